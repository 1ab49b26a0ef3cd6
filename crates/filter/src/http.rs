//! One HTTP stream: Envoy's callbacks become the core's events (with the
//! request's facts), and the core's effects become host calls. Nothing here
//! decides: which policy applies, whether the body is needed, what a store
//! failure means, what a request's fate is, are the core's (`flow`).

use crate::abi;
use crate::effects;
use crate::root::Plugin;
use crate::shared_store::SharedData;
use loopguard_core::flow::{Effects, Engine, Request, Step};
use loopguard_core::request::{HeaderBlock, RequestFacts};
use loopguard_core::state::store::CallReply;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

pub struct Stream {
    req: Request,
    plugin: Option<Rc<Plugin>>,
}

impl Stream {
    pub fn new(id: u32, plugin: Option<Rc<Plugin>>) -> Self {
        Stream {
            req: Request::new(id),
            plugin,
        }
    }

    /// Feed the engine one event, carry out its effects (sending a store
    /// call it asks for and reporting how that went), and say what the
    /// request does next.
    fn run(
        &mut self,
        event: impl FnOnce(&mut Engine<SharedData>, &mut Request, &mut Effects) -> Step,
    ) -> Step {
        let Some(plugin) = self.plugin.clone() else {
            return Step::Continue;
        };
        let mut out = plugin.take_scratch();
        let mut step = match plugin.engine.try_borrow_mut() {
            Ok(mut engine) => event(&mut engine, &mut self.req, &mut out),
            Err(_) => Step::Continue,
        };
        loop {
            let pending = effects::apply(&plugin, &mut out, self.req.id);
            if pending.reply_failed {
                step = Step::Continue;
            }
            if !pending.root_calls_sent.is_empty() {
                // Calls sent from the root context during this stream's
                // event (a response's spending for the shared store): told
                // to the engine in order, as the tick's are.
                if let Ok(mut engine) = plugin.engine.try_borrow_mut() {
                    for sent in pending.root_calls_sent {
                        engine.on_root_call_sent(sent, abi::now_ms(), &mut out);
                    }
                }
                if pending.store_call.is_none() {
                    continue;
                }
            }
            let Some(call) = pending.store_call else {
                break;
            };
            // On behalf of the root context: Envoy cancels a stream's own
            // calls when its client leaves and then never answers them,
            // which would strand the SDK's token-to-context entry. A
            // root-owned call is always answered (or timed out); the SDK
            // routes the answer to this stream, or drops it if it is gone.
            let _ = abi::set_effective_context(plugin.root_id);
            let sent = effects::dispatch(&call);
            let _ = abi::set_effective_context(self.req.id);
            step = match plugin.engine.try_borrow_mut() {
                Ok(mut engine) => engine.on_call_sent(&mut self.req, sent, abi::now_ms(), &mut out),
                Err(_) => Step::Continue,
            };
        }
        plugin.put_back(out);
        step
    }
}

fn action(step: Step) -> Action {
    match step {
        Step::Continue => Action::Continue,
        Step::Pause => Action::Pause,
    }
}

/// Request facts: headers from the block read once, the rest answered from
/// Envoy on demand.
struct HostFacts<'a> {
    headers: &'a HeaderBlock,
}

impl RequestFacts for HostFacts<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers.get(name).map(<[u8]>::to_vec)
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers.get(name).is_some()
    }

    fn source_address(&self) -> Option<String> {
        property_string(&["source", "address"])
    }

    fn verified_claim(&self, payload_key: &str, claim: &str) -> Option<Vec<u8>> {
        abi::property(&[
            "metadata",
            "filter_metadata",
            "envoy.filters.http.jwt_authn",
            payload_key,
            claim,
        ])
        .ok()
        .flatten()
    }

    fn route_name(&self) -> Option<String> {
        property_string(&["xds", "route_name"])
    }

    fn route_policy(&self) -> Option<String> {
        property_string(&[
            "xds",
            "route_metadata",
            "filter_metadata",
            "loopguard",
            "policy",
        ])
    }
}

fn property_string(path: &[&str]) -> Option<String> {
    let raw = abi::property(path).ok().flatten()?;
    String::from_utf8(raw).ok().filter(|s| !s.is_empty())
}

impl Context for Stream {
    /// The answer to this stream's store call.
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let reply = CallReply {
            status: abi::http_call_status(num_headers),
            body: abi::http_call_response_body(body_size).unwrap_or_default(),
        };
        let now = abi::now_ms();
        // The response's end waits for a store call, or the request does.
        let response = self.req.response_held();
        if self.run(|e, r, out| e.on_store_reply(r, token, &reply, now, out)) == Step::Continue {
            let resumed = if response {
                abi::resume_response()
            } else {
                abi::resume_request()
            };
            if let Err(e) = resumed {
                log::debug!(
                    "stream could not resume after the store answered (host status {})",
                    e.0
                );
            }
        }
    }

    fn on_done(&mut self) -> bool {
        self.run(|e, r, out| {
            e.on_done(r, out);
            Step::Continue
        });
        true
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // All headers in one host call; everything reads this block.
        let Some(headers) = abi::request_headers().ok().and_then(HeaderBlock::parse) else {
            return Action::Continue;
        };
        #[cfg(feature = "fault-injection")]
        crate::faults::on_request(&headers);
        let facts = HostFacts { headers: &headers };
        let line = headers.request_line();
        let head = line.head();
        let now = abi::now_ms();
        action(self.run(|e, r, out| e.on_headers(r, &head, &facts, end_of_stream, now, out)))
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let body = if self.req.wants_body(body_size, end_of_stream) {
            abi::request_body(body_size).ok()
        } else {
            None
        };
        let now = abi::now_ms();
        action(
            self.run(|e, r, out| e.on_body(r, body_size, end_of_stream, body.as_deref(), now, out)),
        )
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let body = if self.req.wants_body_at_trailers() {
            abi::request_body(self.req.body_len()).ok()
        } else {
            None
        };
        let now = abi::now_ms();
        action(self.run(|e, r, out| e.on_trailers(r, body.as_deref(), now, out)))
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // A request whose usage is read needs the status and the content
        // type: both from one call for the whole (small) map; any other
        // only its status.
        let (status, head) = if self.req.wants_content_type() {
            let block = abi::response_headers()
                .ok()
                .and_then(loopguard_core::request::HeaderBlock::parse);
            match block {
                Some(b) => (
                    b.get(":status").and_then(loopguard_core::response::status),
                    self.req
                        .response_headers_wanted()
                        .iter()
                        .map(|name| b.get(name).map(|v| String::from_utf8_lossy(v).into_owned()))
                        .collect(),
                ),
                None => (None, Vec::new()),
            }
        } else {
            (
                abi::response_status().and_then(|s| loopguard_core::response::status(&s)),
                Vec::new(),
            )
        };
        let now = abi::now_ms();
        self.run(|e, r, out| {
            e.on_response_headers(r, status, now, out);
            if r.wants_content_type() {
                let head = loopguard_core::response::ResponseHead::of(&head);
                e.on_response_head(r, &head, now, out);
            }
            Step::Continue
        });
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.req.wants_response_body() {
            return Action::Continue;
        }
        // Each chunk passes on at once; only the events that carry usage
        // are parsed.
        let chunk = abi::response_body(body_size).unwrap_or_default();
        let now = abi::now_ms();
        // The last chunk may wait until the shared store has the
        // response's spending.
        action(self.run(|e, r, out| e.on_response_body(r, &chunk, end_of_stream, now, out)))
    }
}
