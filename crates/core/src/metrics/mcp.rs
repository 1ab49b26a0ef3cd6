//! The MCP counters: defined by the host when first counted (their label
//! values are bounded: policy ids, tiers, steps, reasons).

use crate::config::{McpStep, StepName};
use crate::detect::mcp::Tier;

/// Why an MCP request or result was passed on without being judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpUnjudged {
    /// A body: a batch, malformed JSON-RPC, or headers that disagree with
    /// it ([`crate::request::mcp::Unjudged`]).
    Request(crate::request::mcp::Unjudged),
    /// The request's body is larger than `max_body_bytes` (also counted
    /// as a body skipped).
    TooLarge,
    /// The result could not be read (not JSON, too deep, too long, cut
    /// short, an HTTP error).
    ResultUnreadable,
    /// The history store failed (the call passed unjudged, or its result
    /// was not recorded).
    Store,
}

impl McpUnjudged {
    pub fn as_str(self) -> &'static str {
        match self {
            McpUnjudged::Request(u) => u.as_str(),
            McpUnjudged::TooLarge => "too_large",
            McpUnjudged::ResultUnreadable => "result_unreadable",
            McpUnjudged::Store => "store_error",
        }
    }
}

/// `tools/call` requests a policy judged.
pub fn calls(policy_id: &str) -> String {
    format!("loopguard.mcp_calls_total.policy.{policy_id}")
}

/// Calls of exempt tools (never judged).
pub fn exempt(policy_id: &str) -> String {
    format!("loopguard.mcp_exempt_total.policy.{policy_id}")
}

/// Loops acted on (`mcp_loops_total`: a note added, a call blocked, an
/// error or a 429), or with `shadow` what a shadow-mode policy would have
/// done (`mcp_shadow_total`).
pub fn loops(policy_id: &str, shadow: bool, tier: Tier, step: McpStep) -> String {
    let kind = if shadow { "shadow" } else { "loops" };
    let (tier, step) = (tier.as_str(), step.as_str());
    format!("loopguard.mcp_{kind}_total.policy.{policy_id}.tier.{tier}.step.{step}")
}

/// Requests and results passed on unjudged, by reason.
pub fn unjudged(policy_id: &str, why: McpUnjudged) -> String {
    let why = why.as_str();
    format!("loopguard.mcp_unjudged_total.policy.{policy_id}.reason.{why}")
}

/// Live histories pushed out of the local table's bounded region to make
/// room for another.
pub fn evicted(policy_id: &str) -> String {
    format!("loopguard.mcp_histories_evicted_total.policy.{policy_id}")
}
