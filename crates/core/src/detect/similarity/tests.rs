use super::words::{looks_random, GOLDEN};
use super::*;

/// A tail's signature, compared by similarity (no progress made).
fn of_conversation(salt: u64, tail: &[Message]) -> Signature {
    super::of_conversation(salt, tail, false)
}

fn of_words(words: &[String]) -> Signature {
    let mut s = Sketcher::default();
    for w in words {
        s.word(w.as_bytes());
    }
    s.finish()
}

fn of_text(t: &str) -> Signature {
    let mut s = Sketcher::default();
    s.text(t);
    s.finish()
}

fn msg(role: &str, parts: Vec<Part>) -> Message {
    Message {
        role: role.into(),
        parts,
    }
}

fn text(role: &str, t: &str) -> Message {
    msg(role, vec![Part::Text(t.into())])
}

fn result(t: &str) -> Message {
    msg(
        "tool",
        vec![Part::ToolResult {
            content: vec![Part::Text(t.into())],
            is_error: false,
        }],
    )
}

fn call(name: &str, args: &str) -> Message {
    msg(
        "assistant",
        vec![Part::ToolCall {
            name: name.into(),
            arguments: args.into(),
        }],
    )
}

const FIX: &str = "i apologize for the confusion. let me try again to fix the failing unit test in parser.rs: the tokenizer must skip the trailing comma before it reads the closing bracket, so i changed the loop to peek at the next byte first";

#[test]
fn the_same_tail_is_the_same_signature() {
    assert_eq!(of_text(FIX), of_text(FIX));
    assert_eq!(of_text(FIX).similarity(&of_text(FIX)), 1.0);
    assert_eq!(of_text(FIX).matches(&of_text(FIX)), BINS as u32);
}

#[test]
fn a_rephrased_answer_is_similar_another_text_is_not() {
    let rephrased = "sorry about that confusion. let me try again: to fix the failing unit test in parser.rs the tokenizer has to skip the trailing comma before reading the closing bracket, so the loop now peeks at the next byte first";
    let other = "the quarterly revenue grew by eight percent, driven by the new subscription tier and lower churn in the enterprise segment; marketing spend stayed flat";
    let near = of_text(FIX).similarity(&of_text(rephrased));
    let far = of_text(FIX).similarity(&of_text(other));
    assert!(near > 0.45, "rephrased: {near}");
    assert!(far < 0.15, "another text: {far}");
}

#[test]
fn thresholds_are_counted_in_agreeing_bins() {
    assert_eq!(NearThreshold::from_milli(1000).min_matches, BINS as u32);
    // J = 0 still agrees on a quarter of the bins by chance.
    assert_eq!(NearThreshold::from_milli(0).min_matches, BINS as u32 / 4);
    assert_eq!(NearThreshold::from_milli(500).min_matches, 120);
    let mut last = 0;
    for s in 1..=1000 {
        let t = NearThreshold::from_milli(s).min_matches;
        assert!(t >= last);
        last = t;
    }
}

#[test]
fn the_estimate_follows_the_true_similarity() {
    // Two sets of 200 words sharing `shared`: J = shared / (400 - shared).
    for shared in [0usize, 50, 100, 133, 160, 200] {
        let a: Vec<String> = (0..200).map(|i| format!("w{i}")).collect();
        let b: Vec<String> = (0..200)
            .map(|i| {
                if i < shared {
                    format!("w{i}")
                } else {
                    format!("x{i}")
                }
            })
            .collect();
        let truth = shared as f64 / (400 - shared) as f64;
        let est = of_words(&a).similarity(&of_words(&b));
        assert!(
            (est - truth).abs() < 0.12,
            "J {truth:.2}: estimated {est:.2}"
        );
    }
}

