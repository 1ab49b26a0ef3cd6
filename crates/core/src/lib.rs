//! The pure core: everything loopguard decides, with no proxy-wasm in sight.
//!
//! Its folders are the stages of one request, each depending only on the
//! ones before it ([`flow`] drives them; the host feeds it events):
//! 1. [`request`]: reading a request. [`request::policy::select`] picks the
//!    first policy whose selector matches; [`request::llm`] reads the body
//!    as an LLM call (its conversation, tool calls, masked tokens).
//! 2. [`detect`]: [`detect::fingerprint::Pending`] starts the fingerprint
//!    from the request head and the caller's identity and the body
//!    finishes it; [`detect::tool_loops`] judges the conversation.
//! 3. [`state`]: the local [`state::store::SlotStore`] (the slot table, in
//!    Envoy shared data or the native module's memory) or Redis, shared by
//!    every replica ([`state::redis`]), records the hit and answers the
//!    window state.
//! 4. [`act`]: [`act::decision::decide`] turns policy + window state into a
//!    verdict, and [`act::reply`] renders a rejection.
//! 5. [`response`]: what the answer says (an attempt the provider failed
//!    is taken back: a retry of it is not a loop).
//!
//! [`config`] is the validated configuration every stage reads; [`metrics`]
//! names what is counted.

pub mod act;
pub mod config;
pub mod detect;
pub mod flow;
pub mod host;
pub mod metrics;
pub mod request;
pub mod response;
pub mod state;
