//! What an MCP client gets when loopguard acts on a looping `tools/call`,
//! in the protocol's own shapes, so the session goes on:
//!
//! - **note**: the server's real result with one more text block, telling
//!   the model the result is the same again (placed by the response
//!   reader, [`crate::response::mcp`]);
//! - **block**: HTTP 200 and a JSON-RPC `result` with the request's `id`,
//!   `isError: true` and a text block that says, in words, what was
//!   repeated and what to do instead (plus `resultType: "complete"`, which
//!   protocol 2026-07-28 requires on every result and older clients
//!   ignore);
//! - **error**: HTTP 200 and a JSON-RPC `error` (a code outside the range
//!   JSON-RPC reserves), which the client raises;
//! - **reject**: HTTP 429 with the same JSON-RPC error as its body.

use super::reply::{refuse, LocalReply, Refusal, Shape};
use crate::config::{Mcp, McpStep, StepName};
use crate::detect::mcp::{McpVerdict, Tier};
use crate::detect::tool_loops::safe_tool_name;
use serde_json::json;

/// The header a client's response carries when loopguard acted on an MCP
/// call: `tier=..; tool=..; count=..; step=..`.
pub const HEADER: &str = "x-loopguard-mcp-loop";

/// The verdict as [`HEADER`] shows it.
pub fn header_value(tool: &str, v: &McpVerdict) -> String {
    format!(
        "tier={}; tool={}; count={}; step={}",
        v.tier.as_str(),
        safe_tool_name(tool),
        v.occurrences,
        v.step.as_str()
    )
}

fn ordinal(n: u32) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// What was repeated, in words.
fn what(tool: &str, v: &McpVerdict) -> String {
    let (tool, n, period) = (safe_tool_name(tool), v.occurrences, v.evidence.period);
    let outcome = match v.tier {
        Tier::Cycle => return format!(
            "the same {period} calls (`{tool}` and {} other{}) have been repeated in turn, {n} rounds now, and each returned the same result every round",
            period.saturating_sub(1),
            if period > 2 { "s" } else { "" },
        ),
        Tier::Failing => "failed the same way",
        Tier::Identical | Tier::Pattern | Tier::Answer | Tier::Turn => "returned the same result",
    };
    format!(
        "this is the {} call in a row of the tool `{tool}` with these exact arguments, and the previous {} all {outcome}",
        ordinal(n),
        n.saturating_sub(1)
    )
}

/// What to do instead.
fn instead(v: &McpVerdict) -> &'static str {
    match v.tier {
        Tier::Identical | Tier::Pattern | Tier::Answer | Tier::Turn => "Calling it again will not change the result: use the result you already have, change the arguments, or take a different approach.",
        Tier::Failing => "Retrying will not fix it: read the error, change the arguments, or try a different tool or approach.",
        Tier::Cycle => "Going around again will not change anything: use the results you already have, or take a different approach.",
    }
}

/// The text of the note added to a real result.
pub fn note_text(cfg: &Mcp, tool: &str, v: &McpVerdict) -> String {
    let warning = match cfg.ladder.iter().find(|s| s.answers()) {
        Some(McpStep::Block) => " Further identical calls will be blocked.",
        Some(McpStep::Error | McpStep::Reject) => {
            " Further identical calls will be refused with an error."
        }
        _ => "",
    };
    let (what, instead) = (what(tool, v), instead(v));
    format!("[loopguard] Note: {what}. {instead}{warning}")
}

