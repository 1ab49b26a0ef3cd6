//! `loopguard replay` on recorded MCP sessions: results fed through the
//! response path build the histories, so the verdicts are Envoy's (the 3rd
//! identical call noted in its real result, the 4th blocked, a polling call
//! never touched), from JSON Lines and HAR, SSE and JSON results, and from
//! recordings made in front of loopguard.

use super::tests::{replay, Dir};
use super::*;
use serde_json::json;

/// The shipped example's policy: a note on the 3rd identical call with the
/// same result, then block.
const MCP: &str = r#"{"hold_request_headers": true, "policies": [{"id": "mcp-tools", "spec": {
  "selector": {"pathPrefix": "/mcp"},
  "mcp": {"enabled": true, "same_result_min": 3, "same_error_min": 3, "cycle_min": 3,
          "ladder": ["note", "block"], "key": "session", "window_seconds": 600}}}]}"#;

const START: u64 = 1_795_000_000_000;

/// One exchange of a recorded session.
struct Exchange {
    at: u64,
    headers: Vec<(&'static str, String)>,
    body: String,
    /// Status, content type and body; `None`: no response recorded.
    response: Option<(u16, &'static str, String)>,
    /// Response headers (HAR).
    response_headers: Vec<(&'static str, String)>,
}

fn call_body(id: u64, tool: &str, args: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": tool, "arguments": args, "_meta": {"progressToken": id}}})
    .to_string()
}

fn result(id: u64, text: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": {
        "content": [{"type": "text", "text": text}], "isError": false}})
    .to_string()
}

/// Polls run in a session of their own (a call of another tool in between
/// would end a run of the same call in one session).
fn session_of(body: &str) -> &'static str {
    if body.contains("\"poll\"") {
        "a1b2c3d4e5f60718293a4b5c6d7e8f90"
    } else {
        "6b51c3030c384fd3aa87fb6bc9b6ae68"
    }
}

fn sse(json: &str) -> String {
    format!("event: message\ndata: {json}\n\n")
}

/// Legacy sessions (`Mcp-Session-Id`): one calls `search` four times with
/// the same result, with a `tools/list`, a notification and a batch; the
/// other, at the same time, `poll` six times with a result that moves; and
/// a stateless 2026-07-28 caller (mirrored headers, JSON results) repeats
/// another call four times. `sse_results`: the legacy sessions' results as
/// event streams (else JSON).
fn session(sse_results: bool) -> Vec<Exchange> {
    let mut out = Vec::new();
    let mut at = START;
    let legacy = |body: String, response: Option<String>, at: u64| Exchange {
        at,
        headers: vec![
            ("mcp-session-id", session_of(&body).to_string()),
            ("mcp-protocol-version", "2025-11-25".to_string()),
            ("content-type", "application/json".to_string()),
        ],
        body,
        response: response.map(|r| {
            if sse_results {
                (200, "text/event-stream", sse(&r))
            } else {
                (200, "application/json", r)
            }
        }),
        response_headers: Vec::new(),
    };
    let mut id = 0;
    let mut next = |at: &mut u64| {
        *at += 700;
        id += 1;
        id
    };
    let i = next(&mut at);
    out.push(legacy(
        json!({"jsonrpc": "2.0", "id": i, "method": "tools/list"}).to_string(),
        Some(json!({"jsonrpc": "2.0", "id": i, "result": {"tools": []}}).to_string()),
        at,
    ));
    for k in 0..6 {
        let i = next(&mut at);
        out.push(legacy(
            call_body(i, "poll", json!({"job": "j1"})),
            Some(result(
                i,
                &format!("job j1: {}% done (poll #{})", (k + 1) * 10, k + 1),
            )),
            at,
        ));
        if k < 4 {
            let i = next(&mut at);
            out.push(legacy(
                call_body(i, "search", json!({"query": "loopguard"})),
                Some(result(i, "3 results for 'loopguard': doc-1, doc-2, doc-3")),
                at,
            ));
        }
    }
    next(&mut at);
    out.push(legacy(
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}).to_string(),
        None,
        at,
    ));
    next(&mut at);
    out.push(legacy(
        json!([{"jsonrpc": "2.0", "id": 90, "method": "tools/call", "params": {"name": "search"}}])
            .to_string(),
        Some(json!([]).to_string()),
        at,
    ));
    for _ in 0..4 {
        let i = next(&mut at);
        out.push(Exchange {
            at,
            headers: vec![
                ("mcp-protocol-version", "2026-07-28".to_string()),
                ("mcp-method", "tools/call".to_string()),
                ("mcp-name", "weather".to_string()),
                ("content-type", "application/json".to_string()),
            ],
            body: call_body(i, "weather", json!({"city": "Paris"})),
            response: Some((200, "application/json", result(i, "Paris: 21 C, cloudy"))),
            response_headers: Vec::new(),
        });
    }
    out
}

