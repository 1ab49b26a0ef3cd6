use super::*;
use proptest::prelude::*;
use std::borrow::Cow;

fn scan(text: &str) -> Option<Repeated> {
    RepeatWatch::new(RepeatSettings::default()).feed_text(text)
}

/// Fed in pieces of `sizes` chars (cycled; 0 counts as 1).
fn scan_split(text: &str, sizes: &[usize]) -> Option<Repeated> {
    let mut w = RepeatWatch::new(RepeatSettings::default());
    let cuts: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let (mut at, mut found, mut n) = (0, None, 0);
    while at + 1 < cuts.len() {
        let size = sizes
            .get(n % sizes.len().max(1))
            .copied()
            .unwrap_or(1)
            .max(1);
        let to = (at + size).min(cuts.len() - 1);
        if let Some(r) = w.feed_text(&text[cuts[at]..cuts[to]]) {
            assert!(found.is_none(), "reported twice");
            found = Some(r);
        }
        at = to;
        n += 1;
    }
    found
}

/// A deterministic xorshift, for generated texts.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// A long healthy essay from varied sentences, in paragraphs.
fn essay(sentences: usize, seed: u64) -> String {
    let mut r = Rng(seed);
    let subjects = [
        "The gateway",
        "Every agent",
        "A careful operator",
        "The retry budget",
        "Our billing team",
        "The upstream provider",
        "A streaming response",
        "The policy engine",
        "Each replica",
        "The audit log",
    ];
    let verbs = [
        "measures",
        "rejects",
        "forgives",
        "records",
        "summarises",
        "delays",
        "compares",
        "explains",
        "counts",
        "reviews",
    ];
    let objects = [
        "the identical requests",
        "a burst of tool calls",
        "the cost of each token",
        "every failed attempt",
        "the shared window",
        "a runaway conversation",
        "the fingerprint of the body",
        "the latency of the cluster",
        "a quiet weekend deploy",
        "the rate of new sessions",
    ];
    let tails = [
        "before the money is gone",
        "without holding the body back",
        "when the provider is overloaded",
        "so that nobody is paged at night",
        "while the client keeps retrying",
        "as the documentation suggests",
        "in under a millisecond",
        "even across replicas",
    ];
    let ends = [". ", ". ", ". ", "! ", "? "];
    let mut out = String::new();
    for i in 0..sentences {
        out.push_str(&format!(
            "{} {} {} {}{}",
            r.pick(&subjects),
            r.pick(&verbs),
            r.pick(&objects),
            r.pick(&tails),
            r.pick(&ends)
        ));
        if i % 6 == 5 {
            out.push_str("\n\n");
        }
    }
    out
}

fn markdown_table() -> String {
    let mut t = String::from(
        "Here is the latency report you asked for:\n\n| Date | Region | Requests | p99 latency | Status |\n|------|--------|----------|-------------|--------|\n",
    );
    let regions = ["us-east-1", "eu-west-1", "ap-south-1"];
    for d in 1..=30u64 {
        t.push_str(&format!(
            "| 2024-03-{d:02} | {} | {} | {} ms | ok |\n",
            regions[(d % 3) as usize],
            1200 + d * 37 % 500,
            80 + d * 13 % 40
        ));
    }
    t.push_str("\nAll regions stayed within the objective.\n");
    t
}

const CODE: &str = r#"Here is the fix, in Rust and in Ruby:

```rust
impl Drop for Pool {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            if let Some(handle) = worker.handle.take() {
                if handle.join().is_err() {
                    eprintln!("worker {} panicked", worker.id);
                }
            }
        }
    }
}

fn main() {
    let pool = Pool::new(4);
    for job in jobs() {
        pool.run(move || {
            job.execute();
        });
    }
}
```

```ruby
module Billing
  class Invoice
    def total
      lines.sum do |line|
        if line.discounted?
          line.amount * (1 - line.discount)
        else
          line.amount
        end
      end
    end
  end
end
```
"#;

const NUMBERED: &str = "To deploy the filter:\n\n1. Build the module with `make build`.\n2. Copy `loopguard.wasm` to every Envoy host.\n3. Add the filter to the HTTP connection manager.\n4. Point `vm_config.code` at the module's path.\n5. Set the policy's window to sixty seconds.\n6. Restart Envoy and watch the admin page.\n7. Send five identical requests with curl.\n8. Check that the fifth one gets a 429.\n9. Read the metrics under `loopguard.`.\n10. Roll it out to the remaining clusters.\n11. Tell the agent teams what the 429 means.\n12. Review the blocked fingerprints after a week.\n";

