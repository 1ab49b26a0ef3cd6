//! Tool-call loops read from the conversation: identical thrash (the same
//! tool with the same arguments again and again) and pattern thrash (the
//! same tool with variations), judged from the request alone, so the first
//! request that carries the evidence is enough and every replica agrees.

use super::config::{ToolLoops, ToolStep};
use super::llm::{Request, ToolHistory};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Identical,
    Pattern,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Identical => "identical",
            Tier::Pattern => "pattern",
        }
    }
}

/// A detected tool loop and the ladder step it has reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolVerdict {
    pub tier: Tier,
    pub tool: String,
    /// The repeated arguments (identical thrash).
    pub arguments: Option<String>,
    /// Calls of the tool (identical: with these arguments) among the
    /// examined ones.
    pub occurrences: u32,
    /// 1-based position on the ladder.
    pub level: u32,
    pub step: ToolStep,
}

/// Judge the conversation's tool calls. Exempt tools are dropped first,
/// then the last `last_calls` calls are examined. Identical thrash wins
/// over pattern thrash. The newest assistant turn must be part of the
/// repetition: an agent that has moved on is left alone.
pub fn judge(cfg: &ToolLoops, history: &ToolHistory) -> Option<ToolVerdict> {
    let newest = history.newest_turn?;
    let calls: Vec<_> = history
        .calls
        .iter()
        .filter(|c| !cfg.exempt_tools.iter().any(|t| **t == *c.name))
        .collect();
    let recent = calls.get(calls.len().saturating_sub(cfg.last_calls)..)?;

    // Identical thrash: the most repeated (tool, arguments) in the newest turn.
    let mut best: Option<(u32, &str, &str)> = None;
    for c in recent.iter().filter(|c| c.turn == newest) {
        let n = recent
            .iter()
            .filter(|o| o.name == c.name && o.arguments == c.arguments)
            .count() as u32;
        if n >= cfg.identical_min && best.is_none_or(|(m, _, _)| n > m) {
            best = Some((n, &c.name, &c.arguments));
        }
    }
    if let Some((n, name, args)) = best {
        return verdict(cfg, Tier::Identical, name, Some(args), n, cfg.identical_min);
    }

    // Pattern thrash: a tool of the newest turn called often, with
    // differing arguments.
    let mut best: Option<(u32, &str)> = None;
    for c in recent.iter().filter(|c| c.turn == newest) {
        let same_tool: Vec<_> = recent.iter().filter(|o| o.name == c.name).collect();
        let n = same_tool.len() as u32;
        let varied = same_tool.iter().any(|o| o.arguments != c.arguments);
        if varied && n >= cfg.pattern_min && best.is_none_or(|(m, _)| n > m) {
            best = Some((n, &c.name));
        }
    }
    let (n, name) = best?;
    verdict(cfg, Tier::Pattern, name, None, n, cfg.pattern_min)
}

/// step = occurrences - threshold + 1, capped at the ladder's last step.
fn verdict(
    cfg: &ToolLoops,
    tier: Tier,
    tool: &str,
    arguments: Option<&str>,
    occurrences: u32,
    threshold: u32,
) -> Option<ToolVerdict> {
    let last = cfg.ladder.len().checked_sub(1)?;
    let index = ((occurrences - threshold) as usize).min(last);
    let step = *cfg.ladder.get(index)?;
    Some(ToolVerdict {
        tier,
        tool: tool.to_string(),
        arguments: arguments.map(str::to_string),
        occurrences,
        level: index as u32 + 1,
        step,
    })
}

/// The note a nudge appends to the conversation.
pub fn nudge_text(v: &ToolVerdict) -> String {
    match v.tier {
        Tier::Identical => format!(
            "Note from the API gateway: you have called the tool `{}` {} times with the same arguments in your recent steps, and repeating it will not give a different result. Try a different approach or a different tool.",
            v.tool, v.occurrences
        ),
        Tier::Pattern => format!(
            "Note from the API gateway: you have called the tool `{}` {} times in your recent steps with varying arguments without making progress. Try a different approach or a different tool.",
            v.tool, v.occurrences
        ),
    }
}

/// The firmer message of a directive.
pub fn directive_text(v: &ToolVerdict) -> String {
    let what = match &v.arguments {
        Some(args) => {
            let shown: String = args.chars().take(200).collect();
            let cut = if args.chars().count() > 200 {
                "..."
            } else {
                ""
            };
            format!("with the same arguments {shown}{cut}")
        }
        None => "with varying arguments".to_string(),
    };
    format!(
        "Instruction from the API gateway: stop calling the tool `{}`. You have called it {} times {what} without progress. Do not call it again. Answer with the information you already have, or ask the user for what you need.",
        v.tool, v.occurrences
    )
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

/// A tool name reduced to a safe token for headers and logs: at most 64 of
/// `[A-Za-z0-9_.-]`, anything else replaced by `_`.
pub fn safe_tool_name(name: &str) -> String {
    let s: String = name
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "_".to_string()
    } else {
        s
    }
}

/// `x-loopguard-tool-loop: <tier>;tool=<name>;level=<n>`.
pub fn header_value(v: &ToolVerdict) -> String {
    format!(
        "{};tool={};level={}",
        v.tier.as_str(),
        safe_tool_name(&v.tool),
        v.level
    )
}

#[cfg(test)]
mod tests;
