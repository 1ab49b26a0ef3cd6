use super::*;
use serde_json::json;

fn base() -> Value {
    json!({
        "max_tracked_fingerprints": 1024,
        "max_body_bytes": 4096,
        "policies": [{
            "id": "llm-policy",
            "spec": {
                "mode": "enforce",
                "selector": {"pathPrefix": "/v1/", "methods": ["post"], "hosts": ["API.example.com:443"]},
                "limit_keys": ["query:user", "header:X-Org-Id", "jwt:sub", "ip:address"],
                "loop_detection": {
                    "enabled": true,
                    "window_seconds": 60,
                    "threshold_identical_requests": 5,
                    "action": "reject",
                    "similarity": "exact"
                }
            }
        }]
    })
}

fn err_of(v: Value) -> String {
    match Config::from_value(&v) {
        Ok(_) => panic!("expected an error for {v}"),
        Err(e) => e.to_string(),
    }
}

fn with(path: &[&str], value: Value) -> Value {
    let mut v = base();
    let mut cur = &mut v;
    for (i, p) in path.iter().enumerate() {
        if i + 1 == path.len() {
            cur[*p] = value.clone();
            break;
        }
        cur = if let Ok(idx) = p.parse::<usize>() {
            &mut cur[idx]
        } else {
            &mut cur[*p]
        };
    }
    v
}

fn without(path: &[&str]) -> Value {
    let mut v = base();
    let mut cur = &mut v;
    for (i, p) in path.iter().enumerate() {
        if i + 1 == path.len() {
            if let Some(o) = cur.as_object_mut() {
                o.remove(*p);
            }
            break;
        }
        cur = if let Ok(idx) = p.parse::<usize>() {
            &mut cur[idx]
        } else {
            &mut cur[*p]
        };
    }
    v
}

const LD: [&str; 4] = ["policies", "0", "spec", "loop_detection"];

fn ld(field: &str) -> Vec<&str> {
    let mut p = LD.to_vec();
    p.push(field);
    p
}

#[test]
fn parses_the_documented_example() {
    let cfg = Config::from_value(&base()).unwrap();
    assert_eq!(cfg.max_tracked_fingerprints, 1024);
    assert_eq!(cfg.max_body_bytes, 4096);
    let p = &cfg.policies[0];
    assert_eq!(p.id, "llm-policy");
    assert_eq!(p.selector.path, PathMatch::Prefix("/v1/".into()));
    assert_eq!(p.selector.methods, vec!["POST"]);
    assert_eq!(p.selector.hosts, vec!["api.example.com"]);
    // Sorted by canonical name.
    assert_eq!(
        p.limit_keys.iter().map(|k| k.name()).collect::<Vec<_>>(),
        vec!["header:x-org-id", "ip:address", "jwt:sub", "query:user"]
    );
    let d = p.detection.as_ref().unwrap();
    assert_eq!(d.window_ms(), 60_000);
    assert_eq!(
        d.steps,
        vec![Step {
            at: 5,
            action: Action::Reject
        }]
    );
    assert_eq!(d.hits_to_keep(), 5);
    assert_eq!(d.cooldown_seconds, 0);
}

#[test]
fn defaults_apply() {
    let v = json!({"policies": [{"id": "p", "spec": {"selector": {},
        "loop_detection": {"enabled": true, "window_seconds": 1, "threshold_identical_requests": 2}}}]});
    let cfg = Config::from_value(&v).unwrap();
    assert_eq!(cfg.max_tracked_fingerprints, 65_536);
    assert_eq!(cfg.max_body_bytes, 1_048_576);
    let p = &cfg.policies[0];
    assert_eq!(p.mode, Mode::Enforce);
    assert_eq!(p.selector, Selector::default());
    assert!(p.limit_keys.is_empty());
    let d = p.detection.as_ref().unwrap();
    assert_eq!(
        d.steps,
        vec![Step {
            at: 2,
            action: Action::Reject
        }]
    );
    assert_eq!(d.similarity, Similarity::Exact);
    assert!(p.exempt.is_empty());
}

/// Every number as a double, the way a protobuf `Struct` carries it
/// (and Python's or Java's JSON printers write it: `5.0`).
fn as_doubles(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(a) => Value::Array(a.iter().map(as_doubles).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), as_doubles(v))).collect())
        }
        other => other.clone(),
    }
}

