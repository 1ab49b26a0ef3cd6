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

use crate::config::{Config, Policy, Similarity, Volatile};
use crate::detect::progress;
use crate::detect::similarity::{self, NearThreshold, Signature};
use crate::request::llm::{self, Format};
use crate::request::{self, RequestFacts, RequestHead};
use std::collections::HashMap;
use std::fmt;
mod canon;
#[cfg(test)]
mod digest_tests;
#[cfg(test)]
mod llm_tests;
mod show;
#[cfg(test)]
mod tests;
#[cfg(test)]
use canon::truncate;

use canon::{
    note_message, write_message, Canon, TAG_ABSENT, TAG_API_KEY, TAG_LIMIT_KEYS, TAG_PRESENT,
};
pub use canon::{Buffer, Component, Hashing, Sink, Trace};
use sha2::Sha256;
pub use show::{is_secret_name, redact_query, show_bytes};
use show::{show_named, show_secret};

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
    LlmTail {
        tail_messages: usize,
    },
    Near {
        tail_messages: usize,
        threshold: NearThreshold,
        /// Earlier turns to compare the newest tail with: as many as the
        /// ladder's last step needs.
        back: usize,
        /// The count at which the policy's first step applies: below it,
        /// repeats change nothing.
        needed: usize,
    },
    Session {
        session: Option<Vec<u8>>,
    },
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
    /// Near mode: the signature of the masked tail (`fingerprint` then
    /// names the caller's record: policy, caller and model), its anchor
    /// salted with the conversation's length, so the record matches a
    /// conversation sent again at the same length (a resend, an agent that
    /// sends no history), never an earlier turn of a growing one.
    pub near: Option<Signature>,
    /// Near mode: the newest turn and the earlier ones (as many as the
    /// ladder needs, back to one a user's new message started) whose tails
    /// are near its tail in the request's own history (1: none is; 0: not
    /// read). A growing conversation's repeats are judged by its turns,
    /// whatever their pace.
    pub repeats: u32,
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
        let reads = self.reads_progress();
        let history = progress_history(parsed.as_ref(), reads);
        let classes = self.volatile.classes;
        let progress = |back| progressed(parsed.as_ref(), history.as_ref(), classes, back);
        self.finish_parsed(body, parsed.as_ref(), &progress)
    }

    /// Finish with the body and what [`llm::parse`] made of it (parsed once
    /// by the caller, who may need it too); `progress(j)`: the answer `j`
    /// model turns back made progress over the one before it
    /// ([`progress::answer_progressed_at`]; 0, the newest, in near mode
    /// makes the tail repeat only as it is, and so for the earlier turns
    /// it is compared with), asked only for the turns compared.
    pub fn finish_parsed(
        self,
        body: &[u8],
        parsed: Option<&llm::Request<'_>>,
        progress: &dyn Fn(usize) -> bool,
    ) -> Fingerprinted {
        self.complete(body, parsed, progress).0
    }

    /// Whether finishing needs to know if the newest answer made progress
    /// (near mode).
    pub fn reads_progress(&self) -> bool {
        matches!(self.mode, PendingMode::Near { .. })
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
    let near = matches!(pending.mode, PendingMode::Near { .. });
    let history = progress_history(parsed.as_ref(), near);
    let classes = pending.volatile.classes;
    let progress = |back| progressed(parsed.as_ref(), history.as_ref(), classes, back);
    let (made, trace) = pending.complete(body, parsed.as_ref(), &progress);
    Explained {
        made,
        components: trace.components,
        canonical: trace.bytes,
    }
}

