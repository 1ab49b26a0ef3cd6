//! Tool loops judged with results, cycles and repeated answers: the
//! progress a conversation makes is told from a loop.

use super::tests::{cfg, judge_body};
use super::*;
use crate::config::Config;
use crate::request::llm;
use crate::request::llm::ResultAt;
use serde_json::{json, Value};

/// An OpenAI chat history of (tool, arguments, result) calls, one per turn.
pub(super) fn chat(calls: &[(&str, &str, &str)]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "Fix the failing test"})];
    for (i, (name, args, result)) in calls.iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": args}}]}));
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

fn judged(c: &ToolLoops, body: &Value) -> Option<ToolVerdict> {
    let path = if body.get("system").is_some() {
        "/v1/messages"
    } else if body.get("input").is_some() {
        "/v1/responses"
    } else {
        "/v1/chat/completions"
    };
    judge_body(c, body, path)
}

const TESTS: (&str, &str) = ("run_tests", "{\"path\":\"tests\"}");

#[test]
fn identical_calls_answered_differently_are_progress() {
    let c = cfg(json!({}));
    // Tests rerun after edits: fail, fail differently, pass.
    let progress = chat(&[
        (TESTS.0, TESTS.1, "FAILED test_a - AssertionError: 3 != 4"),
        (TESTS.0, TESTS.1, "FAILED test_b - KeyError: 'notes'"),
        (TESTS.0, TESTS.1, "12 passed in 0.41s"),
    ]);
    assert_eq!(judged(&c, &progress), None);
    // The same failure every time, latencies and timestamps aside.
    let stuck = chat(&[
        (
            TESTS.0,
            TESTS.1,
            "Error 503 at 2026-11-23T13:40:01Z after 1843 ms, attempt 1",
        ),
        (
            TESTS.0,
            TESTS.1,
            "Error 503 at 2026-11-23T13:40:09Z after 2210 ms, attempt 2",
        ),
        (
            TESTS.0,
            TESTS.1,
            "Error 503 at 2026-11-23T13:40:17Z after 1977 ms, attempt 3",
        ),
    ]);
    let v = judged(&c, &stuck).unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
    // Two of three answered alike: not yet.
    let two = chat(&[
        (TESTS.0, TESTS.1, "8 passed in 0.41s"),
        (TESTS.0, TESTS.1, "FAILED test_multiline - AssertionError"),
        (TESTS.0, TESTS.1, "9 passed in 0.40s"),
    ]);
    assert_eq!(judged(&c, &two), None);
}

#[test]
fn pattern_thrash_needs_the_same_answer_to_varied_arguments() {
    let c = cfg(json!({}));
    let search = |q: &str| ("search_kb", format!("{{\"query\":\"{q}\"}}"));
    let queries = [
        "refund policy",
        "Refund policy ",
        "refund  policies",
        "refund policy?",
    ];
    // The same empty answer, each with a fresh search id and timing.
    let stuck: Vec<(String, String, String)> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let (n, a) = search(q);
            (n.to_string(), a, format!("{{\"hits\":[],\"search_id\":\"req_{i}x7Kd92mQ0pLz\",\"at\":\"2026-11-23T13:4{i}:00Z\"}}"))
        })
        .collect();
    let refs: Vec<(&str, &str, &str)> = stuck
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    let v = judged(&c, &chat(&refs)).unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Pattern, 4));
    // Pages that advance, amounts that change the answer: progress.
    let pages = chat(&[
        (
            "list_orders",
            "{\"cursor\":null}",
            "{\"items\":[\"ord_1\",\"ord_2\"],\"next\":\"c1\"}",
        ),
        (
            "list_orders",
            "{\"cursor\":\"c1\"}",
            "{\"items\":[\"ord_3\",\"ord_4\"],\"next\":\"c2\"}",
        ),
        (
            "list_orders",
            "{\"cursor\":\"c2\"}",
            "{\"items\":[\"ord_5\",\"ord_6\"],\"next\":\"c3\"}",
        ),
        (
            "list_orders",
            "{\"cursor\":\"c3\"}",
            "{\"items\":[\"ord_7\"],\"next\":null}",
        ),
    ]);
    assert_eq!(judged(&c, &pages), None);
    let conversions = chat(&[
        ("convert", "{\"amount\":1000}", "{\"usd\":1084.2}"),
        ("convert", "{\"amount\":1037}", "{\"usd\":1124.32}"),
        ("convert", "{\"amount\":1500}", "{\"usd\":1626.3}"),
        ("convert", "{\"amount\":250}", "{\"usd\":271.05}"),
    ]);
    assert_eq!(judged(&c, &conversions), None);
}

