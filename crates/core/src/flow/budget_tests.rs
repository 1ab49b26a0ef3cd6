//! Spend caps through the engine: keys per caller, session and
//! conversation, the check before a request goes upstream, the 429, the
//! warning, shadow mode, estimates, and the shared store's calls.

use super::tests::{events, Harness, Sent};
use super::*;
use crate::state::store::CallReply;
use serde_json::{json, Value};

const PRICES: &str = r#"{"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10}}"#;

fn chat(model: &str, first: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": first}]}).to_string()
}

fn usage_body(input: u64, output: u64) -> String {
    json!({"choices": [{"message": {"content": "ok"}}],
        "usage": {"prompt_tokens": input, "completion_tokens": output}})
    .to_string()
}

fn budgeted(budget: Value) -> Harness {
    Harness::new(json!({
        "prices": serde_json::from_str::<Value>(PRICES).unwrap(),
        "policies": [{"id": "p", "spec": {"selector": {}, "budget": budget}}]}))
}

fn ask(h: &mut Harness, key: &str, headers: &[(&str, &str)], body: &str) -> Sent {
    let auth = format!("Bearer {key}");
    let mut all = vec![("authorization", auth.as_str())];
    all.extend_from_slice(headers);
    h.send("POST", "/v1/chat/completions", &all, body.as_bytes())
}

/// The upstream answers `s` with `status` and a JSON body: the effects.
fn answer(h: &mut Harness, s: &mut Sent, status: u32, body: &str) -> Effects {
    let mut out = h.answer(s, status);
    h.engine
        .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
    if s.req.wants_response_body() {
        h.engine
            .on_response_body(&mut s.req, body.as_bytes(), true, h.now, &mut out);
    }
    h.engine.on_done(&mut s.req, &mut out);
    out
}

/// A counter's total over the effects, named or counted by id.
fn named(h: &Harness, effects: &[Effect], name: &str) -> i64 {
    h.metric(effects, name)
        + effects
            .iter()
            .filter_map(|e| match e {
                Effect::CountNamed(n, v) if n == name => Some(*v),
                _ => None,
            })
            .sum::<i64>()
}

/// What the effects added to every spend counter.
pub(super) fn spent_total(effects: &[Effect]) -> i64 {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::CountNamed(n, v) if n.starts_with("loopguard.budget_spend_total.") => Some(*v),
            _ => None,
        })
        .sum()
}

fn header<'a>(s: &'a Sent, name: &str) -> Option<&'a str> {
    s.reply()?
        .headers
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_call_after_the_cap_is_refused_until_the_window_slides() {
    let mut h = budgeted(json!({"limits": [
        {"name": "calls", "per": "caller", "window_seconds": 60, "calls": 3}]}));
    for i in 0..3 {
        let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", &format!("q{i}")));
        assert_eq!(s.status(), 200, "call {i}");
        answer(&mut h, &mut s, 200, &usage_body(10, 2));
        h.now += 1000;
    }
    let s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q3"));
    assert_eq!(s.status(), 429);
    assert_eq!(s.json()["error"]["code"], "budget_exceeded");
    assert_eq!(
        named(
            &h,
            &s.effects,
            "loopguard.budget_rejected_total.policy.p.budget.calls"
        ),
        1
    );
    // The first call's slice leaves 60 s after its own second.
    let retry: u64 = header(&s, "retry-after").unwrap().parse().unwrap();
    assert!((56..=60).contains(&retry), "{retry}");
    // Another caller has a budget of its own.
    assert_eq!(ask(&mut h, "sk-b", &[], &chat("gpt-4o", "q")).status(), 200);
    h.now += retry * 1000;
    assert_eq!(
        ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q4")).status(),
        200
    );
}

#[test]
fn a_provider_failure_is_not_a_call_and_a_refused_request_spends_nothing() {
    let mut h = budgeted(json!({"limits": [
        {"name": "calls", "per": "caller", "window_seconds": 60, "calls": 1}]}));
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
    let failed = answer(
        &mut h,
        &mut s,
        503,
        r#"{"error": {"message": "overloaded"}}"#,
    );
    // Nothing spent, nothing estimated.
    assert!(!failed.iter().any(|e| matches!(e, Effect::CountNamed(..))));
    assert_eq!(
        named(&h, &failed, "loopguard.budget_estimated_total.policy.p"),
        0
    );
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
    assert_eq!(s.status(), 200);
    answer(&mut h, &mut s, 200, &usage_body(10, 2));
    for _ in 0..3 {
        let mut refused = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
        assert_eq!(refused.status(), 429);
        let out = answer(&mut h, &mut refused, 429, "");
        assert_eq!(
            named(
                &h,
                &out,
                "loopguard.budget_spend_total.policy.p.budget.calls.key.other"
            ),
            0
        );
    }
}

