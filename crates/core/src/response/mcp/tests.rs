use super::*;
use serde_json::{json, Value};

fn result(text: &str, is_error: bool) -> Value {
    json!({"jsonrpc": "2.0", "id": 3, "result": {
        "content": [{"type": "text", "text": text}], "isError": is_error}})
}

fn sse(messages: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        out.extend_from_slice(format!("event: message\nid: {i}\ndata: {m}\n\n").as_bytes());
    }
    out
}

/// Feed `body` in chunks of `size`, apply the insertions, and return the
/// body the client gets and what was seen.
fn run(
    framing: Framing,
    body: &[u8],
    size: usize,
    note: Option<NotePlan>,
) -> (Vec<u8>, Option<Seen>) {
    let mut r = ResultReader::new(framing, Classes::defaults(), note);
    let mut out = Vec::new();
    let mut seen = None;
    let chunks: Vec<&[u8]> = body.chunks(size.max(1)).collect();
    for (n, chunk) in chunks.iter().enumerate() {
        let fed = r.feed(chunk, n + 1 == chunks.len());
        let mut c = chunk.to_vec();
        if let Some((at, bytes)) = fed.insert {
            c.splice(at..at, bytes);
        }
        out.extend_from_slice(&c);
        if fed.seen.is_some() {
            assert!(seen.is_none(), "seen once");
            seen = fed.seen;
        }
    }
    (out, seen)
}

fn outcome(framing: Framing, body: &[u8]) -> Outcome {
    match run(framing, body, body.len(), None).1 {
        Some(Seen::Result(o)) => o,
        other => panic!("{other:?}"),
    }
}

#[test]
fn framing_comes_from_the_content_type() {
    assert_eq!(Framing::of(Some("application/json")), Some(Framing::Json));
    assert_eq!(
        Framing::of(Some("text/event-stream; charset=utf-8")),
        Some(Framing::Sse)
    );
    assert_eq!(Framing::of(Some("Application/JSON")), Some(Framing::Json));
    assert_eq!(Framing::of(Some("text/html")), None);
    assert_eq!(Framing::of(None), None);
}

#[test]
fn the_same_result_has_the_same_digest_in_either_framing_and_any_chunking() {
    let msg = result("3 results for 'x'", false);
    let json_body = msg.to_string().into_bytes();
    let a = outcome(Framing::Json, &json_body);
    assert!(!a.failed);
    // A progress notification comes first on the stream.
    let progress = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": 1, "progress": 0.5, "content": ["not this"]}});
    let stream = sse(&[progress, msg.clone()]);
    for size in [1, 2, 3, 7, 64, stream.len()] {
        assert_eq!(
            run(Framing::Sse, &stream, size, None).1,
            Some(Seen::Result(a)),
            "chunks of {size}"
        );
        assert_eq!(
            run(Framing::Json, &json_body, size, None).1,
            Some(Seen::Result(a))
        );
    }
    // Key order and whitespace do not matter.
    let spaced = br#"{ "result" : { "isError" : false , "content" : [ { "text" : "3 results for 'x'" , "type" : "text" } ] } , "id" : 3 , "jsonrpc" : "2.0" }"#;
    assert_eq!(outcome(Framing::Json, spaced), a);
    // CRLF line ends.
    let crlf = String::from_utf8(sse(&[msg]))
        .unwrap()
        .replace('\n', "\r\n");
    assert_eq!(outcome(Framing::Sse, crlf.as_bytes()), a);
}

#[test]
fn results_differ_by_content_error_and_structured_content() {
    let base = outcome(Framing::Json, result("a", false).to_string().as_bytes());
    let other = outcome(Framing::Json, result("b", false).to_string().as_bytes());
    let failed = outcome(Framing::Json, result("a", true).to_string().as_bytes());
    assert_ne!(base.result, other.result);
    assert_ne!(base.result, failed.result);
    assert_eq!(base.content, failed.content);
    assert!(failed.failed);
    let structured = |t: i64| {
        outcome(
            Framing::Json,
            json!({"jsonrpc": "2.0", "id": 1, "result": {
            "content": [{"type": "text", "text": "{}"}], "structuredContent": {"temp": t}}})
            .to_string()
            .as_bytes(),
        )
    };
    assert_ne!(structured(20).result, structured(21).result);
    assert_eq!(structured(20).content, structured(21).content);
}

#[test]
fn volatile_tokens_are_masked_but_numbers_are_news() {
    let at = |t: &str| outcome(Framing::Json, result(t, false).to_string().as_bytes()).result;
    assert_eq!(
        at("job 7 running (checked 2026-11-26T10:00:01Z, req 3f2a9c1e-7b4d-4c1a-9e2f-0a1b2c3d4e5f)"),
        at("job 7 running (checked 2026-11-26T10:00:09Z, req 9d1a2b3c-7b4d-4c1a-9e2f-0a1b2c3d4e5f)")
    );
    assert_ne!(at("progress 40%"), at("progress 45%"));
}

#[test]
fn a_json_rpc_error_is_a_failure_judged_by_code_and_message() {
    let err = |code: i64, msg: &str| {
        outcome(
            Framing::Json,
            json!({"jsonrpc": "2.0", "id": 1,
            "error": {"code": code, "message": msg}})
            .to_string()
            .as_bytes(),
        )
    };
    let a = err(-32602, "Unknown tool: serch");
    assert!(a.failed);
    assert_eq!(a, err(-32602, "Unknown tool: serch"));
    assert_ne!(a.result, err(-32602, "Unknown tool: sarch").result);
    assert_ne!(a.result, err(-32603, "Unknown tool: serch").result);
}

