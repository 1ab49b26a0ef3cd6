//! What loops spend: tokens priced per model, the loop's spending in its
//! events, what rejected requests would have spent, and the looping
//! callers' own series.

use super::tests::{events, Harness, Sent};
use super::usage::{caller_hash, caller_tag};
use super::*;
use serde_json::{json, Value};

const PRICES: &str = r#"{"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10, "cached_input_per_million": 1.25}}"#;

fn chat(model: &str) -> String {
    json!({"model": model, "messages": [
        {"role": "user", "content": "is the build green?"}]})
    .to_string()
}

fn usage_body(input: u64, output: u64) -> String {
    json!({"choices": [{"message": {"content": "checking"}}],
        "usage": {"prompt_tokens": input, "completion_tokens": output}})
    .to_string()
}

fn ask(h: &mut Harness, key: &str, body: &str) -> Sent {
    let auth = format!("Bearer {key}");
    h.send(
        "POST",
        "/v1/chat/completions",
        &[("authorization", auth.as_str())],
        body.as_bytes(),
    )
}

/// Answer `s` with a JSON body carrying `body`: the effects.
fn answer(h: &mut Harness, s: &mut Sent, body: &str) -> Effects {
    let mut out = h.answer(s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
    if s.req.wants_response_body() {
        h.engine
            .on_response_body(&mut s.req, body.as_bytes(), true, h.now, &mut out);
    }
    h.engine.on_done(&mut s.req, &mut out);
    out
}

fn named(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::CountNamed(n, 1) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

fn priced_llm_tail() -> Harness {
    Harness::new(json!({
        "prices": serde_json::from_str::<Value>(PRICES).unwrap(),
        "policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {
            "enabled": true, "window_seconds": 60, "similarity": "llm_tail",
            "escalation": [{"at": 3, "action": "warn"}, {"at": 4, "action": "reject"}]}}}]}))
}

#[test]
fn a_loop_s_event_carries_what_it_spent_and_a_rejection_what_it_saved() {
    let mut h = priced_llm_tail();
    // A dated model name takes the undated name's price.
    let body = chat("gpt-4o-2024-08-06");
    let mut all = Effects::new();
    for (i, (input, output)) in [(1000, 100), (1200, 150)].into_iter().enumerate() {
        let mut s = ask(&mut h, "sk-a", &body);
        assert!(s
            .effects
            .iter()
            .all(|e| !matches!(e, Effect::CountNamed(..))));
        let out = answer(&mut h, &mut s, &usage_body(input, output));
        assert_eq!(
            h.metric(
                &out,
                "loopguard.tokens_total.policy.p.token_type.input.loop.false.model.gpt-4o"
            ),
            input as i64,
            "response {i}"
        );
        all.extend(out);
    }
    // 1000 + 1200 input at $2.50/M, 100 + 150 output at $10/M.
    assert_eq!(
        h.metric(
            &all,
            "loopguard.cost_microusd_total.policy.p.loop.false.model.gpt-4o"
        ),
        2500 + 3000 + 1000 + 1500
    );
    // The third is the detection: its event reports the two responses
    // before it, and who is looping.
    let mut third = ask(&mut h, "sk-a", &body);
    let e = events(&third.effects, "loop.detected");
    assert_eq!(e.len(), 1, "{:?}", third.effects);
    let tag = e[0]["caller"].as_str().unwrap().to_string();
    assert_eq!(tag.len(), 12);
    assert_eq!(
        e[0]["spent"],
        json!({"responses": 2, "input_tokens": 2200, "output_tokens": 250, "usd": 0.008})
    );
    assert_eq!(
        named(&third.effects),
        vec![format!(
            "loopguard.caller_loop_requests_total.policy.p.caller.{tag}"
        )]
    );
    let out = answer(&mut h, &mut third, &usage_body(1300, 90));
    assert_eq!(
        h.metric(
            &out,
            "loopguard.tokens_total.policy.p.token_type.output.loop.true.model.gpt-4o"
        ),
        90
    );
    assert_eq!(
        h.metric(
            &out,
            "loopguard.cost_microusd_total.policy.p.loop.true.model.gpt-4o"
        ),
        3250 + 900
    );
    // The fourth is rejected: it would have spent about what the newest
    // response did.
    let fourth = ask(&mut h, "sk-a", &body);
    assert_eq!(fourth.status(), 429);
    let fx = &fourth.effects;
    assert_eq!(
        h.metric(
            fx,
            "loopguard.tokens_avoided_total.policy.p.token_type.input.model.gpt-4o"
        ),
        1300
    );
    assert_eq!(
        h.metric(
            fx,
            "loopguard.tokens_avoided_total.policy.p.token_type.output.model.gpt-4o"
        ),
        90
    );
    assert_eq!(
        h.metric(
            fx,
            "loopguard.cost_avoided_microusd_total.policy.p.model.gpt-4o"
        ),
        3250 + 900
    );
    // The caller is the same one, counted once per request.
    assert_eq!(named(fx).len(), 1);
}

