//! Numbers that are noise: what a time, an attempt or an id is counted
//! in (`attempt 4`, `latency_ms: 31`, `nov 23`), a time of day, a
//! duration. Numbers that carry meaning (an amount, a count, a version)
//! are kept.

use super::shapes::{byte, digit, digits_end, ends, fraction_end, is_alnum, number_end, run, skip};

/// Words after which a number is noise: times, attempts, ids (`attempt
/// 4`, `latency_ms: 31`, `pid 2231`, `retry budget 4/10`), and the names
/// of months and weekdays (`Nov 23`, `Thu, 05 Nov 2026`). `may` is left
/// out: it is a verb far more often than a month. Sorted (a binary
/// search per word; a test keeps it so).
pub(super) const NOISE_KEYS: &[&[u8]] = &[
    b"apr",
    b"april",
    b"attempt",
    b"attempts",
    b"aug",
    b"august",
    b"backoff",
    b"deadline",
    b"dec",
    b"december",
    b"delay",
    b"duration",
    b"elapsed",
    b"feb",
    b"february",
    b"fri",
    b"friday",
    b"jan",
    b"january",
    b"jul",
    b"july",
    b"jun",
    b"june",
    b"latency",
    b"mar",
    b"march",
    b"mon",
    b"monday",
    b"nonce",
    b"nov",
    b"november",
    b"oct",
    b"october",
    b"pid",
    b"port",
    b"req",
    b"request",
    b"retries",
    b"retry",
    b"sat",
    b"saturday",
    b"sep",
    b"sept",
    b"september",
    b"seq",
    b"session",
    b"span",
    b"sun",
    b"sunday",
    b"thread",
    b"thu",
    b"thur",
    b"thurs",
    b"thursday",
    b"tid",
    b"time",
    b"timestamp",
    b"took",
    b"trace",
    b"tries",
    b"try",
    b"ts",
    b"tue",
    b"tues",
    b"tuesday",
    b"uptime",
    b"wait",
    b"waited",
    b"wed",
    b"wednesday",
    b"worker",
];

