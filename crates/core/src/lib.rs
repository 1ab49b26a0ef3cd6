//! The pure core: everything loopguard decides, with no proxy-wasm in sight.
//!
//! One request flows through it in this order (the host drives the calls):
//! 1. [`policy::select`] picks the first policy whose selector matches.
//! 2. [`fingerprint::Pending`] starts the fingerprint from the request head
//!    and the caller's identity ([`request::RequestFacts`]); the body
//!    finishes it: its CRC (exact) or its normalised conversation
//!    ([`llm`]: conversation tail, or session).
//! 3. A [`store::WindowStore`] records the hit and answers the window state
//!    (the local slot table now, a remote store possibly later).
//! 4. [`decision::decide`] turns policy + window state into a verdict, and
//!    [`reply`] renders a rejection.

pub mod config;
pub mod decision;
pub mod delay_queue;
pub mod events;
pub mod fingerprint;
pub mod flow;
pub mod hold;
pub mod llm;
pub mod metrics;
pub mod near;
pub mod policy;
pub mod redis;
pub mod reply;
pub mod request;
pub mod simhash;
pub mod slot_table;
pub mod store;
pub mod tool_loops;
pub mod window;

/// A source of wall-clock time in milliseconds since the Unix epoch.
///
/// Envoy's clock is shared by every worker thread, so timestamps written by
/// one worker are comparable with those read by another.
pub trait Clock {
    fn now_ms(&self) -> u64;
}
