//! The one module the hosts use (the proxy-wasm filter and the native
//! dynamic module): the engine and what passes between it and Envoy
//! (request facts, effects, store calls and their replies, local replies,
//! the table's buckets, the metrics to define), and [`Engine::drive`],
//! which carries out an event's effects through a [`Host`] and tells the
//! engine how each call went, so both hosts do it the same way by
//! construction.

pub use crate::act::reply::LocalReply;
pub use crate::config::Config;
pub use crate::flow::{Effect, Effects, Engine, Level, Request, Step};
pub use crate::metrics::{named, Kind, MetricId, Registry};
pub use crate::request::{HeaderBlock, RequestFacts};
pub use crate::response::{status as response_status, ResponseHead};
pub use crate::state::slot_table::TableLayout;
pub use crate::state::store::{
    plugin_namespace, BucketBackend, CallReply, CasWrite, InProcess, StoreCall,
};

/// What precedes the dynamic-module ABI version in the native module's
/// file (`loopguard-dynamic-module-abi=v0.2.0`): written by the native host,
/// read by `loopguard check --envoy`.
pub const NATIVE_ABI_MARK_PREFIX: &str = "loopguard-dynamic-module-abi=";

/// How often a host ticks the engine while something waits: the precision
/// of throttle delays (the same in both hosts).
pub const TICK_MS: u32 = 5;

/// Why a store call was not sent: Envoy refused it (`why`), the same text
/// from both hosts.
pub fn refused_call(why: impl std::fmt::Display, cluster: &str) -> String {
    format!("Envoy refused the call ({why}): is \"{cluster}\" a cluster in the bootstrap?")
}

/// 64 random bits for the engine: the standard library's hash keys (from
/// the OS natively, from WASI's random source in a Wasm VM), with the time
/// `now_ms` reads.
pub fn random_seed(now_ms: impl FnOnce() -> u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_ms());
    h.finish()
}

/// What a host does with an event's effects.
pub trait Host {
    /// Carry out one effect; never a call (those are sent through
    /// [`Host::send_call`] and [`Host::send_root_call`]). `false`: a local
    /// reply could not be sent, and the request goes on instead.
    fn apply(&mut self, effect: Effect) -> bool;
    /// Send a store call on behalf of the stream at hand: its token, or why
    /// Envoy refused it.
    fn send_call(&mut self, call: &StoreCall) -> Result<u32, String>;
    /// Send a call from the root context (its answer goes to
    /// [`Engine::on_root_reply`]): its token, or why Envoy refused it.
    fn send_root_call(&mut self, call: StoreCall) -> Result<u32, String>;
    /// The time, read only when the driver needs it (to tell the engine
    /// how a call went).
    fn now_ms(&mut self) -> u64;
    /// Envoy runs no response hook of this filter for a local reply the
    /// filter sends itself (the dynamic module's API): the reply is handed
    /// the response headers the engine adds, as the response hook would.
    fn local_reply_skips_response_hooks(&self) -> bool {
        false
    }
}

impl<B: BucketBackend> Engine<B> {
    /// Carry out `out` (the effects of an event; `step`, what it said the
    /// request does) with `host` until none are left: each call is sent,
    /// and how that went is told to the engine (a stream's call for
    /// `request`, a root call by the id the engine gave it), which may ask
    /// for more. What the request does next.
    pub fn drive(
        &mut self,
        host: &mut impl Host,
        mut request: Option<&mut Request>,
        out: &mut Effects,
        mut step: Step,
    ) -> Step {
        let mut batch = Effects::new();
        while !out.is_empty() {
            std::mem::swap(out, &mut batch);
            let mut call = None;
            for effect in batch.drain(..) {
                match effect {
                    Effect::SendStoreCall(c) => call = Some(c),
                    Effect::SendFromRoot { id, call } => {
                        let sent = host.send_root_call(call);
                        let now = host.now_ms();
                        self.on_root_call_sent(id, sent, now, out);
                    }
                    Effect::LocalReply(mut reply, details) => {
                        if let (true, Some(r)) = (
                            host.local_reply_skips_response_hooks(),
                            request.as_deref_mut(),
                        ) {
                            let mut head = Effects::new();
                            let now = host.now_ms();
                            self.on_response_headers(r, Some(reply.status), now, &mut head);
                            for e in head {
                                match e {
                                    Effect::AddResponseHeader(name, value) => {
                                        reply.headers.push((name, value))
                                    }
                                    Effect::RemoveResponseHeader(_) => {}
                                    other => out.push(other),
                                }
                            }
                        }
                        if !host.apply(Effect::LocalReply(reply, details)) {
                            step = Step::Continue;
                        }
                    }
                    other => {
                        host.apply(other);
                    }
                }
            }
            if let (Some(c), Some(r)) = (call, request.as_deref_mut()) {
                let sent = host.send_call(&c);
                let now = host.now_ms();
                step = self.on_call_sent(r, sent, now, out);
            }
        }
        // Keep the larger buffer for the next event (no allocation once
        // warm).
        if batch.capacity() > out.capacity() {
            std::mem::swap(out, &mut batch);
        }
        step
    }
}
