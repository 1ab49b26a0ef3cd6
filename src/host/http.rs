//! One HTTP stream: collect the request's facts, call the core, apply the
//! decision.
//!
//! Requests without a body are decided in the headers phase. Requests with
//! a body return Continue from headers (Pause there would stop Envoy from
//! calling the body callbacks), buffer the body, and are decided when it is
//! complete (end of stream, or the trailers of an HTTP/2 request). Envoy's
//! buffer filter placed after loopguard holds the headers back, so the
//! upstream never sees a request loopguard then rejects.

use super::abi;
use super::root::Plugin;
use crate::core::decision::{self, Verdict};
use crate::core::fingerprint::{Fingerprinted, Pending};
use crate::core::policy::{self, Selection};
use crate::core::reply::{self, Api, Headers};
use crate::core::request::{RequestFacts, RequestHead};
use crate::core::store::{StoreAnswer, StoreFailure, WindowStore};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// Fail-open warnings are logged at most this often.
const FAIL_OPEN_LOG_INTERVAL_MS: u64 = 10_000;

enum State {
    /// Nothing (more) to do for this request.
    Pass,
    /// Waiting for the whole body.
    Buffering { policy: usize, pending: Pending },
    /// Paused by a throttle until the root context's tick resumes it.
    Held,
}

/// Which request phase a decision is made in: request headers can only be
/// changed in the first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Headers,
    Body,
}

pub struct Stream {
    id: u32,
    plugin: Option<Rc<Plugin>>,
    state: State,
    /// Body bytes buffered so far.
    body_len: usize,
    /// Headers for the client's response (warn, throttle).
    response_headers: Headers,
    /// Whose error shape a 429 takes.
    api: Api,
}

impl Stream {
    pub fn new(id: u32, plugin: Option<Rc<Plugin>>) -> Self {
        Stream {
            id,
            plugin,
            state: State::Pass,
            body_len: 0,
            response_headers: Vec::new(),
            api: Api::OpenAi,
        }
    }

    /// Record the hit, decide, and apply the decision.
    fn decide(
        &mut self,
        plugin: &Plugin,
        policy_index: usize,
        made: Fingerprinted,
        phase: Phase,
    ) -> Action {
        self.state = State::Pass;
        let Some(policy) = plugin.config.policies.get(policy_index) else {
            return Action::Continue;
        };
        let Some(detection) = &policy.detection else {
            return Action::Continue;
        };
        if made.unparsed {
            plugin.metrics.llm_unparsed.inc();
        }
        let fp = made.fingerprint;
        let query = decision::window_query(detection, made.fallback);
        let key = decision::store_key(policy, &fp);
        let now = abi::now_ms();
        let answer = match plugin.store.try_borrow_mut() {
            Ok(mut store) => store.record(&key, now, &query),
            Err(_) => StoreAnswer::Failed(StoreFailure::Backend),
        };
        let receipt = match answer {
            StoreAnswer::Ready(receipt) => receipt,
            StoreAnswer::Failed(failure) => {
                plugin.metrics.store_fail_open.inc();
                let last = plugin.last_fail_open_log_ms.get();
                if now.saturating_sub(last) >= FAIL_OPEN_LOG_INTERVAL_MS {
                    plugin.last_fail_open_log_ms.set(now);
                    log::warn!(
                        "store {} for policy \"{}\"; request passed unchecked (fail-open)",
                        failure.as_str(),
                        policy.id
                    );
                }
                return Action::Continue;
            }
        };
        plugin
            .metrics
            .store_cas_retries
            .add(u64::from(receipt.cas_retries));
        if receipt.evicted {
            plugin.metrics.evicted.inc();
        }
        let decided = decision::decide(policy, detection, &fp, made.fallback, &receipt.state);
        if let Some(line) = reply::log_line(&decided) {
            log::info!("{line}");
        }
        if decided.shadow {
            if decided.verdict.action().is_some() {
                plugin.metrics.shadow.inc();
            }
            return Action::Continue;
        }
        for (name, value) in reply::upstream_headers(&decided) {
            // Later filters (header_mutation) copy this into the request
            // once the body phase is over; in the headers phase loopguard
            // can add the header itself.
            let _ = abi::set_filter_state(&reply::filter_state_name(name), value.as_bytes());
            if phase == Phase::Headers {
                let _ = abi::add_request_header(name, &value);
            }
        }
        self.response_headers = reply::response_headers(&decided);
        match decided.verdict {
            Verdict::Allow => Action::Continue,
            Verdict::Warn(_) => {
                plugin.metrics.warned.inc();
                Action::Continue
            }
            Verdict::Throttle { delay_ms, .. } => {
                plugin.metrics.throttled.inc();
                plugin.hold(self.id, now.saturating_add(delay_ms));
                self.state = State::Held;
                Action::Pause
            }
            Verdict::Reject(rejection) => {
                let local = reply::rejection(&rejection, self.api);
                let headers: Vec<(&str, &str)> = local
                    .headers
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                if let Err(e) = abi::send_local_response(
                    local.status,
                    "loopguard_loop_detected",
                    &headers,
                    local.body.as_bytes(),
                ) {
                    log::warn!(
                        "could not send the 429 (host status {}); request passed",
                        e.0
                    );
                    return Action::Continue;
                }
                plugin.metrics.rejected.inc();
                Action::Pause
            }
        }
    }

