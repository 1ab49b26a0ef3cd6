//! Spend caps nobody slips past: a body too large to read, a request with
//! no body, a model no price names, a cost the upstream reports, an answer
//! that never came, a stream that did not ask for its usage, and caps per
//! end user.

use super::budget_tests::spent_total as spent;
use super::tests::{Harness, Sent};
use super::*;
use serde_json::{json, Value};

fn harness(top: Value, budget: Value) -> Harness {
    let mut cfg = top;
    cfg["policies"] = json!([{"id": "p", "spec": {"selector": {}, "budget": budget}}]);
    Harness::new(cfg)
}

fn chat(model: &str, extra: Value) -> String {
    let mut b = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    b.to_string()
}

fn ask(h: &mut Harness, headers: &[(&str, &str)], body: &str) -> Sent {
    let mut all = vec![("authorization", "Bearer sk-a")];
    all.extend_from_slice(headers);
    h.send("POST", "/v1/chat/completions", &all, body.as_bytes())
}

/// The upstream answers with `status`, `head` and `body` (JSON).
fn answer_with(
    h: &mut Harness,
    s: &mut Sent,
    status: u32,
    head: crate::response::ResponseHead<'_>,
    body: &str,
) -> Effects {
    let mut out = h.answer(s, status);
    h.engine
        .on_response_head(&mut s.req, &head, h.now, &mut out);
    if s.req.wants_response_body() {
        h.engine
            .on_response_body(&mut s.req, body.as_bytes(), true, h.now, &mut out);
    }
    h.engine.on_done(&mut s.req, &mut out);
    out
}

fn json_head() -> crate::response::ResponseHead<'static> {
    crate::response::ResponseHead {
        content_type: Some("application/json"),
        ..Default::default()
    }
}

fn usage(input: u64, output: u64) -> String {
    json!({"model": "gpt-4o-2024-08-06", "choices": [{"message": {"content": "ok"}}],
        "usage": {"prompt_tokens": input, "completion_tokens": output}})
    .to_string()
}

fn response_header<'a>(effects: &'a [Effect], name: &str) -> Vec<&'a str> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::AddResponseHeader(n, v) if *n == name => Some(v.as_str()),
            _ => None,
        })
        .collect()
}

fn calls_cap(n: u64) -> Value {
    json!({"limits": [{"name": "calls", "per": "caller", "window_seconds": 60, "calls": n}]})
}

#[test]
fn a_body_too_large_to_read_is_still_checked_and_counted() {
    let mut h = harness(json!({"max_body_bytes": 1024}), calls_cap(2));
    let big = chat("gpt-4o", json!({"pad": "x".repeat(4000)}));
    for i in 0..2 {
        let mut s = ask(&mut h, &[], &big);
        assert_eq!(s.status(), 200, "call {i}");
        let out = answer_with(&mut h, &mut s, 200, json_head(), &usage(10, 2));
        assert_eq!(spent(&out), 1, "call {i} counted");
    }
    assert_eq!(ask(&mut h, &[], &big).status(), 429);
    // A body-less request is a call too.
    let mut h = harness(json!({}), calls_cap(1));
    let mut s = h.send(
        "GET",
        "/v1/models",
        &[("authorization", "Bearer sk-a")],
        b"",
    );
    assert_eq!(s.status(), 200);
    answer_with(&mut h, &mut s, 200, json_head(), "{}");
    let s = h.send(
        "GET",
        "/v1/models",
        &[("authorization", "Bearer sk-a")],
        b"",
    );
    assert_eq!(s.status(), 429);
}

#[test]
fn a_session_header_is_checked_whatever_the_body() {
    let mut h = harness(
        json!({"max_body_bytes": 1024}),
        json!({"limits": [{"name": "s", "per": "session", "window_seconds": 60, "calls": 1}]}),
    );
    let big = chat("gpt-4o", json!({"pad": "x".repeat(4000)}));
    let mut s = ask(&mut h, &[("x-session-id", "s1")], &big);
    answer_with(&mut h, &mut s, 200, json_head(), &usage(1, 1));
    assert_eq!(ask(&mut h, &[("x-session-id", "s1")], &big).status(), 429);
    assert_eq!(ask(&mut h, &[("x-session-id", "s2")], &big).status(), 200);
}

