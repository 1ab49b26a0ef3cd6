//! Whether the model's newest answer made progress over the one before
//! it. Revising a text turn by turn (an email, a query, release notes)
//! returns nearly the same answer every time, as a model stuck rephrasing
//! does; what tells them apart is what each answer does with the one
//! before it. An answer made progress when:
//! - it took up the user's message (a word of the request new to the
//!   conversation, now in the answer: "sign it from Maria", then "Maria"
//!   in the letter);
//! - it only removed text (a deletion asked for);
//! - it kept what the answer before it had introduced: edits accumulate,
//!   while a model stuck rephrasing drops its last wording for a new one.
//!
//! The answer tier of [`crate::detect::tool_loops`] stops a run of similar
//! answers at one that made progress; in `near` mode a request whose newest
//! answer made progress repeats only word for word (a client resending it
//! is still a loop; the next edit is not a repeat of the last).

use crate::config::Classes;
use crate::detect::results::Results;
use crate::detect::similarity;
use crate::request::llm::volatile::{self, Context};
use crate::request::llm::{ResultAt, ToolHistory};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Answers shorter than this (normalised characters) are not compared: a
/// short reply ("done", "1000 eur is 1084.20 usd") repeats legitimately.
pub const ANSWER_MIN_CHARS: usize = 40;
/// Of an answer, only this much is compared.
pub const ANSWER_MAX_BYTES: usize = 8 << 10;

/// A text as compared: its distinct 4-byte shingles, its distinct words
/// (as hashes; see [`similarity::words`]), each sorted, and (of a user's
/// message) the phrases it quotes.
#[derive(Debug, Clone)]
pub struct Text {
    pub words: Vec<u64>,
    pub quoted: Vec<String>,
    /// The masked text itself, for finding quoted phrases in it.
    pub text: String,
    /// Its shingles, made when first asked for (most answers are judged
    /// by their words alone).
    shingles: std::cell::OnceCell<Vec<u32>>,
}

impl Text {
    /// Its distinct 4-byte shingles, sorted.
    pub fn shingles(&self) -> &[u32] {
        self.shingles.get_or_init(|| shingles(&self.text))
    }
}

/// Texts already read, keyed by their exact bytes in the body and how
/// they were read (looked up by CRC, confirmed by comparison). A
/// conversation's next request carries the same answers and messages
/// again: each is masked and split into words once per worker, not once
/// per request. Bounded: it starts over past [`TEXT_CACHE_BYTES`] (a
/// text's bytes counted four times over, for what is made of it).
#[derive(Debug, Default)]
pub struct TextCache(RefCell<Texts>);

#[derive(Debug, Default)]
struct Texts {
    entries: HashMap<u32, Vec<CachedText>>,
    bytes: usize,
}

#[derive(Debug)]
struct CachedText {
    raw: Vec<u8>,
    classes: Classes,
    min: usize,
    text: Rc<Text>,
}

const TEXT_CACHE_BYTES: usize = 2 << 20;
/// Texts longer than this in the body are read without the cache.
const MAX_CACHED_TEXT: usize = 64 << 10;

impl TextCache {
    fn get(&self, raw: &[u8], classes: Classes, min: usize) -> Option<Rc<Text>> {
        let texts = self.0.borrow();
        texts
            .entries
            .get(&crc32fast::hash(raw))?
            .iter()
            .find(|c| c.classes == classes && c.min == min && c.raw.as_slice() == raw)
            .map(|c| c.text.clone())
    }

    fn put(&self, raw: &[u8], classes: Classes, min: usize, text: Rc<Text>) {
        let mut texts = self.0.borrow_mut();
        let cost = raw.len().saturating_mul(4);
        if texts.bytes + cost > TEXT_CACHE_BYTES {
            texts.entries.clear();
            texts.bytes = 0;
        }
        texts.bytes += cost;
        texts
            .entries
            .entry(crc32fast::hash(raw))
            .or_default()
            .push(CachedText {
                raw: raw.to_vec(),
                classes,
                min,
                text,
            });
    }
}

/// [`read`], through `cache` when there is one.
pub fn read_cached(
    cache: Option<&TextCache>,
    results: &impl Results,
    at: ResultAt,
    classes: Classes,
    min: usize,
) -> Option<Rc<Text>> {
    let raw = results
        .result_bytes(at)
        .filter(|b| b.len() <= MAX_CACHED_TEXT);
    let key = cache.zip(raw);
    if let Some(text) = key.and_then(|(cache, raw)| cache.get(raw, classes, min)) {
        return results.afford_result(at).then_some(text);
    }
    let text = read(results, at, classes, min).map(Rc::new);
    // Only a text read is kept: `None` is a short text (cheap to read
    // again) or the request's parsing budget running out (not the text's
    // doing).
    if let (Some((cache, raw)), Some(t)) = (key, &text) {
        cache.put(raw, classes, min, t.clone());
    }
    text
}

