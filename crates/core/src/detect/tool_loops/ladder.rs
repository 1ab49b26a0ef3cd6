//! The ladder: the step a loop's occurrences reach, the note a nudge or a
//! directive adds to the request, and the tool as headers, logs and 429s
//! show it.

use super::{Repeated, Tier, ToolVerdict};
use crate::config::{ToolLoops, ToolStep};
use crate::request::llm::Request;

/// The loop's step on the policy's ladder (one more per occurrence past
/// the tier's threshold, the last one staying).
pub(super) fn verdict(
    cfg: &ToolLoops,
    tier: Tier,
    tool: &str,
    arguments: Option<&str>,
    occurrences: u32,
) -> Option<ToolVerdict> {
    let threshold = match tier {
        Tier::Identical | Tier::Failing => cfg.identical_min,
        Tier::Pattern => cfg.pattern_min,
        Tier::Cycle => cfg.cycle_min,
        Tier::Answer => cfg.answer_min,
        Tier::Turn => cfg.turn_min,
    };
    let evidence = Repeated {
        tool: tool.to_string(),
        arguments: arguments.map(str::to_string),
    };
    ToolVerdict::climb(tier, occurrences, threshold, &cfg.ladder, evidence)
}

/// The note a nudge appends to the conversation.
pub fn nudge_text(v: &ToolVerdict) -> String {
    let (tool, n) = (&v.evidence.tool, v.occurrences);
    match v.tier {
        Tier::Identical | Tier::Failing => format!(
            "Note from the API gateway: you have called the tool `{tool}` {n} times with the same arguments in your recent steps, and repeating it will not give a different result. Try a different approach or a different tool."
        ),
        Tier::Pattern => format!(
            "Note from the API gateway: you have called the tool `{tool}` {n} times in your recent steps with varying arguments without making progress. Try a different approach or a different tool."
        ),
        Tier::Cycle => format!(
            "Note from the API gateway: you have repeated the same sequence of tool calls ({}) {n} times, with the same results each time. Try a different approach or a different tool.",
            cycle_names(tool)
        ),
        Tier::Answer => format!(
            "Note from the API gateway: your last {n} answers say essentially the same thing, and the conversation has not moved on. Do not repeat that answer: try a fundamentally different approach, or say plainly what you cannot do."
        ),
        Tier::Turn => format!(
            "Note from the API gateway: you have written the same reply and called `{tool}` the same way {n} times in a row, whatever it returned. Read what the last results say, then change your approach."
        ),
    }
}

/// The firmer message of a directive.
pub fn directive_text(v: &ToolVerdict) -> String {
    let (tool, n) = (&v.evidence.tool, v.occurrences);
    match v.tier {
        Tier::Answer => format!(
            "Instruction from the API gateway: stop repeating your answer. You have given essentially the same answer {n} times in a row without resolving the problem. Do not give it again. Take a different approach, ask the user a clarifying question, or explain what you cannot do."
        ),
        Tier::Turn => format!(
            "Instruction from the API gateway: stop repeating this step. You have written the same reply and called `{tool}` the same way {n} times in a row. Do not call it again this way. Say what you learned from its results, or take a different approach."
        ),
        Tier::Cycle => format!(
            "Instruction from the API gateway: stop repeating the tool calls {}. You have gone through them {n} times with the same results. Do not call them again in this order. Answer with the information you already have, or ask the user for what you need.",
            cycle_names(tool)
        ),
        Tier::Identical | Tier::Failing | Tier::Pattern => {
            let what = match &v.evidence.arguments {
                Some(args) => {
                    let shown: String = args.chars().take(200).collect();
                    let cut = args.chars().nth(200).map_or("", |_| "...");
                    format!("with the same arguments {shown}{cut}")
                }
                None => "with varying arguments".to_string(),
            };
            format!(
                "Instruction from the API gateway: stop calling the tool `{tool}`. You have called it {n} times {what} without progress. Do not call it again. Answer with the information you already have, or ask the user for what you need."
            )
        }
    }
}

/// The request body a nudge or directive forwards (`None` for a reject, or
/// when the body has no conversation to append to).
pub fn rewrite(cfg: &ToolLoops, req: &Request<'_>, v: &ToolVerdict) -> Option<Vec<u8>> {
    match v.step {
        ToolStep::Nudge => req.with_note(&nudge_text(v)),
        ToolStep::Directive if cfg.directive_disables_tools => {
            req.with_note_and_no_tools(&directive_text(v))
        }
        ToolStep::Directive => req.with_note(&directive_text(v)),
        ToolStep::Reject => None,
    }
}

/// A cycle's tools for a message: `a` → `b` → `c`.
fn cycle_names(joined: &str) -> String {
    joined
        .split('+')
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(" → ")
}

/// A tool name reduced to a safe token for headers and logs: at most 64 of
/// `[A-Za-z0-9_.-]`, anything else replaced by `_`.
pub fn safe_tool_name(name: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    let s: String = name
        .chars()
        .take(64)
        .map(|c| if safe(c) { c } else { '_' })
        .collect();
    if s.is_empty() {
        "_".to_string()
    } else {
        s
    }
}

/// The verdict's tool as headers, logs and 429s show it: a safe token (a
/// cycle's tools joined by `+`), or none for an answer loop.
pub fn shown_tool(v: &ToolVerdict) -> Option<String> {
    match v.tier {
        Tier::Answer => None,
        // Its tools are safe tokens already (see `cycle`).
        Tier::Cycle => Some(v.evidence.tool.clone()),
        _ => Some(safe_tool_name(&v.evidence.tool)),
    }
}

/// `x-loopguard-tool-loop: <tier>;tool=<name>;level=<n>` (a cycle's
/// tools joined by `+`; an answer loop names none).
pub fn header_value(v: &ToolVerdict) -> String {
    match shown_tool(v) {
        Some(tool) => format!("{};tool={};level={}", v.tier.as_str(), tool, v.level),
        None => format!("{};level={}", v.tier.as_str(), v.level),
    }
}
