//! LLM fingerprints: the llm_tail mode's conversation tail, the fallback
//! to exact for other bodies, and the session mode.

use super::*;
use crate::config::{Config, Policy};
use crate::request::tests::FakeFacts;
use crate::request::RequestHead;
use serde_json::json;

fn llm_policy(similarity: serde_json::Value) -> (Config, Policy) {
    let mut ld = json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3});
    for (k, v) in similarity.as_object().unwrap() {
        ld[k] = v.clone();
    }
    let cfg = Config::from_value(
        &json!({"policies": [{"id": "llm", "spec": {"selector": {}, "loop_detection": ld}}]}),
    )
    .unwrap();
    let p = cfg.policies[0].clone();
    (cfg, p)
}

fn llm_fp(
    cfg: &Config,
    p: &Policy,
    path: &str,
    facts: &FakeFacts,
    body: &serde_json::Value,
) -> Fingerprinted {
    let head = RequestHead {
        method: "POST",
        path,
        authority: "h",
    };
    Pending::start(cfg, p, &head, facts).finish(body.to_string().as_bytes())
}

fn chat(model: &str, msgs: &[(&str, &str)], extra: serde_json::Value) -> serde_json::Value {
    let mut b = json!({"model": model, "messages": msgs.iter().map(|(r, c)| json!({"role": r, "content": c})).collect::<Vec<_>>()});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[test]
fn llm_tail_ignores_history_case_spacing_and_sampling_fields() {
    let (cfg, p) = llm_policy(json!({"similarity": "llm_tail", "tail_messages": 2}));
    let key = FakeFacts::default().with("authorization", "Bearer sk-1");
    let a = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &key,
        &chat(
            "gpt-4o",
            &[("user", "old"), ("user", "Hi"), ("assistant", "Hello")],
            json!({"stream": true}),
        ),
    );
    let b = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &key,
        &chat(
            "gpt-4o",
            &[
                ("user", "other history"),
                ("user", " hi "),
                ("assistant", "HELLO"),
            ],
            json!({"temperature": 1.5, "max_tokens": 9, "user": "x"}),
        ),
    );
    assert_eq!(a.fingerprint, b.fingerprint);
    assert_eq!(a.format, Some(llm::Format::OpenAiChat));
    assert_eq!(a.model.as_deref(), Some("gpt-4o"));
    assert!(!a.unparsed && !a.fallback);
    // Model, caller and tail content each matter.
    let other_model = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &key,
        &chat(
            "gpt-4o-mini",
            &[("user", "hi"), ("assistant", "hello")],
            json!({}),
        ),
    );
    let other_key = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &FakeFacts::default().with("authorization", "Bearer sk-2"),
        &chat(
            "gpt-4o",
            &[("user", "hi"), ("assistant", "hello")],
            json!({}),
        ),
    );
    let other_tail = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &key,
        &chat(
            "gpt-4o",
            &[("user", "hi"), ("assistant", "hello!")],
            json!({}),
        ),
    );
    let other_role = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &key,
        &chat("gpt-4o", &[("user", "hi"), ("user", "hello")], json!({})),
    );
    for other in [other_model, other_key, other_tail, other_role] {
        assert_ne!(a.fingerprint, other.fingerprint);
    }
}

#[test]
fn llm_modes_fall_back_to_exact_for_other_bodies() {
    let (cfg, p) = llm_policy(json!({"similarity": "llm_tail"}));
    let head = RequestHead {
        method: "POST",
        path: "/v1/x",
        authority: "h",
    };
    let f = Pending::start(&cfg, &p, &head, &FakeFacts::default()).finish(b"not json");
    assert!(f.unparsed);
    assert_eq!(f.format, None);
    let g = Pending::start(&cfg, &p, &head, &FakeFacts::default()).finish(b"not json");
    assert_eq!(f.fingerprint, g.fingerprint);
    let h = Pending::start(&cfg, &p, &head, &FakeFacts::default()).finish(b"not JSON");
    assert_ne!(f.fingerprint, h.fingerprint);
    assert!(
        !Pending::start(&cfg, &p, &head, &FakeFacts::default())
            .finish(b"")
            .unparsed
    );
    // Exact mode never reports a body as unparsed.
    let (cfg, p) = llm_policy(json!({}));
    assert!(
        !Pending::start(&cfg, &p, &head, &FakeFacts::default())
            .finish(b"x")
            .unparsed
    );
}

