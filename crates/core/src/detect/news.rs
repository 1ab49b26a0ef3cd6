//! What a repeated call's result adds. An agent that sends the same call
//! word for word may be getting new results (the next page, a log that
//! moved, a poll whose progress changed) or results that differ only by
//! what the repetition itself produces: the same block once more in a file
//! it keeps editing, a line count that grows with it, line numbers
//! shifted by it, a shell's own line counter.
//!
//! A result is read as lines, each without its line-number gutter (`74:`,
//! `    74\t`, `74→`), lower-cased and with the policy's volatile classes
//! masked. A later result of the same call **adds nothing** over the
//! results before it when each of its lines is
//! - a line of an earlier result (of this call or another: a page read
//!   again after scrolling back), or of the call's own arguments (an
//!   edit's block shown again), or
//! - a line of the result just before it with its numbers moved (a
//!   header, a count, an error line: rows of data that differ only in
//!   their numbers are other rows).
//!
//! Whether numbers that moved are the repetition's own effect is the
//! caller's to tell ([`Added::Nothing`]): they are when the repetition
//! writes content its results show again (an edit inserting its block once
//! more), not when a call only reports them (a batch job's progress, a
//! queue draining). A single line never seen before is news.

use crate::config::Classes;
use crate::detect::results::Results;
use crate::detect::similarity;
use crate::request::llm::volatile::{self, Context};
use crate::request::llm::ToolHistory;
use crate::request::Fnv;
use std::collections::{HashMap, HashSet};

/// A text as its lines: each line's digest as written (gutter aside) and
/// the digest of its shape (its numbers replaced).
#[derive(Debug, Default)]
pub struct Lines {
    exact: Vec<u64>,
    shapes: Vec<u64>,
    /// The lines long enough to tell content apart (see [`WRITTEN_BYTES`]).
    long: Vec<u64>,
}

/// A line of a call's arguments this long (trimmed), found again in its
/// result, is content the call wrote and its result shows.
const WRITTEN_BYTES: usize = 12;

/// Lines longer than this are compared by their first this many bytes.
const LINE_BYTES: usize = 4096;
/// Of a text, only this many lines are read (a result is seldom longer;
/// what follows them is not compared).
const MAX_LINES: usize = 4096;

impl Lines {
    /// `text`'s non-blank lines, masked for `classes` as tool results are.
    pub fn of(text: &str, classes: Classes) -> Lines {
        let mut out = Lines::default();
        for line in text.lines().take(MAX_LINES) {
            let line = without_gutter(line).trim_end();
            if line.trim_start().is_empty() {
                continue;
            }
            let line = without_shell_counter(cut(line, LINE_BYTES)).to_lowercase();
            let masked = volatile::mask(&line, classes, Context::ToolResult);
            let (exact, shape) = digests(&masked);
            if masked.trim().len() >= WRITTEN_BYTES {
                out.long.push(exact);
            }
            out.exact.push(exact);
            out.shapes.push(shape);
        }
        out
    }

    /// Whether a long line of `written` (a call's arguments) is a line of
    /// this result: the call wrote content and its result shows it.
    pub fn shows(&self, written: &Lines) -> bool {
        if written.long.is_empty() {
            return false;
        }
        let lines: HashSet<u64> = self.exact.iter().copied().collect();
        written.long.iter().any(|l| lines.contains(l))
    }

    pub(crate) fn len(&self) -> usize {
        self.exact.len()
    }

    /// The digests of its lines as written, for a set of lines seen.
    pub fn exact(&self) -> impl Iterator<Item = u64> + '_ {
        self.exact.iter().copied()
    }
}

/// How many calls before a result are read for what the agent has seen.
pub const SEEN_CALLS: usize = 64;