#[test]
fn dollars_per_session_warn_before_the_cap_and_refuse_at_it() {
    // $0.001 a response: 100 input ($0.00025) + 75 output ($0.00075).
    let mut h = budgeted(json!({"limits": [
        {"name": "session", "per": "session", "window_seconds": 3600, "usd": 0.004}],
        "session": ["body:metadata.session_id", "header:x-session-id"], "warn_at": 0.7}));
    let mut warned = None;
    for i in 0..4 {
        let mut s = ask(
            &mut h,
            "sk-a",
            &[("x-session-id", "s-1")],
            &chat("gpt-4o", "q"),
        );
        assert_eq!(s.status(), 200, "call {i}");
        let headers = h.response(&mut s);
        if i == 3 {
            warned = headers
                .into_iter()
                .find(|(k, _)| *k == "x-loopguard-budget");
            assert_eq!(events(&s.effects, "budget.warning").len(), 1);
        }
        answer(&mut h, &mut s, 200, &usage_body(100, 75));
    }
    assert_eq!(
        warned.unwrap().1,
        "session; spent=0.003; cap=0.004; unit=usd; window=3600"
    );
    let s = ask(
        &mut h,
        "sk-a",
        &[("x-session-id", "s-1")],
        &chat("gpt-4o", "q"),
    );
    assert_eq!(s.status(), 429);
    // The spending leaves with its minute's slice: within the minute
    // before the hour is over.
    let retry: u64 = header(&s, "retry-after").unwrap().parse().unwrap();
    assert!((3540..=3600).contains(&retry), "{retry}");
    assert_eq!(
        s.json()["error"]["message"],
        format!("Budget \"session\" exceeded: spent $0.004 of $0.004 per session in the last 3600 seconds. Retry after {retry} seconds.")
    );
    let e = events(&s.effects, "budget.exceeded");
    assert_eq!(e[0]["budget"], "session");
    assert_eq!(e[0]["action"], "reject");
    // Another session of the same caller, and the body's session first.
    assert_eq!(
        ask(
            &mut h,
            "sk-a",
            &[("x-session-id", "s-2")],
            &chat("gpt-4o", "q")
        )
        .status(),
        200
    );
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "q"}],
        "metadata": {"session_id": "s-3"}})
    .to_string();
    assert_eq!(
        ask(&mut h, "sk-a", &[("x-session-id", "s-1")], &body).status(),
        200
    );
    // The same session id from another caller is another session.
    assert_eq!(
        ask(
            &mut h,
            "sk-b",
            &[("x-session-id", "s-1")],
            &chat("gpt-4o", "q")
        )
        .status(),
        200
    );
    // A request with no session id is not under the session cap.
    assert_eq!(ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q")).status(), 200);
}

#[test]
fn conversations_and_tokens_count_apart() {
    let mut h = budgeted(json!({"limits": [
        {"name": "task", "per": "conversation", "window_seconds": 600, "tokens": 1000, "tokens_of": "output"}]}));
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "task one"));
    let out = answer(&mut h, &mut s, 200, &usage_body(5000, 1000));
    assert_eq!(
        out.iter()
            .filter_map(|e| match e {
                Effect::CountNamed(n, v)
                    if n.starts_with("loopguard.budget_spend_total.policy.p.budget.task.key.") =>
                    Some(*v),
                _ => None,
            })
            .sum::<i64>(),
        1000
    );
    assert_eq!(
        ask(&mut h, "sk-a", &[], &chat("gpt-4o", "task one")).status(),
        429
    );
    assert_eq!(
        ask(&mut h, "sk-a", &[], &chat("gpt-4o", "task two")).status(),
        200
    );
}

#[test]
fn shadow_and_warn_let_the_request_through() {
    let limits = json!([{"name": "calls", "per": "caller", "window_seconds": 60, "calls": 1}]);
    let mut shadow = Harness::new(json!({"policies": [{"id": "p", "spec": {
        "mode": "shadow", "selector": {}, "budget": {"limits": limits}}}]}));
    let mut warn = budgeted(json!({"limits": limits, "action": "warn"}));
    for h in [&mut shadow, &mut warn] {
        let mut s = ask(h, "sk-a", &[], &chat("gpt-4o", "q"));
        answer(h, &mut s, 200, &usage_body(1, 1));
        let mut s = ask(h, "sk-a", &[], &chat("gpt-4o", "q"));
        assert_eq!(s.status(), 200);
        let e = events(&s.effects, "budget.exceeded");
        assert_eq!(e.len(), 1);
        let headers = h.response(&mut s);
        let carried = headers.iter().any(|(k, _)| *k == "x-loopguard-budget");
        if e[0]["action"] == "shadow" {
            assert!(!carried);
            assert_eq!(
                named(
                    h,
                    &s.effects,
                    "loopguard.budget_shadow_total.policy.p.budget.calls"
                ),
                1
            );
            assert!(s
                .logs(Level::Info)
                .iter()
                .any(|l| l.starts_with("shadow: would_reject budget")));
        } else {
            assert_eq!(e[0]["action"], "warn");
            assert!(carried);
            assert_eq!(
                named(
                    h,
                    &s.effects,
                    "loopguard.budget_warned_total.policy.p.budget.calls"
                ),
                1
            );
        }
    }
}

