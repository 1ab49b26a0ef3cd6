//! One HTTP stream: collect the request's facts, call the core, apply the
//! decision.
//!
//! Requests without a body are decided in the headers phase. Requests with
//! a body are decided when it is complete (end of stream, or the trailers
//! of an HTTP/2 request), in one of two setups:
//! - `hold_request_headers` (Envoy's `allow_on_headers_stop_iteration`):
//!   loopguard pauses in the headers phase and Envoy still delivers the
//!   body; the headers go upstream only when loopguard continues, so it can
//!   still add headers to the request ([`loopguard_core::hold`] checks that
//!   Envoy really does this).
//! - otherwise headers return Continue (a Pause there would stop Envoy from
//!   calling the body callbacks), and Envoy's buffer filter placed after
//!   loopguard holds them back, so the upstream never sees a request
//!   loopguard then rejects.

use crate::abi;
use crate::metrics::{PolicyMetrics, WouldBe};
use crate::redis_store;
use crate::root::Plugin;
use loopguard_core::config::{
    AccessLog, Action as LoopAction, Mode, OnStoreError, Policy, StoreConfig, ToolStep,
};
use loopguard_core::decision::{self, Verdict};
use loopguard_core::events;
use loopguard_core::fingerprint::{self, Fingerprint, Fingerprinted, Pending};
use loopguard_core::llm;
use loopguard_core::policy::{self, Selection};
use loopguard_core::redis::RedisError;
use loopguard_core::reply::{self, Api, Headers};
use loopguard_core::request::{self, HeaderBlock, RequestFacts, RequestHead};
use loopguard_core::store::{StoreAnswer, StoreFailure, StoreReceipt, WindowStore};
use loopguard_core::tool_loops::{self, ToolVerdict};
use loopguard_core::window::WindowQuery;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// Fail-open warnings are logged at most this often.
const FAIL_OPEN_LOG_INTERVAL_MS: u64 = 10_000;
/// A tool-loop event is logged once per conversation and level within this
/// window.
const TOOL_EVENT_WINDOW_MS: u64 = 60_000;

enum State {
    /// Nothing (more) to do for this request.
    Pass,
    /// Waiting for the whole body.
    Buffering { policy: usize, pending: Pending },
    /// Paused by a throttle until the root context's tick resumes it.
    Held,
    /// Paused until Redis answers.
    Waiting(Box<Waiting>),
}

/// A request waiting for the shared store's answer.
struct Waiting {
    token: u32,
    policy: usize,
    made: Fingerprinted,
    phase: Phase,
    key: Fingerprint,
    query: WindowQuery,
    /// When the request was paused for the store: a throttle's delay
    /// counts from here, so the store's latency is part of it.
    since_ms: u64,
}

