//! The whole request flow, driven natively: every mode and action, every
//! store outcome, with an in-memory table and a scripted shared store.

use super::*;
use crate::request::tests::FakeFacts;
use crate::request::RequestHead;
use crate::state::store::tests::MemoryBackend;
use crate::state::store::CallReply;
use serde_json::{json, Value};

/// An engine over an in-memory table, and a clock.
pub(super) struct Harness {
    pub(super) engine: Engine<MemoryBackend>,
    pub(super) now: u64,
    next_id: u32,
}

/// What one request did: its effects (all events so far) and its step
/// after the last event.
pub(super) struct Sent {
    pub(super) req: Request,
    pub(super) effects: Effects,
    pub(super) step: Step,
}

impl Sent {
    pub(super) fn reply(&self) -> Option<&LocalReply> {
        self.effects.iter().find_map(|e| match e {
            Effect::LocalReply(r, _) => Some(r),
            _ => None,
        })
    }
    pub(super) fn status(&self) -> u32 {
        self.reply().map_or(200, |r| r.status)
    }
    pub(super) fn json(&self) -> Value {
        serde_json::from_str(&self.reply().unwrap().body).unwrap()
    }
    pub(super) fn request_headers(&self) -> Vec<(&str, &str)> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::AddRequestHeader(n, v) => Some((*n, v.as_str())),
                _ => None,
            })
            .collect()
    }
    pub(super) fn filter_state(&self, name: &str) -> Option<&str> {
        self.effects.iter().rev().find_map(|e| match e {
            Effect::SetFilterState(n, v) if n == name => Some(v.as_str()),
            _ => None,
        })
    }
    pub(super) fn logs(&self, level: Level) -> Vec<&str> {
        self.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Log(l, m) if *l == level => Some(m.as_str()),
                _ => None,
            })
            .collect()
    }
    pub(super) fn call(&self) -> Option<&StoreCall> {
        self.effects.iter().find_map(|e| match e {
            Effect::SendStoreCall(c) => Some(c),
            _ => None,
        })
    }
}

pub(super) fn facts(headers: &[(&str, &str)]) -> FakeFacts {
    headers
        .iter()
        .fold(FakeFacts::default(), |f, (k, v)| f.with(k, v))
}

impl Harness {
    pub(super) fn new(config: Value) -> Harness {
        let cfg = Config::from_value(&config).unwrap();
        let engine = Engine::new(
            cfg,
            "test",
            |_| Ok(MemoryBackend::default()),
            |var| (var == "SECRET").then(|| "s3cret".to_string()),
            42,
        )
        .unwrap();
        Harness {
            engine,
            now: 1_700_000_000_000,
            next_id: 1,
        }
    }

    pub(super) fn policy(spec: Value) -> Harness {
        Harness::new(json!({"policies": [{"id": "p", "spec": spec}]}))
    }

    /// A metric's current value over the given effects.
    pub(super) fn metric(&self, effects: &[Effect], name: &str) -> i64 {
        let defs = self.engine.registry().defs();
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Count(id, n) if defs[id.0 as usize].0 == name => Some(*n),
                Effect::Record(id, _) if defs[id.0 as usize].0 == name => Some(1),
                _ => None,
            })
            .sum()
    }

    /// Send a request's headers and, if it has one, its body in one chunk.
    pub(super) fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Sent {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = Request::new(id);
        let mut out = Effects::new();
        let head = RequestHead {
            method,
            path,
            authority: "api.example.com",
        };
        let f = facts(headers);
        let mut step =
            self.engine
                .on_headers(&mut req, &head, &f, body.is_empty(), self.now, &mut out);
        if !body.is_empty() {
            let given = req.wants_body(body.len(), true).then_some(body);
            step = self
                .engine
                .on_body(&mut req, body.len(), true, given, self.now, &mut out);
        }
        Sent {
            req,
            effects: out,
            step,
        }
    }

    pub(super) fn post(&mut self, body: &str) -> Sent {
        self.send(
            "POST",
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-1")],
            body.as_bytes(),
        )
    }

    pub(super) fn get(&mut self, path: &str) -> Sent {
        self.send("GET", path, &[("authorization", "Bearer sk-1")], b"")
    }

    pub(super) fn tick(&mut self) -> Effects {
        let mut out = Effects::new();
        self.engine.on_tick(self.now, &mut out);
        out
    }

    /// The upstream's answer with `status` reaches the request: the
    /// effects of its response headers.
    pub(super) fn answer(&mut self, s: &mut Sent, status: u32) -> Effects {
        let mut out = Effects::new();
        self.engine
            .on_response_headers(&mut s.req, Some(status), self.now, &mut out);
        out
    }

    pub(super) fn response(&mut self, s: &mut Sent) -> Vec<(&'static str, String)> {
        self.answer(s, 200)
            .into_iter()
            .filter_map(|e| match e {
                Effect::AddResponseHeader(n, v) => Some((n, v)),
                _ => None,
            })
            .collect()
    }
}

