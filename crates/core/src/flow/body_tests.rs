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
