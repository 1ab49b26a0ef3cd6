//! The configuration as written: serde types with `deny_unknown_fields`,
//! read with the path of every value tracked. Everything is optional here,
//! so the validation step ([`super::validate`]) can say exactly what is
//! missing, out of range or inconsistent. The JSON Schema of the
//! configuration (`schema/loopguard.schema.json`, feature `schema`) is
//! generated from these types, so their doc comments are its descriptions.

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::fmt;
use std::marker::PhantomData;

mod budget;
pub use budget::*;

#[cfg(feature = "schema")]
use schemars::JsonSchema;

/// A loopguard plugin configuration (the Wasm filter's `configuration`).
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Configuration"))]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// The JSON Schema this document follows (ignored by the filter; lets
    /// editors validate it).
    #[serde(rename = "$schema")]
    pub schema: Option<String>,
    /// Entries in the fingerprint table, 1..4194304 (rounded up to a
    /// multiple of 4). Default 65536.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 4_194_304)))]
    pub max_tracked_fingerprints: Option<Int>,
    /// Largest request body fingerprinted, 1..67108864 bytes; larger bodies
    /// pass unchecked and are counted. Default 1048576.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 67_108_864)))]
    pub max_body_bytes: Option<Int>,
    /// `true` puts every policy in shadow mode.
    pub shadow: Option<bool>,
    /// The jwt_authn `payload_in_metadata` key that `jwt_verified:` limit
    /// keys read. Default `jwt_payload`.
    pub jwt_payload_in_metadata: Option<String>,
    /// Where detections are sent.
    pub alerts: Option<Obj<RawAlerts>>,
    /// `true`: routes may name their policy in
    /// `filter_metadata.loopguard.policy`.
    pub route_metadata: Option<bool>,
    /// What is published as filter state `wasm.loopguard` for access logs.
    /// Default `actions`.
    pub access_log: Option<AccessLogName>,
    /// Where counts live. Default `{"type": "local"}`.
    pub store: Option<Obj<RawStore>>,
    /// `true`: hold request headers until the body is judged; the Wasm
    /// filter's `allow_on_headers_stop_iteration` must be `true` too.
    pub hold_request_headers: Option<bool>,
    /// US dollars per million tokens, per model (the request's `model`; a
    /// dated name such as `gpt-4o-2024-08-06` takes the price of
    /// `gpt-4o`): responses' token counts become dollars in metrics and
    /// events. At most 64 models.
    pub prices: Option<std::collections::BTreeMap<String, Obj<RawPrice>>>,
    /// At most 256. The first policy whose selector matches applies.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub policies: Option<Vec<Obj<RawPolicy>>>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Policy"))]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    /// Unique, `[A-Za-z0-9_-]{1,64}`; appears in headers, metrics and logs.
    #[cfg_attr(
        feature = "schema",
        schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))
    )]
    #[cfg_attr(feature = "schema", schemars(required))]
    pub id: Option<String>,
    #[cfg_attr(feature = "schema", schemars(required))]
    pub spec: Option<Obj<RawSpec>>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "PolicySpec"))]
