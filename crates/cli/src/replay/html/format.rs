//! Text for numbers and times: counts with separators, UTC dates, clock times, durations.

/// A count with thousands separators: 45,678.
pub(super) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    let len = digits.len();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (len - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(super) fn opt_count(n: Option<u64>) -> String {
    n.map(count).unwrap_or_else(|| "—".to_string())
}

pub(super) fn tokens_text(tokens: Option<u64>, estimated: bool) -> String {
    match (tokens, estimated) {
        (Some(t), true) => format!("{} (estimate)", count(t)),
        (Some(t), false) => count(t),
        (None, _) => "—".to_string(),
    }
}

/// Days since 1970-01-01 as (year, month, day): the core's calendar.
fn civil(days: i64) -> (i64, u64, u64) {
    let (year, month, day) = loopguard_core::act::events::civil(days);
    (
        year,
        u64::try_from(month).unwrap_or(0),
        u64::try_from(day).unwrap_or(0),
    )
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
pub(super) fn utc(ms: u64) -> String {
    let secs = ms / 1_000;
    let (y, m, d) = civil(i64::try_from(secs / 86_400).unwrap_or(0));
    format!("{y:04}-{m:02}-{d:02} {} UTC", clock(ms))
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS.mmm UTC`.
pub(super) fn utc_ms(ms: u64) -> String {
    let secs = ms / 1_000;
    let (y, m, d) = civil(i64::try_from(secs / 86_400).unwrap_or(0));
    let sod = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03} UTC",
        sod / 3_600,
        sod / 60 % 60,
        sod % 60,
        ms % 1_000
    )
}

/// The time of day of `ms`, `HH:MM:SS` (UTC).
pub(super) fn clock(ms: u64) -> String {
    let sod = ms / 1_000 % 86_400;
    format!("{:02}:{:02}:{:02}", sod / 3_600, sod / 60 % 60, sod % 60)
}

/// A length of time, roughly: `850 ms`, `12.5 s`, `3 min 5 s`, `2 h 10 min`.
pub(super) fn duration(ms: u64) -> String {
    let secs = ms / 1_000;
    if ms < 1_000 {
        format!("{ms} ms")
    } else if secs < 60 {
        format!("{}.{} s", secs, ms % 1_000 / 100)
    } else if secs < 3_600 {
        format!("{} min {} s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{} h {} min", secs / 3_600, secs / 60 % 60)
    } else {
        format!("{} d {} h", secs / 86_400, secs / 3_600 % 24)
    }
}
