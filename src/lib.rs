//! loopguard: stops runaway AI-agent request loops inside Envoy.
//!
//! The crate has two halves:
//! - [`core`]: pure logic (configuration, policy matching, fingerprints, the
//!   sliding window, the slot table, decisions, replies). It never touches
//!   proxy-wasm and is tested natively with `cargo test`.
//! - `host` (wasm32 only): the proxy-wasm adapter. It gathers request facts,
//!   calls the core, talks to Envoy shared data and applies the decision.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented
    )
)]

pub mod core;

#[cfg(feature = "cli")]
pub mod cli;

#[cfg(target_arch = "wasm32")]
mod host;
