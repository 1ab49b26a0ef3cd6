//! Loops that drift, through the whole flow: masked tails, near mode
//! (local table and Redis), polling kept out of the count.

use super::tests::{detection, Harness};
use super::*;
use crate::state::store::CallReply;
use serde_json::{json, Value};

/// An agent's chat whose tool keeps failing: `results` are the tool's
/// answers so far (the request ends with the last one).
fn failing(results: &[&str]) -> String {
    let mut messages =
        vec![json!({"role": "user", "content": "Export the monthly revenue report."})];
    for (i, r) in results.iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}x"), "type": "function", "function": {"name": "export_report", "arguments": "{\"report\":\"monthly-revenue\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{i}x"), "content": r}));
    }
    json!({"model": "gpt-4o", "messages": messages}).to_string()
}

fn policy(similarity: &str, extra: Value) -> Harness {
    let mut ld = json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": similarity});
    for (k, v) in extra.as_object().unwrap() {
        ld[k] = v.clone();
    }
    Harness::policy(detection(ld))
}

/// Statuses of the requests a failing agent sends, one more result each.
fn statuses(h: &mut Harness, results: &[&str]) -> Vec<u32> {
    (1..=results.len())
        .map(|n| {
            h.now += 1000;
            h.post(&failing(&results[..n])).status()
        })
        .collect()
}

const MASKED: [&str; 5] = [
    "Error 503 at 2026-11-23T13:40:01.123Z (request id req_8f3aK29dLm01) after 1843 ms",
    "Error 503 at 2026-11-23T13:40:09.981Z (request id req_Tutgo1eoObvK) after 2210 ms",
    "Error 503 at 2026-11-23T13:40:17.004Z (request id req_x0pdAB4vzyn9) after 1977 ms",
    "Error 503 at 2026-11-23T13:40:25.440Z (request id req_QjOj7Zjs6a9W) after 2051 ms",
    "Error 503 at 2026-11-23T13:40:33.818Z (request id req_p0Lk2Jh7Gf5D) after 1880 ms",
];

// The tail of the last 3 messages (a result, the repeated call, its result)
// first repeats in the second request: the third repeat is the fourth.

#[test]
fn llm_tail_masks_volatile_tokens_and_catches_a_failing_tool() {
    let mut h = policy("llm_tail", json!({}));
    assert_eq!(statuses(&mut h, &MASKED), vec![200, 200, 200, 429, 429]);
    // Masking off: every tail differs.
    let mut h = Harness::policy(json!({"selector": {}, "volatile": {"enabled": false},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "llm_tail"}}));
    assert_eq!(statuses(&mut h, &MASKED), vec![200; 5]);
}

/// Failures whose drift is outside every mask class: a short worker id
/// (8 hex digits; the hex class starts at 16).
const UNMASKED: [&str; 5] = [
    "Export aborted: worker c0a323f5 lost its lease on the export queue for report monthly-revenue; no rows were written and the job was returned to the queue",
    "Export aborted: worker a55c6964 lost its lease on the export queue for report monthly-revenue; no rows were written and the job was returned to the queue",
    "Export aborted: worker f7167b20 lost its lease on the export queue for report monthly-revenue; no rows were written and the job was returned to the queue",
    "Export aborted: worker eeae6e4d lost its lease on the export queue for report monthly-revenue; no rows were written and the job was returned to the queue",
    "Export aborted: worker 31bd07aa lost its lease on the export queue for report monthly-revenue; no rows were written and the job was returned to the queue",
];

/// Failures worded a little differently each time (the same error, in a
/// rotating phrasing no mask could name).
const REWORDED: [&str; 5] = [
    "Export aborted: the worker lost its lease on the export queue for report monthly-revenue; no rows were written and the job went back to the queue",
    "Export aborted: the worker lost the lease on the export queue for report monthly-revenue; no rows were written, the job went back to the queue",
    "Export failed: the worker lost its lease on the export queue for report monthly-revenue; nothing was written and the job went back to the queue",
    "Export aborted: a worker lost its lease on the export queue for report monthly-revenue; no rows were written and the job was put back in the queue",
    "Export aborted: the worker dropped its lease on the export queue for report monthly-revenue; no rows were written and the job went back to the queue",
];

