//! One verdict for every guard that judges repetition (tool loops read
//! from a conversation, MCP calls): the tier of repetition found, how
//! often, the level and step it reached on the guard's ladder
//! ([`crate::config::ladder`]), and the guard's own evidence (the tool
//! and its arguments; the result an MCP loop keeps getting).

use crate::config::ladder;
pub use crate::config::StepName;

/// What kind of repetition a loop is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The same call, answered the same, again and again.
    Identical,
    /// The same call failing the same way (MCP).
    Failing,
    /// The same tool with varying arguments, answered the same.
    Pattern,
    /// The same two or three calls in turn.
    Cycle,
    /// The model's text answers repeat (rephrased), turn after turn.
    Answer,
    /// The same turn again and again: the reply written word for word
    /// with the same calls, whatever they returned.
    Turn,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Identical => "identical",
            Tier::Failing => "failing",
            Tier::Pattern => "pattern",
            Tier::Cycle => "cycle",
            Tier::Answer => "answer",
            Tier::Turn => "turn",
        }
    }
}

/// A loop and the step of its guard's ladder it has reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict<S, E> {
    pub tier: Tier,
    /// How many times the loop has gone round (calls of the tool, rounds
    /// of a cycle), this one included.
    pub occurrences: u32,
    /// 1-based position on the ladder.
    pub level: u32,
    pub step: S,
    /// What the guard found, as its acts need it.
    pub evidence: E,
}

impl<S: Copy, E> Verdict<S, E> {
    /// The verdict of a loop seen `occurrences` times, on a ladder of
    /// consecutive steps from `threshold` (`None`: below it).
    pub fn climb(
        tier: Tier,
        occurrences: u32,
        threshold: u32,
        steps: &[S],
        evidence: E,
    ) -> Option<Verdict<S, E>> {
        let (level, step) = ladder::consecutive(steps, threshold, occurrences)?;
        Some(Verdict {
            tier,
            occurrences,
            level,
            step,
            evidence,
        })
    }
}
