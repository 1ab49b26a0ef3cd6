//! The request-headers event: which policy applies, and whether the
//! request is judged now (no body), or after its body (buffered; with
//! `hold_request_headers`, its headers held until then).

use crate::act::{events, reply};
use crate::detect::fingerprint::Pending;
use crate::flow::{
    count, count_opt, mcp, usage, Effect, Effects, Engine, Level, MetricId, Phase, Request, State,
    Step, UsageFor, MAX_UNKNOWN_ROUTE_POLICIES,
};
use crate::metrics::SkipReason;
use crate::request::policy::{self, Selection};
use crate::request::{self, RequestFacts, RequestHead};
use crate::state::store::BucketBackend;
use std::rc::Rc;

impl<B: BucketBackend> Engine<B> {
    /// The request headers arrived (`end_of_stream`: no body follows).
    pub fn on_headers(
        &mut self,
        r: &mut Request,
        head: &RequestHead<'_>,
        facts: &dyn RequestFacts,
        end_of_stream: bool,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        out.push(count(MetricId::REQUESTS, 1));
        // The upstream trusts x-loopguard-* request headers: only loopguard
        // sets them.
        for name in reply::REQUEST_HEADERS {
            if facts.has_header(name) {
                out.push(Effect::RemoveRequestHeader(name));
            }
        }
        let config = Rc::clone(&self.config);
        let index = match policy::select(&config, head, facts) {
            Selection::Policy(i) => i,
            Selection::None => return Step::Continue,
            // Logged the first time it is seen.
            Selection::UnknownRoutePolicy(id) => {
                let seen = &mut self.unknown_route_policies;
                if !seen.contains(&id) && seen.len() < MAX_UNKNOWN_ROUTE_POLICIES {
                    let line = format!("route metadata names policy \"{id}\", which this configuration does not have; its requests pass unchecked");
                    out.push(Effect::Log(Level::Warn, line));
                    seen.push(id);
                }
                return Step::Continue;
            }
        };
        let Some(policy) = config.policies.get(index) else {
            return Step::Continue;
        };
        count_opt(out, self.registry.matched(index), 1);
        if !policy.is_active() {
            return Step::Continue;
        }
        if policy::is_exempt(&config, policy, head, facts) {
            count_opt(out, self.registry.exempted(index), 1);
            self.publish_decision(out, (policy, true), "exempt", || events::NO_REPEAT);
            return Step::Continue;
        }
        let path = head.path_only();
        r.api = reply::Api::for_path(path);
        let pending = Pending::start(&config, policy, head, facts);
        r.caller = usage::caller_hash(&policy.id, pending.identity());
        r.started_ms = now;
        if policy.mcp.is_some() {
            // MCP: only a POST carries a call (GET opens a stream, DELETE
            // ends a session); nothing else of the request is judged.
            if head.method != "POST" || end_of_stream {
                return Step::Continue;
            }
            r.mcp = Some(Box::new(mcp::McpStream::new(index, policy, facts)));
            // The result must come back readable: a compressed one could
            // not be judged (Envoy's compressor, placed before loopguard,
            // may still compress it towards the client). Only for a POST
            // that may carry a call (2026-07-28 names its method).
            let may_call = facts
                .header("mcp-method")
                .is_none_or(|m| m.as_slice() == b"tools/call");
            if may_call && facts.has_header("accept-encoding") {
                out.push(Effect::RemoveRequestHeader("accept-encoding"));
            }
        }
        // An LLM call's answer is read for its usage: a request with a body
        // to an LLM API path, or judged by a policy that reads LLM bodies
        // (a body-less one, or another API's, costs no response-path work).
        // Under a budget every request is read: each is a call, whatever
        // its body.
        let llm_call = || {
            pending.reads_llm_body()
                || policy.tool_loops.is_some()
                || request::llm::is_llm_api_path(path)
        };
        if policy.mcp.is_none() && (policy.budget.is_some() || (!end_of_stream && llm_call())) {
            r.usage_for = Some(UsageFor {
                policy: index,
                ..UsageFor::default()
            });
            if policy.budget.is_some() {
                self.budget_headers(r, index, path, facts);
                // Usage is read from the answer as it passes: it must come
                // uncompressed (a compressor before loopguard may still
                // compress it towards the client).
                out.push(Effect::RemoveRequestHeader("accept-encoding"));
            }
        }
        // An upgrade (WebSocket) or CONNECT sends nothing until it is
        // answered: judged on its headers, never held for a body.
        let tunnel = request::is_tunnel(head.method, facts.header("upgrade").as_deref());
        if tunnel && policy.budget.is_some() {
            // Checked and counted as a call as it opens; what passes
            // through the tunnel is not read.
            count_opt(out, self.registry.budget(index).map(|i| i.tunnels()), 1);
        }
        if end_of_stream || tunnel {
            if policy.detection.is_none() {
                // No body: no conversation for tool loops to read; its
                // budget keys are those its headers name.
                return self.budget_gate_only(r, Phase::HeadersHeld, now, out);
            }
            self.budget_header_keys(r);
            let made = pending.finish(&[]);
            return self.count_hit(r, index, made, Phase::HeadersHeld, now, out);
        }
        let declared = facts
            .header("content-length")
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u64>().ok());
        if let Some(len) = declared.filter(|len| *len > config.max_body_bytes) {
            return self.skip_body(r, len, Phase::HeadersHeld, now, out);
        }
        r.body_limit = config.max_body_bytes;
        r.state = State::Buffering {
            policy: index,
            pending,
        };
        if self.hold.holds(now) {
            // The headers wait for the body's verdict; loopguard sets
            // content-length itself if a note changes the body.
            r.headers_held = true;
            if self.hold.held(r.id, now) {
                out.push(Effect::ArmTick);
            }
            return Step::Pause;
        }
        if policy.may_rewrite_bodies()
            || (policy.budget.as_ref().is_some_and(|b| b.reads_usage())
                && crate::flow::budget::asks_stream_usage(path))
        {
            // A nudge changes the body's length: the buffer filter after
            // loopguard sets content-length again once the body is final.
            out.push(Effect::RemoveRequestHeader("content-length"));
            r.length_dropped = true;
        }
        Step::Continue
    }

    /// Stop buffering a body too large to judge (`len` bytes, declared or
    /// buffered): what is held so far flows on, counted, once the budget
    /// keys its headers name are checked.
    pub(in crate::flow) fn skip_body(
        &mut self,
        r: &mut Request,
        len: u64,
        phase: Phase,
        now: u64,
        out: &mut Effects,
    ) -> Step {
        if let Some(b) = r.budget.as_deref_mut() {
            b.set_body_bytes(len);
        }
        r.state = State::Pass;
        self.mcp_too_large(r, out);
        out.push(count(self.registry.skipped(SkipReason::TooLarge), 1));
        self.budget_gate_only(r, phase, now, out)
    }
}
