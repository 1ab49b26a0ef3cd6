//! Spend caps in the request flow: which budget keys a request counts
//! under (its caller, its session, its conversation), the check before it
//! goes upstream (the local table at once, or the shared store's call),
//! acting on the verdict ([`crate::act::budget`]), and adding what its
//! response spent once the response is over.
//!
//! Spending is read from responses as they pass, so a cap acts on the
//! request after the one whose response crossed it; requests already in
//! flight then are not stopped.

mod check;
mod spend;
mod stream;

pub(super) use stream::asks_stream_usage;

use super::{policy_with, usage, Engine, Phase, Request};
use crate::config::budget::{Budget, BudgetPer, SessionSource};
use crate::config::Policy;
use crate::detect::fingerprint::Fingerprinted;
use crate::request::{llm, RequestFacts};
use crate::state::redis::budget::BudgetKey;
use crate::state::store::{BucketBackend, Hit};
use BudgetPer::{Conversation, Session, User};

/// A request under a policy with a budget.
#[derive(Debug, Default)]
pub(super) struct BudgetReq {
    policy: usize,
    /// A session id found in the headers: its source's place in
    /// `budget.session`, and its hash.
    header_session: Option<(usize, u64)>,
    /// An end user's id found in the headers: its source's place in
    /// `budget.user`, and its hash.
    header_user: Option<(usize, u64)>,
    /// The keys the request counts under: those its headers name at
    /// first, all of them once its body is read.
    keys: Vec<KeyOf>,
    /// What its response is priced at under a dollar cap (`None`: not
    /// yet known, or charged nothing).
    price: Option<Price>,
    /// The output limit its body sets (`max_tokens` and the like): what an
    /// estimate charges at least.
    output_limit: Option<u64>,
    /// The cost the upstream reported in a response header, micro-dollars.
    reported_cost: Option<u64>,
    /// A cap counts dollars (a reported cost is read).
    pub(super) dollars: bool,
    /// An LLM API's path that generates text (an estimate charges its
    /// output limit).
    generates: bool,
    /// The gateway gave up waiting for the answer (a `504`): the provider
    /// may still bill the generation, so it is estimated.
    timed_out: bool,
    /// The provider refused the request (a `4xx` other than `408` and
    /// `429`): a call that generated nothing.
    refused: bool,
    /// loopguard asked for the stream's usage: what that adds to the
    /// answer is taken out.
    strip: Option<Box<crate::response::stream_usage::StripUsage>>,
    /// The request body's length (an estimate's input).
    body_bytes: u64,
    /// The provider failed the attempt (a 5xx or a 429): not a call.
    failed: bool,
    /// Its response was added (once).
    added: bool,
}

impl BudgetReq {
    /// The request body's length when it is not read (too large): its
    /// declared or buffered length.
    pub(super) fn set_body_bytes(&mut self, n: u64) {
        if self.body_bytes == 0 {
            self.body_bytes = n;
        }
    }

    /// Whether the response may wait for the shared store to have its
    /// spending: the request counts under a key (its response adds to it),
    /// and no start of a stream's event is held back from the client (it
    /// must be sent before the response is held).
    pub(super) fn may_settle(&self) -> bool {
        !self.keys.is_empty() && !self.added && !self.strip.as_ref().is_some_and(|s| s.holding())
    }
}

/// How a request's response is priced under a dollar cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Price {
    pub(super) rate: crate::config::prices::Rate,
    /// No price list names the model: charged as `budget.unpriced` says
    /// (the model's name, for the warning).
    pub(super) unpriced: Option<String>,
    /// What it is charged as: the price's name and source
    /// (`gpt-4o (table)`, `openai (provider_max)`, `nothing (ignore)`).
    pub(super) charged_as: String,
}

/// One budget key of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyOf {
    limit: usize,
    key: u64,
    /// The caller, session or conversation (the `key` tag).
    tag: u64,
}

/// What waits for a budget check: a hit to count next.
#[derive(Debug)]
pub(super) struct After {
    pub(super) policy: usize,
    pub(super) made: Fingerprinted,
    pub(super) hit: Hit,
}

/// A request waiting for the shared store's budget answer.
#[derive(Debug)]
pub(super) struct BudgetWait {
    after: Option<After>,
    phase: Phase,
}

