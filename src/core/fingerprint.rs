//! Request fingerprints: a canonical, unambiguous encoding of what makes two
//! requests "identical" under a policy, digested to 128 bits.
//!
//! Every component is framed (a tag byte or a length prefix comes first), so
//! no two different requests share a canonical form: `a|b` + `c` can never
//! equal `a` + `b|c`. The canonical bytes are streamed into SHA-256 and the
//! digest is truncated to 128 bits, shown as 32 hex characters.

use super::config::{Config, Policy};
use super::request::{self, RequestFacts, RequestHead};
use sha2::{Digest, Sha256};
use std::fmt;

/// A 128-bit request fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    /// 32 lower-case hex characters.
    pub fn hex(&self) -> String {
        let mut s = String::with_capacity(32);
        for b in self.0 {
            s.push(HEX[usize::from(b >> 4)]);
            s.push(HEX[usize::from(b & 15)]);
        }
        s
    }

    /// The key under which a shadow-mode policy counts this fingerprint: a
    /// key space of its own, so shadow counts never touch enforce counts
    /// and a policy switched to enforce starts from zero.
    pub fn shadow_key(&self) -> Fingerprint {
        let mut c = Canon::new(b"loopguard/shadow/v1");
        c.field(&self.0);
        c.finish()
    }

    /// 64 well-mixed bits, for choosing a slot-table bucket.
    pub fn spread(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

const HEX: [char; 16] = [
    '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f',
];

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// Writes framed components into a SHA-256 stream.
#[derive(Clone)]
struct Canon(Sha256);

impl Canon {
    fn new(domain: &[u8]) -> Self {
        let mut c = Canon(Sha256::new());
        c.field(domain);
        c
    }
    fn tag(&mut self, t: u8) {
        self.0.update([t]);
    }
    fn count(&mut self, n: usize) {
        self.0.update((n as u64).to_le_bytes());
    }
    /// A length-prefixed byte string.
    fn field(&mut self, b: &[u8]) {
        self.count(b.len());
        self.0.update(b);
    }
    fn optional(&mut self, v: Option<&[u8]>) {
        match v {
            None => self.tag(TAG_ABSENT),
            Some(b) => {
                self.tag(TAG_PRESENT);
                self.field(b);
            }
        }
    }
    fn finish(self) -> Fingerprint {
        let full = self.0.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        Fingerprint(out)
    }
}

const TAG_ABSENT: u8 = 0;
const TAG_PRESENT: u8 = 1;
const TAG_LIMIT_KEYS: u8 = 2;
const TAG_API_KEY: u8 = 3;

/// The "exact" fingerprint, built in two steps: [`ExactBuilder::start`] in
/// the headers phase (policy, method, path, sorted query, limit keys), then
/// [`ExactBuilder::finish`] once the body is known (its CRC32).
#[derive(Clone)]
pub struct ExactBuilder(Canon);

impl ExactBuilder {
    pub fn start(
        config: &Config,
        policy: &Policy,
        head: &RequestHead<'_>,
        facts: &dyn RequestFacts,
    ) -> Self {
        let mut c = Canon::new(b"loopguard/exact/v1");
        c.field(policy.id.as_bytes());
        c.field(head.method.as_bytes());
        c.field(head.path_only().as_bytes());
        let pairs = request::sorted_query_pairs(head.query());
        c.count(pairs.len());
        for (k, v) in &pairs {
            c.field(k);
            c.field(v);
        }
        write_identity(&mut c, config, policy, head, facts);
        ExactBuilder(c)
    }

    /// Finish with the whole request body (empty for a body-less request).
    pub fn finish(self, body: &[u8]) -> Fingerprint {
        self.finish_crc(crc32fast::hash(body))
    }

    pub fn finish_crc(self, body_crc: u32) -> Fingerprint {
        let mut c = self.0;
        c.0.update(body_crc.to_le_bytes());
        c.finish()
    }
}

/// Who is calling: the policy's limit keys (sorted by key) or, when it has
/// none, a SHA-256 of the caller's API key. The raw key never leaves this
/// function.
fn write_identity(
    c: &mut Canon,
    config: &Config,
    policy: &Policy,
    head: &RequestHead<'_>,
    facts: &dyn RequestFacts,
) {
    if policy.limit_keys.is_empty() {
        c.tag(TAG_API_KEY);
        let hashed = request::api_key(facts).map(|key| Sha256::digest(&key));
        c.optional(hashed.as_ref().map(|h| h.as_slice()));
        return;
    }
    c.tag(TAG_LIMIT_KEYS);
    c.count(policy.limit_keys.len());
    for key in &policy.limit_keys {
        c.field(key.name().as_bytes());
        let values = request::limit_key_values(key, head, facts, &config.jwt_payload_in_metadata);
        if values.is_empty() {
            c.tag(TAG_ABSENT);
        } else {
            c.tag(TAG_PRESENT);
            c.count(values.len());
            for v in &values {
                c.field(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config::Config;
    use crate::core::request::tests::FakeFacts;
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
        ExactBuilder::start(&config("x", &[]), p, &head, facts).finish(body.as_bytes())
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
}