#[test]
fn integral_doubles_are_integers_and_fractions_are_refused() {
    let mut full = base();
    full["policies"][0]["spec"]["loop_detection"] = json!({"enabled": true, "window_seconds": 60,
        "escalation": [{"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}, {"at": 8, "action": "reject"}],
        "throttle_step_ms": 200, "throttle_max_delay_ms": 3000, "cooldown_seconds": 120});
    full["policies"][0]["spec"]["tool_loops"] =
        json!({"enabled": true, "last_calls": 6, "identical_min": 3});
    full["store"] = json!({"type": "redis_webdis", "cluster": "r", "timeout_ms": 25});
    let doubles = as_doubles(&full);
    assert!(serde_json::to_string(&doubles)
        .unwrap()
        .contains("\"window_seconds\":60.0"));
    assert_eq!(
        Config::from_value(&doubles).unwrap(),
        Config::from_value(&full).unwrap()
    );
    // Parsed from text too (serde_json reads `5.0` as a float).
    let text = br#"{"max_body_bytes": 2048.0, "policies": [{"id": "p", "spec": {"selector": {},
        "loop_detection": {"enabled": true, "window_seconds": 1e1, "threshold_identical_requests": 2.0}}}]}"#;
    let cfg = Config::parse(text).unwrap();
    assert_eq!(cfg.max_body_bytes, 2048);
    assert_eq!(
        cfg.policies[0].detection.as_ref().unwrap().window_ms(),
        10_000
    );
    assert_eq!(
        err_of(with(&ld("window_seconds"), json!(2.5))),
        "policy \"llm-policy\": loop_detection.window_seconds must be a whole number from 1 to 86400 (got 2.5)"
    );
    assert_eq!(
        err_of(with(&ld("threshold_identical_requests"), json!(1.0))),
        "policy \"llm-policy\": loop_detection.threshold_identical_requests must be >= 2 (got 1); use 0 to switch the policy off"
    );
    assert!(err_of(with(&["max_body_bytes"], json!(-1.0)))
        .starts_with("max_body_bytes must be an integer from 1 to 67108864 (got -1.0)"));
    assert!(err_of(with(&["max_body_bytes"], json!(1e300)))
        .starts_with("max_body_bytes must be <= 67108864 (got 1"));
}

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

#[test]
fn exemptions() {
    let ex = |e: Value| with(&["policies", "0", "spec", "exempt"], e);
    let cfg = Config::from_value(&ex(json!([
        {"key": "header:X-Batch-Id", "present": true},
        {"key": "header:x-api-key-id", "values": ["ci-runner"]}])))
    .unwrap();
    assert_eq!(
        cfg.policies[0].exempt,
        vec![
            Exemption {
                key: LimitKey::Header("x-batch-id".into()),
                matcher: ExemptMatch::Present(true)
            },
            Exemption {
                key: LimitKey::Header("x-api-key-id".into()),
                matcher: ExemptMatch::Values(vec!["ci-runner".into()])
            },
        ]
    );
    assert!(err_of(ex(json!([{"key": "header:a"}])))
        .contains("exempt[0] must give exactly one of \"present\" or \"values\""));
    assert!(err_of(ex(
        json!([{"key": "header:a", "present": true, "values": ["x"]}])
    ))
    .contains("exactly one of"));
    assert!(err_of(ex(json!([{"present": true}]))).contains("exempt[0].key is required"));
    assert!(err_of(ex(json!([{"key": "cookie:a", "present": true}])))
        .contains("exempt[0].key must be header:<name>"));
    assert!(err_of(ex(json!([{"key": "header:a", "value": "x"}])))
        .contains("exempt[0].value is not a known field (did you mean \"values\"?)"));
    assert!(err_of(ex(json!({"key": "header:a"}))).contains("exempt must be a list"));
}