impl Exchange {
    fn jsonl(&self) -> String {
        let mut line = json!({"timestamp": self.at, "method": "POST", "path": "/mcp",
            "headers": self.headers.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "body": self.body});
        if let Some((status, ct, body)) = &self.response {
            line["response"] = json!({"status": status, "content_type": ct, "body": body});
        }
        line.to_string()
    }

    fn har(&self) -> Value {
        let headers: Vec<Value> = self
            .headers
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        let response = match &self.response {
            None => json!({"status": 0, "content": {}}),
            Some((status, ct, body)) => {
                let mut h: Vec<Value> = vec![json!({"name": "Content-Type", "value": ct})];
                h.extend(
                    self.response_headers
                        .iter()
                        .map(|(k, v)| json!({"name": k, "value": v})),
                );
                json!({"status": status, "headers": h,
                       "content": {"mimeType": ct, "size": body.len(), "text": body}})
            }
        };
        json!({"startedDateTime": loopguard_core::act::events::rfc3339(self.at),
               "request": {"method": "POST", "url": "http://gateway/mcp", "headers": headers,
                           "postData": {"mimeType": "application/json", "text": self.body}},
               "response": response})
    }
}

fn jsonl(session: &[Exchange]) -> String {
    session.iter().map(|e| e.jsonl() + "\n").collect()
}

fn har(session: &[Exchange]) -> String {
    json!({"log": {"version": "1.2", "creator": {"name": "t", "version": "1"},
                   "entries": session.iter().map(Exchange::har).collect::<Vec<_>>()}})
    .to_string()
}

/// Replay `traffic` through `config`: the JSON report and the verdicts.
fn run(d: &Dir, config: &str, name: &str, traffic: &str, extra: &[&str]) -> (Value, Vec<Value>) {
    let cfg = d.write(&format!("{name}.cfg.json"), config);
    let t = d.write(name, traffic);
    let verdicts = d.0.join(format!("{name}.verdicts")).display().to_string();
    let mut args = vec!["--config", &cfg, "--json", "--verdicts", &verdicts];
    args.extend_from_slice(extra);
    args.push(&t);
    let (_, out) = replay(&args).unwrap();
    let v = std::fs::read_to_string(&verdicts)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (serde_json::from_str(&out).unwrap(), v)
}

/// Each request's action, with the tool of a `tools/call`.
fn actions(verdicts: &[Value], session: &[Exchange]) -> Vec<String> {
    verdicts
        .iter()
        .zip(session)
        .map(|(v, e)| {
            let b: Value = serde_json::from_str(&e.body).unwrap_or(Value::Null);
            let tool = b["params"]["name"].as_str().unwrap_or("-");
            format!("{tool} {}", v["action"].as_str().unwrap())
        })
        .collect()
}

/// What Envoy does to the session (the flow's own tests and
/// tests/e2e/test_replay_mcp.py hold the filter to it): the 3rd search
/// noted, the 4th blocked; polls, the list, the notification allowed or
/// passed; the batch passed unjudged.
const EXPECTED: [&str; 17] = [
    "- pass",
    "poll allow",
    "search allow",
    "poll allow",
    "search allow",
    "poll allow",
    "search note",
    "poll allow",
    "search block",
    "poll allow",
    "poll allow",
    "- pass",
    "- pass",
    "weather allow",
    "weather allow",
    "weather note",
    "weather block",
];

fn expected() -> Vec<String> {
    EXPECTED.iter().map(|e| e.to_string()).collect()
}

