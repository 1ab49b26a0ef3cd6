//! Carrying out the core's effects with host calls. Every effect maps to
//! one host call; what the effect means was decided in the core.

use crate::abi::{self, MAP_REQUEST_HEADERS, MAP_RESPONSE_HEADERS};
use crate::root::Plugin;
use loopguard_core::host::{refused_call, Effect, Effects, Host, Level, StoreCall};
use std::time::Duration;

/// The Wasm module as the engine's [`Host`] for one event, in the context
/// `home` (a stream's, or the root's): effects are carried out at once and
/// calls sent on behalf of the root context, but a local reply and a
/// resumed stream, which Envoy may answer by calling back into this VM,
/// are kept for [`WasmHost::finish`], once the engine is no longer
/// borrowed.
pub struct WasmHost<'a> {
    plugin: &'a Plugin,
    home: u32,
    kept: Effects,
}

impl<'a> WasmHost<'a> {
    pub fn new(plugin: &'a Plugin, home: u32) -> WasmHost<'a> {
        WasmHost {
            plugin,
            home,
            kept: Effects::new(),
        }
    }

    /// Carry out the effects kept: `false` when a local reply could not be
    /// sent (the request goes on).
    pub fn finish(self) -> bool {
        self.kept.into_iter().fold(true, |replied, e| {
            apply(self.plugin, e, self.home) & replied
        })
    }
}

impl Host for WasmHost<'_> {
    fn apply(&mut self, effect: Effect) -> bool {
        match effect {
            // Every event counts: straight to the metric. A count owns
            // nothing, so the enum's drop glue (a call) is skipped.
            Effect::Count(id, n) => {
                self.plugin.metrics.count(id, n);
                std::mem::forget(effect);
            }
            Effect::LocalReply(..) | Effect::Resume(_) => self.kept.push(effect),
            other => return apply(self.plugin, other, self.home),
        }
        true
    }

    fn send_call(&mut self, call: &StoreCall) -> Result<u32, String> {
        // On behalf of the root context: Envoy cancels a stream's own calls
        // when its client leaves and then never answers them, which would
        // strand the SDK's token-to-context entry. A root-owned call is
        // always answered (or timed out); the SDK routes the answer to the
        // stream that asked, or drops it if it is gone.
        let _ = abi::set_effective_context(self.plugin.root_id);
        let headers: Vec<(&str, &str)> =
            call.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let sent = proxy_wasm::hostcalls::dispatch_http_call(
            &call.cluster,
            headers,
            Some(&call.body),
            vec![],
            Duration::from_millis(call.timeout_ms),
        )
        .map_err(|status| refused_call(format_args!("{status:?}"), &call.cluster));
        let _ = abi::set_effective_context(self.home);
        sent
    }

    fn send_root_call(&mut self, call: StoreCall) -> Result<u32, String> {
        self.send_call(&call)
    }

    fn now_ms(&mut self) -> u64 {
        abi::now_ms()
    }
}

/// Carry out an effect in the context `home` (a resumed stream returns to
/// it): `false` when a local reply could not be sent.
fn apply(plugin: &Plugin, effect: Effect, home: u32) -> bool {
    match effect {
        Effect::AddRequestHeader(name, value) => {
            let _ = abi::add_header(MAP_REQUEST_HEADERS, name, &value, false);
        }
        Effect::RemoveRequestHeader(name) => {
            let _ = abi::remove_header(MAP_REQUEST_HEADERS, name);
        }
        Effect::AddResponseHeader(name, value) => {
            let _ = abi::add_header(MAP_RESPONSE_HEADERS, name, &value, false);
        }
        Effect::RemoveResponseHeader(name) => {
            let _ = abi::remove_header(MAP_RESPONSE_HEADERS, name);
        }
        Effect::ReplaceResponseBody { old_len, body } => {
            if let Err(e) = abi::replace_body(abi::BUFFER_RESPONSE_BODY, old_len, &body) {
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
        } => {
            match abi::replace_body(abi::BUFFER_REQUEST_BODY, old_len, &body) {
                Ok(()) if set_length => {
                    let length = body.len().to_string();
                    if let Err(e) =
                        abi::add_header(MAP_REQUEST_HEADERS, "content-length", &length, true)
                    {
                        log::warn!("the body changed but its content-length could not be set (host status {})", e.0);
                    }
                }
                Ok(()) => {}
                Err(e) => log::warn!("could not replace the request body (host status {})", e.0),
            }
        }
        Effect::LocalReply(reply, details) => {
            if let Err(e) = abi::send_local_response(
                reply.status,
                details,
                &reply.headers,
                reply.body.as_bytes(),
            ) {
                let (status, host) = (reply.status, e.0);
                log::warn!("could not send the {status} (host status {host}); request passed");
                return false;
            }
        }
        // Sent by the driver; counts applied by `WasmHost::apply`.
        Effect::SendStoreCall(_) | Effect::SendFromRoot { .. } | Effect::Count(..) => {}
        Effect::Resume(stream) => {
            // A stream whose client left is gone: nothing to resume.
            if abi::set_effective_context(stream).is_ok() {
                if let Err(e) = abi::resume(false) {
                    log::debug!("stream {stream} could not resume (host status {})", e.0);
                }
            }
            let _ = abi::set_effective_context(home);
        }
        Effect::ArmTick => plugin.arm_tick(),
        Effect::StopTick => plugin.disarm_tick(),
        Effect::CountNamed(name, n) => plugin.metrics.count_named(name, n),
        Effect::Record(id, value) => plugin.metrics.record(id, value),
        Effect::Log(level, message) => match level {
            Level::Debug => log::debug!("{message}"),
            Level::Info => log::info!("{message}"),
            Level::Warn => log::warn!("{message}"),
            Level::Error => log::error!("{message}"),
        },
    }
    true
}