pub(super) fn detection(ld: Value) -> Value {
    json!({"selector": {}, "loop_detection": ld})
}

fn exact(threshold: u32) -> Value {
    detection(
        json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": threshold}),
    )
}

const CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"Is the build green?"}]}"#;

// --- actions -----------------------------------------------------------------

#[test]
fn reject_at_the_threshold_with_a_429_the_sdk_reads() {
    let mut h = Harness::policy(exact(3));
    let first = h.post(CHAT);
    assert_eq!((first.step, first.status()), (Step::Continue, 200));
    assert_eq!(h.metric(&first.effects, "loopguard.requests_total"), 1);
    assert_eq!(
        h.metric(&first.effects, "loopguard.matched_total.policy.p"),
        1
    );
    assert_eq!(h.metric(&first.effects, "loopguard.table_entries_used"), 1);
    h.now += 1000;
    assert_eq!(h.post(CHAT).status(), 200);
    let third = h.post(CHAT);
    assert_eq!((third.step, third.status()), (Step::Pause, 429));
    let err = &third.json()["error"];
    assert_eq!(
        (err["code"].as_str(), err["hit_count"].as_u64()),
        (Some("recursive_loop_detected"), Some(3))
    );
    let reply = third.reply().unwrap();
    // Until the (N-1)th newest hit (just now) leaves the window.
    assert!(
        reply.headers.contains(&("retry-after", "60".to_string())),
        "{:?}",
        reply.headers
    );
    assert_eq!(
        h.metric(&third.effects, "loopguard.rejected_total.policy.p"),
        1
    );
    assert_eq!(
        h.metric(
            &third.effects,
            "loopguard.detected_total.policy.p.mode.enforce"
        ),
        1
    );
    assert!(third.logs(Level::Info)[0].contains("\"event\":\"loop.detected\""));
    // The access log gets the decision.
    assert!(third
        .filter_state("loopguard")
        .unwrap()
        .contains("\"action\":\"reject\""));
    // Anthropic's path: Anthropic's error shape.
    let a = h.send(
        "POST",
        "/v1/messages",
        &[("x-api-key", "k")],
        CHAT.as_bytes(),
    );
    assert_eq!(a.status(), 200);
}

#[test]
fn throttle_holds_the_request_until_the_tick_resumes_it() {
    let mut h = Harness::policy(detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "action": "throttle", "throttle_step_ms": 150})));
    h.get("/v1/x");
    let mut held = h.get("/v1/x");
    assert_eq!(held.step, Step::Pause);
    assert!(held.effects.contains(&Effect::ArmTick));
    assert_eq!(h.metric(&held.effects, "loopguard.throttle_pending"), 1);
    assert_eq!(
        h.metric(&held.effects, "loopguard.throttle_delay_ms.policy.p"),
        1
    );
    h.now += 299;
    assert!(!h.tick().contains(&Effect::Resume(held.req.id)));
    h.now += 1;
    let t = h.tick();
    assert!(t.contains(&Effect::Resume(held.req.id)));
    assert_eq!(h.metric(&t, "loopguard.throttle_pending"), -1);
    assert!(t.contains(&Effect::StopTick));
    let resp = h.response(&mut held);
    assert!(resp.contains(&("x-loopguard-delay-ms", "300".to_string())));
    assert!(resp.contains(&("x-loopguard-loop-count", "2".to_string())));
}

#[test]
fn warn_adds_headers_for_the_client_and_the_upstream() {
    let mut h = Harness::policy(detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "action": "warn"})));
    h.get("/v1/x");
    // Body-less: judged while the headers are still in hand.
    let mut w = h.get("/v1/x");
    assert_eq!(w.step, Step::Continue);
    assert!(w
        .request_headers()
        .contains(&("x-loopguard-warning", "loop_warn")));
    assert_eq!(w.filter_state("loopguard_warning"), Some("loop_warn"));
    assert!(h
        .response(&mut w)
        .contains(&("x-loopguard-policy", "p".to_string())));
    assert_eq!(h.metric(&w.effects, "loopguard.warned_total.policy.p"), 1);
    // With a body and no held headers: only filter state (header_mutation
    // copies it upstream).
    h.post(CHAT);
    let b = h.post(CHAT);
    assert!(b.request_headers().is_empty());
    assert_eq!(b.filter_state("loopguard_loop_count"), Some("2"));
}