#[test]
fn cycles_of_two_and_three_calls_climb_the_ladder() {
    let c = cfg(json!({}));
    let lint = (
        "run_linter",
        "{\"path\":\"api.py\"}",
        "api.py:88: B006 mutable default",
    );
    let fmt = (
        "apply_formatter",
        "{\"path\":\"api.py\"}",
        "1 file left unchanged.",
    );
    let cycle = |n: usize| -> Vec<(&str, &str, &str)> {
        (0..n)
            .map(|i| if i % 2 == 0 { lint } else { fmt })
            .collect()
    };
    assert_eq!(judged(&c, &chat(&cycle(4))), None);
    // Third repetition of (lint, format): identical thrash of the linter
    // fires as well at level 1; the cycle keeps climbing from there.
    let levels: Vec<(Tier, u32)> = [6, 8, 10]
        .iter()
        .map(|&n| {
            let v = judged(&c, &chat(&cycle(n))).unwrap();
            (v.tier, v.level)
        })
        .collect();
    assert_eq!(levels[0].1, 1);
    assert_eq!(levels[1], (Tier::Cycle, 2));
    assert_eq!(levels[2], (Tier::Cycle, 3));
    let v = judged(&c, &chat(&cycle(8))).unwrap();
    assert_eq!(v.evidence.tool, "run_linter+apply_formatter");
    assert_eq!(
        header_value(&v),
        "cycle;tool=run_linter+apply_formatter;level=2"
    );
    assert!(nudge_text(&v).contains("`run_linter` → `apply_formatter`"));
    // A, B, C three times.
    let read = (
        "read_file",
        "{\"path\":\"cart.py\"}",
        "def total(items): ...",
    );
    let edit = (
        "edit_file",
        "{\"path\":\"cart.py\",\"new\":\"round(x, 2)\"}",
        "ok: 1 replacement",
    );
    let test = ("run_tests", "{}", "FAILED test_total: 10.1 != 10.10");
    let abc: Vec<_> = (0..9).map(|i| [read, edit, test][i % 3]).collect();
    let v = judged(&c, &chat(&abc)).unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Cycle, 3));
    // Off with cycle_min 0 (the identical tier alone sees 2 of each).
    assert_eq!(judged(&cfg(json!({"cycle_min": 0})), &chat(&abc)), None);
    // The same cycle whose answers change is progress.
    let moving: Vec<(&str, &str, &str)> = vec![
        read,
        edit,
        ("run_tests", "{}", "3 failed"),
        read,
        edit,
        ("run_tests", "{}", "2 failed"),
        read,
        edit,
        ("run_tests", "{}", "all passed"),
    ];
    assert_eq!(judged(&c, &chat(&moving)), None);
}

