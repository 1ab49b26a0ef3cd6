//! The plugin configuration: read into typed structs ([`raw`], serde with
//! `deny_unknown_fields`, every value's path tracked), then validated into
//! the model the filter runs ([`Config`]; [`validate`] checks ranges and the
//! rules between fields). Every error names the policy and the field and
//! says what was expected, e.g. `policy "llm-policy":
//! loop_detection.threshold_identical_requests must be >= 2 (got 1)`; an
//! unknown field gets a "did you mean" hint. An invalid configuration stops
//! the plugin from starting; nothing here panics on any input. The JSON
//! Schema of the configuration is generated from the same types
//! ([`schema`], feature `schema`).

pub mod budget;
mod error;
pub mod ladder;
pub mod mcp;
pub mod prices;
pub mod raw;
mod services;
mod validate;
pub mod volatile;

pub use budget::Budget;
pub use error::ConfigError;
pub use mcp::{Mcp, McpKey, McpStep};
pub use prices::{ModelPrice, Prices};
use serde_json::Value;
pub use services::{OnStoreError, RedisStore, RedisTopology, StoreConfig, Webhook};
pub use volatile::{Classes, Volatile};

/// The most recent hits one fingerprint's record may keep.
pub const MAX_HITS_PER_FINGERPRINT: u32 = 1024;
/// Upper bound for `max_tracked_fingerprints`.
pub const MAX_TRACKED_FINGERPRINTS: u64 = 4_194_304;
/// Upper bound for `max_body_bytes`.
pub const MAX_BODY_BYTES: u64 = 64 * 1024 * 1024;
/// Upper bound for `window_seconds` and `cooldown_seconds` (one day).
pub const MAX_WINDOW_SECONDS: u64 = 86_400;
/// Upper bound for a throttle delay.
pub const MAX_THROTTLE_DELAY_MS: u64 = 60_000;
/// The most conversation items a request keeps for a policy.
pub const MAX_ITEMS_KEPT: usize = 512;
/// Messages a near-mode tail reaches back, at most, to hold whole steps
/// (tool results and the calls they answer).
pub const MAX_STEP_EXTENSION: usize = 12;
/// Near mode compares a request's newest tail with at most this many
/// earlier turns of its own history.
pub const MAX_NEAR_TURNS_BACK: usize = 9;
/// The earlier turns near mode compares a request's newest tail with:
/// enough for the ladder's last step to be reached by a cycle of up to
/// four steps (every fourth turn a repeat), or by a loop resumed after a
/// short detour; at most [`MAX_NEAR_TURNS_BACK`].
pub fn near_turns_back(d: &Detection) -> usize {
    (4 * d.ladder(false).hits_to_keep().saturating_sub(1) as usize).min(MAX_NEAR_TURNS_BACK)
}

/// Conversation items kept per earlier turn near mode reads (a reply and
/// its results).
const ITEMS_PER_TURN: usize = 4;
/// `near_similarity` unless a policy sets it, in thousandths.
pub const DEFAULT_NEAR_SIMILARITY_MILLI: u32 = 350;
/// Failed attempts forgiven per fingerprint and window, unless a policy
/// sets `forgive_failed_attempts`, and at most.
pub const DEFAULT_FORGIVEN: u32 = 3;
pub const MAX_FORGIVEN: u32 = 16;
const MAX_POLICIES: usize = 256;
const MAX_LIMIT_KEYS: usize = 16;
const MAX_EXEMPTIONS: usize = 32;
const MAX_ROUTES: usize = 256;

/// The whole plugin configuration, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub max_tracked_fingerprints: u32,
    pub max_body_bytes: u64,
    /// The key under which Envoy's jwt_authn filter stores verified
    /// payloads (its `payload_in_metadata`), read by `jwt_verified:` keys.
    pub jwt_payload_in_metadata: String,
    pub policies: Vec<Policy>,
    /// Where detections are sent (`alerts.webhook`).
    pub webhook: Option<Webhook>,
    /// Routes may name their policy in metadata
    /// (`filter_metadata.loopguard.policy`); costs one attribute lookup
    /// per request, so it is opt-in.
    pub route_metadata: bool,
    /// Which decisions are published for Envoy's access log.
    pub access_log: AccessLog,
    /// Where window state lives.
    pub store: StoreConfig,
    /// Hold a request's headers until its body is judged (the Wasm filter's
    /// `allow_on_headers_stop_iteration` must be set): no buffer or
    /// header_mutation filter is needed, and warn headers reach the
    /// upstream directly.
    pub hold_request_headers: bool,
    /// What tokens cost, per model (`prices`).
    pub prices: Prices,
}

