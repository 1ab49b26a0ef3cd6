//! Carrying out the core's effects with Envoy's callbacks: each effect is
//! one call (what it means was decided in the core), as `crates/filter`
//! does for proxy-wasm.

use crate::abi::{self, Body, FilterPtr, HeaderMap};
use crate::worker::{Locked, Worker};
use loopguard_core::act::reply::LocalReply;
use loopguard_core::flow::{Effect, Effects, Level, Request, Step};
use loopguard_core::state::store::StoreCall;

/// Where the effects apply: a stream's event on its worker thread (the
/// stream and the hook it is in), or the main thread (no stream: only
/// metrics, logs, relayed calls, resuming and ticking come from there).
#[derive(Clone, Copy)]
pub struct At {
    pub stream: u32,
    pub filter: Option<FilterPtr>,
    /// In a request body hook: the body is Envoy's buffered part plus the
    /// chunk at hand; elsewhere it is all buffered.
    pub in_request_body: bool,
}

impl At {
    pub const MAIN: At = At {
        stream: 0,
        filter: None,
        in_request_body: false,
    };
}

/// A local reply to send once the event is over (see [`settle`]).
pub struct Reply {
    pub reply: LocalReply,
    pub details: &'static str,
}

impl Reply {
    /// Send it. Envoy may end and destroy the stream inside this call, so
    /// it is the last thing a hook does with its stream.
    pub fn send(self, filter: FilterPtr) {
        abi::send_response(
            filter,
            self.reply.status,
            &self.reply.headers,
            self.reply.body.as_bytes(),
            self.details,
        );
    }
}

/// Carry out effects until none are left, reporting the relayed calls
/// and (in a stream's event, for `request`) sending the store call the
/// engine asks for; what the request does next, and the local reply to
/// send when the engine's lock is given back.
///
/// Envoy skips this filter's response hooks for its own local reply, so
/// the engine is given that response's headers here, as the Wasm host's
/// response hook gives them: the headers it adds go with the reply.
pub fn settle(
    w: &Worker,
    l: &mut Locked,
    at: At,
    now: u64,
    mut request: Option<&mut Request>,
    mut step: Step,
) -> (Step, Option<Reply>) {
    let mut held: Option<Reply> = None;
    loop {
        let pending = apply(w, at, &mut l.out);
        if let Some(mut reply) = pending.reply {
            step = Step::Pause;
            if let Some(r) = request.as_deref_mut() {
                l.engine
                    .on_response_headers(r, Some(reply.reply.status), now, &mut l.out);
                l.out.retain(|e| match e {
                    Effect::AddResponseHeader(name, value) => {
                        reply.reply.headers.push((name, value.clone()));
                        false
                    }
                    Effect::RemoveResponseHeader(_) => false,
                    _ => true,
                });
            }
            held = Some(reply);
            continue;
        }
        if pending.root_calls_sent.is_empty() && pending.store_call.is_none() {
            return (step, held);
        }
        for sent in pending.root_calls_sent {
            l.engine.on_root_call_sent(sent, now, &mut l.out);
        }
        if let (Some(call), Some(r), Some(f)) =
            (pending.store_call, request.as_deref_mut(), at.filter)
        {
            let sent = dispatch(f, &call);
            step = l.engine.on_call_sent(r, sent, now, &mut l.out);
        }
    }
}

/// What the caller must still do after [`apply`].
#[derive(Default)]
pub struct Pending {
    /// A store call to send for this stream, and report to the engine.
    pub store_call: Option<StoreCall>,
    /// Calls relayed from the root (their tokens), in order, to report.
    pub root_calls_sent: Vec<Result<u32, String>>,
    /// A local reply for the request (sent after the event).
    pub reply: Option<Reply>,
}

