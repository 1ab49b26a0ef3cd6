//! Carrying out the core's effects with host calls. Every effect maps to
//! one host call; what the effect means was decided in the core.

use crate::abi;
use crate::root::Plugin;
use loopguard_core::flow::{Effect, Effects, Level};
use loopguard_core::state::store::StoreCall;
use std::time::Duration;

/// What the caller must still do after [`apply`].
#[derive(Default)]
pub struct Pending {
    /// A store call to send for this stream, and report to the engine.
    pub store_call: Option<StoreCall>,
    /// Calls sent (their tokens) or refused from the root context, in
    /// order, to report.
    pub root_calls_sent: Vec<Result<u32, String>>,
    /// A local reply could not be sent: the request goes on instead.
    pub reply_failed: bool,
}

/// Carry out (and empty) `effects` in the context `home` (a stream's, or
/// the root's): a call sent from the root context, or a stream resumed,
/// returns to it.
pub fn apply(plugin: &Plugin, effects: &mut Effects, home: u32) -> Pending {
    let mut pending = Pending::default();
    for effect in effects.drain(..) {
        match effect {
            Effect::AddRequestHeader(name, value) => {
                let _ = abi::add_request_header(name, &value);
            }
            Effect::RemoveRequestHeader(name) => {
                let _ = abi::remove_request_header(name);
            }
            Effect::AddResponseHeader(name, value) => {
                let _ = abi::add_response_header(name, &value);
            }
            Effect::RemoveResponseHeader(name) => {
                let _ = abi::remove_response_header(name);
            }
            Effect::ReplaceResponseBody { old_len, body } => {
                if let Err(e) = abi::replace_response_body(old_len, &body) {
                    log::warn!("could not add to the response body (host status {})", e.0);
                }
            }
            Effect::SetFilterState(name, value) => {
                let _ = abi::set_filter_state(&name, value.as_bytes());
            }
            Effect::ReplaceBody {
                old_len,
                body,
                set_length,
            } => match abi::replace_request_body(old_len, &body) {
                Ok(()) if set_length => {
                    if let Err(e) =
                        abi::replace_request_header("content-length", &body.len().to_string())
                    {
                        log::warn!("the body changed but its content-length could not be set (host status {})", e.0);
                    }
                }
                Ok(()) => {}
                Err(e) => log::warn!("could not replace the request body (host status {})", e.0),
            },
            Effect::LocalReply(reply, details) => {
                let headers: Vec<(&str, &str)> = reply
                    .headers
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                if let Err(e) =
                    abi::send_local_response(reply.status, details, &headers, reply.body.as_bytes())
                {
                    log::warn!(
                        "could not send the {} (host status {}); request passed",
                        reply.status,
                        e.0
                    );
                    pending.reply_failed = true;
                }
            }
            Effect::SendStoreCall(call) => pending.store_call = Some(call),
            Effect::SendFromRoot(call) => {
                let _ = abi::set_effective_context(plugin.root_id);
                pending.root_calls_sent.push(dispatch(&call));
                let _ = abi::set_effective_context(home);
            }
            Effect::Resume(stream) => {
                // A stream whose client left is gone: nothing to resume.
                if abi::set_effective_context(stream).is_ok() {
                    if let Err(e) = abi::resume_request() {
                        log::debug!("stream {stream} could not resume (host status {})", e.0);
                    }
                }
                let _ = abi::set_effective_context(home);
            }
            Effect::ArmTick => plugin.arm_tick(),
            Effect::StopTick => plugin.disarm_tick(),
            Effect::Count(id, n) => plugin.metrics.count(id, n),
            Effect::CountNamed(name, n) => plugin.metrics.count_named(name, n),
            Effect::Record(id, value) => plugin.metrics.record(id, value),
            Effect::Log(level, message) => match level {
                Level::Debug => log::debug!("{message}"),
                Level::Info => log::info!("{message}"),
                Level::Warn => log::warn!("{message}"),
                Level::Error => log::error!("{message}"),
            },
        }
    }
    pending
}

/// Send a call through an Envoy cluster; the call's token, or why Envoy
/// refused it.
pub fn dispatch(call: &StoreCall) -> Result<u32, String> {
    let headers: Vec<(&str, &str)> = call.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    proxy_wasm::hostcalls::dispatch_http_call(
        &call.cluster,
        headers,
        Some(&call.body),
        vec![],
        Duration::from_millis(call.timeout_ms),
    )
    .map_err(|status| {
        format!(
            "Envoy refused the call ({status:?}): is \"{}\" a cluster in the bootstrap?",
            call.cluster
        )
    })
}