/// Which decisions loopguard publishes as filter state `wasm.loopguard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum AccessLog {
    /// Only when loopguard acted (warn, throttle, reject, exempt, tool
    /// loops, shadow would-be actions).
    Actions,
    /// Every request a policy judged, allowed ones too.
    All,
    /// Nothing is published.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Enforce,
    /// Count and log what would happen; enforce nothing.
    Shadow,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub id: String,
    /// Already resolved against the top-level `shadow` switch.
    pub mode: Mode,
    pub selector: Selector,
    /// Sorted by [`LimitKey::name`], so the fingerprint sees them in a
    /// canonical order whatever order the configuration lists them in.
    pub limit_keys: Vec<LimitKey>,
    /// Requests matching any of these are never counted.
    pub exempt: Vec<Exemption>,
    /// `None` when loop detection is switched off (`enabled: false` or a
    /// threshold of 0).
    pub detection: Option<Detection>,
    /// `None` when absent or switched off. A policy with neither still
    /// claims the requests it matches and lets them pass untouched.
    pub tool_loops: Option<ToolLoops>,
    /// `None` when absent or switched off: loops in MCP `tools/call`
    /// traffic (a policy with it has neither of the two above).
    pub mcp: Option<Mcp>,
    /// What is masked in message text and tool results before comparing
    /// (`llm_tail`, `near`; tool-call arguments only when opted in).
    pub volatile: Volatile,
    /// Spend caps (`None`: none).
    pub budget: Option<Budget>,
}

impl Policy {
    /// Whether the policy does anything with the requests it claims.
    pub fn is_active(&self) -> bool {
        self.detection.is_some()
            || self.tool_loops.is_some()
            || self.mcp.is_some()
            || self.budget.is_some()
    }

    /// How many of a conversation's last items the policy reads: the tail
    /// it fingerprints (plus room for an out-of-band system prompt), and
    /// enough history for its tool-call window (four items per call, for
    /// results and exempt calls in between). A request keeps only these
    /// (and the first item), however long the conversation.
    pub fn items_needed(&self) -> usize {
        let tail = match self.detection.as_ref().map(|d| &d.similarity) {
            Some(Similarity::LlmTail { tail_messages }) => *tail_messages as usize + 1,
            // Near mode also reads the newest answers to see whether the
            // newest one made progress (three answers and the user's
            // messages between them), and reaches back over a tail's
            // results to their calls.
            // And the turns before the newest, as many as the ladder needs,
            // each a reply and its results.
            Some(Similarity::Near { tail_messages, .. }) => {
                let back = self.detection.as_ref().map_or(0, near_turns_back);
                (*tail_messages as usize + 1 + MAX_STEP_EXTENSION).max(7) + ITEMS_PER_TURN * back
            }
            _ => 1,
        };
        let tools = self.tool_loops.as_ref().map_or(0, |t| {
            let calls = t.last_calls.max(3 * t.cycle_min as usize);
            // Answers: as many as the ladder can need, with the user's
            // message before each, and one more.
            let answers = 2 * (t.answer_min as usize + t.ladder.len() + 1) + 2;
            // The same turn again: as many turns as the ladder can need,
            // each a reply, its results (a few parallel calls) and a
            // message.
            let turns = 4 * (t.turn_min as usize + t.ladder.len() + 1) + 2;
            (4 * calls + 16).max(answers).max(turns)
        });
        tail.max(tools).min(MAX_ITEMS_KEPT)
    }