const POEM: &str = "The servers hum beneath the floor,\nthe logs roll on forevermore.\nA single request, sent once, sent twice,\nthe gateway counts and rolls the dice.\n\nOh, loop no more, my weary friend,\nthe window closes in the end,\nthe tokens saved, the budget whole,\nthe guard stands watch upon its post.\nOh, loop no more, my weary friend,\nthe window closes in the end,\nthe tokens saved, the budget whole,\nthe guard stands watch upon its post.\n\nAnd when the night is calm and still,\nthe agents rest against their will.\n";

fn json_array() -> String {
    let mut j = String::from("```json\n[\n");
    let names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
    for i in 0..24 {
        j.push_str(&format!(
            "  {{\n    \"id\": {},\n    \"name\": \"{}-{i}\",\n    \"status\": \"active\",\n    \"region\": \"eu-west-1\",\n    \"tags\": [\"prod\", \"billing\"]\n  }}{}\n",
            1000 + i,
            names[i % names.len()],
            if i == 23 { "" } else { "," }
        ));
    }
    j.push_str("]\n```\n");
    j
}

fn healthy() -> Vec<(&'static str, String)> {
    vec![
        ("markdown table", markdown_table()),
        ("code", CODE.to_string()),
        ("numbered list", NUMBERED.to_string()),
        ("poem with a refrain sung twice", POEM.to_string()),
        ("json array", json_array()),
        ("essay", essay(3000, 0x9e37_79b9_7f4a_7c15)),
    ]
}

#[test]
fn healthy_outputs_are_not_flagged() {
    for (name, text) in healthy() {
        assert_eq!(scan(&text), None, "{name}");
    }
}

