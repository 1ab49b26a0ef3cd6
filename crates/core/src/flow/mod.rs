//! The request flow as a state machine with no I/O.
//!
//! The host feeds it events with plain facts (a request's headers, a body
//! chunk or its end, a store call's reply, a tick, a client gone) and it
//! answers with effects (add or remove request headers, set filter state,
//! replace the body, send a local reply or a store call, resume a held
//! request, count a metric, log a line) and whether the request goes on
//! ([`Step::Continue`]) or waits ([`Step::Pause`]). Every decision is made
//! here: which policy applies, which store counts a hit and what its
//! failure means, what shadow mode reports, how tool-loop events are
//! deduplicated, how bodies and `content-length` are handled. The host
//! only translates between proxy-wasm and these types, so the whole flow is
//! tested natively (`flow/tests.rs` and the `flow/*_tests.rs` beside it).
//!
//! The files go by guard: `repeats.rs`, `tool_loops.rs`, `mcp.rs`,
//! `budget/` (and `usage.rs`, a response's usage and the loops'
//! spending), each reached from `phases/` (where each host event enters)
//! and each carrying out its verdict through `enact.rs`; `store/` is the
//! shared store's round trip every guard uses.
//!
//! One [`Engine`] per plugin instance and worker holds the configuration
//! and what the worker's requests share (the fingerprint table through a
//! [`BucketBackend`], the throttle queue, the hold probe, the alert queue);
//! one [`Request`] per stream holds where that request is.

mod budget;
mod enact;
mod mcp;
mod phases;
mod repeats;
mod store;
mod tool_loops;
mod usage;

#[cfg(test)]
mod alert_tests;
#[cfg(test)]
mod body_tests;
#[cfg(test)]
mod budget_gaps_tests;
#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod drift_tests;
#[cfg(test)]
mod hold_tests;
#[cfg(test)]
mod mcp_shared_tests;
#[cfg(test)]
mod mcp_tests;
#[cfg(test)]
mod retry_tests;
#[cfg(test)]
mod spend_tests;
#[cfg(test)]
mod store_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tool_loop_tests;
#[cfg(test)]
mod usage_tests;

use crate::act::delay_queue::DelayQueue;
use crate::act::events::Alert;
use crate::act::hold::HeaderHold;
use crate::act::reply::{Api, Headers, LocalReply};
use crate::config::{Config, StoreConfig};
use crate::detect::fingerprint::{Fingerprinted, Pending};
use crate::detect::progress::TextCache;
use crate::metrics::{MetricId, Registry};
use crate::request::llm::CallCache;
use crate::state::redis::RedisStore;
use crate::state::slot_table::TableLayout;
use crate::state::store::{BucketBackend, Hit, SlotStore, StoreCall, TakeBack};
use std::collections::VecDeque;
use std::rc::Rc;