#[test]
fn llm_tail_and_session_modes() {
    let mut v = with(&ld("similarity"), json!("llm_tail"));
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(d.similarity, Similarity::LlmTail { tail_messages: 3 });
    v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(6);
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(d.similarity, Similarity::LlmTail { tail_messages: 6 });
    v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(0);
    assert!(err_of(v.clone()).contains("loop_detection.tail_messages must be >= 1 (got 0)"));
    v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(65);
    assert!(err_of(v).contains("must be <= 64"));
    assert!(err_of(with(&ld("tail_messages"), json!(3)))
        .contains("loop_detection.tail_messages applies only to similarity \"llm_tail\""));
    assert!(err_of(with(&ld("session_header"), json!("x-s")))
        .contains("session_header applies only to similarity \"session\""));
    assert!(err_of(with(&ld("fallback_threshold"), json!(9)))
        .contains("fallback_threshold applies only"));

    let mut v = with(&ld("similarity"), json!("session"));
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(
        d.similarity,
        Similarity::Session {
            header: "x-session-id".into(),
            fallback_steps: vec![Step {
                at: 25,
                action: Action::Reject
            }]
        }
    );
    assert_eq!(d.ladder(true).threshold(), 25);
    assert_eq!(d.ladder(true).hits_to_keep(), 25);
    assert_eq!(d.ladder(false).threshold(), 5);
    v["policies"][0]["spec"]["loop_detection"]["session_header"] = json!("X-Agent-Session");
    v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(12);
    let d = Config::from_value(&v).unwrap().policies[0]
        .detection
        .clone()
        .unwrap();
    assert_eq!(
        d.similarity,
        Similarity::Session {
            header: "x-agent-session".into(),
            fallback_steps: vec![Step {
                at: 12,
                action: Action::Reject
            }]
        }
    );
    v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(4);
    assert!(err_of(v.clone())
        .contains("loop_detection.fallback_threshold must be >= the threshold (4 < 5)"));
    v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(10);
    v["policies"][0]["spec"]["loop_detection"]["session_header"] = json!("bad header");
    assert!(err_of(v).contains("session_header must be a header name"));
}

#[test]
fn fallback_ladder_scales_every_step() {
    let steps = [
        Step {
            at: 3,
            action: Action::Warn,
        },
        Step {
            at: 5,
            action: Action::Throttle,
        },
        Step {
            at: 8,
            action: Action::Reject,
        },
    ];
    assert_eq!(
        scale_steps(&steps, 15),
        vec![
            Step {
                at: 15,
                action: Action::Warn
            },
            Step {
                at: 25,
                action: Action::Throttle
            },
            Step {
                at: 40,
                action: Action::Reject
            }
        ]
    );
    // Capped at 1024, where the later step wins.
    assert_eq!(
        scale_steps(&steps, 1000),
        vec![
            Step {
                at: 1000,
                action: Action::Warn
            },
            Step {
                at: 1024,
                action: Action::Reject
            }
        ]
    );
}

#[test]
fn tool_loops_block() {
    let tl = |v: Value| with(&["policies", "0", "spec", "tool_loops"], v);
    let cfg = Config::from_value(&tl(json!({"enabled": true}))).unwrap();
    let t = cfg.policies[0].tool_loops.clone().unwrap();
    assert_eq!((t.last_calls, t.identical_min, t.pattern_min), (6, 3, 4));
    assert_eq!(
        t.ladder,
        vec![ToolStep::Nudge, ToolStep::Directive, ToolStep::Reject]
    );
    assert!(!t.directive_disables_tools);
    assert!(cfg.policies[0].may_rewrite_bodies());
    let cfg = Config::from_value(&tl(
        json!({"enabled": true, "ladder": ["reject"], "exempt_tools": ["poll"]}),
    ))
    .unwrap();
    let t = cfg.policies[0].tool_loops.clone().unwrap();
    assert_eq!(t.ladder, vec![ToolStep::Reject]);
    assert_eq!(t.exempt_tools, vec!["poll"]);
    assert!(!cfg.policies[0].may_rewrite_bodies());
    assert!(Config::from_value(&tl(json!({"enabled": false})))
        .unwrap()
        .policies[0]
        .tool_loops
        .is_none());
    assert!(err_of(tl(json!({}))).contains("tool_loops.enabled is required"));
    assert!(err_of(tl(json!({"enabled": true, "last_calls": 65})))
        .contains("tool_loops.last_calls must be <= 64"));
    assert!(err_of(tl(
        json!({"enabled": true, "last_calls": 4, "pattern_min": 5})
    ))
    .contains("tool_loops.pattern_min must be <= last_calls (5 > 4)"));
    assert!(err_of(tl(json!({"enabled": true, "last_calls": 2})))
        .contains("tool_loops.identical_min must be <= last_calls (3 > 2)"));
    assert!(err_of(tl(json!({"enabled": true, "identical_min": 1})))
        .contains("tool_loops.identical_min must be >= 2"));
    assert!(
        err_of(tl(json!({"enabled": true, "ladder": ["reject", "nudge"]})))
            .contains("tool_loops.ladder must list its steps in the order")
    );
    assert!(
        err_of(tl(json!({"enabled": true, "ladder": ["nudge", "nudge"]})))
            .contains("each at most once")
    );
    assert!(err_of(tl(json!({"enabled": true, "ladder": ["poke"]})))
        .contains("tool_loops.ladder[0] must be"));
    assert!(err_of(tl(json!({"enabled": true, "ladder": []})))
        .contains("tool_loops.ladder must not be empty"));
    assert!(err_of(tl(
        json!({"enabled": true, "ladder": ["reject"], "directive_disables_tools": true})
    ))
    .contains("directive_disables_tools needs a \"directive\" step"));
    // tool_loops alone makes a policy.
    let mut v = tl(json!({"enabled": true}));
    v["policies"][0]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("loop_detection");
    let cfg = Config::from_value(&v).unwrap();
    assert!(cfg.policies[0].detection.is_none() && cfg.policies[0].is_active());
    assert!(
        err_of(without(&["policies", "0", "spec", "loop_detection"]))
            .contains("loop_detection is required (or give tool_loops)")
    );
}

