use super::noise::{names_noise, NOISE_KEYS};
use super::*;

fn tool(s: &str) -> String {
    mask(s, Classes::all(), Context::ToolResult).into_owned()
}

fn text(s: &str) -> String {
    mask(s, Classes::all(), Context::Text).into_owned()
}

#[test]
fn a_failing_tool_repeats_once_masked() {
    let a = tool("error 503 at 2026-11-23t13:40:01.123z (request id req_8f3ak29dlm01, trace 5b2c9e0f4a1d7c3b8e9f) after 1843 ms, attempt 4");
    let b = tool("error 503 at 2026-11-23t13:40:07.981z (request id req_k2l9x0pq77za, trace 0a9f8e7d6c5b4a39d2c1) after 2210 ms, attempt 5");
    assert_eq!(a, b);
    assert_eq!(
        a,
        "error # at <datetime> (request id req_<id>, trace <hex>) after # ms, attempt #"
    );
}

#[test]
fn each_class_with_examples() {
    let cases = [
        (
            "id 3f2a9c1e-7b4d-4e8a-9f01-23456789abcd done",
            "id <uuid> done",
        ),
        ("at 2026-11-23t13:40:01z", "at <datetime>"),
        ("at 2026-11-23t13:40:01.123456+01:00.", "at <datetime>."),
        ("at 2026-11-23 13:40", "at <datetime>"),
        ("at 2026-11-23t13:40:01-0500", "at <datetime>"),
        ("on 2026-11-23, twice", "on <date>, twice"),
        ("ts=1732370401 and 1732370401123", "ts=<epoch> and <epoch>"),
        ("ts 1732370401.25", "ts <epoch>"),
        ("sha 9f86d081884c7d659a2feaa0c55ad015", "sha <hex>"),
        (
            "chatcmpl-b7x9k2m4n6p8q0 and toolu_01abcdef23ghij",
            "chatcmpl-<id> and toolu_<id>",
        ),
        ("took 12.5s for 1,843 bytes", "took #s for # bytes"),
    ];
    for (input, want) in cases {
        assert_eq!(tool(input), want, "{input}");
    }
}

#[test]
fn message_text_keeps_numbers_and_bare_dates() {
    assert_eq!(text("convert 1000 eur to usd"), "convert 1000 eur to usd");
    assert_ne!(text("convert 1000 eur"), text("convert 1037 eur"));
    assert_eq!(text("sales on 2026-11-03?"), "sales on 2026-11-03?");
    // Machine-made tokens are masked in text too.
    assert_eq!(
        text("retrying request req_8f3ak29dlm01 at 2026-11-23t13:40:01z"),
        "retrying request req_<id> at <datetime>"
    );
}