#[test]
fn session_mode_counts_per_caller_session_model_and_tools() {
    let (cfg, p) = llm_policy(json!({"similarity": "session"}));
    let t1s1 = FakeFacts::default()
        .with("authorization", "Bearer tenant-1")
        .with("x-session-id", "session-1");
    let t2s1 = FakeFacts::default()
        .with("authorization", "Bearer tenant-2")
        .with("x-session-id", "session-1");
    let t1s2 = FakeFacts::default()
        .with("authorization", "Bearer tenant-1")
        .with("x-session-id", "session-2");
    let body = |model: &str, content: &str, tools: bool| {
        let mut b = chat(model, &[("user", content)], json!({}));
        if tools {
            b["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        }
        b
    };
    let a = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &t1s1,
        &body("m", "first", false),
    );
    // Every call of the session counts, whatever it says.
    assert_eq!(
        a.fingerprint,
        llm_fp(
            &cfg,
            &p,
            "/v1/chat/completions",
            &t1s1,
            &body("m", "second", false)
        )
        .fingerprint
    );
    assert_eq!(a.session.as_deref(), Some("session-1"));
    assert!(!a.fallback);
    for other in [
        llm_fp(
            &cfg,
            &p,
            "/v1/chat/completions",
            &t2s1,
            &body("m", "first", false),
        ),
        llm_fp(
            &cfg,
            &p,
            "/v1/chat/completions",
            &t1s2,
            &body("m", "first", false),
        ),
        llm_fp(
            &cfg,
            &p,
            "/v1/chat/completions",
            &t1s1,
            &body("m2", "first", false),
        ),
        llm_fp(
            &cfg,
            &p,
            "/v1/chat/completions",
            &t1s1,
            &body("m", "first", true),
        ),
    ] {
        assert_ne!(a.fingerprint, other.fingerprint);
    }
    // No session id: one fingerprint per caller, whatever the model.
    let t1 = FakeFacts::default().with("authorization", "Bearer tenant-1");
    let n1 = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &t1,
        &body("m", "a", false),
    );
    let n2 = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &t1,
        &body("other", "b", true),
    );
    assert!(n1.fallback && n2.fallback);
    assert_eq!(n1.fingerprint, n2.fingerprint);
    assert_ne!(
        n1.fingerprint,
        llm_fp(
            &cfg,
            &p,
            "/v1/chat/completions",
            &FakeFacts::default(),
            &body("m", "a", false)
        )
        .fingerprint
    );
}

#[test]
fn session_header_is_configurable() {
    let (cfg, p) =
        llm_policy(json!({"similarity": "session", "session_header": "X-Agent-Session"}));
    let s = FakeFacts::default().with("x-agent-session", "run-42");
    let f = llm_fp(
        &cfg,
        &p,
        "/v1/messages",
        &s,
        &json!({"model": "claude", "max_tokens": 5, "messages": []}),
    );
    assert_eq!(f.session.as_deref(), Some("run-42"));
    assert_eq!(f.format, Some(llm::Format::Anthropic));
}

/// Near mode's fingerprint of a chat body sent by `caller`.
fn near_fp(body: &serde_json::Value, caller: &str) -> Fingerprinted {
    let (cfg, p) = llm_policy(json!({"similarity": "near"}));
    let key = FakeFacts::default().with("authorization", &format!("Bearer {caller}"));
    llm_fp(&cfg, &p, "/v1/chat/completions", &key, body)
}