#[test]
fn route_metadata_and_access_log_switches() {
    let cfg = Config::from_value(&base()).unwrap();
    assert!(!cfg.route_metadata);
    assert_eq!(cfg.access_log, AccessLog::Actions);
    let cfg = Config::from_value(&with(&["route_metadata"], json!(true))).unwrap();
    assert!(cfg.route_metadata);
    assert_eq!(
        Config::from_value(&with(&["access_log"], json!("all")))
            .unwrap()
            .access_log,
        AccessLog::All
    );
    assert_eq!(
        Config::from_value(&with(&["access_log"], json!("off")))
            .unwrap()
            .access_log,
        AccessLog::Off
    );
    assert!(err_of(with(&["access_log"], json!("some")))
        .starts_with("access_log must be \"actions\", \"all\" or \"off\""));
    assert!(err_of(with(&["route_metadata"], json!(1)))
        .starts_with("route_metadata must be true or false"));
    assert!(!cfg.hold_request_headers);
    let cfg = Config::from_value(&with(&["hold_request_headers"], json!(true))).unwrap();
    assert!(cfg.hold_request_headers);
    assert!(err_of(with(&["hold_request_headers"], json!("yes")))
        .starts_with("hold_request_headers must be true or false"));
    assert_eq!(
        err_of(with(&["hold_request_header"], json!(true))),
        "hold_request_header is not a known field (did you mean \"hold_request_headers\"?)"
    );
}

#[test]
fn store_block() {
    assert_eq!(
        Config::from_value(&base()).unwrap().store,
        StoreConfig::Local
    );
    assert_eq!(
        Config::from_value(&with(&["store"], json!({"type": "local"})))
            .unwrap()
            .store,
        StoreConfig::Local
    );
    let cfg = Config::from_value(&with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "loopguard_redis",
        "authority": "webdis", "timeout_ms": 25, "on_error": "local"}),
    ))
    .unwrap();
    assert_eq!(
        cfg.store,
        StoreConfig::RedisWebdis(RedisStore {
            cluster: "loopguard_redis".into(),
            authority: "webdis".into(),
            path: "/".into(),
            timeout_ms: 25,
            on_error: OnStoreError::Local
        })
    );
    let cfg = Config::from_value(&with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "on_error": "allow"}),
    ))
    .unwrap();
    assert!(matches!(
        cfg.store,
        StoreConfig::RedisWebdis(RedisStore {
            on_error: OnStoreError::Allow,
            ..
        })
    ));
    assert!(err_of(with(&["store"], json!({"type": "redis_webdis"})))
        .starts_with("store.cluster is required"));
    assert!(err_of(with(&["store"], json!({"type": "redis"})))
        .starts_with("store.type must be \"local\" or \"redis_webdis\""));
    assert!(err_of(with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "timeout_ms": 0})
    ))
    .contains("store.timeout_ms must be >= 1"));
    assert!(err_of(with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "on_error": "deny"})
    ))
    .contains("store.on_error must be"));
    assert!(
        err_of(with(&["store"], json!({"type": "local", "cluster": "r"})))
            .contains("store.cluster applies only to the \"redis_webdis\" store")
    );
    assert!(err_of(with(
        &["store"],
        json!({"type": "redis_webdis", "cluster": "r", "host": "x"})
    ))
    .contains("store.host is not a known field"));
}