impl<S: Hashing> Pending<S> {
    /// How many earlier turns near mode compares the newest with (0 in the
    /// other modes).
    pub fn turns_back(&self) -> usize {
        match self.mode {
            PendingMode::Near { back, .. } => back,
            _ => 0,
        }
    }

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
            Some(Similarity::Near {
                tail_messages,
                similarity_milli,
                ..
            }) => PendingMode::Near {
                tail_messages: *tail_messages as usize,
                threshold: NearThreshold::from_milli(*similarity_milli),
                back: policy
                    .detection
                    .as_ref()
                    .map_or(0, crate::config::near_turns_back),
                needed: policy
                    .detection
                    .as_ref()
                    .map_or(1, |d| d.threshold().max(1) as usize),
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
        progress_at: &dyn Fn(usize) -> bool,
    ) -> (Fingerprinted, S::Residue) {
        let progress = matches!(self.mode, PendingMode::Near { .. }) && progress_at(0);
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
                    repeats: 0,
                },
                residue,
            );
        };
        let model = req.model.clone();
        let mut session_shown = None;
        let mut fallback = false;
        let mut near = None;
        let mut repeats = 0;
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
            PendingMode::Near {
                tail_messages,
                threshold,
                back,
                needed,
            } => {
                // The fingerprint names the caller's record; the tail goes
                // into the signature compared inside it, salted with the
                // conversation's task, so only turns of one task (or the
                // same task started again) can be near each other.
                let mut c = Canon::<S>::new(b"lg/near/3");
                c.named("policy", self.policy_id.as_bytes());
                c.identity(&self.identity);
                c.named_optional("model", req.model.as_deref().map(str::as_bytes));
                // The task is digested and dropped before the tail is
                // read: a long first message is held once, not twice.
                let mut task = req.task();
                self.volatile.mask_opening(&mut task);
                let salt = similarity::opening_salt(&task);
                c.0.note(|| {
                    Component::new(
                        "opening (its first user message salts the signature)",
                        task.len().to_string(),
                    )
                });
                for (i, m) in task.iter().enumerate() {
                    note_message(&mut c.0, m, "opening", i);
                }
                drop(task);
                let Some(mut tail) = req.tail_of_steps(*tail_messages) else {
                    return self.unparsed(body);
                };
                self.volatile.mask_messages(&mut tail);
                let mut h = similarity::of_conversation(salt, &tail, progress);
                // The turns before, back to one that answered a user's
                // message bringing something new (a dialogue going on):
                // each whose tail is near the newest counts as a repeat
                // (every turn of a loop, every round of a cycle).
                repeats = 1;
                // Each message is read and masked once, whatever number of
                // earlier tails hold it.
                let mut masked: HashMap<Option<usize>, llm::Message> = HashMap::new();
                let mut later: Option<Vec<llm::Message>> = None;
                let starts = req.turn_starts(*back);
                // What users wrote since the oldest turn compared, read once.
                let mut users: Option<Vec<(usize, llm::Message)>> = None;
                for (j, end) in starts.iter().copied().enumerate() {
                    // The rest cannot reach the first step: stop reading.
                    if (repeats as usize) + (starts.len() - j) < *needed {
                        break;
                    }
                    let Some(places) = req.tail_of_steps_at(*tail_messages, end) else {
                        break;
                    };
                    let read: Option<Vec<llm::Message>> = places
                        .into_iter()
                        .map(|at| {
                            if let Some(m) = masked.get(&at) {
                                return Some(m.clone());
                            }
                            let mut m = req.message_at(at)?;
                            self.volatile.mask_messages(std::slice::from_mut(&mut m));
                            masked.insert(at, m.clone());
                            Some(m)
                        })
                        .collect();
                    // A message that cannot be read: no earlier tail to
                    // compare (as when the newest tail cannot be read).
                    let Some(earlier) = read else {
                        break;
                    };
                    // A user's new message since that turn began (in its
                    // exchange or a later one): the conversation went on.
                    let until = starts.get(j.wrapping_sub(1)).copied().unwrap_or(usize::MAX);
                    if similarity::user_brought_news(later.as_deref().unwrap_or(&tail), &earlier)
                        || news_between(req, &mut users, end, until)
                    {
                        break;
                    }
                    // As the filter judged that turn: a turn whose answer
                    // made progress repeats only word for word.
                    let exact = progress_at(j + 1);
                    let e = similarity::of_conversation(salt, &earlier, exact);
                    if h.is_near(&e, *threshold) {
                        repeats += 1;
                    }
                    later = Some(earlier);
                }
                drop(masked);
                c.0.note(|| {
                    Component::new(
                        "earlier turns near the newest, it included (its history)",
                        repeats.to_string(),
                    )
                });
                h.anchor ^= similarity::position_salt(req.len());
                if progress {
                    c.0.note(|| {
                        Component::new(
                            "newest answer made progress",
                            "yes: the tail repeats only word for word",
                        )
                    });
                }
                c.0.note(|| {
                    Component::new("tail messages (in the signature)", tail.len().to_string())
                });
                for (i, m) in tail.iter().enumerate() {
                    note_message(&mut c.0, m, "message", i);
                }
                c.0.note(|| Component::new("signature anchor", format!("{:08x}", h.anchor)));
                c.0.note(|| Component::new("signature", h.hex()));
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
                repeats,
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
                repeats: 0,
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

/// The history near mode's progress rule reads, when it is read (`near`)
/// and readable.
fn progress_history(req: Option<&llm::Request<'_>>, near: bool) -> Option<llm::ToolHistory> {
    req.filter(|r| near && !r.over_budget())
        .map(|r| r.tool_history(None))
}

/// Whether the answer `back` turns ago made progress (false without a
/// history to read).
fn progressed(
    req: Option<&llm::Request<'_>>,
    history: Option<&llm::ToolHistory>,
    classes: crate::config::Classes,
    back: usize,
) -> bool {
    match (req, history) {
        (Some(req), Some(h)) => progress::answer_progressed_at(h, req, classes, None, back),
        _ => false,
    }
}

/// Whether a user's message among the items `from..to` brought news over
/// the user's message before it ([`similarity::user_brought_news`]); the
/// kept user messages are read once, on the first call.
fn news_between(
    req: &llm::Request<'_>,
    users: &mut Option<Vec<(usize, llm::Message)>>,
    from: usize,
    to: usize,
) -> bool {
    let all = users.get_or_insert_with(|| {
        let first = req
            .turn_starts(crate::config::MAX_NEAR_TURNS_BACK + 1)
            .last()
            .copied()
            .unwrap_or(0);
        req.user_messages_between(first.saturating_sub(1), usize::MAX)
    });
    all.iter().enumerate().any(|(k, (i, m))| {
        *i >= from
            && *i < to
            && similarity::user_brought_news(
                std::slice::from_ref(m),
                k.checked_sub(1)
                    .and_then(|p| all.get(p))
                    .map_or(&[][..], |(_, b)| std::slice::from_ref(b)),
            )
    })
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