/// Whether a decision can still change the request headers: in the
/// headers phase, or in the body phase while loopguard holds them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    HeadersHeld,
    HeadersSent,
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
    /// loopguard holds the request headers (`hold_request_headers`) until
    /// it has judged the body.
    headers_held: bool,
    /// The headers phase dropped `content-length` so the body may change
    /// size (the buffer filter sets it again).
    length_dropped: bool,
    /// A body callback has come.
    body_seen: bool,
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
            headers_held: false,
            length_dropped: false,
            body_seen: false,
        }
    }

    /// Record the hit in the store, then decide and apply the decision: at
    /// once with the local table, or when Redis answers (the request waits,
    /// paused, at most the store's timeout).
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
            plugin.metrics.skipped_unparsed.inc();
        }
        let query = decision::window_query(detection, made.fallback);
        let key = decision::store_key(policy, &made.fingerprint);
        if let StoreConfig::RedisWebdis(redis) = &plugin.config.store {
            match redis_store::dispatch(plugin, self.id, redis, &key, &query) {
                Ok(token) => {
                    self.state = State::Waiting(Box::new(Waiting {
                        token,
                        policy: policy_index,
                        made,
                        phase,
                        key,
                        query,
                        since_ms: abi::now_ms(),
                    }));
                    return Action::Pause;
                }
                Err(error) => {
                    plugin.metrics.redis_error(&error).inc();
                    let answer = self.store_failed(plugin, redis.on_error, &key, &query, &error);
                    return self.apply(plugin, policy_index, made, phase, answer, abi::now_ms());
                }
            }
        }
        let answer = record_locally(plugin, &key, &query);
        self.apply(plugin, policy_index, made, phase, answer, abi::now_ms())
    }

    /// The shared store failed this request: count it in the local table
    /// or let it pass, as configured; counted, logged at most every 10 s.
    fn store_failed(
        &self,
        plugin: &Plugin,
        on_error: OnStoreError,
        key: &Fingerprint,
        query: &WindowQuery,
        error: &RedisError,
    ) -> StoreAnswer {
        let now = abi::now_ms();
        let (answer, fallback) = match on_error {
            OnStoreError::Local => (record_locally(plugin, key, query), "counted locally"),
            OnStoreError::Allow => (
                StoreAnswer::Failed(StoreFailure::Remote),
                "passed unchecked",
            ),
        };
        plugin.metrics.store_fallback(on_error).inc();
        if now.saturating_sub(plugin.last_store_error_log_ms.get()) >= FAIL_OPEN_LOG_INTERVAL_MS {
            plugin.last_store_error_log_ms.set(now);
            log::warn!("redis store {error}; requests are {fallback}");
        }
        answer
    }

    /// Decide from the store's answer and apply the decision (`since_ms`:
    /// when the request started waiting for the store).
    fn apply(
        &mut self,
        plugin: &Plugin,
        policy_index: usize,
        made: Fingerprinted,
        phase: Phase,
        answer: StoreAnswer,
        since_ms: u64,
    ) -> Action {
        let Some(policy) = plugin.config.policies.get(policy_index) else {
            return Action::Continue;
        };
        let Some(detection) = &policy.detection else {
            return Action::Continue;
        };
        let pm = plugin.metrics.policy(policy_index);
        let fp = made.fingerprint;
        let now = abi::now_ms();
        let receipt = match answer {
            StoreAnswer::Ready(receipt) => receipt,
            StoreAnswer::Failed(StoreFailure::Remote) => return Action::Continue,
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
        if receipt.added {
            plugin.metrics.tracked.add(1);
        }
        let decided = decision::decide(policy, detection, &fp, made.fallback, &receipt.state);
        // One event per fingerprint and window (the store counts the rest).
        if let Some(suppressed) = receipt.state.event {
            if let Some(event) = events::loop_detected(&decided, &made, suppressed) {
                log::info!("{event}");
                pm.detected(decided.shadow).inc();
                plugin.queue_alert(&event);
            }
        }
        let action = decided.verdict.action();
        publish_decision(plugin, action.is_some(), || {
            events::access_log(
                &policy.id,
                policy.mode,
                action.map_or("allow", |a| a.as_str()),
                Some(&fp),
                Some(receipt.state.count),
            )
        });
        if decided.shadow {
            if let Some(line) = reply::shadow_line(&decided) {
                log::info!("{line}");
            }
            match action {
                Some(LoopAction::Warn) => pm.shadow(WouldBe::Warn).inc(),
                Some(LoopAction::Throttle) => pm.shadow(WouldBe::Throttle).inc(),
                Some(LoopAction::Reject) => pm.shadow(WouldBe::Reject).inc(),
                None => {}
            }
            return Action::Continue;
        }
        for (name, value) in reply::upstream_headers(&decided) {
            // Later filters (header_mutation) copy this into the request
            // once the body phase is over; in the headers phase loopguard
            // can add the header itself.
            let _ = abi::set_filter_state(&reply::filter_state_name(name), value.as_bytes());
            if phase == Phase::HeadersHeld {
                let _ = abi::add_request_header(name, &value);
            }
        }
        self.response_headers
            .extend(reply::response_headers(&decided));
        match decided.verdict {
            Verdict::Allow => Action::Continue,
            Verdict::Warn(_) => {
                pm.warned.inc();
                Action::Continue
            }
            Verdict::Throttle { delay_ms, .. } => {
                pm.throttled.inc();
                pm.throttle_delay_ms.record(delay_ms);
                plugin.hold(self.id, since_ms.saturating_add(delay_ms));
                self.state = State::Held;
                Action::Pause
            }
            Verdict::Reject(rejection) => {
                let local = reply::rejection(&rejection, self.api);
                send_reply(&pm, &local, "loopguard_loop_detected").unwrap_or(Action::Continue)
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
        let body = match abi::request_body(self.body_len) {
            Ok(body) => body,
            Err(e) => {
                log::debug!("body unreadable (host status {}); request passed", e.0);
                plugin.metrics.skipped_unreadable.inc();
                return Action::Continue;
            }
        };
        let Some(p) = plugin.config.policies.get(policy) else {
            return Action::Continue;
        };
        // Parse the body once, for the fingerprint and the tool-loop judge.
        let parsed = if pending.reads_llm_body() || p.tool_loops.is_some() {
            llm::parse(&body, pending.path())
        } else {
            None
        };
        if let (Some(cfg), Some(req)) = (&p.tool_loops, &parsed) {
            let history = {
                let mut cache = plugin.call_cache.try_borrow_mut().ok();
                req.tool_history(cache.as_deref_mut())
            };
            if let Some(v) = tool_loops::judge(cfg, &history) {
                if let Some(action) = self.apply_tool_loop(&plugin, policy, p, &pending, req, &v) {
                    return action;
                }
            }
        }
        if p.detection.is_none() {
            return Action::Continue;
        }
        let made = pending.finish_parsed(&body, parsed.as_ref());
        let phase = if self.headers_held {
            Phase::HeadersHeld
        } else {
            Phase::HeadersSent
        };
        self.decide(&plugin, policy, made, phase)
    }

    /// Act on a tool-loop verdict. `Some` ends the request's processing (a
    /// 429); `None` lets it go on (to loop detection, if the policy has it).
    fn apply_tool_loop(
        &mut self,
        plugin: &Plugin,
        index: usize,
        policy: &Policy,
        pending: &Pending,
        req: &llm::Request<'_>,
        v: &ToolVerdict,
    ) -> Option<Action> {
        let pm = plugin.metrics.policy(index);
        pm.tool_loop(v.tier, v.step).inc();
        let shadow = policy.mode == Mode::Shadow;
        self.log_tool_event(plugin, policy, pending, req, v, shadow);
        let header = tool_loops::header_value(v);
        let _ = abi::set_filter_state(
            "loopguard",
            events::access_log_tool_loop(&policy.id, policy.mode, v.step.as_str(), &header)
                .as_bytes(),
        );
        if shadow {
            log::info!(
                "shadow: would_{} tool loop policy=\"{}\" tier={} tool={} level={}",
                v.step.as_str(),
                policy.id,
                v.tier.as_str(),
                tool_loops::safe_tool_name(&v.tool),
                v.level
            );
            pm.shadow(match v.step {
                ToolStep::Nudge => WouldBe::Nudge,
                ToolStep::Directive => WouldBe::Directive,
                ToolStep::Reject => WouldBe::Reject,
            })
            .inc();
            return None;
        }
        let cfg = policy.tool_loops.as_ref()?;
        if v.step == ToolStep::Reject {
            let local = reply::tool_loop_rejection(&policy.id, v, self.api);
            return send_reply(&pm, &local, "loopguard_tool_loop_detected");
        }
        // Forwarded: the upstream (directly while loopguard holds the
        // headers, else through header_mutation) and the client see the
        // verdict.
        let _ = abi::set_filter_state("loopguard_tool_loop", header.as_bytes());
        if self.headers_held {
            let _ = abi::add_request_header("x-loopguard-tool-loop", &header);
        }
        self.response_headers
            .push(("x-loopguard-tool-loop", header));
        // A note changes the body's length: only possible while the headers
        // can still say so (held), or when they carry no length.
        if !self.headers_held && !self.length_dropped {
            log::warn!(
                "tool-loop {} not added: the request headers already went upstream with their content-length",
                v.step.as_str()
            );
            return None;
        }
        match tool_loops::rewrite(cfg, req, v) {
            Some(body) => match abi::replace_request_body(self.body_len, &body) {
                Ok(()) if self.headers_held => {
                    if let Err(e) =
                        abi::replace_request_header("content-length", &body.len().to_string())
                    {
                        log::warn!(
                            "tool-loop {}: the body changed but its content-length could not be set (host status {})",
                            v.step.as_str(),
                            e.0
                        );
                    }
                }
                Ok(()) => {}
                Err(e) => log::warn!(
                    "could not add the tool-loop {} (host status {})",
                    v.step.as_str(),
                    e.0
                ),
            },
            None => log::debug!(
                "no conversation to add the tool-loop {} to",
                v.step.as_str()
            ),
        }
        None
    }

    /// One event line per conversation and level within a window, however
    /// fast the loop runs (remembered in the shared table, so across
    /// workers too).
    fn log_tool_event(
        &self,
        plugin: &Plugin,
        policy: &Policy,
        pending: &Pending,
        req: &llm::Request<'_>,
        v: &ToolVerdict,
        shadow: bool,
    ) {
        let key = fingerprint::tool_event_key(
            &policy.id,
            pending.identity(),
            req,
            v.tier.as_str(),
            &v.tool,
            v.level,
        );
        // Every hit of this key is a detection; the store reports the
        // first in each window.
        let once = WindowQuery {
            window_ms: TOOL_EVENT_WINDOW_MS,
            capacity: 1,
            trip_at: 2,
            cooldown_ms: 0,
            detect_at: 1,
            event_every_ms: TOOL_EVENT_WINDOW_MS,
        };
        let first = match plugin.store.try_borrow_mut() {
            Ok(mut store) => match store.record(&key, abi::now_ms(), &once) {
                StoreAnswer::Ready(r) => r.state.event.is_some(),
                StoreAnswer::Failed(_) => true,
            },
            Err(_) => true,
        };
        if first {
            let event = events::tool_loop_detected(&policy.id, v, shadow);
            log::info!("{event}");
            plugin.queue_alert(&event);
        }
    }

    /// The first body (or trailers) callback of a held request: Envoy
    /// delivers what follows the headers of held requests (or the probe
    /// released this one's headers).
    fn first_body_event(&mut self, plugin: &Plugin) {
        if self.headers_held && !self.body_seen {
            self.body_seen = true;
            self.headers_held = plugin.body_arrived(self.id);
        }
    }

    fn skip_body(&mut self, plugin: &Plugin) -> Action {
        self.state = State::Pass;
        plugin.metrics.skipped_too_large.inc();
        Action::Continue
    }
}

/// Publish a decision for Envoy's access log (filter state
/// `wasm.loopguard`) as the configuration asks: `acted` says loopguard did
/// something beyond allowing the request.
fn publish_decision(plugin: &Plugin, acted: bool, record: impl FnOnce() -> String) {
    let publish = match plugin.config.access_log {
        AccessLog::All => true,
        AccessLog::Actions => acted,
        AccessLog::Off => false,
    };
    if publish {
        let _ = abi::set_filter_state("loopguard", record().as_bytes());
    }
}

/// Record a hit in this Envoy's table (shared data).
fn record_locally(plugin: &Plugin, key: &Fingerprint, query: &WindowQuery) -> StoreAnswer {
    match plugin.store.try_borrow_mut() {
        Ok(mut store) => store.record(key, abi::now_ms(), query),
        Err(_) => StoreAnswer::Failed(StoreFailure::Backend),
    }
}

/// Answer the request with `local` instead of forwarding it. `None` if
/// Envoy refused (the request then passes).
fn send_reply(pm: &PolicyMetrics, local: &reply::LocalReply, details: &str) -> Option<Action> {
    let headers: Vec<(&str, &str)> = local
        .headers
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .collect();
    if let Err(e) = abi::send_local_response(local.status, details, &headers, local.body.as_bytes())
    {
        log::warn!(
            "could not send the {} (host status {}); request passed",
            local.status,
            e.0
        );
        return None;
    }
    pm.rejected.inc();
    Some(Action::Pause)
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
    fn on_http_call_response(
        &mut self,
        token: u32,
        num_headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if !matches!(&self.state, State::Waiting(w) if w.token == token) {
            return;
        }
        let State::Waiting(waiting) = std::mem::replace(&mut self.state, State::Pass) else {
            return;
        };
        let Some(plugin) = self.plugin.clone() else {
            // Not reachable (a waiting stream has a plugin), but never
            // leave a request paused.
            let _ = abi::resume_request();
            return;
        };
        let Waiting {
            token: _,
            policy,
            made,
            phase,
            key,
            query,
            since_ms,
        } = *waiting;
        let reply = redis_store::read_reply(num_headers, body_size);
        plugin.metrics.redis_call(&reply).inc();
        let answer = match reply {
            Ok(state) => StoreAnswer::Ready(StoreReceipt {
                state,
                evicted: false,
                added: false,
                cas_retries: 0,
            }),
            Err(error) => match &plugin.config.store {
                StoreConfig::RedisWebdis(redis) => {
                    self.store_failed(&plugin, redis.on_error, &key, &query, &error)
                }
                StoreConfig::Local => record_locally(&plugin, &key, &query),
            },
        };
        // The request was paused for this answer: go on unless the decision
        // holds it (throttle) or answered it (429).
        if self.apply(&plugin, policy, made, phase, answer, since_ms) == Action::Continue {
            if let Err(e) = abi::resume_request() {
                log::debug!(
                    "request could not resume after the store answered (host status {})",
                    e.0
                );
            }
        }
    }

    fn on_done(&mut self) -> bool {
        // The client left while the request was held by a throttle.
        if matches!(self.state, State::Held) {
            if let Some(plugin) = &self.plugin {
                plugin.release(self.id);
            }
            self.state = State::Pass;
        }
        if self.headers_held {
            if let Some(plugin) = &self.plugin {
                plugin.forget_held(self.id);
            }
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
        // All headers in one host call; everything below reads this block.
        let Some(headers) = abi::request_headers().ok().and_then(HeaderBlock::parse) else {
            return Action::Continue;
        };
        #[cfg(feature = "fault-injection")]
        crate::faults::on_request(&headers);
        // The upstream trusts x-loopguard-* request headers: only loopguard
        // sets them.
        for name in reply::REQUEST_HEADERS {
            if headers.get(name).is_some() {
                let _ = abi::remove_request_header(name);
            }
        }
        let facts = HostFacts { headers: &headers };
        let (method, path, authority) = (
            headers.text(":method"),
            headers.text(":path"),
            headers.text(":authority"),
        );
        let head = RequestHead {
            method: &method,
            path: &path,
            authority: &authority,
        };
        let index = match policy::select(&plugin.config, &head, &facts) {
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
        let pm = plugin.metrics.policy(index);
        pm.matched.inc();
        if !policy.is_active() {
            return Action::Continue;
        }
        if policy::is_exempt(&plugin.config, policy, &head, &facts) {
            pm.exempted.inc();
            publish_decision(&plugin, true, || {
                events::access_log(&policy.id, policy.mode, "exempt", None, None)
            });
            return Action::Continue;
        }
        self.api = Api::for_path(head.path_only());
        let pending = Pending::start(&plugin.config, policy, &head, &facts);
        // An upgrade (WebSocket) or CONNECT sends nothing until it is
        // answered: judged on its headers, never held for a body.
        if end_of_stream || request::is_tunnel(&method, headers.get("upgrade")) {
            // No body: no conversation for tool loops to read.
            if policy.detection.is_none() {
                return Action::Continue;
            }
            return self.decide(&plugin, index, pending.finish(&[]), Phase::HeadersHeld);
        }
        let declared = headers
            .get("content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok());
        if declared.is_some_and(|len| len > plugin.config.max_body_bytes) {
            return self.skip_body(&plugin);
        }
        self.state = State::Buffering {
            policy: index,
            pending,
        };
        if plugin.holds_headers() {
            // The headers wait for the body's verdict; loopguard sets
            // content-length itself if a note changes the body.
            self.headers_held = true;
            plugin.watch_held(self.id);
            return Action::Pause;
        }
        if policy.may_rewrite_bodies() {
            // A nudge changes the body's length: the buffer filter after
            // loopguard sets content-length again once the body is final.
            let _ = abi::remove_request_header("content-length");
            self.length_dropped = true;
        }
        Action::Continue
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !matches!(self.state, State::Buffering { .. }) {
            return Action::Continue;
        }
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        self.first_body_event(&plugin);
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
        // body callback (and one with trailers but no data, no body
        // callback at all).
        if let Some(plugin) = self.plugin.clone() {
            self.first_body_event(&plugin);
        }
        self.decide_buffered()
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        for (name, value) in std::mem::take(&mut self.response_headers) {
            let _ = abi::add_response_header(name, &value);
        }
        Action::Continue
    }
}