#[test]
fn webhook_alerts() {
    let cfg = Config::from_value(&with(
        &["alerts"],
        json!({"webhook": {"cluster": "alerts", "authority": "hooks.example.com",
        "path": "/loopguard", "timeout_ms": 500, "hmac_secret_env": "LOOPGUARD_WEBHOOK_SECRET"}}),
    ))
    .unwrap();
    assert_eq!(
        cfg.webhook,
        Some(Webhook {
            cluster: "alerts".into(),
            authority: "hooks.example.com".into(),
            path: "/loopguard".into(),
            timeout_ms: 500,
            hmac_secret_env: Some("LOOPGUARD_WEBHOOK_SECRET".into())
        })
    );
    let cfg = Config::from_value(&with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h"}}),
    ))
    .unwrap();
    let w = cfg.webhook.unwrap();
    assert_eq!(
        (w.path.as_str(), w.timeout_ms, w.hmac_secret_env),
        ("/", 2_000, None)
    );
    assert!(Config::from_value(&base()).unwrap().webhook.is_none());
    assert!(
        err_of(with(&["alerts"], json!({"webhook": {"authority": "h"}})))
            .starts_with("alerts.webhook.cluster is required")
    );
    assert!(err_of(with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h", "path": "x"}})
    ))
    .contains("alerts.webhook.path must start with"));
    assert!(err_of(with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h", "timeout_ms": 0}})
    ))
    .contains("alerts.webhook.timeout_ms must be >= 1"));
    assert!(err_of(with(
        &["alerts"],
        json!({"webhook": {"cluster": "a", "authority": "h", "hmac_secret_env": "A B"}})
    ))
    .contains("hmac_secret_env must be an environment variable name"));
    assert!(err_of(with(&["alerts"], json!({"slack": {}})))
        .starts_with("alerts.slack is not a known field"));
}

#[test]
fn routes_and_verified_claims() {
    let cfg = Config::from_value(&with(
        &["policies", "0", "spec", "selector", "routes"],
        json!(["chat", "tools"]),
    ))
    .unwrap();
    assert_eq!(cfg.policies[0].selector.routes, vec!["chat", "tools"]);
    assert!(cfg.uses_route_names());
    assert!(!Config::from_value(&base()).unwrap().uses_route_names());
    assert!(err_of(with(
        &["policies", "0", "spec", "selector", "routes"],
        json!([""])
    ))
    .contains("selector.routes[0] must not be empty"));
    let cfg = Config::from_value(&with(
        &["policies", "0", "spec", "limit_keys"],
        json!(["jwt_verified:sub"]),
    ))
    .unwrap();
    assert_eq!(
        cfg.policies[0].limit_keys,
        vec![LimitKey::JwtVerified("sub".into())]
    );
    assert_eq!(cfg.jwt_payload_in_metadata, "jwt_payload");
    let cfg = Config::from_value(&with(&["jwt_payload_in_metadata"], json!("claims"))).unwrap();
    assert_eq!(cfg.jwt_payload_in_metadata, "claims");
}

#[test]
fn unknown_fields_are_errors_everywhere_with_a_suggestion() {
    assert_eq!(
        err_of(with(&ld("treshold_identical_requests"), json!(5))),
        "policy \"llm-policy\": loop_detection.treshold_identical_requests is not a known field (did you mean \"threshold_identical_requests\"?)"
    );
    assert!(err_of(with(
        &["policies", "0", "spec", "selector", "path"],
        json!("/x")
    ))
    .starts_with("policy \"llm-policy\": selector.path is not a known field"));
    assert!(err_of(with(&["policies", "0", "spec", "rules"], json!([])))
        .starts_with("policy \"llm-policy\": rules is not a known field"));
    assert!(err_of(with(&["policies", "0", "name"], json!("x")))
        .starts_with("policies[0].name is not a known field"));
    assert!(err_of(with(&["max_tracked"], json!(5))).starts_with(
        "max_tracked is not a known field (did you mean \"max_tracked_fingerprints\"?)"
    ));
}

