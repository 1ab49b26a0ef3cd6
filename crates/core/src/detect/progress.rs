//! Whether the model's newest answer made progress over the one before
//! it. Revising a text turn by turn (an email, a query, release notes)
//! returns nearly the same answer every time, as a model stuck rephrasing
//! does; what tells them apart is what each answer does with the one
//! before it. An answer made progress when:
//! - it took up the user's message (shingles of the request new in the
//!   answer: "sign it from Maria", then "Maria" in the letter);
//! - it only removed text (a deletion asked for);
//! - it kept what the answer before it had introduced: edits accumulate,
//!   while a model stuck rephrasing drops its last wording for a new one.
//!
//! The answer tier of [`crate::detect::tool_loops`] stops a run of similar
//! answers at one that made progress; `near` mode does not count a request
//! whose newest answer made progress.

use crate::config::Classes;
use crate::detect::tool_loops::Results;
use crate::request::llm::volatile::{self, Context};
use crate::request::llm::{ResultAt, ToolHistory};

/// Answers shorter than this (normalised characters) are not compared: a
/// short reply ("done", "1000 eur is 1084.20 usd") repeats legitimately.
pub const ANSWER_MIN_CHARS: usize = 40;
/// Of an answer, only this much is compared.
pub const ANSWER_MAX_BYTES: usize = 8 << 10;

/// The text at `at` (an answer or a user's message), masked as the model's
/// text is, as sorted shingles; `None` if unreadable or shorter than `min`.
pub fn read(
    results: &impl Results,
    at: ResultAt,
    classes: Classes,
    min: usize,
) -> Option<Vec<u32>> {
    let mut raw = results.result_text(at)?;
    // Only the beginning is compared: cut it before masking.
    if raw.len() > ANSWER_MAX_BYTES {
        let mut cut = ANSWER_MAX_BYTES;
        while !raw.is_char_boundary(cut) {
            cut -= 1;
        }
        raw.truncate(cut);
    }
    let masked = volatile::mask(&raw, classes, Context::Text);
    shingles(&masked, min)
}

/// Whether `later` (answering the user's message `prompt`) made progress
/// over `earlier` (`before`: the answer before that, when there is one).
pub fn progressed(
    prompt: Option<&[u32]>,
    later: &[u32],
    earlier: &[u32],
    before: Option<&[u32]>,
) -> bool {
    let took_up_prompt = prompt.is_some_and(|p| new_in(p, later, earlier) >= PROMPT_TAKEN_UP);
    let deletion = only_removes(later, earlier);
    let accumulated = before.is_some_and(|b| keeps_what_was_introduced(later, earlier, b));
    took_up_prompt || deletion || accumulated
}

/// Whether the conversation's newest model turn is a text answer that made
/// progress over the text answer of the turn before it (both long enough
/// to compare). A request whose newest answer did is a new step of the
/// conversation, not a repeat.
pub fn newest_answer_progressed(
    history: &ToolHistory,
    results: &impl Results,
    classes: Classes,
) -> bool {
    let mut answers = history.turns.iter().rev().take(3);
    let (Some(newest), Some(previous)) = (answers.next(), answers.next()) else {
        return false;
    };
    if newest.calls > 0 || previous.calls > 0 {
        return false;
    }
    let read_answer = |t: &crate::request::llm::ModelTurn| {
        t.answer
            .and_then(|at| read(results, at, classes, ANSWER_MIN_CHARS))
    };
    let (Some(later), Some(earlier)) = (read_answer(newest), read_answer(previous)) else {
        return false;
    };
    let before = answers
        .next()
        .filter(|t| t.calls == 0)
        .and_then(read_answer);
    let prompt = newest.prompt.and_then(|at| read(results, at, classes, 4));
    progressed(prompt.as_deref(), &later, &earlier, before.as_deref())
}

/// Shingles of the user's message an answer must take up (have, when the
/// answer before it had not) to count as doing what was asked.
const PROMPT_TAKEN_UP: usize = 3;

/// Shingles of `of` in `into` and not in `not_in`.
fn new_in(of: &[u32], into: &[u32], not_in: &[u32]) -> usize {
    of.iter()
        .filter(|s| into.binary_search(s).is_ok() && not_in.binary_search(s).is_err())
        .count()
}

/// `later` only removed text from `earlier` (a handful of new shingles
/// where the cut joins the text, and a real cut).
fn only_removes(later: &[u32], earlier: &[u32]) -> bool {
    let added = later
        .iter()
        .filter(|s| earlier.binary_search(s).is_err())
        .count();
    let removed = earlier
        .iter()
        .filter(|s| later.binary_search(s).is_err())
        .count();
    added <= 3 && removed >= 8
}

/// What `earlier` introduced over `before` (at least a word's worth) is
/// still, almost all of it, in `later`: an edit kept, not a wording
/// replaced.
fn keeps_what_was_introduced(later: &[u32], earlier: &[u32], before: &[u32]) -> bool {
    let introduced: Vec<u32> = earlier
        .iter()
        .copied()
        .filter(|s| before.binary_search(s).is_err())
        .collect();
    if introduced.len() < 4 {
        return false;
    }
    let kept = introduced
        .iter()
        .filter(|s| later.binary_search(s).is_ok())
        .count();
    10 * kept >= 9 * introduced.len()
}

/// A text's distinct 4-byte shingles, sorted (`None` if it is shorter
/// than `min` bytes).
pub fn shingles(text: &str, min: usize) -> Option<Vec<u32>> {
    let b = text.as_bytes();
    let b = b.get(..b.len().min(ANSWER_MAX_BYTES)).unwrap_or(b);
    if b.len() < min.max(4) {
        return None;
    }
    let mut out: Vec<u32> = b
        .windows(4)
        .map(|w| w.iter().fold(0u32, |acc, &c| (acc << 8) | u32::from(c)))
        .collect();
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// At least half of the smaller set is in the other.
pub fn similar(a: &[u32], b: &[u32]) -> bool {
    let (mut i, mut j, mut common) = (0, 0, 0usize);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        match x.cmp(y) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                common += 1;
                i += 1;
                j += 1;
            }
        }
    }
    2 * common >= a.len().min(b.len())
}
