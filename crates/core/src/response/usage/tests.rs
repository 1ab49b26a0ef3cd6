use super::*;
use crate::response::repeats::RepeatSettings;
use proptest::prelude::*;

fn read(framing: Framing, body: &[u8]) -> Option<Usage> {
    let mut r = UsageReader::new(framing);
    r.feed(body);
    r.finish()
}

/// Fed in pieces split at `cuts`.
fn read_split(framing: Framing, body: &[u8], cuts: &[usize]) -> Option<Usage> {
    let mut r = UsageReader::new(framing);
    let mut at = 0;
    for &c in cuts {
        let c = c.min(body.len()).max(at);
        r.feed(&body[at..c]);
        at = c;
    }
    r.feed(&body[at..]);
    r.finish()
}

const CHAT_JSON: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"The field is called \"usage\": {\"prompt_tokens\": 999} in the docs."},"finish_reason":"stop"}],"usage":{"prompt_tokens":812,"completion_tokens":40,"total_tokens":852,"prompt_tokens_details":{"cached_tokens":512},"completion_tokens_details":{"reasoning_tokens":16}}}"#;

const ANTHROPIC_JSON: &str = r#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"tool_use","id":"tu_1","name":"report","input":{"usage":{"input_tokens":5}}}],"stop_reason":"tool_use","usage":{"input_tokens":20,"cache_creation_input_tokens":100,"cache_read_input_tokens":300,"output_tokens":31}}"#;

const RESPONSES_JSON: &str = r#"{"id":"resp_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"ok"}]}],"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":10},"output_tokens":70,"output_tokens_details":{"reasoning_tokens":64},"total_tokens":120}}"#;

const CHAT_STREAM: &str = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"usage is\"}}],\"usage\":null}\n\ndata: {\"id\":\"c\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\ndata: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3,\"total_tokens\":12}}\n\ndata: [DONE]\n\n";

const ANTHROPIC_STREAM: &str = "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,\"cache_read_input_tokens\":5,\"output_tokens\":1}}}\r\n\r\nevent: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\r\n\r\nevent: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\r\n\r\nevent: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";

const RESPONSES_STREAM: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"usage\"}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":7,\"output_tokens\":8,\"output_tokens_details\":{\"reasoning_tokens\":2}}}}\n\n";

fn all() -> Vec<(Framing, &'static str, Usage)> {
    vec![
        (
            Framing::Json,
            CHAT_JSON,
            Usage {
                input: 812,
                output: 40,
                cached_input: 512,
                cache_write: 0,
                reasoning: 16,
                cost_microusd: None,
            },
        ),
        (
            Framing::Json,
            ANTHROPIC_JSON,
            Usage {
                input: 420,
                output: 31,
                cached_input: 300,
                cache_write: 100,
                reasoning: 0,
                cost_microusd: None,
            },
        ),
        (
            Framing::Json,
            RESPONSES_JSON,
            Usage {
                input: 50,
                output: 70,
                cached_input: 10,
                cache_write: 0,
                reasoning: 64,
                cost_microusd: None,
            },
        ),
        (
            Framing::EventStream,
            CHAT_STREAM,
            Usage {
                input: 9,
                output: 3,
                cached_input: 0,
                cache_write: 0,
                reasoning: 0,
                cost_microusd: None,
            },
        ),
        (
            Framing::EventStream,
            ANTHROPIC_STREAM,
            Usage {
                input: 30,
                output: 15,
                cached_input: 5,
                cache_write: 0,
                reasoning: 0,
                cost_microusd: None,
            },
        ),
        (
            Framing::EventStream,
            RESPONSES_STREAM,
            Usage {
                input: 7,
                output: 8,
                cached_input: 0,
                cache_write: 0,
                reasoning: 2,
                cost_microusd: None,
            },
        ),
    ]
}

