//! The examined calls as the judge compares them: their arguments masked
//! once, their results read, masked and digested once, and what tells an
//! answer worth repeating (its words) or two calls' arguments barely apart.

use super::Results;
use crate::config::Classes;
use crate::detect::news::{self, Added, Lines, SEEN_CALLS};
use crate::request::llm::volatile::{self, Context};
use crate::request::llm::{ModelTurn, ToolCall};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::rc::Rc;

/// The classes pattern thrash masks in results: of the policy's, the
/// random ones that change on every call whatever is asked (no numbers: a
/// conversion of another amount answers another number, and a query of
/// another window another latency).
fn noise(classes: Classes) -> Classes {
    classes.iter().filter(|c| !c.is_numbers()).collect()
}

/// An answer with fewer words (markup aside) tells little on its own.
pub(super) const INFORMATIVE_WORDS: usize = 16;

/// Words with a letter or digit in them, markup (`<output>`, `</x>`) and
/// punctuation aside.
pub(super) fn word_count(text: &str) -> usize {
    text.split(|c: char| c.is_whitespace() || c == '<' || c == '>')
        .filter(|w| !w.is_empty() && !w.starts_with('/') && w.chars().any(char::is_alphanumeric))
        .filter(|w| !w.contains('=') || w.len() > 24)
        .count()
        .saturating_sub(markup_words(text))
}

/// Words that are only tag names (`<output>` read as `output`).
fn markup_words(text: &str) -> usize {
    let mut n = 0;
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        let after = rest.get(at + 1..).unwrap_or("");
        match after.find('>') {
            Some(end)
                if end <= 32 && !after.get(..end).unwrap_or("").contains(char::is_whitespace) =>
            {
                n += usize::from(!after.starts_with('/'));
                rest = after.get(end + 1..).unwrap_or("");
            }
            _ => rest = after,
        }
    }
    n
}

/// Whether two calls' arguments barely differ: the same numbers in the
/// same order, and at least half of their words shared (case and
/// punctuation aside): `usb c charger` and `USB-C chargers`, not another
/// date, amount or command.
pub(super) fn trivially_varied(a: &str, b: &str) -> bool {
    let numbers = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    if numbers(a) != numbers(b) {
        return false;
    }
    let words = |s: &str| -> std::collections::BTreeSet<String> {
        s.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty() && !w.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_lowercase)
            .collect()
    };
    let (wa, wb) = (words(a), words(b));
    let shared = wa.intersection(&wb).count();
    let all = wa.union(&wb).count();
    all == 0 || 2 * shared >= all
}

/// The texts in a call's arguments (canonical JSON), one line each, as
/// lines masked for `classes`: what an edit writes, shown again in its
/// result.
fn argument_lines(arguments: &str, classes: Classes) -> Lines {
    fn collect(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::String(s) => {
                out.push_str(s);
                out.push('\n');
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| collect(i, out)),
            serde_json::Value::Object(m) => m.values().for_each(|i| collect(i, out)),
            _ => {}
        }
    }
    let mut out = String::new();
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(v) => collect(&v, &mut out),
        Err(_) => out.push_str(arguments),
    }
    Lines::of(&out, classes)
}

/// What a call was answered, as compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    /// The request does not hold its result: no evidence of progress.
    Missing,
    /// The result could not be read: never counted as a repeat.
    Unreadable,
    /// A digest of the masked result.
    Digest(u64),
}

/// The examined calls, their arguments as compared (masked once, when the
/// policy opts in) and their results, each read and digested once.
pub(super) struct Calls<'h, 'r, R: Results> {
    pub(super) calls: Vec<&'h ToolCall>,
    pub(super) args: Vec<Cow<'h, str>>,
    pub(super) results: &'r R,
    /// The policy's masking classes.
    pub(super) classes: Classes,
    pub(super) cache: RefCell<HashMap<(usize, bool), Answered>>,
    /// Words in each call's answer, counted once.
    pub(super) words: RefCell<HashMap<usize, usize>>,
    /// Each call's result as lines (see `news.rs`), read once.
    pub(super) lines: RefCell<HashMap<usize, Option<Rc<Lines>>>>,
    /// How each call's result compares with its previous occurrence's.
    pub(super) links: RefCell<HashMap<usize, Link>>,
    /// Whether each call's result shows what its arguments wrote.
    pub(super) shown: RefCell<HashMap<usize, bool>>,
    /// The model's turns, where each one's text is (its reasoning, and for
    /// actions written as text the action too).
    pub(super) turns: &'h [ModelTurn],
}

