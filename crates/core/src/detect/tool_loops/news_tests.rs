//! Repeated calls whose results differ only by what the repetition
//! produces (an edit's block once more, a count that grows by the same
//! step, a shell's own line counter) are repeats; a result with anything
//! new (the next page, a poll's uneven progress) is progress.

use super::tests::{cfg, judge_body};
use super::*;
use crate::config::ToolStep;
use serde_json::json;

const CHAT: &str = "/v1/chat/completions";

/// A SWE-agent-style run: each reply a narration and a fenced command,
/// each observation a user message.
fn run(turns: &[(String, String)]) -> serde_json::Value {
    super::trying_tests::narrated("We need to insert the method again.", turns)
}

const BLOCK: [&str; 3] = [
    "    def total(self):",
    "        return round(sum(self.items), 2)",
    "",
];

/// The file view after the block was inserted at line 10 `times` times:
/// the count grows by 3 each time, the lines below shift.
fn view(times: usize) -> String {
    let mut lines = vec![format!(
        "[File: /repo/cart.py ({} lines total)]",
        40 + 3 * times
    )];
    let mut body: Vec<String> = (1..10).map(|i| format!("    x{i} = {i}")).collect();
    for _ in 0..times {
        body.extend(BLOCK.iter().map(|s| s.to_string()));
    }
    body.push("class Item:".to_string());
    for (i, l) in body.iter().enumerate().take(30) {
        lines.push(format!("{}:{l}", i + 1));
    }
    lines.push(format!("({} more lines below)", 40 + 3 * times - 30));
    lines.join("\n")
}

fn edit() -> String {
    format!("edit 10:10\n{}\nend_of_edit", BLOCK.join("\n"))
}

#[test]
fn an_edit_that_only_grows_the_file_is_repeated() {
    let c = cfg(json!({}));
    let turns: Vec<(String, String)> = (1..=3).map(|k| (edit(), view(k))).collect();
    let v = judge_body(&c, &run(&turns), CHAT).expect("a repeated edit");
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
    // Two of them are not yet a loop.
    assert_eq!(judge_body(&c, &run(&turns[..2]), CHAT), None);
}

#[test]
fn an_edit_and_a_test_in_turn_whose_edit_grows_the_file_cycle() {
    let c = cfg(json!({}));
    // The test's traceback points into the file, below the insertions:
    // its line number moves with them.
    let fail = |k: usize| {
        format!("Traceback (most recent call last):\n  File \"/repo/cart.py\", line {}, in total\nAssertionError: 10.1 != 10.10", 20 + 3 * k)
    };
    let mut turns = Vec::new();
    for k in 1..=3 {
        turns.push((edit(), view(k)));
        turns.push(("python reproduce.py".to_string(), fail(k)));
    }
    let v = judge_body(&c, &run(&turns), CHAT).expect("a cycle");
    assert!(matches!(v.tier, Tier::Cycle | Tier::Identical), "{v:?}");
    assert!(v.occurrences >= 3);
}

#[test]
fn a_shell_counter_that_moves_by_the_same_step_is_noise() {
    let c = cfg(json!({}));
    let turns: Vec<(String, String)> = [327, 342, 357]
        .iter()
        .map(|n| {
            (
                "cd.. ls -F".to_string(),
                format!("/bin/bash: line {n}: cd..: command not found\n\n(Current directory: /dvc/temp)\nbash-$"),
            )
        })
        .collect();
    let v = judge_body(&c, &run(&turns), CHAT).expect("a repeated command");
    assert_eq!((v.tier, v.occurrences), (Tier::Identical, 3));
}

#[test]
fn scrolling_to_new_text_is_progress() {
    let c = cfg(json!({}));
    let page = |k: usize| {
        let mut l = vec![
            format!("[File: /repo/big.py (2000 lines total)]"),
            format!("({} more lines above)", 100 * k),
        ];
        for i in 0..100 {
            l.push(format!(
                "{}:    value_{} = compute({})",
                100 * k + i + 1,
                100 * k + i,
                i
            ));
        }
        l.join("\n")
    };
    // Seven pages: the same narration every turn is the same turn again
    // only from the eighth (see the test of `turn_min` below).
    let turns: Vec<(String, String)> = (0..7)
        .map(|k| ("scroll_down".to_string(), page(k)))
        .collect();
    assert_eq!(judge_body(&c, &run(&turns), CHAT), None);
}