#[test]
fn ladder_warns_then_throttles_then_rejects() {
    let mut h = Harness::policy(detection(json!({"enabled": true, "window_seconds": 60,
        "escalation": [{"at": 2, "action": "warn"}, {"at": 3, "action": "throttle"}, {"at": 4, "action": "reject"}],
        "throttle_step_ms": 10})));
    let steps: Vec<(Step, u32, i64)> = (0..5)
        .map(|_| {
            let s = h.get("/v1/l");
            let warned = h.metric(&s.effects, "loopguard.warned_total.policy.p");
            (s.step, s.status(), warned)
        })
        .collect();
    assert_eq!(
        steps,
        vec![
            (Step::Continue, 200, 0),
            (Step::Continue, 200, 1),
            (Step::Pause, 200, 0),
            (Step::Pause, 429, 0),
            (Step::Pause, 429, 0)
        ]
    );
}

#[test]
fn cooldown_keeps_rejecting_after_the_window_clears() {
    let mut h = Harness::policy(detection(json!({"enabled": true, "window_seconds": 1,
        "threshold_identical_requests": 2, "cooldown_seconds": 10})));
    h.get("/v1/c");
    assert_eq!(h.get("/v1/c").status(), 429);
    h.now += 5_000;
    let again = h.get("/v1/c");
    assert_eq!(again.status(), 429);
    assert_eq!(again.json()["error"]["cooldown_seconds"], 10);
    h.now += 6_000;
    assert_eq!(h.get("/v1/c").status(), 200);
}

#[test]
fn shadow_mode_shows_nothing_and_counts_what_it_would_do() {
    let mut spec = exact(2);
    spec["mode"] = json!("shadow");
    let mut h = Harness::policy(spec);
    h.get("/v1/s");
    let mut s = h.get("/v1/s");
    assert_eq!((s.step, s.status()), (Step::Continue, 200));
    assert!(s.request_headers().is_empty());
    assert!(h.response(&mut s).is_empty());
    assert_eq!(
        h.metric(&s.effects, "loopguard.shadow_total.policy.p.action.reject"),
        1
    );
    assert!(s
        .logs(Level::Info)
        .iter()
        .any(|l| l.starts_with("shadow: would_reject policy=\"p\"")));
    assert_eq!(
        h.metric(&s.effects, "loopguard.detected_total.policy.p.mode.shadow"),
        1
    );
}

#[test]
fn llm_tail_and_session_fingerprints_count_the_conversation_not_the_bytes() {
    let mut h = Harness::policy(detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "similarity": "llm_tail"})));
    h.post(CHAT);
    // Spacing, case and sampling fields do not matter.
    let same = h.post(r#"{"model": "m", "temperature": 0.2, "messages": [{"role": "user", "content": "is the BUILD   green?"}]}"#);
    assert_eq!(same.status(), 429);
    let mut h = Harness::policy(detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "similarity": "session"})));
    let session = |h: &mut Harness, body: &str| {
        h.send(
            "POST",
            "/v1/chat/completions",
            &[("x-session-id", "s1")],
            body.as_bytes(),
        )
    };
    session(&mut h, CHAT);
    assert_eq!(
        session(
            &mut h,
            r#"{"model":"m","messages":[{"role":"user","content":"other"}]}"#
        )
        .status(),
        429
    );
}

#[test]
fn an_unparsed_body_is_fingerprinted_exactly_and_counted() {
    let mut h = Harness::policy(detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "similarity": "llm_tail"})));
    let s = h.post("not json");
    assert_eq!(
        h.metric(&s.effects, "loopguard.bodies_skipped_total.reason.unparsed"),
        1
    );
    assert_eq!(h.post("not json").status(), 429);
}

// --- bodies and headers ------------------------------------------------------