/// Over 600 pairs of word sets (24 to 154 words, any overlap) drawn from a
/// fixed seed: the estimate has no bias, its typical error is the
/// standard error the module states (0.04 to 0.06), and it is never far
/// off.
#[test]
fn the_estimate_is_calibrated() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        seed = mix(seed.wrapping_add(GOLDEN));
        seed % n
    };
    let mut errors = Vec::new();
    for _ in 0..600 {
        let (na, nb) = (24 + next(131) as usize, 24 + next(131) as usize);
        let shared = next(na.min(nb) as u64 + 1) as usize;
        let a: Vec<String> = (0..na)
            .map(|i| {
                if i < shared {
                    format!("s{i}")
                } else {
                    format!("a{i}")
                }
            })
            .collect();
        let b: Vec<String> = (0..nb)
            .map(|i| {
                if i < shared {
                    format!("s{i}")
                } else {
                    format!("b{i}")
                }
            })
            .collect();
        let truth = shared as f64 / (na + nb - shared) as f64;
        // Another salt per pair: another draw of the hash functions.
        let mut sa = Sketcher::default();
        let mut sb = Sketcher::default();
        let salt = next(u64::MAX);
        sa.salt(salt);
        sb.salt(salt);
        for w in &a {
            sa.word(w.as_bytes());
        }
        for w in &b {
            sb.word(w.as_bytes());
        }
        errors.push(sa.finish().similarity(&sb.finish()) - truth);
    }
    let n = errors.len() as f64;
    let bias = errors.iter().sum::<f64>() / n;
    let sd = (errors.iter().map(|e| (e - bias) * (e - bias)).sum::<f64>() / n).sqrt();
    let worst = errors.iter().fold(0f64, |m, e| m.max(e.abs()));
    assert!(bias.abs() < 0.01, "bias {bias:.4}");
    assert!(sd < 0.06, "standard error {sd:.4}");
    assert!(worst < 0.2, "worst error {worst:.3}");
}

#[test]
fn bytes_and_hex_round_trip() {
    let mut s = Signature {
        anchor: 0xdead_beef,
        payload: 0x0bad_cafe,
        bins: [0; 6],
    };
    for (i, w) in s.bins.iter_mut().enumerate() {
        *w = mix(i as u64);
    }
    assert_eq!(Signature::from_bytes(&s.to_bytes()), Some(s));
    assert_eq!(Signature::from_hex(&s.hex()), Some(s));
    assert_eq!(s.hex().len(), 2 * SIGNATURE_BYTES);
}

#[test]
fn unreadable_encodings_are_refused() {
    assert_eq!(Signature::from_bytes(&[0; 12]), None);
    assert_eq!(Signature::from_hex("zz"), None);
    assert_eq!(Signature::from_hex(&"g".repeat(2 * SIGNATURE_BYTES)), None);
}

