//! `spec.budget` as written (see [`super`]).

use super::{Int, Obj};
use crate::config::budget::{BudgetAction, BudgetPer, TokensOf, Unpriced};
use serde::Deserialize;

#[cfg(feature = "schema")]
use schemars::JsonSchema;

/// Spend caps of a policy.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Budget"))]
#[serde(deny_unknown_fields)]
pub struct RawBudget {
    /// 1..8 caps, each per caller, session or conversation.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub limits: Option<Vec<Obj<RawBudgetLimit>>>,
    /// What happens at a cap: `reject` (a 429, default) or `warn` (a
    /// header and an event).
    pub action: Option<BudgetAction>,
    /// The fraction of a cap from which requests carry the
    /// `x-loopguard-budget` warning, 0 (off) to below 1. Default 0.8.
    #[cfg_attr(feature = "schema", schemars(with = "Option<f64>"))]
    pub warn_at: Option<serde_json::Value>,
    /// Where a request's session id is read, in order, up to 8:
    /// `header:<name>` or `body:<field>` (`body:<field>.<field>`).
    /// Default `["header:x-session-id"]`.
    pub session: Option<Vec<String>>,
    /// Where a request's end user is read (for `per: user`), in order, up
    /// to 8: `header:<name>`, `body:<field>` (`body:<field>.<field>`),
    /// `jwt:<claim>` (the bearer token's, unverified) or
    /// `jwt_verified:<claim>` (verified by Envoy's `jwt_authn`).
    /// Default `["body:user", "body:safety_identifier",
    /// "body:metadata.user_id"]`.
    pub user: Option<Vec<String>>,
    /// What a dollar cap charges for a model no price names: `max` (its
    /// provider's highest price; default), `reject` or `ignore`.
    pub unpriced: Option<Unpriced>,
    /// Budget keys tracked at once, 64..1048576. Default 8192.
    #[cfg_attr(feature = "schema", schemars(range(min = 64, max = 1_048_576)))]
    pub max_tracked_keys: Option<Int>,
}

/// One spend cap.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "BudgetLimit"))]
#[serde(deny_unknown_fields)]
pub struct RawBudgetLimit {
    /// `[a-z0-9_-]{1,32}`, unique in the policy: in metrics, headers and
    /// logs.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub name: Option<String>,
    /// Whose spending the cap counts: `caller`, `session`,
    /// `conversation` or `user`.
    #[cfg_attr(feature = "schema", schemars(required))]
    pub per: Option<BudgetPer>,
    /// The sliding window, 60..2678400 seconds (31 days).
    #[cfg_attr(
        feature = "schema",
        schemars(required, range(min = 60, max = 2_678_400))
    )]
    pub window_seconds: Option<Int>,
    /// A cap in US dollars (priced by `prices`), above 0 up to 1000000.
    #[cfg_attr(feature = "schema", schemars(with = "Option<f64>"))]
    pub usd: Option<serde_json::Value>,
    /// A cap in tokens, 1..10^12.
    pub tokens: Option<Int>,
    /// With `tokens`: which tokens count, `input`, `output` or `all`
    /// (default).
    pub tokens_of: Option<TokensOf>,
    /// A cap in model calls, 1..10^9.
    pub calls: Option<Int>,
}
