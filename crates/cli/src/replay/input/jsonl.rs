//! loopguard's own traffic format, JSON Lines: one request a line,
//! read as a stream (a day of traffic never sits in memory).
//!
//! ```json
//! {"timestamp": "2026-11-25T18:33:44.123Z", "method": "POST", "path": "/v1/chat/completions",
//!  "headers": {"authorization": "Bearer sk-..."}, "body_json": {"model": "gpt-4o", "messages": []},
//!  "response": {"status": 200, "usage": {"prompt_tokens": 812, "completion_tokens": 40}}}
//! ```
//!
//! The request fields are `explain --request`'s (`method`, `path`,
//! `authority`, `headers`, `body` or `body_json`, `route`, `route_policy`,
//! `source_address`, `verified_claims`); `timestamp` (RFC 3339, or seconds
//! or milliseconds since the epoch) is required; `response` is optional
//! (`status`, and `usage` as the provider reported it, or the response
//! `body` to read it from). Blank lines and lines starting with `#` are
//! skipped silently.

use super::time;
use crate::replay::record::{Answer, Entry, Recorded, Skipped, Usage};
use crate::request_file;
use serde_json::Value;
use std::io::BufRead;

/// The entries of a JSON Lines stream, one per line.
pub struct Lines<R> {
    file: String,
    reader: R,
    line: usize,
    buf: Vec<u8>,
    /// A read failed: the rest of the file is not read.
    failed: bool,
}

impl<R: BufRead> Lines<R> {
    pub fn new(file: &str, reader: R) -> Self {
        Lines {
            file: file.to_string(),
            reader,
            line: 0,
            buf: Vec::new(),
            failed: false,
        }
    }
}

impl<R: BufRead> Iterator for Lines<R> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        if self.failed {
            return None;
        }
        loop {
            self.buf.clear();
            self.line += 1;
            let place = format!("{}:{}", self.file, self.line);
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(e) => {
                    // The file went away or the disk failed: report where,
                    // and stop reading this file.
                    self.failed = true;
                    let reason = format!("cannot read: {e}; the rest of the file is skipped");
                    return Some(Err(Skipped { place, reason }));
                }
            }
            let Ok(text) = std::str::from_utf8(&self.buf) else {
                let reason = "not UTF-8 text (JSON Lines are UTF-8)".to_string();
                return Some(Err(Skipped { place, reason }));
            };
            let text = text.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            return Some(parse_line(&place, text));
        }
    }
}

/// One line: a request with its time, and the response if recorded.
pub fn parse_line(place: &str, text: &str) -> Entry {
    let skip = |reason: String| {
        Err(Skipped {
            place: place.to_string(),
            reason,
        })
    };
    let mut v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return skip(format!("not JSON: {e}")),
    };
    let Some(obj) = v.as_object_mut() else {
        return skip("must be a JSON object (one request a line)".to_string());
    };
    let at_ms = match obj.remove("timestamp") {
        None | Some(Value::Null) => return skip("timestamp is required".to_string()),
        Some(t) => match time::from_json(&t) {
            Ok(ms) => ms,
            Err(e) => return skip(format!("timestamp: {e}")),
        },
    };
    let response = match obj.remove("response") {
        None | Some(Value::Null) => None,
        Some(r) => match answer(&r) {
            Ok(a) => Some(a),
            Err(e) => return skip(format!("response.{e}")),
        },
    };
    match request_file::from_value(place, &v) {
        Ok(mut request) => {
            request.notes.clear();
            Ok(Recorded {
                at_ms,
                request,
                response,
                place: place.to_string(),
            })
        }
        Err(e) => skip(e.strip_prefix(&format!("{place}: ")).unwrap_or(&e).to_string()),
    }
}

/// `response`: `status`, and `usage` or a `body` to read usage from.
fn answer(r: &Value) -> Result<Answer, String> {
    let obj = r
        .as_object()
        .ok_or_else(|| "must be an object with status and usage".to_string())?;
    const KNOWN: [&str; 3] = ["status", "usage", "body"];
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("{k} is not a known field ({})", KNOWN.join(", ")));
    }
    let status = match obj.get("status") {
        None | Some(Value::Null) => None,
        Some(s) => Some(
            s.as_u64()
                .filter(|s| (100..=999).contains(s))
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| format!("status must be an HTTP status code (got {s})"))?,
        ),
    };
    let usage = match (obj.get("usage"), obj.get("body")) {
        (Some(u), _) if !u.is_null() => Some(Usage::from_json(u).ok_or_else(|| {
            "usage must hold input_tokens/output_tokens or prompt_tokens/completion_tokens"
                .to_string()
        })?),
        (_, Some(Value::String(b))) => Usage::in_body(b.as_bytes()),
        (_, Some(b)) if !b.is_null() => Usage::in_body(b.to_string().as_bytes()),
        _ => None,
    };
    Ok(Answer { status, usage })
}