fn dollars(usd: f64) -> Value {
    json!({"limits": [{"name": "usd", "per": "caller", "window_seconds": 3600, "usd": usd}]})
}

#[test]
fn built_in_prices_charge_models_no_configuration_names() {
    let mut h = harness(json!({}), dollars(5.0));
    let mut s = ask(&mut h, &[], &chat("openai/gpt-4o-2024-08-06", json!({})));
    // 1M input at $2.50, 100k output at $10 (the table's gpt-4o).
    let out = answer_with(&mut h, &mut s, 200, json_head(), &usage(1_000_000, 100_000));
    assert_eq!(spent(&out), 3_500_000);
    assert!(!out
        .iter()
        .any(|e| matches!(e, Effect::CountNamed(n, _) if n.contains("unpriced"))));
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    answer_with(&mut h, &mut s, 200, json_head(), &usage(1_000_000, 100_000));
    assert_eq!(ask(&mut h, &[], &chat("gpt-4o", json!({}))).status(), 429);
}

#[test]
fn an_unpriced_model_is_charged_its_providers_highest_price_and_named() {
    let mut h = harness(json!({}), dollars(5.0));
    let mut s = ask(&mut h, &[], &chat("gpt-99-preview", json!({})));
    assert_eq!(s.status(), 200);
    let out = answer_with(&mut h, &mut s, 200, json_head(), &usage(10_000, 1_000));
    let highest = crate::config::Prices::default().highest_for("gpt-99-preview");
    assert_eq!(highest.source.as_str(), "provider_max");
    let cost = highest.rate.cost(&crate::config::prices::Tokens {
        input: 10_000,
        output: 1_000,
        ..Default::default()
    });
    assert!(cost > 0);
    assert_eq!(spent(&out), i64::try_from(cost).unwrap());
    assert_eq!(
        h.metric(&out, "loopguard.budget_unpriced_total.policy.p"),
        1
    );
    let headers = response_header(&out, "x-loopguard-budget");
    assert!(
        headers
            .iter()
            .any(|v| v
                .starts_with("unpriced; model=gpt-99-preview; charged_as=openai (provider_max)")),
        "{headers:?}"
    );
    let events: Vec<&str> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Log(_, l) if l.contains("budget.unpriced") => Some(l.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(events.len(), 1, "{out:?}");
    assert!(events[0].contains(r#""model":"gpt-99-preview""#));
}

#[test]
fn unpriced_reject_refuses_and_ignore_charges_nothing() {
    let mut b = dollars(5.0);
    b["unpriced"] = json!("reject");
    let mut h = harness(json!({}), b);
    let s = ask(&mut h, &[], &chat("my-finetune", json!({})));
    assert_eq!(s.status(), 403);
    assert_eq!(s.json()["error"]["code"], "model_unpriced");
    assert_eq!(
        h.metric(&s.effects, "loopguard.budget_unpriced_total.policy.p"),
        1
    );
    // A priced model passes.
    assert_eq!(
        ask(&mut h, &[], &chat("gpt-4o-mini", json!({}))).status(),
        200
    );
    // Anthropic's shape.
    let body = json!({"model": "my-finetune", "max_tokens": 10, "messages": []}).to_string();
    let s = h.send(
        "POST",
        "/v1/messages",
        &[("authorization", "Bearer sk-a")],
        body.as_bytes(),
    );
    assert_eq!(s.status(), 403);
    assert_eq!(s.json()["error"]["type"], "permission_error");

    let mut b = dollars(5.0);
    b["unpriced"] = json!("ignore");
    let mut h = harness(json!({}), b);
    let mut s = ask(&mut h, &[], &chat("my-finetune", json!({})));
    let out = answer_with(&mut h, &mut s, 200, json_head(), &usage(10_000, 1_000));
    assert_eq!(spent(&out), 0);
    assert_eq!(
        h.metric(&out, "loopguard.budget_unpriced_total.policy.p"),
        1
    );
}

#[test]
fn a_cost_the_upstream_reports_wins_over_the_table() {
    let mut h = harness(json!({}), dollars(5.0));
    // OpenRouter's usage.cost.
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    let body = json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1, "cost": 0.25}}).to_string();
    let out = answer_with(&mut h, &mut s, 200, json_head(), &body);
    assert_eq!(spent(&out), 250_000);
    assert_eq!(
        h.metric(&out, "loopguard.budget_reported_cost_total.policy.p"),
        1
    );
    // LiteLLM's header.
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    let head = crate::response::ResponseHead {
        content_type: Some("application/json"),
        reported_cost: Some("0.125"),
    };
    let out = answer_with(&mut h, &mut s, 200, head, &usage(10, 1));
    assert_eq!(spent(&out), 125_000);
}