/// Whether the model's turn `back` turns ago (0: the newest) made the calls
/// of the turn before it again, word for word, and got results with words
/// the conversation's earlier results had not shown, many of them
/// ([`READ_ON_WORDS`], and a quarter of the results' words): an agent
/// reading on (scrolling a page, paging through results), not one repeating
/// itself. A machine-made word (a pod's suffix, a session token) or a
/// number is not counted: an error that names a fresh worker each time is
/// the same error.
pub fn read_on(
    history: &ToolHistory,
    results: &impl Results,
    classes: Classes,
    back: usize,
) -> bool {
    let kept = history.turns.len().saturating_sub(back);
    let (Some(newest), Some(before)) = (kept.checked_sub(1), kept.checked_sub(2)) else {
        return false;
    };
    let calls = &history.calls;
    let of = |t: usize| calls.iter().filter(move |c| c.turn == t);
    let again = of(newest).next().is_some()
        && of(newest).all(|c| of(before).any(|b| b.name == c.name && b.arguments == c.arguments));
    if !again {
        return false;
    }
    let mut now = HashSet::new();
    for text in of(newest).filter_map(|c| results.result_raw(c.result?)) {
        telling_words(&text, classes, &mut now);
    }
    if now.len() < READ_ON_WORDS {
        return false;
    }
    // What the agent had seen, newest first, as far as a budget of bytes
    // reaches (a long history of long results costs no more).
    let first = calls.iter().position(|c| c.turn == newest).unwrap_or(0);
    let before = calls
        .get(first.saturating_sub(SEEN_CALLS)..first)
        .unwrap_or_default();
    let mut seen = HashSet::new();
    let mut budget = SEEN_BYTES;
    for c in before.iter().rev() {
        if budget == 0 {
            break;
        }
        if let Some(text) = c.result.and_then(|at| results.result_raw(at)) {
            budget = budget.saturating_sub(text.len());
            telling_words(&text, classes, &mut seen);
        }
    }
    let new = now.iter().filter(|w| !seen.contains(*w)).count();
    new >= READ_ON_WORDS && 4 * new >= now.len()
}

/// Of each result, only this many bytes are read for its words.
const RESULT_BYTES: usize = 16 << 10;
/// Of the results before, at most this many bytes are read for the words
/// the agent had seen.
const SEEN_BYTES: usize = 256 << 10;

/// New words a repeated call's results must bring to be read as reading
/// on.
pub const READ_ON_WORDS: usize = 8;

/// The words of a result that tell its content (masked as tool results
/// are): four letters or more, or a pair of characters of a script written
/// without spaces; not a number, not a machine-made word.
fn telling_words(text: &str, classes: Classes, out: &mut HashSet<u64>) {
    let lower = cut(text, RESULT_BYTES).to_lowercase();
    let masked = volatile::mask(&lower, classes, Context::ToolResult);
    similarity::words(&masked, |w, _| {
        if !w.iter().all(u8::is_ascii_digit)
            && !similarity::looks_random(w)
            && similarity::telling(w)
        {
            out.insert(similarity::fnv1a(w));
        }
    });
}

/// What a later result added over the results before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// Nothing new: every line seen, or seen with its numbers moved; how
    /// many lines' numbers moved (0: the result shows only lines seen).
    Nothing(usize),
    /// A line never seen, even with other numbers.
    Something,
}

/// What `later` adds over `previous` (the result just before it) and the
/// lines in `seen` (the earlier results and the call's arguments).
/// A line not seen as written is a line before with its numbers moved
/// only where its shape is on as many lines in both results and on few
/// ([`FEW`]: a header, a count, an error line, each perhaps repeated in a
/// before-and-after view); rows of data that differ only in their numbers
/// are other rows (the next page of a listing), never the same rows moved.
pub fn added(later: &Lines, previous: &Lines, seen: &HashSet<u64>) -> Added {
    let before = shapes(previous);
    let now = shapes(later);
    let mut moved = 0;
    for (exact, shape) in later.exact.iter().zip(&later.shapes) {
        if seen.contains(exact) {
            continue;
        }
        match (before.get(shape), now.get(shape)) {
            (Some(b), Some(n)) if b == n && *b <= FEW => moved += 1,
            _ => return Added::Something,
        }
    }
    Added::Nothing(moved)
}

/// At most this many lines of one shape are read as lines moved.
const FEW: usize = 2;

/// How many lines of `lines` have each shape.
fn shapes(lines: &Lines) -> HashMap<u64, usize> {
    let mut shapes: HashMap<u64, usize> = HashMap::new();
    for shape in &lines.shapes {
        *shapes.entry(*shape).or_default() += 1;
    }
    shapes
}

/// A line's digest as written and the digest of its shape (every run of
/// digits one `#`).
fn digests(line: &str) -> (u64, u64) {
    let mut exact = Fnv::default();
    let mut shape = Fnv::default();
    let mut in_number = false;
    for &b in line.as_bytes() {
        exact.write(&[b]);
        if b.is_ascii_digit() {
            in_number = true;
            continue;
        }
        if std::mem::take(&mut in_number) {
            shape.write(b"#");
        }
        shape.write(&[b]);
    }
    if in_number {
        shape.write(b"#");
    }
    (exact.0, shape.0)
}

/// The line without the number of a shell's own line counter, which
/// grows with every command a harness sends a long-lived shell
/// (`/bin/bash: line 342: cd..: command not found`).
fn without_shell_counter(line: &str) -> std::borrow::Cow<'_, str> {
    let Some((prefix, rest)) = line.split_once("sh: line ") else {
        return line.into();
    };
    let after = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    if after.len() == rest.len() || !after.starts_with(':') || prefix.contains(' ') {
        return line.into();
    }
    format!("{prefix}sh: line{after}").into()
}