#[test]
fn near_mode_counts_tails_that_share_most_of_their_words() {
    let mut exact_tail = policy("llm_tail", json!({}));
    assert_eq!(statuses(&mut exact_tail, &UNMASKED), vec![200; 5]);
    assert_eq!(statuses(&mut exact_tail, &REWORDED), vec![200; 5]);
    // The worker ids look machine-made: read as one placeholder word, the
    // tails are the same however strict the similarity.
    let mut strict = policy("near", json!({"near_similarity": 1.0}));
    assert_eq!(
        statuses(&mut strict, &UNMASKED),
        vec![200, 200, 200, 429, 429]
    );
    // Reworded results share most of their words: near at the default
    // similarity counts them; only identical tails count at 1.0.
    let mut near = policy("near", json!({}));
    assert_eq!(
        statuses(&mut near, &REWORDED),
        vec![200, 200, 200, 429, 429]
    );
    let mut strict = policy("near", json!({"near_similarity": 1.0}));
    assert_eq!(statuses(&mut strict, &REWORDED), vec![200; 5]);
}

#[test]
fn near_mode_judges_a_growing_conversation_by_its_own_turns() {
    let mut h = policy("near", json!({}));
    let body = |n: usize| failing(&MASKED[..n]);
    for n in 1..=3 {
        assert_eq!(h.post(&body(n)).status(), 200);
    }
    assert_eq!(h.post(&body(4)).status(), 429);
    // The request's own history shows its repeated turns: whoever sends
    // it, to whichever model, however long after, it is a loop.
    let mut fresh = policy("near", json!({}));
    let other = fresh.send(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-2")],
        body(4).as_bytes(),
    );
    assert_eq!(other.status(), 429);
    let other_model = body(4).replace("gpt-4o", "gpt-4.1");
    assert_eq!(fresh.post(&other_model).status(), 429);
    // Three failures in a row are not yet three repeated turns: the first
    // turn's tail holds the task.
    assert_eq!(fresh.post(&body(3)).status(), 200);
}

#[test]
fn near_mode_keeps_callers_and_models_apart_and_bounds_the_history() {
    // A conversation sent again as it is (no new turn) is counted in the
    // caller's record: per caller and model, within the window.
    let mut h = policy("near", json!({}));
    let resent = failing(&MASKED[..1]);
    for _ in 0..2 {
        assert_eq!(h.post(&resent).status(), 200);
    }
    // Another caller's third resend is its own first.
    let other = h.send(
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-2")],
        resent.as_bytes(),
    );
    assert_eq!(other.status(), 200);
    // Another model: another record.
    assert_eq!(h.post(&resent.replace("gpt-4o", "gpt-4.1")).status(), 200);
    assert_eq!(h.post(&resent).status(), 429);
    // A history of 3 hits: unrelated traffic pushes the resends out.
    let mut h = policy("near", json!({"near_history": 3}));
    for _ in 0..2 {
        assert_eq!(h.post(&resent).status(), 200);
    }
    for q in [
        "What is the capital of Peru?",
        "Translate 'good morning' to Welsh.",
        "List three prime numbers above 100.",
    ] {
        let chat = json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": q}, {"role": "assistant", "content": "Let me think."}, {"role": "user", "content": "Go on."}]});
        assert_eq!(h.post(&chat.to_string()).status(), 200);
    }
    assert_eq!(h.post(&resent).status(), 200);
}

#[test]
fn near_mode_compares_a_first_turn_exactly() {
    let mut h = policy("near", json!({"near_similarity": 0.2}));
    // A batch job's prompts: one template, different documents.
    for ticket in [
        "Printer offline.",
        "Printer offline again.",
        "printer is offline",
        "Printer offline!",
    ] {
        let body = json!({"model": "gpt-4o", "messages": [
            {"role": "user", "content": format!("Summarise the following support ticket:\n{ticket}")}]});
        assert_eq!(h.post(&body.to_string()).status(), 200, "{ticket}");
    }
    // The same prompt three times is still a repeat.
    let same = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Is the build green?"}]}).to_string();
    let codes: Vec<u32> = (0..3).map(|_| h.post(&same).status()).collect();
    assert_eq!(codes, vec![200, 200, 429]);
}

