//! The shared store's round trip, one way for every guard: a request that
//! waits for an answer (`asks.rs`), and a write whose answer decides
//! nothing for it (`writes.rs`).

pub(super) mod asks;
pub(super) mod writes;