    /// Whether the policy may rewrite request bodies (tool-loop nudges and
    /// directives), so the host must drop `content-length` up front.
    pub fn may_rewrite_bodies(&self) -> bool {
        self.mode == Mode::Enforce
            && self.tool_loops.as_ref().is_some_and(|t| {
                t.ladder
                    .iter()
                    .any(|s| matches!(s, ToolStep::Nudge | ToolStep::Directive))
            })
    }
}

/// Tool-call loop detection, read from the conversation itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolLoops {
    /// How many of the most recent (non-exempt) tool calls are examined.
    pub last_calls: usize,
    /// Identical thrash: the same tool and arguments at least this often.
    pub identical_min: u32,
    /// Pattern thrash: the same tool with differing arguments at least this
    /// often.
    pub pattern_min: u32,
    pub exempt_tools: Vec<String>,
    /// The escalation ladder, in order.
    pub ladder: Vec<ToolStep>,
    /// A directive also sets `tool_choice` to none.
    pub directive_disables_tools: bool,
    /// Cycle thrash: a sequence of 2 or 3 calls repeated at least this
    /// often at the end of the history (0: not looked for).
    pub cycle_min: u32,
    /// Answer loops: the model's text answer repeated this many turns in a
    /// row (0: not looked for).
    pub answer_min: u32,
    /// The same turn again (reply text and calls), this many turns in a
    /// row whatever the calls returned (0: not looked for).
    pub turn_min: u32,
    /// Classes masked in tool-call arguments before they are compared
    /// (none unless `volatile.tool_arguments`).
    pub arguments_mask: Classes,
    /// The policy's masking classes, for tool results and answers (none
    /// when `volatile` is off).
    pub result_classes: Classes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum ToolStep {
    /// Forward with a short note appended to the conversation.
    Nudge,
    /// Forward with a firm instruction to stop calling the tool.
    Directive,
    /// Answer 429.
    Reject,
}

/// A guard's step, as events, metrics and shadow lines name it.
pub trait StepName: Copy {
    fn as_str(self) -> &'static str;
}

impl StepName for ToolStep {
    fn as_str(self) -> &'static str {
        match self {
            ToolStep::Nudge => "nudge",
            ToolStep::Directive => "directive",
            ToolStep::Reject => "reject",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    pub path: PathMatch,
    /// Upper-case HTTP methods; empty matches every method.
    pub methods: Vec<String>,
    /// Lower-case host names without port; `*.example.com` matches any
    /// subdomain. Empty matches every host.
    pub hosts: Vec<String>,
    /// Envoy route names (`xds.route_name`); empty matches every route.
    pub routes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PathMatch {
    #[default]
    Any,
    Exact(String),
    Prefix(String),
}

/// Where one component of the caller's identity comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum LimitKey {
    /// A request header (name lower-cased).
    Header(String),
    /// Every value of a query parameter, sorted.
    Query(String),
    /// A claim from the payload of a Bearer JWT, decoded without
    /// verification.
    Jwt(String),
    /// A claim Envoy's jwt_authn filter verified and stored in dynamic
    /// metadata (`payload_in_metadata`).
    JwtVerified(String),
    /// The downstream address without its port.
    IpAddress,
}

impl LimitKey {
    /// The canonical `source:name` spelling, as written in configuration.
    pub fn name(&self) -> String {
        match self {
            LimitKey::Header(n) => format!("header:{n}"),
            LimitKey::Query(n) => format!("query:{n}"),
            LimitKey::Jwt(n) => format!("jwt:{n}"),
            LimitKey::JwtVerified(n) => format!("jwt_verified:{n}"),
            LimitKey::IpAddress => "ip:address".to_string(),
        }
    }
}

/// A request whose key matches is exempt from counting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exemption {
    pub key: LimitKey,
    pub matcher: ExemptMatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExemptMatch {
    /// `present: true` matches when the key has a value, `false` when not.
    Present(bool),
    /// Matches when the key has one of these values.
    Values(Vec<String>),
}

// Read as written (`raw`; no doc comment: the schema would show it); an
// unknown name's error lists the variants in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Reject,
    Throttle,
    Warn,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Warn => "warn",
            Action::Throttle => "throttle",
            Action::Reject => "reject",
        }
    }
}