#[test]
fn a_stream_cut_off_or_without_usage_is_estimated() {
    let mut h = budgeted(json!({"limits": [
        {"name": "tokens", "per": "caller", "window_seconds": 60, "tokens": 1000000}]}));
    let body = chat("gpt-4o", &"x".repeat(400));
    let mut s = ask(&mut h, "sk-a", &[], &body);
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("text/event-stream"), h.now, &mut out);
    let events_chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n".repeat(30);
    h.engine
        .on_response_body(&mut s.req, events_chunk.as_bytes(), false, h.now, &mut out);
    // The client leaves mid-stream.
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(
        named(&h, &out, "loopguard.budget_estimated_total.policy.p"),
        1
    );
    let spent = spent_total(&out);
    // Input: the body's bytes over four; output: one token an event, but
    // at least what the call may have generated (no max_tokens: the
    // default estimate).
    assert_eq!(spent, body.len() as i64 / 4 + 4096);
    // A stream read to its closing event is whole, even when the client
    // hangs up before the body ends (an SDK stops reading at [DONE]).
    let mut s = ask(&mut h, "sk-a", &[], &body);
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("text/event-stream"), h.now, &mut out);
    let stream = format!(
        "{events_chunk}data: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 12}})
    );
    h.engine
        .on_response_body(&mut s.req, stream.as_bytes(), false, h.now, &mut out);
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(
        named(&h, &out, "loopguard.budget_estimated_total.policy.p"),
        0
    );
    let spent = spent_total(&out);
    assert_eq!(spent, 102);
    // A whole response with its usage is not an estimate.
    let mut s = ask(&mut h, "sk-a", &[], &body);
    let out = answer(&mut h, &mut s, 200, &usage_body(7, 3));
    assert_eq!(
        named(&h, &out, "loopguard.budget_estimated_total.policy.p"),
        0
    );
}

#[test]
fn a_budget_reached_stops_the_request_before_loop_detection_counts_it() {
    let mut h = Harness::new(json!({"policies": [{"id": "p", "spec": {"selector": {},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 5},
        "budget": {"limits": [{"name": "calls", "per": "caller", "window_seconds": 60, "calls": 1}]}}}]}));
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
    answer(&mut h, &mut s, 200, &usage_body(1, 1));
    for _ in 0..6 {
        let s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
        assert_eq!(s.json()["error"]["code"], "budget_exceeded");
        assert!(events(&s.effects, "loop.detected").is_empty());
    }
}

// --- the shared store -------------------------------------------------------------

fn redis(on_error: &str) -> Harness {
    Harness::new(json!({
        "store": {"type": "redis_webdis", "cluster": "webdis", "on_error": on_error},
        "policies": [{"id": "p", "spec": {"selector": {}, "budget": {"limits": [
            {"name": "calls", "per": "caller", "window_seconds": 60, "calls": 2}]}}}]}))
}

