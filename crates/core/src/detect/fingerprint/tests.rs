//! Fingerprints: the components that matter, their framing, and how
//! callers are told apart (API key, limit keys, verified claims).

use super::*;
use crate::config::{Config, Policy};
use crate::request::tests::FakeFacts;
use crate::request::RequestHead;
use serde_json::json;

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