/// Carry out (and empty) `effects`, but a local reply, which is handed
/// back.
pub fn apply(worker: &Worker, at: At, effects: &mut Effects) -> Pending {
    let mut pending = Pending::default();
    let Some(f) = at.filter else {
        for effect in effects.drain(..) {
            main_thread(worker, effect, &mut pending);
        }
        return pending;
    };
    for effect in effects.drain(..) {
        match effect {
            Effect::AddRequestHeader(name, value) => {
                abi::add_header(f, HeaderMap::Request, name, &value);
            }
            Effect::RemoveRequestHeader(name) => {
                abi::remove_header(f, HeaderMap::Request, name);
            }
            Effect::AddResponseHeader(name, value) => {
                abi::add_header(f, HeaderMap::Response, name, &value);
            }
            Effect::RemoveResponseHeader(name) => {
                abi::remove_header(f, HeaderMap::Response, name);
            }
            Effect::ReplaceResponseBody { old_len, body } => {
                if !(abi::drain_body(f, Body::ReceivedResponse, old_len)
                    && abi::append_body(f, Body::ReceivedResponse, &body))
                {
                    abi::log(
                        abi::LogLevel::Warn,
                        "loopguard: could not add to the response body",
                    );
                }
            }
            Effect::SetFilterState(name, value) => {
                // The Wasm module's keys (`wasm.<name>`), so that the same
                // `%FILTER_STATE(...)%` reads either host's.
                abi::set_filter_state(f, &format!("wasm.{name}"), value.as_bytes());
            }
            Effect::ReplaceBody {
                old_len: _,
                body,
                set_length,
            } => {
                let replaced = if at.in_request_body {
                    // Both parts go (the buffered one may be the chunk at
                    // hand: sizes are read after each drain); the new body
                    // is the chunk that passes on.
                    let buffered = abi::body_size(f, Body::BufferedRequest);
                    let drained =
                        buffered == 0 || abi::drain_body(f, Body::BufferedRequest, buffered);
                    let received = abi::body_size(f, Body::ReceivedRequest);
                    drained
                        && (received == 0 || abi::drain_body(f, Body::ReceivedRequest, received))
                        && abi::append_body(f, Body::ReceivedRequest, &body)
                } else {
                    let buffered = abi::body_size(f, Body::BufferedRequest);
                    abi::drain_body(f, Body::BufferedRequest, buffered)
                        && abi::append_body(f, Body::BufferedRequest, &body)
                };
                if !replaced {
                    abi::log(
                        abi::LogLevel::Warn,
                        "loopguard: could not replace the request body",
                    );
                } else if set_length
                    && !abi::set_header(
                        f,
                        HeaderMap::Request,
                        "content-length",
                        &body.len().to_string(),
                    )
                {
                    abi::log(
                        abi::LogLevel::Warn,
                        "loopguard: the body changed but its content-length could not be set",
                    );
                }
            }
            Effect::LocalReply(reply, details) => {
                pending.reply = Some(Reply { reply, details });
            }
            Effect::SendStoreCall(call) => pending.store_call = Some(call),
            Effect::Resume(stream) => worker.resume(stream),
            Effect::ArmTick => worker.arm_tick(Some(at.stream)),
            other => main_thread(worker, other, &mut pending),
        }
    }
    pending
}

/// The effects that need no stream (any thread).
fn main_thread(worker: &Worker, effect: Effect, pending: &mut Pending) {
    match effect {
        Effect::SendFromRoot(call) => {
            let token = worker.root_token();
            worker.config.relay.send(worker.id, token, call);
            pending.root_calls_sent.push(Ok(token));
        }
        Effect::Resume(stream) => worker.resume(stream),
        Effect::ArmTick => worker.arm_tick(None),
        Effect::StopTick => worker.stop_tick(),
        Effect::Count(id, n) => worker.config.metrics.count(id, n),
        Effect::CountNamed(name, n) => worker.config.metrics.count_named(&name, n),
        Effect::Record(id, value) => worker.config.metrics.record(id, value),
        Effect::Log(level, message) => {
            let level = match level {
                Level::Debug => abi::LogLevel::Debug,
                Level::Info => abi::LogLevel::Info,
                Level::Warn => abi::LogLevel::Warn,
                Level::Error => abi::LogLevel::Error,
            };
            if abi::log_enabled(level) {
                abi::log(level, &message);
            }
        }
        // A stream's own effects, with no stream at hand: nothing to
        // apply them to (the engine makes none outside a stream).
        _ => {}
    }
}

/// Send a store call on behalf of a stream: its token, or why Envoy
/// refused it.
pub fn dispatch(filter: FilterPtr, call: &StoreCall) -> Result<u32, String> {
    let id = abi::stream_callout(filter, call).map_err(|why| {
        format!(
            "Envoy refused the call ({why}): is \"{}\" a cluster in the bootstrap?",
            call.cluster
        )
    })?;
    u32::try_from(id).map_err(|_| format!("callout id {id} out of range"))
}