#[test]
fn a_near_cooldown_holds_the_loop_not_the_caller() {
    let mut h = policy("near", json!({"cooldown_seconds": 300}));
    assert_eq!(statuses(&mut h, &MASKED[..4]), vec![200, 200, 200, 429]);
    // Out of the window, the loop is still held...
    h.now += 120_000;
    let again = h.post(&failing(&MASKED[..5]));
    assert_eq!(again.status(), 429);
    assert!(again.json()["error"]["cooldown_seconds"].as_u64().unwrap() > 0);
    // ...while the caller's other work passes.
    let other = json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Summarise the Q3 board minutes."},
        {"role": "assistant", "content": "Here is the summary of the minutes."},
        {"role": "user", "content": "Shorter please."}]});
    assert_eq!(h.post(&other.to_string()).status(), 200);
}

#[test]
fn near_mode_through_the_shared_store() {
    let mut h = Harness::new(
        json!({"store": {"type": "redis_webdis", "cluster": "webdis"},
        "policies": [{"id": "p", "spec": detection(json!({"enabled": true, "window_seconds": 60,
            "threshold_identical_requests": 3, "similarity": "near", "near_similarity": 0.5, "near_history": 32}))}]}),
    );
    let mut s = h.post(&failing(&MASKED[..2]));
    assert_eq!(s.step, Step::Pause);
    let body = String::from_utf8(s.call().unwrap().body.clone()).unwrap();
    let parts: Vec<&str> = body.split('/').collect();
    assert_eq!(&parts[..3], &["FCALL", "loopguard_near", "3"]);
    assert!(parts[3].starts_with("lg:test:{") && parts[3].ends_with("}:n"));
    assert!(parts[4].ends_with("}:ncd") && parts[5].ends_with("}:nev"));
    // window, capacity = near_history, trip_at, cooldown, detect_at,
    // event interval, nonce, signature, the bins that must agree.
    assert_eq!(&parts[6..9], &["60000", "32", "3"]);
    assert_eq!(parts[13].len(), 112);
    assert!(parts[13].chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(parts[14], "120");
    s.step = h
        .engine
        .on_call_sent(&mut s.req, Ok(1), h.now, &mut s.effects);
    let reply = CallReply {
        status: Some("200".into()),
        body: br#"{"FCALL":[3,59000,0,0]}"#.to_vec(),
    };
    assert_eq!(h.reply(&mut s, 1, reply), Step::Pause);
    assert_eq!(s.status(), 429);
}

#[test]
fn polling_turns_are_not_counted_by_loop_detection() {
    let spec = json!({"selector": {},
        "tool_loops": {"enabled": true, "exempt_tools": ["poll_job_status"]},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "llm_tail"}});
    let mut h = Harness::policy(spec);
    let poll = |n: usize| {
        let mut messages = vec![json!({"role": "user", "content": "Wait for export job 42."})];
        for i in 0..n {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("c{i}"), "type": "function", "function": {"name": "poll_job_status", "arguments": "{\"job\":42}"}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": format!("running {}%", 10 * (i + 1))}));
        }
        json!({"model": "gpt-4o", "messages": messages}).to_string()
    };
    for n in 1..=6 {
        let s = h.post(&poll(n));
        assert_eq!(s.status(), 200, "poll {n}");
        assert_eq!(h.metric(&s.effects, "loopguard.exempted_total.policy.p"), 1);
    }
}

/// One run of a batch job: the task names a document, then the same two
/// tool calls answered the same way (the tail is identical across runs).
fn batch_run(document: &str) -> String {
    let policy_text = "Refunds are accepted within 30 days of delivery for unused items in their original packaging; shipping costs are refunded only when the item arrived damaged.";
    json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": format!("Classify support ticket {document} against the refund policy.")},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "load_policy", "arguments": "{\"name\":\"refunds\"}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": policy_text},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_b", "type": "function", "function": {"name": "load_policy", "arguments": "{\"name\":\"shipping\"}"}}]},
        {"role": "tool", "tool_call_id": "call_b", "content": policy_text},
    ]})
    .to_string()
}

