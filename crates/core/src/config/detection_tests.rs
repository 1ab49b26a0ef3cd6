//! The `loop_detection` block: threshold and window bounds, actions and
//! modes, throttling, the escalation ladder and the cooldown.

use super::tests::{err_of, ld, with, without};
use super::*;
use serde_json::json;

#[test]
fn threshold_one_names_policy_and_field() {
    assert_eq!(
        err_of(with(&ld("threshold_identical_requests"), json!(1))),
        "policy \"llm-policy\": loop_detection.threshold_identical_requests must be >= 2 (got 1); use 0 to switch the policy off"
    );
}

#[test]
fn threshold_bounds() {
    assert!(
        err_of(with(&ld("threshold_identical_requests"), json!(1025)))
            .contains("must be <= 1024 (got 1025)")
    );
    assert!(
        err_of(with(&ld("threshold_identical_requests"), json!(-3))).contains("must be an integer")
    );
    assert!(
        err_of(with(&ld("threshold_identical_requests"), json!(2.5)))
            .contains("must be a whole number from 0 to 1024 (got 2.5)")
    );
    assert!(err_of(with(&ld("threshold_identical_requests"), json!("5"))).contains("(got \"5\")"));
    let cfg = Config::from_value(&with(&ld("threshold_identical_requests"), json!(1024))).unwrap();
    assert_eq!(
        cfg.policies[0].detection.as_ref().unwrap().threshold(),
        1024
    );
}

