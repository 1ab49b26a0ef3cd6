//! MCP calls through the flow: judged against the history their results
//! built, the ladder (a note in the real result, a blocked result, an
//! error), progress left alone, odd traffic passed and counted, shadow
//! mode.

use super::tests::{Harness, Sent};
use super::*;
use serde_json::{json, Value};

fn harness(mcp: Value) -> Harness {
    Harness::policy(json!({"selector": {"pathPrefix": "/mcp"}, "mcp": mcp}))
}

fn call_body(id: u32, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": args, "_meta": {"progressToken": id}}})
    .to_string()
}

fn send(h: &mut Harness, session: &str, body: &str) -> Sent {
    h.send(
        "POST",
        "/mcp",
        &[("mcp-session-id", session), ("authorization", "Bearer k")],
        body.as_bytes(),
    )
}

fn result_body(id: u32, text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": {
        "content": [{"type": "text", "text": text}], "isError": false}})
    .to_string()
}

/// The server answers `body` (JSON): the effects, and the body the client
/// gets.
fn answer(h: &mut Harness, s: &mut Sent, body: &str) -> (Effects, Vec<u8>) {
    let mut out = h.answer(s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some("application/json"), &mut out);
    let mut client = body.as_bytes().to_vec();
    if s.req.wants_response_body() {
        let mut more = Effects::new();
        h.engine
            .on_response_body(&mut s.req, body.as_bytes(), true, &mut more);
        for e in &more {
            if let Effect::ReplaceResponseBody { old_len, body } = e {
                assert_eq!(*old_len, client.len());
                client = body.clone();
            }
        }
        out.extend(more);
    }
    (out, client)
}

fn named(effects: &[Effect], name: &str) -> i64 {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::CountNamed(n, k) if n == name => Some(*k),
            _ => None,
        })
        .sum()
}

/// One call and, when it went on, the server's answer `text`.
fn round(
    h: &mut Harness,
    session: &str,
    id: u32,
    tool: &str,
    text: &str,
) -> (Sent, Effects, Value) {
    let mut s = send(h, session, &call_body(id, tool, json!({"q": "x"})));
    if s.step == Step::Pause {
        let body: Value = s.json();
        return (s, Effects::new(), body);
    }
    let (out, client) = answer(h, &mut s, &result_body(id, text));
    let body = serde_json::from_slice(&client).unwrap();
    (s, out, body)
}

#[test]
fn the_same_call_and_result_is_noted_then_blocked() {
    let mut h = harness(json!({"enabled": true}));
    let (_, _, first) = round(&mut h, "s1", 1, "search", "3 results");
    assert_eq!(first["result"]["content"].as_array().unwrap().len(), 1);
    round(&mut h, "s1", 2, "search", "3 results");
    // The third: the real result, with a note.
    let (s, out, third) = round(&mut h, "s1", 3, "search", "3 results");
    assert_eq!(s.step, Step::Continue);
    let content = third["result"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 2, "{third}");
    let note = content[1]["text"].as_str().unwrap();
    assert!(
        note.contains("3rd call in a row of the tool `search`"),
        "{note}"
    );
    assert!(out.contains(&Effect::RemoveResponseHeader("content-length")));
    assert_eq!(
        named(
            &out,
            "loopguard.mcp_loops_total.policy.p.tier.identical.step.note"
        ),
        1
    );
    // The fourth never reaches the server.
    let (s, _, fourth) = round(&mut h, "s1", 4, "search", "3 results");
    assert_eq!((s.step, s.status()), (Step::Pause, 200));
    assert_eq!(fourth["id"], 4);
    assert_eq!(fourth["result"]["isError"], true);
    assert_eq!(fourth["result"]["resultType"], "complete");
    assert!(fourth["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("4th call"));
    assert_eq!(
        named(
            &s.effects,
            "loopguard.mcp_loops_total.policy.p.tier.identical.step.block"
        ),
        1
    );
    let events: Vec<&str> = s.logs(Level::Info);
    assert!(
        events
            .iter()
            .any(|l| l.contains("\"event\":\"loop.mcp.detected\"")),
        "{events:?}"
    );
    // Another session of the same caller is its own history.
    let (s, _, _) = round(&mut h, "s2", 5, "search", "3 results");
    assert_eq!(s.step, Step::Continue);
    // The session goes on: another call passes.
    let (s, _, other) = round(&mut h, "s1", 6, "read", "file");
    assert_eq!(s.step, Step::Continue);
    assert_eq!(other["result"]["content"][0]["text"], "file");
}

#[test]
fn a_result_that_changes_is_never_touched() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"]}));
    for i in 0..10 {
        let (s, out, body) = round(&mut h, "s", i, "poll", &format!("progress {}%", i * 10));
        assert_eq!(s.step, Step::Continue);
        assert_eq!(body["result"]["content"].as_array().unwrap().len(), 1);
        assert!(!out
            .iter()
            .any(|e| matches!(e, Effect::ReplaceResponseBody { .. })));
    }
}

#[test]
fn other_methods_and_verbs_pass_untouched() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"], "same_result_min": 2}));
    for _ in 0..4 {
        round(&mut h, "s", 1, "search", "same");
    }
    for body in [
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}).to_string(),
        json!({"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": {}}).to_string(),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
    ] {
        let s = send(&mut h, "s", &body);
        assert_eq!(s.step, Step::Continue);
        assert!(s.reply().is_none());
        assert!(!s.req.wants_content_type());
    }
    for verb in ["GET", "DELETE"] {
        let s = h.send(verb, "/mcp", &[("mcp-session-id", "s")], b"");
        assert_eq!(s.step, Step::Continue);
        assert!(s.reply().is_none());
    }
}