/// The text at `at` (an answer or a user's message), masked as the model's
/// text is; `None` if unreadable or shorter than `min`.
pub fn read(results: &impl Results, at: ResultAt, classes: Classes, min: usize) -> Option<Text> {
    let mut raw = results.result_text(at)?;
    // Only the beginning is compared: cut it before masking.
    raw.truncate(crate::detect::news::cut(&raw, ANSWER_MAX_BYTES).len());
    let masked = volatile::mask(&raw, classes, Context::Text);
    // Words that say something: four letters or more, a number, a pair of
    // characters of a script written without spaces ("no", "em", "de"
    // would match by chance).
    let mut words = Vec::new();
    similarity::words(&masked, |w, _| {
        if w.iter().any(u8::is_ascii_digit) || similarity::telling(w) {
            words.push(similarity::fnv1a(w));
        }
    });
    words.sort_unstable();
    words.dedup();
    if masked.len() < min.max(4) {
        return None;
    }
    let quoted = similarity::quoted(&masked);
    Some(Text {
        words,
        quoted,
        text: masked.into_owned(),
        shingles: Default::default(),
    })
}

/// One turn as compared: the model's answer, and the user's message it
/// answered (when one came since the turn before).
#[derive(Debug, Clone, Copy)]
pub struct Turn<'a> {
    pub answer: &'a Text,
    pub prompt: Option<&'a Text>,
}

/// Whether `later` made progress over `earlier` (`before`: the turn before
/// that, when there is one). Taking up the user's message counts for a
/// phrase the message quotes, now in the answer, and for what is new to
/// the conversation: a word (or number) of the message that
/// the answer now holds and that neither the earlier turns' answers nor
/// their messages held. A user pushing back repeats what was said ("still
/// the same ModuleNotFoundError", "still crashing with 137"), and an answer
/// that echoes it has done nothing new; "sign it from Maria" or "change 30%
/// to 35%" brings something new, and an answer that carries it did what was
/// asked.
pub fn progressed(later: Turn<'_>, earlier: Turn<'_>, before: Option<Turn<'_>>) -> bool {
    let seen: Vec<&Text> = [Some(earlier), before]
        .into_iter()
        .flatten()
        .flat_map(|t| [Some(t.answer), t.prompt])
        .flatten()
        .collect();
    let answer = later.answer;
    // A phrase the user quoted, now in the answer and not in the one before
    // ("change the subject to 'Shipping delay'").
    let took_up_quote = later.prompt.is_some_and(|p| {
        p.quoted
            .iter()
            .any(|q| answer.text.contains(q.as_str()) && !earlier.answer.text.contains(q.as_str()))
    });
    let took_up_prompt = took_up_quote
        || later.prompt.is_some_and(|p| {
            p.words.iter().any(|w| {
                answer.words.binary_search(w).is_ok()
                    && seen.iter().all(|t| t.words.binary_search(w).is_err())
            })
        });
    took_up_prompt
        || only_removes(answer.shingles(), earlier.answer.shingles())
        || before.is_some_and(|b| {
            keeps_what_was_introduced(
                answer.shingles(),
                earlier.answer.shingles(),
                b.answer.shingles(),
            )
        })
}

/// Whether the model's turn `back` turns ago (0: the newest) made progress
/// over the turn before it: its text answer did ([`answer_progressed_at`]),
/// or it repeated the turn's calls and read something new
/// ([`crate::detect::news::read_on`]). Near mode compares such a turn's
/// tail only word for word.
pub fn turn_progressed_at(
    history: &ToolHistory,
    results: &impl Results,
    classes: Classes,
    cache: Option<&TextCache>,
    back: usize,
) -> bool {
    answer_progressed_at(history, results, classes, cache, back)
        || crate::detect::news::read_on(history, results, classes, back)
}