fn webdis(values: &[u64]) -> CallReply {
    let list: Vec<String> = values.iter().map(u64::to_string).collect();
    CallReply {
        status: Some("200".into()),
        body: format!(r#"{{"FCALL":[{}]}}"#, list.join(",")).into_bytes(),
    }
}

#[test]
fn the_shared_store_checks_every_key_in_one_call_and_holds_the_response_for_its_add() {
    let mut h = redis("local");
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
    assert_eq!(s.step, Step::Pause);
    let call = s.call().expect("a budget check").clone();
    assert!(String::from_utf8_lossy(&call.body).starts_with("FCALL/loopguard_budget/1/lg:test:{b"));
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(5), h.now, &mut s.effects);
    assert_eq!(h.reply(&mut s, 5, webdis(&[1, 0])), Step::Continue);
    // The response's end waits until the store has its spending: the
    // client's next request, on any replica, finds it.
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
    let step = h.engine.on_response_body(
        &mut s.req,
        usage_body(1, 1).as_bytes(),
        true,
        h.now,
        &mut out,
    );
    assert_eq!(step, Step::Pause);
    assert!(s.req.response_held());
    // More of the body (or Envoy handing the buffered body over again)
    // stays held.
    assert!(s.req.wants_response_body());
    assert_eq!(
        h.engine
            .on_response_body(&mut s.req, b"", true, h.now, &mut out),
        Step::Pause
    );
    let add = out
        .iter()
        .find_map(|e| match e {
            Effect::SendStoreCall(c) => Some(String::from_utf8_lossy(&c.body).to_string()),
            _ => None,
        })
        .expect("an add");
    assert!(add.starts_with("FCALL/loopguard_budget/1/"), "{add}");
    assert_eq!(
        h.engine.on_call_sent(&mut s.req, Ok(9), h.now, &mut out),
        Step::Pause
    );
    assert_eq!(h.reply(&mut s, 9, webdis(&[1, 0])), Step::Continue);
    assert!(!s.req.response_held());
    assert_eq!(
        h.metric(&s.effects, "loopguard.store_calls_total.result.ok"),
        1
    );
    // A stream: the chunk with its closing event waits (the client stops
    // reading there), not only the end of the body.
    let mut s = ask(&mut h, "sk-b", &[], &chat("gpt-4o", "q"));
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(10), h.now, &mut s.effects);
    h.reply(&mut s, 10, webdis(&[0, 0]));
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("text/event-stream"), h.now, &mut out);
    let first = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    assert_eq!(
        h.engine
            .on_response_body(&mut s.req, first.as_bytes(), false, h.now, &mut out),
        Step::Continue
    );
    let last = format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
    );
    assert_eq!(
        h.engine
            .on_response_body(&mut s.req, last.as_bytes(), false, h.now, &mut out),
        Step::Pause
    );
    assert!(s.req.response_held());
    // At the cap: refused with the store's time.
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(6), h.now, &mut s.effects);
    assert_eq!(h.reply(&mut s, 6, webdis(&[2, 30_000])), Step::Pause);
    assert_eq!(s.status(), 429);
    assert_eq!(header(&s, "retry-after"), Some("30"));
}

#[test]
fn a_held_response_goes_on_when_the_store_fails_and_a_cut_one_adds_from_the_tick() {
    let mut h = redis("local");
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(1), h.now, &mut s.effects);
    h.reply(&mut s, 1, webdis(&[0, 0]));
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
    let body = usage_body(1, 1);
    h.engine
        .on_response_body(&mut s.req, body.as_bytes(), true, h.now, &mut out);
    // The add cannot be sent: the response goes on at once, counted.
    assert_eq!(
        h.engine
            .on_call_sent(&mut s.req, Err("no cluster".into()), h.now, &mut out),
        Step::Continue
    );
    assert_eq!(
        h.metric(&out, "loopguard.budget_unrecorded_total.policy.p"),
        1
    );
    // A stream whose client left: its add goes from the root context.
    let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(2), h.now, &mut s.effects);
    h.reply(&mut s, 2, webdis(&[1, 0]));
    let mut out = h.answer(&mut s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("text/event-stream"), h.now, &mut out);
    h.engine
        .on_response_body(&mut s.req, b"data: {}\n\n", false, h.now, &mut out);
    h.engine.on_done(&mut s.req, &mut out);
    assert!(out.contains(&Effect::ArmTick));
    let tick = h.tick();
    assert!(tick
        .iter()
        .any(|e| matches!(e, Effect::SendFromRoot { call: c, .. }
        if String::from_utf8_lossy(&c.body).starts_with("FCALL/loopguard_budget/1/"))));
}

#[test]
fn a_failed_shared_store_checks_locally_or_lets_through() {
    for (on_error, expect) in [("local", 429), ("allow", 200)] {
        let mut h = redis(on_error);
        // Two calls this Envoy saw (the store answered them).
        for token in [1, 2] {
            let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
            s.step = h
                .engine
                .on_call_sent(&mut s.req, Ok(token), h.now, &mut s.effects);
            h.reply(&mut s, token, webdis(&[0, 0]));
            answer(&mut h, &mut s, 200, &usage_body(1, 1));
        }
        let mut s = ask(&mut h, "sk-a", &[], &chat("gpt-4o", "q"));
        s.step = h
            .engine
            .on_call_sent(&mut s.req, Ok(3), h.now, &mut s.effects);
        let down = CallReply {
            status: None,
            body: Vec::new(),
        };
        let step = h.reply(&mut s, 3, down);
        assert_eq!(s.status(), expect, "{on_error}");
        assert_eq!(
            step,
            if expect == 429 {
                Step::Pause
            } else {
                Step::Continue
            }
        );
    }
}
