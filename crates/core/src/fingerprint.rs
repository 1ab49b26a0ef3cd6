//! Request fingerprints: a canonical, unambiguous encoding of what makes two
//! requests "identical" under a policy, digested to 128 bits.
//!
//! Every component is framed (a tag byte or a length prefix comes first), so
//! the encoding is unambiguous: `a|b` + `c` can never equal `a` + `b|c`. The
//! canonical bytes are streamed into SHA-256 and the digest is truncated to
//! 128 bits, shown as 32 hex characters.
//!
//! The same code can also record what it writes ([`Trace`]): `loopguard
//! explain` shows a request's components in order and its digest, computed
//! by exactly the path the filter takes (the filter's hashing sink ignores
//! the notes, so it pays nothing for them).

use super::config::{Config, Policy, Similarity, Volatile};
use super::llm::{self, Format, Message, Part};
use super::request::{self, RequestFacts, RequestHead};
use super::simhash;
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
            s.push(hex_digit(b >> 4));
            s.push(hex_digit(b & 15));
        }
        s
    }

    /// The key under which a shadow-mode policy counts this fingerprint: a
    /// key space of its own, so shadow counts never touch enforce counts
    /// and a policy switched to enforce starts from zero.
    pub fn shadow_key(&self) -> Fingerprint {
        let mut c = Canon::<Sha256>::new(b"lg/shadow/1");
        c.field(&self.0);
        c.finish().0
    }

    /// 64 well-mixed bits, for choosing a slot-table bucket.
    pub fn spread(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

/// A nibble (0..=15) as a lower-case hex digit.
fn hex_digit(nibble: u8) -> char {
    char::from_digit(u32::from(nibble), 16).unwrap_or('0')
}

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

/// One component of a fingerprint as `explain` shows it: what it is and
/// its value (text quoted, other bytes in hex, secrets redacted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    pub value: String,
}

