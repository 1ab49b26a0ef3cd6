//! Token usage from responses, added to the request's policy.

use super::tests::*;
use super::*;
use serde_json::json;

const CHAT: &str = r#"{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":812,"completion_tokens":40}}"#;

/// The response `body` (in `chunks` pieces) with `content_type` reaches
/// the request: the effects.
fn respond(
    h: &mut Harness,
    s: &mut Sent,
    content_type: &str,
    body: &str,
    chunks: usize,
) -> Effects {
    let mut out = h.answer(s, 200);
    h.engine
        .on_response_content_type(&mut s.req, Some(content_type), h.now, &mut out);
    let b = body.as_bytes();
    let size = b.len().div_ceil(chunks.max(1)).max(1);
    let pieces: Vec<&[u8]> = b.chunks(size).collect();
    for (i, piece) in pieces.iter().enumerate() {
        if s.req.wants_response_body() {
            h.engine
                .on_response_body(&mut s.req, piece, i + 1 == pieces.len(), h.now, &mut out);
        }
    }
    h.engine.on_done(&mut s.req, &mut out);
    out
}

fn tokens(h: &Harness, out: &[Effect], t: &str, in_loop: bool) -> i64 {
    h.metric(
        out,
        &format!("loopguard.tokens_total.policy.p.token_type.{t}.loop.{in_loop}.model.other"),
    )
}

#[test]
fn a_response_adds_its_tokens_to_the_policy() {
    let mut h = Harness::policy(exact(3));
    let mut s = h.post("{\"q\":1}");
    let out = respond(&mut h, &mut s, "application/json", CHAT, 3);
    assert_eq!(
        (
            tokens(&h, &out, "input", false),
            tokens(&h, &out, "output", false)
        ),
        (812, 40)
    );
    assert_eq!(tokens(&h, &out, "input", true), 0);
    assert_eq!(
        h.metric(&out, "loopguard.responses_without_usage_total.policy.p"),
        0
    );
}

#[test]
fn a_loop_request_s_tokens_are_counted_as_the_loop_s_and_a_rejected_one_spends_none() {
    let mut h = Harness::policy(detection(json!({
        "enabled": true, "window_seconds": 60, "similarity": "exact",
        "escalation": [{"at": 2, "action": "warn"}, {"at": 3, "action": "reject"}]})));
    let mut first = h.post("{\"q\":1}");
    let out = respond(&mut h, &mut first, "application/json", CHAT, 1);
    assert_eq!(tokens(&h, &out, "input", false), 812);
    let mut second = h.post("{\"q\":1}");
    let out = respond(
        &mut h,
        &mut second,
        "application/json; charset=utf-8",
        CHAT,
        2,
    );
    assert_eq!(
        (
            tokens(&h, &out, "input", true),
            tokens(&h, &out, "output", true)
        ),
        (812, 40)
    );
    assert_eq!(tokens(&h, &out, "input", false), 0);
    let mut third = h.post("{\"q\":1}");
    assert_eq!(third.status(), 429);
    // Envoy calls the response path for loopguard's own 429 too.
    let out = respond(
        &mut h,
        &mut third,
        "application/json",
        r#"{"error":{"type":"loop_detected"}}"#,
        1,
    );
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Count(..))),
        "{out:?}"
    );
}

