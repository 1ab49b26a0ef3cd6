//! Held request headers: warn headers set on them directly, the probe
//! confirmed, and body-less requests released by the tick.

use super::tests::{detection, exact, facts, Harness};
use super::*;
use crate::request::RequestHead;
use serde_json::json;

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
