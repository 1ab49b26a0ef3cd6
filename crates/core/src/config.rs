//! The plugin configuration: JSON model and validation.
//!
//! Validation is strict: unknown fields are errors (typo safety), every
//! number is range-checked, and every error names the policy and the field,
//! e.g. `policy "llm-policy": loop_detection.threshold_identical_requests
//! must be >= 2 (got 1)`. An invalid configuration stops the plugin from
//! starting; nothing here panics on any input.

use serde_json::{Map, Value};
use std::fmt;

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
const MAX_POLICIES: usize = 256;
const MAX_LIMIT_KEYS: usize = 16;
const MAX_EXEMPTIONS: usize = 32;
const MAX_ROUTES: usize = 256;
const MAX_ID_LEN: usize = 64;

/// A configuration error: which policy, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The policy id, when the error is inside a policy with a usable id.
    pub policy: Option<String>,
    /// Dotted path of the field, relative to the policy's `spec` inside a
    /// policy, or to the top-level object outside one.
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(policy) = &self.policy {
            write!(f, "policy \"{policy}\": ")?;
        }
        write!(f, "{} {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

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
}

/// Where window state lives.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreConfig {
    /// Envoy shared data: exact across one Envoy's workers.
    #[default]
    Local,
    /// Redis, through webdis, through an Envoy cluster: shared by every
    /// Envoy replica.
    RedisWebdis(RedisStore),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStore {
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub timeout_ms: u64,
    pub on_error: OnStoreError,
}

/// What a request does when the shared store fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    /// Count it in the local table instead.
    Local,
    /// Let it pass unchecked.
    Allow,
}

/// Which decisions loopguard publishes as filter state `wasm.loopguard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLog {
    /// Only when loopguard acted (warn, throttle, reject, exempt, tool
    /// loops, shadow would-be actions).
    Actions,
    /// Every request a policy judged, allowed ones too.
    All,
    Off,
}

/// A webhook receiving signed `loop.detected` alerts through an Envoy
/// cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    pub cluster: String,
    pub authority: String,
    pub path: String,
    pub timeout_ms: u64,
    /// The VM environment variable holding the HMAC secret (Envoy's
    /// `vm_config.environment_variables`), if the alerts are signed.
    pub hmac_secret_env: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

impl Policy {
    /// Whether the policy does anything with the requests it claims.
    pub fn is_active(&self) -> bool {
        self.detection.is_some() || self.tool_loops.is_some()
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ToolStep {
    /// Forward with a short note appended to the conversation.
    Nudge,
    /// Forward with a firm instruction to stop calling the tool.
    Directive,
    /// Answer 429.
    Reject,
}

impl ToolStep {
    pub fn as_str(self) -> &'static str {
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Warn,
    Throttle,
    Reject,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Warn => "warn",
            Action::Throttle => "throttle",
            Action::Reject => "reject",
        }
    }