#[serde(deny_unknown_fields)]
pub struct RawSpec {
    /// `shadow`: count and log, enforce nothing. Default `enforce`.
    pub mode: Option<ModeName>,
    /// Which requests the policy claims; `{}` matches every request.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub selector: Option<Obj<RawSelector>>,
    /// Who the caller is, up to 16: `header:<name>`, `query:<name>`,
    /// `jwt:<claim>` (unverified), `jwt_verified:<claim>`, `ip:address`.
    /// None: the SHA-256 of the API key.
    pub limit_keys: Option<Vec<String>>,
    /// Up to 32 limit-key matches whose requests are never counted.
    pub exempt: Option<Vec<Obj<RawExempt>>>,
    /// Counting identical requests over a sliding window.
    pub loop_detection: Option<Obj<RawDetection>>,
    /// Tool-call loops read from the conversation.
    pub tool_loops: Option<Obj<RawToolLoops>>,
    /// Loops in MCP `tools/call` traffic (JSON-RPC over streamable HTTP),
    /// judged from each call and its result. A policy with `mcp` has
    /// neither `loop_detection` nor `tool_loops`.
    pub mcp: Option<Obj<RawMcp>>,
    /// Volatile-token masking for `llm_tail`, `near` and `tool_loops`
    /// (timestamps, ids, numbers in tool results replaced by placeholders
    /// before comparing). Default: every class, tool-call arguments
    /// unmasked.
    pub volatile: Option<Obj<RawVolatile>>,
    /// Spend caps: tokens, dollars or model calls per caller, session or
    /// conversation over a sliding window, read from the responses.
    pub budget: Option<Obj<RawBudget>>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Volatile"))]
#[serde(deny_unknown_fields)]
pub struct RawVolatile {
    /// `false` compares text as it is. Default `true`.
    pub enabled: Option<bool>,
    /// The classes masked. Default: all but `tool_result_numbers`.
    pub classes: Option<Vec<VolatileClassName>>,
    /// Also mask tool-call arguments (every class but numbers). Default
    /// `false`: ids in arguments usually name different resources.
    pub tool_arguments: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "VolatileClass"))]
#[serde(rename_all = "snake_case")]
pub enum VolatileClassName {
    Uuid,
    Datetime,
    Epoch,
    Hex,
    PrefixedId,
    NoiseNumbers,
    ToolResultNumbers,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Selector"))]
#[serde(deny_unknown_fields)]
pub struct RawSelector {
    /// The request path, query string excluded, equals this.
    #[serde(rename = "pathExact")]
    pub path_exact: Option<String>,
    /// Segment-aware prefix: `/v1/` matches `/v1/x`; `/v1` matches `/v1` and
    /// `/v1/x` but not `/v10`.
    #[serde(rename = "pathPrefix")]
    pub path_prefix: Option<String>,
    /// HTTP methods, case-insensitive.
    pub methods: Option<Vec<String>>,
    /// Host names, case-insensitive, port ignored; `*.example.com` for
    /// subdomains.
    pub hosts: Option<Vec<String>>,
    /// Envoy route names (`xds.route_name`), up to 256.
    pub routes: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Exemption"))]
#[serde(deny_unknown_fields)]
pub struct RawExempt {
    /// A limit key, written as in `limit_keys`.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub key: Option<String>,
    /// `true` matches requests that have the key, `false` those without.
    pub present: Option<bool>,
    /// Matches requests whose key has one of these values.
    pub values: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "LoopDetection"))]
#[serde(deny_unknown_fields)]
pub struct RawDetection {
    /// `false` switches the policy off (it still claims its requests).
    #[cfg_attr(feature = "schema", schemars(required))]
    pub enabled: Option<bool>,
    /// The sliding window, 1..86400 seconds.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400)))]
    pub window_seconds: Option<Int>,
    /// The Nth identical request in the window triggers the action: 2..1024,
    /// or 0 to switch the policy off.
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 1024)))]
    pub threshold_identical_requests: Option<Int>,
    /// What happens from the threshold on. Default `reject`.
    pub action: Option<ActionName>,
    /// A ladder of actions, replacing `action` and the threshold: `at` is
    /// strictly increasing, 2..1024.
    pub escalation: Option<Vec<Obj<RawStep>>>,
    /// Throttle delay per identical request, 1..60000 ms. Default 100.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 60_000)))]
    pub throttle_step_ms: Option<Int>,
    /// Throttle delay cap, at most 60000 ms. Default 10000.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 60_000)))]
    pub throttle_max_delay_ms: Option<Int>,
    /// Keep rejecting this long after the first reject, 0..86400 seconds.
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 86_400)))]
    pub cooldown_seconds: Option<Int>,
    /// What makes two requests identical. Default `exact`.
    pub similarity: Option<SimilarityName>,
    /// `llm_tail` and `near`: messages in the fingerprint, 1..64.
    /// Default 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 64)))]
    pub tail_messages: Option<Int>,
    /// `near`: two requests are near-identical when their tails share at
    /// least this fraction of their words (estimated Jaccard similarity),
    /// above 0 and at most 1. Default 0.35.
    #[cfg_attr(feature = "schema", schemars(range(min = 0.001, max = 1)))]
    pub near_similarity: Option<Fraction>,
    /// `near`: recent hits kept per caller and model, 1..1024 (at least
    /// the ladder's last step). Default 64.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 1024)))]
    pub near_history: Option<Int>,
    /// Attempts the provider failed (a 5xx or 429 answer) that are not
    /// counted, per fingerprint and window, so an SDK retrying them is not
    /// a loop; 0..16. Default 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 16)))]
    pub forgive_failed_attempts: Option<Int>,
    /// `session`: the header carrying the session id. Default
    /// `x-session-id`.
    pub session_header: Option<String>,
    /// `session`: the threshold for requests without a session id, up to
    /// 1024. Default 5 x the threshold.
    #[cfg_attr(feature = "schema", schemars(range(min = 2, max = 1024)))]
    pub fallback_threshold: Option<Int>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "EscalationStep"))]