#[test]
fn ids_are_checked_and_unique() {
    assert!(err_of(with(&["policies", "0", "id"], json!("bad id")))
        .starts_with("policies[0].id must match [A-Za-z0-9_-]{1,64} (got \"bad id\")"));
    assert!(err_of(with(&["policies", "0", "id"], json!(""))).contains("must match"));
    assert!(err_of(with(&["policies", "0", "id"], json!("a".repeat(65)))).contains("must match"));
    assert!(err_of(without(&["policies", "0", "id"])).contains("policies[0].id is required"));
    let mut v = base();
    let p = v["policies"][0].clone();
    v["policies"].as_array_mut().unwrap().push(p);
    assert_eq!(
        err_of(v),
        "policy \"llm-policy\": id is used by more than one policy; ids must be unique"
    );
}

#[test]
fn selector_validation() {
    let sel = |s: Value| with(&["policies", "0", "spec", "selector"], s);
    assert!(err_of(sel(json!({"pathExact": "/a", "pathPrefix": "/b"})))
        .contains("selector may give pathExact or pathPrefix, not both"));
    assert!(err_of(sel(json!({"pathPrefix": "v1"})))
        .contains("selector.pathPrefix must start with \"/\""));
    assert!(err_of(sel(json!({"pathExact": "/a?b=1"}))).contains("must not contain a query"));
    assert!(err_of(sel(json!({"methods": []}))).contains("selector.methods must not be empty"));
    assert!(err_of(sel(json!({"methods": ["GET", "P O"]})))
        .contains("selector.methods[1] must be an HTTP method token"));
    assert!(err_of(sel(json!({"methods": "GET"})))
        .contains("selector.methods must be a list of strings"));
    assert!(
        err_of(sel(json!({"hosts": ["a b"]}))).contains("selector.hosts[0] must be a host name")
    );
    assert!(err_of(sel(json!("x"))).contains("selector must be an object"));
    assert!(err_of(without(&["policies", "0", "spec", "selector"]))
        .contains("selector is required (use {} to match every request)"));
    let cfg = Config::from_value(&sel(json!({"hosts": ["*.Example.com", "[::1]:80"]}))).unwrap();
    assert_eq!(
        cfg.policies[0].selector.hosts,
        vec!["*.example.com", "[::1]"]
    );
}

#[test]
fn limit_key_validation() {
    let lk = |s: Value| with(&["policies", "0", "spec", "limit_keys"], s);
    assert!(err_of(lk(json!(["cookie:x"]))).contains("limit_keys[0] must be header:<name>, query:<name>, jwt:<claim>, jwt_verified:<claim> or ip:address (got \"cookie:x\")"));
    assert!(err_of(lk(json!(["header:"]))).contains("limit_keys[0] names no header"));
    assert!(err_of(lk(json!(["ip:port"]))).contains("must be ip:address"));
    assert!(err_of(lk(json!(["header:a b"]))).contains("invalid header name"));
    assert!(err_of(lk(json!(["header:X-A", "header:x-a"])))
        .contains("limit_keys[1] repeats \"header:x-a\""));
    assert!(err_of(lk(json!([3]))).contains("limit_keys[0] must be a string (got 3)"));
    assert!(err_of(lk(json!("header:x"))).contains("limit_keys must be a list"));
    assert!(err_of(lk(json!(["nocolon"]))).contains("limit_keys[0] must be"));
}

#[test]
fn top_level_validation() {
    assert!(err_of(with(&["max_tracked_fingerprints"], json!(0)))
        .starts_with("max_tracked_fingerprints must be >= 1 (got 0)"));
    assert!(
        err_of(with(&["max_tracked_fingerprints"], json!(4_194_305)))
            .contains("must be <= 4194304")
    );
    assert!(err_of(with(&["max_body_bytes"], json!(0))).starts_with("max_body_bytes must be >= 1"));
    assert!(err_of(json!({"policies": []})).contains("policies must list at least one policy"));
    assert!(err_of(json!({})).contains("policies is required"));
    assert!(err_of(json!([])).contains("configuration must be an object"));
    assert!(Config::parse(b"{not json")
        .unwrap_err()
        .to_string()
        .starts_with("configuration is not valid JSON"));
    assert!(Config::parse(b"").is_err());
}

#[test]
fn normalize_host_cases() {
    assert_eq!(normalize_host("API.Example.COM:8443"), "api.example.com");
    assert_eq!(normalize_host("example.com."), "example.com");
    assert_eq!(normalize_host("[::1]:10000"), "[::1]");
    assert_eq!(normalize_host("::1"), "::1");
    assert_eq!(normalize_host("localhost"), "localhost");
}

