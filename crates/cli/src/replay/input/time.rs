//! Timestamps as traffic files write them: RFC 3339 / ISO 8601 text (HAR's
//! `startedDateTime`), or numbers of seconds or milliseconds since the Unix
//! epoch.

use serde_json::Value;

/// Milliseconds since the epoch of a JSON timestamp: a number (seconds
/// with a fraction below 10^11, milliseconds from there up) or RFC 3339
/// text.
pub fn from_json(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().ok_or("is not a number")?;
            if !(f.is_finite() && f >= 0.0) {
                return Err(format!("{n} is not a time since the epoch"));
            }
            Ok(if f < 1e11 {
                (f * 1000.0).round() as u64
            } else {
                f.round() as u64
            })
        }
        Value::String(s) => rfc3339(s),
        other => Err(format!(
            "must be RFC 3339 text or a number of seconds or milliseconds since the epoch (got {other})"
        )),
    }
}

/// `2026-11-25T18:33:44.123Z`, `2026-11-25T19:33:44+01:00`, with `T` or a
/// space, any number of fraction digits (read to the millisecond).
pub fn rfc3339(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not an RFC 3339 time (like 2026-11-25T18:33:44.123Z)");
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Result<i64, String> {
        let part = s.get(from..from + len).ok_or_else(bad)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse::<i64>().map_err(|_| bad())
    };
    let sep = |at: usize, want: &[u8]| b.get(at).is_some_and(|c| want.contains(c));
    if !(sep(4, b"-") && sep(7, b"-") && sep(10, b"Tt ") && sep(13, b":") && sep(16, b":")) {
        return Err(bad());
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let mut at = 19;
    let mut millis = 0i64;
    if sep(at, b".,") {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return Err(bad());
        }
        let digits = s.get(start..at).ok_or_else(bad)?;
        let first3: String = digits.chars().chain("000".chars()).take(3).collect();
        millis = first3.parse::<i64>().map_err(|_| bad())?;
    }
    let offset_min = match s.get(at..) {
        Some("Z") | Some("z") => 0,
        Some(z)
            if z.len() == 6 && (z.starts_with('+') || z.starts_with('-')) && sep(at + 3, b":") =>
        {
            let minutes = num(at + 1, 2)? * 60 + num(at + 4, 2)?;
            if z.starts_with('-') {
                -minutes
            } else {
                minutes
            }
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_min * 60;
    let ms = secs * 1000 + millis;
    u64::try_from(ms).map_err(|_| format!("{s:?} is before 1970"))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rfc3339_forms() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(rfc3339("2026-11-25T18:33:44.123Z"), Ok(1_795_631_624_123));
        assert_eq!(
            rfc3339("2026-11-25T19:33:44.123+01:00"),
            Ok(1_795_631_624_123)
        );
        assert_eq!(
            rfc3339("2026-11-25 18:33:44.1234567Z"),
            Ok(1_795_631_624_123)
        );
        assert_eq!(rfc3339("2000-02-29T12:00:00-00:30"), Ok(951_827_400_000));
        for bad in [
            "2026-11-25",
            "2026-13-01T00:00:00Z",
            "2026-11-25T18:33:44",
            "x",
            "2026-11-25T18:33:44.Z",
        ] {
            assert!(rfc3339(bad).is_err(), "{bad}");
        }
        assert!(rfc3339("1969-12-31T23:59:59Z")
            .unwrap_err()
            .contains("before 1970"));
    }

    #[test]
    fn numbers_are_seconds_or_milliseconds() {
        assert_eq!(from_json(&json!(1_795_631_624.5)), Ok(1_795_631_624_500));
        assert_eq!(
            from_json(&json!(1_795_631_624_123u64)),
            Ok(1_795_631_624_123)
        );
        assert_eq!(
            from_json(&json!("2026-11-25T18:33:44.123Z")),
            Ok(1_795_631_624_123)
        );
        assert!(from_json(&json!(-1)).is_err());
        assert!(from_json(&json!(true)).is_err());
    }
}