/// Spending added in the shared store (a held response's, or from the
/// tick).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BudgetAdd {
    pub(super) policy: usize,
    pub(super) caller: u64,
    pub(super) keys: Vec<BudgetKey>,
    pub(super) at: u64,
}

/// The budget keys' series on this worker: per policy and limit, the key
/// tags given a series of their own, and its name.
#[derive(Default)]
pub(super) struct BudgetMemo {
    series: Vec<Vec<Vec<(u64, String)>>>,
}

/// A key of `base` (a caller, session or conversation) under one limit.
fn key_of(base: u64, policy_id: &str, limit: &str) -> u64 {
    let mut h = crate::request::Fnv(base ^ 0x6275_6467_6574_0001);
    h.write(policy_id.as_bytes());
    h.write(&[0xff]);
    h.write(limit.as_bytes());
    h.0
}

/// What an id's hash is scoped by, with its caller: a session id's, an
/// end user's.
const SESSION: u64 = 0x7365_7373_696f_6e00;
const USER: u64 = 0x7573_6572_0000_0001;

/// A session id's or end user's hash, scoped to its caller (`kind`:
/// [`SESSION`] or [`USER`]).
fn id_hash(kind: u64, caller: u64, value: &[u8]) -> u64 {
    let mut h = crate::request::Fnv(caller ^ kind);
    h.write(value);
    h.0
}

/// The first id the request headers carry from `sources`: its source's
/// place in the list and its hash (`hash` scopes it to the caller).
fn header_id(
    sources: &[SessionSource],
    facts: &dyn RequestFacts,
    jwt_payload_key: &str,
    hash: impl Fn(&[u8]) -> u64,
) -> Option<(usize, u64)> {
    sources.iter().enumerate().find_map(|(i, s)| {
        let v = match s {
            SessionSource::Header(name) => facts.header(name),
            SessionSource::Jwt(claim) => facts
                .header("authorization")
                .and_then(|auth| crate::request::jwt_claim(&auth, claim)),
            SessionSource::JwtVerified(claim) => facts.verified_claim(jwt_payload_key, claim),
            SessionSource::Body(_) => None,
        }?;
        (!v.is_empty()).then(|| (i, hash(&v)))
    })
}

/// An id known from the headers alone: the first source found in the
/// headers, unless a body source comes before it (then the body decides).
fn known_from_headers(sources: &[SessionSource], found: Option<(usize, u64)>) -> Option<u64> {
    let (i, h) = found?;
    sources
        .iter()
        .take(i)
        .all(SessionSource::in_headers)
        .then_some(h)
}

/// The id a request names, with its body: the first source found, body
/// sources read from `body`.
fn id_with_body(
    sources: &[SessionSource],
    found: Option<(usize, u64)>,
    body: &[u8],
    hash: impl Fn(&[u8]) -> u64,
) -> Option<u64> {
    let before = found.map_or(sources.len(), |(i, _)| i);
    sources
        .iter()
        .take(before)
        .find_map(|s| match s {
            SessionSource::Body(path) => body_field(body, path).map(&hash),
            _ => None,
        })
        .or(found.map(|(_, h)| h))
}

/// A field of the body's top-level object, or a field of one (`a.b`): its
/// value's raw bytes (a string with its quotes, a number), if a string or
/// a number.
fn body_field<'b>(body: &'b [u8], path: &[String]) -> Option<&'b [u8]> {
    use llm::scan::Members;
    let mut span = (0, body.len());
    for (depth, name) in path.iter().enumerate() {
        let (_, found) = Members::new(body, span)?.find(|(k, _)| *k == name.as_bytes())?;
        span = found;
        if depth + 1 < path.len() && body.get(llm::scan::skip_ws(body, span.0)) != Some(&b'{') {
            return None;
        }
    }
    let v = body.get(span.0..span.1)?;
    match v.first()? {
        // A string's contents (escapes as written), as a header would carry
        // the same id.
        b'"' if v.len() > 2 => v.get(1..v.len() - 1),
        b'-' | b'0'..=b'9' => Some(v),
        _ => None,
    }
}