/// Whether the request goes on or waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Continue,
    Pause,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// Something the host does for the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    AddRequestHeader(&'static str, String),
    RemoveRequestHeader(&'static str),
    AddResponseHeader(&'static str, String),
    /// Remove a response header (in the response headers phase).
    RemoveResponseHeader(&'static str),
    /// Replace the response body chunk at hand (`old_len` bytes) with
    /// `body` (an MCP result with a note inserted).
    ReplaceResponseBody {
        old_len: usize,
        body: Vec<u8>,
    },
    /// Envoy filter state `wasm.<name>`.
    SetFilterState(String, String),
    /// Replace the buffered body (`old_len` bytes); with `set_length`, set
    /// `content-length` to the new size once the body is replaced.
    ReplaceBody {
        old_len: usize,
        body: Vec<u8>,
        set_length: bool,
    },
    /// Answer the request instead of forwarding it (then the request is
    /// paused for good).
    LocalReply(LocalReply, &'static str),
    /// Send a store call for this request; report the outcome with
    /// [`Engine::on_call_sent`].
    SendStoreCall(StoreCall),
    /// Send a call from the root context (a webhook alert, a shared-store
    /// write): report its token (or why it could not be sent) under `id`
    /// with [`Engine::on_root_call_sent`], and its answer with
    /// [`Engine::on_root_reply`].
    SendFromRoot {
        id: u32,
        call: StoreCall,
    },
    /// Resume the paused request of this stream (from a tick).
    Resume(u32),
    /// Make sure the tick runs (something waits for it).
    ArmTick,
    /// Nothing waits for the tick any more.
    StopTick,
    /// Add to a counter or gauge.
    Count(MetricId, i64),
    /// Add to a counter known by its full name (defined by the host when
    /// first counted; names are bounded by the engine).
    CountNamed(String, i64),
    /// Record a histogram value.
    Record(MetricId, u64),
    Log(Level, String),
}

/// Effects, appended to by each event (the host keeps one buffer and
/// drains it after every event: no allocation per request once warm).
pub type Effects = Vec<Effect>;

/// Which request phase a decision is made in: whether the request headers
/// can still be changed (in the headers phase, or later while loopguard
/// holds them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    HeadersHeld,
    HeadersSent,
}

/// Where one request is. (The buffering variant is large; the state lives
/// inside the stream's own allocation, and boxing it would cost an
/// allocation per request.)
#[derive(Debug, Default)]
#[allow(clippy::large_enum_variant)]
enum State {
    /// Nothing (more) to do.
    #[default]
    Pass,
    /// Waiting for the whole body.
    Buffering { policy: usize, pending: Pending },
    /// Paused by a throttle until a tick resumes it.
    Held,
    /// Paused until the shared store answers a call (a loop's hit, a
    /// budget check, an MCP history), or the response's end held until it
    /// has a write.
    Asking(Box<store::asks::Asking>),
    /// The client left.
    Done,
}

/// A request waiting for the shared store's answer.
#[derive(Debug)]
struct Waiting {
    policy: usize,
    made: Fingerprinted,
    phase: Phase,
    hit: Hit,
    /// When the request started waiting: a throttle's delay counts from
    /// here, so the store's latency is part of it.
    since_ms: u64,
}

/// One stream's request, as the engine tracks it.
#[derive(Debug, Default)]
pub struct Request {
    /// The host's id for the stream (the throttle queue and the hold probe
    /// name requests by it).
    pub id: u32,
    state: State,
    /// Body bytes buffered so far.
    body_len: usize,
    /// The largest body judged (the configuration's `max_body_bytes`).
    body_limit: u64,
    /// Headers for the client's response (warn, throttle, tool loops).
    response_headers: Headers,
    /// Whose error shape a 429 takes.
    api: Api,
    /// loopguard holds the request headers until it has judged the body.
    headers_held: bool,
    /// The headers phase dropped `content-length` so the body may change
    /// size (the buffer filter sets it again).
    length_dropped: bool,
    /// A body (or trailers) callback has come.
    body_seen: bool,
    /// The hit this request recorded, while it goes upstream: taken back
    /// if the provider fails the attempt.
    counted: Option<Counted>,
    /// The policy whose tokens the response's usage adds to, and whether
    /// the request was part of a detected loop.
    usage_for: Option<UsageFor>,
    /// The response body's usage, read as it passes.
    usage: Option<Box<crate::response::usage::UsageReader>>,
    /// A hash of who is calling under the policy (its limit keys, or the
    /// API key): the caller label of loop metrics.
    caller: u64,
    /// Counted as a caller's loop request already.
    loop_counted: bool,
    /// The request's model, while its response is read (for events).
    model: Option<String>,
    /// When its headers arrived (the time its response's spending is
    /// dated by).
    started_ms: u64,
    /// An MCP request under a policy with `mcp`.
    mcp: Option<Box<mcp::McpStream>>,
    /// A request under a policy with a budget.
    budget: Option<Box<budget::BudgetReq>>,
}

/// Whose tokens a response's usage is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct UsageFor {
    policy: usize,
    in_loop: bool,
    /// The loop (ledger) key its spending adds to: the fingerprint its hit
    /// was counted under, or (a tool-loop policy without loop detection)
    /// its conversation.
    loop_key: Option<u64>,
    /// The priced model of its request (`None`: unpriced or unknown).
    model: Option<usize>,
}

/// A hit a forwarded request recorded.
#[derive(Debug, Clone, Copy)]
struct Counted {
    policy: usize,
    take_back: TakeBack,
    /// Recorded in the shared store (else in the local table).
    shared: bool,
}

/// What a call sent from the root context is for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RootCall {
    Alert,
    Write(store::writes::Sending),
}

/// Calls from the root context: store writes waiting for the tick, the
/// calls handed to the host and not yet reported (by the id the engine
/// gave each), and the writes sent and waiting for their answers, by
/// token.
#[derive(Default)]
struct RootCalls {
    queued: VecDeque<(store::writes::Sending, StoreCall)>,
    sent: VecDeque<(u32, RootCall)>,
    awaiting: VecDeque<(u32, store::writes::Sending)>,
    next_id: u32,
}

