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
            let text = if m.is_authored() {
                None
            } else {
                Some(Context::Text)
            };
            mask_parts(&mut m.parts, self.classes, args, text);
        }
    }

    /// Mask a conversation's opening as near mode's salt reads it: the
    /// system prompt's machine-made tokens (an agent that writes the
    /// current time into it every turn is still one task); the user's
    /// words stay as they are (two tickets are two tasks).
    pub fn mask_opening(&self, opening: &mut [Message]) {
        for m in opening {
            if m.is_prompt() {
                mask_parts(
                    &mut m.parts,
                    self.classes,
                    Classes::NONE,
                    Some(Context::Text),
                );
            }
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
    for (from, end, placeholder) in Tokens::new(text, classes, context) {
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
    for (from, end, placeholder) in Tokens::new(text, classes, context) {
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
    Tokens::new(text, classes, context)
        .filter_map(|(from, end, _)| text.get(from..end))
        .collect()
}

/// 64-bit FNV-1a.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, b: &[u8]) {
        for &c in b {
            self.0 = (self.0 ^ u64::from(c)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The volatile tokens of a text, in order: where each masked part starts
/// (a prefixed id keeps its prefix) and ends, and its placeholder.
struct Tokens<'t> {
    b: &'t [u8],
    cursor: Cursor,
}

impl<'t> Tokens<'t> {
    fn new(text: &'t str, classes: Classes, context: Context) -> Self {
        Tokens {
            b: text.as_bytes(),
            cursor: Cursor::new(classes, context),
        }
    }
}

impl Iterator for Tokens<'_> {
    type Item = (usize, usize, &'static str);

    fn next(&mut self) -> Option<Self::Item> {
        self.cursor.next(self.b)
    }
}

/// The scan behind [`Tokens`], holding no borrow of the text so that the
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
                    self.i += 1;
                    while b.get(self.i).is_some_and(u8::is_ascii_alphabetic) {
                        self.i += 1;
                    }
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
                        self.keyed = match b.get(i..end) {
                            Some(w) if names_noise(w) => 2,
                            _ => self.keyed.saturating_sub(1),
                        };
                    }
                    self.i = end.max(i + 1);
                    self.in_word = true;
                }
            }
        }
        None
    }
}

