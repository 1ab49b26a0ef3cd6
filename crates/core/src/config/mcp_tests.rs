//! The `mcp` block: defaults, every field's range, the ladder's order,
//! and what it cannot be combined with.

use super::*;
use serde_json::{json, Value};

fn with_mcp(mcp: Value) -> Value {
    json!({"policies": [{"id": "tools", "spec": {"selector": {"pathPrefix": "/mcp"}, "mcp": mcp}}]})
}

fn err(mcp: Value) -> String {
    Config::from_value(&with_mcp(mcp)).unwrap_err().to_string()
}

#[test]
fn defaults_and_a_full_block() {
    let cfg = Config::from_value(&with_mcp(json!({"enabled": true}))).unwrap();
    let m = cfg.policies[0].mcp.as_ref().unwrap();
    assert_eq!(
        (m.same_result_min, m.same_error_min, m.cycle_min),
        (3, 3, 3)
    );
    assert_eq!(m.ladder, vec![McpStep::Note, McpStep::Block]);
    assert_eq!(
        (m.error_code, m.key, m.window_ms),
        (-31_000, McpKey::Session, 600_000)
    );
    assert_eq!(m.recheck_ms, 60_000);
    // Durations and attempt counts are what a poll watches change: kept in
    // results unless the policy lists its classes.
    use crate::config::volatile::Class;
    assert!(!m.result_classes.contains(Class::NoiseNumbers));
    assert!(m.result_classes.contains(Class::DateTime));
    let mut listed = with_mcp(json!({"enabled": true}));
    listed["policies"][0]["spec"]["volatile"] = json!({"classes": ["noise_numbers"]});
    let cfg2 = Config::from_value(&listed).unwrap();
    assert!(cfg2.policies[0]
        .mcp
        .as_ref()
        .unwrap()
        .result_classes
        .contains(Class::NoiseNumbers));
    assert!(cfg.policies[0].is_active() && cfg.policies[0].detection.is_none());
    let cfg = Config::from_value(&with_mcp(json!({"enabled": true, "same_result_min": 4,
        "same_error_min": 2, "cycle_min": 0, "exempt_tools": ["poll"], "ladder": ["block", "error"],
        "error_code": 4290, "key": "caller", "window_seconds": 60})))
    .unwrap();
    let m = cfg.policies[0].mcp.as_ref().unwrap();
    assert_eq!(
        (m.same_result_min, m.same_error_min, m.cycle_min),
        (4, 2, 0)
    );
    assert_eq!(
        (m.error_code, m.key, m.window_ms),
        (4290, McpKey::Caller, 60_000)
    );
    assert_eq!(m.exempt_tools, vec!["poll".to_string()]);
    let off = Config::from_value(&with_mcp(json!({"enabled": false}))).unwrap();
    assert!(off.policies[0].mcp.is_none() && !off.policies[0].is_active());
}

#[test]
fn each_field_is_checked_and_named() {
    for (mcp, want) in [
        (json!({}), "policy \"tools\": mcp.enabled is required"),
        (json!({"enabled": true, "same_result_min": 1}), "mcp.same_result_min must be >= 2 (got 1)"),
        (json!({"enabled": true, "same_error_min": 17}), "mcp.same_error_min must be <= 16 (got 17)"),
        (json!({"enabled": true, "cycle_min": 1}), "mcp.cycle_min must be >= 2 (got 1); use 0 to switch cycle detection off"),
        (json!({"enabled": true, "cycle_min": 6}), "mcp.cycle_min must be <= 5 (got 6)"),
        (json!({"enabled": true, "exempt_tools": []}), "mcp.exempt_tools must not be empty"),
        (json!({"enabled": true, "exempt_tools": ["a", ""]}), "mcp.exempt_tools[1] must name a tool"),
        (json!({"enabled": true, "ladder": ["block", "note"]}), "mcp.ladder must list its steps in the order note, block, then error or reject"),
        (json!({"enabled": true, "ladder": ["error", "reject"]}), "mcp.ladder must list its steps in the order note, block, then error or reject (not both)"),
        (json!({"enabled": true, "ladder": ["note", "nudge"]}), "mcp.ladder"),
        (json!({"enabled": true, "ladder": ["error"], "error_code": -32001}), "mcp.error_code must be outside -32768..-32000, the range JSON-RPC reserves (got -32001)"),
        (json!({"enabled": true, "error_code": 7}), "mcp.error_code needs an \"error\" step in the ladder"),
        (json!({"enabled": true, "key": "user"}), "mcp.key"),
        (json!({"enabled": true, "window_seconds": 0}), "mcp.window_seconds must be >= 1 (got 0)"),
        (json!({"enabled": true, "recheck_seconds": 86_401}), "mcp.recheck_seconds must be <= 86400 (got 86401)"),
        (json!({"enabled": true, "recheck_seconds": 86_401}), "mcp.recheck_seconds must be <= 86400 (got 86401)"),
        (json!({"enabled": true, "same_result": 3}), "mcp.same_result"),
    ] {
        let got = err(mcp.clone());
        assert!(got.contains(want), "{mcp}: {got}");
    }
}

#[test]
fn mcp_has_a_policy_of_its_own() {
    for (extra, field) in [
        (
            json!({"loop_detection": {"enabled": true}}),
            "loop_detection",
        ),
        (json!({"tool_loops": {"enabled": true}}), "tool_loops"),
    ] {
        let mut v = with_mcp(json!({"enabled": true}));
        for (k, val) in extra.as_object().unwrap() {
            v["policies"][0]["spec"][k] = val.clone();
        }
        let got = Config::from_value(&v).unwrap_err().to_string();
        assert!(
            got.contains(&format!(
                "policy \"tools\": {field} cannot be combined with mcp"
            )),
            "{got}"
        );
    }
    // Volatile masking applies to MCP results (and opted-in arguments).
    let mut v = with_mcp(json!({"enabled": true}));
    v["policies"][0]["spec"]["volatile"] = json!({"tool_arguments": true});
    let cfg = Config::from_value(&v).unwrap();
    assert!(!cfg.policies[0]
        .mcp
        .as_ref()
        .unwrap()
        .arguments_mask
        .is_empty());
}