#[test]
fn bodies_above_max_body_bytes_pass_unjudged_and_are_counted() {
    let mut h =
        Harness::new(json!({"max_body_bytes": 8, "policies": [{"id": "p", "spec": exact(2)}]}));
    // Declared too large: decided in the headers phase.
    let mut req = Request::new(1);
    let mut out = Effects::new();
    let head = RequestHead {
        method: "POST",
        path: "/v1/x",
        authority: "",
    };
    let step = h.engine.on_headers(
        &mut req,
        &head,
        &facts(&[("content-length", "100")]),
        false,
        h.now,
        &mut out,
    );
    assert_eq!(step, Step::Continue);
    assert_eq!(
        h.metric(&out, "loopguard.bodies_skipped_total.reason.too_large"),
        1
    );
    // Chunked: stops once the buffered size crosses the limit.
    for _ in 0..2 {
        let mut req = Request::new(2);
        let mut out = Effects::new();
        h.engine
            .on_headers(&mut req, &head, &facts(&[]), false, h.now, &mut out);
        assert_eq!(
            h.engine.on_body(&mut req, 4, false, None, h.now, &mut out),
            Step::Pause
        );
        assert!(!req.wants_body(12, true));
        assert_eq!(
            h.engine.on_body(&mut req, 12, true, None, h.now, &mut out),
            Step::Continue
        );
        assert_eq!(
            h.metric(&out, "loopguard.bodies_skipped_total.reason.too_large"),
            1
        );
    }
}

#[test]
fn an_unreadable_body_passes_and_is_counted() {
    let mut h = Harness::policy(exact(2));
    let mut req = Request::new(1);
    let mut out = Effects::new();
    let head = RequestHead {
        method: "POST",
        path: "/v1/x",
        authority: "",
    };
    h.engine
        .on_headers(&mut req, &head, &facts(&[]), false, h.now, &mut out);
    assert!(req.wants_body(3, true));
    assert_eq!(
        h.engine.on_body(&mut req, 3, true, None, h.now, &mut out),
        Step::Continue
    );
    assert_eq!(
        h.metric(&out, "loopguard.bodies_skipped_total.reason.unreadable"),
        1
    );
}

#[test]
fn client_sent_loopguard_headers_are_removed() {
    let mut h = Harness::policy(exact(5));
    let s = h.send(
        "GET",
        "/v1/x",
        &[
            ("x-loopguard-warning", "forged"),
            ("x-loopguard-policy", "x"),
        ],
        b"",
    );
    let removed: Vec<&str> = s
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::RemoveRequestHeader(n) => Some(*n),
            _ => None,
        })
        .collect();
    assert_eq!(removed, ["x-loopguard-warning", "x-loopguard-policy"]);
}

