use super::*;

pub(super) fn scan(text: &str) -> Option<Repeated> {
    RepeatWatch::new(RepeatSettings::default()).feed_text(text)
}

/// Fed in pieces of `sizes` chars (cycled; 0 counts as 1).
pub(super) fn scan_split(text: &str, sizes: &[usize]) -> Option<Repeated> {
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
pub(super) fn essay(sentences: usize, seed: u64) -> String {
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

pub(super) fn healthy() -> Vec<(&'static str, String)> {
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