#[test]
fn a_poll_whose_progress_moves_unevenly_is_progress() {
    let c = cfg(json!({}));
    let turns: Vec<(String, String)> = [12, 31, 47, 52, 78, 90]
        .iter()
        .map(|p| {
            (
                "gh run view 4242".to_string(),
                format!("Build 4242: in_progress\nProgress: {p}%\nStep: compile"),
            )
        })
        .collect();
    assert_eq!(judge_body(&c, &run(&turns), CHAT), None);
    // A poll that says the same every time repeats.
    let stuck: Vec<(String, String)> = (0..3)
        .map(|_| {
            (
                "gh run view 4242".to_string(),
                "Build 4242: queued\nProgress: 0%".to_string(),
            )
        })
        .collect();
    assert!(judge_body(&c, &run(&stuck), CHAT).is_some());
}

#[test]
fn native_tool_calls_are_judged_alike() {
    let c = cfg(json!({}));
    let args = json!({"command": "insert", "path": "/repo/cart.py", "insert_line": 10,
                      "new_str": BLOCK.join("\n")})
    .to_string();
    let mut messages = vec![json!({"role": "user", "content": "Fix the cart total."})];
    for k in 1..=3 {
        let id = format!("call_{k}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "str_replace_editor", "arguments": args}}]}));
        let shown = view(k).replace(':', "\t");
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": shown}));
    }
    let body = json!({"model": "gpt-4o", "messages": messages});
    let v = judge_body(&c, &body, CHAT).expect("a repeated insert");
    assert_eq!(
        (v.tier, v.evidence.tool.as_str(), v.occurrences),
        (Tier::Identical, "str_replace_editor", 3)
    );
}

#[test]
fn a_batch_job_whose_counts_move_evenly_is_progress() {
    let c = cfg(json!({}));
    let args = json!({"queue": "dead-letter.payments", "max": 200}).to_string();
    let mut messages = vec![json!({"role": "user", "content": "Drain the dead-letter queue."})];
    for k in 0..6 {
        let id = format!("call_{k}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "drain_queue_batch", "arguments": args}}]}));
        let left = 2000 - 200 * (k + 1);
        messages.push(json!({"role": "tool", "tool_call_id": id,
            "content": format!("replayed 200 messages from dead-letter.payments · {left} left in queue · batch {}", k + 1)}));
    }
    let body = json!({"model": "gpt-4o", "messages": messages});
    assert_eq!(judge_body(&c, &body, CHAT), None);
}

/// A SWE-agent run scrolling a long file: each page new, the narration
/// `narration(k)` at turn k.
fn scrolling(pages: usize, narration: &dyn Fn(usize) -> String) -> serde_json::Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are an autonomous programmer."}),
        json!({"role": "user", "content": "Find where the cart total is rounded."}),
    ];
    for k in 0..pages {
        messages.push(json!({"role": "assistant",
            "content": format!("{}\n\n```\nscroll_down\n```\n", narration(k))}));
        let lines: Vec<String> = (0..100)
            .map(|i| {
                format!(
                    "{}:    step_{k}_{i} = handler_{k}(record_{i})",
                    100 * k + i + 1
                )
            })
            .collect();
        messages.push(json!({"role": "user", "content": lines.join("\n")}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

#[test]
fn the_same_reply_and_call_eight_times_is_a_loop_whatever_they_return() {
    let c = cfg(json!({}));
    let same = |_: usize| {
        "We still have not found the rounding; let us scroll down further to find it.".to_string()
    };
    // Seven times: reading on, left alone.
    assert_eq!(judge_body(&c, &scrolling(7, &same), CHAT), None);
    let v = judge_body(&c, &scrolling(8, &same), CHAT).expect("the same turn eight times");
    assert_eq!(
        (v.tier, v.evidence.tool.as_str(), v.occurrences, v.level),
        (Tier::Turn, "scroll_down", 8, 1)
    );
    let v = judge_body(&c, &scrolling(10, &same), CHAT).unwrap();
    assert_eq!((v.tier, v.level, v.step), (Tier::Turn, 3, ToolStep::Reject));
    // A model that says what each page showed is reading it.
    let reading = |k: usize| {
        format!("Page {k} defines handler_{k}; the rounding is not there, so let us scroll down further.")
    };
    assert_eq!(judge_body(&c, &scrolling(12, &reading), CHAT), None);
    // Too short a reply to tell, and the rule switched off.
    let short = |_: usize| "Scrolling.".to_string();
    assert_eq!(judge_body(&c, &scrolling(12, &short), CHAT), None);
    let off = cfg(json!({"turn_min": 0}));
    assert_eq!(judge_body(&off, &scrolling(12, &same), CHAT), None);
}

#[test]
fn a_job_run_a_batch_at_a_time_says_the_same_each_time() {
    let c = cfg(json!({}));
    let args = json!({"queue": "dead-letter.payments", "max": 200}).to_string();
    let mut messages = vec![json!({"role": "user", "content": "Drain the dead-letter queue."})];
    for k in 0..11 {
        let id = format!("call_{k}");
        messages.push(json!({"role": "assistant", "content": "Replaying the next batch of dead-letter messages now.",
            "tool_calls": [{"id": id, "type": "function",
                            "function": {"name": "drain_queue_batch", "arguments": args}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id,
            "content": format!("replayed 200 messages from dead-letter.payments · {} left in queue", 2200 - 200 * (k + 1))}));
    }
    let body = json!({"model": "gpt-4o", "messages": messages});
    assert_eq!(judge_body(&c, &body, CHAT), None);
}

#[test]
fn a_list_that_shrinks_is_progress() {
    let c = cfg(json!({}));
    let mut messages =
        vec![json!({"role": "user", "content": "Wait for the nightly jobs to finish."})];
    let jobs = [
        "ingest-orders",
        "ingest-refunds",
        "rebuild-search",
        "export-ledger",
        "compact-logs",
        "vacuum-db",
    ];
    for k in 0..4 {
        let id = format!("call_{k}");
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": "list_running_jobs", "arguments": "{}"}}]}));
        let running: Vec<String> = jobs[k..].iter().map(|j| format!("{j}: running")).collect();
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": running.join("\n")}));
    }
    let body = json!({"model": "gpt-4o", "messages": messages});
    assert_eq!(judge_body(&c, &body, CHAT), None);
}

#[test]
fn a_turn_without_text_is_never_the_same_reply() {
    // Claude scrolling a page with no text beside its calls: the calls are
    // not a reply it wrote, so ten of them are not the same turn.
    let c = cfg(json!({}));
    let mut messages =
        vec![json!({"role": "user", "content": "Read the article in the open tab."})];
    for k in 0..10 {
        let id = format!("toolu_{k}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "computer",
             "input": {"action": "scroll", "coordinate": [640, 400], "scroll_direction": "down"}}]}));
        let page: Vec<String> = (0..40)
            .map(|i| format!("paragraph {k}.{i}: the expedition reached camp {i} of stage {k}"))
            .collect();
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": page.join("\n")}]}));
    }
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": messages});
    let v = judge_body(&c, &body, "/v1/messages");
    assert!(v.as_ref().is_none_or(|v| v.tier != Tier::Turn), "{v:?}");
}

#[test]
fn a_turn_that_also_polls_is_waiting() {
    // The same narration with a sleep and an exempt status poll, turn after
    // turn: waiting for a job, not the same turn again.
    let c = cfg(json!({"exempt_tools": ["poll_status"]}));
    let mut messages =
        vec![json!({"role": "user", "content": "Deploy and wait until it is live."})];
    for k in 0..10 {
        messages.push(json!({"role": "assistant",
            "content": "The rollout is still in progress, so I will wait a minute and check its status again.",
            "tool_calls": [
                {"id": format!("s{k}"), "type": "function", "function": {"name": "sleep", "arguments": "{\"seconds\":60}"}},
                {"id": format!("p{k}"), "type": "function", "function": {"name": "poll_status", "arguments": "{\"rollout\":\"web\"}"}}]}));
        messages.push(
            json!({"role": "tool", "tool_call_id": format!("s{k}"), "content": "slept 60 s"}),
        );
        messages.push(json!({"role": "tool", "tool_call_id": format!("p{k}"), "content": format!("web: {} of 12 pods ready", k + 1)}));
    }
    let body = json!({"model": "gpt-4o", "messages": messages});
    let v = judge_body(&c, &body, CHAT);
    assert!(v.as_ref().is_none_or(|v| v.tier != Tier::Turn), "{v:?}");
}