/// From `at` identical requests in the window on, `action` applies (until
/// a later step's `at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub at: u32,
    pub action: Action,
}

/// What makes two requests "identical".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Similarity {
    /// Method, path, query, body bytes and caller.
    Exact,
    /// Caller, model and the last `tail_messages` messages, normalised.
    LlmTail { tail_messages: u32 },
    /// Caller and model name a record of recent hits; a hit counts the
    /// earlier ones whose tail shares at least `similarity_milli` / 1000 of
    /// its words with this one's (and the same anchor: calls and numbers).
    Near {
        tail_messages: u32,
        /// `near_similarity` in thousandths, 1..=1000.
        similarity_milli: u32,
        history: u32,
    },
    /// Caller, session id, model and whether tools are offered. Requests
    /// without a session id share one fingerprint per caller, judged
    /// against `fallback_steps` (the ladder scaled to `fallback_threshold`).
    Session {
        header: String,
        fallback_steps: Vec<Step>,
    },
}

impl Similarity {
    /// Whether requests are compared by what their conversation says
    /// (`llm_tail`, `near`), not by their bytes or their session.
    pub fn compares_content(&self) -> bool {
        matches!(self, Similarity::LlmTail { .. } | Similarity::Near { .. })
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Similarity::Exact => "exact",
            Similarity::LlmTail { .. } => "llm_tail",
            Similarity::Near { .. } => "near",
            Similarity::Session { .. } => "session",
        }
    }
}

/// Active loop detection for one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detection {
    pub window_seconds: u64,
    /// Non-empty, `at` strictly increasing. A single `action` is one step
    /// at the threshold; `escalation` gives several.
    pub steps: Vec<Step>,
    pub throttle_step_ms: u64,
    pub throttle_max_delay_ms: u64,
    pub cooldown_seconds: u64,
    pub similarity: Similarity,
    /// Failed attempts (the provider answered 5xx or 429) not counted per
    /// fingerprint and window.
    pub forgive_failed_attempts: u32,
}

impl Detection {
    pub fn window_ms(&self) -> u64 {
        self.window_seconds * 1000
    }

    /// The steps that judge a fingerprint: the policy's own, or for a
    /// session-mode request without a session id, the fallback ladder.
    pub fn ladder(&self, fallback: bool) -> Ladder<'_> {
        let steps = match &self.similarity {
            Similarity::Session { fallback_steps, .. } if fallback => fallback_steps.as_slice(),
            _ => self.steps.as_slice(),
        };
        Ladder {
            steps,
            throttle_step_ms: self.throttle_step_ms,
            throttle_max_delay_ms: self.throttle_max_delay_ms,
        }
    }

    /// The count at which the first step applies.
    pub fn threshold(&self) -> u32 {
        self.ladder(false).threshold()
    }
}

#[cfg(test)]
impl Detection {
    pub fn reject_at(&self) -> Option<u32> {
        self.ladder(false).reject_at()
    }

    pub fn step_at(&self, count: u32) -> Option<Step> {
        self.ladder(false).step_at(count)
    }

    pub fn hits_to_keep(&self) -> u32 {
        self.ladder(false).hits_to_keep()
    }
}

/// A ladder of steps with the throttle settings that go with it.
#[derive(Debug, Clone, Copy)]
pub struct Ladder<'a> {
    pub steps: &'a [Step],
    pub throttle_step_ms: u64,
    pub throttle_max_delay_ms: u64,
}