#[test]
fn exempt_inactive_and_unknown_route_policies() {
    let mut h = Harness::new(json!({"route_metadata": true, "policies": [
        {"id": "off", "spec": {"selector": {"pathPrefix": "/batch"}, "loop_detection": {"enabled": false}}},
        {"id": "p", "spec": {"selector": {}, "exempt": [{"key": "header:x-ci", "present": true}],
            "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 2}}}]}));
    for _ in 0..3 {
        assert_eq!(h.get("/batch/x").status(), 200);
        let e = h.send("GET", "/v1/x", &[("x-ci", "1")], b"");
        assert_eq!(e.status(), 200);
        assert_eq!(h.metric(&e.effects, "loopguard.exempted_total.policy.p"), 1);
        assert!(e
            .filter_state("loopguard")
            .unwrap()
            .contains("\"action\":\"exempt\""));
    }
    // A route naming a policy that does not exist: logged once, passes.
    let unknown = |h: &mut Harness| {
        let mut req = Request::new(9);
        let mut out = Effects::new();
        let mut f = facts(&[]);
        f.route_policy = Some("ghost".into());
        let head = RequestHead {
            method: "GET",
            path: "/v1/x",
            authority: "",
        };
        let step = h
            .engine
            .on_headers(&mut req, &head, &f, true, h.now, &mut out);
        (step, out)
    };
    let (step, first) = unknown(&mut h);
    assert_eq!(step, Step::Continue);
    assert_eq!(
        first
            .iter()
            .filter(|e| matches!(e, Effect::Log(Level::Warn, _)))
            .count(),
        1
    );
    let (_, second) = unknown(&mut h);
    assert!(!second.iter().any(|e| matches!(e, Effect::Log(..))));
}

#[test]
fn tunnels_are_judged_on_their_headers() {
    let mut h = Harness::new(
        json!({"hold_request_headers": true, "policies": [{"id": "p", "spec": exact(2)}]}),
    );
    let ws = |h: &mut Harness| {
        let mut req = Request::new(1);
        let mut out = Effects::new();
        let head = RequestHead {
            method: "GET",
            path: "/v1/realtime",
            authority: "",
        };
        let step = h.engine.on_headers(
            &mut req,
            &head,
            &facts(&[("upgrade", "websocket")]),
            false,
            h.now,
            &mut out,
        );
        (step, out)
    };
    assert_eq!(ws(&mut h).0, Step::Continue);
    let (step, out) = ws(&mut h);
    assert_eq!(step, Step::Pause);
    assert!(out
        .iter()
        .any(|e| matches!(e, Effect::LocalReply(r, _) if r.status == 429)));
    assert!(!out.contains(&Effect::ArmTick), "never held for a body");
}

// --- holding headers -----------------------------------------------------------

#[test]
fn held_headers_get_warn_headers_directly_and_the_probe_is_confirmed() {
    let mut h = Harness::new(
        json!({"hold_request_headers": true, "policies": [{"id": "p",
        "spec": detection(json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 2, "action": "warn"}))}]}),
    );
    let head = RequestHead {
        method: "POST",
        path: "/v1/x",
        authority: "",
    };
    let mut req = Request::new(1);
    let mut out = Effects::new();
    assert_eq!(
        h.engine
            .on_headers(&mut req, &head, &facts(&[]), false, h.now, &mut out),
        Step::Pause
    );
    assert!(out.contains(&Effect::ArmTick), "watched until confirmed");
    assert_eq!(
        h.engine
            .on_body(&mut req, 2, true, Some(b"{}"), h.now, &mut out),
        Step::Continue
    );
    let second = h.send("POST", "/v1/x", &[], b"{}");
    assert!(
        !second.effects.contains(&Effect::ArmTick),
        "confirmed: nothing watched"
    );
    assert!(second
        .request_headers()
        .contains(&("x-loopguard-warning", "loop_warn")));
    assert_eq!(h.engine.hold.probe(), crate::act::hold::Probe::Confirmed);
}

#[test]
fn held_requests_without_a_body_are_released_by_the_tick() {
    let mut h = Harness::new(
        json!({"hold_request_headers": true, "policies": [{"id": "p", "spec": exact(2)}]}),
    );
    let head = RequestHead {
        method: "POST",
        path: "/v1/x",
        authority: "",
    };
    let mut reqs: Vec<Request> = (1..=3).map(Request::new).collect();
    for r in &mut reqs {
        let mut out = Effects::new();
        assert_eq!(
            h.engine
                .on_headers(r, &head, &facts(&[]), false, h.now, &mut out),
            Step::Pause
        );
    }
    h.now += crate::act::hold::HOLD_PROBE_MS;
    let t = h.tick();
    for r in &reqs {
        assert!(t.contains(&Effect::Resume(r.id)));
    }
    assert_eq!(h.metric(&t, "loopguard.hold_released_total"), 3);
    assert_eq!(
        t.iter()
            .filter(|e| matches!(e, Effect::Log(Level::Error, _)))
            .count(),
        1
    );
    // The late body of a released request is judged without held headers.
    let mut out = Effects::new();
    let r = &mut reqs[0];
    assert_eq!(
        h.engine.on_body(r, 2, true, Some(b"{}"), h.now, &mut out),
        Step::Continue
    );
    assert!(!r.headers_held);
}

// --- tool loops ------------------------------------------------------------------

fn tool_conversation(calls: usize) -> String {
    let mut msgs = vec![json!({"role": "user", "content": "read the config"})];
    for i in 0..calls {
        msgs.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("c{i}"), "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"/etc/a\"}"}}]}));
        msgs.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "no change"}));
    }
    json!({"model": "m", "messages": msgs}).to_string()
}

#[test]
fn tool_loop_ladder_nudges_directs_then_rejects() {
    let mut h = Harness::policy(
        json!({"selector": {}, "tool_loops": {"enabled": true, "directive_disables_tools": true}}),
    );
    let nudge = h.post(&tool_conversation(3));
    assert_eq!(nudge.step, Step::Continue);
    let body = nudge.effects.iter().find_map(|e| match e {
        Effect::ReplaceBody {
            body, set_length, ..
        } => Some((String::from_utf8(body.clone()).unwrap(), *set_length)),
        _ => None,
    });
    let (body, set_length) = body.expect("a note is appended");
    assert!(
        body.contains("called the tool `read_file` 3 times"),
        "{body}"
    );
    assert!(!set_length, "the buffer filter sets content-length");
    assert_eq!(
        nudge.filter_state("loopguard_tool_loop"),
        Some("identical;tool=read_file;level=1")
    );
    assert_eq!(
        h.metric(
            &nudge.effects,
            "loopguard.tool_loop_detected_total.policy.p.tier.identical.step.nudge"
        ),
        1
    );
    let directive = h.post(&tool_conversation(4));
    assert!(directive.effects.iter().any(|e| matches!(e, Effect::ReplaceBody { body, .. } if String::from_utf8_lossy(body).contains("\"tool_choice\":\"none\""))));
    let reject = h.post(&tool_conversation(5));
    assert_eq!((reject.step, reject.status()), (Step::Pause, 429));
    assert_eq!(reject.json()["error"]["code"], "tool_loop_detected");
}