/// A reply shorter than this (normalised) says too little to tell that a
/// model wrote the same thing again.
const REPLY_MIN_CHARS: usize = 40;

/// How a call's result compares with the result of the same call (tool
/// and arguments) made before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Link {
    /// No such earlier call, or a result that cannot be read.
    Unknown,
    /// The same result (masked), or none to compare.
    Same,
    /// Another result: what it added (see `news.rs`).
    Other(Added),
}

impl<R: Results> Calls<'_, '_, R> {
    pub(super) fn get(&self, i: usize) -> Option<&ToolCall> {
        self.calls.get(i).copied()
    }

    pub(super) fn arg(&self, i: usize) -> &str {
        self.args.get(i).map_or("", |a| a.as_ref())
    }

    /// Call `i`'s result (`full`: every class masked; else the noise
    /// classes, leaving alone the tokens its own arguments name).
    fn answered(&self, i: usize, full: bool) -> Answered {
        let Some(at) = self.get(i).and_then(|c| c.result) else {
            return Answered::Missing;
        };
        memo(&self.cache, (i, full), || {
            let Some(text) = self.results.result_text(at) else {
                return Answered::Unreadable;
            };
            // Noise classes only: the resource the call asked for, echoed
            // in its result, is what tells two answers apart: the tokens of
            // its arguments as written (even when the policy masks
            // arguments), read as a result is (epochs included: a
            // `"since": 1732370401` echoed back names the window).
            let raw = self.get(i).map_or("", |c| &*c.arguments);
            let (classes, named) = if full {
                (self.classes, Vec::new())
            } else {
                let classes = noise(self.classes);
                (classes, volatile::tokens(raw, classes, Context::ToolResult))
            };
            Answered::Digest(volatile::masked_digest(
                &text,
                classes,
                Context::ToolResult,
                &|t| named.iter().any(|n| n.eq_ignore_ascii_case(t)),
            ))
        })
    }

    /// Whether calls `i` and `j` got the same answer.
    pub(super) fn same(&self, i: usize, j: usize, full: bool) -> bool {
        match (self.answered(i, full), self.answered(j, full)) {
            (Answered::Unreadable, _) | (_, Answered::Unreadable) => false,
            (Answered::Missing, _) | (_, Answered::Missing) => true,
            (Answered::Digest(x), Answered::Digest(y)) => x == y,
        }
    }

    /// Whether call `i` is a repeat of an earlier call (the same tool and
    /// arguments, answered the same, or answered with nothing new): nothing
    /// new was tried.
    pub(super) fn repeats_earlier(&self, i: usize) -> bool {
        (0..i).any(|j| self.same_call(j, i) && self.same(j, i, true)) || self.repeats_previous(i)
    }

    /// The same call made last before call `j`.
    pub(super) fn previous(&self, j: usize) -> Option<usize> {
        self.previous_since(j, 0)
    }

    /// The same call made last before call `j`, at `first` or after.
    pub(super) fn previous_since(&self, j: usize, first: usize) -> Option<usize> {
        (first..j).rev().find(|&i| self.same_call(i, j))
    }

    /// Whether call `j`'s result repeats the result of the same call made
    /// before it: the same, or nothing new ([`crate::detect::news`]), any
    /// numbers that moved the repetition's own effect.
    pub(super) fn repeats_previous(&self, j: usize) -> bool {
        match self.link(j) {
            Link::Same => true,
            Link::Unknown | Link::Other(Added::Something) => false,
            Link::Other(Added::Nothing(moved)) => {
                // Numbers that moved, or lines gone, are the repetition's
                // own effect when the repetition writes content a result
                // shows again: an edit inserting its block once more (the
                // file's length grows, the view's offsets and the line
                // numbers of a test run's traceback after it move). A call
                // that only reports numbers (a batch job's progress, a
                // queue draining) or a list that shrinks (jobs finishing)
                // is making progress.
                if moved == 0 && !self.lost_lines(j) {
                    return true;
                }
                let from = self.previous(j).unwrap_or(j);
                (from + 1..=j).any(|i| self.shows_what_it_wrote(i))
            }
        }
    }