#[test]
fn a_note_goes_into_the_expected_content_only() {
    let msg = result("same again", false);
    let expected = outcome(Framing::Json, msg.to_string().as_bytes()).content;
    let plan = NotePlan {
        expected_content: expected,
        text: "loopguard: \"same\"\nagain".to_string(),
    };
    for framing in [Framing::Json, Framing::Sse] {
        let body = match framing {
            Framing::Json => msg.to_string().into_bytes(),
            Framing::Sse => sse(std::slice::from_ref(&msg)),
        };
        for size in [1, 5, 13, body.len()] {
            let (out, seen) = run(framing, &body, size, Some(plan.clone()));
            let text = String::from_utf8(out).unwrap();
            let json_text = match framing {
                Framing::Json => text.clone(),
                Framing::Sse => text
                    .lines()
                    .find_map(|l| l.strip_prefix("data: "))
                    .unwrap()
                    .to_string(),
            };
            let v: Value = serde_json::from_str(&json_text).unwrap();
            let content = v["result"]["content"].as_array().unwrap();
            assert_eq!(content.len(), 2, "{text}");
            assert_eq!(content[1]["text"], plan.text);
            assert_eq!(content[0]["text"], "same again");
            // The digest is of the result as the server sent it.
            assert!(matches!(seen, Some(Seen::Result(o)) if o.content == expected));
        }
    }
    // A result that changed gets no note.
    let changed = result("something new", false).to_string();
    let (out, _) = run(Framing::Json, changed.as_bytes(), 4, Some(plan.clone()));
    assert_eq!(out, changed.as_bytes());
    // An empty content array gets the note as its only block.
    let empty = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": []}});
    let plan = NotePlan {
        expected_content: outcome(Framing::Json, empty.to_string().as_bytes()).content,
        text: "n".to_string(),
    };
    let (out, _) = run(Framing::Json, empty.to_string().as_bytes(), 3, Some(plan));
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["result"]["content"],
        json!([{"type": "text", "text": "n"}])
    );
}

#[test]
fn odd_responses_are_unreadable_and_bounded() {
    let seen = |framing, body: &[u8]| run(framing, body, 7, None).1;
    assert_eq!(seen(Framing::Json, b"not json"), Some(Seen::Unreadable));
    assert_eq!(
        seen(Framing::Json, br#"{"jsonrpc":"2.0","method":"x"}"#),
        Some(Seen::Unreadable)
    );
    assert_eq!(
        seen(
            Framing::Json,
            br#"{"jsonrpc":"2.0","id":1,"result":{"content":["#
        ),
        Some(Seen::Unreadable)
    );
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":{}1{}}}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    );
    assert_eq!(seen(Framing::Json, deep.as_bytes()), Some(Seen::Unreadable));
    // An event that ends in the middle of its message.
    assert_eq!(
        seen(Framing::Sse, b"data: {\"jsonrpc\":\"2.0\",\n\ndata: {}\n\n"),
        Some(Seen::Unreadable)
    );
    // A stream of notifications that never ends is read only so far.
    let mut r = ResultReader::new(Framing::Sse, Classes::defaults(), None);
    let ping = sse(&[json!({"jsonrpc": "2.0", "method": "notifications/message", "params": {}})]);
    let mut fed = 0;
    let mut seen = None;
    while seen.is_none() && fed < 2 * MAX_SCANNED {
        seen = r.feed(&ping, false).seen;
        fed += ping.len();
    }
    assert_eq!(seen, Some(Seen::Unreadable));
    assert!(fed <= MAX_SCANNED + ping.len());
    assert!(!r.reading());
    // A long content is judged by its bytes: the same twice, another not.
    let long = |c: char| result(&c.to_string().repeat(scan::MAX_CAPTURE + 10), false).to_string();
    let a = outcome(Framing::Json, long('a').as_bytes());
    assert_eq!(a, outcome(Framing::Json, long('a').as_bytes()));
    assert_ne!(
        a.result,
        outcome(Framing::Json, long('b').as_bytes()).result
    );
}

#[test]
fn a_member_given_twice_is_not_read() {
    let body = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"content":[{"type":"text","text":"b"}]}}"#;
    let first = outcome(
        Framing::Json,
        br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}]}}"#,
    );
    let plan = NotePlan {
        expected_content: first.content,
        text: "n".to_string(),
    };
    for size in [1, 7, body.len()] {
        let (out, seen) = run(Framing::Json, body, size, Some(plan.clone()));
        assert_eq!(seen, Some(Seen::Unreadable), "chunks of {size}");
        // At most the one note, whatever the chunking.
        let notes = String::from_utf8(out)
            .unwrap()
            .matches("\"text\":\"n\"")
            .count();
        assert!(notes <= 1);
    }
}

#[test]
fn an_errors_data_is_not_part_of_its_digest() {
    let err = |data: &str| {
        outcome(
            Framing::Json,
            json!({"jsonrpc": "2.0", "id": 1,
                "error": {"code": -32603, "message": "backend down", "data": {"trace": data}}})
            .to_string()
            .as_bytes(),
        )
    };
    assert_eq!(err("at x.py:10"), err("at y.py:99"));
}
