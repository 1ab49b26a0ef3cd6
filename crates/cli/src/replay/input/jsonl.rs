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
//! (`status`; `usage` as the provider reported it, or the response `body`
//! to read it from; `content_type`, and `body_truncated` when the body is
//! only the start of what was sent: the body goes through the response
//! path, where an MCP result is read). Blank lines and lines starting with
//! `#` are skipped silently.

use super::time;
use crate::replay::record::{usage_in_body, Answer, Entry, Recorded, Skipped, Usage};
use crate::request_file;
use serde_json::Value;
use std::collections::VecDeque;
use std::io::BufRead;

/// Bytes of lines parsed together: one JSON parser reads a batch, so its
/// buffer for unescaping strings (a 16 KB body is escaped text) grows once,
/// not once a line. Memory stays bounded by the batch.
const BATCH_BYTES: usize = 1 << 20;

/// The entries of a JSON Lines stream, one per line.
pub struct Lines<R> {
    file: String,
    reader: R,
    line: usize,
    buf: Vec<u8>,
    /// A read failed: the rest of the file is not read.
    failed: bool,
    /// The lines of the batch being read, and where each starts in it
    /// (with its line number).
    batch: String,
    starts: Vec<(usize, usize)>,
    /// Entries read, not yet taken.
    ready: VecDeque<Entry>,
}

impl<R: BufRead> Lines<R> {
    pub fn new(file: &str, reader: R) -> Self {
        Lines {
            file: file.to_string(),
            reader,
            line: 0,
            buf: Vec::new(),
            failed: false,
            batch: String::new(),
            starts: Vec::new(),
            ready: VecDeque::new(),
        }
    }

    fn place(&self, line: usize) -> String {
        format!("{}:{line}", self.file)
    }

    /// Read the next batch of lines into `ready`.
    fn fill(&mut self) {
        self.batch.clear();
        self.starts.clear();
        let mut after_batch = None;
        while !self.failed && self.batch.len() < BATCH_BYTES {
            self.buf.clear();
            self.line += 1;
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    // The file went away or the disk failed: report where,
                    // and stop reading this file.
                    self.failed = true;
                    let reason = format!("cannot read: {e}; the rest of the file is skipped");
                    after_batch = Some(Skipped {
                        place: self.place(self.line),
                        reason,
                    });
                    break;
                }
            }
            let Ok(text) = std::str::from_utf8(&self.buf) else {
                let reason = "not UTF-8 text (JSON Lines are UTF-8)".to_string();
                after_batch = Some(Skipped {
                    place: self.place(self.line),
                    reason,
                });
                break;
            };
            let text = text.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            self.starts.push((self.batch.len(), self.line));
            self.batch.push_str(text);
            self.batch.push('\n');
        }
        self.parse_batch();
        if let Some(s) = after_batch {
            self.ready.push_back(Err(s));
        }
    }

    /// Parse the batch, one entry per line; a line that is not one JSON
    /// value is reported alone and the parser starts again after it.
    fn parse_batch(&mut self) {
        let mut k = 0;
        while let Some(&(from, _)) = self.starts.get(k) {
            let rest = self.batch.get(from..).unwrap_or("");
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            while let Some(&(start, line)) = self.starts.get(k) {
                let end = self.starts.get(k + 1).map_or(self.batch.len(), |s| s.0);
                match values.next() {
                    None => {
                        k = self.starts.len();
                        break;
                    }
                    Some(Ok(v))
                        if self
                            .batch
                            .get(from + values.byte_offset()..end)
                            .is_some_and(|after| after.trim().is_empty()) =>
                    {
                        self.ready.push_back(from_fields(&self.place(line), v));
                        k += 1;
                    }
                    // Not one value on this line (a broken line, or one
                    // value over several): this line alone says why.
                    Some(_) => {
                        let text = self.batch.get(start..end).unwrap_or("").trim();
                        self.ready.push_back(parse_line(&self.place(line), text));
                        k += 1;
                        break;
                    }
                }
            }
        }
    }
}