    fn parse(s: &str) -> Option<Action> {
        match s {
            "warn" => Some(Action::Warn),
            "throttle" => Some(Action::Throttle),
            "reject" => Some(Action::Reject),
            _ => None,
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
    /// Caller, session id, model and whether tools are offered. Requests
    /// without a session id share one fingerprint per caller, judged
    /// against `fallback_steps` (the ladder scaled to `fallback_threshold`).
    Session {
        header: String,
        fallback_steps: Vec<Step>,
    },
}

impl Similarity {
    pub fn as_str(&self) -> &'static str {
        match self {
            Similarity::Exact => "exact",
            Similarity::LlmTail { .. } => "llm_tail",
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

    /// The count from which requests are rejected, if any step rejects.
    pub fn reject_at(&self) -> Option<u32> {
        self.ladder(false).reject_at()
    }

    /// The step that applies at `count`, if any.
    pub fn step_at(&self, count: u32) -> Option<Step> {
        self.ladder(false).step_at(count)
    }

    /// Hits the throttle needs to reach its cap: `ceil(max / step)`.
    pub fn throttle_hits_to_cap(&self) -> u64 {
        self.ladder(false).throttle_hits_to_cap()
    }

    /// How many recent hits a fingerprint's record must keep to decide.
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
        self.steps.iter().rev().find(|s| count >= s.at).copied()
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
        let last = self.steps.last().map_or(2, |s| s.at);
        let throttle = match self.steps.last() {
            Some(s) if s.action == Action::Throttle => self.throttle_hits_to_cap(),
            _ => 0,
        };
        let need = u64::from(last).max(throttle);
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
            Some(prev) if prev.at >= at => {
                *prev = Step {
                    at: prev.at,
                    action: s.action,
                }
            }
            _ => out.push(Step {
                at,
                action: s.action,
            }),
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

    pub fn from_value(value: &Value) -> Result<Config, ConfigError> {
        let top = Ctx { policy: None };
        let obj = top.object(
            value,
            "",
            &[
                "max_tracked_fingerprints",
                "max_body_bytes",
                "shadow",
                "jwt_payload_in_metadata",
                "alerts",
                "route_metadata",
                "access_log",
                "store",
                "hold_request_headers",
                "policies",
            ],
        )?;
        let max_tracked = top
            .uint(
                obj,
                "",
                "max_tracked_fingerprints",
                1,
                MAX_TRACKED_FINGERPRINTS,
            )?
            .unwrap_or(65_536);
        let max_body_bytes = top
            .uint(obj, "", "max_body_bytes", 1, MAX_BODY_BYTES)?
            .unwrap_or(1_048_576);
        let shadow_all = top.boolean(obj, "", "shadow")?.unwrap_or(false);
        let jwt_payload_in_metadata = match top.string(obj, "", "jwt_payload_in_metadata")? {
            None => "jwt_payload".to_string(),
            Some("") => return Err(top.err("jwt_payload_in_metadata", "must not be empty")),
            Some(k) => k.to_string(),
        };
        let route_metadata = top.boolean(obj, "", "route_metadata")?.unwrap_or(false);
        let hold_request_headers = top
            .boolean(obj, "", "hold_request_headers")?
            .unwrap_or(false);
        let access_log = match top.string(obj, "", "access_log")? {
            None | Some("actions") => AccessLog::Actions,
            Some("all") => AccessLog::All,
            Some("off") => AccessLog::Off,
            Some(other) => {
                return Err(top.err(
                    "access_log",
                    format!("must be \"actions\", \"all\" or \"off\" (got \"{other}\")"),
                ))
            }
        };
        let store = match obj.get("store") {
            None => StoreConfig::Local,
            Some(v) => parse_store(&top, v)?,
        };
        let webhook = match obj.get("alerts") {
            None => None,
            Some(v) => parse_alerts(&top, v)?,
        };
        let list = match obj.get("policies") {
            None => return Err(top.err("policies", "is required")),
            Some(Value::Array(list)) => list,
            Some(other) => {
                return Err(top.err("policies", format!("must be a list (got {})", show(other))))
            }
        };
        if list.is_empty() {
            return Err(top.err("policies", "must list at least one policy"));
        }
        if list.len() > MAX_POLICIES {
            return Err(top.err(
                "policies",
                format!(
                    "may list at most {MAX_POLICIES} policies (got {})",
                    list.len()
                ),
            ));
        }
        let mut policies: Vec<Policy> = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            let mut policy = parse_policy(item, i)?;
            if policies.iter().any(|p| p.id == policy.id) {
                return Err(ConfigError {
                    policy: Some(policy.id.clone()),
                    field: "id".to_string(),
                    reason: "is used by more than one policy; ids must be unique".to_string(),
                });
            }
            if shadow_all {
                policy.mode = Mode::Shadow;
            }
            policies.push(policy);
        }
        Ok(Config {
            max_tracked_fingerprints: u32::try_from(max_tracked).unwrap_or(u32::MAX),
            max_body_bytes,
            jwt_payload_in_metadata,
            policies,
            webhook,
            route_metadata,
            access_log,
            store,
            hold_request_headers,
        })
    }

    pub fn policy_index(&self, id: &str) -> Option<usize> {
        self.policies.iter().position(|p| p.id == id)
    }

    /// Whether any policy selects by Envoy route name (so the host reads it).
    pub fn uses_route_names(&self) -> bool {
        self.policies.iter().any(|p| !p.selector.routes.is_empty())
    }
}

fn parse_store(ctx: &Ctx, value: &Value) -> Result<StoreConfig, ConfigError> {
    const SECTION: &str = "store";
    let f = |name: &str| join(SECTION, name);
    let obj = ctx.object(
        value,
        SECTION,
        &[
            "type",
            "cluster",
            "authority",
            "path",
            "timeout_ms",
            "on_error",
        ],
    )?;
    match ctx.string(obj, SECTION, "type")? {
        None | Some("local") => {
            if let Some(extra) = ["cluster", "authority", "path", "timeout_ms", "on_error"]
                .iter()
                .find(|k| obj.contains_key(**k))
            {
                return Err(ctx.err(&f(extra), "applies only to the \"redis_webdis\" store"));
            }
            Ok(StoreConfig::Local)
        }
        Some("redis_webdis") => {
            let cluster = match ctx.string(obj, SECTION, "cluster")? {
                Some(c) if !c.is_empty() => c.to_string(),
                _ => {
                    return Err(ctx.err(&f("cluster"), "is required (the Envoy cluster of webdis)"))
                }
            };
            let authority = ctx.string(obj, SECTION, "authority")?.unwrap_or("webdis");
            if authority.is_empty() {
                return Err(ctx.err(&f("authority"), "must not be empty"));
            }
            let path = ctx.string(obj, SECTION, "path")?.unwrap_or("/");
            if !path.starts_with('/') {
                return Err(ctx.err(
                    &f("path"),
                    format!("must start with \"/\" (got \"{path}\")"),
                ));
            }
            let timeout_ms = ctx
                .uint(obj, SECTION, "timeout_ms", 1, 5_000)?
                .unwrap_or(25);
            let on_error = match ctx.string(obj, SECTION, "on_error")? {
                None | Some("local") => OnStoreError::Local,
                Some("allow") => OnStoreError::Allow,
                Some(other) => {
                    return Err(ctx.err(
                        &f("on_error"),
                        format!("must be \"local\" or \"allow\" (got \"{other}\")"),
                    ))
                }
            };
            Ok(StoreConfig::RedisWebdis(RedisStore {
                cluster,
                authority: authority.to_string(),
                path: path.to_string(),
                timeout_ms,
                on_error,
            }))
        }
        Some(other) => Err(ctx.err(
            &f("type"),
            format!("must be \"local\" or \"redis_webdis\" (got \"{other}\")"),
        )),
    }
}

fn parse_alerts(ctx: &Ctx, value: &Value) -> Result<Option<Webhook>, ConfigError> {
    let obj = ctx.object(value, "alerts", &["webhook"])?;
    let Some(w) = obj.get("webhook") else {
        return Ok(None);
    };
    const SECTION: &str = "alerts.webhook";
    let w = ctx.object(
        w,
        SECTION,
        &[
            "cluster",
            "authority",
            "path",
            "timeout_ms",
            "hmac_secret_env",
        ],
    )?;
    let required = |name: &str| -> Result<String, ConfigError> {
        match ctx.string(w, SECTION, name)? {
            Some(s) if !s.is_empty() => Ok(s.to_string()),
            Some(_) => Err(ctx.err(&join(SECTION, name), "must not be empty")),
            None => Err(ctx.err(&join(SECTION, name), "is required")),
        }
    };
    let cluster = required("cluster")?;
    let authority = required("authority")?;
    let path = ctx.string(w, SECTION, "path")?.unwrap_or("/").to_string();
    if !path.starts_with('/') {
        return Err(ctx.err(
            &join(SECTION, "path"),
            format!("must start with \"/\" (got \"{path}\")"),
        ));
    }
    let timeout_ms = ctx
        .uint(w, SECTION, "timeout_ms", 1, 60_000)?
        .unwrap_or(2_000);
    let hmac_secret_env = match ctx.string(w, SECTION, "hmac_secret_env")? {
        None => None,
        Some(name)
            if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
        {
            Some(name.to_string())
        }
        Some(other) => {
            return Err(ctx.err(
                &join(SECTION, "hmac_secret_env"),
                format!("must be an environment variable name (got \"{other}\")"),
            ))
        }
    };
    Ok(Some(Webhook {
        cluster,
        authority,
        path,
        timeout_ms,
        hmac_secret_env,
    }))
}

fn parse_policy(item: &Value, index: usize) -> Result<Policy, ConfigError> {
    let anon = Ctx { policy: None };
    let at = format!("policies[{index}]");
    let obj = anon.object(item, &at, &["id", "spec"])?;
    let id = match obj.get("id") {
        None => return Err(anon.err(&join(&at, "id"), "is required")),
        Some(Value::String(id)) if valid_id(id) => id.clone(),
        Some(other) => {
            return Err(anon.err(
                &join(&at, "id"),
                format!("must match [A-Za-z0-9_-]{{1,64}} (got {})", show(other)),
            ))
        }
    };
    let ctx = Ctx {
        policy: Some(id.clone()),
    };
    let spec = match obj.get("spec") {
        None => return Err(ctx.err("spec", "is required")),
        Some(spec) => ctx.object(
            spec,
            "spec",
            &[
                "mode",
                "selector",
                "limit_keys",
                "exempt",
                "loop_detection",
                "tool_loops",
            ],
        )?,
    };
    let mode = match ctx.string(spec, "", "mode")? {
        None | Some("enforce") => Mode::Enforce,
        Some("shadow") => Mode::Shadow,
        Some(other) => {
            return Err(ctx.err(
                "mode",
                format!("must be \"enforce\" or \"shadow\" (got \"{other}\")"),
            ))
        }
    };
    let selector = match spec.get("selector") {
        None => return Err(ctx.err("selector", "is required (use {} to match every request)")),
        Some(v) => parse_selector(&ctx, v)?,
    };
    let limit_keys = parse_limit_keys(&ctx, spec.get("limit_keys"))?;
    let exempt = parse_exempt(&ctx, spec.get("exempt"))?;
    let tool_loops = match spec.get("tool_loops") {
        None => None,
        Some(v) => parse_tool_loops(&ctx, v)?,
    };
    let detection = match spec.get("loop_detection") {
        None if spec.contains_key("tool_loops") => None,
        None => return Err(ctx.err("loop_detection", "is required (or give tool_loops)")),
        Some(v) => parse_detection(&ctx, v)?,
    };
    Ok(Policy {
        id,
        mode,
        selector,
        limit_keys,
        exempt,
        detection,
        tool_loops,
    })
}

fn parse_selector(ctx: &Ctx, value: &Value) -> Result<Selector, ConfigError> {
    let obj = ctx.object(
        value,
        "selector",
        &["pathExact", "pathPrefix", "methods", "hosts", "routes"],
    )?;
    let exact = ctx.string(obj, "selector", "pathExact")?;
    let prefix = ctx.string(obj, "selector", "pathPrefix")?;
    let path = match (exact, prefix) {
        (Some(_), Some(_)) => {
            return Err(ctx.err("selector", "may give pathExact or pathPrefix, not both"))
        }
        (Some(p), None) => PathMatch::Exact(check_path(ctx, "selector.pathExact", p)?),
        (None, Some(p)) => PathMatch::Prefix(check_path(ctx, "selector.pathPrefix", p)?),
        (None, None) => PathMatch::Any,
    };
    let mut methods = Vec::new();
    if let Some(list) = ctx.string_list(obj, "selector", "methods")? {
        for (i, m) in list.iter().enumerate() {
            if m.is_empty() || !m.bytes().all(is_token_byte) {
                return Err(ctx.err(
                    &format!("selector.methods[{i}]"),
                    format!("must be an HTTP method token (got \"{m}\")"),
                ));
            }
            methods.push(m.to_ascii_uppercase());
        }
    }
    let mut hosts = Vec::new();
    if let Some(list) = ctx.string_list(obj, "selector", "hosts")? {
        for (i, h) in list.iter().enumerate() {
            let host = normalize_host(h);
            let body = host.strip_prefix("*.").unwrap_or(&host);
            let ok = !body.is_empty()
                && body
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._[]:".contains(&b));
            if !ok {
                return Err(ctx.err(
                    &format!("selector.hosts[{i}]"),
                    format!("must be a host name, optionally starting with \"*.\" (got \"{h}\")"),
                ));
            }
            hosts.push(host);
        }
    }
    let mut routes = Vec::new();
    if let Some(list) = ctx.string_list(obj, "selector", "routes")? {
        if list.len() > MAX_ROUTES {
            return Err(ctx.err(
                "selector.routes",
                format!("may list at most {MAX_ROUTES} routes (got {})", list.len()),
            ));
        }
        for (i, r) in list.iter().enumerate() {
            if r.is_empty() {
                return Err(ctx.err(&format!("selector.routes[{i}]"), "must not be empty"));
            }
            routes.push(r.to_string());
        }
    }
    Ok(Selector {
        path,
        methods,
        hosts,
        routes,
    })
}

fn check_path(ctx: &Ctx, field: &str, p: &str) -> Result<String, ConfigError> {
    if !p.starts_with('/') {
        return Err(ctx.err(field, format!("must start with \"/\" (got \"{p}\")")));
    }
    if p.contains('?') || p.contains('#') {
        return Err(ctx.err(
            field,
            format!("must not contain a query or fragment; matching ignores the query string (got \"{p}\")"),
        ));
    }
    Ok(p.to_string())
}

/// Lower-case a host and drop its port (`API.example.com:443` ->
/// `api.example.com`, `[::1]:8080` -> `[::1]`) and any trailing dot.
pub fn normalize_host(raw: &str) -> String {
    let lower = raw.trim().to_ascii_lowercase();
    let without_port = if lower.starts_with('[') {
        match lower.find(']') {
            Some(end) => &lower[..=end],
            None => lower.as_str(),
        }
    } else if lower.bytes().filter(|&b| b == b':').count() == 1 {
        lower.split(':').next().unwrap_or("")
    } else {
        lower.as_str()
    };
    without_port.trim_end_matches('.').to_string()
}

fn parse_limit_keys(ctx: &Ctx, value: Option<&Value>) -> Result<Vec<LimitKey>, ConfigError> {
    let list = match value {
        None => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(ctx.err(
                "limit_keys",
                format!("must be a list of strings (got {})", show(other)),
            ))
        }
    };
    if list.len() > MAX_LIMIT_KEYS {
        return Err(ctx.err(
            "limit_keys",
            format!(
                "may list at most {MAX_LIMIT_KEYS} keys (got {})",
                list.len()
            ),
        ));
    }
    let mut keys: Vec<LimitKey> = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let field = format!("limit_keys[{i}]");
        let raw = match item {
            Value::String(s) => s.as_str(),
            other => return Err(ctx.err(&field, format!("must be a string (got {})", show(other)))),
        };
        let key = parse_limit_key(raw).map_err(|reason| ctx.err(&field, reason))?;
        if keys.contains(&key) {
            return Err(ctx.err(&field, format!("repeats \"{raw}\"")));
        }
        keys.push(key);
    }
    keys.sort_by_key(|k| k.name());
    Ok(keys)
}