#[serde(deny_unknown_fields)]
pub struct RawStep {
    /// From this many identical requests in the window on, 2..1024.
    #[cfg_attr(feature = "schema", schemars(range(min = 2, max = 1024)))]
    #[cfg_attr(feature = "schema", schemars(required))]
    pub at: Option<Int>,
    #[cfg_attr(feature = "schema", schemars(required))]
    pub action: Option<ActionName>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "ToolLoops"))]
#[serde(deny_unknown_fields)]
pub struct RawToolLoops {
    /// `false` switches tool-loop detection off.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub enabled: Option<bool>,
    /// Recent tool calls examined, 1..64. Default 6.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 64)))]
    pub last_calls: Option<Int>,
    /// The same tool and arguments at least this often, 2..last_calls.
    /// Default 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 2, max = 64)))]
    pub identical_min: Option<Int>,
    /// The same tool with differing arguments at least this often,
    /// 2..last_calls. Default 4.
    #[cfg_attr(feature = "schema", schemars(range(min = 2, max = 64)))]
    pub pattern_min: Option<Int>,
    /// Tools never counted (polling, for example).
    pub exempt_tools: Option<Vec<String>>,
    /// Any subsequence of nudge, directive, reject, in that order.
    pub ladder: Option<Vec<ToolStepName>>,
    /// A directive also sets `tool_choice` to none.
    pub directive_disables_tools: Option<bool>,
    /// Cycle thrash: the same sequence of 2 or 3 calls repeated at least
    /// this often at the end of the history, 2..16, or 0 for none. Default
    /// 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 16)))]
    pub cycle_min: Option<Int>,
    /// Answer loops: the model's text answer repeated (rephrased) this many
    /// turns in a row, 2..16, or 0 for none. Default 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 16)))]
    pub answer_min: Option<Int>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Store"))]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    /// `local`: Envoy shared data. `redis_webdis`: Redis through webdis.
    #[serde(rename = "type")]
    pub kind: Option<StoreName>,
    /// `redis_webdis`: what webdis talks to. `single`: one Redis node, the
    /// library loaded as a Redis Function (`FCALL`). `cluster`: a Redis
    /// Cluster through Envoy's `redis_proxy` (`EVALSHA`, then `EVAL` on
    /// `NOSCRIPT`). Default `single`.
    pub topology: Option<TopologyName>,
    /// `redis_webdis`: the Envoy cluster of webdis (required).
    pub cluster: Option<String>,
    /// `redis_webdis`: `:authority` of the calls. Default `webdis`.
    pub authority: Option<String>,
    /// `redis_webdis`: webdis's path. Default `/`.
    pub path: Option<String>,
    /// `redis_webdis`: no request waits longer than this, 1..5000 ms.
    /// Default 25.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 5_000)))]
    pub timeout_ms: Option<Int>,
    /// `redis_webdis`: when a call fails, count locally or let the request
    /// pass. Default `local`.
    pub on_error: Option<OnErrorName>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Alerts"))]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    /// Signed `loop.detected` alerts POSTed through an Envoy cluster.
    pub webhook: Option<Obj<RawWebhook>>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Webhook"))]
#[serde(deny_unknown_fields)]
pub struct RawWebhook {
    /// The Envoy cluster of the receiver (required).
    #[cfg_attr(feature = "schema", schemars(required))]
    pub cluster: Option<String>,
    /// `:authority` of the calls (required).
    #[cfg_attr(feature = "schema", schemars(required))]
    pub authority: Option<String>,
    /// Default `/`.
    pub path: Option<String>,
    /// 1..60000 ms. Default 2000.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 60_000)))]
    pub timeout_ms: Option<Int>,
    /// The VM environment variable holding the HMAC secret.
    pub hmac_secret_env: Option<String>,
}

/// One model's prices, in US dollars per million tokens.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Price"))]
#[serde(deny_unknown_fields)]
pub struct RawPrice {
    /// Input (prompt) tokens (required).
    #[cfg_attr(feature = "schema", schemars(required, with = "f64"))]
    pub input_per_million: Option<serde_json::Value>,
    /// Output (completion) tokens, reasoning included (required).
    #[cfg_attr(feature = "schema", schemars(required, with = "f64"))]
    pub output_per_million: Option<serde_json::Value>,
    /// Input tokens read from the provider's prompt cache. Default: the
    /// input price.
    #[cfg_attr(feature = "schema", schemars(with = "Option<f64>"))]
    pub cached_input_per_million: Option<serde_json::Value>,
    /// Input tokens written to the provider's prompt cache (Anthropic's
    /// cache writes). Default: the input price.
    #[cfg_attr(feature = "schema", schemars(with = "Option<f64>"))]
    pub cache_write_per_million: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Mode"))]
#[serde(rename_all = "snake_case")]
pub enum ModeName {
    Enforce,
    Shadow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Action"))]
#[serde(rename_all = "snake_case")]
pub enum ActionName {
    Reject,
    Throttle,
    Warn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Similarity"))]
#[serde(rename_all = "snake_case")]
pub enum SimilarityName {
    Exact,
    LlmTail,
    Near,
    Session,
}

impl SimilarityName {
    /// Compares a conversation's tail (masking and `tail_messages` apply).
    pub fn reads_tail(self) -> bool {
        matches!(self, SimilarityName::LlmTail | SimilarityName::Near)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "AccessLog"))]
#[serde(rename_all = "snake_case")]
pub enum AccessLogName {
    Actions,
    All,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "StoreType"))]
#[serde(rename_all = "snake_case")]
pub enum StoreName {
    Local,
    RedisWebdis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "OnStoreError"))]