impl<B: BucketBackend> Engine<B> {
    /// The request headers of a request under a budget: the ids they
    /// carry (a session's, an end user's), for its keys.
    pub(super) fn budget_headers(
        &self,
        r: &mut Request,
        policy: usize,
        path: &str,
        facts: &dyn RequestFacts,
    ) {
        let Some((_, b)) = policy_with(&self.config, policy, |p| p.budget.as_ref()) else {
            return;
        };
        let caller = r.caller;
        let jwt = self.config.jwt_payload_in_metadata.as_str();
        let id = |has: bool, sources, kind| {
            has.then(|| header_id(sources, facts, jwt, |v| id_hash(kind, caller, v)))
                .flatten()
        };
        let header_session = id(b.has_per(Session), &b.session, SESSION);
        let header_user = id(b.has_per(User), &b.user, USER);
        r.budget = Some(Box::new(BudgetReq {
            policy,
            header_session,
            header_user,
            dollars: b.has_usd(),
            generates: llm::is_llm_api_path(path),
            ..BudgetReq::default()
        }));
    }

    /// A request judged without its body (none, too large, unreadable, a
    /// tunnel): the keys its headers name (the caller's, and a session or
    /// end user named there).
    pub(super) fn budget_header_keys(&self, r: &mut Request) {
        let caller = r.caller;
        let Some(req) = r.budget.as_deref_mut() else {
            return;
        };
        let Some((p, b)) = policy_with(&self.config, req.policy, |p| p.budget.as_ref()) else {
            return;
        };
        let session = known_from_headers(&b.session, req.header_session);
        let user = known_from_headers(&b.user, req.header_user);
        set_keys(req, p, b, caller, [session, user, None]);
    }

    /// The body of a request under a budget: the keys it counts under.
    pub(super) fn budget_keys(
        &self,
        r: &mut Request,
        p: &Policy,
        body: &[u8],
        parsed: Option<&llm::Request<'_>>,
    ) {
        let (Some(b), Some(req)) = (p.budget.as_ref(), r.budget.as_deref_mut()) else {
            return;
        };
        req.body_bytes = body.len() as u64;
        let caller = r.caller;
        let id = |has: bool, sources, found, kind| {
            has.then(|| id_with_body(sources, found, body, |v| id_hash(kind, caller, v)))
                .flatten()
        };
        let session = id(b.has_per(Session), &b.session, req.header_session, SESSION);
        let user = id(b.has_per(User), &b.user, req.header_user, USER);
        let conversation = parsed
            .filter(|_| b.has_per(Conversation))
            .and_then(|q| q.first_raw())
            .map(|first| usage::conversation_key(caller, first));
        set_keys(req, p, b, caller, [session, user, conversation]);
        req.output_limit = match parsed {
            Some(q) => q.output_limit,
            // Unparsed (exact mode): one search spares most bodies the scan.
            None if memchr::memmem::find(body, b"\"max_").is_some() => llm::OUTPUT_LIMIT_FIELDS
                .iter()
                .find_map(|f| body_field(body, &[(*f).to_string()]))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok()),
            None => None,
        };
        // A generation (an LLM API's path whose body names a model): an
        // estimate charges its output limit. Embeddings, moderation and
        // other calls generate no text.
        let named = match parsed {
            Some(q) => q.model.is_some(),
            None => memchr::memmem::find(body, b"\"model\"").is_some(),
        };
        if named && req.generates && req.output_limit.is_none() {
            req.output_limit = Some(spend::DEFAULT_OUTPUT_ESTIMATE);
        }
        if b.has_usd() {
            let name = match parsed {
                Some(q) => q.model.as_deref().map(str::to_string),
                None => llm::model_of(body),
            };
            // Its response is priced by the request's model.
            let model = self.priced(name.as_deref());
            if let Some(u) = r.usage_for.as_mut() {
                u.model = u.model.or(model);
            }
            if let (Some(n), Some(req)) = (name.as_deref(), r.budget.as_deref_mut()) {
                req.price = Some(price_of(&self.config.prices, b, n));
            }
            r.model = r.model.take().or(name);
        }
    }
}