#[test]
fn near_mode_tells_a_batch_from_a_task_restarted() {
    // Five tickets through the same steps: five tasks, their tails alike.
    let mut h = policy("near", json!({}));
    for ticket in ["T-1041", "T-1042", "T-1043", "T-1044", "T-1045"] {
        h.now += 1000;
        assert_eq!(h.post(&batch_run(ticket)).status(), 200, "{ticket}");
    }
    // The same ticket restarted three times is one task looping.
    let mut h = policy("near", json!({}));
    let statuses: Vec<u32> = (0..3)
        .map(|_| {
            h.now += 1000;
            h.post(&batch_run("T-1041")).status()
        })
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
}

#[test]
fn near_mode_reads_past_the_time_in_a_system_prompt() {
    // An agent that writes the current time into its system prompt every
    // turn, its tool failing the same way: one task, looping.
    let mut h = policy("near", json!({}));
    let statuses: Vec<u32> = (1..=4)
        .map(|n| {
            h.now += 1000;
            let mut chat: Value = serde_json::from_str(&failing(&MASKED[..n])).unwrap();
            let system = json!({"role": "system",
                "content": format!("You are an export agent. Current time: 2026-11-23T13:40:{:02}Z", n * 8)});
            chat["messages"].as_array_mut().unwrap().insert(0, system);
            h.post(&chat.to_string()).status()
        })
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
}

#[test]
fn near_mode_salts_with_a_user_message_after_system_and_developer_prompts() {
    // Two tickets behind the same system and developer prompts, the same
    // tools answering the same way: two tasks.
    let run = |ticket: &str| {
        let mut chat: Value = serde_json::from_str(&batch_run(ticket)).unwrap();
        let messages = chat["messages"].as_array_mut().unwrap();
        messages.insert(
            0,
            json!({"role": "developer", "content": "Answer in English."}),
        );
        messages.insert(
            0,
            json!({"role": "system", "content": "You classify support tickets."}),
        );
        chat.to_string()
    };
    let mut h = policy("near", json!({}));
    for ticket in ["T-1041", "T-1042", "T-1043", "T-1044"] {
        h.now += 1000;
        assert_eq!(h.post(&run(ticket)).status(), 200, "{ticket}");
    }
}

/// The 429's message and `repeated_turns` (OpenAI's error shape).
fn turns_rejection(s: &super::tests::Sent) -> (String, Option<u64>) {
    let e = &s.json()["error"];
    (
        e["message"].as_str().unwrap().to_string(),
        e["repeated_turns"].as_u64(),
    )
}

#[test]
fn near_mode_rejects_repeated_turns_whoever_sends_them_and_whenever() {
    let body = failing(&MASKED);
    // A day apart, three callers, fresh filters: the history alone shows
    // the last 4 turns near the newest.
    for (caller, later) in [("sk-1", 0), ("sk-2", 86_400_000), ("sk-3", 3_600_000)] {
        let mut h = policy("near", json!({}));
        h.now += later;
        let auth = format!("Bearer {caller}");
        let s = h.send(
            "POST",
            "/v1/chat/completions",
            &[("authorization", &auth)],
            body.as_bytes(),
        );
        assert_eq!(s.status(), 429, "{caller}");
        let (message, turns) = turns_rejection(&s);
        assert!(
            message
                .starts_with("Blocked: the last 4 turns of this conversation are near-identical."),
            "{message}"
        );
        assert_eq!(turns, Some(4));
        assert_eq!(s.json()["error"]["code"], "recursive_loop_detected");
        assert_eq!(s.json()["error"]["hit_count"], 4);
        // The same conversation sent again is rejected again: retry after
        // the window.
        assert_eq!(s.json()["error"]["retry_after_seconds"], 60);
    }
    // A conversation resent as it is: counted in the caller's record, its
    // rejection says so and names no turns.
    let mut h = policy("near", json!({}));
    let resent = failing(&MASKED[..1]);
    let codes: Vec<u32> = (0..3).map(|_| h.post(&resent).status()).collect();
    assert_eq!(codes, vec![200, 200, 429]);
    let s = h.post(&resent);
    let (message, turns) = turns_rejection(&s);
    assert!(
        message.starts_with("Blocked: near-identical request sent"),
        "{message}"
    );
    assert_eq!(turns, None);
}

