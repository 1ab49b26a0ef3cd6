//! Bodies and headers through the flow: the body size limit, unreadable
//! bodies, client-sent loopguard headers, route policies and tunnels.

use super::tests::{exact, facts, Harness};
use super::*;
use crate::request::RequestHead;
use serde_json::json;

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

/// A mini-swe-agent 2.x conversation whose harness asked the model again
/// `times` times after answers without a tool call (the answers dropped,
/// the same correction appended each time).
fn reasked(times: usize) -> String {
    let correction = "Tool call error:\n\n<error>\nNo tool calls found in the response. Every response MUST include at least one tool call.\n</error>";
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant that can interact with a computer."}),
        json!({"role": "user", "content": "Fix the rounding of the cart total."}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "bash", "arguments": "{\"command\":\"grep -n total cart.py\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "3: def total(self):"}),
    ];
    for _ in 0..times {
        messages.push(json!({"role": "user", "content": correction}));
    }
    json!({"model": "gpt-5-mini", "messages": messages}).to_string()
}

#[test]
fn a_harness_asking_again_is_counted_and_never_judged() {
    for similarity in ["llm_tail", "near"] {
        let mut h = Harness::policy(json!({"selector": {},
            "loop_detection": {"enabled": true, "window_seconds": 60,
                               "threshold_identical_requests": 3, "similarity": similarity},
            "tool_loops": {"enabled": true}}));
        let first = h.post(&reasked(1));
        assert_eq!(
            h.metric(&first.effects, "loopguard.harness_retries_total.policy.p"),
            0
        );
        for times in 2..12 {
            let s = h.post(&reasked(times));
            assert_eq!(s.status(), 200, "{similarity}: re-ask {times}");
            assert_eq!(
                h.metric(&s.effects, "loopguard.harness_retries_total.policy.p"),
                1
            );
            assert!(s
                .filter_state("loopguard")
                .unwrap()
                .contains("\"action\":\"harness_retry\""));
        }
    }
    // The same user message sent again after a model turn is a turn of
    // the conversation, not a harness's retry: still judged.
    let mut h = Harness::policy(json!({"selector": {},
        "loop_detection": {"enabled": true, "window_seconds": 60,
                           "threshold_identical_requests": 3, "similarity": "llm_tail"}}));
    let body = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "still broken"}, {"role": "assistant", "content": "Try restarting it."},
        {"role": "user", "content": "still broken"}]})
    .to_string();
    for _ in 0..2 {
        assert_eq!(h.post(&body).status(), 200);
    }
    let third = h.post(&body);
    assert_eq!(third.status(), 429);
    assert_eq!(
        h.metric(&third.effects, "loopguard.harness_retries_total.policy.p"),
        0
    );
}