#[test]
fn numbers_left_in_results_anchor_the_signature() {
    // A coding agent's test run: the same words, other counts.
    let run = |failed: u32, passed: u32| {
        of_conversation(
            7,
            &[
                call("run_pytest", r#"{"args":"-q"}"#),
                result(&format!(
                    "collected 25 items ... {failed} failed, {passed} passed in #s"
                )),
            ],
        )
    };
    let (a, b) = (run(5, 20), run(4, 21));
    assert_ne!(a.anchor, b.anchor);
    assert!(!a.is_near(&b, NearThreshold::from_milli(100)));
    assert_eq!(a.similarity(&b), 0.0);
    // The same counts (a latency masked as `#`): a near repeat.
    assert!(a.is_near(&run(5, 20), NearThreshold::from_milli(1000)));
}

#[test]
fn calls_anchor_what_users_write_does_not() {
    let fetch = |id: &str| of_conversation(1, &[call("get_order", &format!(r#"{{"id":"{id}"}}"#))]);
    assert_ne!(fetch("7010651600").anchor, fetch("7010651601").anchor);
    // What a user wrote is compared by its words: 1000 and 1037 are two
    // words of many, not an anchor.
    let ask = |n: &str| {
        of_conversation(
            1,
            &[text(
                "user",
                &format!("please convert {n} eur to usd at today's rate, round the result to cents, and tell me which rate you used and when it was published by the bank"),
            )],
        )
    };
    assert_eq!(ask("1000").anchor, ask("1037").anchor);
    assert!(ask("1000").similarity(&ask("1037")) < 1.0);
}

#[test]
fn a_short_tail_is_near_only_to_the_same_words() {
    // A threaded conversation sends a tool's one-line result alone: a few
    // words shared say nothing about a repeat.
    let edited =
        |change: &str| of_conversation(1, &[result(&format!("edited src/parser.py: {change}"))]);
    let a = edited("parse_date: accept two-digit years");
    let b = edited("parse_amount: strip thousands separators");
    assert_ne!(a.anchor, b.anchor);
    assert!(!a.is_near(&b, NearThreshold::from_milli(100)));
    // The same words are still a repeat.
    assert!(a.is_near(
        &edited("parse_date: accept two-digit years"),
        NearThreshold::from_milli(1000)
    ));
}

#[test]
fn the_place_of_a_message_counts() {
    let a = [
        text("user", "run the linter please"),
        text("assistant", "found one error in handlers"),
    ];
    let b = [a[1].clone(), a[0].clone()];
    assert_ne!(of_conversation(0, &a), of_conversation(0, &b));
}

#[test]
fn random_tokens_fold_in_results_not_in_arguments() {
    let failed = |token: &str| {
        of_conversation(
            3,
            &[result(&format!(
                "build failed: unexpected eof (session {token})"
            ))],
        )
    };
    assert_eq!(
        failed("j#U#w#M#fHqnp#ue#RLAq"),
        failed("T#CdW#UvtQ#XJVWzdXqLP#TZC")
    );
    let get = |id: &str| of_conversation(3, &[call("get_order", &format!(r#"{{"id":"{id}"}}"#))]);
    assert_ne!(get("A7K2M9P4Q1"), get("B3N8L2W5R7"));
}

#[test]
fn the_task_is_the_first_user_message_not_the_system_prompt() {
    let opening =
        |system: &str, user: &str| opening_salt(&[text("system", system), text("user", user)]);
    // An agent that writes the time or its scratchpad into the system
    // prompt every turn is still on one task.
    assert_eq!(
        opening(
            "you are a build agent. time: 13:40. notes: tried twice",
            "fix the build"
        ),
        opening(
            "you are a build agent. time: 13:41. notes: tried three times",
            "fix the build"
        )
    );
    assert_ne!(opening("x", "fix the build"), opening("x", "fix the tests"));
    // With no user message, the prompts are the task.
    assert_ne!(
        opening_salt(&[text("system", "summarise ticket 1")]),
        opening_salt(&[text("system", "summarise ticket 2")])
    );
}

#[test]
fn an_empty_tail_has_a_stable_signature() {
    let empty = Sketcher::default().finish();
    assert_eq!(empty, Sketcher::default().finish());
    assert_eq!(empty.similarity(&empty), 1.0);
}

#[test]
fn random_looking_words() {
    for w in [
        "j9U91w8M0730fHqnp3ue9RLAq",
        "f7167b20",
        "itH0Q8K8Al1VGZmhdq_Ai0WV",
        "j#U#w#M#fHqnp#ue#RLAq",
    ] {
        assert!(looks_random(w.as_bytes()), "{w}");
    }
    for w in [
        "sha256sum",
        "base64encoded",
        "gpt4o",
        "deployment",
        "12345678",
        "x86_64",
        "f#b#",
    ] {
        assert!(!looks_random(w.as_bytes()), "{w}");
    }
}

#[test]
fn unicode_words_count() {
    assert_ne!(of_text("fehler über alles"), of_text("fehler unter alles"));
    assert_eq!(of_text("日本語 テキスト"), of_text("日本語  テキスト"));
}

#[test]
fn scripts_without_spaces_are_read_as_character_pairs() {
    // Two renderings of one apology and fix, in Japanese: one sentence
    // each, no spaces. As whole words they would share nothing.
    let a = "ご指摘ありがとうございます。失礼しました。こちらの訳はいかがでしょうか。予算管理をもっと簡単に、もっと楽しく。";
    let b = "ご指摘ありがとうございます。大変失礼しました。こちらの訳でいかがでしょうか。予算管理をもっと簡単に、楽しく。";
    let c = "会議は水曜日の午前十時からです。議題と資料は前日までに共有してください。";
    assert!(of_text(a).similarity(&of_text(b)) > 0.5);
    assert!(of_text(a).similarity(&of_text(c)) < 0.2);
    // A lone character between other text is a word of its own.
    let mut s = Sketcher::default();
    s.text("価 is one");
    assert_eq!(s.words(), 3);
}

#[test]
fn a_tail_after_progress_is_near_only_to_the_same_words() {
    let letter = |signed: &str| {
        of_conversation(
            2,
            &[text("assistant", &format!("dear colleagues, i would like to invite you to meet on wednesday at ten to plan the fourth quarter; please bring your top three priorities and any open risks, and we will meet in room four b. kind regards, {signed}"))],
        )
    };
    let exact = |signed: &str| {
        super::of_conversation(
            2,
            &[text("assistant", &format!("dear colleagues, i would like to invite you to meet on wednesday at ten to plan the fourth quarter; please bring your top three priorities and any open risks, and we will meet in room four b. kind regards, {signed}"))],
            true,
        )
    };
    // Compared by similarity, two versions of a letter are near...
    assert!(letter("jordan").is_near(&letter("maria"), NearThreshold::from_milli(350)));
    // ...but once an edit made progress, only a resend of it repeats.
    assert!(!exact("jordan").is_near(&exact("maria"), NearThreshold::from_milli(350)));
    assert_eq!(exact("maria"), exact("maria"));
}

#[test]
fn the_same_code_in_reworded_prose_is_a_repeat() {
    let answer = |prose: &str, code: &str| {
        of_conversation(
            4,
            &[
                text("user", "nope, still broken"),
                text(
                    "assistant",
                    &format!("{prose} ```{code}``` let me know if that works."),
                ),
            ],
        )
    };
    let a = answer(
        "the error means the pyyaml package is not installed in the environment you run the script with. install it with pip:",
        "bash pip install PyYAML",
    );
    let b = answer(
        "apologies for the confusion. the yaml module comes from the pyyaml distribution, which your interpreter cannot find. this should fix it:",
        "sh pip install pyyaml",
    );
    // The prose shares few words...
    assert!(a.matches(&b) < NearThreshold::from_milli(350).min_matches);
    // ...the fix is the same: near.
    assert_ne!(a.payload, 0);
    assert!(a.is_near(&b, NearThreshold::from_milli(350)));
    // Another fix is not.
    let c = answer(
        "try upgrading pip first:",
        "bash python -m pip install --upgrade pip",
    );
    assert!(!a.is_near(&c, NearThreshold::from_milli(350)));
    // Lines in another order are the same code.
    let nginx = |order: &str| {
        of_conversation(4, &[text("assistant", &format!("use a server block: ```nginx server {{ {order} return 301 https://www.example.de$request_uri; }}```"))])
    };
    assert_eq!(
        nginx("listen 80; server_name shop.example.de;").payload,
        nginx("server_name shop.example.de; listen 80;").payload
    );
    // No code, no payload.
    assert_eq!(
        of_conversation(4, &[text("assistant", "no code here at all")]).payload,
        0
    );
}

/// A user's long report (more than [`NEWS_WORDS`] words).
const REPORT: &str = "i ran the migration again after restoring last night's backup and this time it stopped at step four with a lock timeout on the orders table while the nightly export was still running";
const OTHER_REPORT: &str = "the export finished at two so i started the migration once more and it got through the orders table but now fails on the invoices table with a duplicate key on invoice number";

fn observation(t: &str) -> Message {
    // An observation a text-action agent receives: a user message read as
    // its action's result.
    msg(
        "user",
        vec![Part::ToolResult {
            content: vec![Part::Text(t.into())],
            is_error: false,
        }],
    )
}

#[test]
fn a_user_brings_news_with_a_long_new_message() {
    assert!(REPORT.split_whitespace().count() > NEWS_WORDS);
    assert!(OTHER_REPORT.split_whitespace().count() > NEWS_WORDS);
    let turn = |user: Message| vec![call("run_migration", "{}"), user];
    let said = |t: &str| turn(text("user", t));
    let cases: Vec<(&str, Vec<Message>, Vec<Message>, bool)> = vec![
        ("a long new report", said(OTHER_REPORT), said(REPORT), true),
        (
            "a long report after a complaint",
            said(REPORT),
            said("still broken"),
            true,
        ),
        (
            "a long report, nothing written before",
            said(REPORT),
            vec![call("run_migration", "{}"), result("ok")],
            true,
        ),
        ("the same report again", said(REPORT), said(REPORT), false),
        (
            "the same report, its time changed",
            said(&REPORT.replace("at step four", "at step five")),
            said(REPORT),
            false,
        ),
        (
            "a short complaint",
            said("it is still broken, you keep saying the same thing"),
            said(REPORT),
            false,
        ),
        (
            "a tool's long result",
            vec![call("run_migration", "{}"), result(OTHER_REPORT)],
            said(REPORT),
            false,
        ),
        (
            "an observation as long as a report",
            turn(observation(OTHER_REPORT)),
            turn(observation(REPORT)),
            false,
        ),
        (
            // The newest message the user wrote, the model's reply after it.
            "a report the model answered since",
            vec![
                text("user", OTHER_REPORT),
                text("assistant", "let me look at the invoices table"),
                result("ok"),
            ],
            said(REPORT),
            true,
        ),
        ("nothing at all", vec![], said(REPORT), false),
    ];
    for (what, later, earlier, news) in cases {
        assert_eq!(user_brought_news(&later, &earlier), news, "{what}");
    }
    // Exactly NEWS_WORDS words are not news; one more is.
    let words = |n: usize| {
        (0..n)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let before = said("x");
    assert!(!user_brought_news(&said(&words(NEWS_WORDS)), &before));
    assert!(user_brought_news(&said(&words(NEWS_WORDS + 1)), &before));
    // Words of other parts (a result beside the text, media) are not
    // counted: only what the user wrote.
    let mixed = msg(
        "user",
        vec![
            Part::ToolResult {
                content: vec![Part::Text(OTHER_REPORT.into())],
                is_error: false,
            },
            Part::Text("and now?".into()),
        ],
    );
    assert!(!user_brought_news(&[mixed], &before));
}

#[test]
fn a_position_salt_tells_lengths_apart() {
    let salts: std::collections::HashSet<u32> = (0..10_000).map(position_salt).collect();
    assert_eq!(salts.len(), 10_000);
    assert_eq!(position_salt(12), position_salt(12));
    assert_ne!(position_salt(12), position_salt(13));
    assert_ne!(position_salt(0), 0);
    // Salted, the same tail at two lengths has two anchors.
    let tail = [call("export_report", "{}"), result("error 503")];
    let at = |len: usize| {
        let mut s = of_conversation(1, &tail);
        s.anchor ^= position_salt(len);
        s
    };
    assert_eq!(at(7), at(7));
    assert_ne!(at(7).anchor, at(9).anchor);
    assert!(!at(7).is_near(&at(9), NearThreshold::from_milli(0)));
}