#[test]
fn an_unpriced_model_counts_tokens_as_other_and_no_dollars() {
    let mut h = priced_llm_tail();
    let mut s = ask(&mut h, "sk-a", &chat("gpt-4o-mini"));
    let out = answer(&mut h, &mut s, &usage_body(10, 5));
    assert_eq!(
        h.metric(
            &out,
            "loopguard.tokens_total.policy.p.token_type.input.loop.false.model.other"
        ),
        10
    );
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Count(id, _)
            if h.engine.registry().defs()[id.0 as usize].0.starts_with("loopguard.cost"))),
        "{out:?}"
    );
    // Without prices, events carry tokens but no dollars.
    let mut h = Harness::policy(json!({"selector": {}, "loop_detection": {
        "enabled": true, "window_seconds": 60, "similarity": "llm_tail",
        "escalation": [{"at": 2, "action": "warn"}]}}));
    let body = chat("gpt-4o");
    let mut first = ask(&mut h, "sk-a", &body);
    answer(&mut h, &mut first, &usage_body(10, 5));
    let second = ask(&mut h, "sk-a", &body);
    let e = events(&second.effects, "loop.detected");
    assert_eq!(
        e[0]["spent"],
        json!({"responses": 1, "input_tokens": 10, "output_tokens": 5})
    );
}

#[test]
fn looping_callers_get_their_own_series_up_to_a_bound() {
    let mut h = Harness::policy(json!({"selector": {}, "loop_detection": {
        "enabled": true, "window_seconds": 60, "similarity": "exact",
        "escalation": [{"at": 2, "action": "warn"}]}}));
    let mut names = Vec::new();
    for c in 0..crate::metrics::MAX_CALLER_SERIES + 3 {
        let key = format!("sk-{c}");
        ask(&mut h, &key, "{}");
        names.extend(named(&ask(&mut h, &key, "{}").effects));
    }
    let others = names
        .iter()
        .filter(|n| n.ends_with(".caller.other"))
        .count();
    assert_eq!(others, 3);
    names.sort();
    names.dedup();
    assert_eq!(names.len(), crate::metrics::MAX_CALLER_SERIES + 1);
    // A known caller keeps its series; the tag is the caller's hash, the
    // same on every worker and replica.
    let again = named(&ask(&mut h, "sk-0", "{}").effects);
    let mut facts_identity = None;
    for n in &names {
        if n.ends_with(&caller_tag(caller_hash("p", b"x"))) {
            facts_identity = Some(n);
        }
    }
    assert_eq!(facts_identity, None, "a caller never seen has no series");
    assert_eq!(again.len(), 1);
    assert!(names.contains(&again[0]));
    // Nothing is counted for requests outside loops.
    assert!(named(&ask(&mut h, "sk-new", "{\"n\":1}").effects).is_empty());
}

#[test]
fn a_tool_loop_only_policy_keeps_the_conversation_s_spending() {
    let mut h = Harness::policy(json!({"selector": {}, "tool_loops": {"enabled": true}}));
    let conversation = |calls: usize| {
        let mut msgs = vec![json!({"role": "user", "content": "read the config"})];
        for i in 0..calls {
            msgs.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}"), "type": "function", "function": {"name": "read_file", "arguments": "{\"path\": \"/etc/a\"}"}}]}));
            msgs.push(
                json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "no change"}),
            );
        }
        json!({"model": "m", "messages": msgs}).to_string()
    };
    // The first turns are healthy; the third call of the same tool is the
    // first verdict.
    for calls in 0..3 {
        let mut s = ask(&mut h, "sk-a", &conversation(calls));
        assert!(events(&s.effects, "loop.tool.detected").is_empty());
        answer(&mut h, &mut s, &usage_body(500, 20));
    }
    let s = ask(&mut h, "sk-a", &conversation(3));
    let e = events(&s.effects, "loop.tool.detected");
    assert_eq!(e.len(), 1, "{:?}", s.effects);
    // The conversation's earlier turns are what it spent (the same
    // conversation: its caller and first message).
    assert_eq!(
        e[0]["spent"],
        json!({"responses": 3, "input_tokens": 1500, "output_tokens": 60})
    );
    // Another caller's conversation is another one.
    let other = ask(&mut h, "sk-b", &conversation(3));
    let e = events(&other.effects, "loop.tool.detected");
    assert_eq!(e[0]["spent"]["responses"], json!(0));
    assert_eq!(e[0]["caller"].as_str().map(str::len), Some(12));
}