fn tokens_cap(n: u64) -> Value {
    json!({"limits": [{"name": "tok", "per": "caller", "window_seconds": 60, "tokens": n, "tokens_of": "output"}]})
}

#[test]
fn an_answer_that_never_came_is_charged_its_output_limit() {
    // The gateway gave up (504): the provider may still bill.
    let mut h = harness(json!({}), tokens_cap(1_000_000));
    let mut s = ask(
        &mut h,
        &[],
        &chat("gpt-4o", json!({"max_completion_tokens": 3000})),
    );
    let out = answer_with(
        &mut h,
        &mut s,
        504,
        crate::response::ResponseHead {
            content_type: Some("text/plain"),
            ..Default::default()
        },
        "upstream request timeout",
    );
    assert_eq!(spent(&out), 3000);
    assert_eq!(
        h.metric(&out, "loopguard.budget_estimated_total.policy.p"),
        1
    );
    // A 503 is the provider's failure: no call.
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    let out = answer_with(&mut h, &mut s, 503, json_head(), "{}");
    assert_eq!(spent(&out), 0);
    // The client left before the answer's headers: no limit set, the
    // default estimate.
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(spent(&out), 4096);
    // A refused request spends nothing when its client leaves.
    let mut h = harness(json!({}), calls_cap(1));
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    answer_with(&mut h, &mut s, 200, json_head(), &usage(1, 1));
    let mut refused = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    assert_eq!(refused.status(), 429);
    let mut out = Effects::new();
    h.engine.on_done(&mut refused.req, &mut out);
    assert_eq!(spent(&out), 0);
}

const STREAM_WITH_USAGE: &str = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\ndata: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n";
const STREAM_AS_ASKED: &str =
    "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";

#[test]
fn a_stream_is_asked_for_its_usage_and_the_client_sees_none_of_it() {
    let mut h = Harness::new(json!({"hold_request_headers": true,
        "policies": [{"id": "p", "spec": {"selector": {}, "budget": tokens_cap(1000)}}]}));
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({"stream": true})));
    let sent = s
        .effects
        .iter()
        .find_map(|e| match e {
            Effect::ReplaceBody { body, .. } => Some(body.clone()),
            _ => None,
        })
        .expect("the body asks for usage");
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let mut out = h.answer(&mut s, 200);
    let head = crate::response::ResponseHead {
        content_type: Some("text/event-stream"),
        ..Default::default()
    };
    h.engine
        .on_response_head(&mut s.req, &head, h.now, &mut out);
    h.engine.on_response_body(
        &mut s.req,
        STREAM_WITH_USAGE.as_bytes(),
        true,
        h.now,
        &mut out,
    );
    let to_client: Vec<u8> = out
        .iter()
        .find_map(|e| match e {
            Effect::ReplaceResponseBody { body, .. } => Some(body.clone()),
            _ => None,
        })
        .expect("the stream is rewritten");
    assert_eq!(String::from_utf8(to_client).unwrap(), STREAM_AS_ASKED);
    // Read, not estimated: 3 output tokens.
    assert_eq!(spent(&out), 3);
    assert_eq!(
        h.metric(&out, "loopguard.budget_estimated_total.policy.p"),
        0
    );
    // A client that asked gets the stream untouched.
    let mut s = ask(
        &mut h,
        &[],
        &chat(
            "gpt-4o",
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
    );
    assert!(!s
        .effects
        .iter()
        .any(|e| matches!(e, Effect::ReplaceBody { .. })));
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_head(&mut s.req, &head, h.now, &mut out);
    h.engine.on_response_body(
        &mut s.req,
        STREAM_WITH_USAGE.as_bytes(),
        true,
        h.now,
        &mut out,
    );
    assert!(!out
        .iter()
        .any(|e| matches!(e, Effect::ReplaceResponseBody { .. })));
}