#[test]
fn the_fixtures_are_repetitive_enough_to_matter() {
    // Each healthy fixture is caught by a looser watch: the defaults (and
    // not the fixture's shape) are what keeps it unflagged.
    let loose = |s: RepeatSettings, text: &str| RepeatWatch::new(s).feed_text(text);
    let d = RepeatSettings::default();
    // The refrain twice: caught when two repeats are enough.
    assert!(loose(RepeatSettings { repeats: 2, ..d }, POEM).is_some());
    // Closing braces and `end`s: caught when any unit and letters do.
    let short = RepeatSettings {
        min_unit_chars: 1,
        min_total_chars: 1,
        min_distinct_letters: 0,
        repeats: 3,
        ..d
    };
    assert!(loose(short, CODE).is_some());
    // Table rows and JSON objects are only different in their values:
    // a watch that ignored digits would flag them.
    let no_digits = |t: &str| t.replace(|c: char| c.is_ascii_digit(), "0");
    assert!(scan(&no_digits(&markdown_table())).is_some());
    let same_names: String = no_digits(&json_array())
        .lines()
        .map(|l| {
            if l.contains("\"name\"") {
                "    \"name\": \"x\",\n".to_string()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert!(scan(&same_names).is_some());
}

#[test]
fn short_units_and_letterless_rows_are_not_flagged() {
    // A deeply nested JSON's closings, a Ruby file's `end`s: a unit of
    // several of them would be long enough, but it is one short line.
    assert_eq!(scan(&"}\n".repeat(300)), None);
    assert_eq!(scan(&"    end\n".repeat(100)), None);
    assert_eq!(scan(&"  },\n  {\n".repeat(100)), None);
    // A zero matrix, a table of placeholders: data, not a loop.
    let row = format!("{}0\n", "0 ".repeat(19));
    assert_eq!(scan(&row.repeat(20)), None);
    assert_eq!(scan(&"| N/A | N/A | N/A | N/A |\n".repeat(20)), None);
    // With letters, the same shapes are flagged.
    assert!(scan(&"| Pending review | Pending review |\n".repeat(20)).is_some());
}

#[test]
fn a_short_unit_is_not_flagged_as_several_of_it() {
    // Two `Thanks.` would be a 16-char unit: it is one 8-char unit.
    let text = "Thanks.\n".repeat(100);
    assert_eq!(scan(&text), None);
    let w = |min_unit_chars| {
        RepeatWatch::new(RepeatSettings {
            min_unit_chars,
            ..RepeatSettings::default()
        })
        .feed_text(&text)
    };
    assert_eq!(w(8).map(|r| r.unit_chars), Some(8));
}

#[test]
fn the_same_sentence_ten_times_is_flagged() {
    let s = "I apologize for the confusion, let me try that again. ";
    let text = format!("Sure. {}", s.repeat(10));
    let unit = s.trim().chars().count() + 1;
    let want = 200usize.div_ceil(unit).max(4) as u32;
    assert_eq!(
        scan(&text),
        Some(Repeated {
            unit_chars: unit,
            repeats: want,
            covered_chars: unit * want as usize,
        })
    );
}

#[test]
fn a_block_of_three_sentences_five_times_is_flagged() {
    let block = "First we read the configuration file from disk. Then we validate every policy it declares! Why does the third one fail again? ";
    let text = format!("Let me walk through it.\n{}", block.repeat(5));
    let found = scan(&text).expect("flagged");
    assert_eq!(found.unit_chars, block.trim().chars().count() + 1);
    assert_eq!(found.repeats, 4);
    // Four repeats are not enough if they do not reach the total.
    let short = "Is it there yet? No, not yet. Wait a bit! ";
    assert_eq!(scan(&short.repeat(4)), None);
    assert!(scan(&short.repeat(6)).is_some());
}

#[test]
fn whitespace_does_not_hide_a_repeat() {
    let variants = [
        "The build is green and all the tests pass now.\n",
        "  The build  is green and all the tests pass now.  \n",
        "\tThe build is green\tand all the tests   pass now.\r\n",
        "The build is green and all the tests pass now.\n\n",
    ];
    let text: String = (0..12).map(|i| variants[i % variants.len()]).collect();
    let found = scan(&text).expect("flagged");
    assert_eq!(found.unit_chars, variants[0].trim().chars().count() + 1);
}

#[test]
fn numbering_does_not_hide_a_repeat() {
    let text: String = (1..=10)
        .map(|i| format!("{i}. Check the logs of the payment service.\n"))
        .collect();
    assert!(scan(&text).is_some());
}

#[test]
fn a_long_line_is_cut_the_same_way_each_time() {
    let line: String = (0..300)
        .map(|i| format!("{}{i} ", ["alpha", "bravo", "charlie", "delta"][i % 4]))
        .collect();
    assert!(line.len() > 1024);
    let found = scan(&format!("{line}\n").repeat(4)).expect("flagged");
    assert_eq!(found.repeats, 4);
    // Three segments, each with its break; a space at a cut is dropped.
    let chars = line.trim().chars().count();
    assert!(line.len() > 2048 && line.len() < 3072);
    assert!(
        (chars + 1..=chars + 3).contains(&found.unit_chars),
        "{found:?}"
    );
}

#[test]
fn cjk_sentences_are_segmented() {
    let s = "我们需要重新检查一下这个配置文件的内容。";
    assert!(scan(&s.repeat(40)).is_some());
    assert_eq!(scan("我们需要重新检查配置文件。然后再试一次！"), None);
}

#[test]
fn it_reports_once() {
    let s = "Let me check the deployment status for you right now. ";
    let mut w = RepeatWatch::new(RepeatSettings::default());
    assert!(!w.reported());
    let mut reports = 0;
    for _ in 0..50 {
        reports += usize::from(w.feed_text(s).is_some());
    }
    assert_eq!(reports, 1);
    assert!(w.reported());
    let event = br#"{"type":"response.output_text.delta","delta":"Let me check. "}"#;
    assert_eq!(w.feed_data(event), None);
}

#[test]
fn memory_stays_bounded() {
    let mut w = RepeatWatch::new(RepeatSettings::default());
    let start = w.kept_bytes();
    assert!(start < 4096, "{start}");
    let mut fed = 0;
    let mut i = 0u64;
    while fed < 10 << 20 {
        // Non-repeating text: numbered sentences, and now and then a long
        // run with no break at all.
        let chunk = if i.is_multiple_of(50) {
            let words: String = (0..800).map(|k| format!("r{i}w{k} ")).collect();
            words + "\n"
        } else {
            format!("Sentence {i} of the report is about item {}. ", i * 7919)
        };
        fed += chunk.len();
        assert_eq!(w.feed_text(&chunk), None);
        i += 1;
    }
    assert_eq!(w.kept_bytes(), start);
}

#[test]
fn settings_out_of_range_are_raised() {
    let s = "This sentence keeps coming back again and again. ";
    let mut w = RepeatWatch::new(RepeatSettings {
        repeats: 0,
        max_period: 0,
        history: 0,
        ..RepeatSettings::default()
    });
    assert!(w.feed_text(&s.repeat(10)).is_some());
    let mut w = RepeatWatch::new(RepeatSettings {
        max_segment_bytes: 0,
        ..RepeatSettings::default()
    });
    assert_eq!(w.feed_text(&essay(100, 3)), None);
    assert_eq!(w.feed_text("é😀é😀"), None);
}

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