#[test]
fn streams_are_read_as_they_pass_and_other_answers_report_no_usage() {
    let mut h = Harness::policy(exact(3));
    let mut s = h.post("{\"q\":2}");
    let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n";
    let out = respond(&mut h, &mut s, "text/event-stream", stream, 7);
    assert_eq!(
        (
            tokens(&h, &out, "input", false),
            tokens(&h, &out, "output", false)
        ),
        (25, 15)
    );
    let mut html = h.post("{\"q\":3}");
    let out = respond(&mut h, &mut html, "text/html", "<html>", 1);
    assert_eq!(
        h.metric(&out, "loopguard.responses_without_usage_total.policy.p"),
        1
    );
    let mut bare = h.post("{\"q\":4}");
    let out = respond(
        &mut h,
        &mut bare,
        "application/json",
        "{\"error\":\"overloaded\"}",
        1,
    );
    assert_eq!(
        h.metric(&out, "loopguard.responses_without_usage_total.policy.p"),
        1
    );
    // A stream cut short counts what it had read, once.
    let mut cut = h.post("{\"q\":5}");
    let mut out = h.answer(&mut cut, 200);
    h.engine
        .on_response_content_type(&mut cut.req, Some("text/event-stream"), h.now, &mut out);
    h.engine.on_response_body(
        &mut cut.req,
        &stream.as_bytes()[..120],
        false,
        h.now,
        &mut out,
    );
    h.engine.on_done(&mut cut.req, &mut out);
    h.engine.on_done(&mut cut.req, &mut out);
    assert_eq!(tokens(&h, &out, "input", false), 25);
    // No body, no reading (an LLM call has one); no policy, no reading.
    let mut get = h.get("/v1/models");
    assert!(!get.req.reads_usage());
    let mut out = h.answer(&mut get, 200);
    h.engine
        .on_response_content_type(&mut get.req, Some("application/json"), h.now, &mut out);
    assert!(!get.req.wants_response_body());
    let mut h = Harness::policy(json!({"selector": {"pathPrefix": "/v1/"},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}));
    let mut other = h.send("POST", "/other", &[], b"{}");
    let mut out = h.answer(&mut other, 200);
    h.engine
        .on_response_content_type(&mut other.req, Some("application/json"), h.now, &mut out);
    assert!(!other.req.wants_response_body());
}

/// A Chat Completions stream of `deltas`, then its usage.
fn chat_stream(deltas: &[&str]) -> String {
    let mut s = String::new();
    for d in deltas {
        let chunk = json!({"id": "c", "model": "gpt-4o", "choices": [{"index": 0, "delta": {"content": d}}], "usage": null});
        s.push_str(&format!("data: {chunk}\n\n"));
    }
    s.push_str("data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":400}}\n\ndata: [DONE]\n\n");
    s
}

#[test]
fn a_stream_repeating_itself_is_reported_once_and_passes_whole() {
    let mut h = Harness::policy(exact(3));
    let mut s = h.post("{\"model\":\"gpt-4o\",\"q\":7}");
    let sentence = "I will now check the deployment status again. ";
    // Deltas of a few characters, as models stream: past the first 8 KB
    // of events the watch reads the text.
    let text = sentence.repeat(30);
    let deltas: Vec<&str> = text
        .as_bytes()
        .chunks(6)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let stream = chat_stream(&deltas);
    assert!(stream.len() > 2 * crate::response::usage::WATCH_AFTER as usize);
    let out = respond(&mut h, &mut s, "text/event-stream", &stream, 9);
    assert_eq!(
        h.metric(&out, "loopguard.degenerate_output_total.policy.p"),
        1
    );
    let events = super::tests::events(&out, "output.degenerate");
    assert_eq!(events.len(), 1, "{out:?}");
    let e = &events[0];
    assert_eq!(e["policy"], "p");
    assert_eq!(e["caller"].as_str().map(str::len), Some(12));
    assert!(e["repeats"].as_u64().unwrap() >= 4, "{e}");
    assert_eq!(
        e["unit_chars"],
        json!(sentence.trim_end().chars().count() + 1)
    );
    // Its usage is still read.
    assert_eq!(tokens(&h, &out, "output", false), 400);
    // A healthy stream of varied sentences is not reported.
    let mut ok = h.post("{\"model\":\"gpt-4o\",\"q\":8}");
    let varied: Vec<String> = (0..40)
        .map(|i| {
            format!(
                "Step {i} checks the {} service and finds {} pods. ",
                ["api", "db", "queue", "cache"][i % 4],
                i * 3 + 1
            )
        })
        .collect();
    let refs: Vec<&str> = varied.iter().map(String::as_str).collect();
    let out = respond(&mut h, &mut ok, "text/event-stream", &chat_stream(&refs), 5);
    assert_eq!(
        h.metric(&out, "loopguard.degenerate_output_total.policy.p"),
        0
    );
    // A short stream is not watched: under 8 KB of events it cannot have
    // burnt much (and reading it costs nothing more).
    let mut short = h.post("{\"model\":\"gpt-4o\",\"q\":9}");
    let few: Vec<&str> = std::iter::repeat_n(sentence, 8).collect();
    let stream = chat_stream(&few);
    assert!(stream.len() < crate::response::usage::WATCH_AFTER as usize);
    let out = respond(&mut h, &mut short, "text/event-stream", &stream, 1);
    assert_eq!(
        h.metric(&out, "loopguard.degenerate_output_total.policy.p"),
        0
    );
}
