//! Tool loops through the flow: the nudge, directive and reject ladder,
//! events logged once, shadow mode.

use super::tests::{Harness, Sent};
use super::*;
use serde_json::json;

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
    h.now += super::enact::EVENT_WINDOW_MS;
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
