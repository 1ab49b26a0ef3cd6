//! The output text of each API's events, and streams fed event by event.

use super::tests::{essay, healthy, scan, scan_split};
use super::*;
use proptest::prelude::*;
use std::borrow::Cow;

// Event data of the three APIs, as sent.
const CHAT_TEXT: &str = r#" {"id":"chatcmpl-9","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"Line one\nshe said \"hi\" at C:\\tmp, caf\u00e9 \ud83d\ude00\/"},"logprobs":null,"finish_reason":null}]}"#;
const CHAT_ROLE: &str = r#"{"id":"chatcmpl-9","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}]}"#;
const CHAT_TOOL: &str = r#"{"id":"chatcmpl-9","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Par"}}]},"finish_reason":null}]}"#;
const CHAT_USAGE: &str = r#"{"id":"chatcmpl-9","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#;
const CHAT_FINISH: &str =
    r#"{"id":"chatcmpl-9","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#;
const CHAT_LOGPROBS: &str = r#"{"choices":[{"index":0,"logprobs":{"content":[{"token":"no","logprob":-0.1}]},"delta":{"content":"Hi"}}]}"#;
const CHAT_SECOND_CHOICE: &str = r#"{"choices":[{"index":1,"delta":{"content":"other answer"}}]}"#;
const RESPONSES_TEXT: &str = r#"{"type":"response.output_text.delta","sequence_number":5,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello \"world\"\n\\o/","logprobs":[]}"#;
const RESPONSES_ARGS: &str = r#"{"type":"response.function_call_arguments.delta","sequence_number":9,"item_id":"fc_1","output_index":1,"delta":"{\"location\":"}"#;
const RESPONSES_CREATED: &str = r#"{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","output":[],"status":"in_progress"}}"#;
const RESPONSES_REASONING: &str = r#"{"type":"response.reasoning_summary_text.delta","item_id":"rs_1","delta":"Thinking about it"}"#;
const ANTHROPIC_TEXT: &str = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Tab\there \\ done \u00e9\ud83d\ude00"}}"#;
const ANTHROPIC_SPACED: &str = r#"{ "type" : "content_block_delta" , "index" : 0 , "delta" : { "text" : "spaced" , "type" : "text_delta" } }"#;
const ANTHROPIC_JSON: &str = r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\": \"San Fra"}}"#;
const ANTHROPIC_THINKING: &str = r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me think"}}"#;
const ANTHROPIC_START: &str = r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":25,"output_tokens":1}}}"#;
const ANTHROPIC_PING: &str = r#"{"type": "ping"}"#;

#[test]
fn output_delta_of_each_api() {
    let text = |d: &str| output_delta(d.as_bytes()).map(Cow::into_owned);
    assert_eq!(
        text(CHAT_TEXT).as_deref(),
        Some("Line one\nshe said \"hi\" at C:\\tmp, café 😀/")
    );
    assert_eq!(text(CHAT_LOGPROBS).as_deref(), Some("Hi"));
    assert_eq!(
        text(RESPONSES_TEXT).as_deref(),
        Some("Hello \"world\"\n\\o/")
    );
    assert_eq!(
        text(ANTHROPIC_TEXT).as_deref(),
        Some("Tab\there \\ done é😀")
    );
    assert_eq!(text(ANTHROPIC_SPACED).as_deref(), Some("spaced"));
    for other in [
        CHAT_ROLE,
        CHAT_TOOL,
        CHAT_USAGE,
        CHAT_FINISH,
        CHAT_SECOND_CHOICE,
        RESPONSES_ARGS,
        RESPONSES_CREATED,
        RESPONSES_REASONING,
        ANTHROPIC_JSON,
        ANTHROPIC_THINKING,
        ANTHROPIC_START,
        ANTHROPIC_PING,
        "[DONE]",
        " [DONE]",
        "",
        "{",
        r#"{"choices":[{"index":0,"delta":{"content":"unterminated}}]}"#,
        r#"{"type":"response.output_text.delta","delta":"bad \q escape"}"#,
        r#"{"type":"response.output_text.delta","delta":12}"#,
    ] {
        assert_eq!(text(other), None, "{other}");
    }
    // The same data checked against serde_json.
    for (data, path) in [
        (CHAT_TEXT, "/choices/0/delta/content"),
        (RESPONSES_TEXT, "/delta"),
        (ANTHROPIC_TEXT, "/delta/text"),
    ] {
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        assert_eq!(text(data).as_deref(), v.pointer(path).unwrap().as_str());
    }
}

#[test]
fn output_delta_borrows_unless_escaped() {
    let plain = br#"{"type":"response.output_text.delta","delta":"plain text"}"#;
    assert!(matches!(
        output_delta(plain),
        Some(Cow::Borrowed("plain text"))
    ));
    assert!(matches!(
        output_delta(RESPONSES_TEXT.as_bytes()),
        Some(Cow::Owned(_))
    ));
}

