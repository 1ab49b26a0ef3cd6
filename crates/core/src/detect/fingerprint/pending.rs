//! The headers phase: a [`Pending`] fingerprint holds what the request's
//! head tells (policy, request line, caller identity, session id) and the
//! mode that will read the body; [`explain`] runs it to the end with every
//! component noted.

use super::canon::Canon;
use super::identity::identity;
use super::show::show_named;
use super::{Component, Fingerprinted, Hashing, Trace};
use crate::config::{Config, Policy, Similarity, Volatile};
use crate::detect::progress;
use crate::detect::similarity::NearThreshold;
use crate::request::llm;
use crate::request::{self, RequestFacts, RequestHead};
use sha2::Sha256;

/// A fingerprint in the making: what the headers phase knows (policy,
/// request line, caller identity, session id), waiting for the body. The
/// filter uses the SHA-256 form; `explain` the [`Trace`] form.
#[derive(Clone)]
pub struct Pending<S: Hashing = Sha256> {
    /// The exact fingerprint's canonical form so far: every mode falls back
    /// to it when the body is not an LLM request.
    pub(super) exact: Canon<S>,
    pub(super) policy_id: String,
    /// The caller's identity, framed: limit-key values, or the API key.
    /// Absorbed into every digest made for this request.
    pub(super) identity: S::Buffer,
    path: String,
    pub(super) mode: PendingMode,
    /// Conversation items the policy reads (see [`Policy::items_needed`]).
    keep: usize,
    /// What is masked in the tail before it is compared.
    pub(super) volatile: Volatile,
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
pub(super) enum PendingMode {
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
        self.parse_and_complete(body).0
    }

    /// Finish with the body and what [`llm::parse`] made of it (parsed once
    /// by the caller, who may need it too); `progress(j)`: the answer `j`
    /// model turns back made progress over the one before it
    /// ([`progress::turn_progressed_at`]; 0, the newest, in near mode
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
    let (made, trace) = pending.parse_and_complete(body);
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
        exact.note("query parameters", || pairs.len().to_string());
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
        let mode = match policy.detection.as_ref().map(|d| (d, &d.similarity)) {
            Some((_, Similarity::LlmTail { tail_messages })) => PendingMode::LlmTail {
                tail_messages: *tail_messages as usize,
            },
            Some((
                d,
                Similarity::Near {
                    tail_messages,
                    similarity_milli,
                    ..
                },
            )) => PendingMode::Near {
                tail_messages: *tail_messages as usize,
                threshold: NearThreshold::from_milli(*similarity_milli),
                back: crate::config::near_turns_back(d),
                needed: d.threshold().max(1) as usize,
            },
            Some((_, Similarity::Session { header, .. })) => PendingMode::Session {
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

    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Parse the body (when the mode reads it) and finish with it, near
    /// mode's progress rule reading the request's history (false without
    /// one to read).
    fn parse_and_complete(self, body: &[u8]) -> (Fingerprinted, S::Residue) {
        let parsed = self
            .reads_llm_body()
            .then(|| llm::parse(body, &self.path, self.keep).ok())
            .flatten();
        let near = matches!(self.mode, PendingMode::Near { .. });
        let history = parsed
            .as_ref()
            .filter(|r| near && !r.over_budget())
            .map(|r| r.tool_history(None));
        let classes = self.volatile.classes;
        let progress = |back| match (&parsed, &history) {
            (Some(req), Some(h)) => progress::turn_progressed_at(h, req, classes, None, back),
            _ => false,
        };
        self.complete(body, parsed.as_ref(), &progress)
    }
}
