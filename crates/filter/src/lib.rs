//! loopguard's proxy-wasm filter: it translates between Envoy and the pure
//! core (`loopguard-core`), and decides nothing itself. Only built for
//! wasm32 (the crate is empty natively).
//!
//! - `root`: configuration, per-plugin state, the tick, calls' answers.
//! - `http`: one stream: request facts in, the core's effects applied.
//! - `effects`: each of the core's effects as a host call.
//! - `shared_store`: the core's bucket backend over Envoy shared data.
//! - `abi`: fallible host calls (never panic).
//! - `metrics`: loopguard's counters in Envoy's stats.
#![cfg(target_arch = "wasm32")]

mod abi;
mod effects;
#[cfg(feature = "fault-injection")]
mod faults;
mod http;
mod metrics;
mod root;
mod shared_store;

use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    // Installs the logger and a panic hook that logs at critical level.
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| Box::new(root::Root { id, plugin: None }));
}}