/// A chat of user messages and the model's text answers.
fn answers(turns: &[(&str, &str)]) -> Value {
    let mut messages = vec![json!({"role": "system", "content": "You help."})];
    for (user, answer) in turns {
        messages.push(json!({"role": "user", "content": user}));
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    messages.push(json!({"role": "user", "content": "try again"}));
    json!({"model": "gpt-4o", "messages": messages})
}

const HAIKU: &str =
    "Autumn rain falls soft\nOn a roof of old gray slate\nLeaves drift down the lane";

#[test]
fn a_model_rephrasing_the_same_answer_is_an_answer_loop() {
    let c = cfg(json!({}));
    let a1 = format!("Sorry about that! Here's a version without the letter e:\n\n{HAIKU}");
    let a2 = format!("You're right, sorry! Here is one that avoids the letter e:\n\n{HAIKU}");
    let a3 = format!("I apologize! This one has no letter e at all:\n\n{HAIKU}");
    let a4 = format!("My mistake. A haiku without any e:\n\n{HAIKU}");
    let turns = [
        (
            "Write a haiku about autumn rain without the letter e.",
            a1.as_str(),
        ),
        ("That has an e.", a2.as_str()),
    ];
    assert_eq!(judged(&c, &answers(&turns)), None);
    let three = [turns[0], turns[1], ("Still has an e.", a3.as_str())];
    let v = judged(&c, &answers(&three)).unwrap();
    assert_eq!((v.tier, v.occurrences, v.level), (Tier::Answer, 3, 1));
    assert_eq!(header_value(&v), "answer;level=1");
    assert!(nudge_text(&v).contains("last 3 answers"));
    let four = [three[0], three[1], three[2], ("no e please", a4.as_str())];
    assert_eq!(judged(&c, &answers(&four)).unwrap().level, 2);
    // Off with answer_min 0.
    assert_eq!(
        judged(&cfg(json!({"answer_min": 0})), &answers(&three)),
        None
    );
}

#[test]
fn revising_a_text_turn_by_turn_is_not_an_answer_loop() {
    let c = cfg(json!({}));
    let v1 = "Subject: Q4 planning\n\nHi all,\n\nLet's meet on Tuesday at 10:00 to plan Q4. Please bring your top three priorities and any open risks. The meeting will take about an hour.\n\nThanks!\nJordan";
    let v2 = v1.replace("Tuesday", "Wednesday");
    let v3 = v2
        .replace("Hi all,", "Dear colleagues,")
        .replace("Let's meet", "I would like to invite you to meet")
        .replace("Thanks!", "Kind regards,");
    let v4 = v3.replace(" The meeting will take about an hour.", "");
    let v5 = v4.replace("Jordan", "Maria");
    let turns = [
        ("Draft an invitation to the Q4 planning meeting.", v1),
        ("Change Tuesday to Wednesday.", v2.as_str()),
        ("Make it more formal.", v3.as_str()),
        ("Drop the sentence about the duration.", v4.as_str()),
        ("Sign it from Maria.", v5.as_str()),
    ];
    for n in 3..=turns.len() {
        assert_eq!(
            judged(&c, &answers(&turns[..n])),
            None,
            "after {n} versions"
        );
    }
    // Short replies repeat legitimately.
    let short = [
        ("Convert 1000 EUR", "1000 EUR is 1084.20 USD."),
        ("And 1037?", "1037 EUR is 1124.32 USD."),
        ("And 1500?", "1500 EUR is 1626.30 USD."),
    ];
    assert_eq!(judged(&c, &answers(&short)), None);
    // A model that moved on to a tool call is not looping in text.
    let mut body = answers(&[
        ("q", &format!("Sorry! {HAIKU}")),
        ("q", &format!("Oops! {HAIKU}")),
        ("q", &format!("Sorry again! {HAIKU}")),
    ]);
    let msgs = body["messages"].as_array_mut().unwrap();
    msgs.pop();
    msgs.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "count_letters", "arguments": "{}"}}]}));
    msgs.push(json!({"role": "tool", "tool_call_id": "c", "content": "3"}));
    assert_eq!(judged(&c, &body), None);
}