/// A lint, format, lint, format... agent: `n` turns.
fn cycling(n: usize) -> String {
    let lint = (
        "run_linter",
        "{\"path\":\"api.py\"}",
        "api.py:88:5: B006 do not use mutable data structures for argument defaults",
    );
    let format = (
        "apply_formatter",
        "{\"path\":\"api.py\"}",
        "All done! 1 file left unchanged.",
    );
    let mut messages = vec![json!({"role": "user", "content": "Make the linter pass on api.py."})];
    for i in 0..n {
        let (name, args, result) = [lint, format][i % 2];
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("c{i}"), "type": "function", "function": {"name": name, "arguments": args}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": result}));
    }
    json!({"model": "gpt-4o", "messages": messages}).to_string()
}

#[test]
fn near_mode_counts_the_rounds_of_a_cycle() {
    let mut h = policy("near", json!({}));
    let codes: Vec<u32> = (1..=8)
        .map(|n| {
            h.now += 1000;
            h.post(&cycling(n)).status()
        })
        .collect();
    // Every other turn repeats the newest: the third round rejects.
    assert_eq!(codes, vec![200, 200, 200, 200, 200, 429, 429, 429]);
    let mut fresh = policy("near", json!({}));
    assert_eq!(turns_rejection(&fresh.post(&cycling(8))).1, Some(4));
}

const SUPPORT_ANSWER: &str = "I'm sorry the connection is still down. Please unplug the router, wait thirty seconds, plug it back in, and tell me what the status light shows.";

/// A support chat: the user's messages, the same answer to each.
fn support(users: &[&str]) -> String {
    let mut messages =
        vec![json!({"role": "system", "content": "You are the ISP's support agent."})];
    for (i, u) in users.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": SUPPORT_ANSWER}));
        }
        messages.push(json!({"role": "user", "content": u}));
    }
    json!({"model": "gpt-4o", "messages": messages}).to_string()
}

#[test]
fn near_mode_leaves_a_user_with_news_alone() {
    let reports = [
        "My internet has been down since this morning. The router is a FritzBox 7590 and the light marked Internet is blinking red while the power light is steady green.",
        "I unplugged it for a full minute as you said. After it came back the Internet light went orange for a while and now it is solid orange, and my laptop says connected, no internet.",
        "Now the DSL light is also blinking and the router's web page says the line is training at 16 Mbit. My neighbour on the same street says her connection works fine today.",
        "I called from my mobile and the automated line said there is no outage in my area. The router log shows PPP authentication failed three times since I restarted it this afternoon.",
        "I swapped the DSL cable for the spare one from the box and tried the other wall socket in the hallway too, but the Internet light stays orange and the log still shows the same PPP error.",
        "My partner's phone on the same Wi-Fi cannot load anything either, and the router's status page now lists the firmware as 7.57 with an update available that I have not installed yet.",
    ];
    let mut h = policy("near", json!({}));
    for n in 1..=reports.len() {
        h.now += 1000;
        assert_eq!(h.post(&support(&reports[..n])).status(), 200, "{n}");
    }
    // A user who only complains gets the same answer turn after turn.
    let mut h = policy("near", json!({}));
    let complaints = [
        reports[0],
        "Still down.",
        "Still down.",
        "Still down.",
        "Still down.",
    ];
    let codes: Vec<u32> = (1..=complaints.len())
        .map(|n| {
            h.now += 1000;
            h.post(&support(&complaints[..n])).status()
        })
        .collect();
    assert_eq!(codes, vec![200, 200, 200, 429, 429]);
}

/// A SWE-agent run over chat: each reply a DISCUSSION worded anew and a
/// fenced command, each observation a user message.
fn swe_agent(steps: &[(&str, &str)]) -> String {
    let discussions = [
        "Let's run the reproduction script to see whether the bug is still there.",
        "I'll run it again to check the current behaviour.",
        "Running the script once more should tell us what happens now.",
        "Let me execute the command and look at its output.",
        "We should check the output of this command before going further.",
        "Let's see what this gives us.",
    ];
    let mut messages = vec![
        json!({"role": "system", "content": "You are an autonomous programmer working in a command line with a special interface."}),
        json!({"role": "user", "content": "We're currently solving the following issue within our repository: total() drops the trailing zero of 10.10."}),
    ];
    for (i, (command, output)) in steps.iter().enumerate() {
        let discussion = discussions[i % discussions.len()];
        messages.push(json!({"role": "assistant",
            "content": format!("DISCUSSION\n{discussion}\n\n```\n{command}\n```\n")}));
        messages.push(json!({"role": "user", "content": output}));
    }
    json!({"model": "gpt-4o", "messages": messages}).to_string()
}

