//! Loops in MCP tool calls, judged from a caller's (or session's) recent
//! calls and what each got back. At the gateway a call and its result are
//! both seen, so a loop is told from progress directly:
//!
//! - **identical**: the same call (tool and canonical arguments) answered
//!   with the same result, time after time, nothing else in between;
//! - **failing**: the same call failing the same way (`isError`, or a
//!   JSON-RPC error);
//! - **cycle**: the same two or three calls in turn, each answered the
//!   same every round.
//!
//! The same call whose result changed is progress (polling a job, paging,
//! rerunning tests after an edit): its run starts again. A result that
//! could not be read is never a repeat. The verdict is made before the
//! call goes on: it predicts the result the loop keeps getting, which the
//! ladder's note is checked against when the real result passes.

use crate::config::{Mcp, McpStep};
use crate::detect::repetition;
use crate::detect::verdict::Verdict;

/// One call in a history, with what it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    /// The call's digest (tool and canonical arguments).
    pub call: u64,
    /// The digest of its whole result.
    pub result: u64,
    /// The digest of its result's `content` (what a note is checked
    /// against).
    pub content: u64,
    /// The result was an error (`isError`, or a JSON-RPC error).
    pub failed: bool,
    /// The result could not be read: never a repeat of anything.
    pub unread: bool,
    /// Answered by loopguard (the result is the one the loop kept
    /// getting).
    pub answered: bool,
}

impl Entry {
    /// The same call with the same result (both read).
    fn repeats(&self, other: &Entry) -> bool {
        !self.unread && !other.unread && self.call == other.call && self.result == other.result
    }
}

pub use crate::detect::verdict::Tier;

/// A loop the next call would continue.
pub type McpVerdict = Verdict<McpStep, Expected>;

/// What an MCP loop keeps getting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    /// Calls in a cycle's round (1 for identical and failing).
    pub period: u32,
    /// What the call got last time (the result the loop keeps getting).
    pub expected: Entry,
}

/// Judge `call` against `history` (oldest first, exempt tools left out).
pub fn judge(cfg: &Mcp, history: &[Entry], call: u64) -> Option<McpVerdict> {
    identical(cfg, history, call).or_else(|| cycle(cfg, history, call))
}

fn identical(cfg: &Mcp, history: &[Entry], call: u64) -> Option<McpVerdict> {
    let last = history.last().filter(|e| e.call == call && !e.unread)?;
    let n = history.len();
    let run = repetition::periodic_end(n, 1, |i, j| both(history, i, j, Entry::repeats));
    let occurrences = u32::try_from(run).unwrap_or(u32::MAX).saturating_add(1);
    let (tier, min) = if last.failed {
        (Tier::Failing, cfg.same_error_min)
    } else {
        (Tier::Identical, cfg.same_result_min)
    };
    verdict(cfg, tier, occurrences, min, 1, *last)
}

fn cycle(cfg: &Mcp, history: &[Entry], call: u64) -> Option<McpVerdict> {
    if cfg.cycle_min == 0 {
        return None;
    }
    let n = history.len();
    let same_call = |i, j| both(history, i, j, |a, b| a.call == b.call);
    for p in [2usize, 3] {
        let Some(first) = history.get(n.wrapping_sub(p)).filter(|e| e.call == call) else {
            continue;
        };
        // One call over and over is identical thrash, not a cycle; and a
        // round of three whose calls repeat with period 1 is neither.
        if repetition::one_call(n, p, same_call) {
            continue;
        }
        // The end where each call repeats the one a round before it, with
        // the same result: at least one call must have (a round seen once
        // is no evidence yet).
        let len = repetition::periodic_end(n, p, |i, j| both(history, i, j, Entry::repeats));
        if len == p {
            continue;
        }
        // Rounds of this call: that end, and this call.
        let occurrences = u32::try_from((len + p) / p).unwrap_or(u32::MAX);
        if let Some(v) = verdict(cfg, Tier::Cycle, occurrences, cfg.cycle_min, p, *first) {
            return Some(v);
        }
    }
    None
}

/// Whether entries `i` and `j` are both in `history` and `f` holds of them.
fn both(history: &[Entry], i: usize, j: usize, f: impl Fn(&Entry, &Entry) -> bool) -> bool {
    history
        .get(i)
        .zip(history.get(j))
        .is_some_and(|(a, b)| f(a, b))
}

fn verdict(
    cfg: &Mcp,
    tier: Tier,
    occurrences: u32,
    min: u32,
    period: usize,
    expected: Entry,
) -> Option<McpVerdict> {
    let evidence = Expected {
        period: u32::try_from(period).unwrap_or(3),
        expected,
    };
    McpVerdict::climb(tier, occurrences, min, &cfg.ladder, evidence)
}

/// Whether `tool` is never counted.
pub fn exempt(cfg: &Mcp, tool: &str) -> bool {
    cfg.exempt_tools.iter().any(|t| t == tool)
}

#[cfg(test)]
mod tests;