fn check_session(report: &Value, verdicts: &[Value], s: &[Exchange]) {
    assert_eq!(actions(verdicts, s), expected(), "{verdicts:#?}");
    // The note: the server's result went on, with a note inserted.
    let noted = &verdicts[6];
    assert_eq!(noted["status"], Value::Null);
    assert_eq!(
        noted["mcp_loop"],
        "tier=identical; tool=search; count=3; step=note"
    );
    assert_eq!(noted["mcp"]["note_added"], true);
    assert_eq!(noted["decision"]["action"], "note");
    // The block: loopguard answered (200, a tool result with isError).
    let blocked = &verdicts[8];
    assert_eq!(blocked["status"], 200);
    assert_eq!(
        (
            blocked["mcp"]["step"].as_str(),
            blocked["mcp"]["tier"].as_str(),
            blocked["mcp"]["tool"].as_str(),
            blocked["mcp"]["count"].as_u64()
        ),
        (Some("block"), Some("identical"), Some("search"), Some(4))
    );
    assert_eq!(verdicts[12]["mcp"]["unjudged"], "batch");
    // The polls: judged, never touched.
    for v in verdicts.iter().filter(|v| v["mcp"]["judged"] == true) {
        assert_eq!(v["mcp"]["result_missing"], Value::Null, "{v}");
    }
    let p = &report["runs"][0]["policies"][0];
    assert_eq!(p["requests"], 17);
    assert_eq!(p["loops_found"], 2);
    assert_eq!(p["requests_touched"], 4);
    assert_eq!(
        p["actions"],
        json!({"pass": 3, "allow": 10, "note": 2, "block": 2})
    );
    let m = &p["mcp"];
    assert_eq!(m["calls_judged"], 14);
    assert_eq!(m["notes_added"], 2);
    assert_eq!(m["unjudged"], json!({"batch": 1}));
    assert_eq!(
        m["loops_by_tool"],
        json!({"search": {"note": 1, "block": 1}, "weather": {"note": 1, "block": 1}})
    );
    let loops = p["loops"].as_array().unwrap();
    assert_eq!(loops.len(), 2);
    assert_eq!(loops[0]["tool"], "search");
    assert_eq!(loops[0]["kind"], "mcp (identical)");
    assert_eq!(loops[0]["turns"], 2);
    assert!(
        loops[0]["caller"]
            .as_str()
            .unwrap()
            .contains("mcp session #"),
        "{}",
        loops[0]
    );
    assert_eq!(loops[1]["tool"], "weather");
    assert!(!loops[1]["caller"].as_str().unwrap().contains("mcp session"));
}

#[test]
fn a_recorded_session_is_noted_then_blocked_and_polling_never_is() {
    let d = Dir::new("mcp-jsonl");
    for sse_results in [true, false] {
        let s = session(sse_results);
        let (report, verdicts) = run(&d, MCP, "s.jsonl", &jsonl(&s), &[]);
        check_session(&report, &verdicts, &s);
        assert!(
            !report["notes"].to_string().contains("MCP"),
            "{}",
            report["notes"]
        );
    }
    // The text report and the page say the same, with MCP's actions.
    let s = session(true);
    let cfg = d.write("c.json", MCP);
    let t = d.write("t.jsonl", &jsonl(&s));
    let page = d.0.join("r.html").display().to_string();
    let (_, text) = replay(&["--config", &cfg, "--html", &page, &t]).unwrap();
    assert!(
        text.contains("actions: block 2, note 2, allow 10"),
        "{text}"
    );
    assert!(
        text.contains("    mcp: 14 tools/call judged, 2 notes added; tool search: block 1, note 1; tool weather: block 1, note 1; unjudged: batch 1\n"),
        "{text}"
    );
    assert!(
        text.contains(": mcp (identical) on tool search, 2 turns from"),
        "{text}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    for part in [
        "class=\"mark mark-note\"",
        "class=\"mark mark-block\"",
        "<dt>MCP calls judged</dt><dd>14</dd>",
        "<dt>Tool <code>search</code></dt><dd>block 1, note 1</dd>",
        "<dt>Passed unjudged</dt><dd>batch 1</dd>",
        "tool <code>weather</code>",
    ] {
        assert!(html.contains(part), "{part}");
    }
}

