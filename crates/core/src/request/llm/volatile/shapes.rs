//! The shapes of volatile tokens, each read from a word start only as far
//! as its own shape: UUIDs, dates and times, epochs, hex runs, prefixed
//! ids, numbers.

use super::{Class, Classes, Context};

/// The volatile token starting at `i` (a word start), if any: where the
/// masked part starts (a prefixed id keeps its prefix) and ends, and its
/// placeholder.
pub(super) fn token(
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

pub(super) fn is_alnum(b: &[u8], i: usize) -> bool {
    b.get(i).is_some_and(u8::is_ascii_alphanumeric)
}

/// The end of the ASCII word (letters and digits) starting at `i`.
pub(super) fn word_end(b: &[u8], i: usize) -> usize {
    skip(b, i, u8::is_ascii_alphanumeric).max(1)
}

/// Past the bytes from `i` that satisfy `f`.
pub(super) fn skip(b: &[u8], mut i: usize, f: impl Fn(&u8) -> bool) -> usize {
    while b.get(i).is_some_and(&f) {
        i += 1;
    }
    i
}

/// `n` bytes from `i` satisfying `f`; the position after them.
pub(super) fn run(b: &[u8], i: usize, n: usize, f: impl Fn(u8) -> bool) -> Option<usize> {
    let s = b.get(i..i + n)?;
    s.iter().all(|&c| f(c)).then_some(i + n)
}

pub(super) fn hex(c: u8) -> bool {
    c.is_ascii_hexdigit()
}

pub(super) fn digit(c: u8) -> bool {
    c.is_ascii_digit()
}

pub(super) fn byte(b: &[u8], i: usize, want: u8) -> Option<usize> {
    (b.get(i) == Some(&want)).then_some(i + 1)
}

/// A token must not run on into a longer word.
pub(super) fn ends(b: &[u8], end: usize) -> Option<usize> {
    (!is_alnum(b, end)).then_some(end)
}

pub(super) fn uuid(b: &[u8], i: usize) -> Option<usize> {
    let mut p = run(b, i, 8, hex)?;
    for n in [4, 4, 4, 12] {
        p = byte(b, p, b'-')?;
        p = run(b, p, n, hex)?;
    }
    ends(b, p)
}

/// `yyyy-mm-dd`, optionally followed by `t` or a space and `hh:mm`,
/// `:ss`, a fraction and a zone (`z`, `+hh:mm`, `+hhmm`, `+hh`). Returns
/// the end and whether a time was there.
pub(super) fn date_time(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut p = run(b, i, 4, digit)?;
    for _ in 0..2 {
        p = byte(b, p, b'-')?;
        p = run(b, p, 2, digit)?;
    }
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
pub(super) fn time_of_day(b: &[u8], i: usize) -> Option<usize> {
    let mut p = run(b, i, 2, digit)?;
    p = byte(b, p, b':')?;
    p = run(b, p, 2, digit)?;
    if let Some(q) = byte(b, p, b':').and_then(|q| run(b, q, 2, digit)) {
        p = fraction_end(b, q);
    }
    match b.get(p) {
        Some(b'z' | b'Z') => Some(p + 1),
        Some(b'+' | b'-') => {
            let q = run(b, p + 1, 2, digit)?;
            let r = byte(b, q, b':').unwrap_or(q);
            Some(run(b, r, 2, digit).unwrap_or(q))
        }
        _ => Some(p),
    }
}

/// Past a fraction (`.` or `,` then digits) at `p`, if there is one.
pub(super) fn fraction_end(b: &[u8], p: usize) -> usize {
    b.get(p)
        .filter(|c| matches!(c, b'.' | b','))
        .and_then(|_| digits_end(b, p + 1))
        .unwrap_or(p)
}

/// The end of a run of at least one digit from `i`.
pub(super) fn digits_end(b: &[u8], i: usize) -> Option<usize> {
    let p = skip(b, i, u8::is_ascii_digit);
    (p > i).then_some(p)
}

/// 10 digits (seconds) or 13 (milliseconds) in 2001..2036, optionally with
/// a fraction (`1732370401.123`).
pub(super) fn epoch(b: &[u8], i: usize) -> Option<usize> {
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
    let fraction = byte(b, end, b'.').and_then(|p| digits_end(b, p));
    ends(b, fraction.unwrap_or(end))
}

/// 16 or more hex digits, with both digits and letters.
pub(super) fn hex_run(b: &[u8], i: usize) -> Option<usize> {
    // Both kinds: sixteen digits are a number (an order, a card), sixteen
    // letters a word; a digest mixes them.
    let (p, mixed) = mixed_run(b, i, u8::is_ascii_hexdigit);
    (p - i >= 16 && mixed).then_some(p).and_then(|e| ends(b, e))
}

/// 1-12 letters, `_` or `-`, then 10+ letters and digits with both kinds:
/// where the random part starts and ends.
pub(super) fn prefixed_id(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let p = skip(b, i, u8::is_ascii_alphabetic);
    if p - i > 12 || !matches!(b.get(p), Some(b'_' | b'-')) {
        return None;
    }
    let start = p + 1;
    let (q, mixed) = mixed_run(b, start, u8::is_ascii_alphanumeric);
    (q - start >= 10 && mixed).then_some((start, q))
}

/// Past the bytes from `i` that satisfy `f`, and whether they hold both
/// digits and letters (one pass).
fn mixed_run(b: &[u8], i: usize, f: impl Fn(&u8) -> bool) -> (usize, bool) {
    let (mut p, mut digits, mut letters) = (i, false, false);
    while let Some(c) = b.get(p).filter(|c| f(c)) {
        digits |= c.is_ascii_digit();
        letters |= c.is_ascii_alphabetic();
        p += 1;
    }
    (p, digits && letters)
}

/// The end of a number from `i`: digits, with `.` or `,` between digit
/// groups (`1,843.5`).
pub(super) fn number_end(b: &[u8], i: usize) -> usize {
    let mut p = i;
    loop {
        p = skip(b, p, u8::is_ascii_digit);
        let sep = matches!(b.get(p), Some(b'.' | b','));
        if sep && b.get(p + 1).is_some_and(u8::is_ascii_digit) {
            p += 1;
        } else {
            return p;
        }
    }
}
