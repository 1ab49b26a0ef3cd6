//! Spend per budget key over sliding windows: the slices of a window
//! ([`slices`]) and the bounded table that keeps every key's
//! ([`table`]). The Redis store keeps the same slices
//! ([`crate::state::redis::budget`]).

pub mod slices;
pub mod table;

pub use slices::{slice_ms, Slices, SLICES};
pub use table::{Add, Added, BudgetTable};
