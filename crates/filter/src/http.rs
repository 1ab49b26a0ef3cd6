//! One HTTP stream: Envoy's callbacks become the core's events (with the
//! request's facts), and the core's effects become host calls. Nothing here
//! decides: which policy applies, whether the body is needed, what a store
//! failure means, what a request's fate is, are the core's (`flow`).

use crate::abi;
use crate::root::Plugin;
use crate::shared_store::SharedData;
use loopguard_core::host::{
    response_status, Effects, Engine, HeaderBlock, Request, RequestFacts, ResponseHead, Step,
};
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

    /// Feed the engine one event, carry out its effects (see
    /// [`Plugin::run`]), and say what the request does next.
    fn run(
        &mut self,
        event: impl FnOnce(&mut Engine<SharedData>, &mut Request, &mut Effects) -> Step,
    ) -> Step {
        let Some(plugin) = self.plugin.clone() else {
            return Step::Continue;
        };
        let id = self.req.id;
        plugin.run(id, Some(&mut self.req), |engine, r, out| {
            r.map_or(Step::Continue, |r| event(engine, r, out))
        })
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

/// The buffered request body's first `len` bytes, if the core wants them.
fn request_body(wanted: bool, len: usize) -> Option<Vec<u8>> {
    wanted
        .then(|| abi::buffer(abi::BUFFER_REQUEST_BODY, len).ok())
        .flatten()
}

fn property_string(path: &[&str]) -> Option<String> {
    let raw = abi::property(path)?;
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
        let reply = abi::http_call_reply(num_headers, body_size);
        let now = abi::now_ms();
        // The response's end waits for a store call, or the request does.
        let response = self.req.response_held();
        if self.run(|e, r, out| e.on_store_reply(r, token, &reply, now, out)) == Step::Continue {
            if let Err(e) = abi::resume(response) {
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
        let Some(headers) = abi::header_block(abi::MAP_REQUEST_HEADERS) else {
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
        let body = request_body(self.req.wants_body(body_size, end_of_stream), body_size);
        let now = abi::now_ms();
        action(
            self.run(|e, r, out| e.on_body(r, body_size, end_of_stream, body.as_deref(), now, out)),
        )
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        let body = request_body(self.req.wants_body_at_trailers(), self.req.body_len());
        let now = abi::now_ms();
        action(self.run(|e, r, out| e.on_trailers(r, body.as_deref(), now, out)))
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // A request whose usage is read needs the status and the content
        // type: both from one call for the whole (small) map; any other
        // only its status.
        let (status, head) = if self.req.wants_content_type() {
            match abi::header_block(abi::MAP_RESPONSE_HEADERS) {
                Some(b) => (
                    b.get(":status").and_then(response_status),
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
                abi::response_status().and_then(|s| response_status(&s)),
                Vec::new(),
            )
        };
        let now = abi::now_ms();
        self.run(|e, r, out| {
            e.on_response_headers(r, status, now, out);
            if r.wants_content_type() {
                let head = ResponseHead::of(&head);
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
        let chunk = abi::buffer(abi::BUFFER_RESPONSE_BODY, body_size).unwrap_or_default();
        let now = abi::now_ms();
        // The last chunk may wait until the shared store has the
        // response's spending.
        action(self.run(|e, r, out| e.on_response_body(r, &chunk, end_of_stream, now, out)))
    }
}