impl RootCalls {
    /// Hand a call to the host: the effect sending it, under a new id.
    fn send(&mut self, what: RootCall, call: StoreCall) -> Effect {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        self.sent.push_back((id, what));
        Effect::SendFromRoot { id, call }
    }

    /// The call reported under `id`.
    fn reported(&mut self, id: u32) -> Option<RootCall> {
        let i = self.sent.iter().position(|(i, _)| *i == id)?;
        self.sent.remove(i).map(|(_, what)| what)
    }
}

impl Request {
    pub fn new(id: u32) -> Request {
        Request {
            id,
            ..Request::default()
        }
    }

    /// Whether its request headers can still be changed: held by
    /// loopguard, or already gone upstream.
    fn phase(&self) -> Phase {
        if self.headers_held {
            Phase::HeadersHeld
        } else {
            Phase::HeadersSent
        }
    }

    /// Whether the engine will read the body at this body callback: the
    /// host then hands it over ([`Engine::on_body`]).
    pub fn wants_body(&self, size: usize, end_of_stream: bool) -> bool {
        end_of_stream && self.wants_body_now(size)
    }

    /// Whether the engine will read the body when the trailers come.
    pub fn wants_body_at_trailers(&self) -> bool {
        self.wants_body_now(self.body_len)
    }

    fn wants_body_now(&self, size: usize) -> bool {
        matches!(self.state, State::Buffering { .. }) && size as u64 <= self.body_limit
    }