#[test]
fn odd_bodies_pass_and_are_counted() {
    let mut h = harness(json!({"enabled": true}));
    for (body, reason) in [
        (
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\"}]".to_string(),
            "batch",
        ),
        ("{not json".to_string(), "malformed"),
    ] {
        let s = send(&mut h, "s", &body);
        assert_eq!(s.step, Step::Continue);
        let name = format!("loopguard.mcp_unjudged_total.policy.p.reason.{reason}");
        assert_eq!(named(&s.effects, &name), 1, "{body}");
    }
    let s = h.send(
        "POST",
        "/mcp",
        &[("mcp-method", "tools/list")],
        call_body(1, "search", json!({})).as_bytes(),
    );
    assert_eq!(
        named(
            &s.effects,
            "loopguard.mcp_unjudged_total.policy.p.reason.headers_disagree"
        ),
        1
    );
    // A result that cannot be read is recorded as such: never a repeat.
    let mut h = harness(json!({"enabled": true, "ladder": ["block"], "same_result_min": 2}));
    for i in 0..4 {
        let mut s = send(&mut h, "s", &call_body(i, "search", json!({"q": "x"})));
        assert_eq!(s.step, Step::Continue);
        let (out, _) = answer(&mut h, &mut s, "<html>oops</html>");
        assert_eq!(
            named(
                &out,
                "loopguard.mcp_unjudged_total.policy.p.reason.result_unreadable"
            ),
            1
        );
    }
}

#[test]
fn failures_cycles_errors_and_exempt_tools() {
    let mut h = harness(
        json!({"enabled": true, "ladder": ["block", "error"], "same_error_min": 2,
        "error_code": -31999, "exempt_tools": ["ping"]}),
    );
    let fail = |id| {
        json!({"jsonrpc": "2.0", "id": id, "result": {
        "content": [{"type": "text", "text": "permission denied"}], "isError": true}})
        .to_string()
    };
    let mut s = send(&mut h, "s", &call_body(1, "write", json!({"q": "x"})));
    answer(&mut h, &mut s, &fail(1));
    // An exempt call in between neither counts nor breaks the run.
    let ping = send(&mut h, "s", &call_body(2, "ping", json!({})));
    assert_eq!(
        named(&ping.effects, "loopguard.mcp_exempt_total.policy.p"),
        1
    );
    let s = send(&mut h, "s", &call_body(3, "write", json!({"q": "x"})));
    assert_eq!(s.status(), 200);
    assert!(s.json()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("failed the same way"));
    let s = send(&mut h, "s", &call_body(4, "write", json!({"q": "x"})));
    assert_eq!(s.json()["error"]["code"], -31999);
    // A cycle of two calls, each with the same result every round.
    let mut h = harness(json!({"enabled": true, "ladder": ["block"]}));
    let mut last = None;
    for i in 0..6 {
        let tool = if i % 2 == 0 { "search" } else { "read" };
        let (s, _, _) = round(&mut h, "c", i, tool, tool);
        last = Some(s);
    }
    let last = last.unwrap();
    assert_eq!(last.status(), 200);
    assert!(last.json()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("same 2 calls"));
}