impl Component {
    fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Component {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// Where framed components go: a SHA-256 stream, a plain buffer, or a
/// [`Trace`] that also notes what each component is.
pub trait Sink: Clone {
    fn put(&mut self, b: &[u8]);
    /// Note what the next bytes are (only a trace keeps it).
    #[inline]
    fn note(&mut self, _c: impl FnOnce() -> Component) {}
    /// Note components described elsewhere (a framed identity).
    #[inline]
    fn note_all(&mut self, _c: &[Component]) {}
}

/// A sink whose bytes are read back (the caller's identity is framed once
/// and absorbed into several digests).
pub trait Buffer: Sink + Default {
    /// An empty buffer with room for `n` bytes.
    fn sized(_n: usize) -> Self {
        Self::default()
    }
    fn bytes(&self) -> &[u8];
    fn components(&self) -> &[Component] {
        &[]
    }
}

/// A sink that ends in a digest: the filter's SHA-256 stream, or a trace.
pub trait Hashing: Sink + Default {
    /// Where the caller's identity is framed.
    type Buffer: Buffer;
    /// What is left besides the digest (a trace's components).
    type Residue;
    fn finish_digest(self) -> (Fingerprint, Self::Residue);
}

impl Sink for Sha256 {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.update(b);
    }
}

impl Hashing for Sha256 {
    type Buffer = Vec<u8>;
    type Residue = ();
    fn finish_digest(self) -> (Fingerprint, ()) {
        (truncate(&self.finalize()), ())
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

impl Buffer for Vec<u8> {
    fn sized(n: usize) -> Self {
        Vec::with_capacity(n)
    }
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// The canonical bytes of a fingerprint and what each component is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    pub bytes: Vec<u8>,
    pub components: Vec<Component>,
}

impl Sink for Trace {
    fn put(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
    }
    fn note(&mut self, c: impl FnOnce() -> Component) {
        self.components.push(c());
    }
    fn note_all(&mut self, c: &[Component]) {
        self.components.extend_from_slice(c);
    }
}

impl Buffer for Trace {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn components(&self) -> &[Component] {
        &self.components
    }
}

impl Hashing for Trace {
    type Buffer = Trace;
    type Residue = Trace;
    fn finish_digest(self) -> (Fingerprint, Trace) {
        (truncate(&<Sha256 as Digest>::digest(&self.bytes)), self)
    }
}

fn truncate(full: &[u8]) -> Fingerprint {
    let mut out = [0u8; 16];
    if let Some(head) = full.get(..16) {
        out.copy_from_slice(head);
    }
    Fingerprint(out)
}

/// Bytes as `explain` shows them: quoted text if printable UTF-8, else
/// hex; long values shortened.
pub fn show_bytes(b: &[u8]) -> String {
    const MAX: usize = 160;
    match std::str::from_utf8(b) {
        Ok(s) if !s.chars().any(char::is_control) => {
            if s.chars().count() > MAX {
                let cut: String = s.chars().take(MAX).collect();
                format!("{}... ({} bytes)", quoted(&cut), b.len())
            } else {
                quoted(s)
            }
        }
        _ => {
            let shown: String = b.iter().take(MAX / 2).map(|x| format!("{x:02x}")).collect();
            if b.len() > MAX / 2 {
                format!("0x{shown}... ({} bytes)", b.len())
            } else {
                format!("0x{shown}")
            }
        }
    }
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// Whether a header, query parameter or limit key by this name carries a
/// credential (`explain` never shows its value).
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    let n = n.rsplit(':').next().unwrap_or(&n);
    matches!(
        n,
        "authorization" | "proxy-authorization" | "cookie" | "key" | "sig" | "signature" | "code"
    ) || [
        "token",
        "secret",
        "password",
        "passwd",
        "api-key",
        "api_key",
        "apikey",
        "credential",
        "session",
    ]
    .iter()
    .any(|s| n.contains(s))
}

/// A path with the values of credential-like query parameters redacted
/// (`?key=AIza...` becomes `?key=<redacted>`), for `explain`.
pub fn redact_query(path: &str) -> String {
    let Some((p, q)) = path.split_once('?') else {
        return path.to_string();
    };
    let parts: Vec<String> = q
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if !v.is_empty() && is_secret_name(k) => format!("{k}=<redacted>"),
            _ => pair.to_string(),
        })
        .collect();
    format!("{p}?{}", parts.join("&"))
}

/// A value as `explain` shows it: redacted when its name says it is a
/// credential.
fn show_named(name: &str, b: &[u8]) -> String {
    if is_secret_name(name) {
        show_secret(b)
    } else {
        show_bytes(b)
    }
}

/// A secret (an API key) as `explain` shows it: never the value.
fn show_secret(b: &[u8]) -> String {
    let h = <Sha256 as Digest>::digest(b);
    let prefix: String = h.iter().take(4).map(|x| format!("{x:02x}")).collect();
    format!("<redacted: {} bytes, sha256 {prefix}...>", b.len())
}

/// Writes framed components: every field is length-prefixed and every
/// optional or variant value tagged, so the encoding is unambiguous.
#[derive(Clone)]
struct Canon<S>(S);

impl<S: Hashing> Canon<S> {
    fn new(domain: &[u8]) -> Self {
        let mut c = Canon(S::default());
        c.0.note(|| Component::new("domain", show_bytes(domain)));
        c.field(domain);
        c
    }