/// An agent's chat: the task, then one call and its result a turn.
fn agent(task: &str, steps: &[(&str, &str, &str)]) -> serde_json::Value {
    let mut messages = vec![json!({"role": "user", "content": task})];
    for (i, (name, args, result)) in steps.iter().enumerate() {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": args}}]}));
        messages
            .push(json!({"role": "tool", "tool_call_id": format!("call_{i}"), "content": result}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

const EXPORT: (&str, &str, &str) = (
    "export_report",
    "{\"report\":\"monthly-revenue\"}",
    "Error 503: the export service is unavailable, try again later",
);
const LINT: (&str, &str, &str) = (
    "run_linter",
    "{\"path\":\"api.py\"}",
    "api.py:88:5: B006 do not use mutable data structures for argument defaults",
);
const FORMAT: (&str, &str, &str) = (
    "apply_formatter",
    "{\"path\":\"api.py\"}",
    "All done! 1 file left unchanged.",
);

#[test]
fn near_repeats_count_the_turns_of_a_conversation_near_its_newest() {
    let repeats = |steps: &[(&str, &str, &str)]| {
        near_fp(&agent("Export the monthly revenue report.", steps), "sk-1").repeats
    };
    // One failing call again and again: every turn but the first (whose
    // tail holds the task) repeats the newest.
    let failing: Vec<u32> = (1..=7).map(|n| repeats(&vec![EXPORT; n])).collect();
    assert_eq!(failing, vec![1, 1, 2, 3, 4, 5, 6]);
    // A cycle of two calls: every other turn.
    let cycle =
        |n: usize| -> Vec<(&str, &str, &str)> { (0..n).map(|i| [LINT, FORMAT][i % 2]).collect() };
    let cycling: Vec<u32> = (1..=8).map(|n| repeats(&cycle(n))).collect();
    assert_eq!(cycling, vec![1, 1, 1, 2, 2, 3, 3, 4]);
    // A loop resumed after a detour still counts its earlier turns.
    let mut detour = vec![EXPORT; 3];
    detour.push(("get_status", "{\"service\":\"export\"}", "degraded"));
    detour.extend([EXPORT; 2]);
    assert_eq!(repeats(&detour), 3);
    // Progress: each turn reads another page.
    let pages: Vec<(String, String, String)> = (0..6)
        .map(|i| {
            (
                "list_orders".to_string(),
                format!("{{\"page\":{i}}}"),
                format!("orders {}-{}", 10 * i + 1, 10 * i + 10),
            )
        })
        .collect();
    let pages: Vec<(&str, &str, &str)> = pages
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(repeats(&pages), 1);
    // The caller does not matter: the history is the request's own.
    let body = agent("Export the monthly revenue report.", &[EXPORT; 5]);
    assert_eq!(near_fp(&body, "sk-2").repeats, 4);
    // Other modes do not read the turns.
    let (cfg, p) = llm_policy(json!({"similarity": "llm_tail"}));
    let f = llm_fp(
        &cfg,
        &p,
        "/v1/chat/completions",
        &FakeFacts::default(),
        &body,
    );
    assert_eq!(f.repeats, 0);
}

#[test]
fn near_repeats_stop_at_a_user_message_that_brought_news() {
    let answer = "I'm sorry the connection is still down. Please unplug the router, wait thirty seconds, plug it back in, and tell me what the status light shows.";
    let reports = [
        "My internet has been down since this morning. The router is a FritzBox 7590 and the light marked Internet is blinking red while the power light is steady green.",
        "I unplugged it for a full minute as you said. After it came back the Internet light went orange for a while and now it is solid orange, and my laptop says connected, no internet.",
        "Now the DSL light is also blinking and the router's web page says the line is training at 16 Mbit. My neighbour on the same street says her connection works fine today.",
        "I called from my mobile and the automated line said there is no outage in my area. The router log shows PPP authentication failed three times since I restarted it this afternoon.",
        "I swapped the DSL cable for the spare one from the box and tried the other wall socket in the hallway too, but the Internet light stays orange and the log still shows the same PPP error.",
    ];
    let dialogue = |users: &[&str]| {
        let mut messages =
            vec![json!({"role": "system", "content": "You are the ISP's support agent."})];
        for (i, u) in users.iter().enumerate() {
            if i > 0 {
                messages.push(json!({"role": "assistant", "content": answer}));
            }
            messages.push(json!({"role": "user", "content": u}));
        }
        json!({"model": "gpt-4o", "messages": messages})
    };
    // A user with something new to say each turn: a dialogue going on.
    assert_eq!(near_fp(&dialogue(&reports), "sk-1").repeats, 1);
    // The same complaint each turn, the same answer: a loop, back to the
    // first answer (to the report, which a complaint did not follow).
    let complaints = [
        reports[0],
        "Still down.",
        "Still down.",
        "Still down.",
        "Still down.",
    ];
    assert_eq!(near_fp(&dialogue(&complaints), "sk-1").repeats, 4);
    // A new report two turns back: the turn that answered it counts, the
    // turns before it are not read.
    let renewed = [
        reports[0],
        "Still down.",
        reports[1],
        "Still down.",
        "Still down.",
    ];
    assert_eq!(near_fp(&dialogue(&renewed), "sk-1").repeats, 3);
    // A new report in the newest message: nothing before it is read.
    let newest = [
        reports[0],
        "Still down.",
        "Still down.",
        "Still down.",
        reports[2],
    ];
    assert_eq!(near_fp(&dialogue(&newest), "sk-1").repeats, 1);
    // The same long message pasted again and again brings nothing new.
    let pasted = [reports[1]; 5];
    assert_eq!(near_fp(&dialogue(&pasted), "sk-1").repeats, 4);
}

#[test]
fn near_signatures_are_salted_with_the_conversations_length() {
    let body = |n: usize| agent("Export the monthly revenue report.", &vec![EXPORT; n]);
    let (four, again, five) = (
        near_fp(&body(4), "sk-1"),
        near_fp(&body(4), "sk-1"),
        near_fp(&body(5), "sk-1"),
    );
    // The caller's record: the same for the same caller and model.
    assert_eq!(four.fingerprint, five.fingerprint);
    // A resend at the same length signs alike; a longer conversation's
    // newest turn, though its tail is the same, does not.
    assert_eq!(four.near, again.near);
    let (a, b) = (four.near.unwrap(), five.near.unwrap());
    assert_ne!(a.anchor, b.anchor);
    assert_eq!(a.bins, b.bins);
}
