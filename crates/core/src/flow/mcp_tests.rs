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
        .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
    let mut client = body.as_bytes().to_vec();
    if s.req.wants_response_body() {
        let mut more = Effects::new();
        h.engine
            .on_response_body(&mut s.req, body.as_bytes(), true, h.now, &mut more);
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

/// One call from the client address `from` with these headers (no
/// session) and, when it went on, the server's answer `text`: its step.
fn call_from(
    h: &mut Harness,
    from: &str,
    headers: &[(&str, &str)],
    id: u32,
    tool: &str,
    text: &str,
) -> Step {
    let mut f = headers
        .iter()
        .fold(crate::request::tests::FakeFacts::default(), |f, (k, v)| {
            f.with(k, v)
        });
    f.source = Some(format!("{from}:40000"));
    let body = call_body(id, tool, json!({"q": "x"}));
    let mut s = h.send_with("POST", "/mcp", &f, body.as_bytes());
    if s.step == Step::Continue {
        answer(h, &mut s, &result_body(id, text));
    }
    s.step
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
        call_from(
            h,
            from,
            &[("mcp-method", "tools/call")],
            id,
            "search",
            "same",
        )
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

#[test]
fn a_blocked_call_goes_to_the_server_again_after_recheck_seconds() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"], "recheck_seconds": 30}));
    for i in 0..2 {
        round(&mut h, "s", i, "status", "running");
    }
    h.now += 1_000;
    let (s, _, _) = round(&mut h, "s", 2, "status", "running");
    assert_eq!(s.step, Step::Pause, "blocked");
    // The agent keeps asking: still blocked while the last real result is
    // recent, however often it asks.
    for i in 3..6 {
        h.now += 5_000;
        assert_eq!(
            round(&mut h, "s", i, "status", "running").0.step,
            Step::Pause
        );
    }
    // 30 s after the last real result, one call goes through: the job is
    // done, a new result, progress.
    h.now += 15_000;
    let (s, _, body) = round(&mut h, "s", 6, "status", "done");
    assert_eq!(s.step, Step::Continue);
    assert_eq!(body["result"]["content"][0]["text"], "done");
    assert_eq!(
        round(&mut h, "s", 7, "status", "done").0.step,
        Step::Continue
    );
}

#[test]
fn without_a_session_agents_on_other_hosts_sharing_a_key_are_apart() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"], "same_result_min": 2}));
    let go = |h: &mut Harness, from: &str, id: u32| {
        let headers = [
            ("authorization", "Bearer shared-team-key"),
            ("mcp-method", "tools/call"),
        ];
        call_from(h, from, &headers, id, "list_projects", "3 projects")
    };
    // Four agents start up, each listing the projects once.
    for (i, host) in ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
        .iter()
        .enumerate()
    {
        assert_eq!(go(&mut h, host, i as u32), Step::Continue, "{host}");
    }
    // One of them looping is still its own loop.
    assert_eq!(go(&mut h, "10.0.0.1", 9), Step::Pause);
}

#[test]
fn durations_in_a_polled_result_are_progress_by_default() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"]}));
    for (i, elapsed) in ["35s", "65s", "95s", "125s", "155s"].iter().enumerate() {
        let (s, _, _) = round(
            &mut h,
            "s",
            i as u32,
            "status",
            &format!("running, elapsed {elapsed}"),
        );
        assert_eq!(s.step, Step::Continue, "{elapsed}");
    }
    // A timestamp alone is noise: the same status checked at other times
    // is the same result.
    for i in 10..12 {
        round(
            &mut h,
            "t",
            i,
            "status",
            &format!("running (checked 2026-11-26T10:00:{i}Z)"),
        );
    }
    let (s, _, _) = round(
        &mut h,
        "t",
        12,
        "status",
        "running (checked 2026-11-26T10:00:12Z)",
    );
    assert_eq!(s.step, Step::Pause);
}

