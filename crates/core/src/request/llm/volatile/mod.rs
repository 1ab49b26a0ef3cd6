//! Volatile-token masking: the parts of a message that change every turn
//! of a loop without meaning anything new (timestamps, request ids,
//! latencies) are replaced by typed placeholders before hashing, so a tool
//! that keeps failing with `Error 503 at 2026-11-23T13:40:01.123Z (request
//! id req_8f3aK29dLm01)` repeats as `error # at <datetime> (request id
//! <id>)`.
//!
//! One pass over normalised (lower-cased) text, no regular expressions: at
//! each word start the classes are tried in a fixed order, each reading
//! ahead only as far as its own shape; a word no class takes is skipped
//! whole. Text without a volatile token is returned borrowed, unchanged.
//!
//! Where each class applies (see [`Context`]): tool results get every
//! enabled class; the model's own text keeps its bare dates and numbers;
//! what a user or the system wrote is never masked (`convert 1000 eur` and
//! `convert 1037 eur` stay different; so do two tickets that differ only
//! in a document hash); tool-call arguments are masked only when the
//! policy opts in, and never their numbers.

use super::{Message, Part};
pub use crate::config::volatile::{Class, Classes, Volatile};
use crate::request::Fnv;
use std::borrow::Cow;

impl Volatile {
    /// Mask messages in place: tool results, the model's text, and
    /// arguments when opted in. What a user or the system wrote is the
    /// request's intent and stays as it is (a ticket that differs only in
    /// its document hash is another ticket); tool results inside a user
    /// message (Anthropic) are tool results.
    pub fn mask_messages(&self, messages: &mut [Message]) {
        if self.classes.is_empty() {
            return;
        }
        let args = self.argument_classes();
        for m in messages {
            let text = (!m.is_authored()).then_some(Context::Text);
            mask_parts(&mut m.parts, self.classes, args, text);
        }
    }

    /// Mask a conversation's opening as near mode's salt reads it: the
    /// system prompt's machine-made tokens (an agent that writes the
    /// current time into it every turn is still one task); the user's
    /// words stay as they are (two tickets are two tasks).
    pub fn mask_opening(&self, opening: &mut [Message]) {
        for m in opening.iter_mut().filter(|m| m.is_prompt()) {
            let text = Some(Context::Text);
            mask_parts(&mut m.parts, self.classes, Classes::NONE, text);
        }
    }
}

/// Mask parts: text in `text` context (`None`: left alone), tool results
/// and arguments in theirs.
fn mask_parts(parts: &mut [Part], classes: Classes, args: Classes, text: Option<Context>) {
    for p in parts {
        match p {
            Part::Text(t) => {
                if let Some(context) = text {
                    replace(t, classes, context);
                }
            }
            Part::ToolCall { arguments, .. } => replace(arguments, args, Context::Arguments),
            Part::ToolResult { content, .. } => {
                mask_parts(content, classes, args, Some(Context::ToolResult))
            }
            Part::Media(_) | Part::Other(_) => {}
        }
    }
}

/// Mask `s` in place: a placeholder is never longer than its token, so
/// the masked text is written over the text as it is read (no copy of a
/// long tool result; a token whose placeholder would not fit stays).
fn replace(s: &mut String, classes: Classes, context: Context) {
    if classes.is_empty() {
        return;
    }
    let mut b = std::mem::take(s).into_bytes();
    let mut cursor = Cursor::new(classes, context);
    // Bytes before `copied` have been moved down to below `w`.
    let (mut w, mut copied) = (0, 0);
    while let Some((from, end, placeholder)) = cursor.next(&b) {
        if from < copied || placeholder.len() > end - from {
            continue;
        }
        b.copy_within(copied..from, w);
        w += from - copied;
        if let Some(dst) = b.get_mut(w..w + placeholder.len()) {
            dst.copy_from_slice(placeholder.as_bytes());
        }
        w += placeholder.len();
        copied = end;
    }
    if copied > 0 {
        let len = b.len();
        b.copy_within(copied..len, w);
        b.truncate(w + len - copied);
    }
    // Whole ASCII tokens were replaced by ASCII: still UTF-8.
    *s =
        String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
}

/// What a piece of text is, which decides the classes that apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// Message text written by a user, the system or the model.
    Text,
    /// A tool's result.
    ToolResult,
    /// A tool call's arguments (only when the policy opts in).
    Arguments,
}

/// Mask `text` for `context` (case does not matter: message text is
/// normalised to lower case, arguments are not). Borrowed when nothing was
/// masked.
pub fn mask(text: &str, classes: Classes, context: Context) -> Cow<'_, str> {
    let mut out: Option<String> = None;
    // Bytes of `text` before `copied` are in `out` already.
    let mut copied = 0;
    for (from, end, placeholder) in spans(text, classes, context) {
        let s = out.get_or_insert_with(|| String::with_capacity(text.len()));
        s.push_str(text.get(copied..from).unwrap_or(""));
        s.push_str(placeholder);
        copied = end;
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut s) => {
            s.push_str(text.get(copied..).unwrap_or(""));
            Cow::Owned(s)
        }
    }
}

