//! Tool-call loops read from the conversation: identical thrash (the same
//! tool with the same arguments again and again), pattern thrash (the same
//! tool with variations) and cycles (the same two or three calls in turn),
//! judged from the request alone, so the first request that carries the
//! evidence is enough and every replica agrees.
//!
//! A repetition counts only while the tool keeps answering the same:
//! results are compared, so an agent that reruns its tests after an edit
//! (and sees fewer failures), pages through results or fetches one order
//! after another is making progress, not looping. Identical calls and
//! cycles compare results with the policy's volatile classes masked (a
//! latency or a timestamp is noise; a count, a percentage or a size that
//! changed is progress); pattern thrash, whose arguments differ, masks
//! only what changes at random on every call whatever is asked
//! (timestamps, random ids), never a number, so a result that changes with
//! its arguments (another amount, another date, another latency for
//! another window) is progress.
//!
//! This file holds the verdict, where results are read, and the judge;
//! `calls.rs` the calls as compared, `call_loops.rs` identical thrash,
//! pattern thrash and cycles, `answer_loops.rs` repeated answers, and
//! `ladder.rs` the ladder's steps and what each one says.

use crate::config::{ToolLoops, ToolStep};
use crate::detect::progress;
use crate::detect::verdict::Verdict;
use crate::request::llm::volatile::{self, Context};
use crate::request::llm::{ToolCall, ToolHistory};
use answer_loops::{answer, news_before};
use call_loops::{cycle, identical, pattern, same_turns};
use calls::Calls;
use std::cell::RefCell;
use std::collections::HashMap;

mod answer_loops;
mod call_loops;
mod calls;
mod ladder;

pub use crate::detect::results::Results;
pub use ladder::{directive_text, header_value, nudge_text, rewrite, safe_tool_name, shown_tool};

pub use crate::detect::verdict::Tier;

/// A detected tool loop and the ladder step it has reached.
pub type ToolVerdict = Verdict<ToolStep, Repeated>;

/// What a tool loop repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repeated {
    /// The tool (a cycle: its tools in order, joined by `+`).
    pub tool: String,
    /// The repeated arguments (identical thrash, the same turn).
    pub arguments: Option<String>,
}

/// Judge the conversation's tool calls. Exempt tools are dropped first.
/// The last `last_calls` calls are examined for identical and pattern
/// thrash, the end of the history for cycles. Identical thrash and cycles
/// win over pattern thrash; between the two the higher ladder level wins
/// (identical on a tie), so an alternating loop keeps climbing. The newest
/// assistant turn must be part of the repetition: an agent that has moved
/// on is left alone.
pub fn judge(
    cfg: &ToolLoops,
    history: &ToolHistory,
    results: &impl Results,
    texts: Option<&progress::TextCache>,
) -> Option<ToolVerdict> {
    let newest = history.newest_turn?;
    let calls: Vec<&ToolCall> = history
        .calls
        .iter()
        .filter(|c| !cfg.exempt_tools.iter().any(|t| **t == *c.name))
        .collect();
    let args = calls
        .iter()
        .map(|c| volatile::mask(&c.arguments, cfg.arguments_mask, Context::Arguments))
        .collect();
    let calls = Calls {
        calls,
        args,
        results,
        classes: cfg.result_classes,
        cache: RefCell::new(HashMap::new()),
        words: RefCell::new(HashMap::new()),
        lines: RefCell::new(HashMap::new()),
        links: RefCell::new(HashMap::new()),
        shown: RefCell::new(HashMap::new()),
        turns: &history.turns,
    };
    let n = calls.calls.len();
    let recent: Vec<usize> = (n.saturating_sub(cfg.last_calls)..n).collect();
    let repeated = [
        identical(cfg, &calls, &recent, newest, &|turn| {
            news_before(history, results, texts, turn)
        }),
        cycle(cfg, &calls, newest),
        answer(cfg, history, results, texts),
        same_turns(cfg, &calls, newest),
    ];
    repeated
        .into_iter()
        .flatten()
        .reduce(|best, v| if v.level > best.level { v } else { best })
        .or_else(|| pattern(cfg, &calls, &recent, newest))
}

/// Whether the model's newest turn calls tools and every one of them is
/// exempt (a polling step).
pub fn only_exempt_calls(cfg: &ToolLoops, history: &ToolHistory) -> bool {
    let Some(newest) = history.newest_turn else {
        return false;
    };
    let mut newest_calls = history.calls.iter().filter(|c| c.turn == newest).peekable();
    newest_calls.peek().is_some()
        && newest_calls.all(|c| cfg.exempt_tools.iter().any(|t| **t == *c.name))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod drift_tests;
#[cfg(test)]
mod news_tests;
#[cfg(test)]
mod trying_tests;
