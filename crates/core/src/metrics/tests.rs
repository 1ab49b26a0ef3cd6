use super::*;
use crate::config::StepName;
use serde_json::json;

#[test]
fn every_id_names_its_metric() {
    let cfg = Config::from_value(&json!({"policies": [
        {"id": "a", "spec": {"selector": {}, "tool_loops": {"enabled": true}}},
        {"id": "b", "spec": {"selector": {}, "tool_loops": {"enabled": true}}}]}))
    .unwrap();
    let r = Registry::new(&cfg);
    let name = |id: Option<MetricId>| r.defs()[id.unwrap().0 as usize].0.clone();
    assert_eq!(name(Some(MetricId::REQUESTS)), "loopguard.requests_total");
    assert_eq!(
        r.defs()[MetricId::TABLE_ENTRIES.0 as usize],
        ("loopguard.table_entries_used".to_string(), Kind::Gauge)
    );
    assert_eq!(
        name(Some(r.skipped(SkipReason::TooDeep))),
        "loopguard.bodies_skipped_total.reason.too_deep"
    );
    assert_eq!(
        name(Some(r.store_call(CallResult::Reply))),
        "loopguard.store_calls_total.result.reply"
    );
    assert_eq!(
        name(Some(r.fallback(OnStoreError::Allow))),
        "loopguard.store_fallback_total.action.allow"
    );
    assert_eq!(
        name(Some(r.webhook(WebhookResult::Dropped))),
        "loopguard.webhook_total.result.dropped"
    );
    assert_eq!(name(r.matched(1)), "loopguard.matched_total.policy.b");
    assert_eq!(
        name(r.throttle_delay(0)),
        "loopguard.throttle_delay_ms.policy.a"
    );
    assert_eq!(
        name(r.detected(1, true)),
        "loopguard.detected_total.policy.b.mode.shadow"
    );
    assert_eq!(
        name(r.shadow(0, WouldBe::Directive)),
        "loopguard.shadow_total.policy.a.action.directive"
    );
    assert_eq!(
        name(r.tool_loop(1, Tier::Pattern, ToolStep::Reject)),
        "loopguard.tool_loop_detected_total.policy.b.tier.pattern.step.reject"
    );
    assert_eq!(
        name(r.tokens(1, TokenType::Output, true, None)),
        "loopguard.tokens_total.policy.b.token_type.output.loop.true.model.other"
    );
    assert_eq!(
        name(r.tokens(0, TokenType::Input, false, Some(0))),
        "loopguard.tokens_total.policy.a.token_type.input.loop.false.model.other"
    );
    assert_eq!(r.cost(0, true, None), None);
    assert_eq!(
        name(r.without_usage(1)),
        "loopguard.responses_without_usage_total.policy.b"
    );
    assert_eq!(
        name(r.failed_attempt(0, None)),
        "loopguard.failed_attempts_total.policy.a.result.unrecorded"
    );
    assert_eq!(
        name(r.tool_loop(0, Tier::Turn, ToolStep::Nudge)),
        "loopguard.tool_loop_detected_total.policy.a.tier.turn.step.nudge"
    );
    assert_eq!(
        name(r.harness_retries(1)),
        "loopguard.harness_retries_total.policy.b"
    );
    assert_eq!(
        name(Some(MetricId::LEDGER_FAILED)),
        "loopguard.spend_ledger_failed_total"
    );
    assert_eq!(r.matched(2), None);
    assert_eq!(
        r.defs().len(),
        (GLOBALS + 2 * Registry::per_policy(0)) as usize
    );
    // Names are unique.
    let mut names: Vec<&String> = r.defs().iter().map(|(n, _)| n).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), r.defs().len());
}