#[test]
fn upper_case_is_masked_too() {
    let m = |s| mask(s, Classes::all(), Context::Arguments).into_owned();
    assert_eq!(
        m(r#"{"since":"2026-11-23T13:40:01Z","id":"3F2A9C1E-7B4D-4E8A-9F01-23456789ABCD"}"#),
        r#"{"since":"<datetime>","id":"<uuid>"}"#
    );
    assert_eq!(m("trace 9F86D081884C7D659A2FEAA0C55AD015"), "trace <hex>");
    assert_eq!(m("REQ_8F3AK29DLM01"), "REQ_<id>");
}

#[test]
fn arguments_keep_numbers() {
    let m = |s| mask(s, Classes::all(), Context::Arguments).into_owned();
    assert_eq!(
        m(r#"{"page":2,"since":"2026-11-23"}"#),
        r#"{"page":2,"since":"<date>"}"#
    );
}

#[test]
fn near_misses_are_left_alone() {
    for s in [
        "customer 4829103746",       // a 10-digit id outside the epoch range
        "get_build_status for main", // snake_case words are not ids
        "deadbeefcafebabedeadbeef",  // hex letters only
        "abc123",                    // too short
        "x-request-idabcdefghij",    // no digits after the prefix
        "8f3a9c1e",                  // short hex
        "12026-11-23",               // not a date: runs on
    ] {
        assert_eq!(text(s), s, "{s}");
    }
    assert_eq!(tool("customer 4829103746"), "customer #");
}

/// The default classes (noise numbers, not every number).
fn default_tool(s: &str) -> String {
    mask(s, Classes::defaults(), Context::ToolResult).into_owned()
}

fn default_text(s: &str) -> String {
    mask(s, Classes::defaults(), Context::Text).into_owned()
}

#[test]
fn numbers_that_carry_meaning_are_kept_noise_is_masked() {
    let cases = [
        // Progress: counts, percentages, amounts, sizes, items left.
        ("5 failed, 20 passed in 1.04s", "5 failed, 20 passed in #s"),
        (
            "=== 4 failed, 21 passed in 1.10 seconds ===",
            "=== 4 failed, 21 passed in # seconds ===",
        ),
        (
            "progress 45% (1,204 of 2,000 rows)",
            "progress 45% (1,204 of 2,000 rows)",
        ),
        ("wrote 4096 bytes to out.csv", "wrote 4096 bytes to out.csv"),
        ("remaining: 37 items", "remaining: 37 items"),
        ("total $1,843.50 due", "total $1,843.50 due"),
        ("handlers.py:88:5: b006", "handlers.py:88:5: b006"),
        (
            "http 503 service unavailable",
            "http 503 service unavailable",
        ),
        // Noise: durations and latencies, with or without a space.
        ("timed out after 30012 ms", "timed out after # ms"),
        ("elapsed 30211ms", "elapsed #ms"),
        (
            "took 2.5 sec; 120µs in the kernel",
            "took # sec; #µs in the kernel",
        ),
        ("export aborted after 10m07s", "export aborted after #"),
        ("ok  \tpkg/api\t0.012s", "ok  \tpkg/api\t#s"),
        ("连接超时（耗时 10.06 秒）", "连接超时（耗时 # 秒）"),
        ("応答まで200ミリ秒", "応答まで#ミリ秒"),
        (
            "nach 30 Sekunden abgebrochen",
            "nach # Sekunden abgebrochen",
        ),
        (
            "tiempo de espera: 12,5 segundos",
            "tiempo de espera: # segundos",
        ),
        // Times of day and written dates.
        ("nov 19 10:41:14 ci-runner-3", "nov # # ci-runner-3"),
        ("at thu, 05 nov 2026 08:16:21 gmt", "at thu, # nov # # gmt"),
        ("started 09:05", "started #"),
        // The value of a key that names a time, an attempt or an id.
        ("attempt 4 of 10", "attempt # of 10"),
        ("retry budget 4/10 used", "retry budget #/10 used"),
        (
            r#"{"took_ms": 31, "total": 0}"#,
            r#"{"took_ms": #, "total": 0}"#,
        ),
        (
            r#"{"attempt": 6, "items": 3}"#,
            r#"{"attempt": #, "items": 3}"#,
        ),
        ("buildkitd pid 2231 exited", "buildkitd pid # exited"),
        (
            "worker 31bd07aa lost its lease",
            "worker 31bd07aa lost its lease",
        ),
    ];
    for (input, want) in cases {
        assert_eq!(default_tool(input), want, "{input}");
    }
}

#[test]
fn noise_keys_are_sorted_lower_case_and_short() {
    assert!(NOISE_KEYS.windows(2).all(|w| w[0] < w[1]));
    assert!(NOISE_KEYS
        .iter()
        .all(|k| (2..=9).contains(&k.len()) && k.iter().all(u8::is_ascii_lowercase)));
    assert!(names_noise(b"Attempt") && names_noise(b"NOV") && !names_noise(b"may"));
}

#[test]
fn near_misses_of_noise_numbers_are_kept() {
    for s in [
        "16:9 aspect",       // not a time of day
        "88:50 in the log",  // hours above 23
        "5 sheep, 3 m long", // not units of time (m alone is ambiguous)
        "10m of cable",      // one part: not a compound duration
        "5 retries left",    // the count comes before the word
        "may 5 tests fail",  // may is not read as a month
        "http2 and v1.2.3",  // numbers inside words and versions
    ] {
        assert_eq!(default_tool(s), s, "{s}");
    }
}

#[test]
fn the_model_text_masks_noise_numbers_but_keeps_the_rest() {
    assert_eq!(
        default_text("retrying: the call took 1843 ms; 4 tests still fail"),
        "retrying: the call took # ms; 4 tests still fail"
    );
    assert_eq!(
        default_text("convert 1000 eur to usd"),
        "convert 1000 eur to usd"
    );
    // Arguments keep every number, even with the policy masking them.
    assert_eq!(
        mask("latency 5 ms", Classes::defaults(), Context::Arguments),
        "latency 5 ms"
    );
}

#[test]
fn every_number_is_masked_only_on_request() {
    assert!(!Classes::defaults().contains(Class::ToolResultNumbers));
    assert!(Classes::defaults().contains(Class::NoiseNumbers));
    assert_eq!(
        tool("5 failed, 20 passed in 1.04s"),
        "# failed, # passed in #s"
    );
}

#[test]
fn classes_can_be_chosen() {
    let only_uuid: Classes = [Class::Uuid].into_iter().collect();
    let s = "3f2a9c1e-7b4d-4e8a-9f01-23456789abcd at 2026-11-23t13:40:01z took 5 ms";
    assert_eq!(
        mask(s, only_uuid, Context::ToolResult),
        "<uuid> at 2026-11-23t13:40:01z took 5 ms"
    );
    assert!(matches!(
        mask(s, Classes::NONE, Context::ToolResult),
        Cow::Borrowed(_)
    ));
    assert!(matches!(
        mask("nothing volatile here", Classes::all(), Context::ToolResult),
        Cow::Borrowed(_)
    ));
    assert_eq!(Class::from_name("prefixed_id"), Some(Class::PrefixedId));
    assert_eq!(Class::from_name("nope"), None);
}

#[test]
fn non_ascii_text_is_safe() {
    assert_eq!(tool("fehler — 503 über 12 ms…"), "fehler — # über # ms…");
    assert_eq!(tool("日本 2026-11-23t13:40:01z"), "日本 <datetime>");
}

#[test]
fn epochs_only_in_tool_results_and_hex_needs_digits_and_letters() {
    // A 10-digit number a user or the model writes is a quantity or an
    // id, not a clock reading.
    assert_eq!(
        text("invoice 1732370401 is due"),
        "invoice 1732370401 is due"
    );
    assert_eq!(tool("expires 1732370401"), "expires <epoch>");
    // Sixteen digits are a number (a card, an order), sixteen letters a
    // word; a hash mixes both.
    for s in ["order 4111111111111111", "deadbeefcafebabe"] {
        assert_eq!(text(s), s, "{s}");
    }
    assert_eq!(text("commit 4111111111111111a"), "commit <hex>");
}

#[test]
fn masking_never_lengthens_text() {
    for s in ["1 2 3 4 5", "took 5 ms", "a1 b2", "2026-11-23 and 7"] {
        assert!(tool(s).len() <= s.len(), "{s}");
    }
}

#[test]
fn a_digest_is_the_masked_texts_and_keeps_what_it_is_told() {
    let a = "order 3f2a9c1e-7b4d-4e8a-9f01-23456789abcd failed at 2026-11-23t13:40:01z";
    let b = "order 0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9 failed at 2026-11-23t13:40:09z";
    let none = |_: &str| false;
    let digest = |s| masked_digest(s, Classes::all(), Context::ToolResult, &none);
    assert_eq!(digest(a), digest(b));
    assert_eq!(
        digest(a),
        masked_digest(&tool(a), Classes::NONE, Context::ToolResult, &none)
    );
    // The ids the call's arguments name are kept: two orders differ.
    let named = tokens(
        r#"{"order":"3f2a9c1e-7b4d-4e8a-9f01-23456789abcd"}"#,
        Classes::all(),
        Context::Arguments,
    );
    assert_eq!(named, ["3f2a9c1e-7b4d-4e8a-9f01-23456789abcd"]);
    let keep = |t: &str| named.iter().any(|n| n.eq_ignore_ascii_case(t));
    assert_ne!(
        masked_digest(a, Classes::all(), Context::ToolResult, &keep),
        masked_digest(b, Classes::all(), Context::ToolResult, &keep)
    );
}

#[test]
fn masking_in_place_remembers_the_word_it_overwrote() {
    // "1" becomes "#" in place; the id after it is still inside the
    // word "1xreq_...", so it is no prefixed id.
    let text = "1xreq_8f3ak29dlm01 took 5 ms";
    let mut in_place = text.to_string();
    replace(&mut in_place, Classes::all(), Context::ToolResult);
    assert_eq!(in_place, "#xreq_#f#ak#dlm# took # ms");
    assert_eq!(in_place, tool(text));
}

const PIECES: [&str; 18] = [
    "1",
    "42",
    "1,843.5",
    "2026-11-23",
    "t13:40:01z",
    "T13:40:01.123+01:00",
    " ",
    "-",
    "req_",
    "8f3ak29dlm01",
    "3f2a9c1e-7b4d-4e8a-9f01-23456789abcd",
    "9f86d081884c7d659a2feaa0c55ad015",
    "1732370401",
    "ms",
    "é",
    "x",
    "_",
    ".",
];

proptest::proptest! {
    /// Masking in place (over the text as it is read) gives what the
    /// copying mask gives, in every context.
    #[test]
    fn masking_in_place_equals_masking_by_copy(
        picks in proptest::collection::vec(0usize..PIECES.len(), 0..40),
        context in 0usize..3,
    ) {
        let text: String = picks.iter().filter_map(|&i| PIECES.get(i).copied()).collect();
        let context = [Context::Text, Context::ToolResult, Context::Arguments]
            .get(context)
            .copied()
            .unwrap_or(Context::Text);
        let copied = mask(&text, Classes::all(), context).into_owned();
        let mut in_place = text.clone();
        replace(&mut in_place, Classes::all(), context);
        proptest::prop_assert_eq!(in_place, copied);
    }
}

#[test]
fn a_harness_countdown_is_noise() {
    let cases = [
        // What agents' harnesses write every turn.
        ("you have 4 steps left.", "you have # steps left."),
        ("12 turns remaining", "# turns remaining"),
        ("(1 step left)", "(# step left)"),
        (
            "observation: 2 passed. 3 attempts remaining",
            "observation: 2 passed. # attempts remaining",
        ),
        ("only 2 tries left!", "only # tries left!"),
        (
            "you have 5 iterations left and 1 round remaining",
            "you have # iterations left and # round remaining",
        ),
        (
            "9 calls left, 30 requests remaining",
            "# calls left, # requests remaining",
        ),
        ("4 Steps LEFT", "# Steps LEFT"),
        // Other counts left are progress: kept.
        ("4 items left", "4 items left"),
        ("3 files remaining", "3 files remaining"),
        ("2 tests remaining to fix", "2 tests remaining to fix"),
        // Not a countdown as written.
        ("4 steps to go", "4 steps to go"),
        ("4 steps", "4 steps"),
        ("4 steps leftover", "4 steps leftover"),
        ("4 steps lefty", "4 steps lefty"),
        ("4  steps left", "4  steps left"),
        ("4 steps  left", "4 steps  left"),
        ("steps left: 4", "steps left: 4"),
        ("4 stepsleft", "4 stepsleft"),
    ];
    for (input, want) in cases {
        assert_eq!(default_tool(input), want, "{input}");
        // In the model's own text too.
        assert_eq!(default_text(input), want, "{input}");
    }
    // Never in arguments, and not with noise numbers switched off.
    assert_eq!(
        mask("4 steps left", Classes::defaults(), Context::Arguments),
        "4 steps left"
    );
    let no_noise: Classes = [Class::Uuid].into_iter().collect();
    assert_eq!(
        mask("4 steps left", no_noise, Context::ToolResult),
        "4 steps left"
    );
}

#[test]
fn texts_differing_only_in_a_countdown_digest_alike() {
    let none = |_: &str| false;
    let digest = |s: &str| masked_digest(s, Classes::defaults(), Context::ToolResult, &none);
    let observation = |n: u32, noun: &str| {
        format!("execution output: assertionerror: 10.1 != 10.10\nyou have {n} {noun} left and 2 chances to propose a solution.")
    };
    for noun in ["steps", "turns", "attempts", "iterations"] {
        assert_eq!(
            digest(&observation(4, noun)),
            digest(&observation(3, noun)),
            "{noun}"
        );
    }
    assert_eq!(digest("12 turns remaining"), digest("11 turns remaining"));
    // Items, files or chances left are what the task counts.
    for noun in ["items", "files", "chances"] {
        assert_ne!(
            digest(&observation(4, noun)),
            digest(&observation(3, noun)),
            "{noun}"
        );
    }
    // The rest still tells observations apart.
    assert_ne!(
        digest(&observation(4, "steps")),
        digest(&observation(4, "steps").replace("10.10", "10.2"))
    );
}

#[test]
fn a_countdown_is_masked_in_observations_not_in_what_a_user_wrote() {
    let v = Volatile::default_on();
    let mut messages = vec![
        Message {
            role: "user".into(),
            parts: vec![Part::Text("finish in 4 steps left or fewer".into())],
        },
        Message {
            role: "user".into(),
            parts: vec![Part::ToolResult {
                content: vec![Part::Text("out: 3 failed. you have 4 steps left.".into())],
                is_error: false,
            }],
        },
        Message {
            role: "assistant".into(),
            parts: vec![Part::Text("with 4 steps left i will rerun it".into())],
        },
    ];
    v.mask_messages(&mut messages);
    assert_eq!(
        messages[0].parts,
        vec![Part::Text("finish in 4 steps left or fewer".into())]
    );
    assert_eq!(
        messages[1].parts,
        vec![Part::ToolResult {
            content: vec![Part::Text("out: 3 failed. you have # steps left.".into())],
            is_error: false,
        }]
    );
    assert_eq!(
        messages[2].parts,
        vec![Part::Text("with # steps left i will rerun it".into())]
    );
}

/// The word lookup as it was (a binary search over the byte strings): the
/// packed table and the per-letter lengths answer alike.
fn names_noise_reference(word: &[u8]) -> bool {
    let len = word.len();
    if !(2..=9).contains(&len)
        || !matches!(word.first().map(u8::to_ascii_lowercase), Some(b'a'..=b'w'))
    {
        return false;
    }
    let lower: Vec<u8> = word.iter().map(u8::to_ascii_lowercase).collect();
    NOISE_KEYS.binary_search(&lower.as_slice()).is_ok()
}

#[test]
fn packed_noise_keys_answer_as_the_keys() {
    use super::noise::{pack, LENGTHS_BY_LETTER, NOISE_PACKED};
    assert!(NOISE_PACKED.windows(2).all(|w| w[0] < w[1]));
    for (k, p) in NOISE_KEYS.iter().zip(NOISE_PACKED.iter()) {
        assert_eq!(pack(k), *p);
        let letter = usize::from(k[0] - b'a');
        assert_ne!(LENGTHS_BY_LETTER[letter] >> k.len() & 1, 0);
        assert!(names_noise(k));
        assert!(names_noise(&k.to_ascii_uppercase()));
        // One letter more or less, or another last letter.
        let mut longer = k.to_vec();
        longer.push(b's');
        assert_eq!(names_noise(&longer), names_noise_reference(&longer));
        assert_eq!(
            names_noise(&k[..k.len() - 1]),
            names_noise_reference(&k[..k.len() - 1])
        );
    }
}

/// The scan as it was before words of letters only were passed over in
/// one step: the tokens it finds, in order.
fn tokens_reference(text: &str, classes: Classes, context: Context) -> Vec<(usize, usize, String)> {
    use super::noise::noise_number;
    use super::shapes::{is_alnum, number_end, token, word_end};
    let b = text.as_bytes();
    let mut out = Vec::new();
    if classes.is_empty() {
        return out;
    }
    let numbers = context == Context::ToolResult && classes.contains(Class::ToolResultNumbers);
    let noise = context != Context::Arguments && classes.contains(Class::NoiseNumbers);
    let (mut i, mut in_word, mut keyed) = (0usize, false, 0u8);
    while i < b.len() {
        let at = i;
        let c = b[at];
        if !c.is_ascii_alphanumeric() {
            i += 1;
            in_word = false;
            continue;
        }
        let found = if in_word {
            None
        } else {
            token(b, at, classes, context)
        };
        let found = found.or_else(|| {
            if numbers && c.is_ascii_digit() {
                Some((at, number_end(b, at), "#"))
            } else if noise && !in_word && c.is_ascii_digit() {
                noise_number(b, at, keyed > 0).map(|end| (at, end, "#"))
            } else {
                None
            }
        });
        match found {
            Some(t) => {
                keyed = 0;
                i = t.1.max(at + 1);
                in_word = is_alnum(b, i - 1);
                out.push((t.0, t.1, t.2.to_string()));
            }
            None if numbers => {
                i += 1;
                while b.get(i).is_some_and(u8::is_ascii_alphabetic) {
                    i += 1;
                }
                in_word = true;
            }
            None => {
                let end = if c.is_ascii_digit() {
                    word_end(b, number_end(b, at))
                } else {
                    word_end(b, at)
                };
                if noise && !in_word {
                    keyed = match b.get(at..end) {
                        Some(w) if names_noise_reference(w) => 2,
                        _ => keyed.saturating_sub(1),
                    };
                }
                i = end.max(at + 1);
                in_word = true;
            }
        }
    }
    out
}

const WORD_PIECES: [&str; 24] = [
    "1",
    "42",
    "2026-11-23",
    "t13:40:01z",
    " ",
    "-",
    "_",
    ".",
    ":",
    "req_",
    "8f3ak29dlm01",
    "3f2a9c1e-7b4d-4e8a-9f01-23456789abcd",
    "9f86d081884c7d659a2feaa0c55ad015",
    "1732370401",
    "ms",
    "attempt",
    "Nov",
    "the",
    "deadbeef",
    "abcdef",
    "steps left",
    "x",
    "é",
    "Retry",
];

proptest::proptest! {
    /// Passing a word of letters over in one step finds the tokens the
    /// byte-by-byte scan found, for every context and set of classes.
    #[test]
    fn the_scan_finds_what_it_found_before(
        picks in proptest::collection::vec(0usize..WORD_PIECES.len(), 0..40),
        context in 0usize..3,
        mask_bits in 0u32..256,
    ) {
        let text: String = picks.iter().filter_map(|&i| WORD_PIECES.get(i).copied()).collect();
        let context = [Context::Text, Context::ToolResult, Context::Arguments][context];
        for classes in [
            Classes::all(),
            Classes::defaults(),
            Classes::all().iter().enumerate().filter(|(k, _)| mask_bits >> k & 1 == 1).map(|(_, c)| c).collect(),
        ] {
            let found: Vec<(usize, usize, String)> = spans(&text, classes, context)
                .map(|(a, b, p)| (a, b, p.to_string()))
                .collect();
            proptest::prop_assert_eq!(found, tokens_reference(&text, classes, context));
        }
    }
}
