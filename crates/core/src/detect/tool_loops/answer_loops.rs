//! Repeated answers: the model's text answers saying the same thing turn
//! after turn, and the user messages that brought something new (a
//! dialogue going on, not a loop).

use super::ladder::verdict;
use super::{Results, Tier, ToolVerdict};
use crate::config::{Classes, ToolLoops};
use crate::detect::progress::{self, Text};
pub(super) use crate::detect::similarity::NEWS_WORDS;
use crate::request::llm::{ResultAt, ToolHistory};
use std::rc::Rc;

/// The model's newest turn is a text answer and the answers before it
/// (consecutive turns without tool calls) say the same thing in other
/// words: at least half of the shorter one's 4-character shingles appear
/// in the newest (`answer_min` answers in a row, the newest included).
///
/// The run stops at an answer that made progress over the one before it
/// ([`progress::progressed`]): how revising a text turn by turn (nearly
/// the same answer every time, but each one doing what was asked) is told
/// from a loop; and at an answer to a user message that brought something
/// new ([`brought_news`]): a support dialogue whose user reports another
/// status each turn is going on, however alike the agent's replies are.
pub(super) fn answer<R: Results>(
    cfg: &ToolLoops,
    history: &ToolHistory,
    results: &R,
    texts: Option<&progress::TextCache>,
) -> Option<ToolVerdict> {
    if cfg.answer_min == 0 {
        return None;
    }
    let read = |at: ResultAt, min: usize| {
        progress::read_cached(texts, results, at, cfg.result_classes, min)
    };
    // The newest answers, newest first, as far as the ladder can need
    // (and one more, to see what the oldest of them introduced).
    let wanted = cfg.answer_min as usize + cfg.ladder.len() + 1;
    // (answer, the user's message it answered)
    let mut answers: Vec<(Rc<Text>, Option<Rc<Text>>)> = Vec::new();
    for t in history.turns.iter().rev().take(wanted) {
        if t.calls > 0 {
            break;
        }
        let Some(text) = t.answer.and_then(|at| read(at, progress::ANSWER_MIN_CHARS)) else {
            break;
        };
        // What the user wrote is never masked.
        let prompt = t
            .prompt
            .and_then(|at| progress::read_cached(texts, results, at, Classes::NONE, 4));
        answers.push((text, prompt));
    }
    let turn = |k: usize| {
        answers.get(k).map(|(answer, prompt)| progress::Turn {
            answer,
            prompt: prompt.as_deref(),
        })
    };
    let newest = turn(0)?;
    let mut occurrences = 1u32;
    for k in 1..answers.len() {
        let (Some(later), Some(earlier)) = (turn(k - 1), turn(k)) else {
            break;
        };
        // The later answer replied to a message that brought something
        // new (a status, an output, a detailed report): answering it alike
        // is a dialogue going on, not an answer repeated.
        if brought_news(later.prompt, earlier.prompt)
            || !progress::similar(newest.answer, earlier.answer)
            || progress::progressed(later, earlier, turn(k + 1))
        {
            break;
        }
        occurrences += 1;
    }
    if occurrences < cfg.answer_min {
        return None;
    }
    verdict(cfg, Tier::Answer, "", None, occurrences)
}

/// Whether the user's message `prompt` (what an answer replied to) brought
/// something new: a long message (a pasted output, a report of what the
/// user did) that is not the one before it again. A complaint ("still
/// broken", "you keep saying the same thing") brings nothing.
pub(super) fn brought_news(prompt: Option<&Text>, before: Option<&Text>) -> bool {
    prompt.is_some_and(|p| {
        p.text.split_whitespace().count() > NEWS_WORDS
            && !before.is_some_and(|b| progress::similar(p, b))
    })
}

/// Whether the user's message before model turn `turn` brought news (see
/// [`brought_news`]) over the user's message before it.
pub(super) fn news_before<R: Results>(
    history: &ToolHistory,
    results: &R,
    texts: Option<&progress::TextCache>,
    turn: usize,
) -> bool {
    let prompt_of = |t: usize| {
        history
            .turns
            .get(t)
            .and_then(|m| m.prompt)
            .and_then(|at| progress::read_cached(texts, results, at, Classes::NONE, 4))
    };
    prompt_of(turn).is_some_and(|p| {
        let before = (0..turn).rev().find_map(prompt_of);
        brought_news(Some(&p), before.as_deref())
    })
}
