//! Request fingerprints: a canonical, unambiguous encoding of what makes two
//! requests "identical" under a policy, digested to 128 bits.
//!
//! Every component is framed (a tag byte or a length prefix comes first), so
//! no two different requests share a canonical form: `a|b` + `c` can never
//! equal `a` + `b|c`. The canonical bytes are streamed into SHA-256 and the
//! digest is truncated to 128 bits, shown as 32 hex characters.

use super::config::{Config, Policy, Similarity};
use super::llm::{self, Format, Message, Part};
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
        let mut c = Canon::new(b"lg/shadow/1");
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

/// Where framed components go: a SHA-256 stream, or a buffer that is
/// absorbed into one later.
trait Sink {
    fn put(&mut self, b: &[u8]);
}

impl Sink for Sha256 {
    fn put(&mut self, b: &[u8]) {
        self.update(b);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Writes framed components: every field is length-prefixed and every
/// optional or variant value tagged, so the encoding is unambiguous.
#[derive(Clone)]
struct Canon<S = Sha256>(S);

impl Canon<Sha256> {
    fn new(domain: &[u8]) -> Self {
        let mut c = Canon(Sha256::new());
        c.field(domain);
        c
    }

    fn finish(self) -> Fingerprint {
        let full = self.0.finalize();
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        Fingerprint(out)
    }
}

impl<S: Sink> Canon<S> {
    fn tag(&mut self, t: u8) {
        self.0.put(&[t]);
    }
    fn count(&mut self, n: usize) {
        self.0.put(&(n as u32).to_le_bytes());
    }
    /// A length-prefixed byte string.
    fn field(&mut self, b: &[u8]) {
        self.count(b.len());
        self.0.put(b);
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
}

const TAG_ABSENT: u8 = 0;
const TAG_PRESENT: u8 = 1;
const TAG_LIMIT_KEYS: u8 = 2;
const TAG_API_KEY: u8 = 3;

/// A fingerprint in the making: what the headers phase knows (policy,
/// request line, caller identity, session id), waiting for the body.
#[derive(Clone)]
pub struct Pending {
    /// The exact fingerprint's canonical form so far: every mode falls back
    /// to it when the body is not an LLM request.
    exact: Canon,
    policy_id: String,
    /// The caller's identity, framed: limit-key values, or a SHA-256 of the
    /// API key. Absorbed into every digest made for this request.
    identity: Vec<u8>,
    path: String,
    mode: PendingMode,
}

#[derive(Clone)]
enum PendingMode {
    Exact,
    LlmTail { tail_messages: usize },
    Session { session: Option<Vec<u8>> },
}

/// A finished fingerprint and what was learnt making it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprinted {
    pub fingerprint: Fingerprint,
    /// A session-mode request without a session id: judged by the fallback
    /// ladder.
    pub fallback: bool,
    /// An LLM mode could not read the body (not JSON, or not a format it
    /// knows) and used the exact fingerprint instead.
    pub unparsed: bool,
    /// The LLM format and model, when the body was read as one.
    pub format: Option<Format>,
    pub model: Option<String>,
    /// The session id (session mode), for events.
    pub session: Option<String>,
}

impl Pending {
    pub fn start(
        config: &Config,
        policy: &Policy,
        head: &RequestHead<'_>,
        facts: &dyn RequestFacts,
    ) -> Self {
        let identity = identity(config, policy, head, facts);
        let mut exact = Canon::new(b"lg/exact/3");
        exact.field(policy.id.as_bytes());
        exact.field(head.method.as_bytes());
        exact.field(head.path_only().as_bytes());
        let pairs = request::sorted_query_pairs(head.query());
        exact.count(pairs.len());
        for (k, v) in &pairs {
            exact.field(k);
            exact.field(v);
        }
        exact.field(&identity);
        let mode = match policy.detection.as_ref().map(|d| &d.similarity) {
            Some(Similarity::LlmTail { tail_messages }) => PendingMode::LlmTail {
                tail_messages: *tail_messages as usize,
            },
            Some(Similarity::Session { header, .. }) => PendingMode::Session {
                session: facts.header(header).filter(|v| !v.is_empty()),
            },
            _ => PendingMode::Exact,
        };
        Pending {
            exact,
            policy_id: policy.id.clone(),
            identity,
            path: head.path_only().to_string(),
            mode,
        }
    }

    /// Whether finishing reads the body as an LLM request.
    pub fn reads_llm_body(&self) -> bool {
        !matches!(self.mode, PendingMode::Exact)
    }

    /// The path, for recognising the body's format.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The caller's identity, framed (never logged or stored).
    pub fn identity(&self) -> &[u8] {
        &self.identity
    }

    /// Finish with the whole request body (empty for a body-less request).
    pub fn finish(self, body: &[u8]) -> Fingerprinted {
        let parsed = if self.reads_llm_body() {
            llm::parse(body, &self.path)
        } else {
            None
        };
        self.finish_parsed(body, parsed.as_ref())
    }

    /// Finish with the body and what [`llm::parse`] made of it (parsed once
    /// by the caller, who may need it too).
    pub fn finish_parsed(self, body: &[u8], parsed: Option<&llm::Request<'_>>) -> Fingerprinted {
        let parsed = if self.reads_llm_body() { parsed } else { None };
        let Some(req) = parsed else {
            // A body-less request (a GET) is simply not an LLM call.
            let unparsed = !matches!(self.mode, PendingMode::Exact) && !body.is_empty();
            return Fingerprinted {
                fingerprint: self.exact_with(body),
                fallback: false,
                unparsed,
                format: None,
                model: None,
                session: None,
            };
        };
        let model = req.model.clone();
        let mut session_shown = None;
        let mut fallback = false;
        let fingerprint = match &self.mode {
            PendingMode::LlmTail { tail_messages } => {
                let mut c = Canon::new(b"lg/llm_tail/2");
                c.field(self.policy_id.as_bytes());
                c.field(&self.identity);
                c.optional(req.model.as_deref().map(str::as_bytes));
                let Some(tail) = req.tail(*tail_messages) else {
                    return self.unparsed(body);
                };
                c.count(tail.len());
                for m in &tail {
                    write_message(&mut c, m);
                }
                c.finish()
            }
            PendingMode::Session { session } => {
                let mut c = Canon::new(b"lg/session/2");
                c.field(self.policy_id.as_bytes());
                c.field(&self.identity);
                match session {
                    Some(id) => {
                        c.tag(TAG_PRESENT);
                        c.field(id);
                        c.optional(req.model.as_deref().map(str::as_bytes));
                        c.tag(u8::from(req.offers_tools));
                        session_shown =
                            Some(String::from_utf8_lossy(id).chars().take(128).collect());
                    }
                    None => {
                        // One fingerprint per caller, judged by the
                        // fallback threshold.
                        c.tag(TAG_ABSENT);
                        fallback = true;
                    }
                }
                c.finish()
            }
            PendingMode::Exact => self.exact_with(body),
        };
        Fingerprinted {
            fingerprint,
            fallback,
            unparsed: false,
            format: Some(req.format),
            model,
            session: session_shown,
        }
    }

    /// The exact fingerprint of a body an LLM mode could not read.
    fn unparsed(&self, body: &[u8]) -> Fingerprinted {
        Fingerprinted {
            fingerprint: self.exact_with(body),
            fallback: false,
            unparsed: !body.is_empty(),
            format: None,
            model: None,
            session: None,
        }
    }

    fn exact_with(&self, body: &[u8]) -> Fingerprint {
        let mut c = self.exact.clone();
        c.0.put(&crc32fast::hash(body).to_le_bytes());
        c.finish()
    }
}

/// The key under which a tool-loop event is remembered, so it is logged
/// once per conversation (the caller and the conversation's opening
/// message) and level within a window, not once per request.
pub fn tool_event_key(
    policy_id: &str,
    identity: &[u8],
    req: &llm::Request<'_>,
    tier: &str,
    tool: &str,
    level: u32,
) -> Fingerprint {
    let mut c = Canon::new(b"lg/tool-event/2");
    c.field(policy_id.as_bytes());
    c.field(identity);
    match req.first_message() {
        Some(m) => {
            c.tag(TAG_PRESENT);
            write_message(&mut c, &m);
        }
        None => c.tag(TAG_ABSENT),
    }
    c.field(tier.as_bytes());
    c.field(tool.as_bytes());
    c.count(level as usize);
    c.finish()
}

fn write_message(c: &mut Canon, m: &Message) {
    c.field(m.role.as_bytes());
    write_parts(c, &m.parts);
}

fn write_parts(c: &mut Canon, parts: &[Part]) {
    c.count(parts.len());
    for p in parts {
        match p {
            Part::Text(t) => {
                c.tag(1);
                c.field(t.as_bytes());
            }
            Part::Media(h) => {
                c.tag(2);
                c.field(h);
            }
            Part::ToolCall { name, arguments } => {
                c.tag(3);
                c.field(name.as_bytes());
                c.field(arguments.as_bytes());
            }
            Part::ToolResult { content, is_error } => {
                c.tag(4);
                c.tag(u8::from(*is_error));
                write_parts(c, content);
            }
            Part::Other(kind) => {
                c.tag(5);
                c.field(kind.as_bytes());
            }
        }
    }
}

/// Who is calling, framed: the policy's limit keys (sorted by key) or, when
/// it has none, the caller's API key. These bytes only ever enter a
/// SHA-256 (the fingerprint's, or an event key's): the key itself is never
/// stored, logged or returned, and two keys never share a fingerprint.
fn identity(
    config: &Config,
    policy: &Policy,
    head: &RequestHead<'_>,
    facts: &dyn RequestFacts,
) -> Vec<u8> {
    let mut c = Canon(Vec::with_capacity(48));
    if policy.limit_keys.is_empty() {
        c.tag(TAG_API_KEY);
        c.optional(request::api_key(facts).as_deref());
    } else {
        c.tag(TAG_LIMIT_KEYS);
        c.count(policy.limit_keys.len());
        for key in &policy.limit_keys {
            c.field(key.name().as_bytes());
            let values =
                request::limit_key_values(key, head, facts, &config.jwt_payload_in_metadata);
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
    c.0
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
        let mut ld =
            json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3});
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
}