    /// Whether call `j`'s result differs from the same call's before only
    /// in numbers that are not the repetition's own effect: a batch job or
    /// a queue reporting its progress.
    pub(super) fn reports_progress(&self, j: usize) -> bool {
        matches!(self.link(j), Link::Other(Added::Nothing(moved)) if moved > 0)
            && !self.repeats_previous(j)
    }

    fn link(&self, j: usize) -> Link {
        memo(&self.links, j, || match self.previous(j) {
            None => Link::Unknown,
            Some(p) if self.same(p, j, true) => Link::Same,
            Some(p) => match (self.lines_of(j), self.lines_of(p)) {
                (Some(later), Some(before)) => {
                    // What the agent has seen: the results of the calls
                    // before this one (a page read again after scrolling
                    // back is not new), and what the call itself writes.
                    let mut seen: HashSet<u64> = HashSet::new();
                    for i in j.saturating_sub(SEEN_CALLS)..j {
                        if let Some(l) = self.lines_of(i) {
                            seen.extend(l.exact());
                        }
                    }
                    if let Some(c) = self.get(j) {
                        seen.extend(argument_lines(&c.arguments, self.classes).exact());
                    }
                    Link::Other(news::added(&later, &before, &seen))
                }
                _ => Link::Unknown,
            },
        })
    }

    /// Whether model turns `a` and `b` replied the same text, long enough
    /// to tell.
    pub(super) fn same_turn_reply(&self, a: usize, b: usize) -> bool {
        let text = |turn: usize| {
            let at = self.turns.get(turn)?.answer?;
            self.results
                .reply_words(at)
                .filter(|t| t.len() >= REPLY_MIN_CHARS)
        };
        matches!((text(a), text(b)), (Some(x), Some(y)) if x == y)
    }

    /// Whether call `j`'s result has fewer lines than the result of the
    /// same call before it.
    fn lost_lines(&self, j: usize) -> bool {
        let before = self.previous(j).and_then(|p| self.lines_of(p));
        matches!((self.lines_of(j), before), (Some(now), Some(before)) if now.len() < before.len())
    }

    /// Whether call `j`'s result shows a line its arguments wrote (read
    /// once per call).
    fn shows_what_it_wrote(&self, j: usize) -> bool {
        memo(&self.shown, j, || match (self.get(j), self.lines_of(j)) {
            (Some(c), Some(result)) => result.shows(&argument_lines(&c.arguments, self.classes)),
            _ => false,
        })
    }

    /// Call `i`'s result as lines, read once.
    fn lines_of(&self, i: usize) -> Option<Rc<Lines>> {
        memo(&self.lines, i, || {
            let at = self.get(i)?.result?;
            let text = self.results.result_raw(at)?;
            Some(Rc::new(Lines::of(&text, self.classes)))
        })
    }

    /// Whether call `i`'s answer tells something: at least
    /// [`INFORMATIVE_WORDS`] words once markup is set aside (not an empty
    /// output, an "ok", a "no results").
    pub(super) fn informative(&self, i: usize) -> bool {
        let Some(at) = self.get(i).and_then(|c| c.result) else {
            return false;
        };
        let n = memo(&self.words, i, || {
            self.results.result_text(at).map_or(0, |t| word_count(&t))
        });
        n >= INFORMATIVE_WORDS
    }

    /// The same tool, the same arguments.
    pub(super) fn same_call(&self, i: usize, j: usize) -> bool {
        self.get(i)
            .zip(self.get(j))
            .is_some_and(|(a, b)| a.name == b.name && self.arg(i) == self.arg(j))
    }
}

/// `map`'s value for `key`, made by `make` the first time it is asked for.
fn memo<K: Hash + Eq, V: Clone>(
    map: &RefCell<HashMap<K, V>>,
    key: K,
    make: impl FnOnce() -> V,
) -> V {
    if let Some(v) = map.borrow().get(&key) {
        return v.clone();
    }
    let v = make();
    map.borrow_mut().insert(key, v.clone());
    v
}
