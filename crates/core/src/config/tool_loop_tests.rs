//! The `tool_loops` block: defaults, bounds and ladder, and the cycle,
//! answer-loop and same-turn counts.

use super::tests::{err_of, with, without};
use super::*;
use serde_json::json;

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
            .contains("loop_detection is required (or give tool_loops, mcp or budget)")
    );
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

#[test]
fn same_turn_settings() {
    let tl = |v: Value| with(&["policies", "0", "spec", "tool_loops"], v);
    let turn_min = |v: Value| {
        Config::from_value(&tl(v)).unwrap().policies[0]
            .tool_loops
            .clone()
            .unwrap()
            .turn_min
    };
    assert_eq!(turn_min(json!({"enabled": true})), 8);
    assert_eq!(turn_min(json!({"enabled": true, "turn_min": 0})), 0);
    assert_eq!(turn_min(json!({"enabled": true, "turn_min": 32})), 32);
    assert!(
        err_of(tl(json!({"enabled": true, "turn_min": 1}))).contains(
            "tool_loops.turn_min must be >= 2 (got 1); use 0 to switch same-turn detection off"
        )
    );
    assert!(err_of(tl(json!({"enabled": true, "turn_min": 33})))
        .contains("tool_loops.turn_min must be <= 32 (got 33)"));
    // The conversation is kept far enough back for the ladder to climb.
    let keep = |v: Value| Config::from_value(&tl(v)).unwrap().policies[0].items_needed();
    assert!(keep(json!({"enabled": true, "turn_min": 32})) > keep(json!({"enabled": true})));
}