#[test]
fn tool_loop_events_are_logged_once_per_conversation_and_level() {
    let mut h = Harness::policy(json!({"selector": {}, "tool_loops": {"enabled": true}}));
    let events = |s: &Sent| {
        s.logs(Level::Info)
            .iter()
            .filter(|l| l.contains("loop.tool.detected"))
            .count()
    };
    let first = h.post(&tool_conversation(3));
    let again = h.post(&tool_conversation(3));
    assert_eq!((events(&first), events(&again)), (1, 0));
    h.now += TOOL_EVENT_WINDOW_MS;
    assert_eq!(events(&h.post(&tool_conversation(3))), 1);
}

#[test]
fn shadow_tool_loops_change_nothing() {
    let mut h =
        Harness::policy(json!({"mode": "shadow", "selector": {}, "tool_loops": {"enabled": true}}));
    let s = h.post(&tool_conversation(5));
    assert_eq!((s.step, s.status()), (Step::Continue, 200));
    assert!(!s
        .effects
        .iter()
        .any(|e| matches!(e, Effect::ReplaceBody { .. })));
    assert_eq!(
        h.metric(&s.effects, "loopguard.shadow_total.policy.p.action.reject"),
        1
    );
}

// --- the local store ---------------------------------------------------------------

#[test]
fn cas_conflict_exhausted_fails_open_counted_and_logged_once() {
    let mut h = Harness::policy(exact(2));
    h.engine.local.backend.conflicts_ahead = u32::MAX;
    let first = h.get("/v1/x");
    assert_eq!((first.step, first.status()), (Step::Continue, 200));
    assert_eq!(
        h.metric(&first.effects, "loopguard.store_fail_open_total"),
        1
    );
    assert_eq!(first.logs(Level::Warn).len(), 1);
    assert!(first.logs(Level::Warn)[0].contains("store contention for policy \"p\""));
    let second = h.get("/v1/x");
    assert_eq!(second.status(), 200);
    assert!(
        second.logs(Level::Warn).is_empty(),
        "logged at most every 10 s"
    );
}

#[test]
fn lost_races_are_retried_and_counted() {
    let mut h = Harness::policy(exact(2));
    h.engine.local.backend.conflicts_ahead = 3;
    let s = h.get("/v1/x");
    assert_eq!(h.metric(&s.effects, "loopguard.store_cas_retries_total"), 3);
    assert_eq!(h.get("/v1/x").status(), 429, "the hit was recorded once");
}

// --- the shared store -----------------------------------------------------------------

fn redis(on_error: &str, threshold: u32) -> Harness {
    Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis", "on_error": on_error},
        "policies": [{"id": "p", "spec": exact(threshold)}]}),
    )
}

/// webdis's answer to one hit: count, until-allowed ms, cooldown ms, event.
fn answer(count: u32, until: u64, event: i64) -> CallReply {
    CallReply {
        status: Some("200".into()),
        body: format!(r#"{{"FCALL":[{count},{until},0,{event}]}}"#).into_bytes(),
    }
}

impl Harness {
    /// A request that waits for the shared store: its call sent as token.
    fn waiting(&mut self, token: u32) -> Sent {
        let mut s = self.get("/v1/r");
        assert_eq!(s.step, Step::Pause);
        let call = s.call().expect("a store call").clone();
        assert_eq!(call.cluster, "webdis");
        assert!(String::from_utf8_lossy(&call.body).starts_with("FCALL/loopguard_hit/3/lg:test:{"));
        s.step = self
            .engine
            .on_call_sent(&mut s.req, Ok(token), self.now, &mut s.effects);
        assert_eq!(s.step, Step::Pause);
        s
    }

    pub(super) fn reply(&mut self, s: &mut Sent, token: u32, reply: CallReply) -> Step {
        s.effects.clear();
        s.step = self
            .engine
            .on_store_reply(&mut s.req, token, &reply, self.now, &mut s.effects);
        s.step
    }
}

#[test]
fn redis_answers_decide_like_the_local_table() {
    let mut h = redis("local", 3);
    let mut a = h.waiting(7);
    assert_eq!(h.reply(&mut a, 7, answer(1, 0, -1)), Step::Continue);
    assert_eq!(
        h.metric(&a.effects, "loopguard.store_calls_total.result.ok"),
        1
    );
    let mut b = h.waiting(8);
    assert_eq!(h.reply(&mut b, 8, answer(3, 42_000, 0)), Step::Pause);
    assert_eq!(b.status(), 429);
    assert_eq!(
        b.reply()
            .unwrap()
            .headers
            .iter()
            .find(|(k, _)| *k == "retry-after")
            .unwrap()
            .1,
        "42"
    );
    // A reply carrying another token is not this request's.
    let mut c = h.waiting(9);
    assert_eq!(h.reply(&mut c, 99, answer(1, 0, -1)), Step::Pause);
    assert!(c.effects.is_empty());
}

#[test]
fn redis_answer_late_a_throttle_counts_from_when_the_wait_began() {
    let mut h = Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis"},
        "policies": [{"id": "p", "spec": detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "action": "throttle", "throttle_step_ms": 100}))}]}),
    );
    let mut s = h.waiting(1);
    let began = h.now;
    h.now += 150; // the answer takes 150 ms
    assert_eq!(h.reply(&mut s, 1, answer(2, 0, -1)), Step::Pause);
    h.now = began + 199;
    assert!(!h.tick().contains(&Effect::Resume(s.req.id)));
    h.now = began + 200;
    assert!(h.tick().contains(&Effect::Resume(s.req.id)));
}

