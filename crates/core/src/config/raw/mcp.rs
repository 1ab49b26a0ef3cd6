//! `spec.mcp` as written (see [`super`]).

use super::Int;
use crate::config::{McpKey, McpStep};
use serde::Deserialize;

#[cfg(feature = "schema")]
use schemars::JsonSchema;

#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "schema", derive(JsonSchema), schemars(rename = "Mcp"))]
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
    pub ladder: Option<Vec<McpStep>>,
    /// The JSON-RPC error code of the `error` step, outside
    /// -32768..-32000. Default -31000.
    pub error_code: Option<i64>,
    /// `session`: the caller's `Mcp-Session-Id` history (the caller's
    /// own when the protocol has no session). `caller`: one history per
    /// caller (limit keys). Default `session`.
    pub key: Option<McpKey>,
    /// A history idle this long starts again, 1..86400. Default 600.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400)))]
    pub window_seconds: Option<Int>,
    /// A call answered by loopguard goes to the server again once this
    /// long has passed since the loop's last real result (a job that
    /// finished, a service back up), 1..86400. Default 60.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 86_400)))]
    pub recheck_seconds: Option<Int>,
}
