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
use crate::core::fingerprint::{ExactBuilder, Fingerprint};
use crate::core::policy;
use crate::core::reply;
use crate::core::request::{RequestFacts, RequestHead};
use crate::core::store::{StoreAnswer, WindowStore};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// Fail-open warnings are logged at most this often.
const FAIL_OPEN_LOG_INTERVAL_MS: u64 = 10_000;

enum State {
    /// Nothing (more) to do for this request.
    Pass,
    /// Waiting for the whole body.
    Buffering {
        policy: usize,
        builder: ExactBuilder,
    },
}

pub struct Stream {
    plugin: Option<Rc<Plugin>>,
    state: State,
    /// Body bytes buffered so far.
    body_len: usize,
}

impl Stream {
    pub fn new(plugin: Option<Rc<Plugin>>) -> Self {
        Stream {
            plugin,
            state: State::Pass,
            body_len: 0,
        }
    }

    /// Record the hit, decide, and apply the verdict.
    fn decide(&mut self, plugin: &Plugin, policy_index: usize, fp: Fingerprint) -> Action {
        self.state = State::Pass;
        let Some(policy) = plugin.config.policies.get(policy_index) else {
            return Action::Continue;
        };
        let Some(detection) = &policy.detection else {
            return Action::Continue;
        };
        let query = decision::window_query(detection);
        let now = abi::now_ms();
        let answer = match plugin.store.try_borrow_mut() {
            Ok(mut store) => store.record(&fp, now, &query),
            Err(_) => StoreAnswer::Failed(crate::core::store::StoreFailure::Backend),
        };
        let receipt = match answer {
            StoreAnswer::Ready(receipt) => receipt,
            StoreAnswer::Failed(failure) => {
                plugin.metrics.store_fail_open.inc();
                if now.saturating_sub(plugin.last_fail_open_log_ms.get())
                    >= FAIL_OPEN_LOG_INTERVAL_MS
                {
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
        match decision::decide(policy, detection, &fp, &receipt.state) {
            Verdict::Allow { .. } => Action::Continue,
            Verdict::Reject(rejection) => {
                let local = reply::rejection(&rejection);
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
                if rejection.first {
                    log::info!(
                        "loop detected: policy \"{}\" fingerprint {} sent {} times in {} s; rejecting",
                        rejection.policy_id,
                        rejection.fingerprint,
                        rejection.hit_count,
                        rejection.window_seconds
                    );
                } else {
                    log::debug!(
                        "rejected policy \"{}\" fingerprint {} (hit {})",
                        rejection.policy_id,
                        rejection.fingerprint,
                        rejection.hit_count
                    );
                }
                Action::Pause
            }
        }
    }

    fn decide_buffered(&mut self) -> Action {
        let State::Buffering { policy, builder } = std::mem::replace(&mut self.state, State::Pass)
        else {
            return Action::Continue;
        };
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        match abi::request_body(self.body_len) {
            Ok(body) => self.decide(&plugin, policy, builder.finish(&body)),
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
        let raw = abi::property(&["source", "address"]).ok().flatten()?;
        String::from_utf8(raw).ok()
    }
}

fn header_string(name: &str) -> String {
    match abi::request_header(name) {
        Ok(Some(v)) => String::from_utf8(v)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        _ => String::new(),
    }
}

impl Context for Stream {}

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
        let Some((index, policy)) = policy::select(&plugin.config, &head) else {
            return Action::Continue;
        };
        plugin.metrics.matched.inc();
        if policy.detection.is_none() {
            return Action::Continue;
        }
        let builder = ExactBuilder::start(policy, &head, &HostFacts);
        if end_of_stream {
            return self.decide(&plugin, index, builder.finish(&[]));
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
            builder,
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
}
