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

use super::*;
use crate::config::budget::{BudgetPer, SessionSource};
use crate::config::Policy;
use crate::request::llm;
use crate::request::RequestFacts;
use crate::state::redis::budget::BudgetKey;

/// A budget check or event is logged once per key within this interval
/// per worker.
const EVENT_EVERY_MS: u64 = 60_000;
/// Keys whose last event is remembered per worker.
const MAX_EVENT_MEMO: usize = 256;
/// Shared-store adds waiting for the tick or their answers, at most (more
/// are counted as unrecorded: the local table has them).
pub(super) const MAX_BUDGET_ADDS: usize = 1024;

/// A request under a policy with a budget.
#[derive(Debug, Default)]
pub(super) struct BudgetReq {
    policy: usize,
    /// A session id found in the headers: its source's place in
    /// `budget.session`, and its hash.
    header_session: Option<(usize, u64)>,
    /// The keys the request counts under, found with its body.
    keys: Vec<KeyOf>,
    /// The request body's length (an estimate's input).
    body_bytes: u64,
    /// The provider failed the attempt (a 5xx or a 429): not a call.
    failed: bool,
    /// Its response was added (once).
    added: bool,
}

impl BudgetReq {
    /// The request body's length.
    pub(super) fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    /// Whether the request counts under a key (its response adds to it).
    pub(super) fn has_keys(&self) -> bool {
        !self.keys.is_empty() && !self.added
    }
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
    pub(super) token: Option<u32>,
    after: Option<After>,
    phase: Phase,
    /// When the check was sent (the keys' time in the store).
    at: u64,
    resent: bool,
}

/// A response held until the shared store has its spending.
#[derive(Debug)]
pub(super) struct AddWait {
    pub(super) token: Option<u32>,
    add: BudgetAdd,
}

/// Spending added in the shared store (a held response's, or from the
/// tick).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BudgetAdd {
    pub(super) policy: usize,
    pub(super) caller: u64,
    pub(super) keys: Vec<BudgetKey>,
    pub(super) at: u64,
    pub(super) resent: bool,
}

/// The budget keys' shared state on this worker: key tags given their own
/// series, and when each key's last event was logged.
#[derive(Default)]
pub(super) struct BudgetMemo {
    /// Per policy and limit, the key tags with a series of their own, and
    /// its name.
    series: Vec<Vec<Vec<(u64, String)>>>,
    events: VecDeque<(u64, u64)>,
}

/// A key of `base` (a caller, session or conversation) under one limit.
fn key_of(base: u64, policy_id: &str, limit: &str) -> u64 {
    let mut h = crate::request::Fnv(base ^ 0x6275_6467_6574_0001);
    h.write(policy_id.as_bytes());
    h.write(&[0xff]);
    h.write(limit.as_bytes());
    h.0
}

/// A session id's hash, scoped to its caller.
fn session_hash(caller: u64, value: &[u8]) -> u64 {
    let mut h = crate::request::Fnv(caller ^ 0x7365_7373_696f_6e00);
    h.write(value);
    h.0
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
    /// The request headers of a request under a budget: remember the first
    /// session header it carries.
    pub(super) fn budget_headers(&self, r: &mut Request, policy: usize, facts: &dyn RequestFacts) {
        let Some(b) = self
            .config
            .policies
            .get(policy)
            .and_then(|p| p.budget.as_ref())
        else {
            return;
        };
        let header_session = if b.has_session() {
            b.session.iter().enumerate().find_map(|(i, s)| match s {
                SessionSource::Header(name) => facts
                    .header(name)
                    .filter(|v| !v.is_empty())
                    .map(|v| (i, session_hash(r.caller, &v))),
                SessionSource::Body(_) => None,
            })
        } else {
            None
        };
        r.budget = Some(Box::new(BudgetReq {
            policy,
            header_session,
            ..BudgetReq::default()
        }));
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
        let session = if b.has_session() {
            let before = req.header_session.map_or(b.session.len(), |(i, _)| i);
            b.session
                .iter()
                .take(before)
                .find_map(|s| match s {
                    SessionSource::Body(path) => {
                        body_field(body, path).map(|v| session_hash(caller, v))
                    }
                    SessionSource::Header(_) => None,
                })
                .or(req.header_session.map(|(_, h)| h))
        } else {
            None
        };
        let conversation = if b.has_conversation() {
            parsed
                .and_then(|q| q.first_raw())
                .map(|first| usage::conversation_key(caller, first))
        } else {
            None
        };
        req.keys.clear();
        if b.has_usd() {
            // Its response is priced by the request's model.
            let name = match parsed {
                Some(q) => q.model.as_deref().map(str::to_string),
                None => llm::model_of(body),
            };
            let model = self.priced(name.as_deref());
            if let Some(u) = r.usage_for.as_mut() {
                if u.model.is_none() {
                    u.model = model;
                }
            }
            if r.model.is_none() {
                r.model = name;
            }
        }
        let Some(req) = r.budget.as_deref_mut() else {
            return;
        };
        for (i, l) in b.limits.iter().enumerate() {
            let base = match l.per {
                BudgetPer::Caller => Some(caller),
                BudgetPer::Session => session,
                BudgetPer::Conversation => conversation,
            };
            if let Some(tag) = base {
                req.keys.push(KeyOf {
                    limit: i,
                    key: key_of(tag, &p.id, &l.name),
                    tag,
                });
            }
        }
        // Group by group: one read of the table per group.
        req.keys.sort_by_key(|k| k.tag);
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
        assert_ne!(session_hash(1, b"s"), session_hash(2, b"s"));
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
            spent_of(Some(&reported), true, 4000, none),
            (reported, false)
        );
        // Cut off after 50 events: the output is at least those.
        let cut = spent_of(
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
        );
        assert_eq!((cut.0.input, cut.0.output, cut.1), (100, 50, true));
        // No usage at all, a JSON body: bytes over four.
        let json = spent_of(
            None,
            true,
            4000,
            BytesRead {
                bytes: 800,
                ..BytesRead::default()
            },
        );
        assert_eq!((json.0.input, json.0.output, json.1), (1000, 200, true));
    }
}