fn parse_limit_key(raw: &str) -> Result<LimitKey, String> {
    let bad_source = || {
        format!(
            "must be header:<name>, query:<name>, jwt:<claim>, jwt_verified:<claim> or ip:address (got \"{raw}\")"
        )
    };
    let (source, name) = raw.split_once(':').ok_or_else(bad_source)?;
    if name.is_empty() {
        return Err(format!(
            "names no {source} after \"{source}:\" (got \"{raw}\")"
        ));
    }
    match source {
        "header" => {
            if !name.bytes().all(is_token_byte) {
                return Err(format!("has an invalid header name (got \"{raw}\")"));
            }
            Ok(LimitKey::Header(name.to_ascii_lowercase()))
        }
        "query" => Ok(LimitKey::Query(name.to_string())),
        "jwt" => Ok(LimitKey::Jwt(name.to_string())),
        "jwt_verified" => Ok(LimitKey::JwtVerified(name.to_string())),
        "ip" if name == "address" => Ok(LimitKey::IpAddress),
        "ip" => Err(format!("must be ip:address (got \"{raw}\")")),
        _ => Err(bad_source()),
    }
}

fn parse_exempt(ctx: &Ctx, value: Option<&Value>) -> Result<Vec<Exemption>, ConfigError> {
    let list = match value {
        None => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(ctx.err(
                "exempt",
                format!(
                    "must be a list of {{\"key\": ..., \"present\" | \"values\": ...}} (got {})",
                    show(other)
                ),
            ))
        }
    };
    if list.len() > MAX_EXEMPTIONS {
        return Err(ctx.err(
            "exempt",
            format!(
                "may list at most {MAX_EXEMPTIONS} entries (got {})",
                list.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let at = format!("exempt[{i}]");
        let obj = ctx.object(item, &at, &["key", "present", "values"])?;
        let key = match ctx.string(obj, &at, "key")? {
            None => return Err(ctx.err(&join(&at, "key"), "is required")),
            Some(raw) => parse_limit_key(raw).map_err(|r| ctx.err(&join(&at, "key"), r))?,
        };
        let present = ctx.boolean(obj, &at, "present")?;
        let values = ctx.string_list(obj, &at, "values")?;
        let matcher = match (present, values) {
            (Some(p), None) => ExemptMatch::Present(p),
            (None, Some(v)) => ExemptMatch::Values(v.iter().map(|s| s.to_string()).collect()),
            _ => return Err(ctx.err(&at, "must give exactly one of \"present\" or \"values\"")),
        };
        out.push(Exemption { key, matcher });
    }
    Ok(out)
}

fn parse_detection(ctx: &Ctx, value: &Value) -> Result<Option<Detection>, ConfigError> {
    const SECTION: &str = "loop_detection";
    let f = |name: &str| join(SECTION, name);
    let obj = ctx.object(
        value,
        SECTION,
        &[
            "enabled",
            "window_seconds",
            "threshold_identical_requests",
            "action",
            "escalation",
            "throttle_step_ms",
            "throttle_max_delay_ms",
            "cooldown_seconds",
            "similarity",
            "tail_messages",
            "session_header",
            "fallback_threshold",
        ],
    )?;
    let enabled = match ctx.boolean(obj, SECTION, "enabled")? {
        None => return Err(ctx.err(&f("enabled"), "is required")),
        Some(b) => b,
    };
    let window = ctx.uint(obj, SECTION, "window_seconds", 1, MAX_WINDOW_SECONDS)?;
    let threshold = match ctx.uint(
        obj,
        SECTION,
        "threshold_identical_requests",
        0,
        u64::from(MAX_HITS_PER_FINGERPRINT),
    )? {
        Some(1) => {
            return Err(ctx.err(
                &f("threshold_identical_requests"),
                "must be >= 2 (got 1); use 0 to switch the policy off",
            ))
        }
        t => t,
    };
    let action = match ctx.string(obj, SECTION, "action")? {
        None => None,
        Some(a) => Some(Action::parse(a).ok_or_else(|| {
            ctx.err(
                &f("action"),
                format!("must be \"reject\", \"throttle\" or \"warn\" (got \"{a}\")"),
            )
        })?),
    };
    let escalation = match obj.get("escalation") {
        None => None,
        Some(v) => Some(parse_escalation(ctx, v)?),
    };
    if escalation.is_some() {
        if action.is_some() {
            return Err(ctx.err(
                &f("escalation"),
                "replaces \"action\"; give one or the other",
            ));
        }
        if threshold.is_some() {
            return Err(ctx.err(
                &f("escalation"),
                "replaces \"threshold_identical_requests\" (the first step's \"at\" is the threshold); give one or the other",
            ));
        }
    }
    let throttle_step_ms = ctx
        .uint(obj, SECTION, "throttle_step_ms", 1, MAX_THROTTLE_DELAY_MS)?
        .unwrap_or(100);
    let throttle_max_delay_ms = ctx
        .uint(
            obj,
            SECTION,
            "throttle_max_delay_ms",
            1,
            MAX_THROTTLE_DELAY_MS,
        )?
        .unwrap_or(10_000);
    let cooldown_seconds = ctx
        .uint(obj, SECTION, "cooldown_seconds", 0, MAX_WINDOW_SECONDS)?
        .unwrap_or(0);
    let similarity_name = ctx.string(obj, SECTION, "similarity")?.unwrap_or("exact");
    if !matches!(similarity_name, "exact" | "llm_tail" | "session") {
        return Err(ctx.err(
            &f("similarity"),
            format!("must be \"exact\", \"llm_tail\" or \"session\" (got \"{similarity_name}\")"),
        ));
    }
    let tail_messages = ctx.uint(obj, SECTION, "tail_messages", 1, 64)?;
    let session_header = ctx.string(obj, SECTION, "session_header")?;
    let fallback_threshold = ctx.uint(
        obj,
        SECTION,
        "fallback_threshold",
        2,
        u64::from(MAX_HITS_PER_FINGERPRINT),
    )?;
    if tail_messages.is_some() && similarity_name != "llm_tail" {
        return Err(ctx.err(
            &f("tail_messages"),
            "applies only to similarity \"llm_tail\"",
        ));
    }
    for (name, given) in [
        ("session_header", session_header.is_some()),
        ("fallback_threshold", fallback_threshold.is_some()),
    ] {
        if given && similarity_name != "session" {
            return Err(ctx.err(&f(name), "applies only to similarity \"session\""));
        }
    }
    if let Some(h) = session_header {
        if h.is_empty() || !h.bytes().all(is_token_byte) {
            return Err(ctx.err(
                &f("session_header"),
                format!("must be a header name (got \"{h}\")"),
            ));
        }
    }
    if !enabled {
        return Ok(None);
    }
    let window_seconds =
        window.ok_or_else(|| ctx.err(&f("window_seconds"), "is required when enabled"))?;
    let steps = match (escalation, threshold) {
        (Some(steps), _) => steps,
        (None, None) => {
            return Err(ctx.err(
                &f("threshold_identical_requests"),
                "is required when enabled (or give an \"escalation\" ladder)",
            ))
        }
        (None, Some(0)) => return Ok(None),
        (None, Some(t)) => vec![Step {
            at: u32::try_from(t).unwrap_or(MAX_HITS_PER_FINGERPRINT),
            action: action.unwrap_or(Action::Reject),
        }],
    };
    let threshold = steps.first().map_or(2, |s| s.at);
    let similarity = match similarity_name {
        "llm_tail" => Similarity::LlmTail {
            tail_messages: tail_messages.map_or(3, |n| n as u32),
        },
        "session" => {
            let fallback = match fallback_threshold {
                Some(fb) if fb < u64::from(threshold) => {
                    return Err(ctx.err(
                        &f("fallback_threshold"),
                        format!("must be >= the threshold ({fb} < {threshold})"),
                    ))
                }
                Some(fb) => fb as u32,
                None => (threshold * 5).min(MAX_HITS_PER_FINGERPRINT),
            };
            Similarity::Session {
                header: session_header
                    .unwrap_or("x-session-id")
                    .to_ascii_lowercase(),
                fallback_steps: scale_steps(&steps, fallback),
            }
        }
        _ => Similarity::Exact,
    };
    let detection = Detection {
        window_seconds,
        steps,
        throttle_step_ms,
        throttle_max_delay_ms,
        cooldown_seconds,
        similarity,
    };
    let throttles = detection.steps.iter().any(|s| s.action == Action::Throttle);
    if throttles && detection.throttle_max_delay_ms < detection.throttle_step_ms {
        return Err(ctx.err(
            &f("throttle_max_delay_ms"),
            format!(
                "must be >= throttle_step_ms ({} < {})",
                detection.throttle_max_delay_ms, detection.throttle_step_ms
            ),
        ));
    }
    let last_throttles = detection
        .steps
        .last()
        .is_some_and(|s| s.action == Action::Throttle);
    if last_throttles && detection.throttle_hits_to_cap() > u64::from(MAX_HITS_PER_FINGERPRINT) {
        return Err(ctx.err(
            &f("throttle_max_delay_ms"),
            format!(
                "needs {} identical hits to reach its cap at {} ms per hit, more than the {MAX_HITS_PER_FINGERPRINT} a fingerprint keeps; raise throttle_step_ms or lower the cap",
                detection.throttle_hits_to_cap(),
                detection.throttle_step_ms
            ),
        ));
    }
    if detection.cooldown_seconds > 0 && detection.reject_at().is_none() {
        return Err(ctx.err(
            &f("cooldown_seconds"),
            "needs a reject action (the cooldown starts at the first reject)",
        ));
    }
    Ok(Some(detection))
}

fn parse_tool_loops(ctx: &Ctx, value: &Value) -> Result<Option<ToolLoops>, ConfigError> {
    const SECTION: &str = "tool_loops";
    let f = |name: &str| join(SECTION, name);
    let obj = ctx.object(
        value,
        SECTION,
        &[
            "enabled",
            "last_calls",
            "identical_min",
            "pattern_min",
            "exempt_tools",
            "ladder",
            "directive_disables_tools",
        ],
    )?;
    let enabled = ctx
        .boolean(obj, SECTION, "enabled")?
        .ok_or_else(|| ctx.err(&f("enabled"), "is required"))?;
    let last_calls = ctx.uint(obj, SECTION, "last_calls", 1, 64)?.unwrap_or(6);
    let identical_min = ctx.uint(obj, SECTION, "identical_min", 2, 64)?.unwrap_or(3);
    let pattern_min = ctx.uint(obj, SECTION, "pattern_min", 2, 64)?.unwrap_or(4);
    for (name, min) in [
        ("identical_min", identical_min),
        ("pattern_min", pattern_min),
    ] {
        if min > last_calls {
            return Err(ctx.err(
                &f(name),
                format!("must be <= last_calls ({min} > {last_calls})"),
            ));
        }
    }
    let exempt_tools = ctx
        .string_list(obj, SECTION, "exempt_tools")?
        .unwrap_or_default()
        .into_iter()
        .map(str::to_string)
        .collect();
    let ladder = match ctx.string_list(obj, SECTION, "ladder")? {
        None => vec![ToolStep::Nudge, ToolStep::Directive, ToolStep::Reject],
        Some(list) => {
            let mut steps: Vec<ToolStep> = Vec::with_capacity(list.len());
            for (i, name) in list.iter().enumerate() {
                let step = match *name {
                    "nudge" => ToolStep::Nudge,
                    "directive" => ToolStep::Directive,
                    "reject" => ToolStep::Reject,
                    other => {
                        return Err(ctx.err(
                            &format!("{}[{i}]", f("ladder")),
                            format!(
                                "must be \"nudge\", \"directive\" or \"reject\" (got \"{other}\")"
                            ),
                        ))
                    }
                };
                if steps.last().is_some_and(|prev| *prev >= step) {
                    return Err(ctx.err(
                        &f("ladder"),
                        "must list its steps in the order nudge, directive, reject, each at most once",
                    ));
                }
                steps.push(step);
            }
            steps
        }
    };
    let directive_disables_tools = ctx
        .boolean(obj, SECTION, "directive_disables_tools")?
        .unwrap_or(false);
    if directive_disables_tools && !ladder.contains(&ToolStep::Directive) {
        return Err(ctx.err(
            &f("directive_disables_tools"),
            "needs a \"directive\" step in the ladder",
        ));
    }
    if !enabled {
        return Ok(None);
    }
    Ok(Some(ToolLoops {
        last_calls: last_calls as usize,
        identical_min: identical_min as u32,
        pattern_min: pattern_min as u32,
        exempt_tools,
        ladder,
        directive_disables_tools,
    }))
}

fn parse_escalation(ctx: &Ctx, value: &Value) -> Result<Vec<Step>, ConfigError> {
    let field = "loop_detection.escalation";
    let list = match value {
        Value::Array(list) if !list.is_empty() => list,
        other => {
            return Err(ctx.err(
                field,
                format!(
                    "must be a non-empty list of {{\"at\": <count>, \"action\": ...}} (got {})",
                    show(other)
                ),
            ))
        }
    };
    if list.len() > 16 {
        return Err(ctx.err(
            field,
            format!("may list at most 16 steps (got {})", list.len()),
        ));
    }
    let mut steps: Vec<Step> = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let at_path = format!("{field}[{i}]");
        let obj = ctx.object(item, &at_path, &["at", "action"])?;
        let at = ctx
            .uint(obj, &at_path, "at", 2, u64::from(MAX_HITS_PER_FINGERPRINT))?
            .ok_or_else(|| ctx.err(&join(&at_path, "at"), "is required"))?;
        let at = u32::try_from(at).unwrap_or(MAX_HITS_PER_FINGERPRINT);
        let action = match ctx.string(obj, &at_path, "action")? {
            None => return Err(ctx.err(&join(&at_path, "action"), "is required")),
            Some(a) => Action::parse(a).ok_or_else(|| {
                ctx.err(
                    &join(&at_path, "action"),
                    format!("must be \"reject\", \"throttle\" or \"warn\" (got \"{a}\")"),
                )
            })?,
        };
        if let Some(prev) = steps.last() {
            if at <= prev.at {
                return Err(ctx.err(
                    &join(&at_path, "at"),
                    format!(
                        "must be greater than the previous step's ({at} <= {})",
                        prev.at
                    ),
                ));
            }
        }
        steps.push(Step { at, action });
    }
    Ok(steps)
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// RFC 9110 token characters.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// A JSON number as an unsigned integer. Control planes that carry the
/// configuration as a protobuf `Struct` (Istio's `pluginConfig`) pass every
/// number through a double, and some print `5` as `5.0`: an integral value
/// is accepted in either spelling. `None` if `v` is not a number;
/// `Some(Err)` for a fractional one; `None` for anything else (a negative
/// number included), which the caller reports as not an integer in range.
fn whole_number(v: &Value) -> Option<Result<u64, ()>> {
    if let Some(n) = v.as_u64() {
        return Some(Ok(n));
    }
    let f = v.as_f64()?;
    if f < 0.0 {
        return None;
    }
    if f.fract() != 0.0 || !f.is_finite() {
        return Some(Err(()));
    }
    // 2^64 and above cannot be represented; they fail every range check.
    Some(Ok(if f >= 18_446_744_073_709_551_616.0 {
        u64::MAX
    } else {
        f as u64
    }))
}

/// A value as it appears in JSON, shortened for error messages.
fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        let cut: String = s.chars().take(40).collect();
        format!("{cut}...")
    } else {
        s
    }
}