/// Units of time a number may carry (`1843 ms`, `1.04s`, `5 seconds`,
/// `30 Sekunden`, `2 horas`). `m` alone is left out (minutes, metres or
/// millions); it counts inside a compound duration (`10m07s`).
pub(super) const TIME_UNITS: &[&str] = &[
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
pub(super) const TIME_UNITS_UNSPACED: &[&str] = &[
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

pub(super) fn names_noise(word: &[u8]) -> bool {
    // Most words are longer than any key, or start with a letter none
    // starts with: answered without a comparison.
    let (len, first) = (word.len(), word.first().map_or(0, u8::to_ascii_lowercase));
    if !(2..=9).contains(&len) || !(b'a'..=b'w').contains(&first) {
        return false;
    }
    let lengths = LENGTHS_BY_LETTER
        .get(usize::from(first - b'a'))
        .copied()
        .unwrap_or(0);
    if lengths >> len & 1 == 0 {
        // No key of this length starts with this letter.
        return false;
    }
    // Zero-padded as `pack` pads.
    let mut lower = [0u8; 16];
    for (d, c) in lower.iter_mut().zip(word) {
        *d = c.to_ascii_lowercase();
    }
    NOISE_PACKED
        .binary_search(&u128::from_be_bytes(lower))
        .is_ok()
}

/// Per letter `a`..`z`, the lengths of the [`NOISE_KEYS`] starting with it
/// (bit `n` for length `n`): most words are answered without a search.
pub(super) const LENGTHS_BY_LETTER: [u16; 26] = lengths_by_letter(NOISE_KEYS);

const fn lengths_by_letter(keys: &[&[u8]]) -> [u16; 26] {
    let mut out = [0u16; 26];
    let mut src = keys;
    while let [k, rest @ ..] = src {
        if let [first, ..] = k {
            let mut slot: &mut [u16] = &mut out;
            let mut letter = b'a';
            while let [s, tail @ ..] = slot {
                if letter == *first {
                    *s |= 1 << k.len();
                }
                letter += 1;
                slot = tail;
            }
        }
        src = rest;
    }
    out
}

/// [`NOISE_KEYS`] packed into integers (see [`pack`]), in the same order:
/// a binary search compares integers, not byte strings.
pub(super) const NOISE_PACKED: [u128; NOISE_KEYS.len()] = pack_all(NOISE_KEYS);

/// A word of at most 16 bytes as an integer, its bytes big-endian and
/// zero-padded: two words compare as integers as they do as byte strings
/// (no key holds a zero byte), and are equal only when they are.
pub(super) const fn pack(w: &[u8]) -> u128 {
    let mut v = 0u128;
    let mut n = 0u32;
    let mut rest = w;
    while let [c, tail @ ..] = rest {
        v = (v << 8) | *c as u128;
        n += 1;
        rest = tail;
    }
    match v.checked_shl(8 * (16 - n)) {
        Some(v) => v,
        None => 0,
    }
}

const fn pack_all<const N: usize>(keys: &[&[u8]]) -> [u128; N] {
    let mut out = [0u128; N];
    let mut dst: &mut [u128] = &mut out;
    let mut src = keys;
    while let ([d, dst_rest @ ..], [k, src_rest @ ..]) = (dst, src) {
        *d = pack(k);
        dst = dst_rest;
        src = src_rest;
    }
    out
}

/// Whether the number at `i` (a word start) is noise, and where the masked
/// part ends: a time of day (`13:40:01`, all of it), a compound duration
/// (`10m07s`, all of it), a number with a unit of time after it (the
/// number), or any number right after a word that names a time, an
/// attempt or an id (`keyed`).
pub(super) fn noise_number(b: &[u8], i: usize, keyed: bool) -> Option<usize> {
    if let Some(end) = clock_time(b, i).or_else(|| compound_duration(b, i)) {
        return Some(end);
    }
    let end = number_end(b, i);
    if time_unit_at(b, end) || budget_at(b, end) {
        return Some(end);
    }
    // After a key, a number standing alone (`worker 31bd07aa` is an id
    // that starts with digits, not a number).
    (keyed && !is_alnum(b, end)).then_some(end)
}

/// A unit of time at `p`, directly or after one space, ending its word.
pub(super) fn time_unit_at(b: &[u8], p: usize) -> bool {
    let p = if b.get(p) == Some(&b' ') { p + 1 } else { p };
    // `µs`: U+00B5 then `s`.
    if b.get(p..p + 3) == Some(&[0xC2, 0xB5, b's'][..]) {
        return !is_alnum(b, p + 3);
    }
    let rest = b.get(p..).unwrap_or_default();
    TIME_UNITS_UNSPACED
        .iter()
        .any(|u| rest.starts_with(u.as_bytes()))
        || word_of(b, p, TIME_UNITS).is_some()
}

/// The end of the word of letters at `p` when it is one of `words` (case
/// aside).
fn word_of(b: &[u8], p: usize, words: &[&str]) -> Option<usize> {
    let q = skip(b, p, u8::is_ascii_alphabetic);
    let word = b.get(p..q)?;
    let known = words
        .iter()
        .any(|w| w.as_bytes().eq_ignore_ascii_case(word));
    (known && !is_alnum(b, q)).then_some(q)
}

/// What an agent's harness counts down every turn, whatever the task
/// does: `4 steps left`, `12 turns remaining`.
const BUDGET_NOUNS: &[&str] = &[
    "step",
    "steps",
    "turn",
    "turns",
    "attempt",
    "attempts",
    "try",
    "tries",
    "iteration",
    "iterations",
    "round",
    "rounds",
    "call",
    "calls",
    "request",
    "requests",
];

/// A budget noun at `p` (after one space) followed by `left` or
/// `remaining`: the number before it counts down the agent's budget, not
/// its progress.
pub(super) fn budget_at(b: &[u8], p: usize) -> bool {
    byte(b, p, b' ')
        .and_then(|p| word_of(b, p, BUDGET_NOUNS))
        .and_then(|q| byte(b, q, b' '))
        .and_then(|r| word_of(b, r, &["left", "remaining"]))
        .is_some()
}

/// `h:mm`, `hh:mm`, `hh:mm:ss`, with a fraction: a time of day (hours up to
/// 23, minutes and seconds up to 59). `16:9` or `88:50` are not.
pub(super) fn clock_time(b: &[u8], i: usize) -> Option<usize> {
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
        p = fraction_end(b, q);
    }
    ends(b, p)
}

/// The value of one or two digits.
pub(super) fn two_digit_value(d: &[u8]) -> Option<u32> {
    if d.is_empty() || d.len() > 2 {
        return None;
    }
    Some(d.iter().fold(0, |v, c| v * 10 + u32::from(c - b'0')))
}

/// Two or more `<digits><unit>` parts of `h`, `m`, `s` or `ms` run
/// together: `10m07s`, `1h30m`, `2m3.5s`.
pub(super) fn compound_duration(b: &[u8], i: usize) -> Option<usize> {
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
