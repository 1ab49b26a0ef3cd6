//! Fingerprints: every mode's components, their framing, digests pinned.

use super::*;
use crate::config::Config;
use crate::request::tests::FakeFacts;
use serde_json::json;
use serde_json::Value;
use sha2::Digest;

fn config(id: &str, keys: &[&str]) -> Config {
    Config::from_value(&json!({"policies": [{"id": id, "spec": {
        "selector": {}, "limit_keys": keys,
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 5}}}]}))
    .unwrap()
}

fn policy(id: &str, keys: &[&str]) -> Policy {
    config(id, keys).policies[0].clone()
}

fn fp(p: &Policy, method: &str, path: &str, facts: &FakeFacts, body: &str) -> Fingerprint {
    let head = RequestHead {
        method,
        path,
        authority: "h",
    };
    Pending::start(&config("x", &[]), p, &head, facts)
        .finish(body.as_bytes())
        .fingerprint
}

#[test]
fn hex_is_32_chars() {
    let p = policy("p", &[]);
    let f = fp(&p, "GET", "/", &FakeFacts::default(), "");
    assert_eq!(f.hex().len(), 32);
    assert!(f
        .hex()
        .chars()
        .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    assert_eq!(format!("{f}"), f.hex());
}

#[test]
fn components_that_matter() {
    let p = policy("p", &[]);
    let none = FakeFacts::default();
    let base = fp(&p, "POST", "/v1/x?a=1&a=2&b=3", &none, "{}");
    assert_eq!(
        base,
        fp(&p, "POST", "/v1/x?b=3&a=2&a=1", &none, "{}"),
        "query order"
    );
    assert_ne!(
        base,
        fp(&p, "POST", "/v1/x?a=1&b=3", &none, "{}"),
        "multi-value query"
    );
    assert_ne!(
        base,
        fp(&p, "PUT", "/v1/x?a=1&a=2&b=3", &none, "{}"),
        "method"
    );
    assert_ne!(
        base,
        fp(&p, "POST", "/v1/y?a=1&a=2&b=3", &none, "{}"),
        "path"
    );
    assert_ne!(
        base,
        fp(&p, "POST", "/v1/x?a=1&a=2&b=3", &none, "{ }"),
        "body"
    );
    assert_ne!(
        base,
        fp(&policy("q", &[]), "POST", "/v1/x?a=1&a=2&b=3", &none, "{}"),
        "policy"
    );
}

#[test]
fn framing_prevents_concatenation_collisions() {
    let p = policy("p", &[]);
    let none = FakeFacts::default();
    assert_ne!(
        fp(&p, "GET", "/?ab=c", &none, ""),
        fp(&p, "GET", "/?a=bc", &none, "")
    );
    assert_ne!(
        fp(&p, "GET", "/?a=b&c=", &none, ""),
        fp(&p, "GET", "/?a=b%26c", &none, "")
    );
    let hk = policy("p", &["header:a", "header:b"]);
    let f1 = FakeFacts::default().with("a", "x|").with("b", "y");
    let f2 = FakeFacts::default().with("a", "x").with("b", "|y");
    assert_ne!(fp(&hk, "GET", "/", &f1, ""), fp(&hk, "GET", "/", &f2, ""));
}

#[test]
fn api_key_is_the_default_identity() {
    let p = policy("p", &[]);
    let a = FakeFacts::default().with("authorization", "Bearer sk-a");
    let b = FakeFacts::default().with("authorization", "Bearer sk-b");
    let a2 = FakeFacts::default().with("authorization", "bearer   sk-a");
    let xa = FakeFacts::default().with("x-api-key", "sk-a");
    assert_ne!(fp(&p, "GET", "/", &a, ""), fp(&p, "GET", "/", &b, ""));
    assert_eq!(fp(&p, "GET", "/", &a, ""), fp(&p, "GET", "/", &a2, ""));
    // The same key through either header is the same caller.
    assert_eq!(fp(&p, "GET", "/", &a, ""), fp(&p, "GET", "/", &xa, ""));
    assert_ne!(
        fp(&p, "GET", "/", &a, ""),
        fp(&p, "GET", "/", &FakeFacts::default(), "")
    );
}

#[test]
fn absent_differs_from_empty() {
    let p = policy("p", &["header:x-org-id", "query:user"]);
    let absent = FakeFacts::default();
    let empty = FakeFacts::default().with("x-org-id", "");
    assert_ne!(
        fp(&p, "GET", "/", &absent, ""),
        fp(&p, "GET", "/", &empty, "")
    );
    assert_ne!(
        fp(&p, "GET", "/", &absent, ""),
        fp(&p, "GET", "/?user=", &absent, "")
    );
}

#[test]
fn each_limit_key_source_separates_callers() {
    let p = policy(
        "p",
        &["header:x-org-id", "query:user", "jwt:sub", "ip:address"],
    );
    // {"sub":"u1"} and {"sub":"u2"}
    let jwt1 = "Bearer e30.eyJzdWIiOiJ1MSJ9.s";
    let jwt2 = "Bearer e30.eyJzdWIiOiJ1MiJ9.s";
    let mut base = FakeFacts::default()
        .with("x-org-id", "org-a")
        .with("authorization", jwt1);
    base.source = Some("10.0.0.1:1111".into());
    let f0 = fp(&p, "GET", "/?user=u", &base, "");
    // Port changes do not matter; the address does.
    let mut other_port = base.clone();
    other_port.source = Some("10.0.0.1:2222".into());
    assert_eq!(f0, fp(&p, "GET", "/?user=u", &other_port, ""));
    let mut other_ip = base.clone();
    other_ip.source = Some("10.0.0.2:1111".into());
    assert_ne!(f0, fp(&p, "GET", "/?user=u", &other_ip, ""));
    assert_ne!(
        f0,
        fp(
            &p,
            "GET",
            "/?user=u",
            &base.clone().with("x-org-id", "org-b"),
            ""
        )
    );
    assert_ne!(f0, fp(&p, "GET", "/?user=v", &base, ""));
    assert_ne!(
        f0,
        fp(
            &p,
            "GET",
            "/?user=u",
            &base.clone().with("authorization", jwt2),
            ""
        )
    );
    // With limit keys, a different API key in another header is the same caller.
    assert_eq!(
        f0,
        fp(
            &p,
            "GET",
            "/?user=u",
            &base.clone().with("x-api-key", "k"),
            ""
        )
    );
}

#[test]
fn verified_claims_separate_callers_and_shadow_keys_differ() {
    let p = policy("p", &["jwt_verified:sub"]);
    let mut a = FakeFacts::default();
    a.verified
        .insert(("jwt_payload".into(), "sub".into()), b"alice".to_vec());
    let mut b = FakeFacts::default();
    b.verified
        .insert(("jwt_payload".into(), "sub".into()), b"bob".to_vec());
    let fa = fp(&p, "GET", "/", &a, "");
    assert_ne!(fa, fp(&p, "GET", "/", &b, ""));
    assert_ne!(fa, fp(&p, "GET", "/", &FakeFacts::default(), ""));
    assert_ne!(fa.shadow_key(), fa);
    assert_eq!(fa.shadow_key(), fa.shadow_key());
}

#[test]
fn limit_key_order_in_config_does_not_matter() {
    let a = policy("p", &["header:a", "query:q"]);
    let b = policy("p", &["query:q", "header:a"]);
    let f = FakeFacts::default().with("a", "1");
    assert_eq!(
        fp(&a, "GET", "/?q=2", &f, ""),
        fp(&b, "GET", "/?q=2", &f, "")
    );
}

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

fn pin_config(similarity: Value, keys: Value) -> Config {
    let mut ld = json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 5});
    for (k, v) in similarity.as_object().unwrap() {
        ld[k] = v.clone();
    }
    Config::from_value(&json!({"policies": [{"id": "pin", "spec": {"selector": {}, "limit_keys": keys, "loop_detection": ld}}]}))
        .unwrap()
}