#[serde(rename_all = "snake_case")]
pub enum OnErrorName {
    Local,
    Allow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "RedisTopology"))]
#[serde(rename_all = "snake_case")]
pub enum TopologyName {
    Single,
    Cluster,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Mcp"))]
#[serde(deny_unknown_fields)]
pub struct RawMcp {
    /// `false` switches MCP loop detection off.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub enabled: Option<bool>,
    /// The same call with the same result this many times (this call
    /// included) reaches the ladder's first step, 2..16. Default 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 2, max = 16)))]
    pub same_result_min: Option<Int>,
    /// The same call failing the same way this many times, 2..16.
    /// Default 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 2, max = 16)))]
    pub same_error_min: Option<Int>,
    /// A cycle of 2 or 3 calls repeated this many times, 2..5, or 0 for
    /// none. Default 3.
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 5)))]
    pub cycle_min: Option<Int>,
    /// Tools never counted (polling, for example).
    pub exempt_tools: Option<Vec<String>>,
    /// Any subsequence of note, block, then error or reject. Default
    /// `["note", "block"]`.
    pub ladder: Option<Vec<McpStepName>>,
    /// The JSON-RPC error code of the `error` step, outside
    /// -32768..-32000. Default -31000.
    pub error_code: Option<i64>,
    /// `session`: the caller's `Mcp-Session-Id` history (the caller's
    /// own when the protocol has no session). `caller`: one history per
    /// caller (limit keys). Default `session`.
    pub key: Option<McpKeyName>,
    /// A history idle this long starts again, 1..86400. Default 600.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400)))]
    pub window_seconds: Option<Int>,
    /// A call answered by loopguard goes to the server again once this
    /// long has passed since the loop's last real result (a job that
    /// finished, a service back up), 1..86400. Default 60.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400)))]
    pub recheck_seconds: Option<Int>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "McpStep"))]