#[test]
fn redis_timeout_falls_back_to_the_local_table() {
    let mut h = redis("local", 2);
    let timeout = CallReply {
        status: None,
        body: Vec::new(),
    };
    let mut a = h.waiting(1);
    assert_eq!(h.reply(&mut a, 1, timeout.clone()), Step::Continue);
    assert_eq!(
        h.metric(&a.effects, "loopguard.store_calls_total.result.unavailable"),
        1
    );
    assert_eq!(
        h.metric(&a.effects, "loopguard.store_fallback_total.action.local"),
        1
    );
    assert!(
        a.logs(Level::Warn)[0].starts_with("redis store unavailable: no answer within the timeout")
    );
    let mut b = h.waiting(2);
    assert_eq!(
        h.reply(&mut b, 2, timeout),
        Step::Pause,
        "counted locally: the 2nd hit trips"
    );
    assert_eq!(b.status(), 429);
    assert!(b.logs(Level::Warn).is_empty(), "logged at most every 10 s");
}

#[test]
fn redis_timeout_with_allow_passes_unchecked() {
    let mut h = redis("allow", 2);
    for token in 1..=3 {
        let mut s = h.waiting(token);
        assert_eq!(h.reply(&mut s, token, CallReply::default()), Step::Continue);
        assert_eq!(
            h.metric(&s.effects, "loopguard.store_fallback_total.action.allow"),
            1
        );
        assert_eq!(h.metric(&s.effects, "loopguard.store_fail_open_total"), 0);
    }
}

#[test]
fn redis_garbage_reply_is_a_reply_error_and_falls_back() {
    let mut h = redis("local", 5);
    let mut s = h.waiting(1);
    let garbage = CallReply {
        status: Some("200".into()),
        body: b"<html>not webdis</html>".to_vec(),
    };
    assert_eq!(h.reply(&mut s, 1, garbage), Step::Continue);
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.reply"),
        1
    );
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_fallback_total.action.local"),
        1
    );
    assert_eq!(
        h.metric(&s.effects, "loopguard.table_entries_used"),
        1,
        "counted in the local table"
    );
}

#[test]
fn redis_error_reply_and_error_statuses_fall_back() {
    let mut h = redis("local", 5);
    let cases = [
        (
            CallReply {
                status: Some("200".into()),
                body: br#"{"FCALL":[false,"NOSCRIPT no such function"]}"#.to_vec(),
            },
            "reply",
            "NOSCRIPT",
        ),
        (
            CallReply {
                status: Some("403".into()),
                body: Vec::new(),
            },
            "status",
            "HTTP 403",
        ),
        (
            CallReply {
                status: Some("503".into()),
                body: b"upstream connect error".to_vec(),
            },
            "unavailable",
            "HTTP 503",
        ),
    ];
    for (i, (reply, result, said)) in cases.into_iter().enumerate() {
        h.now += 20_000; // past the log's rate limit
        let token = u32::try_from(i).unwrap();
        let mut s = h.waiting(token);
        assert_eq!(h.reply(&mut s, token, reply), Step::Continue);
        assert_eq!(
            h.metric(
                &s.effects,
                &format!("loopguard.store_calls_total.result.{result}")
            ),
            1
        );
        assert!(
            s.logs(Level::Warn)[0].contains(said),
            "{:?}",
            s.logs(Level::Warn)
        );
    }
}