#[test]
fn each_format_whole() {
    for (framing, body, want) in all() {
        assert_eq!(read(framing, body.as_bytes()), Some(want), "{body}");
    }
}

#[test]
fn each_format_split_at_every_byte() {
    for (framing, body, want) in all() {
        let b = body.as_bytes();
        for cut in 0..=b.len() {
            assert_eq!(
                read_split(framing, b, &[cut]),
                Some(want),
                "cut at {cut}: {body}"
            );
        }
        let mut r = UsageReader::new(framing);
        for byte in b {
            r.feed(std::slice::from_ref(byte));
        }
        assert_eq!(r.finish(), Some(want), "byte by byte: {body}");
    }
}

proptest! {
    #[test]
    fn any_chunking_reads_the_same(cuts in proptest::collection::vec(0usize..700, 0..12)) {
        for (framing, body, want) in all() {
            let mut cuts = cuts.clone();
            cuts.sort_unstable();
            prop_assert_eq!(read_split(framing, body.as_bytes(), &cuts), Some(want));
        }
    }
}

#[test]
fn no_usage_is_none() {
    assert_eq!(read(Framing::Json, br#"{"choices":[],"usage":null}"#), None);
    assert_eq!(
        read(Framing::Json, br#"{"error":{"message":"overloaded"}}"#),
        None
    );
    assert_eq!(
        read(
            Framing::EventStream,
            b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n"
        ),
        None
    );
    assert_eq!(read(Framing::Json, b""), None);
    assert_eq!(read(Framing::Json, b"not json \"usage\": {broken"), None);
}

#[test]
fn a_stream_without_a_final_newline_is_read_to_its_end() {
    let body = "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}";
    assert_eq!(
        read(Framing::EventStream, body.as_bytes()).map(|u| (u.input, u.output)),
        Some((1, 2))
    );
}

#[test]
fn memory_is_bounded_whatever_the_length() {
    // A 1 MB line without a newline, then a usage line: the long one is
    // passed over, counted, and the reader never keeps more than the bound.
    let mut r = UsageReader::new(Framing::EventStream);
    let chunk = vec![b'x'; 8192];
    r.feed(b"data: ");
    for _ in 0..128 {
        r.feed(&chunk);
        assert!(r.kept.len() <= MAX_KEPT);
        assert!(r.long.as_ref().map_or(0, |l| l.kept.len()) <= MAX_KEPT);
    }
    r.feed(b"\ndata: {\"usage\":{\"input_tokens\":3,\"output_tokens\":4}}\n");
    assert_eq!(r.oversize, 1);
    assert_eq!(r.finish().map(|u| (u.input, u.output)), Some((3, 4)));
    // The same for a JSON body whose usage object never ends.
    let mut r = UsageReader::new(Framing::Json);
    r.feed(b"{\"usage\": {\"input_tokens\": 1, \"x\": [");
    for _ in 0..128 {
        r.feed(&chunk);
        assert!(r.kept.len() <= MAX_KEPT);
    }
    assert_eq!(r.oversize, 1);
    assert_eq!(r.finish(), None);
}

#[test]
fn content_types() {
    assert_eq!(
        Framing::of_content_type("text/event-stream; charset=utf-8"),
        Some(Framing::EventStream)
    );
    assert_eq!(
        Framing::of_content_type("application/json"),
        Some(Framing::Json)
    );
    assert_eq!(
        Framing::of_content_type("application/problem+json"),
        Some(Framing::Json)
    );
    assert_eq!(Framing::of_content_type("text/html"), None);
}

#[test]
fn usage_written_inside_a_string_is_not_usage() {
    // The model's text quotes a usage object; the key's quotes are escaped
    // inside the JSON string, so only the real key (null here) is seen.
    let line = "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\": {\\\"prompt_tokens\\\": 5}\"}}],\"usage\":null}\n\n";
    assert_eq!(read(Framing::EventStream, line.as_bytes()), None);
    let json = br#"{"choices":[{"message":{"content":"\"usage\": {\"prompt_tokens\": 5}"}}]}"#;
    assert_eq!(read(Framing::Json, json), None);
    // An object that never closes on its line is not parsed.
    assert_eq!(
        read(
            Framing::EventStream,
            b"data: {\"usage\":{\"prompt_tokens\":5\n\n"
        ),
        None
    );
}

/// A stream's events after `pad` bytes of text events, so that the reader
/// passes from reading whole chunks to reading line by line (the watch
/// starts after `WATCH_AFTER` bytes) inside the body.
fn padded(body: &str, pad: usize) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < pad {
        s.push_str(&format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"step {i} of the plan. \"}}}}],\"usage\":null}}\n\n"
        ));
        i += 1;
    }
    s + body
}

proptest! {
    #[test]
    fn watching_reads_the_same_usage_whatever_the_chunking(
        cuts in proptest::collection::vec(0usize..12_000, 0..16),
        pad in 0usize..10_000,
    ) {
        for (framing, body, want) in all() {
            if framing != Framing::EventStream {
                continue;
            }
            let body = padded(body, pad);
            let b = body.as_bytes();
            let mut cuts = cuts.clone();
            cuts.sort_unstable();
            let mut r = UsageReader::new(framing).watching(RepeatSettings::default());
            let mut at = 0;
            for &c in &cuts {
                let c = c.min(b.len()).max(at);
                r.feed(&b[at..c]);
                at = c;
            }
            r.feed(&b[at..]);
            prop_assert_eq!(r.finish(), Some(want));
            prop_assert_eq!(read_split(framing, b, &cuts), Some(want));
        }
    }
}

#[test]
fn a_long_line_split_over_chunks_keeps_its_usage() {
    // The Responses API's `response.completed` repeats the whole response
    // (instructions, output, tools) before its usage: past 64 KB, split
    // over chunks, it is read on for the usage object alone.
    let big = "y".repeat(100 * 1024);
    let line = format!(
        "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"instructions\":\"{big}\",\"usage\":{{\"input_tokens\":900,\"output_tokens\":70}}}}}}\n\n"
    );
    for size in [1000, 16 * 1024, 64 * 1024, 100 * 1024] {
        let mut r = UsageReader::new(Framing::EventStream);
        for piece in line.as_bytes().chunks(size) {
            r.feed(piece);
            assert!(r.kept.len() <= MAX_KEPT);
        }
        assert_eq!(
            r.finish().map(|u| (u.input, u.output)),
            Some((900, 70)),
            "chunks of {size}"
        );
    }
}

#[test]
fn a_compressed_body_is_not_read() {
    for framing in [Framing::Json, Framing::EventStream] {
        let mut r = UsageReader::new(framing);
        r.feed(&[0x1f, 0x8b, 8, 0, 0, 0]);
        r.feed(br#"{"usage":{"input_tokens":1,"output_tokens":1}}"#);
        assert!(r.compressed);
        assert_eq!(r.finish(), None);
    }
}

#[test]
fn reported_cost_and_the_answering_model_are_read() {
    let body = br#"{"id":"gen-1","model":"openai/gpt-4o","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"cost":0.00125}}"#;
    let mut r = UsageReader::new(Framing::Json).finding_model();
    r.feed(body);
    assert_eq!(r.model(), Some("openai/gpt-4o"));
    let u = r.finish().unwrap();
    assert_eq!((u.input, u.output, u.cost_microusd), (10, 5, Some(1250)));
    // Not asked: not looked for.
    let mut r = UsageReader::new(Framing::Json);
    r.feed(body);
    assert_eq!(r.model(), None);
    assert_eq!(microusd_of(&serde_json::json!("0.5")), Some(500_000));
    assert_eq!(microusd_of(&serde_json::json!(-1)), None);
    assert_eq!(microusd_of(&serde_json::json!(null)), None);
}
