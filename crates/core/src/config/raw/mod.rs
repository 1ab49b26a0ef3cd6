//! The configuration as written: serde types with `deny_unknown_fields`,
//! read with the path of every value tracked. Everything is optional here,
//! so the validation step ([`super::validate`]) can say exactly what is
//! missing, out of range or inconsistent. The JSON Schema of the
//! configuration (`schema/loopguard.schema.json`, feature `schema`) is
//! generated from these types, so their doc comments are its descriptions.

use super::Action;
use serde::Deserialize;

mod budget;
mod mcp;
mod values;
pub use budget::*;
pub use mcp::*;
pub use values::*;

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
    pub access_log: Option<super::AccessLog>,
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
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Policy"))]
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
    pub mode: Option<super::Mode>,
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
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Volatile"))]
#[serde(deny_unknown_fields)]
pub struct RawVolatile {
    /// `false` compares text as it is. Default `true`.
    pub enabled: Option<bool>,
    /// The classes masked. Default: all but `tool_result_numbers`.
    pub classes: Option<Vec<super::volatile::Class>>,
    /// Also mask tool-call arguments (every class but numbers). Default
    /// `false`: ids in arguments usually name different resources.
    pub tool_arguments: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Selector"))]
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
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Exemption"))]
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
    pub action: Option<Action>,
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
    #[cfg_attr(feature = "schema", schemars(range(min = 2, max = 1024), required))]
    pub at: Option<Int>,
    #[cfg_attr(feature = "schema", schemars(required))]
    pub action: Option<Action>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "ToolLoops"))]
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
    pub ladder: Option<Vec<super::ToolStep>>,
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
    /// The same turn again: the model's reply written word for word as
    /// before (its reasoning, at least 40 characters) with the same calls,
    /// this many turns in a row whatever the calls returned, 2..32, or 0
    /// for none. Default 8.
    #[cfg_attr(feature = "schema", schemars(range(min = 0, max = 32)))]
    pub turn_min: Option<Int>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Store"))]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    /// `local`: Envoy shared data. `redis_webdis`: Redis through webdis.
    #[serde(rename = "type")]
    pub kind: Option<StoreName>,
    /// `redis_webdis`: what webdis talks to. `single`: one Redis node, the
    /// library loaded as a Redis Function (`FCALL`). `cluster`: a Redis
    /// Cluster through Envoy's `redis_proxy` (`EVALSHA`, then `EVAL` on
    /// `NOSCRIPT`). Default `single`.
    pub topology: Option<super::RedisTopology>,
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
    pub on_error: Option<super::OnStoreError>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Alerts"))]
#[serde(deny_unknown_fields)]
pub struct RawAlerts {
    /// Signed `loop.detected` alerts POSTed through an Envoy cluster.
    pub webhook: Option<Obj<RawWebhook>>,
}

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Webhook"))]
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
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Price"))]
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
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "StoreType"))]
#[serde(rename_all = "snake_case")]
pub enum StoreName {
    Local,
    RedisWebdis,
}

/// The schema of a unit enum the model declares and serde reads as
/// written: its names only, in order (the doc comments of the type and its
/// variants describe the model, not the configuration field).
#[cfg(feature = "schema")]
pub fn names_only(s: &mut schemars::Schema) {
    let items = s.remove("oneOf").unwrap_or_default();
    let names = items
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| match v.get("enum") {
            Some(serde_json::Value::Array(plain)) => plain.clone(),
            _ => v.get("const").cloned().into_iter().collect(),
        });
    *s = schemars::json_schema!({"type": "string", "enum": names.collect::<Vec<_>>()});
}