/// A 64-bit digest of `text` masked for `context`, computed as it is
/// masked (nothing is copied, however long the text and however many
/// numbers become placeholders). A volatile token for which `keep` is true
/// stays as it is.
pub fn masked_digest(
    text: &str,
    classes: Classes,
    context: Context,
    keep: &dyn Fn(&str) -> bool,
) -> u64 {
    let mut h = Fnv::default();
    let mut copied = 0;
    for (from, end, placeholder) in spans(text, classes, context) {
        let token = text.get(from..end).unwrap_or("");
        if keep(token) {
            continue;
        }
        h.write(text.get(copied..from).unwrap_or("").as_bytes());
        h.write(placeholder.as_bytes());
        copied = end;
    }
    h.write(text.get(copied..).unwrap_or("").as_bytes());
    h.0
}

/// The volatile tokens of `text` (each as it is written), for telling a
/// result's own echo of its arguments from noise.
pub fn tokens(text: &str, classes: Classes, context: Context) -> Vec<&str> {
    spans(text, classes, context)
        .filter_map(|(from, end, _)| text.get(from..end))
        .collect()
}

/// The volatile tokens of a text, in order: where each masked part starts
/// (a prefixed id keeps its prefix) and ends, and its placeholder.
fn spans(
    text: &str,
    classes: Classes,
    context: Context,
) -> impl Iterator<Item = (usize, usize, &'static str)> + '_ {
    let mut cursor = Cursor::new(classes, context);
    std::iter::from_fn(move || cursor.next(text.as_bytes()))
}

/// The scan behind [`spans`], holding no borrow of the text so that the
/// text can be rewritten behind it ([`replace`]). One pass: at each word
/// start the classes are tried in a fixed order; a word no class takes is
/// skipped whole. It only ever reads at or after its position (whether the
/// byte before it was part of a word is remembered, not read again).
struct Cursor {
    i: usize,
    /// Whether the byte before `i` is a letter or digit.
    in_word: bool,
    classes: Classes,
    context: Context,
    /// Every number is masked (`tool_result_numbers`, in a tool result).
    numbers: bool,
    /// Numbers whose context says they are noise are masked
    /// (`noise_numbers`, in a tool result or the model's text).
    noise: bool,
    /// Words left in which a number is noise because a word before it
    /// named a time, an attempt or an id (`attempt 4`, `nov 23`).
    keyed: u8,
}

impl Cursor {
    fn new(classes: Classes, context: Context) -> Self {
        Cursor {
            i: 0,
            in_word: false,
            classes,
            context,
            numbers: context == Context::ToolResult && classes.contains(Class::ToolResultNumbers),
            noise: context != Context::Arguments && classes.contains(Class::NoiseNumbers),
            keyed: 0,
        }
    }

    /// A word passed over (see `keyed`).
    fn passed(&mut self, word: Option<&[u8]>) {
        self.keyed = match word {
            Some(w) if names_noise(w) => 2,
            _ => self.keyed.saturating_sub(1),
        };
    }

    fn next(&mut self, b: &[u8]) -> Option<(usize, usize, &'static str)> {
        if self.classes.is_empty() {
            return None;
        }
        while self.i < b.len() {
            let i = self.i;
            let Some(&c) = b.get(i) else { break };
            if !c.is_ascii_alphanumeric() {
                self.i += 1;
                self.in_word = false;
                continue;
            }
            if !self.in_word && c.is_ascii_alphabetic() {
                // A word of letters only, not running on into digits, `_`
                // or `-`: no class takes it (each needs digits, or a `_` or
                // `-` after the letters), so it is passed over whole, as
                // the general path below would.
                let p = skip(b, i + 1, u8::is_ascii_alphabetic);
                if !b
                    .get(p)
                    .is_some_and(|n| n.is_ascii_digit() || matches!(n, b'_' | b'-'))
                {
                    if self.noise && !self.numbers {
                        self.passed(b.get(i..p));
                    }
                    self.i = p;
                    self.in_word = true;
                    continue;
                }
            }
            let found = if self.in_word {
                None
            } else {
                token(b, i, self.classes, self.context)
            };
            let found = found.or_else(|| {
                if self.numbers && c.is_ascii_digit() {
                    Some((i, number_end(b, i), "#"))
                } else if self.noise && !self.in_word && c.is_ascii_digit() {
                    noise_number(b, i, self.keyed > 0).map(|end| (i, end, "#"))
                } else {
                    None
                }
            });
            match found {
                Some(t) => {
                    self.keyed = 0;
                    self.i = t.1.max(i + 1);
                    self.in_word = is_alnum(b, self.i - 1);
                    return Some(t);
                }
                None if self.numbers => {
                    // Letters up to the next digit or the word's end: a
                    // number inside a word (`1843ms`, `http2`) is still a
                    // number.
                    self.i = skip(b, self.i + 1, u8::is_ascii_alphabetic);
                    self.in_word = true;
                }
                None => {
                    let end = if c.is_ascii_digit() {
                        // A kept number, `1,843.5` whole, and any letters
                        // after it.
                        word_end(b, number_end(b, i))
                    } else {
                        word_end(b, i)
                    };
                    if self.noise && !self.in_word {
                        self.passed(b.get(i..end));
                    }
                    self.i = end.max(i + 1);
                    self.in_word = true;
                }
            }
        }
        None
    }
}

mod noise;
mod shapes;

use noise::{names_noise, noise_number};
use shapes::{is_alnum, number_end, skip, token, word_end};
#[cfg(test)]
mod tests;