    /// The headers the client's response will carry (warn, throttle,
    /// tool loops), added when the response headers pass.
    pub fn client_headers(&self) -> &[(&'static str, String)] {
        &self.response_headers
    }

    /// Whether the response (not the request) waits for a store call: the
    /// host resumes the response when [`Engine::on_store_reply`] says
    /// [`Step::Continue`].
    pub fn response_held(&self) -> bool {
        matches!(&self.state, State::Asking(a) if matches!(a.what, store::asks::Ask::Held(_)))
    }

    /// The body length buffered so far (for reading it at the trailers).
    pub fn body_len(&self) -> usize {
        self.body_len
    }
}

/// Webhook alerts waiting for the tick.
struct Alerts {
    webhook: Option<crate::config::Webhook>,
    secret: Option<Vec<u8>>,
    queue: VecDeque<Alert>,
}

/// Alerts waiting to be sent, per worker; more are dropped and counted.
pub const MAX_QUEUED_ALERTS: usize = 256;
/// Alerts dispatched per tick.
const ALERTS_PER_TICK: usize = 32;
/// Repeated failures are logged at most this often.
const FAILURE_LOG_INTERVAL_MS: u64 = 10_000;
/// Distinct unknown route-policy ids remembered (each is logged once).
const MAX_UNKNOWN_ROUTE_POLICIES: usize = 64;

/// When each kind of repeated failure was last logged.
#[derive(Default)]
struct LogLimits {
    fail_open: u64,
    store_error: u64,
    webhook: u64,
    /// A compressed response body was logged (once per worker).
    compressed_body: bool,
}

impl LogLimits {
    /// Whether a failure last logged at `*last` may be logged at `now`
    /// (and if so, note it).
    fn allow(last: &mut u64, now: u64) -> bool {
        let allow = now.saturating_sub(*last) >= FAILURE_LOG_INTERVAL_MS || *last == 0;
        if allow {
            *last = now.max(1);
        }
        allow
    }
}

/// One plugin instance on one worker: the configuration and the state its
/// requests share.
pub struct Engine<B> {
    config: Rc<Config>,
    registry: Registry,
    local: SlotStore<B>,
    /// The shared store, when the configuration names one.
    shared: Option<RedisStore>,
    throttled: DelayQueue,
    hold: HeaderHold,
    call_cache: CallCache,
    /// Answers and messages read for the progress check and the answer
    /// tier, kept for the conversation's next request.
    text_cache: TextCache,
    alerts: Alerts,
    logs: LogLimits,
    unknown_route_policies: Vec<String>,
    /// Hits recorded by this engine, for each hit's id (with the seed, the
    /// shared store's log member).
    hits: u64,
    root_calls: RootCalls,
    /// Per policy, the callers given their own loop-metric series on this
    /// worker (at most [`crate::metrics::MAX_CALLER_SERIES`]).
    caller_series: Vec<Vec<u64>>,
    /// This worker's part of the loops' spending.
    ledger: crate::state::ledger::Ledger,
    /// MCP result members already digested (a loop's results repeat).
    mcp_memo: crate::response::mcp::SharedMemo,
    /// Every policy's budget keys, in the shared table.
    budget_table: crate::state::budget::BudgetTable,
    /// Budget key tags with series of their own, and events logged.
    budget_memo: budget::BudgetMemo,
    /// The MCP history region's seed (shared by the process's workers).
    mcp_seed: u64,
}

impl<B: BucketBackend> Engine<B> {
    /// Set up a validated configuration. `namespace` keeps this plugin's
    /// counts apart (shared data and Redis keys); `open` opens the
    /// fingerprint table of the given layout; `env` reads the VM's
    /// environment (the webhook secret); `seed` is random (Redis nonces).
    pub fn new(
        config: Config,
        namespace: &str,
        open: impl FnOnce(TableLayout) -> Result<B, String>,
        env: impl Fn(&str) -> Option<String>,
        seed: u64,
    ) -> Result<Engine<B>, String> {
        let secret = match config.webhook.as_ref().and_then(|w| w.hmac_secret_env.as_ref()) {
            None => None,
            Some(var) => match env(var).filter(|v| !v.is_empty()) {
                Some(v) => Some(v.into_bytes()),
                None => {
                    return Err(format!(
                        "alerts.webhook.hmac_secret_env names {var}, which is not set in the VM environment (add it to vm_config.environment_variables.host_env_keys)"
                    ))
                }
            },
        };
        let budgets = config.policies.iter().filter_map(|p| p.budget.as_ref());
        let keys = budgets.map(|b| u64::from(b.max_tracked_keys)).sum();
        let budget_table = crate::state::budget::BudgetTable::for_keys(keys);
        let layout = TableLayout {
            mcp: config.policies.iter().any(|p| p.mcp.is_some()),
            budget_buckets: budget_table.buckets,
            ..TableLayout::new(config.max_tracked_fingerprints)
        };
        let mut backend = open(layout)?;
        let ledger = crate::state::ledger::Ledger::join(&mut backend);
        let mcp_seed = if layout.mcp {
            crate::state::mcp_sessions::region_seed(&mut backend, seed.rotate_left(17) | 1)
        } else {
            0
        };
        let shared = match &config.store {
            StoreConfig::Local => None,
            StoreConfig::RedisWebdis(r) => Some(RedisStore::new(r.clone(), namespace, seed)),
        };
        Ok(Engine {
            registry: Registry::new(&config),
            local: SlotStore { layout, backend },
            shared,
            throttled: DelayQueue::default(),
            hold: HeaderHold::new(config.hold_request_headers),
            call_cache: CallCache::default(),
            text_cache: TextCache::default(),
            alerts: Alerts {
                webhook: config.webhook.clone(),
                secret,
                queue: VecDeque::new(),
            },
            logs: LogLimits::default(),
            unknown_route_policies: Vec::new(),
            hits: 0,
            root_calls: RootCalls::default(),
            caller_series: vec![Vec::new(); config.policies.len()],
            ledger,
            mcp_memo: Default::default(),
            budget_table,
            budget_memo: Default::default(),
            mcp_seed,
            config: Rc::new(config),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The metrics this configuration counts (the host defines each with
    /// Envoy, in order).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The line logged when the configuration is in place.
    pub fn summary(&self) -> String {
        let ids: Vec<&str> = self.config.policies.iter().map(|p| p.id.as_str()).collect();
        format!(
            "configured {} polic{} ({}), tracking up to {} fingerprints",
            ids.len(),
            if ids.len() == 1 { "y" } else { "ies" },
            ids.join(", "),
            self.local.layout.capacity(),
        )
    }
}

fn count(id: MetricId, n: i64) -> Effect {
    Effect::Count(id, n)
}

/// Policy `index` of `config` and the part of it a guard reads (`None`:
/// no such policy, or it has no such part).
fn policy_with<'c, T>(
    config: &'c Config,
    index: usize,
    part: impl FnOnce(&'c crate::config::Policy) -> Option<&'c T>,
) -> Option<(&'c crate::config::Policy, &'c T)> {
    let p = config.policies.get(index)?;
    Some((p, part(p)?))
}

/// Count an optional (per-policy) metric.
fn count_opt(out: &mut Effects, id: Option<MetricId>, n: i64) {
    if let Some(id) = id {
        out.push(count(id, n));
    }
}

/// A count as a metric's increment (saturated).
fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