#[test]
fn json_rpc_errors_count_whatever_their_status_and_structured_results_get_no_note() {
    let mut h = harness(json!({"enabled": true, "ladder": ["block"], "same_error_min": 2}));
    let err = |id: u32| {
        json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "quota exceeded"}})
            .to_string()
    };
    let mut s = send(&mut h, "s", &call_body(1, "search", json!({"q": "x"})));
    let mut out = h.answer(&mut s, 429);
    h.engine
        .on_response_content_type(&mut s.req, Some("application/json"), h.now, &mut out);
    h.engine
        .on_response_body(&mut s.req, err(1).as_bytes(), true, h.now, &mut out);
    let s = send(&mut h, "s", &call_body(2, "search", json!({"q": "x"})));
    assert_eq!(s.step, Step::Pause);
    assert!(s.json()["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("failed the same way"));
    // A result with structured content: its content alone cannot tell it is
    // the same again as it passes, so no note (the block still comes).
    let mut h = harness(json!({"enabled": true}));
    let structured = |id: u32| {
        json!({"jsonrpc": "2.0", "id": id, "result": {
        "content": [{"type": "text", "text": "{}"}], "structuredContent": {"state": "running"}}})
        .to_string()
    };
    for i in 0..3 {
        let mut s = send(&mut h, "s", &call_body(i, "job", json!({})));
        assert_eq!(s.step, Step::Continue);
        let (out, client) = answer(&mut h, &mut s, &structured(i));
        assert_eq!(client, structured(i).as_bytes(), "untouched");
        assert!(!out.contains(&Effect::RemoveResponseHeader("content-length")));
    }
    assert_eq!(
        send(&mut h, "s", &call_body(3, "job", json!({}))).step,
        Step::Pause
    );
}

/// A healthy agent session of 150 calls: paging, polling a job to its end,
/// reading many files, searching many queries, rerunning tests after each
/// edit (fewer failures every time), a file read again after it changed.
#[test]
fn a_healthy_session_of_150_calls_is_never_touched() {
    let mut h = harness(json!({"enabled": true}));
    let mut id = 0;
    let mut step = |h: &mut Harness, tool: &str, args: Value, result: String| {
        id += 1;
        let mut s = send(h, "healthy", &call_body(id, tool, args));
        assert_eq!(s.step, Step::Continue, "{tool} #{id}");
        let (out, client) = answer(h, &mut s, &result_body(id, &result));
        assert!(
            !out.iter()
                .any(|e| matches!(e, Effect::ReplaceResponseBody { .. })),
            "{tool} #{id} noted"
        );
        assert_eq!(client, result_body(id, &result).as_bytes());
    };
    for page in 0..30 {
        step(
            &mut h,
            "list_issues",
            json!({"page": page}),
            format!("issues {}..{}", page * 20, page * 20 + 19),
        );
    }
    for pct in (0..=100).step_by(5) {
        step(
            &mut h,
            "job_status",
            json!({"job": "build-7"}),
            format!("build-7: {pct}% done"),
        );
    }
    for f in 0..40 {
        step(
            &mut h,
            "read_file",
            json!({"path": format!("src/m{f}.rs")}),
            format!("// module {f}\nfn f{f}() {{}}"),
        );
    }
    for q in 0..35 {
        step(
            &mut h,
            "search",
            json!({"query": format!("symbol_{q}")}),
            format!("{} hits for symbol_{q}", q % 4),
        );
    }
    for failing in (0..12).rev() {
        step(
            &mut h,
            "edit_file",
            json!({"path": "src/lib.rs", "patch": format!("fix {failing}")}),
            "applied".to_string(),
        );
        step(
            &mut h,
            "run_tests",
            json!({}),
            format!("{failing} failed, {} passed", 40 - failing),
        );
    }
    step(
        &mut h,
        "read_file",
        json!({"path": "src/lib.rs"}),
        "v1".to_string(),
    );
    step(
        &mut h,
        "edit_file",
        json!({"path": "src/lib.rs", "patch": "x"}),
        "applied".to_string(),
    );
    step(
        &mut h,
        "read_file",
        json!({"path": "src/lib.rs"}),
        "v2".to_string(),
    );
    assert!(id >= 150, "{id} calls");
}
