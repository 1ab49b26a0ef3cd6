//! LLM fingerprints: the llm_tail mode's conversation tail, the fallback
//! to exact for other bodies, and the session mode.

use super::*;
use crate::config::Config;
use crate::request::tests::FakeFacts;
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