    fn decide_buffered(&mut self) -> Action {
        let State::Buffering { policy, pending } = std::mem::replace(&mut self.state, State::Pass)
        else {
            return Action::Continue;
        };
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        match abi::request_body(self.body_len) {
            Ok(body) => self.decide(&plugin, policy, pending.finish(&body), Phase::Body),
            Err(e) => {
                log::debug!("body unreadable (host status {}); request passed", e.0);
                plugin.metrics.body_skipped.inc();
                Action::Continue
            }
        }
    }

    fn skip_body(&mut self, plugin: &Plugin) -> Action {
        self.state = State::Pass;
        plugin.metrics.body_skipped.inc();
        Action::Continue
    }
}

/// Request facts answered from Envoy on demand.
struct HostFacts;

impl RequestFacts for HostFacts {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        abi::request_header(name).ok().flatten()
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

fn header_string(name: &str) -> String {
    match abi::request_header(name) {
        Ok(Some(v)) => String::from_utf8(v)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        _ => String::new(),
    }
}

impl Context for Stream {
    fn on_done(&mut self) -> bool {
        // The client left while the request was held by a throttle.
        if matches!(self.state, State::Held) {
            if let Some(plugin) = &self.plugin {
                plugin.release(self.id);
            }
            self.state = State::Pass;
        }
        true
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        plugin.metrics.requests.inc();
        let method = header_string(":method");
        let path = header_string(":path");
        let authority = header_string(":authority");
        let head = RequestHead {
            method: &method,
            path: &path,
            authority: &authority,
        };
        let index = match policy::select(&plugin.config, &head, &HostFacts) {
            Selection::Policy(i) => i,
            Selection::None => return Action::Continue,
            Selection::UnknownRoutePolicy(id) => {
                plugin.note_unknown_route_policy(&id);
                return Action::Continue;
            }
        };
        let Some(policy) = plugin.config.policies.get(index) else {
            return Action::Continue;
        };
        plugin.metrics.matched.inc();
        if policy.detection.is_none() {
            return Action::Continue;
        }
        if policy::is_exempt(&plugin.config, policy, &head, &HostFacts) {
            plugin.metrics.exempted.inc();
            return Action::Continue;
        }
        self.api = Api::for_path(head.path_only());
        let pending = Pending::start(&plugin.config, policy, &head, &HostFacts);
        if end_of_stream {
            return self.decide(&plugin, index, pending.finish(&[]), Phase::Headers);
        }
        let declared = abi::request_header("content-length")
            .ok()
            .flatten()
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u64>().ok());
        if declared.is_some_and(|len| len > plugin.config.max_body_bytes) {
            return self.skip_body(&plugin);
        }
        self.state = State::Buffering {
            policy: index,
            pending,
        };
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !matches!(self.state, State::Buffering { .. }) {
            return Action::Continue;
        }
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        self.body_len = body_size;
        if body_size as u64 > plugin.config.max_body_bytes {
            // Stop buffering; what is held so far flows on.
            return self.skip_body(&plugin);
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.decide_buffered()
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        // An HTTP/2 request with trailers never sees end of stream in the
        // body callback.
        self.decide_buffered()
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in std::mem::take(&mut self.response_headers) {
            let _ = abi::add_response_header(name, &value);
        }
        Action::Continue
    }
}