#[test]
fn shadow_mode_counts_and_changes_nothing() {
    let mut h = Harness::policy(json!({"mode": "shadow", "selector": {},
        "mcp": {"enabled": true, "ladder": ["note", "block"]}}));
    for i in 0..6 {
        let (s, out, body) = round(&mut h, "s", i, "search", "same");
        assert_eq!(s.step, Step::Continue);
        assert_eq!(body["result"]["content"].as_array().unwrap().len(), 1);
        assert!(!out.contains(&Effect::RemoveResponseHeader("content-length")));
        if i == 3 {
            assert_eq!(
                named(
                    &s.effects,
                    "loopguard.mcp_shadow_total.policy.p.tier.identical.step.block"
                ),
                1
            );
        }
    }
}

#[test]
fn a_stateless_caller_is_one_history_by_its_limit_keys() {
    let mut h = Harness::policy(json!({"selector": {}, "limit_keys": ["header:x-agent"],
        "mcp": {"enabled": true, "ladder": ["block"]}}));
    let go = |h: &mut Harness, agent: &str, id| {
        let mut s = h.send(
            "POST",
            "/mcp",
            &[
                ("x-agent", agent),
                ("mcp-method", "tools/call"),
                ("mcp-name", "search"),
            ],
            call_body(id, "search", json!({"q": "x"})).as_bytes(),
        );
        if s.step == Step::Continue {
            answer(h, &mut s, &result_body(id, "same"));
        }
        s
    };
    for i in 0..2 {
        assert_eq!(go(&mut h, "a", i).step, Step::Continue);
    }
    assert_eq!(go(&mut h, "b", 7).step, Step::Continue);
    assert_eq!(go(&mut h, "a", 3).step, Step::Pause);
}

#[test]
fn callers_known_by_nothing_are_told_apart_by_their_address() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"], "same_result_min": 2}));
    let go = |h: &mut Harness, from: &str, id: u32| {
        let mut req = Request::new(id);
        let mut out = Effects::new();
        let mut f = crate::request::tests::FakeFacts::default().with("mcp-method", "tools/call");
        f.source = Some(format!("{from}:40000"));
        let head = crate::request::RequestHead {
            method: "POST",
            path: "/mcp",
            authority: "tools",
        };
        let body = call_body(id, "search", json!({"q": "x"}));
        h.engine
            .on_headers(&mut req, &head, &f, false, h.now, &mut out);
        let step = h.engine.on_body(
            &mut req,
            body.len(),
            true,
            Some(body.as_bytes()),
            h.now,
            &mut out,
        );
        let mut s = Sent {
            req,
            effects: out,
            step,
        };
        if step == Step::Continue {
            answer(h, &mut s, &result_body(id, "same"));
        }
        step
    };
    assert_eq!(go(&mut h, "10.0.0.1", 1), Step::Continue);
    assert_eq!(go(&mut h, "10.0.0.2", 2), Step::Continue);
    assert_eq!(go(&mut h, "10.0.0.1", 3), Step::Pause);
}

#[test]
fn a_call_whose_result_never_came_back_breaks_the_run() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"], "same_result_min": 3}));
    round(&mut h, "s", 1, "search", "same");
    // The second goes on; its client leaves before the result.
    let mut s = send(&mut h, "s", &call_body(2, "search", json!({"q": "x"})));
    assert_eq!(s.step, Step::Continue);
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert_eq!(
        named(
            &out,
            "loopguard.mcp_unjudged_total.policy.p.reason.result_unreadable"
        ),
        1
    );
    // So the next is the first of a new run, not the third of the old.
    let (s, _, _) = round(&mut h, "s", 3, "search", "same");
    assert_eq!(s.step, Step::Continue);
    round(&mut h, "s", 4, "search", "same");
    let (s, _, _) = round(&mut h, "s", 5, "search", "same");
    assert_eq!(s.step, Step::Pause);
    // A finished exchange's end adds nothing more.
    let (mut s, _, _) = round(&mut h, "s", 6, "read", "file");
    let mut out = Effects::new();
    h.engine.on_done(&mut s.req, &mut out);
    assert!(out.iter().all(|e| !matches!(e, Effect::CountNamed(..))));
}