/// The line without a line-number gutter: spaces, digits, then `:`, a
/// tab, `|` or `→` (a file viewer's numbering, which an insertion shifts).
fn without_gutter(line: &str) -> &str {
    let rest = line.trim_start_matches(' ');
    let after = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    if after.len() == rest.len() {
        return line;
    }
    [":", "\t", "|", "→"]
        .into_iter()
        .find_map(|mark| after.strip_prefix(mark))
        .unwrap_or(line)
}

/// At most `max` bytes of `s`, cut on a character boundary.
pub(crate) fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let end = (0..=max).rev().find(|&i| s.is_char_boundary(i));
    s.get(..end.unwrap_or(0)).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(t: &str) -> Lines {
        Lines::of(t, Classes::NONE)
    }

    fn seen(texts: &[&str]) -> HashSet<u64> {
        texts.iter().flat_map(|t| lines(t).exact).collect()
    }

    #[test]
    fn gutters_are_not_content() {
        assert_eq!(without_gutter("74:    return x"), "    return x");
        assert_eq!(without_gutter("    74\treturn x"), "return x");
        assert_eq!(without_gutter("  74→return x"), "return x");
        assert_eq!(without_gutter("12|a"), "a");
        // A number that is the line's content, not its gutter.
        assert_eq!(without_gutter("74 passed"), "74 passed");
        assert_eq!(without_gutter("x: 74"), "x: 74");
        // The same line at another place in the file is the same line.
        assert_eq!(
            lines("74:    return x").exact,
            lines("89:    return x").exact
        );
    }

    #[test]
    fn an_edit_shown_again_adds_nothing() {
        let block = "def total(self):\n    return round(sum(self.items), 2)";
        let before = "[File: cart.py (40 lines total)]\n10:def total(self):\n11:    return round(sum(self.items), 2)\n12:class Item:";
        let after = "[File: cart.py (42 lines total)]\n10:def total(self):\n11:    return round(sum(self.items), 2)\n12:def total(self):\n13:    return round(sum(self.items), 2)\n14:class Item:";
        // Only the count moved.
        assert_eq!(
            added(&lines(after), &lines(before), &seen(&[before, block])),
            Added::Nothing(1)
        );
        // A line never seen is news.
        let fixed = format!("{after}\n15:    price: Decimal");
        assert_eq!(
            added(&lines(&fixed), &lines(before), &seen(&[before, block])),
            Added::Something
        );
    }

    #[test]
    fn rows_that_differ_in_their_numbers_are_other_rows() {
        // The next page of a listing: every row of the same shape as a row
        // before, none the same row.
        let page = |from: usize| {
            (from..from + 5)
                .map(|i| format!("order {i}: shipped, {} items", i % 7))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let (a, b) = (page(1), page(6));
        assert_eq!(
            added(&lines(&b), &lines(&a), &seen(&[&a])),
            Added::Something
        );
        // A header and a footer whose numbers moved, the rows seen.
        let a = format!("showing 1-5 of 9\n{}\nmore: 4", page(1));
        let b = format!("showing 1-5 of 10\n{}\nmore: 5", page(1));
        assert_eq!(
            added(&lines(&b), &lines(&a), &seen(&[&a])),
            Added::Nothing(2)
        );
    }

    #[test]
    fn a_shells_own_line_counter_is_not_content() {
        assert_eq!(
            without_shell_counter("/bin/bash: line 342: cd..: command not found"),
            "/bin/bash: line: cd..: command not found"
        );
        assert_eq!(
            without_shell_counter("bash: line 7: x: unbound variable"),
            "bash: line: x: unbound variable"
        );
        // Not a shell's counter.
        assert_eq!(
            without_shell_counter("see bash: line 342: here"),
            "see bash: line 342: here"
        );
        assert_eq!(
            without_shell_counter("/bin/sh: line 12 is long"),
            "/bin/sh: line 12 is long"
        );
        assert_eq!(
            lines("/bin/bash: line 342: cd..: command not found").exact,
            lines("/bin/bash: line 357: cd..: command not found").exact
        );
    }

    #[test]
    fn long_numbers_and_lines_are_read_safely() {
        let huge = "9".repeat(60);
        let l = lines(&format!("{huge}\n{}", "x".repeat(10_000)));
        assert_eq!(l.exact.len(), 2);
        assert_ne!(l.shapes[0], l.shapes[1]);
        let wide = "é".repeat(LINE_BYTES);
        assert_eq!(lines(&wide).exact.len(), 1);
    }
}