#[test]
fn threshold_zero_and_disabled_switch_the_policy_off() {
    let cfg = Config::from_value(&with(&ld("threshold_identical_requests"), json!(0))).unwrap();
    assert!(cfg.policies[0].detection.is_none());
    let cfg = Config::from_value(&with(&ld("enabled"), json!(false))).unwrap();
    assert!(cfg.policies[0].detection.is_none());
    // A disabled policy needs no window or threshold...
    let v = json!({"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {"enabled": false}}}]});
    assert!(Config::from_value(&v).unwrap().policies[0]
        .detection
        .is_none());
    // ...but what it gives is still checked.
    let v = json!({"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {"enabled": false, "window_seconds": 0}}}]});
    assert!(err_of(v).contains("loop_detection.window_seconds must be >= 1 (got 0)"));
}

#[test]
fn window_bounds() {
    assert_eq!(
        err_of(with(&ld("window_seconds"), json!(0))),
        "policy \"llm-policy\": loop_detection.window_seconds must be >= 1 (got 0)"
    );
    assert!(err_of(with(&ld("window_seconds"), json!(86_401))).contains("must be <= 86400"));
    assert!(err_of(without(&ld("window_seconds")))
        .contains("loop_detection.window_seconds is required when enabled"));
    assert!(err_of(without(&ld("threshold_identical_requests")))
        .contains("threshold_identical_requests is required when enabled"));
    assert!(err_of(without(&ld("enabled"))).contains("loop_detection.enabled is required"));
    assert!(err_of(with(&ld("enabled"), json!("yes"))).contains("must be true or false"));
}

#[test]
fn actions_and_modes() {
    for (a, want) in [
        ("warn", Action::Warn),
        ("throttle", Action::Throttle),
        ("reject", Action::Reject),
    ] {
        let cfg = Config::from_value(&with(&ld("action"), json!(a))).unwrap();
        let d = cfg.policies[0].detection.clone().unwrap();
        assert_eq!(
            d.steps,
            vec![Step {
                at: 5,
                action: want
            }]
        );
        assert_eq!(d.threshold(), 5);
    }
    assert!(err_of(with(&ld("action"), json!("block")))
        .contains("must be \"reject\", \"throttle\" or \"warn\" (got \"block\")"));
    assert!(err_of(with(&ld("similarity"), json!("fuzzy"))).contains(
        "loop_detection.similarity must be \"exact\", \"llm_tail\", \"near\" or \"session\" (got \"fuzzy\")"
    ));
    let cfg =
        Config::from_value(&with(&["policies", "0", "spec", "mode"], json!("shadow"))).unwrap();
    assert_eq!(cfg.policies[0].mode, Mode::Shadow);
    assert!(
        err_of(with(&["policies", "0", "spec", "mode"], json!("audit"))).contains("mode must be")
    );
    // The top-level switch overrides every policy's mode.
    let cfg = Config::from_value(&with(&["shadow"], json!(true))).unwrap();
    assert_eq!(cfg.policies[0].mode, Mode::Shadow);
    assert!(err_of(with(&["shadow"], json!("yes"))).starts_with("shadow must be true or false"));
}

#[test]
fn throttle_settings() {
    let mut v = with(&ld("action"), json!("throttle"));
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!((d.throttle_step_ms, d.throttle_max_delay_ms), (100, 10_000));
    // The record keeps enough hits to reach the cap: 10000 / 100.
    assert_eq!(d.hits_to_keep(), 100);
    v["policies"][0]["spec"]["loop_detection"]["throttle_max_delay_ms"] = json!(60_001);
    assert!(err_of(v.clone())
        .contains("loop_detection.throttle_max_delay_ms must be <= 60000 (got 60001)"));
    v["policies"][0]["spec"]["loop_detection"]["throttle_max_delay_ms"] = json!(60_000);
    v["policies"][0]["spec"]["loop_detection"]["throttle_step_ms"] = json!(10);
    assert!(err_of(v.clone()).contains("loop_detection.throttle_max_delay_ms needs 6000 identical hits to reach its cap at 10 ms per hit, more than the 1024 a fingerprint keeps"));
    v["policies"][0]["spec"]["loop_detection"]["throttle_step_ms"] = json!(100);
    v["policies"][0]["spec"]["loop_detection"]["throttle_max_delay_ms"] = json!(50);
    assert!(
        err_of(v.clone()).contains("throttle_max_delay_ms must be >= throttle_step_ms (50 < 100)")
    );
    v["policies"][0]["spec"]["loop_detection"]["throttle_step_ms"] = json!(0);
    assert!(err_of(v).contains("throttle_step_ms must be >= 1 (got 0)"));
}

#[test]
fn escalation_ladder() {
    let mut v = without(&ld("threshold_identical_requests"));
    v["policies"][0]["spec"]["loop_detection"]
        .as_object_mut()
        .unwrap()
        .remove("action");
    v["policies"][0]["spec"]["loop_detection"]["escalation"] = json!([
        {"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}, {"at": 8, "action": "reject"}]);
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(d.threshold(), 3);
    assert_eq!(d.reject_at(), Some(8));
    assert_eq!(d.step_at(2), None);
    assert_eq!(d.step_at(4).map(|s| s.action), Some(Action::Warn));
    assert_eq!(d.step_at(7).map(|s| s.action), Some(Action::Throttle));
    assert_eq!(d.step_at(100).map(|s| s.action), Some(Action::Reject));
    assert_eq!(d.hits_to_keep(), 8);
    let esc = |steps: Value| {
        let mut v = v.clone();
        v["policies"][0]["spec"]["loop_detection"]["escalation"] = steps;
        v
    };
    assert!(err_of(esc(
        json!([{"at": 3, "action": "warn"}, {"at": 3, "action": "reject"}])
    ))
    .contains("loop_detection.escalation[1].at must be greater than the previous step's (3 <= 3)"));
    assert!(err_of(esc(json!([{"at": 1, "action": "warn"}])))
        .contains("escalation[0].at must be >= 2 (got 1)"));
    assert!(err_of(esc(json!([{"at": 1025, "action": "warn"}])))
        .contains("escalation[0].at must be <= 1024"));
    assert!(
        err_of(esc(json!([{"at": 3, "action": "stop"}]))).contains("escalation[0].action must be")
    );
    assert!(err_of(esc(json!([{"at": 3}]))).contains("escalation[0].action is required"));
    assert!(err_of(esc(json!([{"at": 3, "action": "warn", "x": 1}])))
        .contains("escalation[0].x is not a known field"));
    assert!(err_of(esc(json!([]))).contains("loop_detection.escalation must be a non-empty list"));
    // Giving either of what the ladder replaces is an error.
    let mut both = v.clone();
    both["policies"][0]["spec"]["loop_detection"]["action"] = json!("reject");
    assert!(err_of(both).contains("loop_detection.escalation replaces \"action\""));
    let mut both = v.clone();
    both["policies"][0]["spec"]["loop_detection"]["threshold_identical_requests"] = json!(3);
    assert!(err_of(both).contains("replaces \"threshold_identical_requests\""));
    // A ladder ending in throttle keeps enough hits for the cap.
    let d = Config::from_value(&esc(
        json!([{"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}]),
    ))
    .unwrap()
    .policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(d.hits_to_keep(), 100);
}

#[test]
fn cooldown_needs_a_reject() {
    let d = Config::from_value(&with(&ld("cooldown_seconds"), json!(30)))
        .unwrap()
        .policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(d.cooldown_seconds, 30);
    assert!(err_of(with(&ld("cooldown_seconds"), json!(86_401)))
        .contains("cooldown_seconds must be <= 86400"));
    let mut v = with(&ld("action"), json!("warn"));
    v["policies"][0]["spec"]["loop_detection"]["cooldown_seconds"] = json!(5);
    assert!(err_of(v).contains("loop_detection.cooldown_seconds needs a reject action"));
}
