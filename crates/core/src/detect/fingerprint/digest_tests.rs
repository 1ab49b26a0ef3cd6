//! Digests pinned across versions, one request per mode, and `explain`:
//! the filter's digest recomputed, every component named, no credential shown.

use super::*;
use crate::config::Config;
use crate::request::tests::FakeFacts;
use crate::request::RequestHead;
use serde_json::json;
use serde_json::Value;
use sha2::Digest;

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