/// Error construction and typed field access within one policy (or the
/// top level).
struct Ctx {
    policy: Option<String>,
}

impl Ctx {
    fn err(&self, field: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            policy: self.policy.clone(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    /// The value must be an object whose keys are all in `known`.
    fn object<'v>(
        &self,
        value: &'v Value,
        path: &str,
        known: &[&str],
    ) -> Result<&'v Map<String, Value>, ConfigError> {
        // Inside a policy, paths are shown relative to its spec.
        let rel = path.strip_prefix("spec").map(|p| p.trim_start_matches('.'));
        let rel = rel.unwrap_or(path);
        let shown = if rel.is_empty() {
            if path.is_empty() {
                "configuration"
            } else {
                path
            }
        } else {
            rel
        };
        let obj = value
            .as_object()
            .ok_or_else(|| self.err(shown, format!("must be an object (got {})", show(value))))?;
        for key in obj.keys() {
            if !known.contains(&key.as_str()) {
                let mut reason = "is not a known field".to_string();
                if let Some(near) = nearest(key, known) {
                    reason.push_str(&format!(" (did you mean \"{near}\"?)"));
                }
                return Err(self.err(&join(rel, key), reason));
            }
        }
        Ok(obj)
    }

    fn uint(
        &self,
        obj: &Map<String, Value>,
        path: &str,
        name: &str,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, ConfigError> {
        let field = join(path, name);
        let Some(v) = obj.get(name) else {
            return Ok(None);
        };
        match whole_number(v) {
            Some(Ok(n)) if n < min => {
                Err(self.err(&field, format!("must be >= {min} (got {})", show(v))))
            }
            Some(Ok(n)) if n > max => {
                Err(self.err(&field, format!("must be <= {max} (got {})", show(v))))
            }
            Some(Ok(n)) => Ok(Some(n)),
            Some(Err(())) => Err(self.err(
                &field,
                format!(
                    "must be a whole number from {min} to {max} (got {})",
                    show(v)
                ),
            )),
            None => Err(self.err(
                &field,
                format!("must be an integer from {min} to {max} (got {})", show(v)),
            )),
        }
    }

    fn boolean(
        &self,
        obj: &Map<String, Value>,
        path: &str,
        name: &str,
    ) -> Result<Option<bool>, ConfigError> {
        match obj.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.err(
                &join(path, name),
                format!("must be true or false (got {})", show(other)),
            )),
        }
    }

    fn string<'v>(
        &self,
        obj: &'v Map<String, Value>,
        path: &str,
        name: &str,
    ) -> Result<Option<&'v str>, ConfigError> {
        match obj.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(self.err(
                &join(path, name),
                format!("must be a string (got {})", show(other)),
            )),
        }
    }

    fn string_list<'v>(
        &self,
        obj: &'v Map<String, Value>,
        path: &str,
        name: &str,
    ) -> Result<Option<Vec<&'v str>>, ConfigError> {
        let field = join(path, name);
        let list = match obj.get(name) {
            None => return Ok(None),
            Some(Value::Array(list)) => list,
            Some(other) => {
                return Err(self.err(
                    &field,
                    format!("must be a list of strings (got {})", show(other)),
                ))
            }
        };
        if list.is_empty() {
            return Err(self.err(
                &field,
                "must not be empty (leave the field out to match everything)",
            ));
        }
        list.iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.as_str()),
                other => Err(self.err(
                    &format!("{field}[{i}]"),
                    format!("must be a string (got {})", show(other)),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// The known field closest to a misspelt one, if any is close enough.
fn nearest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let lower = key.to_lowercase();
    if let Some(k) = known
        .iter()
        .find(|k| lower.len() >= 4 && (k.starts_with(&lower) || lower.starts_with(**k)))
    {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, k)| *d <= 3.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance, case-insensitive, one row at a time.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.to_lowercase().chars().enumerate() {
        let mut cur = Vec::with_capacity(b.len() + 1);
        cur.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let diagonal = prev
                .get(j)
                .copied()
                .unwrap_or(usize::MAX)
                .saturating_add(usize::from(ca != *cb));
            let up = prev
                .get(j + 1)
                .copied()
                .unwrap_or(usize::MAX)
                .saturating_add(1);
            let left = cur.last().copied().unwrap_or(usize::MAX).saturating_add(1);
            cur.push(diagonal.min(up).min(left));
        }
        prev = cur;
    }
    prev.last().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "max_tracked_fingerprints": 1024,
            "max_body_bytes": 4096,
            "policies": [{
                "id": "llm-policy",
                "spec": {
                    "mode": "enforce",
                    "selector": {"pathPrefix": "/v1/", "methods": ["post"], "hosts": ["API.example.com:443"]},
                    "limit_keys": ["query:user", "header:X-Org-Id", "jwt:sub", "ip:address"],
                    "loop_detection": {
                        "enabled": true,
                        "window_seconds": 60,
                        "threshold_identical_requests": 5,
                        "action": "reject",
                        "similarity": "exact"
                    }
                }
            }]
        })
    }

    fn err_of(v: Value) -> String {
        match Config::from_value(&v) {
            Ok(_) => panic!("expected an error for {v}"),
            Err(e) => e.to_string(),
        }
    }

    fn with(path: &[&str], value: Value) -> Value {
        let mut v = base();
        let mut cur = &mut v;
        for (i, p) in path.iter().enumerate() {
            if i + 1 == path.len() {
                cur[*p] = value.clone();
                break;
            }
            cur = if let Ok(idx) = p.parse::<usize>() {
                &mut cur[idx]
            } else {
                &mut cur[*p]
            };
        }
        v
    }

    fn without(path: &[&str]) -> Value {
        let mut v = base();
        let mut cur = &mut v;
        for (i, p) in path.iter().enumerate() {
            if i + 1 == path.len() {
                if let Some(o) = cur.as_object_mut() {
                    o.remove(*p);
                }
                break;
            }
            cur = if let Ok(idx) = p.parse::<usize>() {
                &mut cur[idx]
            } else {
                &mut cur[*p]
            };
        }
        v
    }

    const LD: [&str; 4] = ["policies", "0", "spec", "loop_detection"];

    fn ld(field: &str) -> Vec<&str> {
        let mut p = LD.to_vec();
        p.push(field);
        p
    }

    #[test]
    fn parses_the_documented_example() {
        let cfg = Config::from_value(&base()).unwrap();
        assert_eq!(cfg.max_tracked_fingerprints, 1024);
        assert_eq!(cfg.max_body_bytes, 4096);
        let p = &cfg.policies[0];
        assert_eq!(p.id, "llm-policy");
        assert_eq!(p.selector.path, PathMatch::Prefix("/v1/".into()));
        assert_eq!(p.selector.methods, vec!["POST"]);
        assert_eq!(p.selector.hosts, vec!["api.example.com"]);
        // Sorted by canonical name.
        assert_eq!(
            p.limit_keys.iter().map(|k| k.name()).collect::<Vec<_>>(),
            vec!["header:x-org-id", "ip:address", "jwt:sub", "query:user"]
        );
        let d = p.detection.as_ref().unwrap();
        assert_eq!(d.window_ms(), 60_000);
        assert_eq!(
            d.steps,
            vec![Step {
                at: 5,
                action: Action::Reject
            }]
        );
        assert_eq!(d.hits_to_keep(), 5);
        assert_eq!(d.cooldown_seconds, 0);
    }

    #[test]
    fn defaults_apply() {
        let v = json!({"policies": [{"id": "p", "spec": {"selector": {},
            "loop_detection": {"enabled": true, "window_seconds": 1, "threshold_identical_requests": 2}}}]});
        let cfg = Config::from_value(&v).unwrap();
        assert_eq!(cfg.max_tracked_fingerprints, 65_536);
        assert_eq!(cfg.max_body_bytes, 1_048_576);
        let p = &cfg.policies[0];
        assert_eq!(p.mode, Mode::Enforce);
        assert_eq!(p.selector, Selector::default());
        assert!(p.limit_keys.is_empty());
        let d = p.detection.as_ref().unwrap();
        assert_eq!(
            d.steps,
            vec![Step {
                at: 2,
                action: Action::Reject
            }]
        );
        assert_eq!(d.similarity, Similarity::Exact);
        assert!(p.exempt.is_empty());
    }

    /// Every number as a double, the way a protobuf `Struct` carries it
    /// (and Python's or Java's JSON printers write it: `5.0`).
    fn as_doubles(v: &Value) -> Value {
        match v {
            Value::Number(n) => json!(n.as_f64().unwrap()),
            Value::Array(a) => Value::Array(a.iter().map(as_doubles).collect()),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), as_doubles(v))).collect())
            }
            other => other.clone(),
        }
    }

    #[test]
    fn integral_doubles_are_integers_and_fractions_are_refused() {
        let mut full = base();
        full["policies"][0]["spec"]["loop_detection"] = json!({"enabled": true, "window_seconds": 60,
            "escalation": [{"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}, {"at": 8, "action": "reject"}],
            "throttle_step_ms": 200, "throttle_max_delay_ms": 3000, "cooldown_seconds": 120});
        full["policies"][0]["spec"]["tool_loops"] =
            json!({"enabled": true, "last_calls": 6, "identical_min": 3});
        full["store"] = json!({"type": "redis_webdis", "cluster": "r", "timeout_ms": 25});
        let doubles = as_doubles(&full);
        assert!(serde_json::to_string(&doubles)
            .unwrap()
            .contains("\"window_seconds\":60.0"));
        assert_eq!(
            Config::from_value(&doubles).unwrap(),
            Config::from_value(&full).unwrap()
        );
        // Parsed from text too (serde_json reads `5.0` as a float).
        let text = br#"{"max_body_bytes": 2048.0, "policies": [{"id": "p", "spec": {"selector": {},
            "loop_detection": {"enabled": true, "window_seconds": 1e1, "threshold_identical_requests": 2.0}}}]}"#;
        let cfg = Config::parse(text).unwrap();
        assert_eq!(cfg.max_body_bytes, 2048);
        assert_eq!(
            cfg.policies[0].detection.as_ref().unwrap().window_ms(),
            10_000
        );
        assert_eq!(
            err_of(with(&ld("window_seconds"), json!(2.5))),
            "policy \"llm-policy\": loop_detection.window_seconds must be a whole number from 1 to 86400 (got 2.5)"
        );
        assert_eq!(
            err_of(with(&ld("threshold_identical_requests"), json!(1.0))),
            "policy \"llm-policy\": loop_detection.threshold_identical_requests must be >= 2 (got 1); use 0 to switch the policy off"
        );
        assert!(err_of(with(&["max_body_bytes"], json!(-1.0)))
            .starts_with("max_body_bytes must be an integer from 1 to 67108864 (got -1.0)"));
        assert!(err_of(with(&["max_body_bytes"], json!(1e300)))
            .starts_with("max_body_bytes must be <= 67108864 (got 1"));
    }

    #[test]
    fn threshold_one_names_policy_and_field() {
        assert_eq!(
            err_of(with(&ld("threshold_identical_requests"), json!(1))),
            "policy \"llm-policy\": loop_detection.threshold_identical_requests must be >= 2 (got 1); use 0 to switch the policy off"
        );
    }

    #[test]
    fn threshold_bounds() {
        assert!(
            err_of(with(&ld("threshold_identical_requests"), json!(1025)))
                .contains("must be <= 1024 (got 1025)")
        );
        assert!(err_of(with(&ld("threshold_identical_requests"), json!(-3)))
            .contains("must be an integer"));
        assert!(
            err_of(with(&ld("threshold_identical_requests"), json!(2.5)))
                .contains("must be a whole number from 0 to 1024 (got 2.5)")
        );
        assert!(
            err_of(with(&ld("threshold_identical_requests"), json!("5"))).contains("(got \"5\")")
        );
        let cfg =
            Config::from_value(&with(&ld("threshold_identical_requests"), json!(1024))).unwrap();
        assert_eq!(
            cfg.policies[0].detection.as_ref().unwrap().threshold(),
            1024
        );
    }

    #[test]
    fn threshold_zero_and_disabled_switch_the_policy_off() {
        let cfg = Config::from_value(&with(&ld("threshold_identical_requests"), json!(0))).unwrap();
        assert!(cfg.policies[0].detection.is_none());
        let cfg = Config::from_value(&with(&ld("enabled"), json!(false))).unwrap();
        assert!(cfg.policies[0].detection.is_none());
        // A disabled policy needs no window or threshold...
        let v = json!({"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {"enabled": false}}}]});
        assert!(Config::from_value(&v).unwrap().policies[0]
            .detection
            .is_none());
        // ...but what it gives is still checked.
        let v = json!({"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {"enabled": false, "window_seconds": 0}}}]});
        assert!(err_of(v).contains("loop_detection.window_seconds must be >= 1 (got 0)"));
    }

    #[test]
    fn window_bounds() {
        assert_eq!(
            err_of(with(&ld("window_seconds"), json!(0))),
            "policy \"llm-policy\": loop_detection.window_seconds must be >= 1 (got 0)"
        );
        assert!(err_of(with(&ld("window_seconds"), json!(86_401))).contains("must be <= 86400"));
        assert!(err_of(without(&ld("window_seconds")))
            .contains("loop_detection.window_seconds is required when enabled"));
        assert!(err_of(without(&ld("threshold_identical_requests")))
            .contains("threshold_identical_requests is required when enabled"));
        assert!(err_of(without(&ld("enabled"))).contains("loop_detection.enabled is required"));
        assert!(err_of(with(&ld("enabled"), json!("yes"))).contains("must be true or false"));
    }

    #[test]
    fn actions_and_modes() {
        for (a, want) in [
            ("warn", Action::Warn),
            ("throttle", Action::Throttle),
            ("reject", Action::Reject),
        ] {
            let cfg = Config::from_value(&with(&ld("action"), json!(a))).unwrap();
            let d = cfg.policies[0].detection.clone().unwrap();
            assert_eq!(
                d.steps,
                vec![Step {
                    at: 5,
                    action: want
                }]
            );
            assert_eq!(d.threshold(), 5);
        }
        assert!(err_of(with(&ld("action"), json!("block")))
            .contains("must be \"reject\", \"throttle\" or \"warn\" (got \"block\")"));
        assert!(err_of(with(&ld("similarity"), json!("fuzzy")))
            .contains("loop_detection.similarity must be \"exact\", \"llm_tail\" or \"session\" (got \"fuzzy\")"));
        let cfg =
            Config::from_value(&with(&["policies", "0", "spec", "mode"], json!("shadow"))).unwrap();
        assert_eq!(cfg.policies[0].mode, Mode::Shadow);
        assert!(
            err_of(with(&["policies", "0", "spec", "mode"], json!("audit")))
                .contains("mode must be")
        );
        // The top-level switch overrides every policy's mode.
        let cfg = Config::from_value(&with(&["shadow"], json!(true))).unwrap();
        assert_eq!(cfg.policies[0].mode, Mode::Shadow);
        assert!(err_of(with(&["shadow"], json!("yes"))).starts_with("shadow must be true or false"));
    }

    #[test]
    fn throttle_settings() {
        let mut v = with(&ld("action"), json!("throttle"));
        let d = Config::from_value(&v).unwrap().policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!((d.throttle_step_ms, d.throttle_max_delay_ms), (100, 10_000));
        // The record keeps enough hits to reach the cap: 10000 / 100.
        assert_eq!(d.hits_to_keep(), 100);
        v["policies"][0]["spec"]["loop_detection"]["throttle_max_delay_ms"] = json!(60_001);
        assert!(err_of(v.clone())
            .contains("loop_detection.throttle_max_delay_ms must be <= 60000 (got 60001)"));
        v["policies"][0]["spec"]["loop_detection"]["throttle_max_delay_ms"] = json!(60_000);
        v["policies"][0]["spec"]["loop_detection"]["throttle_step_ms"] = json!(10);
        assert!(err_of(v.clone()).contains("loop_detection.throttle_max_delay_ms needs 6000 identical hits to reach its cap at 10 ms per hit, more than the 1024 a fingerprint keeps"));
        v["policies"][0]["spec"]["loop_detection"]["throttle_step_ms"] = json!(100);
        v["policies"][0]["spec"]["loop_detection"]["throttle_max_delay_ms"] = json!(50);
        assert!(err_of(v.clone())
            .contains("throttle_max_delay_ms must be >= throttle_step_ms (50 < 100)"));
        v["policies"][0]["spec"]["loop_detection"]["throttle_step_ms"] = json!(0);
        assert!(err_of(v).contains("throttle_step_ms must be >= 1 (got 0)"));
    }

    #[test]
    fn escalation_ladder() {
        let mut v = without(&ld("threshold_identical_requests"));
        v["policies"][0]["spec"]["loop_detection"]
            .as_object_mut()
            .unwrap()
            .remove("action");
        v["policies"][0]["spec"]["loop_detection"]["escalation"] = json!([
            {"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}, {"at": 8, "action": "reject"}]);
        let d = Config::from_value(&v).unwrap().policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!(d.threshold(), 3);
        assert_eq!(d.reject_at(), Some(8));
        assert_eq!(d.step_at(2), None);
        assert_eq!(d.step_at(4).map(|s| s.action), Some(Action::Warn));
        assert_eq!(d.step_at(7).map(|s| s.action), Some(Action::Throttle));
        assert_eq!(d.step_at(100).map(|s| s.action), Some(Action::Reject));
        assert_eq!(d.hits_to_keep(), 8);
        let esc = |steps: Value| {
            let mut v = v.clone();
            v["policies"][0]["spec"]["loop_detection"]["escalation"] = steps;
            v
        };
        assert!(err_of(esc(
            json!([{"at": 3, "action": "warn"}, {"at": 3, "action": "reject"}])
        ))
        .contains(
            "loop_detection.escalation[1].at must be greater than the previous step's (3 <= 3)"
        ));
        assert!(err_of(esc(json!([{"at": 1, "action": "warn"}])))
            .contains("escalation[0].at must be >= 2 (got 1)"));
        assert!(err_of(esc(json!([{"at": 1025, "action": "warn"}])))
            .contains("escalation[0].at must be <= 1024"));
        assert!(err_of(esc(json!([{"at": 3, "action": "stop"}])))
            .contains("escalation[0].action must be"));
        assert!(err_of(esc(json!([{"at": 3}]))).contains("escalation[0].action is required"));
        assert!(err_of(esc(json!([{"at": 3, "action": "warn", "x": 1}])))
            .contains("escalation[0].x is not a known field"));
        assert!(
            err_of(esc(json!([]))).contains("loop_detection.escalation must be a non-empty list")
        );
        // Giving either of what the ladder replaces is an error.
        let mut both = v.clone();
        both["policies"][0]["spec"]["loop_detection"]["action"] = json!("reject");
        assert!(err_of(both).contains("loop_detection.escalation replaces \"action\""));
        let mut both = v.clone();
        both["policies"][0]["spec"]["loop_detection"]["threshold_identical_requests"] = json!(3);
        assert!(err_of(both).contains("replaces \"threshold_identical_requests\""));
        // A ladder ending in throttle keeps enough hits for the cap.
        let d = Config::from_value(&esc(
            json!([{"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}]),
        ))
        .unwrap()
        .policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!(d.hits_to_keep(), 100);
    }

    #[test]
    fn cooldown_needs_a_reject() {
        let d = Config::from_value(&with(&ld("cooldown_seconds"), json!(30)))
            .unwrap()
            .policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!(d.cooldown_seconds, 30);
        assert!(err_of(with(&ld("cooldown_seconds"), json!(86_401)))
            .contains("cooldown_seconds must be <= 86400"));
        let mut v = with(&ld("action"), json!("warn"));
        v["policies"][0]["spec"]["loop_detection"]["cooldown_seconds"] = json!(5);
        assert!(err_of(v).contains("loop_detection.cooldown_seconds needs a reject action"));
    }

    #[test]
    fn exemptions() {
        let ex = |e: Value| with(&["policies", "0", "spec", "exempt"], e);
        let cfg = Config::from_value(&ex(json!([
            {"key": "header:X-Batch-Id", "present": true},
            {"key": "header:x-api-key-id", "values": ["ci-runner"]}])))
        .unwrap();
        assert_eq!(
            cfg.policies[0].exempt,
            vec![
                Exemption {
                    key: LimitKey::Header("x-batch-id".into()),
                    matcher: ExemptMatch::Present(true)
                },
                Exemption {
                    key: LimitKey::Header("x-api-key-id".into()),
                    matcher: ExemptMatch::Values(vec!["ci-runner".into()])
                },
            ]
        );
        assert!(err_of(ex(json!([{"key": "header:a"}])))
            .contains("exempt[0] must give exactly one of \"present\" or \"values\""));
        assert!(err_of(ex(
            json!([{"key": "header:a", "present": true, "values": ["x"]}])
        ))
        .contains("exactly one of"));
        assert!(err_of(ex(json!([{"present": true}]))).contains("exempt[0].key is required"));
        assert!(err_of(ex(json!([{"key": "cookie:a", "present": true}])))
            .contains("exempt[0].key must be header:<name>"));
        assert!(err_of(ex(json!([{"key": "header:a", "value": "x"}])))
            .contains("exempt[0].value is not a known field (did you mean \"values\"?)"));
        assert!(err_of(ex(json!({"key": "header:a"}))).contains("exempt must be a list"));
    }

    #[test]
    fn llm_tail_and_session_modes() {
        let mut v = with(&ld("similarity"), json!("llm_tail"));
        let d = Config::from_value(&v).unwrap().policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!(d.similarity, Similarity::LlmTail { tail_messages: 3 });
        v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(6);
        let d = Config::from_value(&v).unwrap().policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!(d.similarity, Similarity::LlmTail { tail_messages: 6 });
        v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(0);
        assert!(err_of(v.clone()).contains("loop_detection.tail_messages must be >= 1 (got 0)"));
        v["policies"][0]["spec"]["loop_detection"]["tail_messages"] = json!(65);
        assert!(err_of(v).contains("must be <= 64"));
        assert!(err_of(with(&ld("tail_messages"), json!(3)))
            .contains("loop_detection.tail_messages applies only to similarity \"llm_tail\""));
        assert!(err_of(with(&ld("session_header"), json!("x-s")))
            .contains("session_header applies only to similarity \"session\""));
        assert!(err_of(with(&ld("fallback_threshold"), json!(9)))
            .contains("fallback_threshold applies only"));

        let mut v = with(&ld("similarity"), json!("session"));
        let d = Config::from_value(&v).unwrap().policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!(
            d.similarity,
            Similarity::Session {
                header: "x-session-id".into(),
                fallback_steps: vec![Step {
                    at: 25,
                    action: Action::Reject
                }]
            }
        );
        assert_eq!(d.ladder(true).threshold(), 25);
        assert_eq!(d.ladder(true).hits_to_keep(), 25);
        assert_eq!(d.ladder(false).threshold(), 5);
        v["policies"][0]["spec"]["loop_detection"]["session_header"] = json!("X-Agent-Session");
        v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(12);
        let d = Config::from_value(&v).unwrap().policies[0]
            .detection
            .clone()
            .unwrap();
        assert_eq!(
            d.similarity,
            Similarity::Session {
                header: "x-agent-session".into(),
                fallback_steps: vec![Step {
                    at: 12,
                    action: Action::Reject
                }]
            }
        );
        v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(4);
        assert!(err_of(v.clone())
            .contains("loop_detection.fallback_threshold must be >= the threshold (4 < 5)"));
        v["policies"][0]["spec"]["loop_detection"]["fallback_threshold"] = json!(10);
        v["policies"][0]["spec"]["loop_detection"]["session_header"] = json!("bad header");
        assert!(err_of(v).contains("session_header must be a header name"));
    }

    #[test]
    fn fallback_ladder_scales_every_step() {
        let steps = [
            Step {
                at: 3,
                action: Action::Warn,
            },
            Step {
                at: 5,
                action: Action::Throttle,
            },
            Step {
                at: 8,
                action: Action::Reject,
            },
        ];
        assert_eq!(
            scale_steps(&steps, 15),
            vec![
                Step {
                    at: 15,
                    action: Action::Warn
                },
                Step {
                    at: 25,
                    action: Action::Throttle
                },
                Step {
                    at: 40,
                    action: Action::Reject
                }
            ]
        );
        // Capped at 1024, where the later step wins.
        assert_eq!(
            scale_steps(&steps, 1000),
            vec![
                Step {
                    at: 1000,
                    action: Action::Warn
                },
                Step {
                    at: 1024,
                    action: Action::Reject
                }
            ]
        );
    }

    #[test]
    fn tool_loops_block() {
        let tl = |v: Value| with(&["policies", "0", "spec", "tool_loops"], v);
        let cfg = Config::from_value(&tl(json!({"enabled": true}))).unwrap();
        let t = cfg.policies[0].tool_loops.clone().unwrap();
        assert_eq!((t.last_calls, t.identical_min, t.pattern_min), (6, 3, 4));
        assert_eq!(
            t.ladder,
            vec![ToolStep::Nudge, ToolStep::Directive, ToolStep::Reject]
        );
        assert!(!t.directive_disables_tools);
        assert!(cfg.policies[0].may_rewrite_bodies());
        let cfg = Config::from_value(&tl(
            json!({"enabled": true, "ladder": ["reject"], "exempt_tools": ["poll"]}),
        ))
        .unwrap();
        let t = cfg.policies[0].tool_loops.clone().unwrap();
        assert_eq!(t.ladder, vec![ToolStep::Reject]);
        assert_eq!(t.exempt_tools, vec!["poll"]);
        assert!(!cfg.policies[0].may_rewrite_bodies());
        assert!(Config::from_value(&tl(json!({"enabled": false})))
            .unwrap()
            .policies[0]
            .tool_loops
            .is_none());
        assert!(err_of(tl(json!({}))).contains("tool_loops.enabled is required"));
        assert!(err_of(tl(json!({"enabled": true, "last_calls": 65})))
            .contains("tool_loops.last_calls must be <= 64"));
        assert!(err_of(tl(
            json!({"enabled": true, "last_calls": 4, "pattern_min": 5})
        ))
        .contains("tool_loops.pattern_min must be <= last_calls (5 > 4)"));
        assert!(err_of(tl(json!({"enabled": true, "last_calls": 2})))
            .contains("tool_loops.identical_min must be <= last_calls (3 > 2)"));
        assert!(err_of(tl(json!({"enabled": true, "identical_min": 1})))
            .contains("tool_loops.identical_min must be >= 2"));
        assert!(
            err_of(tl(json!({"enabled": true, "ladder": ["reject", "nudge"]})))
                .contains("tool_loops.ladder must list its steps in the order")
        );
        assert!(
            err_of(tl(json!({"enabled": true, "ladder": ["nudge", "nudge"]})))
                .contains("each at most once")
        );
        assert!(err_of(tl(json!({"enabled": true, "ladder": ["poke"]})))
            .contains("tool_loops.ladder[0] must be"));
        assert!(err_of(tl(json!({"enabled": true, "ladder": []})))
            .contains("tool_loops.ladder must not be empty"));
        assert!(err_of(tl(
            json!({"enabled": true, "ladder": ["reject"], "directive_disables_tools": true})
        ))
        .contains("directive_disables_tools needs a \"directive\" step"));
        // tool_loops alone makes a policy.
        let mut v = tl(json!({"enabled": true}));
        v["policies"][0]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("loop_detection");
        let cfg = Config::from_value(&v).unwrap();
        assert!(cfg.policies[0].detection.is_none() && cfg.policies[0].is_active());
        assert!(
            err_of(without(&["policies", "0", "spec", "loop_detection"]))
                .contains("loop_detection is required (or give tool_loops)")
        );
    }

    #[test]
    fn route_metadata_and_access_log_switches() {
        let cfg = Config::from_value(&base()).unwrap();
        assert!(!cfg.route_metadata);
        assert_eq!(cfg.access_log, AccessLog::Actions);
        let cfg = Config::from_value(&with(&["route_metadata"], json!(true))).unwrap();
        assert!(cfg.route_metadata);
        assert_eq!(
            Config::from_value(&with(&["access_log"], json!("all")))
                .unwrap()
                .access_log,
            AccessLog::All
        );
        assert_eq!(
            Config::from_value(&with(&["access_log"], json!("off")))
                .unwrap()
                .access_log,
            AccessLog::Off
        );
        assert!(err_of(with(&["access_log"], json!("some")))
            .starts_with("access_log must be \"actions\", \"all\" or \"off\""));
        assert!(err_of(with(&["route_metadata"], json!(1)))
            .starts_with("route_metadata must be true or false"));
        assert!(!cfg.hold_request_headers);
        let cfg = Config::from_value(&with(&["hold_request_headers"], json!(true))).unwrap();
        assert!(cfg.hold_request_headers);
        assert!(err_of(with(&["hold_request_headers"], json!("yes")))
            .starts_with("hold_request_headers must be true or false"));
        assert_eq!(
            err_of(with(&["hold_request_header"], json!(true))),
            "hold_request_header is not a known field (did you mean \"hold_request_headers\"?)"
        );
    }

    #[test]
    fn store_block() {
        assert_eq!(
            Config::from_value(&base()).unwrap().store,
            StoreConfig::Local
        );
        assert_eq!(
            Config::from_value(&with(&["store"], json!({"type": "local"})))
                .unwrap()
                .store,
            StoreConfig::Local
        );
        let cfg = Config::from_value(&with(
            &["store"],
            json!({"type": "redis_webdis", "cluster": "loopguard_redis",
            "authority": "webdis", "timeout_ms": 25, "on_error": "local"}),
        ))
        .unwrap();
        assert_eq!(
            cfg.store,
            StoreConfig::RedisWebdis(RedisStore {
                cluster: "loopguard_redis".into(),
                authority: "webdis".into(),
                path: "/".into(),
                timeout_ms: 25,
                on_error: OnStoreError::Local
            })
        );
        let cfg = Config::from_value(&with(
            &["store"],
            json!({"type": "redis_webdis", "cluster": "r", "on_error": "allow"}),
        ))
        .unwrap();
        assert!(matches!(
            cfg.store,
            StoreConfig::RedisWebdis(RedisStore {
                on_error: OnStoreError::Allow,
                ..
            })
        ));
        assert!(err_of(with(&["store"], json!({"type": "redis_webdis"})))
            .starts_with("store.cluster is required"));
        assert!(err_of(with(&["store"], json!({"type": "redis"})))
            .starts_with("store.type must be \"local\" or \"redis_webdis\""));
        assert!(err_of(with(
            &["store"],
            json!({"type": "redis_webdis", "cluster": "r", "timeout_ms": 0})
        ))
        .contains("store.timeout_ms must be >= 1"));
        assert!(err_of(with(
            &["store"],
            json!({"type": "redis_webdis", "cluster": "r", "on_error": "deny"})
        ))
        .contains("store.on_error must be"));
        assert!(
            err_of(with(&["store"], json!({"type": "local", "cluster": "r"})))
                .contains("store.cluster applies only to the \"redis_webdis\" store")
        );
        assert!(err_of(with(
            &["store"],
            json!({"type": "redis_webdis", "cluster": "r", "host": "x"})
        ))
        .contains("store.host is not a known field"));
    }

    #[test]
    fn webhook_alerts() {
        let cfg = Config::from_value(&with(&["alerts"], json!({"webhook": {"cluster": "alerts", "authority": "hooks.example.com",
            "path": "/loopguard", "timeout_ms": 500, "hmac_secret_env": "LOOPGUARD_WEBHOOK_SECRET"}}))).unwrap();
        assert_eq!(
            cfg.webhook,
            Some(Webhook {
                cluster: "alerts".into(),
                authority: "hooks.example.com".into(),
                path: "/loopguard".into(),
                timeout_ms: 500,
                hmac_secret_env: Some("LOOPGUARD_WEBHOOK_SECRET".into())
            })
        );
        let cfg = Config::from_value(&with(
            &["alerts"],
            json!({"webhook": {"cluster": "a", "authority": "h"}}),
        ))
        .unwrap();
        let w = cfg.webhook.unwrap();
        assert_eq!(
            (w.path.as_str(), w.timeout_ms, w.hmac_secret_env),
            ("/", 2_000, None)
        );
        assert!(Config::from_value(&base()).unwrap().webhook.is_none());
        assert!(
            err_of(with(&["alerts"], json!({"webhook": {"authority": "h"}})))
                .starts_with("alerts.webhook.cluster is required")
        );
        assert!(err_of(with(
            &["alerts"],
            json!({"webhook": {"cluster": "a", "authority": "h", "path": "x"}})
        ))
        .contains("alerts.webhook.path must start with"));
        assert!(err_of(with(
            &["alerts"],
            json!({"webhook": {"cluster": "a", "authority": "h", "timeout_ms": 0}})
        ))
        .contains("alerts.webhook.timeout_ms must be >= 1"));
        assert!(err_of(with(
            &["alerts"],
            json!({"webhook": {"cluster": "a", "authority": "h", "hmac_secret_env": "A B"}})
        ))
        .contains("hmac_secret_env must be an environment variable name"));
        assert!(err_of(with(&["alerts"], json!({"slack": {}})))
            .starts_with("alerts.slack is not a known field"));
    }

    #[test]
    fn routes_and_verified_claims() {
        let cfg = Config::from_value(&with(
            &["policies", "0", "spec", "selector", "routes"],
            json!(["chat", "tools"]),
        ))
        .unwrap();
        assert_eq!(cfg.policies[0].selector.routes, vec!["chat", "tools"]);
        assert!(cfg.uses_route_names());
        assert!(!Config::from_value(&base()).unwrap().uses_route_names());
        assert!(err_of(with(
            &["policies", "0", "spec", "selector", "routes"],
            json!([""])
        ))
        .contains("selector.routes[0] must not be empty"));
        let cfg = Config::from_value(&with(
            &["policies", "0", "spec", "limit_keys"],
            json!(["jwt_verified:sub"]),
        ))
        .unwrap();
        assert_eq!(
            cfg.policies[0].limit_keys,
            vec![LimitKey::JwtVerified("sub".into())]
        );
        assert_eq!(cfg.jwt_payload_in_metadata, "jwt_payload");
        let cfg = Config::from_value(&with(&["jwt_payload_in_metadata"], json!("claims"))).unwrap();
        assert_eq!(cfg.jwt_payload_in_metadata, "claims");
    }

    #[test]
    fn unknown_fields_are_errors_everywhere_with_a_suggestion() {
        assert_eq!(
            err_of(with(&ld("treshold_identical_requests"), json!(5))),
            "policy \"llm-policy\": loop_detection.treshold_identical_requests is not a known field (did you mean \"threshold_identical_requests\"?)"
        );
        assert!(err_of(with(
            &["policies", "0", "spec", "selector", "path"],
            json!("/x")
        ))
        .starts_with("policy \"llm-policy\": selector.path is not a known field"));
        assert!(err_of(with(&["policies", "0", "spec", "rules"], json!([])))
            .starts_with("policy \"llm-policy\": rules is not a known field"));
        assert!(err_of(with(&["policies", "0", "name"], json!("x")))
            .starts_with("policies[0].name is not a known field"));
        assert!(err_of(with(&["max_tracked"], json!(5))).starts_with(
            "max_tracked is not a known field (did you mean \"max_tracked_fingerprints\"?)"
        ));
    }

    #[test]
    fn ids_are_checked_and_unique() {
        assert!(err_of(with(&["policies", "0", "id"], json!("bad id")))
            .starts_with("policies[0].id must match [A-Za-z0-9_-]{1,64} (got \"bad id\")"));
        assert!(err_of(with(&["policies", "0", "id"], json!(""))).contains("must match"));
        assert!(
            err_of(with(&["policies", "0", "id"], json!("a".repeat(65)))).contains("must match")
        );
        assert!(err_of(without(&["policies", "0", "id"])).contains("policies[0].id is required"));
        let mut v = base();
        let p = v["policies"][0].clone();
        v["policies"].as_array_mut().unwrap().push(p);
        assert_eq!(
            err_of(v),
            "policy \"llm-policy\": id is used by more than one policy; ids must be unique"
        );
    }

    #[test]
    fn selector_validation() {
        let sel = |s: Value| with(&["policies", "0", "spec", "selector"], s);
        assert!(err_of(sel(json!({"pathExact": "/a", "pathPrefix": "/b"})))
            .contains("selector may give pathExact or pathPrefix, not both"));
        assert!(err_of(sel(json!({"pathPrefix": "v1"})))
            .contains("selector.pathPrefix must start with \"/\""));
        assert!(err_of(sel(json!({"pathExact": "/a?b=1"}))).contains("must not contain a query"));
        assert!(err_of(sel(json!({"methods": []}))).contains("selector.methods must not be empty"));
        assert!(err_of(sel(json!({"methods": ["GET", "P O"]})))
            .contains("selector.methods[1] must be an HTTP method token"));
        assert!(err_of(sel(json!({"methods": "GET"})))
            .contains("selector.methods must be a list of strings"));
        assert!(err_of(sel(json!({"hosts": ["a b"]})))
            .contains("selector.hosts[0] must be a host name"));
        assert!(err_of(sel(json!("x"))).contains("selector must be an object"));
        assert!(err_of(without(&["policies", "0", "spec", "selector"]))
            .contains("selector is required (use {} to match every request)"));
        let cfg =
            Config::from_value(&sel(json!({"hosts": ["*.Example.com", "[::1]:80"]}))).unwrap();
        assert_eq!(
            cfg.policies[0].selector.hosts,
            vec!["*.example.com", "[::1]"]
        );
    }

    #[test]
    fn limit_key_validation() {
        let lk = |s: Value| with(&["policies", "0", "spec", "limit_keys"], s);
        assert!(err_of(lk(json!(["cookie:x"]))).contains("limit_keys[0] must be header:<name>, query:<name>, jwt:<claim>, jwt_verified:<claim> or ip:address (got \"cookie:x\")"));
        assert!(err_of(lk(json!(["header:"]))).contains("limit_keys[0] names no header"));
        assert!(err_of(lk(json!(["ip:port"]))).contains("must be ip:address"));
        assert!(err_of(lk(json!(["header:a b"]))).contains("invalid header name"));
        assert!(err_of(lk(json!(["header:X-A", "header:x-a"])))
            .contains("limit_keys[1] repeats \"header:x-a\""));
        assert!(err_of(lk(json!([3]))).contains("limit_keys[0] must be a string (got 3)"));
        assert!(err_of(lk(json!("header:x"))).contains("limit_keys must be a list"));
        assert!(err_of(lk(json!(["nocolon"]))).contains("limit_keys[0] must be"));
    }

    #[test]
    fn top_level_validation() {
        assert!(err_of(with(&["max_tracked_fingerprints"], json!(0)))
            .starts_with("max_tracked_fingerprints must be >= 1 (got 0)"));
        assert!(
            err_of(with(&["max_tracked_fingerprints"], json!(4_194_305)))
                .contains("must be <= 4194304")
        );
        assert!(
            err_of(with(&["max_body_bytes"], json!(0))).starts_with("max_body_bytes must be >= 1")
        );
        assert!(err_of(json!({"policies": []})).contains("policies must list at least one policy"));
        assert!(err_of(json!({})).contains("policies is required"));
        assert!(err_of(json!([])).contains("configuration must be an object"));
        assert!(Config::parse(b"{not json")
            .unwrap_err()
            .to_string()
            .starts_with("configuration is not valid JSON"));
        assert!(Config::parse(b"").is_err());
    }

    #[test]
    fn normalize_host_cases() {
        assert_eq!(normalize_host("API.Example.COM:8443"), "api.example.com");
        assert_eq!(normalize_host("example.com."), "example.com");
        assert_eq!(normalize_host("[::1]:10000"), "[::1]");
        assert_eq!(normalize_host("::1"), "::1");
        assert_eq!(normalize_host("localhost"), "localhost");
    }

    #[test]
    fn never_panics_on_odd_json() {
        for s in [
            "null", "1", "\"x\"", "{\"policies\": [null]}", "{\"policies\": [{\"id\": 5}]}",
            "{\"policies\": [{\"id\": \"a\", \"spec\": []}]}",
            "{\"policies\": [{\"id\": \"a\", \"spec\": {\"selector\": {}, \"loop_detection\": []}}]}",
            "{\"policies\": {}}", "{\"max_body_bytes\": 1e300, \"policies\": []}",
        ] {
            assert!(Config::parse(s.as_bytes()).is_err(), "{s}");
        }
    }
}