#[test]
fn compressed_answers_are_not_asked_for() {
    let mut h = harness(json!({}), calls_cap(10));
    let s = ask(
        &mut h,
        &[("accept-encoding", "gzip, deflate")],
        &chat("gpt-4o", json!({})),
    );
    assert!(s
        .effects
        .contains(&Effect::RemoveRequestHeader("accept-encoding")));
}

#[test]
fn caps_per_end_user_are_scoped_to_their_caller() {
    let mut h = harness(
        json!({}),
        json!({"limits": [{"name": "u", "per": "user", "window_seconds": 2_678_400, "calls": 1}],
            "user": ["header:x-end-user", "body:user", "jwt:sub"]}),
    );
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({"user": "alice"})));
    answer_with(&mut h, &mut s, 200, json_head(), &usage(1, 1));
    assert_eq!(
        ask(&mut h, &[], &chat("gpt-4o", json!({"user": "alice"}))).status(),
        429
    );
    assert_eq!(
        ask(&mut h, &[], &chat("gpt-4o", json!({"user": "bob"}))).status(),
        200
    );
    // The header comes first in the list: it names the user.
    assert_eq!(
        ask(
            &mut h,
            &[("x-end-user", "alice")],
            &chat("gpt-4o", json!({"user": "carol"}))
        )
        .status(),
        429
    );
    // Another caller's alice is someone else.
    let body = chat("gpt-4o", json!({"user": "alice"}));
    let s = h.send(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-b")],
        body.as_bytes(),
    );
    assert_eq!(s.status(), 200);
    // A month later, alice may call again.
    h.now += 2_678_400_000;
    assert_eq!(
        ask(&mut h, &[], &chat("gpt-4o", json!({"user": "alice"}))).status(),
        200
    );
}

