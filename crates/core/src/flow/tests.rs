//! The whole request flow, driven natively: the harness the flow's tests
//! share (an in-memory table and a scripted shared store), and every mode
//! and action.

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

/// The calls an event hands the root context: each one's id and call.
pub(super) fn root_calls(effects: &[Effect]) -> Vec<(u32, &StoreCall)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::SendFromRoot { id, call } => Some((*id, call)),
            _ => None,
        })
        .collect()
}

/// The structured events named `name` among the effects' info log lines.
pub(super) fn events(effects: &[Effect], name: &str) -> Vec<Value> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Log(Level::Info, line) => serde_json::from_str::<Value>(line).ok(),
            _ => None,
        })
        .filter(|v| v["event"] == name)
        .collect()
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
        self.send_with(method, path, &facts(headers), body)
    }

    /// [`Harness::send`] with the request's facts given whole (a client
    /// address, say).
    pub(super) fn send_with(
        &mut self,
        method: &str,
        path: &str,
        f: &FakeFacts,
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
        let mut step =
            self.engine
                .on_headers(&mut req, &head, f, body.is_empty(), self.now, &mut out);
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

    /// The shared store's `reply` to the call a request sent as `token`.
    pub(super) fn reply(&mut self, s: &mut Sent, token: u32, reply: CallReply) -> Step {
        s.effects.clear();
        s.step = self
            .engine
            .on_store_reply(&mut s.req, token, &reply, self.now, &mut s.effects);
        s.step
    }
}

pub(super) fn detection(ld: Value) -> Value {
    json!({"selector": {}, "loop_detection": ld})
}

pub(super) fn exact(threshold: u32) -> Value {
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