#[serde(rename_all = "snake_case")]
pub enum McpStepName {
    Note,
    Block,
    Error,
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "McpKey"))]
#[serde(rename_all = "snake_case")]
pub enum McpKeyName {
    Session,
    Caller,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "ToolStep"))]
#[serde(rename_all = "snake_case")]
pub enum ToolStepName {
    Nudge,
    Directive,
    Reject,
}

/// An object, and only an object: serde's derive would also read a
/// struct from a list of its fields in order, which a configuration never
/// means.
#[derive(Debug)]
pub struct Obj<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(V(PhantomData)).map(Obj)
    }
}

#[cfg(feature = "schema")]
impl<T: JsonSchema> JsonSchema for Obj<T> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        T::schema_name()
    }
    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        T::json_schema(g)
    }
    fn inline_schema() -> bool {
        T::inline_schema()
    }
}

/// A number meant as a whole number, as written. Any JSON value is read,
/// so the validation step can report a wrong one with the field's range:
/// control planes that carry the configuration in a protobuf `Struct`
/// (Istio's `pluginConfig`) pass every number through a double, so an
/// integral `5.0` is a whole number too.
#[derive(Debug, Clone, PartialEq)]
pub enum Int {
    Whole(u64),
    /// Integral but negative, or beyond 2^64.
    OutOfRange(String),
    Fraction(String),
    /// Not a number: the value as JSON.
    NotNumber(String),
}

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Int, E> {
                Ok(Int::Whole(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Int, E> {
                Ok(u64::try_from(n).map_or_else(|_| Int::NotNumber(n.to_string()), Int::Whole))
            }
            fn visit_f64<E: de::Error>(self, f: f64) -> Result<Int, E> {
                let shown = serde_json::Number::from_f64(f)
                    .map_or_else(|| f.to_string(), |n| n.to_string());
                Ok(if f < 0.0 {
                    Int::NotNumber(shown)
                } else if f.fract() != 0.0 || !f.is_finite() {
                    Int::Fraction(shown)
                } else if f >= 18_446_744_073_709_551_616.0 {
                    Int::OutOfRange(shown)
                } else {
                    Int::Whole(f as u64)
                })
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Int, E> {
                Ok(Int::NotNumber(serde_json::Value::from(s).to_string()))
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Int, E> {
                Ok(Int::NotNumber(b.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Int, E> {
                Ok(Int::NotNumber("null".to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Int, A::Error> {
                let v = serde_json::Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Int::NotNumber(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Int, A::Error> {
                let v = serde_json::Value::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(Int::NotNumber(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A number that may have a fraction (JSON numbers, integral or not);
/// what is not a number is kept as JSON so validation can show it.
#[derive(Debug, Clone, PartialEq)]
pub enum Fraction {
    Number(f64),
    NotNumber(String),
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(match v.as_f64() {
            Some(f) if v.is_number() => Fraction::Number(f),
            _ => Fraction::NotNumber(v.to_string()),
        })
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for Fraction {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Fraction".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "number"})
    }
    fn inline_schema() -> bool {
        true
    }
}

#[cfg(feature = "schema")]
impl JsonSchema for Int {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "WholeNumber".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // JSON Schema's integer is any number without a fractional part, so
        // 5.0 validates as it loads.
        schemars::json_schema!({"type": "integer"})
    }
    fn inline_schema() -> bool {
        true
    }
}
