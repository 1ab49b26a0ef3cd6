//! The configuration as a whole: parsing, defaults, numbers, top-level
//! switches, unknown fields and wrong types; and the helpers the other
//! configuration tests share.

use super::*;
use serde_json::json;

pub(super) fn base() -> Value {
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

pub(super) fn err_of(v: Value) -> String {
    match Config::from_value(&v) {
        Ok(_) => panic!("expected an error for {v}"),
        Err(e) => e.to_string(),
    }
}

pub(super) fn with(path: &[&str], value: Value) -> Value {
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

pub(super) fn without(path: &[&str]) -> Value {
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

pub(super) fn ld(field: &str) -> Vec<&str> {
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