#[test]
fn anthropic_and_responses_answers_are_read_too() {
    let c = cfg(json!({}));
    let a = |p: &str| {
        format!("{p} Here is the JSON only: ```json\n{{\"name\": \"Tomasz Wojcik\", \"email\": \"tomasz@example.com\"}}\n```")
    };
    let anthropic = json!({"model": "claude", "max_tokens": 100, "system": "Extract.", "messages": [
        {"role": "user", "content": "Extract name and email."},
        {"role": "assistant", "content": [{"type": "text", "text": a("Sure.")}]},
        {"role": "user", "content": "Not valid JSON. JSON only."},
        {"role": "assistant", "content": [{"type": "text", "text": a("My apologies.")}]},
        {"role": "user", "content": "Not valid JSON. JSON only."},
        {"role": "assistant", "content": a("Sorry for that.")},
        {"role": "user", "content": "Not valid JSON. JSON only."}]});
    assert_eq!(judged(&c, &anthropic).unwrap().tier, Tier::Answer);
    let responses = json!({"model": "gpt-4.1", "input": [
        {"role": "user", "content": "Extract name and email."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": a("Sure.")}]},
        {"role": "user", "content": "Not valid JSON. JSON only."},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": a("My apologies.")}]},
        {"role": "user", "content": "Not valid JSON. JSON only."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": a("Sorry for that.")}]},
        {"role": "user", "content": "Not valid JSON. JSON only."}]});
    assert_eq!(judged(&c, &responses).unwrap().tier, Tier::Answer);
}

#[test]
fn a_turn_of_only_exempt_calls_is_polling() {
    let c = cfg(json!({"exempt_tools": ["poll_job_status"]}));
    let history = |calls: &[(&str, &str, &str)]| {
        let bytes = chat(calls).to_string().into_bytes();
        let req = llm::parse(&bytes, "/v1/chat/completions", usize::MAX).unwrap();
        only_exempt_calls(&c, &req.tool_history(None))
    };
    assert!(history(&[("poll_job_status", "{}", "running 40%")]));
    assert!(!history(&[
        ("poll_job_status", "{}", "done"),
        ("read_file", "{}", "x")
    ]));
    assert!(!history(&[]));
}

#[test]
fn masked_arguments_are_an_opt_in() {
    let since = |t: &str| {
        (
            "get_events",
            format!("{{\"since\":\"{t}\"}}"),
            "[]".to_string(),
        )
    };
    let calls: Vec<_> = [
        "2026-11-23T13:40:01Z",
        "2026-11-23T13:40:09Z",
        "2026-11-23T13:40:17Z",
    ]
    .iter()
    .map(|t| since(t))
    .collect();
    let refs: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(a, b, c)| (*a, b.as_str(), c.as_str()))
        .collect();
    let body = chat(&refs);
    // By default the arguments differ (three distinct calls answered alike,
    // under pattern_min).
    assert_eq!(judged(&cfg(json!({})), &body), None);
    let policy = Config::from_value(&json!({"policies": [{"id": "p", "spec": {"selector": {},
        "tool_loops": {"enabled": true}, "volatile": {"tool_arguments": true}}}]}))
    .unwrap();
    let c = policy.policies[0].tool_loops.clone().unwrap();
    let v = judged(&c, &body).unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
    assert_eq!(
        v.evidence.arguments.as_deref(),
        Some("{\"since\":\"<datetime>\"}")
    );
}

/// The stuck export of `identical_calls_answered_differently_are_progress`,
/// its results drifting only in masked tokens.
fn stuck_export() -> Value {
    chat(&[
        (
            TESTS.0,
            TESTS.1,
            "Error 503 at 2026-11-23T13:40:01Z after 1843 ms",
        ),
        (
            TESTS.0,
            TESTS.1,
            "Error 503 at 2026-11-23T13:40:09Z after 2210 ms",
        ),
        (
            TESTS.0,
            TESTS.1,
            "Error 503 at 2026-11-23T13:40:17Z after 1977 ms",
        ),
    ])
}

#[test]
fn results_are_compared_with_the_policys_masking() {
    let with = |volatile: Value| {
        Config::from_value(&json!({"policies": [{"id": "p", "spec": {"selector": {},
            "tool_loops": {"enabled": true}, "volatile": volatile}}]}))
        .unwrap()
        .policies[0]
            .tool_loops
            .clone()
            .unwrap()
    };
    let v = judged(&with(json!({})), &stuck_export()).unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
    // Masking off: each result differs, so each call made progress.
    assert_eq!(
        judged(&with(json!({"enabled": false})), &stuck_export()),
        None
    );
    // Dates masked, numbers not: the latencies still differ.
    assert_eq!(
        judged(&with(json!({"classes": ["datetime"]})), &stuck_export()),
        None
    );
    let v = judged(
        &with(json!({"classes": ["datetime", "tool_result_numbers"]})),
        &stuck_export(),
    );
    assert_eq!(v.map(|v| v.tier), Some(Tier::Identical));
}

/// Results the body does not let the judge read (over its budget).
struct Unreadable;

impl Results for Unreadable {
    fn result_text(&self, _: ResultAt) -> Option<String> {
        None
    }
}

#[test]
fn an_unreadable_result_is_never_a_repeat() {
    let c = cfg(json!({}));
    let bytes = stuck_export().to_string().into_bytes();
    let req = llm::parse(&bytes, "/v1/chat/completions", usize::MAX).unwrap();
    let history = req.tool_history(None);
    assert!(judge(&c, &history, &req, None).is_some());
    assert_eq!(judge(&c, &history, &Unreadable, None), None);
    // Calls without their results in the request are judged by the calls.
    let mut without = history.clone();
    for call in &mut without.calls {
        call.result = None;
    }
    let v = judge(&c, &without, &Unreadable, None).unwrap();
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
}

#[test]
fn an_epoch_the_arguments_name_tells_answers_apart() {
    // Paging through time: each call asks for another window and its
    // answer names it. Not thrash, though the rest of the answer repeats.
    let c = cfg(json!({}));
    let calls: Vec<(String, String)> = ["1732370401", "1732456801", "1732543201", "1732629601"]
        .iter()
        .map(|t| {
            (
                format!("{{\"since\":{t}}}"),
                format!("no new events since {t}"),
            )
        })
        .collect();
    let refs: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(a, r)| ("list_events", a.as_str(), r.as_str()))
        .collect();
    assert_eq!(judged(&c, &chat(&refs)), None);
    // "No new events" for each window, its epoch not echoed: a short
    // answer to another question each time, not thrash on its own.
    let quiet: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(a, _)| ("list_events", a.as_str(), "no new events"))
        .collect();
    assert_eq!(judged(&c, &chat(&quiet)), None);
    // The same failure, in full, whatever window is asked for: thrash.
    let failing = "error: the events service rejected the query because the upstream index is rebuilding; retry later or contact the platform team";
    let stuck: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(a, _)| ("list_events", a.as_str(), failing))
        .collect();
    let v = judged(&c, &chat(&stuck)).unwrap();
    assert_eq!(v.tier, Tier::Pattern);
}