#[test]
fn never_panics_on_odd_json() {
    for s in [
        "null",
        "1",
        "\"x\"",
        "{\"policies\": [null]}",
        "{\"policies\": [{\"id\": 5}]}",
        "{\"policies\": [{\"id\": \"a\", \"spec\": []}]}",
        "{\"policies\": [{\"id\": \"a\", \"spec\": {\"selector\": {}, \"loop_detection\": []}}]}",
        "{\"policies\": {}}",
        "{\"max_body_bytes\": 1e300, \"policies\": []}",
    ] {
        assert!(Config::parse(s.as_bytes()).is_err(), "{s}");
    }
}

#[test]
fn objects_must_be_objects_even_where_serde_would_read_a_list() {
    // serde's derive would read a struct from a list of its fields in
    // order; a configuration never means that.
    assert_eq!(
        err_of(with(
            &["policies", "0", "spec", "selector"],
            json!([null, null, null, null, null])
        )),
        "policy \"llm-policy\": selector must be an object (got [null,null,null,null,null])"
    );
    assert_eq!(
        err_of(with(&ld("escalation"), json!([[3, "warn"]]))),
        "policy \"llm-policy\": loop_detection.escalation[0] must be an object (got [3,\"warn\"])"
    );
    assert!(err_of(json!({"policies": [["p", {}]]}))
        .starts_with("policies[0] must be an object (got [\"p\",{}])"));
}

#[test]
fn wrong_types_name_the_full_path_and_what_was_expected() {
    assert_eq!(
        err_of(with(&ld("escalation"), json!([{"at": 3, "action": 7}]))),
        "policy \"llm-policy\": loop_detection.escalation[0].action must be a string (got 7)"
    );
    assert_eq!(
        err_of(with(&ld("escalation"), json!([{"at": 3, "action": "block"}]))),
        "policy \"llm-policy\": loop_detection.escalation[0].action must be \"reject\", \"throttle\" or \"warn\" (got \"block\")"
    );
    assert_eq!(
        err_of(with(
            &["policies", "0", "spec", "selector", "methods"],
            json!(["GET", 5])
        )),
        "policy \"llm-policy\": selector.methods[1] must be a string (got 5)"
    );
    assert_eq!(
        err_of(with(&["policies", "0", "spec", "exempt"], json!({"key": "header:x"}))),
        "policy \"llm-policy\": exempt must be a list of {\"key\": ..., \"present\" | \"values\": ...} (got {\"key\":\"header:x\"})"
    );
    assert_eq!(
        err_of(with(
            &["store"],
            json!({"type": "redis_webdis", "cluster": "r", "timeot_ms": 5})
        )),
        "store.timeot_ms is not a known field (did you mean \"timeout_ms\"?)"
    );
    // A policy without a usable id: errors inside it name its position.
    assert_eq!(
        err_of(
            json!({"policies": [{"id": "bad id!", "spec": {"selector": {}, "loop_detecton": {}}}]})
        ),
        "policies[0].spec.loop_detecton is not a known field (did you mean \"loop_detection\"?)"
    );
    // JSON null is the same as leaving a field out.
    let cfg = Config::from_value(&with(&["max_body_bytes"], Value::Null)).unwrap();
    assert_eq!(cfg.max_body_bytes, 1_048_576);
}

