//! loopguard as an Envoy dynamic module (`libloopguard_native.so`, loaded
//! by `envoy.filters.http.dynamic_modules`): the same core as the Wasm
//! module, behind a second host that translates between Envoy's native
//! ABI and the core and decides nothing itself.
//!
//! - `hooks`: the functions Envoy calls; each guards against panics.
//! - `config`: one filter configuration (main thread): validation, metrics,
//!   the relay for calls that belong to no stream.
//! - `worker`: one configuration's engine on one worker thread, its live
//!   streams and its tick, and the engine behind its lock.
//! - `stream`: one HTTP stream: request facts in, the core's effects out;
//!   `facts`: what the core asks about a request; `reentry`: Envoy calling
//!   back inside a stream's event.
//! - `effects`: each of the core's effects as a callback.
//! - `memory_store`: the core's bucket backend over process memory.
//! - `timer`: the clock thread that drives the tick.
//! - `metrics`: loopguard's metrics in Envoy's stats.
//! - `abi`: the ABI's types and the callbacks used, fallible, never
//!   panicking.
#![allow(unsafe_code)]

mod abi;
mod config;
mod effects;
mod facts;
#[cfg(feature = "fault-injection")]
mod faults;
mod hooks;
mod memory_store;
mod metrics;
mod reentry;
mod stream;
mod timer;
mod worker;