#[test]
fn a_har_recorded_in_front_of_loopguard_replays_the_same() {
    let d = Dir::new("mcp-har");
    let plain = session(true);
    let (report, verdicts) = run(&d, MCP, "s.har", &har(&plain), &[]);
    check_session(&report, &verdicts, &plain);
    // Recorded in front of loopguard: the 3rd result carries loopguard's
    // note, the 4th answer is loopguard's own.
    let mut s = session(true);
    let note = json!({"type": "text", "text": "[loopguard] Note: this is the 3rd call in a row of the tool `search` with these exact arguments, and the previous 2 all returned the same result. Calling it again will not change the result."}).to_string();
    for k in [6, 15] {
        let (_, _, body) = s[k].response.as_mut().unwrap();
        let end = body.find("}],").unwrap() + 1;
        body.insert_str(end, &format!(",{note}"));
    }
    for k in [8, 16] {
        s[k].response = Some(if k == 8 {
            (
                200,
                "application/json",
                json!({"jsonrpc": "2.0", "id": 9, "result": {
                    "content": [{"type": "text", "text": "[loopguard] This call was not run"}],
                    "isError": true, "resultType": "complete",
                    "_meta": {"loopguard": {"policy": "mcp-tools"}}}})
                .to_string(),
            )
        } else {
            // A reject: its 429 is loopguard's, not the server's.
            (
                429,
                "application/json",
                json!({"jsonrpc": "2.0", "id": 9, "error": {"code": -31000,
                    "message": "[loopguard] This call was not run", "data": {"loopguard": {}}}})
                .to_string(),
            )
        });
        s[k].response_headers = vec![(
            "x-loopguard-mcp-loop",
            "tier=identical; tool=search; count=4; step=block".to_string(),
        )];
    }
    let (report, verdicts) = run(&d, MCP, "front.har", &har(&s), &[]);
    check_session(&report, &verdicts, &s);
    assert_eq!(
        report["runs"][0]["policies"][0]["mcp"]["unjudged"],
        json!({"batch": 1})
    );
    assert_eq!(verdicts[6]["mcp"]["own_note_removed"], true);
    assert_eq!(
        report["runs"][0]["policies"][0]["mcp"]["own_notes_removed"],
        2
    );
    assert!(
        report["notes"]
            .to_string()
            .contains("2 recorded MCP results carried loopguard's own note"),
        "{}",
        report["notes"]
    );
    // A configuration that forwards the 4th call meets loopguard's answer
    // where the server's should be: said, and left out of the history.
    let later = MCP.replace("\"same_result_min\": 3", "\"same_result_min\": 5");
    let (report, verdicts) = run(&d, &later, "front2.har", &har(&s), &[]);
    assert_eq!(verdicts[8]["action"], "allow");
    for k in [8, 16] {
        assert_eq!(
            verdicts[k]["mcp"]["result_missing"],
            "answered_by_loopguard"
        );
    }
    // Never read as a result that could not be read (the 429 was
    // loopguard's).
    assert_eq!(
        report["runs"][0]["policies"][0]["mcp"]["unjudged"],
        json!({"batch": 1})
    );
    assert_eq!(
        report["runs"][0]["policies"][0]["mcp"]["results_missing"],
        json!({"answered_by_loopguard": 2})
    );
    assert!(report["notes"].to_string().contains(
        "2 forwarded MCP calls had loopguard's own answer recorded instead of the server's"
    ));
}

#[test]
fn results_that_were_not_recorded_are_said_and_never_guessed() {
    let d = Dir::new("mcp-missing");
    let mut s = session(false);
    for e in &mut s {
        e.response = None;
    }
    let (report, verdicts) = run(&d, MCP, "s.jsonl", &jsonl(&s), &[]);
    assert!(verdicts
        .iter()
        .all(|v| v["action"] != "note" && v["action"] != "block"));
    assert_eq!(verdicts[2]["mcp"]["result_missing"], "not_recorded");
    let p = &report["runs"][0]["policies"][0];
    assert_eq!(p["loops_found"], 0);
    assert_eq!(p["mcp"]["results_missing"], json!({"not_recorded": 14}));
    assert!(
        report["notes"]
            .to_string()
            .contains("14 forwarded MCP calls had no recorded result"),
        "{}",
        report["notes"]
    );
    // A body cut before the result: incomplete, said too.
    let mut s = session(false);
    for e in &mut s {
        if let Some((_, _, body)) = e.response.as_mut() {
            body.truncate(20);
        }
    }
    let lines: String = s
        .iter()
        .map(|e| {
            let mut v: Value = serde_json::from_str(&e.jsonl()).unwrap();
            if v.get("response").is_some() {
                v["response"]["body_truncated"] = json!(true);
            }
            v.to_string() + "\n"
        })
        .collect();
    let (report, _) = run(&d, MCP, "cut.jsonl", &lines, &[]);
    assert_eq!(
        report["runs"][0]["policies"][0]["mcp"]["results_missing"],
        json!({"incomplete": 14})
    );
}