#[test]
fn redis_call_the_host_could_not_send_falls_back_at_once() {
    let mut h = redis("local", 2);
    let mut s = h.get("/v1/r");
    let step = h.engine.on_call_sent(
        &mut s.req,
        Err("no cluster \"webdis\"".into()),
        h.now,
        &mut s.effects,
    );
    assert_eq!(step, Step::Continue);
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.unavailable"),
        1
    );
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_fallback_total.action.local"),
        1
    );
}

#[test]
fn redis_reply_for_a_request_that_already_left_does_nothing() {
    let mut h = redis("local", 2);
    let mut s = h.waiting(5);
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(h.reply(&mut s, 5, answer(9, 1000, 0)), Step::Pause);
    assert!(s.effects.is_empty(), "no resume, no reply, no metric");
}

#[test]
fn redis_reply_after_the_client_gave_up_while_throttled_does_nothing() {
    let mut h = Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis"},
        "policies": [{"id": "p", "spec": detection(json!({"enabled": true, "window_seconds": 60,
        "threshold_identical_requests": 2, "action": "throttle", "throttle_step_ms": 1000}))}]}),
    );
    let mut s = h.waiting(3);
    assert_eq!(
        h.reply(&mut s, 3, answer(2, 0, -1)),
        Step::Pause,
        "throttled"
    );
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(h.metric(&out, "loopguard.throttle_pending"), -1);
    // A late duplicate of the reply: ignored.
    assert_eq!(h.reply(&mut s, 3, answer(2, 0, -1)), Step::Pause);
    assert!(s.effects.is_empty());
    // The throttle queue forgot it: the tick resumes nothing.
    h.now += 10_000;
    let t = h.tick();
    assert!(!t.iter().any(|e| matches!(e, Effect::Resume(_))));
    assert!(t.contains(&Effect::StopTick));
}

// --- alerts ----------------------------------------------------------------------------

#[test]
fn alerts_are_queued_sent_from_the_tick_and_bounded() {
    let mut h = Harness::new(
        json!({"alerts": {"webhook": {"cluster": "hooks", "authority": "hooks.example.com", "hmac_secret_env": "SECRET"}},
        "policies": [{"id": "p", "spec": exact(2)}]}),
    );
    h.get("/v1/a");
    let detected = h.get("/v1/a");
    assert!(detected.effects.contains(&Effect::ArmTick));
    let t = h.tick();
    let sent: Vec<&StoreCall> = t
        .iter()
        .filter_map(|e| match e {
            Effect::SendFromRoot(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].cluster, "hooks");
    assert!(sent[0]
        .headers
        .iter()
        .any(|(k, v)| *k == "x-loopguard-signature" && v.starts_with("sha256=")));
    let mut out = Effects::new();
    h.engine.on_root_call_sent(Ok(5), h.now, &mut out);
    h.engine.on_root_reply(5, Some("204"), b"", h.now, &mut out);
    assert_eq!(h.metric(&out, "loopguard.webhook_total.result.sent"), 1);
    h.engine.on_root_reply(6, None, b"", h.now, &mut out);
    h.engine
        .on_root_call_sent(Err("no cluster".into()), h.now, &mut out);
    assert_eq!(h.metric(&out, "loopguard.webhook_total.result.failed"), 2);
    assert_eq!(
        out.iter()
            .filter(|e| matches!(e, Effect::Log(Level::Warn, _)))
            .count(),
        1,
        "rate-limited"
    );
    // More alerts than the queue holds are dropped and counted.
    let mut out = Effects::new();
    for i in 0..(MAX_QUEUED_ALERTS + 3) {
        h.engine.queue_alert(&json!({"n": i}), h.now, &mut out);
    }
    assert_eq!(h.metric(&out, "loopguard.webhook_total.result.dropped"), 3);
}

#[test]
fn a_missing_webhook_secret_refuses_the_configuration() {
    let cfg = Config::from_value(&json!({"alerts": {"webhook": {"cluster": "c", "authority": "a", "hmac_secret_env": "NOPE"}},
        "policies": [{"id": "p", "spec": exact(2)}]}))
    .unwrap();
    let err = Engine::new(cfg, "t", |_| Ok(MemoryBackend::default()), |_| None, 1)
        .err()
        .unwrap();
    assert!(
        err.starts_with("alerts.webhook.hmac_secret_env names NOPE, which is not set"),
        "{err}"
    );
}