/// Words after which a number is noise: times, attempts, ids (`attempt
/// 4`, `latency_ms: 31`, `pid 2231`, `retry budget 4/10`), and the names
/// of months and weekdays (`Nov 23`, `Thu, 05 Nov 2026`). `may` is left
/// out: it is a verb far more often than a month.
const NOISE_KEYS: &[&str] = &[
    "attempt",
    "attempts",
    "retry",
    "retries",
    "try",
    "tries",
    "took",
    "elapsed",
    "latency",
    "duration",
    "uptime",
    "time",
    "ts",
    "timestamp",
    "pid",
    "tid",
    "port",
    "seq",
    "nonce",
    "trace",
    "span",
    "session",
    "worker",
    "thread",
    "request",
    "req",
    "wait",
    "waited",
    "delay",
    "backoff",
    "deadline",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "january",
    "february",
    "march",
    "april",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
    "mon",
    "tue",
    "tues",
    "wed",
    "thu",
    "thur",
    "thurs",
    "fri",
    "sat",
    "sun",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// Units of time a number may carry (`1843 ms`, `1.04s`, `5 seconds`,
/// `30 Sekunden`, `2 horas`). `m` alone is left out (minutes, metres or
/// millions); it counts inside a compound duration (`10m07s`).
const TIME_UNITS: &[&str] = &[
    "ms",
    "s",
    "sec",
    "secs",
    "second",
    "seconds",
    "us",
    "ns",
    "min",
    "mins",
    "minute",
    "minutes",
    "h",
    "hr",
    "hrs",
    "hour",
    "hours",
    "sek",
    "sekunde",
    "sekunden",
    "minuten",
    "stunde",
    "stunden",
    "millisekunden",
    "seg",
    "segundo",
    "segundos",
    "minuto",
    "minutos",
    "hora",
    "horas",
    "milisegundos",
    "milissegundos",
    "seconde",
    "secondes",
    "heure",
    "heures",
    "millisecondes",
];

/// Units of time in scripts that write them right after the number, with
/// no space and no word boundary (`10.06 秒`, `200ミリ秒`, `3 分钟后`): the
/// unit's UTF-8 bytes.
const TIME_UNITS_UNSPACED: &[&str] = &[
    "毫秒",
    "ミリ秒",
    "秒",
    "分钟",
    "分鐘",
    "小时",
    "小時",
    "時間",
    "мс",
    "сек",
    "мин",
    "초",
];

fn names_noise(word: &[u8]) -> bool {
    word.len() <= 9
        && NOISE_KEYS
            .iter()
            .any(|k| k.as_bytes().eq_ignore_ascii_case(word))
}

/// Whether the number at `i` (a word start) is noise, and where the masked
/// part ends: a time of day (`13:40:01`, all of it), a compound duration
/// (`10m07s`, all of it), a number with a unit of time after it (the
/// number), or any number right after a word that names a time, an
/// attempt or an id (`keyed`).
fn noise_number(b: &[u8], i: usize, keyed: bool) -> Option<usize> {
    if let Some(end) = clock_time(b, i).or_else(|| compound_duration(b, i)) {
        return Some(end);
    }
    let end = number_end(b, i);
    if time_unit_at(b, end) {
        return Some(end);
    }
    // After a key, a number standing alone (`worker 31bd07aa` is an id
    // that starts with digits, not a number).
    (keyed && !is_alnum(b, end)).then_some(end)
}

/// A unit of time at `p`, directly or after one space, ending its word.
fn time_unit_at(b: &[u8], p: usize) -> bool {
    let p = if b.get(p) == Some(&b' ') { p + 1 } else { p };
    // `µs`: U+00B5 then `s`.
    if b.get(p..p + 3) == Some(&[0xC2, 0xB5, b's'][..]) {
        return !is_alnum(b, p + 3);
    }
    let rest = b.get(p..).unwrap_or_default();
    if TIME_UNITS_UNSPACED
        .iter()
        .any(|u| rest.starts_with(u.as_bytes()))
    {
        return true;
    }
    let mut q = p;
    while b.get(q).is_some_and(u8::is_ascii_alphabetic) {
        q += 1;
    }
    let unit = b.get(p..q).unwrap_or_default();
    !unit.is_empty()
        && !is_alnum(b, q)
        && TIME_UNITS
            .iter()
            .any(|u| u.as_bytes().eq_ignore_ascii_case(unit))
}

/// `h:mm`, `hh:mm`, `hh:mm:ss`, with a fraction: a time of day (hours up to
/// 23, minutes and seconds up to 59). `16:9` or `88:50` are not.
fn clock_time(b: &[u8], i: usize) -> Option<usize> {
    let h_end = digits_end(b, i)?;
    let hours = two_digit_value(b.get(i..h_end)?)?;
    if hours > 23 {
        return None;
    }
    let mut p = byte(b, h_end, b':')?;
    let m_end = run(b, p, 2, digit)?;
    if two_digit_value(b.get(p..m_end)?)? > 59 {
        return None;
    }
    p = m_end;
    if let Some(q) = byte(b, p, b':').and_then(|q| run(b, q, 2, digit)) {
        if two_digit_value(b.get(p + 1..q)?)? > 60 {
            return None;
        }
        p = q;
        if let Some(q) = b
            .get(p)
            .filter(|c| matches!(c, b'.' | b','))
            .and_then(|_| digits_end(b, p + 1))
        {
            p = q;
        }
    }
    ends(b, p)
}

/// The value of one or two digits.
fn two_digit_value(d: &[u8]) -> Option<u32> {
    if d.is_empty() || d.len() > 2 {
        return None;
    }
    Some(d.iter().fold(0, |v, c| v * 10 + u32::from(c - b'0')))
}

/// Two or more `<digits><unit>` parts of `h`, `m`, `s` or `ms` run
/// together: `10m07s`, `1h30m`, `2m3.5s`.
fn compound_duration(b: &[u8], i: usize) -> Option<usize> {
    let mut p = i;
    let mut parts = 0;
    while let Some(d) = digits_end(b, p) {
        let d = match b.get(d) {
            Some(b'.') => digits_end(b, d + 1).unwrap_or(d),
            _ => d,
        };
        let unit = match (
            b.get(d).map(u8::to_ascii_lowercase),
            b.get(d + 1).map(u8::to_ascii_lowercase),
        ) {
            (Some(b'm'), Some(b's')) => 2,
            (Some(b'h' | b'm' | b's'), _) => 1,
            _ => break,
        };
        p = d + unit;
        parts += 1;
    }
    (parts >= 2).then_some(p).and_then(|e| ends(b, e))
}

/// The volatile token starting at `i` (a word start), if any: where the
/// masked part starts (a prefixed id keeps its prefix) and ends, and its
/// placeholder.
fn token(
    b: &[u8],
    i: usize,
    classes: Classes,
    context: Context,
) -> Option<(usize, usize, &'static str)> {
    let bare_dates = context != Context::Text;
    let c = *b.get(i)?;
    if classes.contains(Class::Uuid) && c.is_ascii_hexdigit() {
        if let Some(end) = uuid(b, i) {
            return Some((i, end, "<uuid>"));
        }
    }
    if classes.contains(Class::DateTime) && c.is_ascii_digit() {
        if let Some((end, has_time)) = date_time(b, i) {
            if has_time {
                return Some((i, end, "<datetime>"));
            }
            if bare_dates {
                return Some((i, end, "<date>"));
            }
        }
    }
    // A 10- or 13-digit number is an epoch only in a tool's result; in the
    // model's text or an argument it is as likely an id.
    if c.is_ascii_digit() && classes.contains(Class::Epoch) && context == Context::ToolResult {
        if let Some(end) = epoch(b, i) {
            return Some((i, end, "<epoch>"));
        }
    }
    if classes.contains(Class::Hex) && c.is_ascii_hexdigit() {
        if let Some(end) = hex_run(b, i) {
            return Some((i, end, "<hex>"));
        }
    }
    if classes.contains(Class::PrefixedId) && c.is_ascii_alphabetic() {
        if let Some((from, end)) = prefixed_id(b, i) {
            return Some((from, end, "<id>"));
        }
    }
    None
}

fn is_alnum(b: &[u8], i: usize) -> bool {
    b.get(i).is_some_and(u8::is_ascii_alphanumeric)
}

/// The end of the ASCII word (letters and digits) starting at `i`.
fn word_end(b: &[u8], mut i: usize) -> usize {
    while is_alnum(b, i) {
        i += 1;
    }
    i.max(1)
}

/// `n` bytes from `i` satisfying `f`; the position after them.
fn run(b: &[u8], i: usize, n: usize, f: impl Fn(u8) -> bool) -> Option<usize> {
    let s = b.get(i..i + n)?;
    s.iter().all(|&c| f(c)).then_some(i + n)
}

fn hex(c: u8) -> bool {
    c.is_ascii_hexdigit()
}

fn digit(c: u8) -> bool {
    c.is_ascii_digit()
}

fn byte(b: &[u8], i: usize, want: u8) -> Option<usize> {
    (b.get(i) == Some(&want)).then_some(i + 1)
}

/// A token must not run on into a longer word.
fn ends(b: &[u8], end: usize) -> Option<usize> {
    (!is_alnum(b, end)).then_some(end)
}

fn uuid(b: &[u8], i: usize) -> Option<usize> {
    let mut p = run(b, i, 8, hex)?;
    for n in [4, 4, 4] {
        p = byte(b, p, b'-')?;
        p = run(b, p, n, hex)?;
    }
    p = byte(b, p, b'-')?;
    p = run(b, p, 12, hex)?;
    ends(b, p)
}

/// `yyyy-mm-dd`, optionally followed by `t` or a space and `hh:mm`,
/// `:ss`, a fraction and a zone (`z`, `+hh:mm`, `+hhmm`, `+hh`). Returns
/// the end and whether a time was there.
fn date_time(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut p = run(b, i, 4, digit)?;
    p = byte(b, p, b'-')?;
    p = run(b, p, 2, digit)?;
    p = byte(b, p, b'-')?;
    p = run(b, p, 2, digit)?;
    let date_end = p;
    let time = b
        .get(p)
        .filter(|c| matches!(c, b't' | b'T' | b' '))
        .and_then(|_| time_of_day(b, p + 1));
    match time {
        Some(end) => ends(b, end).map(|e| (e, true)),
        None => ends(b, date_end).map(|e| (e, false)),
    }
}

/// `hh:mm[:ss[.frac]][zone]` from `i`.
fn time_of_day(b: &[u8], i: usize) -> Option<usize> {
    let mut p = run(b, i, 2, digit)?;
    p = byte(b, p, b':')?;
    p = run(b, p, 2, digit)?;
    if let Some(q) = byte(b, p, b':').and_then(|q| run(b, q, 2, digit)) {
        p = q;
        if let Some(q) = b
            .get(p)
            .filter(|c| matches!(c, b'.' | b','))
            .and_then(|_| digits_end(b, p + 1))
        {
            p = q;
        }
    }
    match b.get(p) {
        Some(b'z' | b'Z') => Some(p + 1),
        Some(b'+' | b'-') => {
            let q = run(b, p + 1, 2, digit)?;
            let q = match byte(b, q, b':') {
                Some(r) => run(b, r, 2, digit).unwrap_or(q),
                None => run(b, q, 2, digit).unwrap_or(q),
            };
            Some(q)
        }
        _ => Some(p),
    }
}

/// The end of a run of at least one digit from `i`.
fn digits_end(b: &[u8], i: usize) -> Option<usize> {
    let mut p = i;
    while b.get(p).is_some_and(u8::is_ascii_digit) {
        p += 1;
    }
    (p > i).then_some(p)
}

/// 10 digits (seconds) or 13 (milliseconds) in 2001..2036, optionally with
/// a fraction (`1732370401.123`).
fn epoch(b: &[u8], i: usize) -> Option<usize> {
    let end = digits_end(b, i)?;
    let digits = b.get(i..end)?;
    let value: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let in_range = match digits.len() {
        10 => (1_000_000_000..2_100_000_000).contains(&value),
        13 => (1_000_000_000_000..2_100_000_000_000).contains(&value),
        _ => false,
    };
    if !in_range {
        return None;
    }
    let end = match b
        .get(end)
        .filter(|c| **c == b'.')
        .and_then(|_| digits_end(b, end + 1))
    {
        Some(e) => e,
        None => end,
    };
    ends(b, end)
}

/// 16 or more hex digits, with both digits and letters.
fn hex_run(b: &[u8], i: usize) -> Option<usize> {
    let mut p = i;
    let (mut digits, mut letters) = (false, false);
    while let Some(&c) = b.get(p).filter(|c| hex(**c)) {
        digits |= c.is_ascii_digit();
        letters |= c.is_ascii_alphabetic();
        p += 1;
    }
    // Both kinds: sixteen digits are a number (an order, a card), sixteen
    // letters a word; a digest mixes them.
    (p - i >= 16 && digits && letters)
        .then_some(p)
        .and_then(|e| ends(b, e))
}

/// 1-12 letters, `_` or `-`, then 10+ letters and digits with both kinds:
/// where the random part starts and ends.
fn prefixed_id(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let mut p = i;
    while b.get(p).is_some_and(u8::is_ascii_alphabetic) {
        p += 1;
    }
    if p - i > 12 || !matches!(b.get(p), Some(b'_' | b'-')) {
        return None;
    }
    let start = p + 1;
    let (mut letters, mut digits) = (false, false);
    let mut q = start;
    while let Some(&c) = b.get(q).filter(|c| c.is_ascii_alphanumeric()) {
        letters |= c.is_ascii_alphabetic();
        digits |= c.is_ascii_digit();
        q += 1;
    }
    (q - start >= 10 && letters && digits).then_some((start, q))
}

/// The end of a number from `i`: digits, with `.` or `,` between digit
/// groups (`1,843.5`).
fn number_end(b: &[u8], i: usize) -> usize {
    let mut p = i;
    loop {
        while b.get(p).is_some_and(u8::is_ascii_digit) {
            p += 1;
        }
        let sep = matches!(b.get(p), Some(b'.' | b','));
        if sep && b.get(p + 1).is_some_and(u8::is_ascii_digit) {
            p += 1;
        } else {
            return p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(s: &str) -> String {
        mask(s, Classes::all(), Context::ToolResult).into_owned()
    }

    fn text(s: &str) -> String {
        mask(s, Classes::all(), Context::Text).into_owned()
    }

    #[test]
    fn a_failing_tool_repeats_once_masked() {
        let a = tool("error 503 at 2026-11-23t13:40:01.123z (request id req_8f3ak29dlm01, trace 5b2c9e0f4a1d7c3b8e9f) after 1843 ms, attempt 4");
        let b = tool("error 503 at 2026-11-23t13:40:07.981z (request id req_k2l9x0pq77za, trace 0a9f8e7d6c5b4a39d2c1) after 2210 ms, attempt 5");
        assert_eq!(a, b);
        assert_eq!(
            a,
            "error # at <datetime> (request id req_<id>, trace <hex>) after # ms, attempt #"
        );
    }

    #[test]
    fn each_class_with_examples() {
        let cases = [
            (
                "id 3f2a9c1e-7b4d-4e8a-9f01-23456789abcd done",
                "id <uuid> done",
            ),
            ("at 2026-11-23t13:40:01z", "at <datetime>"),
            ("at 2026-11-23t13:40:01.123456+01:00.", "at <datetime>."),
            ("at 2026-11-23 13:40", "at <datetime>"),
            ("at 2026-11-23t13:40:01-0500", "at <datetime>"),
            ("on 2026-11-23, twice", "on <date>, twice"),
            ("ts=1732370401 and 1732370401123", "ts=<epoch> and <epoch>"),
            ("ts 1732370401.25", "ts <epoch>"),
            ("sha 9f86d081884c7d659a2feaa0c55ad015", "sha <hex>"),
            (
                "chatcmpl-b7x9k2m4n6p8q0 and toolu_01abcdef23ghij",
                "chatcmpl-<id> and toolu_<id>",
            ),
            ("took 12.5s for 1,843 bytes", "took #s for # bytes"),
        ];
        for (input, want) in cases {
            assert_eq!(tool(input), want, "{input}");
        }
    }

    #[test]
    fn message_text_keeps_numbers_and_bare_dates() {
        assert_eq!(text("convert 1000 eur to usd"), "convert 1000 eur to usd");
        assert_ne!(text("convert 1000 eur"), text("convert 1037 eur"));
        assert_eq!(text("sales on 2026-11-03?"), "sales on 2026-11-03?");
        // Machine-made tokens are masked in text too.
        assert_eq!(
            text("retrying request req_8f3ak29dlm01 at 2026-11-23t13:40:01z"),
            "retrying request req_<id> at <datetime>"
        );
    }

    #[test]
    fn upper_case_is_masked_too() {
        let m = |s| mask(s, Classes::all(), Context::Arguments).into_owned();
        assert_eq!(
            m(r#"{"since":"2026-11-23T13:40:01Z","id":"3F2A9C1E-7B4D-4E8A-9F01-23456789ABCD"}"#),
            r#"{"since":"<datetime>","id":"<uuid>"}"#
        );
        assert_eq!(m("trace 9F86D081884C7D659A2FEAA0C55AD015"), "trace <hex>");
        assert_eq!(m("REQ_8F3AK29DLM01"), "REQ_<id>");
    }

    #[test]
    fn arguments_keep_numbers() {
        let m = |s| mask(s, Classes::all(), Context::Arguments).into_owned();
        assert_eq!(
            m(r#"{"page":2,"since":"2026-11-23"}"#),
            r#"{"page":2,"since":"<date>"}"#
        );
    }

    #[test]
    fn near_misses_are_left_alone() {
        for s in [
            "customer 4829103746",       // a 10-digit id outside the epoch range
            "get_build_status for main", // snake_case words are not ids
            "deadbeefcafebabedeadbeef",  // hex letters only
            "abc123",                    // too short
            "x-request-idabcdefghij",    // no digits after the prefix
            "8f3a9c1e",                  // short hex
            "12026-11-23",               // not a date: runs on
        ] {
            assert_eq!(text(s), s, "{s}");
        }
        assert_eq!(tool("customer 4829103746"), "customer #");
    }

    /// The default classes (noise numbers, not every number).
    fn default_tool(s: &str) -> String {
        mask(s, Classes::defaults(), Context::ToolResult).into_owned()
    }

    fn default_text(s: &str) -> String {
        mask(s, Classes::defaults(), Context::Text).into_owned()
    }

    #[test]
    fn numbers_that_carry_meaning_are_kept_noise_is_masked() {
        let cases = [
            // Progress: counts, percentages, amounts, sizes, items left.
            ("5 failed, 20 passed in 1.04s", "5 failed, 20 passed in #s"),
            (
                "=== 4 failed, 21 passed in 1.10 seconds ===",
                "=== 4 failed, 21 passed in # seconds ===",
            ),
            (
                "progress 45% (1,204 of 2,000 rows)",
                "progress 45% (1,204 of 2,000 rows)",
            ),
            ("wrote 4096 bytes to out.csv", "wrote 4096 bytes to out.csv"),
            ("remaining: 37 items", "remaining: 37 items"),
            ("total $1,843.50 due", "total $1,843.50 due"),
            ("handlers.py:88:5: b006", "handlers.py:88:5: b006"),
            (
                "http 503 service unavailable",
                "http 503 service unavailable",
            ),
            // Noise: durations and latencies, with or without a space.
            ("timed out after 30012 ms", "timed out after # ms"),
            ("elapsed 30211ms", "elapsed #ms"),
            (
                "took 2.5 sec; 120µs in the kernel",
                "took # sec; #µs in the kernel",
            ),
            ("export aborted after 10m07s", "export aborted after #"),
            ("ok  \tpkg/api\t0.012s", "ok  \tpkg/api\t#s"),
            ("连接超时（耗时 10.06 秒）", "连接超时（耗时 # 秒）"),
            ("応答まで200ミリ秒", "応答まで#ミリ秒"),
            (
                "nach 30 Sekunden abgebrochen",
                "nach # Sekunden abgebrochen",
            ),
            (
                "tiempo de espera: 12,5 segundos",
                "tiempo de espera: # segundos",
            ),
            // Times of day and written dates.
            ("nov 19 10:41:14 ci-runner-3", "nov # # ci-runner-3"),
            ("at thu, 05 nov 2026 08:16:21 gmt", "at thu, # nov # # gmt"),
            ("started 09:05", "started #"),
            // The value of a key that names a time, an attempt or an id.
            ("attempt 4 of 10", "attempt # of 10"),
            ("retry budget 4/10 used", "retry budget #/10 used"),
            (
                r#"{"took_ms": 31, "total": 0}"#,
                r#"{"took_ms": #, "total": 0}"#,
            ),
            (
                r#"{"attempt": 6, "items": 3}"#,
                r#"{"attempt": #, "items": 3}"#,
            ),
            ("buildkitd pid 2231 exited", "buildkitd pid # exited"),
            (
                "worker 31bd07aa lost its lease",
                "worker 31bd07aa lost its lease",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(default_tool(input), want, "{input}");
        }
    }

    #[test]
    fn near_misses_of_noise_numbers_are_kept() {
        for s in [
            "16:9 aspect",       // not a time of day
            "88:50 in the log",  // hours above 23
            "5 sheep, 3 m long", // not units of time (m alone is ambiguous)
            "10m of cable",      // one part: not a compound duration
            "5 retries left",    // the count comes before the word
            "may 5 tests fail",  // may is not read as a month
            "http2 and v1.2.3",  // numbers inside words and versions
        ] {
            assert_eq!(default_tool(s), s, "{s}");
        }
    }

    #[test]
    fn the_model_text_masks_noise_numbers_but_keeps_the_rest() {
        assert_eq!(
            default_text("retrying: the call took 1843 ms; 4 tests still fail"),
            "retrying: the call took # ms; 4 tests still fail"
        );
        assert_eq!(
            default_text("convert 1000 eur to usd"),
            "convert 1000 eur to usd"
        );
        // Arguments keep every number, even with the policy masking them.
        assert_eq!(
            mask("latency 5 ms", Classes::defaults(), Context::Arguments),
            "latency 5 ms"
        );
    }

    #[test]
    fn every_number_is_masked_only_on_request() {
        assert!(!Classes::defaults().contains(Class::ToolResultNumbers));
        assert!(Classes::defaults().contains(Class::NoiseNumbers));
        assert_eq!(
            tool("5 failed, 20 passed in 1.04s"),
            "# failed, # passed in #s"
        );
    }

    #[test]
    fn classes_can_be_chosen() {
        let only_uuid: Classes = [Class::Uuid].into_iter().collect();
        let s = "3f2a9c1e-7b4d-4e8a-9f01-23456789abcd at 2026-11-23t13:40:01z took 5 ms";
        assert_eq!(
            mask(s, only_uuid, Context::ToolResult),
            "<uuid> at 2026-11-23t13:40:01z took 5 ms"
        );
        assert!(matches!(
            mask(s, Classes::NONE, Context::ToolResult),
            Cow::Borrowed(_)
        ));
        assert!(matches!(
            mask("nothing volatile here", Classes::all(), Context::ToolResult),
            Cow::Borrowed(_)
        ));
        assert_eq!(Class::from_name("prefixed_id"), Some(Class::PrefixedId));
        assert_eq!(Class::from_name("nope"), None);
    }

    #[test]
    fn non_ascii_text_is_safe() {
        assert_eq!(tool("fehler — 503 über 12 ms…"), "fehler — # über # ms…");
        assert_eq!(tool("日本 2026-11-23t13:40:01z"), "日本 <datetime>");
    }

    #[test]
    fn epochs_only_in_tool_results_and_hex_needs_digits_and_letters() {
        // A 10-digit number a user or the model writes is a quantity or an
        // id, not a clock reading.
        assert_eq!(
            text("invoice 1732370401 is due"),
            "invoice 1732370401 is due"
        );
        assert_eq!(tool("expires 1732370401"), "expires <epoch>");
        // Sixteen digits are a number (a card, an order), sixteen letters a
        // word; a hash mixes both.
        for s in ["order 4111111111111111", "deadbeefcafebabe"] {
            assert_eq!(text(s), s, "{s}");
        }
        assert_eq!(text("commit 4111111111111111a"), "commit <hex>");
    }

    #[test]
    fn masking_never_lengthens_text() {
        for s in ["1 2 3 4 5", "took 5 ms", "a1 b2", "2026-11-23 and 7"] {
            assert!(tool(s).len() <= s.len(), "{s}");
        }
    }

    #[test]
    fn a_digest_is_the_masked_texts_and_keeps_what_it_is_told() {
        let a = "order 3f2a9c1e-7b4d-4e8a-9f01-23456789abcd failed at 2026-11-23t13:40:01z";
        let b = "order 0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9 failed at 2026-11-23t13:40:09z";
        let none = |_: &str| false;
        let digest = |s| masked_digest(s, Classes::all(), Context::ToolResult, &none);
        assert_eq!(digest(a), digest(b));
        assert_eq!(
            digest(a),
            masked_digest(&tool(a), Classes::NONE, Context::ToolResult, &none)
        );
        // The ids the call's arguments name are kept: two orders differ.
        let named = tokens(
            r#"{"order":"3f2a9c1e-7b4d-4e8a-9f01-23456789abcd"}"#,
            Classes::all(),
            Context::Arguments,
        );
        assert_eq!(named, ["3f2a9c1e-7b4d-4e8a-9f01-23456789abcd"]);
        let keep = |t: &str| named.iter().any(|n| n.eq_ignore_ascii_case(t));
        assert_ne!(
            masked_digest(a, Classes::all(), Context::ToolResult, &keep),
            masked_digest(b, Classes::all(), Context::ToolResult, &keep)
        );
    }

    #[test]
    fn masking_in_place_remembers_the_word_it_overwrote() {
        // "1" becomes "#" in place; the id after it is still inside the
        // word "1xreq_...", so it is no prefixed id.
        let text = "1xreq_8f3ak29dlm01 took 5 ms";
        let mut in_place = text.to_string();
        replace(&mut in_place, Classes::all(), Context::ToolResult);
        assert_eq!(in_place, "#xreq_#f#ak#dlm# took # ms");
        assert_eq!(in_place, tool(text));
    }

    const PIECES: [&str; 18] = [
        "1",
        "42",
        "1,843.5",
        "2026-11-23",
        "t13:40:01z",
        "T13:40:01.123+01:00",
        " ",
        "-",
        "req_",
        "8f3ak29dlm01",
        "3f2a9c1e-7b4d-4e8a-9f01-23456789abcd",
        "9f86d081884c7d659a2feaa0c55ad015",
        "1732370401",
        "ms",
        "é",
        "x",
        "_",
        ".",
    ];

    proptest::proptest! {
        /// Masking in place (over the text as it is read) gives what the
        /// copying mask gives, in every context.
        #[test]
        fn masking_in_place_equals_masking_by_copy(
            picks in proptest::collection::vec(0usize..PIECES.len(), 0..40),
            context in 0usize..3,
        ) {
            let text: String = picks.iter().filter_map(|&i| PIECES.get(i).copied()).collect();
            let context = [Context::Text, Context::ToolResult, Context::Arguments]
                .get(context)
                .copied()
                .unwrap_or(Context::Text);
            let copied = mask(&text, Classes::all(), context).into_owned();
            let mut in_place = text.clone();
            replace(&mut in_place, Classes::all(), context);
            proptest::prop_assert_eq!(in_place, copied);
        }
    }
}