/// The reply for an answering step (`None` for a note, which forwards).
/// `id` is the request's JSON-RPC id as written.
pub fn reply(
    cfg: &Mcp,
    policy_id: &str,
    id: &str,
    tool: &str,
    v: &McpVerdict,
) -> Option<LocalReply> {
    // The id is echoed byte for byte (the reader checked it is a JSON
    // string or number): a large integer stays exact.
    let id = serde_json::value::RawValue::from_string(id.to_string()).ok()?;
    let (shape, status) = match v.step {
        McpStep::Note => return None,
        McpStep::Block => (Shape::McpResult(&id), 200),
        McpStep::Error => (Shape::McpError(&id, cfg.error_code), 200),
        McpStep::Reject => (Shape::McpError(&id, cfg.error_code), 429),
    };
    let refusal = Refusal {
        policy_id,
        status,
        // The text of a blocked call's result (or its error's message).
        message: format!(
            "[loopguard] This call was not run: {}. {}",
            what(tool, v),
            instead(v)
        ),
        details: json!({
            "policy": policy_id,
            "tier": v.tier.as_str(),
            "tool": safe_tool_name(tool),
            "occurrences": v.occurrences,
            "level": v.level,
            "step": v.step.as_str(),
        }),
        // The call goes to the server again this long after the loop's
        // last real result.
        retry_after_ms: (v.step == McpStep::Reject).then_some(cfg.recheck_ms),
        header: Some((HEADER, header_value(tool, v))),
    };
    Some(refuse(shape, refusal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Classes, McpKey};
    use crate::detect::mcp::Entry;
    use serde_json::Value;

    fn cfg(ladder: &[McpStep]) -> Mcp {
        Mcp {
            same_result_min: 3,
            same_error_min: 3,
            cycle_min: 3,
            exempt_tools: Vec::new(),
            ladder: ladder.to_vec(),
            error_code: -31_000,
            key: McpKey::Session,
            window_ms: 120_000,
            recheck_ms: 30_000,
            result_classes: Classes::defaults(),
            arguments_mask: Classes::NONE,
        }
    }

    fn verdict(tier: Tier, step: McpStep, n: u32) -> McpVerdict {
        McpVerdict {
            tier,
            occurrences: n,
            level: 2,
            step,
            evidence: crate::detect::mcp::Expected {
                period: if tier == Tier::Cycle { 2 } else { 1 },
                expected: Entry::default(),
            },
        }
    }

    #[test]
    fn a_blocked_call_is_a_tool_result_with_the_requests_id() {
        let c = cfg(&[McpStep::Note, McpStep::Block]);
        let v = verdict(Tier::Identical, McpStep::Block, 4);
        let r = reply(&c, "mcp", "\"req-7\"", "search", &v).unwrap();
        assert_eq!(r.status, 200);
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["id"], "req-7");
        assert_eq!(body["result"]["isError"], true);
        assert_eq!(body["result"]["resultType"], "complete");
        let text = body["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("4th call in a row of the tool `search`"),
            "{text}"
        );
        assert!(
            text.contains("previous 3 all returned the same result"),
            "{text}"
        );
        assert_eq!(body["result"]["_meta"]["loopguard"]["tier"], "identical");
        let numeric = reply(&c, "mcp", "12", "search", &v).unwrap();
        let body: Value = serde_json::from_str(&numeric.body).unwrap();
        assert_eq!(body["id"], 12);
        assert!(r.headers.contains(&(
            HEADER,
            "tier=identical; tool=search; count=4; step=block".to_string()
        )));
    }

    #[test]
    fn error_and_reject_carry_a_json_rpc_error() {
        let c = cfg(&[McpStep::Block, McpStep::Error]);
        let v = verdict(Tier::Failing, McpStep::Error, 5);
        let r = reply(&c, "p", "3", "fail", &v).unwrap();
        assert_eq!(r.status, 200);
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["error"]["code"], -31_000);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failed the same way"));
        let c = cfg(&[McpStep::Reject]);
        let v = verdict(Tier::Cycle, McpStep::Reject, 3);
        let r = reply(&c, "p", "3", "read", &v).unwrap();
        assert_eq!(r.status, 429);
        assert!(r.headers.contains(&("retry-after", "30".to_string())));
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("same 2 calls"));
        assert!(reply(
            &c,
            "p",
            "3",
            "read",
            &verdict(Tier::Cycle, McpStep::Note, 3)
        )
        .is_none());
    }

    #[test]
    fn a_note_says_what_comes_next() {
        let v = verdict(Tier::Identical, McpStep::Note, 3);
        let t = note_text(&cfg(&[McpStep::Note, McpStep::Block]), "search", &v);
        assert!(t.contains("3rd call in a row"), "{t}");
        assert!(
            t.ends_with("Further identical calls will be blocked."),
            "{t}"
        );
        let t = note_text(&cfg(&[McpStep::Note]), "search", &v);
        assert!(t.ends_with("take a different approach."), "{t}");
        assert_eq!(ordinal(11), "11th");
        assert_eq!(ordinal(22), "22nd");
    }
}