#[test]
fn lone_surrogates_become_replacement_chars() {
    let d = |s: &str| {
        output_delta(format!(r#"{{"type":"response.output_text.delta","delta":"{s}"}}"#).as_bytes())
            .map(Cow::into_owned)
    };
    assert_eq!(d(r"a\ud83db").as_deref(), Some("a\u{FFFD}b"));
    assert_eq!(d(r"a\ude00b").as_deref(), Some("a\u{FFFD}b"));
    assert_eq!(d(r"\ud83d\u0041").as_deref(), Some("\u{FFFD}A"));
    assert_eq!(d(r"\ud83d").as_deref(), Some("\u{FFFD}"));
    assert_eq!(d(r"\u12").as_deref(), None);
}

/// A degenerate stream as each API sends it: text in small deltas, with
/// other events in between.
fn streams(text: &str) -> Vec<Vec<String>> {
    let pieces: Vec<String> = text
        .chars()
        .collect::<Vec<_>>()
        .chunks(7)
        .map(|c| serde_json::to_string(&c.iter().collect::<String>()).unwrap())
        .collect();
    let chat = std::iter::once(CHAT_ROLE.to_string())
        .chain(pieces.iter().map(|p| {
            format!(r#" {{"id":"c","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":{p}}},"finish_reason":null}}]}}"#)
        }))
        .chain([CHAT_FINISH.to_string(), CHAT_USAGE.to_string(), "[DONE]".to_string()])
        .collect();
    let responses = std::iter::once(RESPONSES_CREATED.to_string())
        .chain(pieces.iter().enumerate().map(|(i, p)| {
            format!(r#"{{"type":"response.output_text.delta","sequence_number":{i},"item_id":"msg_1","output_index":0,"content_index":0,"delta":{p},"logprobs":[]}}"#)
        }))
        .collect();
    let anthropic = [ANTHROPIC_START.to_string(), ANTHROPIC_PING.to_string()]
        .into_iter()
        .chain(pieces.iter().map(|p| {
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{p}}}}}"#)
        }))
        .collect();
    vec![chat, responses, anthropic]
}

#[test]
fn feed_data_flags_each_api() {
    let text = "Checking the file.\n".to_string()
        + &"I will now call the tool to \"read\" the file again.\n".repeat(8);
    for events in streams(&text) {
        let mut w = RepeatWatch::new(RepeatSettings::default());
        let reports = events
            .iter()
            .filter(|e| w.feed_data(e.as_bytes()).is_some())
            .count();
        assert_eq!(reports, 1, "{}", events[1]);
    }
    for events in streams(&essay(300, 7)) {
        let mut w = RepeatWatch::new(RepeatSettings::default());
        assert!(events.iter().all(|e| w.feed_data(e.as_bytes()).is_none()));
    }
}

#[test]
fn tool_call_arguments_are_not_fed() {
    let args = "{\"query\": \"the same search query again and again\"}\n".repeat(30);
    let mut w = RepeatWatch::new(RepeatSettings::default());
    for piece in args.as_bytes().chunks(9) {
        let p = serde_json::to_string(std::str::from_utf8(piece).unwrap()).unwrap();
        let chat = format!(
            r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":{p}}}}}]}}}}]}}"#
        );
        let responses = format!(
            r#"{{"type":"response.function_call_arguments.delta","item_id":"fc_1","delta":{p}}}"#
        );
        let anthropic = format!(
            r#"{{"type":"content_block_delta","index":1,"delta":{{"type":"input_json_delta","partial_json":{p}}}}}"#
        );
        for e in [chat, responses, anthropic] {
            assert_eq!(w.feed_data(e.as_bytes()), None);
        }
    }
    // The same text as output is flagged.
    assert!(scan(&args).is_some());
}

/// `s` as a JSON string with every non-ASCII char as `\u` escapes
/// (surrogate pairs beyond the BMP), as some encoders send it.
fn ascii_json(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_ascii() && !c.is_ascii_control() => out.push(c),
            c => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

proptest! {
    #[test]
    fn repetition_in_tiny_deltas_is_flagged(
        sizes in proptest::collection::vec(1usize..=3, 1..64),
        prefix in "[a-zA-Z ,.]{0,40}",
        which in 0usize..3,
        copies in 10usize..14,
    ) {
        let units = [
            "I apologize for the confusion, let me try that again. ",
            "Step one: open the file.\nStep two: read the file.\nStep three: close the file.\n",
            "Wait — the café’s menu changed. Let me re-check 😀! ",
        ];
        let text = format!("{prefix}\n{}", units[which].repeat(copies));
        let whole = scan(&text);
        prop_assert!(whole.is_some());
        prop_assert_eq!(scan_split(&text, &sizes), whole);
    }

    #[test]
    fn healthy_outputs_are_not_flagged_however_split(
        sizes in proptest::collection::vec(1usize..=3, 1..64),
        which in 0usize..6,
        seed in 1u64..u64::MAX,
    ) {
        let text = if which == 5 {
            essay(400, seed)
        } else {
            healthy().swap_remove(which).1
        };
        prop_assert_eq!(scan_split(&text, &sizes), None);
    }

    #[test]
    fn output_delta_unescapes_like_serde_json(s in "\\PC*|[\\x00-\\x1f\"\\\\/a\u{e9}\u{1F600}]{0,20}") {
        for quoted in [serde_json::to_string(&s).unwrap(), ascii_json(&s)] {
            let want: String = serde_json::from_str(&quoted).unwrap();
            for data in [
                format!(r#"{{"choices":[{{"index":0,"delta":{{"content":{quoted}}}}}]}}"#),
                format!(r#"{{"type":"response.output_text.delta","delta":{quoted}}}"#),
                format!(r#"{{"type":"content_block_delta","delta":{{"type":"text_delta","text":{quoted}}}}}"#),
            ] {
                let got = output_delta(data.as_bytes()).map(Cow::into_owned);
                prop_assert_eq!(got, (!want.is_empty()).then(|| want.clone()), "{}", data);
            }
        }
    }
}