/// The keys a request counts under, given whose they are (its session,
/// end user and conversation; `None`: not known), group by group (one
/// read of the table per group).
fn set_keys(
    req: &mut BudgetReq,
    p: &Policy,
    b: &Budget,
    caller: u64,
    [session, user, conversation]: [Option<u64>; 3],
) {
    req.keys.clear();
    for (i, l) in b.limits.iter().enumerate() {
        let base = match l.per {
            BudgetPer::Caller => Some(caller),
            Session => session,
            User => user,
            Conversation => conversation,
        };
        if let Some(tag) = base {
            req.keys.push(KeyOf {
                limit: i,
                key: key_of(tag, &p.id, &l.name),
                tag,
            });
        }
    }
    req.keys.sort_by_key(|k| k.tag);
}

/// What a model's calls are charged at under a dollar cap: its price, or
/// for a model no list prices, what `budget.unpriced` says (`Reject`
/// prices it like `Max`: the request is refused before it spends).
pub(super) fn price_of(
    prices: &crate::config::Prices,
    b: &crate::config::budget::Budget,
    model: &str,
) -> Price {
    use crate::config::budget::Unpriced;
    let (p, unpriced) = match (prices.price_of(model), b.unpriced) {
        (Some(p), _) => (p, None),
        (None, Unpriced::Max | Unpriced::Reject) => (prices.highest_for(model), Some(model)),
        (None, Unpriced::Ignore) => {
            return Price {
                rate: crate::config::prices::Rate::default(),
                unpriced: Some(model.to_string()),
                charged_as: "nothing (ignore)".to_string(),
            }
        }
    };
    Price {
        rate: p.rate,
        unpriced: unpriced.map(str::to_string),
        charged_as: format!("{} ({})", p.resolved, p.source.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_fields_are_read_at_the_top_and_one_level_down() {
        let body = br#"{"messages":[{"role":"user","content":"{\"user\":\"x\"}"}],"user":"u-1","metadata":{"session_id":"s-9","n":3},"seed":42}"#;
        let path = |p: &str| p.split('.').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(body_field(body, &path("user")), Some(&b"u-1"[..]));
        assert_eq!(
            body_field(body, &path("metadata.session_id")),
            Some(&b"s-9"[..])
        );
        assert_eq!(body_field(body, &path("metadata.n")), Some(&b"3"[..]));
        assert_eq!(body_field(body, &path("seed")), Some(&b"42"[..]));
        assert_eq!(body_field(body, &path("messages")), None);
        assert_eq!(body_field(body, &path("user.x")), None);
        assert_eq!(body_field(body, &path("missing")), None);
        assert_eq!(body_field(br#"{"user":""}"#, &path("user")), None);
        assert_eq!(body_field(b"not json", &path("user")), None);
    }

    #[test]
    fn sessions_are_scoped_to_their_caller() {
        assert_ne!(id_hash(SESSION, 1, b"s"), id_hash(SESSION, 2, b"s"));
        assert_ne!(key_of(7, "p", "a"), key_of(7, "p", "b"));
        assert_ne!(key_of(7, "p", "a"), key_of(7, "q", "a"));
    }

    #[test]
    fn estimates_fill_in_what_a_response_did_not_report() {
        use super::spend::spent_of;
        use crate::response::usage::{BytesRead, Usage};
        let reported = Usage {
            input: 100,
            output: 20,
            ..Usage::default()
        };
        let none = BytesRead::default();
        assert_eq!(
            spent_of(Some(&reported), true, 4000, none, 4096),
            (reported, false)
        );
        // Cut off after 50 events: the output is at least those, and at
        // least the request's output limit.
        let cut = |limit| {
            spent_of(
                Some(&Usage {
                    input: 100,
                    ..Usage::default()
                }),
                false,
                4000,
                BytesRead {
                    bytes: 9000,
                    events: 50,
                    closed: false,
                },
                limit,
            )
        };
        assert_eq!((cut(0).0.input, cut(0).0.output, cut(0).1), (100, 50, true));
        assert_eq!(cut(2000).0.output, 2000);
        // No usage at all, a JSON body: bytes over four, or the limit.
        let json = |limit| {
            spent_of(
                None,
                true,
                4000,
                BytesRead {
                    bytes: 800,
                    ..BytesRead::default()
                },
                limit,
            )
        };
        assert_eq!(
            (json(0).0.input, json(0).0.output, json(0).1),
            (1000, 200, true)
        );
        assert_eq!(json(4096).0.output, 4096);
    }
}