impl<R: BufRead> Iterator for Lines<R> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        while self.ready.is_empty() {
            if self.failed {
                return None;
            }
            let line = self.line;
            self.fill();
            if self.ready.is_empty() && self.line == line + 1 {
                // Nothing more in the file.
                return None;
            }
        }
        self.ready.pop_front()
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
    match serde_json::from_str(text) {
        Ok(v) => from_fields(place, v),
        Err(e) => skip(format!("not JSON: {e}")),
    }
}

/// A line's JSON value: its time, response and request.
fn from_fields(place: &str, mut v: Value) -> Entry {
    let skip = |reason: String| {
        Err(Skipped {
            place: place.to_string(),
            reason,
        })
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
    // A text body moves into the request (it is most of the line).
    let no_method = obj.get("method").is_none_or(Value::is_null);
    let body = match obj.get("body") {
        Some(Value::String(_)) if !obj.contains_key("body_json") => match obj.remove("body") {
            Some(Value::String(b)) => Some(b),
            _ => None,
        },
        _ => None,
    };
    match request_file::from_value(place, &v) {
        Ok(mut request) => {
            request.notes.clear();
            if let Some(b) = body {
                // Without a method, a request with a body is a POST.
                if no_method && !b.is_empty() {
                    request.method = "POST".to_string();
                }
                request.body = b.into_bytes();
            }
            Ok(Recorded {
                at_ms,
                request,
                response,
                place: place.to_string(),
            })
        }
        Err(e) => skip(
            e.strip_prefix(&format!("{place}: "))
                .unwrap_or(&e)
                .to_string(),
        ),
    }
}

/// `response`: `status`, `usage` (else read from `body`), and the body
/// with its `content_type` for the response path.
fn answer(r: &Value) -> Result<Answer, String> {
    let obj = r
        .as_object()
        .ok_or_else(|| "must be an object with status and usage".to_string())?;
    const KNOWN: [&str; 5] = ["status", "usage", "body", "content_type", "body_truncated"];
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
    // A text body is its bytes; any other JSON value is sent compactly.
    let body: Option<Vec<u8>> = match obj.get("body") {
        None | Some(Value::Null) => None,
        Some(Value::String(b)) => Some(b.as_bytes().to_vec()),
        Some(b) => Some(b.to_string().into_bytes()),
    };
    let usage = match obj.get("usage") {
        Some(u) if !u.is_null() => Some(Usage::from_json(u).ok_or_else(|| {
            "usage must hold input_tokens/output_tokens or prompt_tokens/completion_tokens"
                .to_string()
        })?),
        _ => body.as_deref().and_then(usage_in_body),
    };
    let content_type = match obj.get("content_type") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) => Some(c.clone()),
        Some(other) => return Err(format!("content_type must be a string (got {other})")),
    };
    let cut = match obj.get("body_truncated") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(format!(
                "body_truncated must be true or false (got {other})"
            ))
        }
    };
    let mut answer = Answer {
        status,
        usage,
        ..Answer::default()
    };
    if let Some(b) = body {
        // Without a content type, the body tells: a JSON object, else an
        // event stream (as usage is read).
        answer.content_type = content_type.or_else(|| {
            Some(if b.trim_ascii_start().starts_with(b"{") {
                "application/json".to_string()
            } else {
                "text/event-stream".to_string()
            })
        });
        answer.keep_body(b, cut);
    } else {
        answer.content_type = content_type;
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_all(text: &str) -> Vec<String> {
        Lines::new("f", std::io::Cursor::new(text.as_bytes().to_vec()))
            .map(|e| match e {
                Ok(r) => format!(
                    "{} {} {} {}",
                    r.place,
                    r.request.method,
                    r.request.path,
                    String::from_utf8_lossy(&r.request.body)
                ),
                Err(s) => format!("{} skipped: {}", s.place, s.reason),
            })
            .collect()
    }

    #[test]
    fn lines_keep_their_numbers_through_comments_and_broken_lines() {
        let text = "# a comment\n\n{\"timestamp\": 1, \"path\": \"/a\", \"body\": \"{\\\"x\\\":1}\"}\n{nope\n{\"timestamp\": 2, \"path\": \"/b\"}\n{\"timestamp\": 3,\n\"path\": \"/c\"}\n{\"timestamp\": 4, \"path\": \"/d\"} {\"timestamp\": 5, \"path\": \"/e\"}\n{\"timestamp\": 6, \"method\": \"get\", \"path\": \"/f\"}";
        let got = read_all(text);
        assert_eq!(got[0], "f:3 POST /a {\"x\":1}");
        assert!(got[1].starts_with("f:4 skipped: not JSON"), "{}", got[1]);
        assert_eq!(got[2], "f:5 GET /b ");
        assert!(got[3].starts_with("f:6 skipped: not JSON"), "{}", got[3]);
        assert!(got[4].starts_with("f:7 skipped: not JSON"), "{}", got[4]);
        assert!(got[5].starts_with("f:8 skipped: not JSON"), "{}", got[5]);
        assert_eq!(got[6], "f:9 GET /f ");
        assert_eq!(got.len(), 7, "{got:?}");
        let mut bad = b"{\"timestamp\": 1, \"path\": \"/a\"}\n".to_vec();
        bad.extend_from_slice(b"\xff\xfe\n{\"timestamp\": 2, \"path\": \"/b\"}\n");
        let got: Vec<String> = Lines::new("g", std::io::Cursor::new(bad))
            .map(|e| {
                e.map(|r| r.place)
                    .unwrap_or_else(|s| format!("{} {}", s.place, s.reason))
            })
            .collect();
        assert_eq!(
            got,
            ["g:1", "g:2 not UTF-8 text (JSON Lines are UTF-8)", "g:3"]
        );
    }

    #[test]
    fn batches_hold_many_lines_in_order() {
        let line = json!({"timestamp": 1, "path": "/p", "body": "y".repeat(5000)}).to_string();
        let text = (0..600)
            .map(|_| line.clone())
            .collect::<Vec<_>>()
            .join("\n");
        let got = read_all(&text);
        assert_eq!(got.len(), 600);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, g)| g.starts_with(&format!("f:{} POST /p y", i + 1))));
    }

    #[test]
    fn bad_lines_name_the_field() {
        let reason = |l: Value| parse_line("f:1", &l.to_string()).unwrap_err().reason;
        assert_eq!(reason(json!({"path": "/"})), "timestamp is required");
        assert!(reason(json!({"timestamp": 1, "path": "/", "body": 3}))
            .starts_with("body must be a string"));
        assert!(reason(json!({"timestamp": 1, "path": "/", "bogus": 3}))
            .starts_with("bogus is not a known field"));
        assert!(
            reason(json!({"timestamp": 1, "path": "/", "response": {"status": 42}}))
                .starts_with("response.status must be an HTTP status code")
        );
        assert!(
            reason(json!({"timestamp": 1, "path": "/", "body": "a", "body_json": {}}))
                .contains("not both")
        );
        assert!(parse_line("f:1", "{nope")
            .unwrap_err()
            .reason
            .starts_with("not JSON"));
        assert!(reason(json!([1])).starts_with("must be a JSON object"));
        assert!(
            reason(json!({"timestamp": 1, "path": "/", "response": {"content_type": 7}}))
                .starts_with("response.content_type must be a string")
        );
        assert!(
            reason(json!({"timestamp": 1, "path": "/", "response": {"headers": {}}}))
                .starts_with("response.headers is not a known field")
        );
    }

    #[test]
    fn a_response_body_keeps_its_content_type_or_tells_it() {
        let answer = |r: Value| {
            parse_line(
                "f:1",
                &json!({"timestamp": 1, "path": "/mcp", "response": r}).to_string(),
            )
            .unwrap()
            .response
            .unwrap()
        };
        let a = answer(json!({"status": 200, "body": {"jsonrpc": "2.0", "id": 1, "result": {}}}));
        assert_eq!(a.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            a.body.as_deref(),
            Some(&br#"{"id":1,"jsonrpc":"2.0","result":{}}"#[..])
        );
        let a = answer(json!({"body": "event: message\ndata: {}\n\n"}));
        assert_eq!(a.content_type.as_deref(), Some("text/event-stream"));
        let a = answer(json!({"content_type": "text/plain", "body": "{}", "body_truncated": true}));
        assert_eq!(a.content_type.as_deref(), Some("text/plain"));
        assert!(a.body_cut);
        let a = answer(json!({"status": 200}));
        assert_eq!((a.content_type, a.body), (None, None));
    }
}