const PIN_BODY: &[u8] = br#"{"model":"gpt-4o","messages":[{"role":"system","content":"Be brief"},{"role":"user","content":[{"type":"text","text":"Hi  THERE"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"b\":1,\"a\":2}"}}]},{"role":"tool","tool_call_id":"c1","content":"result"}],"tools":[{"type":"function","function":{"name":"get"}}]}"#;

fn pin_cases() -> Vec<(&'static str, Config, &'static str, &'static str)> {
    vec![
        (
            "exact",
            pin_config(json!({"similarity": "exact"}), json!([])),
            "891f9682e8ae0c00b8f969c1b5846309",
            "cb929674ba75966c26e00e2781a4be55",
        ),
        (
            "llm_tail",
            pin_config(
                json!({"similarity": "llm_tail", "tail_messages": 3}),
                json!(["header:x-org", "query:u"]),
            ),
            "7b76cea6e2dfea9da17a691cb839f113",
            "29ff9474a8d7525b7505735abcb9a793",
        ),
        (
            "session",
            pin_config(json!({"similarity": "session"}), json!([])),
            "a3e61a8bbedc098280b68ec728c0f948",
            "cb929674ba75966c26e00e2781a4be55",
        ),
    ]
}

fn pin_facts() -> FakeFacts {
    FakeFacts::default()
        .with("authorization", "Bearer sk-pin")
        .with("x-org", "acme")
        .with("x-session-id", "s1")
}

const PIN_HEAD: RequestHead<'static> = RequestHead {
    method: "POST",
    path: "/v1/chat/completions?u=1&b=2",
    authority: "h",
};

/// Digests are stored (shared data, Redis) across upgrades and shown
/// to users: a change to the encoding must be deliberate (bump the
/// domain tag) and show up here.
#[test]
fn digests_are_stable() {
    for (mode, cfg, llm, not_json) in pin_cases() {
        let p = &cfg.policies[0];
        let f = Pending::start(&cfg, p, &PIN_HEAD, &pin_facts()).finish(PIN_BODY);
        assert_eq!(f.fingerprint.hex(), llm, "{mode}");
        let g = Pending::start(&cfg, p, &PIN_HEAD, &pin_facts()).finish(b"not json");
        assert_eq!(g.fingerprint.hex(), not_json, "{mode}");
    }
}