#[test]
fn a_sweep_over_the_mcp_threshold() {
    let d = Dir::new("mcp-sweep");
    let s = session(false);
    let (report, _) = run(
        &d,
        MCP,
        "s.jsonl",
        &jsonl(&s),
        &["--set", "policies.mcp-tools.mcp.same_result_min=2,3,4"],
    );
    let rows: Vec<u64> = report["sweep"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["requests_touched"].as_u64().unwrap())
        .collect();
    // 2: the 2nd noted, the 3rd and 4th blocked; 3: the 3rd noted, the
    // 4th blocked; 4: the 4th noted.
    assert_eq!(rows, [6, 4, 2]);
}

#[test]
fn loopguards_own_note_is_taken_out_of_a_recorded_result() {
    use super::mcp::without_own_note;
    let note =
        json!({"type": "text", "text": "[loopguard] Note: the 3rd call. Use what you have."})
            .to_string();
    let server = r#"{"id":3,"jsonrpc":"2.0","result":{"content":[{"text":"x","type":"text"}],"isError":false}}"#;
    let noted = server.replace("}],", &format!("}},{note}],"));
    let (b, removed) = without_own_note(noted.as_bytes());
    assert!(removed);
    assert_eq!(b.as_ref(), server.as_bytes());
    // In an event stream too; and as the only block.
    let empty = r#"{"result":{"content":[]}}"#;
    let framed = format!("data: {}\n\n", empty.replace("[]", &format!("[{note}]")));
    let (b, removed) = without_own_note(framed.as_bytes());
    assert!(removed);
    assert_eq!(b.as_ref(), format!("data: {empty}\n\n").as_bytes());
    // A server's text that quotes a note, not as the last block, stays.
    let quoted = server.replace(
        "}],",
        &format!("}},{note},{{\"text\":\"y\",\"type\":\"text\"}}],"),
    );
    assert!(!without_own_note(quoted.as_bytes()).1);
    assert!(!without_own_note(server.as_bytes()).1);
    // Keys in the other order.
    let other = server.replace(
        "}],",
        r#"},{"type":"text","text":"[loopguard] Note: again."}],"#,
    );
    let (b, removed) = without_own_note(other.as_bytes());
    assert!(removed);
    assert_eq!(b.as_ref(), server.as_bytes());
}

#[test]
fn callers_known_by_nothing_else_are_told_apart_by_their_address() {
    let d = Dir::new("mcp-address");
    let mut lines = String::new();
    for i in 0..6u64 {
        let address = if i % 2 == 0 {
            "10.0.0.7:4100"
        } else {
            "10.0.0.8:4100"
        };
        lines += &(json!({"timestamp": START + i * 1000, "method": "POST", "path": "/mcp",
            "source_address": address,
            "headers": {"mcp-method": "tools/call", "mcp-name": "search"},
            "body": call_body(i, "search", json!({"query": "x"})),
            "response": {"status": 200, "body": result(i, "same")}})
        .to_string()
            + "\n");
    }
    let (report, verdicts) = run(&d, MCP, "a.jsonl", &lines, &[]);
    let actions: Vec<&str> = verdicts
        .iter()
        .map(|v| v["action"].as_str().unwrap())
        .collect();
    // One history each: the 3rd call of each is noted, none blocked.
    assert_eq!(
        actions,
        ["allow", "allow", "allow", "allow", "note", "note"]
    );
    let p = &report["runs"][0]["policies"][0];
    assert_eq!(
        (p["loops_found"].as_u64(), p["callers_touched"].as_u64()),
        (Some(2), Some(2))
    );
    let callers: Vec<&str> = p["loops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["caller"].as_str().unwrap())
        .collect();
    assert!(callers[0].ends_with("address 10.0.0.7"), "{callers:?}");
    assert!(callers[1].ends_with("address 10.0.0.8"), "{callers:?}");
}