/// Whether the conversation's model turn `back` turns ago (0: the newest)
/// is a text answer that made progress over the text answer of the turn
/// before it (both long enough to compare), in the conversation as it was
/// then: what the request sent then was judged by. A request whose newest
/// answer did is a new step of the conversation, not a repeat.
pub fn answer_progressed_at(
    history: &ToolHistory,
    results: &impl Results,
    classes: Classes,
    cache: Option<&TextCache>,
    back: usize,
) -> bool {
    let turns = history.turns.iter().rev().skip(back);
    let mut answers = turns.take(3).take_while(|t| t.calls == 0);
    let (Some(newest), Some(previous)) = (answers.next(), answers.next()) else {
        return false;
    };
    let read_answer = |t: &crate::request::llm::ModelTurn| {
        t.answer
            .and_then(|at| read_cached(cache, results, at, classes, ANSWER_MIN_CHARS))
    };
    // What the user wrote is never masked.
    let read_prompt = |t: &crate::request::llm::ModelTurn| {
        t.prompt
            .and_then(|at| read_cached(cache, results, at, Classes::NONE, 4))
    };
    let (Some(later), Some(earlier)) = (read_answer(newest), read_answer(previous)) else {
        return false;
    };
    let third = answers.next();
    let before = third.and_then(read_answer);
    let prompts = [
        read_prompt(newest),
        read_prompt(previous),
        third.and_then(read_prompt),
    ];
    let [p_later, p_earlier, p_before] = prompts.each_ref().map(Option::as_deref);
    let turn = |answer, prompt| Turn { answer, prompt };
    progressed(
        turn(&*later, p_later),
        turn(&*earlier, p_earlier),
        before.as_deref().map(|b| turn(b, p_before)),
    )
}

/// `later` only removed text from `earlier`: a real cut, and little added
/// (where the cut joins the text, and a reworded opening line such as
/// "Updated:" for "Here is the full text:"): at most a quarter of what was
/// removed.
fn only_removes(later: &[u32], earlier: &[u32]) -> bool {
    let both = common(later, earlier);
    let added = later.len() - both;
    let removed = earlier.len() - both;
    removed >= 8 && added <= 3.max(removed / 4)
}

/// What `earlier` introduced over `before` (at least a word's worth) is
/// still, almost all of it, in `later`: an edit kept, not a wording
/// replaced.
fn keeps_what_was_introduced(later: &[u32], earlier: &[u32], before: &[u32]) -> bool {
    let introduced = earlier.len() - common(earlier, before);
    if introduced < 4 {
        return false;
    }
    // Of what `earlier` introduced, what `later` has: what the two share
    // that `before` did not have.
    let kept = common(later, earlier) - common3(later, earlier, before);
    10 * kept >= 9 * introduced
}

/// How many values two sorted sets share (one pass over both).
fn common(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0usize);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        n += usize::from(x == y);
        i += usize::from(x <= y);
        j += usize::from(y <= x);
    }
    n
}

/// How many values three sorted sets share (one pass over all three).
fn common3(a: &[u32], b: &[u32], c: &[u32]) -> usize {
    let (mut i, mut j, mut k, mut n) = (0, 0, 0, 0usize);
    while let (Some(&x), Some(&y), Some(&z)) = (a.get(i), b.get(j), c.get(k)) {
        let top = x.max(y).max(z);
        if x == top && y == top && z == top {
            n += 1;
            i += 1;
            j += 1;
            k += 1;
        } else {
            i += usize::from(x < top);
            j += usize::from(y < top);
            k += usize::from(z < top);
        }
    }
    n
}

