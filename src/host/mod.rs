//! The proxy-wasm adapter: Envoy callbacks in, core calls, decisions out.
//! Nothing here decides; an `if` about policy belongs in `core`.

mod abi;
#[cfg(feature = "fault-injection")]
mod faults;
mod http;
mod metrics;
mod redis_store;
mod root;
mod shared_store;

use proxy_wasm::types::LogLevel;

proxy_wasm::main! {{
    // Installs the logger and a panic hook that logs at critical level.
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|id| Box::new(root::Root::new(id)));
}}