    fn finish(self) -> (Fingerprint, S::Residue) {
        self.0.finish_digest()
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
    /// A length-prefixed byte string, noted under `name`.
    fn named(&mut self, name: &str, b: &[u8]) {
        self.0.note(|| Component::new(name, show_bytes(b)));
        self.field(b);
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
    /// An optional value, noted under `name`.
    fn named_optional(&mut self, name: &str, v: Option<&[u8]>) {
        self.0
            .note(|| Component::new(name, v.map_or_else(|| "(absent)".to_string(), show_bytes)));
        self.optional(v);
    }
    /// The caller's identity, framed elsewhere: its components, then its
    /// bytes as one field.
    fn identity<B: Buffer>(&mut self, id: &B) {
        self.0.note_all(id.components());
        self.field(id.bytes());
    }
}

const TAG_ABSENT: u8 = 0;
const TAG_PRESENT: u8 = 1;
const TAG_LIMIT_KEYS: u8 = 2;
const TAG_API_KEY: u8 = 3;

/// A fingerprint in the making: what the headers phase knows (policy,
/// request line, caller identity, session id), waiting for the body. The
/// filter uses the SHA-256 form; `explain` the [`Trace`] form.
#[derive(Clone)]
pub struct Pending<S: Hashing = Sha256> {
    /// The exact fingerprint's canonical form so far: every mode falls back
    /// to it when the body is not an LLM request.
    exact: Canon<S>,
    policy_id: String,
    /// The caller's identity, framed: limit-key values, or the API key.
    /// Absorbed into every digest made for this request.
    identity: S::Buffer,
    path: String,
    mode: PendingMode,
    /// Conversation items the policy reads (see [`Policy::items_needed`]).
    keep: usize,
    /// What is masked in the tail before it is compared.
    volatile: Volatile,
}

impl<S: Hashing> std::fmt::Debug for Pending<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("policy", &self.policy_id)
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

#[derive(Clone)]
enum PendingMode {
    Exact,
    LlmTail { tail_messages: usize },
    Near { tail_messages: usize },
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
    /// Near mode: the SimHash of the masked tail (`fingerprint` then names
    /// the caller's record: policy, caller and model). `None` for a
    /// conversation with no model turn yet, fingerprinted exactly.
    pub near: Option<u64>,
}

impl Pending<Sha256> {
    pub fn start(
        config: &Config,
        policy: &Policy,
        head: &RequestHead<'_>,
        facts: &dyn RequestFacts,
    ) -> Self {
        Self::begin(config, policy, head, facts)
    }

    /// Finish with the whole request body (empty for a body-less request).
    pub fn finish(self, body: &[u8]) -> Fingerprinted {
        let parsed = if self.reads_llm_body() {
            llm::parse(body, &self.path, self.keep).ok()
        } else {
            None
        };
        self.finish_parsed(body, parsed.as_ref())
    }

    /// Finish with the body and what [`llm::parse`] made of it (parsed once
    /// by the caller, who may need it too).
    pub fn finish_parsed(self, body: &[u8], parsed: Option<&llm::Request<'_>>) -> Fingerprinted {
        self.complete(body, parsed).0
    }

    /// The caller's identity, framed (never logged or stored).
    pub fn identity(&self) -> &[u8] {
        &self.identity
    }
}

/// A request's fingerprint with the components that made it, in order.
#[derive(Debug, Clone)]
pub struct Explained {
    pub made: Fingerprinted,
    pub components: Vec<Component>,
    /// The canonical bytes that were hashed.
    pub canonical: Vec<u8>,
}

/// Fingerprint a request the way the filter does, noting every component
/// (`loopguard explain`).
pub fn explain(
    config: &Config,
    policy: &Policy,
    head: &RequestHead<'_>,
    facts: &dyn RequestFacts,
    body: &[u8],
) -> Explained {
    let pending = Pending::<Trace>::begin(config, policy, head, facts);
    let parsed = if pending.reads_llm_body() {
        llm::parse(body, &pending.path, pending.keep).ok()
    } else {
        None
    };
    let (made, trace) = pending.complete(body, parsed.as_ref());
    Explained {
        made,
        components: trace.components,
        canonical: trace.bytes,
    }
}

impl<S: Hashing> Pending<S> {
    fn begin(
        config: &Config,
        policy: &Policy,
        head: &RequestHead<'_>,
        facts: &dyn RequestFacts,
    ) -> Self {
        let identity: S::Buffer = identity(config, policy, head, facts);
        let mut exact = Canon::<S>::new(b"lg/exact/3");
        exact.named("policy", policy.id.as_bytes());
        exact.named("method", head.method.as_bytes());
        exact.named("path", head.path_only().as_bytes());
        let pairs = request::sorted_query_pairs(head.query());
        exact
            .0
            .note(|| Component::new("query parameters", pairs.len().to_string()));
        exact.count(pairs.len());
        for (k, v) in &pairs {
            exact.0.note(|| {
                let k = String::from_utf8_lossy(k);
                Component::new(format!("query {k}"), show_named(&k, v))
            });
            exact.field(k);
            exact.field(v);
        }
        exact.identity(&identity);
        let mode = match policy.detection.as_ref().map(|d| &d.similarity) {
            Some(Similarity::LlmTail { tail_messages }) => PendingMode::LlmTail {
                tail_messages: *tail_messages as usize,
            },
            Some(Similarity::Near { tail_messages, .. }) => PendingMode::Near {
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
            keep: policy.items_needed(),
            volatile: policy.volatile,
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

    /// Conversation items the policy reads.
    pub fn keep(&self) -> usize {
        self.keep
    }

    fn complete(
        self,
        body: &[u8],
        parsed: Option<&llm::Request<'_>>,
    ) -> (Fingerprinted, S::Residue) {
        let parsed = if self.reads_llm_body() { parsed } else { None };
        let Some(req) = parsed else {
            // A body-less request (a GET) is simply not an LLM call.
            let unparsed = !matches!(self.mode, PendingMode::Exact) && !body.is_empty();
            let (fingerprint, residue) = self.exact_with(body);
            return (
                Fingerprinted {
                    fingerprint,
                    fallback: false,
                    unparsed,
                    format: None,
                    model: None,
                    session: None,
                    near: None,
                },
                residue,
            );
        };
        let model = req.model.clone();
        let mut session_shown = None;
        let mut fallback = false;
        let mut near = None;
        let (fingerprint, residue) = match &self.mode {
            PendingMode::LlmTail { tail_messages } => {
                let mut c = Canon::<S>::new(b"lg/llm_tail/2");
                c.named("policy", self.policy_id.as_bytes());
                c.identity(&self.identity);
                c.named_optional("model", req.model.as_deref().map(str::as_bytes));
                let Some(mut tail) = req.tail(*tail_messages) else {
                    return self.unparsed(body);
                };
                self.volatile.mask_messages(&mut tail);
                c.0.note(|| Component::new("tail messages", tail.len().to_string()));
                c.count(tail.len());
                for (i, m) in tail.iter().enumerate() {
                    write_message(&mut c, m, i);
                }
                c.finish()
            }
            PendingMode::Near { tail_messages } => {
                // The fingerprint names the caller's record; the tail goes
                // into the SimHash compared inside it, salted with the
                // conversation's opening, so only turns of one task (or
                // the same task started again) can be near each other.
                let mut c = Canon::<S>::new(b"lg/near/2");
                c.named("policy", self.policy_id.as_bytes());
                c.identity(&self.identity);
                c.named_optional("model", req.model.as_deref().map(str::as_bytes));
                // The opening is digested and dropped before the tail is
                // read: a long first message is held once, not twice.
                let mut opening = req.opening();
                self.volatile.mask_opening(&mut opening);
                let salt = simhash::opening_salt(&opening);
                c.0.note(|| {
                    Component::new("opening (salts the SimHash)", opening.len().to_string())
                });
                for (i, m) in opening.iter().enumerate() {
                    note_message(&mut c.0, m, "opening", i);
                }
                drop(opening);
                let Some(mut tail) = req.tail(*tail_messages) else {
                    return self.unparsed(body);
                };
                self.volatile.mask_messages(&mut tail);
                let h = simhash::of_conversation(salt, &tail);
                c.0.note(|| {
                    Component::new("tail messages (in the SimHash)", tail.len().to_string())
                });
                for (i, m) in tail.iter().enumerate() {
                    note_message(&mut c.0, m, "message", i);
                }
                c.0.note(|| Component::new("simhash", format!("{h:016x}")));
                near = Some(h);
                c.finish()
            }
            PendingMode::Session { session } => {
                let mut c = Canon::<S>::new(b"lg/session/2");
                c.named("policy", self.policy_id.as_bytes());
                c.identity(&self.identity);
                match session {
                    Some(id) => {
                        c.tag(TAG_PRESENT);
                        c.named("session", id);
                        c.named_optional("model", req.model.as_deref().map(str::as_bytes));
                        c.0.note(|| {
                            Component::new(
                                "offers tools",
                                if req.offers_tools { "yes" } else { "no" },
                            )
                        });
                        c.tag(u8::from(req.offers_tools));
                        session_shown =
                            Some(String::from_utf8_lossy(id).chars().take(128).collect());
                    }
                    None => {
                        // One fingerprint per caller, judged by the
                        // fallback threshold.
                        c.0.note(|| {
                            Component::new("session", "(absent: judged by fallback_threshold)")
                        });
                        c.tag(TAG_ABSENT);
                        fallback = true;
                    }
                }
                c.finish()
            }
            PendingMode::Exact => self.exact_with(body),
        };
        (
            Fingerprinted {
                fingerprint,
                fallback,
                unparsed: false,
                format: Some(req.format),
                model,
                session: session_shown,
                near,
            },
            residue,
        )
    }

    /// The exact fingerprint of a body an LLM mode could not read.
    fn unparsed(&self, body: &[u8]) -> (Fingerprinted, S::Residue) {
        let (fingerprint, residue) = self.exact_with(body);
        (
            Fingerprinted {
                fingerprint,
                fallback: false,
                unparsed: !body.is_empty(),
                format: None,
                model: None,
                session: None,
                near: None,
            },
            residue,
        )
    }

    fn exact_with(&self, body: &[u8]) -> (Fingerprint, S::Residue) {
        let mut c = self.exact.clone();
        let crc = crc32fast::hash(body);
        c.0.note(|| Component::new("body crc32", format!("{crc:08x} ({} bytes)", body.len())));
        c.0.put(&crc.to_le_bytes());
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
    let mut c = Canon::<Sha256>::new(b"lg/tool-event/2");
    c.field(policy_id.as_bytes());
    c.field(identity);
    match req.first_message() {
        Some(m) => {
            c.tag(TAG_PRESENT);
            write_message(&mut c, &m, 0);
        }
        None => c.tag(TAG_ABSENT),
    }
    c.field(tier.as_bytes());
    c.field(tool.as_bytes());
    c.count(level as usize);
    c.finish().0
}

fn write_message<S: Sink>(c: &mut Canon<S>, m: &Message, index: usize) {
    note_message(&mut c.0, m, "message", index);
    c.field(m.role.as_bytes());
    write_parts(c, &m.parts);
}

/// Note a message and its parts (explain), in the order they are hashed;
/// near mode notes the opening and the tail that went into its SimHash
/// this way without hashing them.
fn note_message<S: Sink>(sink: &mut S, m: &Message, list: &str, index: usize) {
    sink.note(|| Component::new(labelled(list, index, "role"), show_bytes(m.role.as_bytes())));
    note_parts(sink, &m.parts, list, index);
}

fn note_parts<S: Sink>(sink: &mut S, parts: &[Part], list: &str, index: usize) {
    for p in parts {
        match p {
            Part::Text(t) => sink
                .note(|| Component::new(labelled(list, index, "text"), show_bytes(t.as_bytes()))),
            Part::Media(h) => {
                sink.note(|| Component::new(labelled(list, index, "media sha256"), show_bytes(h)))
            }
            Part::ToolCall { name, arguments } => sink.note(|| {
                Component::new(
                    labelled(list, index, "tool call"),
                    format!(
                        "{} {}",
                        show_bytes(name.as_bytes()),
                        show_bytes(arguments.as_bytes())
                    ),
                )
            }),
            Part::ToolResult { content, is_error } => {
                sink.note(|| {
                    Component::new(
                        labelled(list, index, "tool result"),
                        if *is_error { "(error)" } else { "(ok)" },
                    )
                });
                note_parts(sink, content, list, index);
            }
            Part::Other(kind) => sink.note(|| {
                Component::new(
                    labelled(list, index, "other block"),
                    show_bytes(kind.as_bytes()),
                )
            }),
        }
    }
}

/// A component's label (built only when tracing: the hashing sinks never
/// call the closures that use it): which list (the tail's messages, the
/// opening's), which item, what part.
fn labelled(list: &str, index: usize, what: &str) -> String {
    format!("{list}[{index}] {what}")
}

fn write_parts<S: Sink>(c: &mut Canon<S>, parts: &[Part]) {
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
/// stored, logged or returned (a trace shows it redacted), and two keys
/// never share a fingerprint.
fn identity<B: Buffer>(
    config: &Config,
    policy: &Policy,
    head: &RequestHead<'_>,
    facts: &dyn RequestFacts,
) -> B {
    let mut c = Canon(B::sized(48));
    if policy.limit_keys.is_empty() {
        c.tag(TAG_API_KEY);
        let key = request::api_key(facts);
        c.0.note(|| {
            Component::new(
                "caller: API key",
                key.as_deref()
                    .map_or_else(|| "(absent)".to_string(), show_secret),
            )
        });
        c.optional(key.as_deref());
    } else {
        c.tag(TAG_LIMIT_KEYS);
        c.count(policy.limit_keys.len());
        for key in &policy.limit_keys {
            let name = key.name();
            c.field(name.as_bytes());
            let values =
                request::limit_key_values(key, head, facts, &config.jwt_payload_in_metadata);
            c.0.note(|| {
                let shown = if values.is_empty() {
                    "(absent)".to_string()
                } else {
                    values
                        .iter()
                        .map(|v| show_named(&name, v))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                Component::new(format!("caller: {name}"), shown)
            });
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
    use crate::config::Config;
    use crate::request::tests::FakeFacts;
    use serde_json::json;
    use serde_json::Value;

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

    fn pin_config(similarity: Value, keys: Value) -> Config {
        let mut ld =
            json!({"enabled": true, "window_seconds": 60, "threshold_identical_requests": 5});
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
}