/// A text's distinct 4-byte shingles, sorted (none for a text shorter
/// than 4 bytes).
fn shingles(text: &str) -> Vec<u32> {
    let b = text.as_bytes();
    let b = b.get(..b.len().min(ANSWER_MAX_BYTES)).unwrap_or(b);
    let mut out: Vec<u32> = b
        .windows(4)
        .map(|w| w.iter().fold(0u32, |acc, &c| (acc << 8) | u32::from(c)))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// At least half of the smaller text's shingles are in the other.
pub fn similar(a: &Text, b: &Text) -> bool {
    let (a, b) = (a.shingles(), b.shingles());
    2 * common(a, b) >= a.len().min(b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(t: &str) -> Text {
        let masked = t.to_lowercase();
        let mut words = Vec::new();
        similarity::words(&masked, |w, _| {
            let telling = w.iter().any(u8::is_ascii_digit)
                || std::str::from_utf8(w).is_ok_and(|s| {
                    s.chars().count() >= 4 || s.chars().any(similarity::unsegmented)
                });
            if telling {
                words.push(similarity::fnv1a(w));
            }
        });
        words.sort_unstable();
        words.dedup();
        let quoted = similarity::quoted(&masked);
        Text {
            words,
            quoted,
            text: masked,
            shingles: Default::default(),
        }
    }

    fn turn<'a>(answer: &'a Text, prompt: &'a Text) -> Turn<'a> {
        Turn {
            answer,
            prompt: Some(prompt),
        }
    }

    const LETTER: &str = "Dear colleagues, I would like to invite you to meet on Wednesday at 10:00 to plan Q4. Please bring your top three priorities and any open risks. Kind regards, Jordan";

    #[test]
    fn an_edit_that_takes_up_something_new_is_progress() {
        let before = text(LETTER);
        let earlier_prompt = text("Make it a bit more formal.");
        let prompt = text("Sign it from Maria instead of Jordan.");
        let later = text(&LETTER.replace("Jordan", "Maria"));
        assert!(progressed(
            turn(&later, &prompt),
            turn(&before, &earlier_prompt),
            None
        ));
        // A number asked for: 30% to 35%.
        let base = text("Reduced invoice processing time by 30% over two quarters, with a team of four analysts and one engineer.");
        let asked = text("Change 30% to 35%.");
        let edited = text("Reduced invoice processing time by 35% over two quarters, with a team of four analysts and one engineer.");
        assert!(progressed(
            turn(&edited, &asked),
            turn(&base, &earlier_prompt),
            None
        ));
        // A quoted phrase, even made of words seen before.
        let subject = text("件名：商品発送遅延のお詫び 山田 花子 様 いつも当店をご利用いただき、誠にありがとうございます。ゆずリビング");
        let ask = text("件名を「【ゆずリビング】発送遅延のお詫び」にしてください。");
        let renamed = text("件名：【ゆずリビング】発送遅延のお詫び 山田 花子 様 いつも当店をご利用いただき、誠にありがとうございます。ゆずリビング");
        assert!(progressed(
            turn(&renamed, &ask),
            turn(&subject, &earlier_prompt),
            None
        ));
    }

    #[test]
    fn echoing_the_users_pushback_is_not_progress() {
        let first_prompt = text(
            "Running my script gives ModuleNotFoundError: No module named 'yaml'. How do I fix it?",
        );
        let first = text("The error means the PyYAML package isn't installed in your environment. Install it with pip install pyyaml, then run it again.");
        let pushback = text("Still the same ModuleNotFoundError, I already installed it.");
        let again = text("Apologies for the ModuleNotFoundError. The yaml module comes from PyYAML, which your interpreter can't find. Installing it should fix this: pip install PyYAML.");
        assert!(!progressed(
            turn(&again, &pushback),
            turn(&first, &first_prompt),
            None
        ));
    }

    #[test]
    fn a_cut_with_a_reworded_opening_line_is_a_deletion() {
        let full = text("Updated: Dear team, the release ships on Friday. Please review the notes before Thursday. The migration runs on Saturday night and takes two hours. Thanks, Ana");
        let cut = text("Done: Dear team, the release ships on Friday. Please review the notes before Thursday. Thanks, Ana");
        assert!(only_removes(cut.shingles(), full.shingles()));
        assert!(!only_removes(full.shingles(), cut.shingles()));
    }

    #[test]
    fn quotes_are_found_apostrophes_are_not() {
        use similarity::quoted;
        assert_eq!(
            quoted("change the greeting to 'olá, time da lumina,' please, it's too formal"),
            vec!["olá, time da lumina,".to_string()]
        );
        assert_eq!(
            quoted("「担当：佐藤」を追加"),
            vec!["担当：佐藤".to_string()]
        );
        assert!(quoted("it's fine, don't worry").is_empty());
    }

    fn set(v: Vec<u32>) -> Vec<u32> {
        let mut v = v;
        v.sort_unstable();
        v.dedup();
        v
    }

    proptest::proptest! {
        /// The one-pass counts agree with counting by lookup.
        #[test]
        fn shared_counts_agree_with_lookups(
            a in proptest::collection::vec(0u32..64, 0..40),
            b in proptest::collection::vec(0u32..64, 0..40),
            c in proptest::collection::vec(0u32..64, 0..40),
        ) {
            let (a, b, c) = (set(a), set(b), set(c));
            let in_ = |s: &[u32], x: &u32| s.binary_search(x).is_ok();
            proptest::prop_assert_eq!(common(&a, &b), a.iter().filter(|x| in_(&b, x)).count());
            proptest::prop_assert_eq!(
                common3(&a, &b, &c),
                a.iter().filter(|x| in_(&b, x) && in_(&c, x)).count()
            );
            // What `b` introduced over `c`, kept in `a`.
            let introduced: Vec<u32> = b.iter().copied().filter(|x| !in_(&c, x)).collect();
            let kept = introduced.iter().filter(|x| in_(&a, x)).count();
            proptest::prop_assert_eq!(
                keeps_what_was_introduced(&a, &b, &c),
                introduced.len() >= 4 && 10 * kept >= 9 * introduced.len()
            );
        }
    }
}