#[test]
fn an_unread_body_is_priced_by_the_model_its_answer_names() {
    let mut h = harness(json!({"max_body_bytes": 1024}), dollars(5.0));
    let big = chat("gpt-4o", json!({"pad": "x".repeat(4000)}));
    let mut s = ask(&mut h, &[], &big);
    // The answer names gpt-4o-2024-08-06: the table's gpt-4o prices it.
    let out = answer_with(&mut h, &mut s, 200, json_head(), &usage(1_000_000, 0));
    assert_eq!(spent(&out), 2_500_000);
    assert_eq!(
        h.metric(&out, "loopguard.budget_unpriced_total.policy.p"),
        0
    );
    // A request nothing names a model for (no body, an answer without
    // usage) is no LLM call: a call, no dollars, not unpriced.
    let mut s = h.send(
        "GET",
        "/v1/models",
        &[("authorization", "Bearer sk-a")],
        b"",
    );
    let out = answer_with(&mut h, &mut s, 200, json_head(), r#"{"data": []}"#);
    assert_eq!(spent(&out), 0);
    assert_eq!(
        h.metric(&out, "loopguard.budget_unpriced_total.policy.p"),
        0
    );
    // An answer with token counts but no model: unpriced, never free.
    let mut s = ask(&mut h, &[], &big);
    let body = json!({"usage": {"prompt_tokens": 1000, "completion_tokens": 10}}).to_string();
    let out = answer_with(&mut h, &mut s, 200, json_head(), &body);
    assert!(spent(&out) > 0);
    assert_eq!(
        h.metric(&out, "loopguard.budget_unpriced_total.policy.p"),
        1
    );
}

#[test]
fn a_reported_cost_of_nothing_for_tokens_is_no_report() {
    let mut h = harness(json!({}), dollars(5.0));
    // LiteLLM's 0.0 for a model it cannot price: the table decides.
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    let head = crate::response::ResponseHead {
        content_type: Some("application/json"),
        reported_cost: Some("0.0"),
    };
    let out = answer_with(&mut h, &mut s, 200, head, &usage(1_000_000, 0));
    assert_eq!(spent(&out), 2_500_000);
    // OpenRouter with the caller's own provider key: its fee and the
    // provider's bill.
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    let body = json!({"usage": {"prompt_tokens": 10, "completion_tokens": 1, "cost": 0.05,
        "cost_details": {"upstream_inference_cost": 1.0}}})
    .to_string();
    let out = answer_with(&mut h, &mut s, 200, json_head(), &body);
    assert_eq!(spent(&out), 1_050_000);
}

#[test]
fn a_request_the_provider_refused_generated_nothing() {
    let mut h = harness(json!({}), tokens_cap(1_000_000));
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({"max_tokens": 30_000})));
    let body = r#"{"error": {"code": "context_length_exceeded"}}"#;
    let out = answer_with(&mut h, &mut s, 400, json_head(), body);
    assert_eq!(spent(&out), 0);
    assert_eq!(
        h.metric(&out, "loopguard.budget_estimated_total.policy.p"),
        0
    );
    // Still a call.
    let mut h = harness(json!({}), calls_cap(1));
    let mut s = ask(&mut h, &[], &chat("gpt-4o", json!({})));
    answer_with(&mut h, &mut s, 404, json_head(), "{}");
    assert_eq!(ask(&mut h, &[], &chat("gpt-4o", json!({}))).status(), 429);
}

#[test]
fn an_embedding_is_charged_no_output_estimate() {
    let mut h = harness(json!({}), tokens_cap(1_000_000));
    let body = json!({"model": "text-embedding-3-small", "input": "hello"}).to_string();
    let mut s = h.send(
        "POST",
        "/v1/embeddings",
        &[("authorization", "Bearer sk-a")],
        body.as_bytes(),
    );
    let out = answer_with(&mut h, &mut s, 200, json_head(), "{}");
    assert_eq!(spent(&out), 0);
}

#[test]
fn mistral_and_azure_streams_are_not_asked_for_usage() {
    let mut h = Harness::new(json!({"hold_request_headers": true,
        "policies": [{"id": "p", "spec": {"selector": {}, "budget": tokens_cap(1000)}}]}));
    let body = chat("mistral-large-latest", json!({"stream": true}));
    let s = ask(&mut h, &[], &body);
    assert!(!s
        .effects
        .iter()
        .any(|e| matches!(e, Effect::ReplaceBody { .. })));
    let body = chat("gpt-4o", json!({"stream": true}));
    let s = h.send(
        "POST",
        "/openai/deployments/gpt4o/chat/completions?api-version=2024-06-01",
        &[("authorization", "Bearer sk-a")],
        body.as_bytes(),
    );
    assert!(!s
        .effects
        .iter()
        .any(|e| matches!(e, Effect::ReplaceBody { .. })));
}

#[test]
fn a_throttled_request_whose_client_left_after_it_went_is_charged() {
    let mut h = Harness::new(json!({"policies": [{"id": "p", "spec": {"selector": {},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 2,
            "action": "throttle", "throttle_step_ms": 100},
        "budget": tokens_cap(1_000_000)}}]}));
    let body = chat("gpt-4o", json!({"max_tokens": 700}));
    let mut first = ask(&mut h, &[], &body);
    answer_with(&mut h, &mut first, 200, json_head(), &usage(1, 1));
    let mut s = ask(&mut h, &[], &body);
    assert_eq!(s.step, Step::Pause, "throttled");
    h.now += 200;
    let resumed = h.tick();
    assert!(resumed.contains(&Effect::Resume(s.req.id)), "{resumed:?}");
    // Gone before the answer's headers: charged its output limit.
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(spent(&out), 700);
}
