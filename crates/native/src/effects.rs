//! Carrying out the core's effects with Envoy's callbacks: each effect is
//! one call (what it means was decided in the core), as `crates/filter`
//! does for proxy-wasm.

use crate::abi::{self, Body, FilterPtr, HeaderMap};
use crate::worker::{Locked, Worker};
use loopguard_core::host::{
    refused_call, Effect, Host, Level, LocalReply, Request, Step, StoreCall,
};

/// Where the effects apply: a stream's event on its worker thread (the
/// stream and the hook it is in), or the main thread (the default; no
/// stream: only metrics, logs, relayed calls, resuming and ticking come
/// from there).
#[derive(Clone, Copy, Default)]
pub struct At {
    pub stream: u32,
    pub filter: Option<FilterPtr>,
    /// In a request body hook: the body is Envoy's buffered part plus the
    /// chunk at hand; elsewhere it is all buffered.
    pub in_request_body: bool,
}

/// A local reply and its details, to send once the event is over (see
/// [`settle`]).
pub type Reply = (LocalReply, &'static str);

/// The dynamic module as the engine's [`Host`]: a stream's effects go to
/// its filter, the others to the worker; a local reply is kept to be sent
/// once the engine's lock is given back.
pub struct NativeHost<'a> {
    pub worker: &'a Worker,
    pub at: At,
    /// The event's time (read once by the hook).
    pub now: u64,
    pub reply: Option<Reply>,
}

impl Host for NativeHost<'_> {
    fn apply(&mut self, effect: Effect) -> bool {
        match effect {
            // Every event counts: straight to the metric. A count owns
            // nothing, so the enum's drop glue (a call) is skipped.
            Effect::Count(id, n) => {
                self.worker.config.metrics.count(id, n);
                std::mem::forget(effect);
            }
            Effect::LocalReply(reply, details) if self.at.filter.is_some() => {
                self.reply = Some((reply, details));
            }
            effect => match self.at.filter {
                Some(f) => on_stream(self.worker, self.at, f, effect),
                None => main_thread(self.worker, &effect),
            },
        }
        true
    }

    /// On behalf of the stream at hand: its token, or why Envoy refused it.
    fn send_call(&mut self, call: &StoreCall) -> Result<u32, String> {
        let f = self.at.filter.ok_or("no stream to send the call for")?;
        let id = abi::callout(f, false, call).map_err(|why| refused_call(why, &call.cluster))?;
        u32::try_from(id).map_err(|_| format!("callout id {id} out of range"))
    }

    fn send_root_call(&mut self, call: StoreCall) -> Result<u32, String> {
        let token = self.worker.root_token();
        self.worker.config.relay.send(self.worker.id, token, call);
        Ok(token)
    }

    fn now_ms(&mut self) -> u64 {
        self.now
    }

    /// Envoy skips this filter's response hooks for its own local reply.
    fn local_reply_skips_response_hooks(&self) -> bool {
        true
    }
}

/// Carry out an event's effects (the engine locked in `l`): what the
/// request does next, and the local reply to send once the lock is given
/// back.
pub fn settle(
    w: &Worker,
    l: &mut Locked,
    at: At,
    now: u64,
    request: Option<&mut Request>,
    step: Step,
) -> (Step, Option<Reply>) {
    let mut host = NativeHost {
        worker: w,
        at,
        now,
        reply: None,
    };
    let step = l.engine.drive(&mut host, request, &mut l.out, step);
    match host.reply {
        Some(reply) => (Step::Pause, Some(reply)),
        None => (step, None),
    }
}

/// Carry out one effect of a stream's event through its filter.
fn on_stream(worker: &Worker, at: At, f: FilterPtr, effect: Effect) {
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
                warn("loopguard: could not add to the response body");
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
                let drained = buffered == 0 || abi::drain_body(f, Body::BufferedRequest, buffered);
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
                warn("loopguard: could not replace the request body");
            } else if set_length
                && !abi::set_header(
                    f,
                    HeaderMap::Request,
                    "content-length",
                    &body.len().to_string(),
                )
            {
                warn("loopguard: the body changed but its content-length could not be set");
            }
        }
        Effect::ArmTick => worker.arm_tick(Some(at.stream)),
        other => main_thread(worker, &other),
    }
}

/// A change to the stream that Envoy refused (the request goes on).
fn warn(message: &str) {
    abi::log(abi::LogLevel::Warn, message);
}

/// The effects that need no stream (any thread).
fn main_thread(worker: &Worker, effect: &Effect) {
    match *effect {
        Effect::Resume(stream) => worker.resume(stream),
        Effect::ArmTick => worker.arm_tick(None),
        Effect::StopTick => worker.stop_tick(),
        Effect::CountNamed(ref name, n) => worker.config.metrics.count_named(name, n),
        Effect::Record(id, value) => worker.config.metrics.record(id, value),
        Effect::Log(level, ref message) => {
            let level = match level {
                Level::Debug => abi::LogLevel::Debug,
                Level::Info => abi::LogLevel::Info,
                Level::Warn => abi::LogLevel::Warn,
                Level::Error => abi::LogLevel::Error,
            };
            if abi::log_enabled(level) {
                abi::log(level, message);
            }
        }
        // A stream's own effects, with no stream at hand: nothing to
        // apply them to (the engine makes none outside a stream); calls
        // are the driver's, counts `NativeHost::apply`'s.
        _ => {}
    }
}