fn swe_statuses(steps: &[(&str, &str)]) -> Vec<u32> {
    let mut h = policy("near", json!({}));
    (1..=steps.len())
        .map(|n| {
            h.now += 1000;
            h.post(&swe_agent(&steps[..n])).status()
        })
        .collect()
}

#[test]
fn near_mode_reads_a_text_action_agent_by_its_commands() {
    let failure = "Traceback (most recent call last):\n  File \"/testbed/reproduce.py\", line 4, in <module>\n    assert total([10.10]) == \"10.10\"\nAssertionError\n(Open file: /testbed/cart.py)\n(Current directory: /testbed)\nbash-$";
    let same = [("python reproduce.py", failure); 5];
    assert_eq!(swe_statuses(&same), vec![200, 200, 200, 429, 429]);
    // Another directory each time, the same (empty) output.
    let quiet = "Your command ran successfully and did not produce any output.\n(Open file: n/a)\n(Current directory: /testbed)\nbash-$";
    let dirs = [
        ("cd /testbed/src", quiet),
        ("cd /testbed/tests", quiet),
        ("cd /testbed/docs", quiet),
        ("cd /testbed/scripts", quiet),
        ("cd /testbed/tools", quiet),
    ];
    assert_eq!(swe_statuses(&dirs), vec![200; 5]);
    // Edits of different references, each answered alike.
    let updated = "File updated. Please review the changes and make sure they are correct (correct indentation, no duplicate lines, etc). Edit the file again if necessary.\n(Open file: /testbed/docs/usage.rst)\n(Current directory: /testbed)\nbash-$";
    let edits = [
        (
            "edit 12:12\nSee :ref:`installation` first.\nend_of_edit",
            updated,
        ),
        (
            "edit 30:30\nSee :ref:`configuration` for the options.\nend_of_edit",
            updated,
        ),
        (
            "edit 47:47\nSee :ref:`api-cart` for the totals.\nend_of_edit",
            updated,
        ),
        (
            "edit 63:63\nSee :ref:`changelog` for what changed.\nend_of_edit",
            updated,
        ),
        (
            "edit 80:80\nSee :ref:`contributing` to help.\nend_of_edit",
            updated,
        ),
    ];
    assert_eq!(swe_statuses(&edits), vec![200; 5]);
    // The same edit again and again is a loop.
    let stuck_edit = [edits[0]; 5];
    assert_eq!(swe_statuses(&stuck_edit), vec![200, 200, 200, 429, 429]);
}

#[test]
fn near_mode_rejects_a_react_loop_over_anthropic() {
    let react = |n: usize| {
        let mut messages =
            vec![json!({"role": "user", "content": "What is the status of order W2378156?"})];
        for i in 0..n {
            messages.push(json!({"role": "assistant", "content": [
                {"type": "text", "text": format!("Thought: attempt {i}, I should look the order up.\nAction: get_order_details\nAction Input: {{\"order_id\": \"W2378156\"}}")}]}));
            messages.push(json!({"role": "user", "content": [
                {"type": "text", "text": "Observation: Error: order service timed out."}]}));
        }
        json!({"model": "claude-sonnet-4-5", "max_tokens": 512, "system": "Use Thought/Action/Action Input.", "messages": messages}).to_string()
    };
    let mut h = policy("near", json!({}));
    let send = |h: &mut Harness, n: usize| {
        h.now += 1000;
        h.send(
            "POST",
            "/v1/messages",
            &[("x-api-key", "sk-ant-1")],
            react(n).as_bytes(),
        )
    };
    let codes: Vec<u32> = (1..=3).map(|n| send(&mut h, n).status()).collect();
    assert_eq!(codes, vec![200, 200, 200]);
    let s = send(&mut h, 4);
    assert_eq!(s.status(), 429);
    let body = s.json();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Blocked: the last 3 turns of this conversation are near-identical."));
    assert_eq!(body["loopguard"]["repeated_turns"], 3);
}