#[test]
fn token_and_cost_ids_name_their_model() {
    let cfg = Config::from_value(&json!({
        "prices": {
            "gpt-4.1": {"input_per_million": 2, "output_per_million": 8},
            "claude-sonnet-4": {"input_per_million": 3, "output_per_million": 15}},
        "policies": [
            {"id": "a", "spec": {"selector": {}, "tool_loops": {"enabled": true}}},
            {"id": "b", "spec": {"selector": {}, "tool_loops": {"enabled": true}}}]}))
    .unwrap();
    let r = Registry::new(&cfg);
    let name = |id: Option<MetricId>| r.defs()[id.unwrap().0 as usize].0.clone();
    // The price list is kept in name order.
    let models = [
        (Some(0), "claude-sonnet-4"),
        (Some(1), "gpt-4.1"),
        (None, "other"),
    ];
    let mut seen = Vec::new();
    for p in 0..2 {
        let id = ["a", "b"][p];
        for (t, tn) in [(TokenType::Input, "input"), (TokenType::Output, "output")] {
            for (m, mn) in models {
                for l in [false, true] {
                    seen.push(name(r.tokens(p, t, l, m)));
                    assert_eq!(
                        seen.last().unwrap(),
                        &format!("loopguard.tokens_total.policy.{id}.token_type.{tn}.loop.{l}.model.{mn}")
                    );
                }
                seen.push(name(r.tokens_avoided(p, t, m)));
                assert_eq!(
                    seen.last().unwrap(),
                    &format!(
                        "loopguard.tokens_avoided_total.policy.{id}.token_type.{tn}.model.{mn}"
                    )
                );
            }
        }
        for (m, mn) in models {
            for l in [false, true] {
                match m {
                    Some(_) => {
                        seen.push(name(r.cost(p, l, m)));
                        assert_eq!(
                            seen.last().unwrap(),
                            &format!(
                                "loopguard.cost_microusd_total.policy.{id}.loop.{l}.model.{mn}"
                            )
                        );
                    }
                    None => assert_eq!(r.cost(p, l, m), None),
                }
            }
            match m {
                Some(_) => {
                    seen.push(name(r.cost_avoided(p, m)));
                    assert_eq!(
                        seen.last().unwrap(),
                        &format!("loopguard.cost_avoided_microusd_total.policy.{id}.model.{mn}")
                    );
                }
                None => assert_eq!(r.cost_avoided(p, m), None),
            }
        }
        seen.push(name(r.without_usage(p)));
        seen.push(name(r.degenerate_output(p)));
        assert_eq!(
            seen.last().unwrap(),
            &format!("loopguard.degenerate_output_total.policy.{id}")
        );
        // An unknown model index is `other`.
        assert_eq!(
            r.tokens(p, TokenType::Input, true, Some(7)),
            r.tokens(p, TokenType::Input, true, None)
        );
    }
    // Every id above is distinct, and the block ends where the next
    // policy's begins.
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n);
    assert_eq!(
        r.defs().len(),
        (GLOBALS + 2 * Registry::per_policy(2)) as usize
    );
    assert_eq!(name(r.matched(1)), "loopguard.matched_total.policy.b");
}

/// The ids computed from an enum's order name the label of every variant
/// (a variant moved in its enum would count under another's name).
#[test]
fn every_variant_counts_under_its_own_label() {
    let cfg = Config::from_value(&json!({"policies": [
        {"id": "a", "spec": {"selector": {}, "tool_loops": {"enabled": true}}}]}))
    .unwrap();
    let r = Registry::new(&cfg);
    let name = |id: Option<MetricId>| r.defs()[id.unwrap().0 as usize].0.clone();
    let results = [
        (CallResult::Ok, "ok"),
        (CallResult::Unavailable, "unavailable"),
        (CallResult::Status, "status"),
        (CallResult::Reply, "reply"),
        (CallResult::NoScript, "noscript"),
    ];
    for (result, label) in results {
        assert!(name(Some(r.store_call(result))).ends_with(&format!(".result.{label}")));
    }
    for (on_error, label) in [
        (OnStoreError::Local, "local"),
        (OnStoreError::Allow, "allow"),
    ] {
        assert!(name(Some(r.fallback(on_error))).ends_with(&format!(".action.{label}")));
    }
    let webhook = [
        (WebhookResult::Sent, "sent"),
        (WebhookResult::Failed, "failed"),
        (WebhookResult::Dropped, "dropped"),
    ];
    for (result, label) in webhook {
        assert!(name(Some(r.webhook(result))).ends_with(&format!(".result.{label}")));
    }
    use SkipReason::*;
    let reasons = [TooLarge, Unreadable, Unparsed, TooDeep, TooMany];
    for (reason, label) in reasons.into_iter().zip(SKIP_REASONS) {
        assert!(name(Some(r.skipped(reason))).ends_with(&format!(".reason.{label}")));
    }
    let would = [
        (WouldBe::Warn, "warn"),
        (WouldBe::Throttle, "throttle"),
        (WouldBe::Reject, "reject"),
        (WouldBe::Nudge, "nudge"),
        (WouldBe::Directive, "directive"),
    ];
    for (w, label) in would {
        assert!(name(r.shadow(0, w)).ends_with(&format!(".action.{label}")));
    }
    for step in [ToolStep::Nudge, ToolStep::Directive, ToolStep::Reject] {
        let n = name(r.tool_loop(0, Tier::Cycle, step));
        assert!(
            n.ends_with(&format!(".tier.cycle.step.{}", step.as_str())),
            "{n}"
        );
    }
    let forgave = [
        (Some(Forgave::Forgiven), "forgiven"),
        (Some(Forgave::OverBudget), "counted"),
        (Some(Forgave::NotFound), "gone"),
        (None, "unrecorded"),
    ];
    for (f, label) in forgave {
        assert!(name(r.failed_attempt(0, f)).ends_with(&format!(".result.{label}")));
    }
}