impl Ladder<'_> {
    /// The count at which the first step applies.
    pub fn threshold(&self) -> u32 {
        self.steps.first().map_or(u32::MAX, |s| s.at)
    }

    /// The count from which requests are rejected, if any step rejects.
    pub fn reject_at(&self) -> Option<u32> {
        self.steps
            .iter()
            .find(|s| s.action == Action::Reject)
            .map(|s| s.at)
    }

    /// The step that applies at `count`, if any.
    pub fn step_at(&self, count: u32) -> Option<Step> {
        let rungs = self.steps.iter().map(|s| (u64::from(s.at), *s));
        ladder::climb(rungs, u64::from(count)).map(|(_, s)| s)
    }

    /// Hits the throttle needs to reach its cap: `ceil(max / step)`.
    pub fn throttle_hits_to_cap(&self) -> u64 {
        self.throttle_max_delay_ms
            .div_ceil(self.throttle_step_ms.max(1))
    }

    /// How many recent hits a fingerprint's record must keep to decide:
    /// the last step's count, and when the last step throttles (its delay
    /// grows with the count), the count that reaches the cap.
    pub fn hits_to_keep(&self) -> u32 {
        let last = self.steps.last();
        let throttle = last.filter(|s| s.action == Action::Throttle);
        let throttle = throttle.map_or(0, |_| self.throttle_hits_to_cap());
        let need = u64::from(last.map_or(2, |s| s.at)).max(throttle);
        u32::try_from(need)
            .unwrap_or(MAX_HITS_PER_FINGERPRINT)
            .min(MAX_HITS_PER_FINGERPRINT)
    }
}

/// The ladder scaled so its first step sits at `fallback`: every `at`
/// multiplied by `fallback / threshold` (rounded up, at most 1024); where
/// two steps land on the same count, the later one wins.
fn scale_steps(steps: &[Step], fallback: u32) -> Vec<Step> {
    let threshold = u64::from(steps.first().map_or(1, |s| s.at).max(1));
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    for s in steps {
        let at = (u64::from(s.at) * u64::from(fallback))
            .div_ceil(threshold)
            .min(u64::from(MAX_HITS_PER_FINGERPRINT)) as u32;
        match out.last_mut() {
            Some(prev) if prev.at >= at => prev.action = s.action,
            _ => out.push(Step { at, ..*s }),
        }
    }
    out
}

impl Config {
    /// Parse and validate the plugin configuration.
    pub fn parse(bytes: &[u8]) -> Result<Config, ConfigError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| ConfigError {
            policy: None,
            field: "configuration".to_string(),
            reason: format!("is not valid JSON: {e}"),
        })?;
        Config::from_value(&value)
    }

    /// Validate a configuration already parsed as JSON.
    pub fn from_value(value: &Value) -> Result<Config, ConfigError> {
        let raw: raw::Obj<raw::RawConfig> =
            serde_path_to_error::deserialize(value).map_err(|e| error::from_serde(e, value))?;
        Config::try_from(raw.0)
    }

    pub fn policy_index(&self, id: &str) -> Option<usize> {
        self.policies.iter().position(|p| p.id == id)
    }

    /// Whether any policy selects by Envoy route name.
    #[cfg(test)]
    pub fn uses_route_names(&self) -> bool {
        self.policies.iter().any(|p| !p.selector.routes.is_empty())
    }
}

/// The JSON Schema of the configuration, generated from [`raw`]
/// (`schema/loopguard.schema.json` is this, checked in).
#[cfg(feature = "schema")]
pub fn schema() -> Value {
    let mut s = schemars::schema_for!(raw::Obj<raw::RawConfig>);
    s.insert("$id".to_string(), Value::from(SCHEMA_ID));
    s.insert("title".to_string(), Value::from("loopguard configuration"));
    s.to_value()
}

/// Where the checked-in schema is published.
pub const SCHEMA_ID: &str =
    "https://raw.githubusercontent.com/loopguard/loopguard/main/schema/loopguard.schema.json";

/// Lower-case a host and drop its port (`API.example.com:443` ->
/// `api.example.com`, `[::1]:8080` -> `[::1]`) and any trailing dot.
pub fn normalize_host(raw: &str) -> String {
    let lower = raw.trim().to_ascii_lowercase();
    let without_port = if lower.starts_with('[') {
        lower.find(']').map_or(lower.as_str(), |end| &lower[..=end])
    } else if lower.bytes().filter(|&b| b == b':').count() == 1 {
        lower.split(':').next().unwrap_or("")
    } else {
        lower.as_str()
    };
    without_port.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod detection_tests;
#[cfg(test)]
mod mcp_tests;
#[cfg(test)]
mod selector_tests;
#[cfg(test)]
mod services_tests;
#[cfg(test)]
mod similarity_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tool_loop_tests;
