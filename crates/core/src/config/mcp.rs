//! The `mcp` block of a policy: loops in MCP `tools/call` traffic, judged
//! at the gateway from each call and the result it got (see
//! [`crate::detect::mcp`]).

use super::Classes;

/// The JSON-RPC error code of the `error` step unless a policy sets one:
/// outside the range JSON-RPC reserves (-32768..-32000).
pub const DEFAULT_ERROR_CODE: i64 = -31_000;

/// MCP tool-call loop detection and the ladder it climbs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mcp {
    /// The same call answered with the same result this many times (this
    /// call included) reaches the ladder's first step.
    pub same_result_min: u32,
    /// The same call failing the same way (`isError`, or a JSON-RPC error)
    /// this many times reaches the first step.
    pub same_error_min: u32,
    /// A cycle of two or three calls (each with the same result every
    /// round) repeated this many times (0: not looked for).
    pub cycle_min: u32,
    /// Tools never counted (and never breaking a run of other calls).
    pub exempt_tools: Vec<String>,
    /// The escalation ladder, in order: step `k` applies from the
    /// threshold + `k` on.
    pub ladder: Vec<McpStep>,
    /// The code of the JSON-RPC error the `error` step answers.
    pub error_code: i64,
    /// Whose calls form one history.
    pub key: McpKey,
    /// A history idle this long starts again.
    pub window_ms: u64,
    /// An answering step lets the call through again once this long has
    /// passed since the history's last real result.
    pub recheck_ms: u64,
    /// Classes masked in tool results before they are compared.
    pub result_classes: Classes,
    /// Classes masked in tool arguments (none unless
    /// `volatile.tool_arguments`).
    pub arguments_mask: Classes,
}

/// One step of the MCP ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = super::raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum McpStep {
    /// Forward the call; when its result is the same again, add a note to
    /// it (a text block the model reads).
    Note,
    /// Answer the call with a tool result that says it was blocked and
    /// why (`isError: true`), without calling the server.
    Block,
    /// Answer a JSON-RPC error (the client raises it).
    Error,
    /// Answer HTTP 429.
    Reject,
}

impl super::StepName for McpStep {
    fn as_str(self) -> &'static str {
        match self {
            McpStep::Note => "note",
            McpStep::Block => "block",
            McpStep::Error => "error",
            McpStep::Reject => "reject",
        }
    }
}

impl McpStep {
    /// Whether the step answers instead of the server.
    pub fn answers(self) -> bool {
        self != McpStep::Note
    }
}

/// Whose calls form one history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = super::raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum McpKey {
    /// The caller (limit keys) and its `Mcp-Session-Id`, when the
    /// protocol version has one.
    Session,
    /// The caller alone, whatever session it opens (an agent that starts a
    /// new session for every call is still one history).
    Caller,
}

impl McpKey {
    pub fn as_str(self) -> &'static str {
        match self {
            McpKey::Session => "session",
            McpKey::Caller => "caller",
        }
    }
}
