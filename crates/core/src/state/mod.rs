//! Keeping state: the sliding windows and near-mode records, the bounded
//! table that holds them, and the stores that keep the table (Envoy shared
//! data through a compare-and-swap backend, or Redis).

pub mod budget;
pub mod bytes;
pub mod ledger;
pub mod mcp_sessions;
pub mod near;
pub mod redis;
pub mod slot_table;
pub mod store;
pub mod window;