#[test]
fn near_mode_settings() {
    let near = |extra: Value| {
        let mut v = with(&ld("similarity"), json!("near"));
        for (k, x) in extra.as_object().unwrap() {
            v["policies"][0]["spec"]["loop_detection"][k] = x.clone();
        }
        v
    };
    let cfg = Config::from_value(&near(json!({}))).unwrap();
    assert_eq!(
        cfg.policies[0].detection.as_ref().unwrap().similarity,
        Similarity::Near {
            tail_messages: 3,
            similarity_milli: crate::config::DEFAULT_NEAR_SIMILARITY_MILLI,
            history: 64
        }
    );
    let cfg = Config::from_value(&near(
        json!({"near_similarity": 0.35, "near_history": 1024, "tail_messages": 5}),
    ))
    .unwrap();
    assert_eq!(
        cfg.policies[0].detection.as_ref().unwrap().similarity,
        Similarity::Near {
            tail_messages: 5,
            similarity_milli: 350,
            history: 1024
        }
    );
    // 1 is allowed (every word shared); an integral 1.0 too.
    assert!(Config::from_value(&near(json!({"near_similarity": 1}))).is_ok());
    for bad in [json!(0), json!(-0.2), json!(1.01), json!(2)] {
        let e = err_of(near(json!({ "near_similarity": bad })));
        assert!(
            e.contains("policy \"llm-policy\": loop_detection.near_similarity must be above 0 and at most 1"),
            "{e}"
        );
    }
    assert!(err_of(near(json!({"near_similarity": "0.5"}))).contains(
        "loop_detection.near_similarity must be a number above 0 and at most 1 (got \"0.5\")"
    ));
    // The SimHash distance is gone: its replacement is named.
    let e = err_of(near(json!({"near_distance": 3})));
    assert!(
        e.contains("policy \"llm-policy\": loop_detection.near_distance was replaced by \"near_similarity\""),
        "{e}"
    );
    assert!(err_of(near(json!({"near_history": 0})))
        .contains("loop_detection.near_history must be >= 1 (got 0)"));
    // The history must hold the threshold's count.
    assert!(err_of(near(json!({"near_history": 4})))
        .contains("loop_detection.near_history must be >= the count of the last step (4 < 5)"));
    // Near settings elsewhere are errors.
    assert!(err_of(with(&ld("near_similarity"), json!(0.5)))
        .contains("loop_detection.near_similarity applies only to similarity \"near\""));
    assert!(err_of(with(&ld("tail_messages"), json!(3)))
        .contains("applies only to similarity \"llm_tail\" or \"near\""));
}

#[test]
fn volatile_masking_settings() {
    let spec = |volatile: Value, similarity: &str| {
        let mut v = with(&ld("similarity"), json!(similarity));
        v["policies"][0]["spec"]["volatile"] = volatile;
        v
    };
    use crate::request::llm::volatile::Class;
    // Default: every class but every-number masking, arguments unmasked.
    let cfg = Config::from_value(&with(&ld("similarity"), json!("llm_tail"))).unwrap();
    assert_eq!(cfg.policies[0].volatile, Volatile::default_on());
    let cfg = Config::from_value(&spec(
        json!({"classes": ["uuid", "datetime"], "tool_arguments": true}),
        "llm_tail",
    ))
    .unwrap();
    let v = cfg.policies[0].volatile;
    assert!(v.classes.contains(Class::Uuid) && v.classes.contains(Class::DateTime));
    assert!(!v.classes.contains(Class::Epoch));
    assert!(v.tool_arguments);
    let off = Config::from_value(&spec(json!({"enabled": false}), "near")).unwrap();
    assert_eq!(off.policies[0].volatile, Volatile::OFF);
    assert!(err_of(spec(json!({"classes": ["uuids"]}), "llm_tail"))
        .contains("policy \"llm-policy\": volatile.classes[0]"));
    assert!(err_of(spec(json!({"classes": []}), "llm_tail"))
        .contains("volatile.classes must not be empty"));
    assert!(err_of(spec(
        json!({"enabled": false, "tool_arguments": true}),
        "llm_tail"
    ))
    .contains("volatile.enabled is false, so \"classes\" and \"tool_arguments\" would do nothing"));
    // Exact and session modes compare no text.
    assert!(err_of(spec(json!({}), "exact")).contains(
        "volatile applies only to similarity \"llm_tail\" or \"near\", or to tool_loops"
    ));
    assert!(err_of(spec(json!({"clases": []}), "llm_tail")).contains("did you mean \"classes\""));
}

#[test]
fn cycle_and_answer_settings() {
    let tl = |v: Value| with(&["policies", "0", "spec", "tool_loops"], v);
    let cfg = Config::from_value(&tl(json!({"enabled": true}))).unwrap();
    let t = cfg.policies[0].tool_loops.clone().unwrap();
    assert_eq!((t.cycle_min, t.answer_min), (3, 3));
    let cfg = Config::from_value(&tl(
        json!({"enabled": true, "cycle_min": 0, "answer_min": 5}),
    ))
    .unwrap();
    let t = cfg.policies[0].tool_loops.clone().unwrap();
    assert_eq!((t.cycle_min, t.answer_min), (0, 5));
    assert!(
        err_of(tl(json!({"enabled": true, "cycle_min": 1}))).contains(
            "tool_loops.cycle_min must be >= 2 (got 1); use 0 to switch cycle detection off"
        )
    );
    assert!(err_of(tl(json!({"enabled": true, "answer_min": 17})))
        .contains("tool_loops.answer_min must be <= 16 (got 17)"));
}