#[test]
fn explain_computes_the_filters_digest_and_names_every_component() {
    for (mode, cfg, _, _) in pin_cases() {
        let p = &cfg.policies[0];
        for body in [PIN_BODY, b"not json".as_slice(), b"".as_slice()] {
            let filter = Pending::start(&cfg, p, &PIN_HEAD, &pin_facts()).finish(body);
            let e = explain(&cfg, p, &PIN_HEAD, &pin_facts(), body);
            assert_eq!(e.made, filter, "{mode}");
            // The digest is the SHA-256 of the canonical bytes shown.
            assert_eq!(
                truncate(&<Sha256 as Digest>::digest(&e.canonical)),
                filter.fingerprint
            );
        }
    }
    let (_, exact, _, _) = pin_cases().remove(0);
    let e = explain(&exact, &exact.policies[0], &PIN_HEAD, &pin_facts(), b"{}");
    let names: Vec<&str> = e.components.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "domain",
            "policy",
            "method",
            "path",
            "query parameters",
            "query b",
            "query u",
            "caller: API key",
            "body crc32"
        ]
    );
    let shown: Vec<&str> = e.components.iter().map(|c| c.value.as_str()).collect();
    assert_eq!(
        shown[1..5],
        ["\"pin\"", "\"POST\"", "\"/v1/chat/completions\"", "2"]
    );
    assert_eq!(
        shown[8],
        "4b8b7d2b (2 bytes)".replace("4b8b7d2b", &format!("{:08x}", crc32fast::hash(b"{}")))
    );
    // The API key itself is never shown.
    assert!(
        shown[7].starts_with("<redacted: 6 bytes, sha256 "),
        "{}",
        shown[7]
    );
    assert!(!shown.iter().any(|v| v.contains("sk-pin")));

    let (_, tail, _, _) = pin_cases().remove(1);
    let e = explain(&tail, &tail.policies[0], &PIN_HEAD, &pin_facts(), PIN_BODY);
    let lines: Vec<String> = e
        .components
        .iter()
        .map(|c| format!("{}={}", c.name, c.value))
        .collect();
    assert_eq!(
        lines,
        [
            "domain=\"lg/llm_tail/2\"",
            "policy=\"pin\"",
            "caller: header:x-org=\"acme\"",
            "caller: query:u=\"1\"",
            "model=\"gpt-4o\"",
            "tail messages=3",
            "message[0] role=\"user\"",
            "message[0] text=\"hi there\"",
            &format!(
                "message[0] media sha256={}",
                show_bytes(&<Sha256 as Digest>::digest(b"http://x/y.png"))
            ),
            "message[1] role=\"assistant\"",
            "message[1] tool call=\"get\" \"{\\\"a\\\":2,\\\"b\\\":1}\"",
            "message[2] role=\"tool\"",
            "message[2] tool result=(ok)",
            "message[2] text=\"result\"",
        ]
    );
}

#[test]
fn show_bytes_quotes_text_and_hexes_the_rest() {
    assert_eq!(show_bytes(b"a\"b"), "\"a\\\"b\"");
    assert_eq!(show_bytes(&[0, 255]), "0x00ff");
    assert_eq!(show_bytes(b"line\nbreak"), "0x6c696e650a627265616b");
    let long = "x".repeat(200);
    assert!(show_bytes(long.as_bytes()).ends_with("... (200 bytes)"));
}

#[test]
fn explain_never_shows_credentials() {
    assert!(is_secret_name("header:authorization"));
    assert!(is_secret_name("x-api-key"));
    assert!(is_secret_name("query:access_token"));
    assert!(is_secret_name("Cookie"));
    assert!(!is_secret_name("header:x-org-id"));
    assert!(!is_secret_name("jwt:sub"));
    assert_eq!(
        redact_query("/v1/models/x:generate?key=AIzaSecret&alt=sse&token="),
        "/v1/models/x:generate?key=<redacted>&alt=sse&token="
    );
    assert_eq!(redact_query("/plain"), "/plain");
    let cfg = pin_config(
        json!({"similarity": "exact"}),
        json!(["header:x-api-key", "query:key", "header:x-org"]),
    );
    let head = RequestHead {
        method: "GET",
        path: "/v1/x?key=AIzaSecret&user=u1",
        authority: "h",
    };
    let facts = FakeFacts::default()
        .with("x-api-key", "sk-live-123")
        .with("x-org", "acme");
    let e = explain(&cfg, &cfg.policies[0], &head, &facts, b"");
    let text = format!("{:?}", e.components);
    assert!(
        !text.contains("sk-live-123") && !text.contains("AIzaSecret"),
        "{text}"
    );
    let values: Vec<&str> = e.components.iter().map(|c| c.value.as_str()).collect();
    assert!(
        values.contains(&"\"acme\"") && values.contains(&"\"u1\""),
        "{text}"
    );
}
