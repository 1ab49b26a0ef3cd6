//! A `tools/call`'s result, read as it passes to the client (never held):
//! the JSON-RPC response in an `application/json` body, or the response
//! event of a `text/event-stream` (after any notifications the server
//! sends first). What is kept is bounded: a few digests, and at most
//! [`scan::MAX_CAPTURE`] bytes of a member while it is read.
//!
//! A result is judged by digests of its `content`, `isError` and
//! `structuredContent`, each in canonical JSON with the policy's volatile
//! classes masked (a timestamp in a result is noise; a count that changed
//! is news). A JSON-RPC error is judged by its code and masked message.
//!
//! The reader also places the note of the ladder's first step: when the
//! result's `content` turns out to be the one expected (the same as last
//! time), a text block is inserted before the `]` that closes it, in the
//! chunk that holds that byte.

pub mod scan;

use crate::config::Classes;
use crate::request::llm::normalize::canonical_json;
use crate::request::llm::scan as structure;
use crate::request::llm::volatile::{self, Context};
use crate::request::Fnv;
use scan::{Captured, Event, Field, Scanner};
use serde_json::Value;

/// Bytes of one response read at most (an event stream that never ends is
/// left alone after this many).
pub const MAX_SCANNED: usize = 16 * 1024 * 1024;
/// Bytes of an SSE field name compared.
const MAX_FIELD_NAME: usize = 8;

/// How the response body frames its JSON-RPC messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Framing {
    #[default]
    Json,
    Sse,
}

impl Framing {
    /// From the response's `content-type` (`None`: not an MCP answer).
    pub fn of(content_type: Option<&str>) -> Option<Framing> {
        let ct = content_type?.split(';').next()?.trim().to_ascii_lowercase();
        match ct.as_str() {
            "application/json" => Some(Framing::Json),
            "text/event-stream" => Some(Framing::Sse),
            _ => None,
        }
    }
}

/// What a tool call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The digest of the whole result (content, isError, structured
    /// content), or of a JSON-RPC error.
    pub result: u64,
    /// The digest of `content` alone (what a note compares).
    pub content: u64,
    /// `isError: true`, or a JSON-RPC error.
    pub failed: bool,
    /// A JSON-RPC `error` (not a `result`).
    pub rpc_error: bool,
}

/// How a response ended for the reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Result(Outcome),
    /// No response could be read (not JSON, nested too deep, too long, or
    /// the stream ended first).
    Unreadable,
}

/// A note to insert into the result when its content is the one expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotePlan {
    pub expected_content: u64,
    pub text: String,
}

impl NotePlan {
    /// The content block inserted (`comma`: after other blocks).
    fn block(&self, comma: bool) -> Vec<u8> {
        let block = serde_json::json!({"type": "text", "text": self.text});
        format!("{}{block}", if comma { "," } else { "" }).into_bytes()
    }
}

/// What one chunk gave.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fed {
    /// Insert these bytes at this offset of the chunk.
    pub insert: Option<(usize, Vec<u8>)>,
    /// The response is read (once).
    pub seen: Option<Seen>,
}

#[derive(Debug, Default)]
struct Sse {
    /// A byte of the current line was read (an empty line dispatches the
    /// event).
    in_line: bool,
    name: Vec<u8>,
    /// In the field name (before `:`).
    in_name: bool,
    data: bool,
    /// The byte after `data:` (one space is dropped).
    first: bool,
    after_cr: bool,
}

/// Members already digested, by their bytes' digest: a loop's results
/// repeat byte for byte, and canonical JSON and masking are most of what
/// reading a result costs. Bounded; the oldest entry makes room.
#[derive(Debug, Default)]
pub struct DigestMemo {
    entries: Vec<(u64, Classes, u64)>,
    next: usize,
}

/// Members a memo remembers.
pub const MEMO_ENTRIES: usize = 64;

impl DigestMemo {
    fn get(&self, raw: u64, classes: Classes) -> Option<u64> {
        self.entries
            .iter()
            .find(|(r, c, _)| *r == raw && *c == classes)
            .map(|(_, _, d)| *d)
    }

    fn put(&mut self, raw: u64, classes: Classes, digest: u64) {
        if self.entries.len() < MEMO_ENTRIES {
            self.entries.push((raw, classes, digest));
        } else if let Some(slot) = self.entries.get_mut(self.next) {
            *slot = (raw, classes, digest);
        }
        self.next = (self.next + 1) % MEMO_ENTRIES;
    }
}

/// A memo the readers of one worker share.
pub type SharedMemo = std::rc::Rc<std::cell::RefCell<DigestMemo>>;

/// The reader of one response.
#[derive(Debug, Default)]
pub struct ResultReader {
    framing: Framing,
    classes: Classes,
    note: Option<NotePlan>,
    memo: Option<SharedMemo>,
    json: Scanner,
    sse: Sse,
    scanned: usize,
    done: bool,
}

impl ResultReader {
    pub fn new(framing: Framing, classes: Classes, note: Option<NotePlan>) -> ResultReader {
        ResultReader {
            framing,
            classes,
            note,
            ..ResultReader::default()
        }
    }

    /// Digest members through `memo` (shared by a worker's readers).
    pub fn with_memo(mut self, memo: SharedMemo) -> ResultReader {
        self.memo = Some(memo);
        self
    }

    /// A member's digest, remembered.
    fn digest(&self, c: &Captured) -> u64 {
        let Some(memo) = &self.memo else {
            return digest(c, self.classes);
        };
        let (key, classes) = (c.key(), self.classes);
        let known = memo.try_borrow().ok().and_then(|m| m.get(key, classes));
        known.unwrap_or_else(|| {
            let d = digest(c, classes);
            if let Ok(mut m) = memo.try_borrow_mut() {
                m.put(key, classes, d);
            }
            d
        })
    }

    /// Whether the reader wants more of the body.
    pub fn reading(&self) -> bool {
        !self.done
    }

    /// Read a chunk (`end`: the body's last).
    pub fn feed(&mut self, chunk: &[u8], end: bool) -> Fed {
        let mut fed = Fed::default();
        if self.done {
            return fed;
        }
        let mut i = 0;
        while let Some(&b) = chunk.get(i) {
            // Inside a string value, the plain bytes up to its next quote
            // or escape (or, in an event stream, line end) go at once.
            let run = self.plain_run(chunk.get(i..).unwrap_or_default());
            if run > 0 {
                self.scanned += run;
                if self.scanned > MAX_SCANNED {
                    return self.finish(fed, Seen::Unreadable);
                }
                self.json
                    .string_run(chunk.get(i..i + run).unwrap_or_default());
                i += run;
                continue;
            }
            // Counted apart from a run's: one byte, on the hot path.
            self.scanned += 1;
            if self.scanned > MAX_SCANNED {
                return self.finish(fed, Seen::Unreadable);
            }
            let at = i;
            i += 1;
            let event = match self.framing {
                Framing::Json => self.json.byte(b),
                Framing::Sse => self.sse_byte(b),
            };
            match event {
                Event::None => {}
                Event::ContentEnds => {
                    if let (Some(note), Some(c)) = (&self.note, self.json.field(Field::Content)) {
                        if self.digest(c) == note.expected_content {
                            fed.insert = Some((at, note.block(c.items > 0)));
                        }
                    }
                }
                Event::MessageEnds => {
                    if self.json.is_response {
                        let seen = self.outcome();
                        return self.finish(fed, seen);
                    }
                    if self.framing == Framing::Json {
                        return self.finish(fed, Seen::Unreadable);
                    }
                    // A notification or a server's request first: the
                    // response is still to come.
                    self.json.reset();
                }
                Event::Broken => return self.finish(fed, Seen::Unreadable),
            }
        }
        if end {
            return self.finish(fed, Seen::Unreadable);
        }
        fed
    }

    /// How many of `rest`'s first bytes are plain bytes of a string value
    /// (0 when not inside one).
    fn plain_run(&self, rest: &[u8]) -> usize {
        if !self.json.in_plain_string() {
            return 0;
        }
        match self.framing {
            Framing::Json => memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len()),
            Framing::Sse => {
                let s = &self.sse;
                if !s.data || s.first || s.in_name || !s.in_line {
                    return 0;
                }
                rest.iter()
                    .position(|b| matches!(b, b'"' | b'\\' | b'\n' | b'\r'))
                    .unwrap_or(rest.len())
            }
        }
    }

    fn finish(&mut self, mut fed: Fed, seen: Seen) -> Fed {
        self.done = true;
        fed.seen = Some(seen);
        self.json.reset();
        fed
    }

    /// One byte of an event stream: data lines go to the JSON scanner
    /// (their line ends as whitespace), other lines are skipped.
    fn sse_byte(&mut self, b: u8) -> Event {
        let s = &mut self.sse;
        if b == b'\n' && s.after_cr {
            s.after_cr = false;
            return Event::None;
        }
        s.after_cr = b == b'\r';
        if b == b'\n' || b == b'\r' {
            let was_data = std::mem::take(&mut s.data);
            let empty = !s.in_line;
            s.in_line = false;
            s.name.clear();
            if was_data {
                return self.json.byte(b'\n');
            }
            if empty && self.json.mid_message() {
                // The event ended inside a message: it cannot be read.
                return Event::Broken;
            }
            return Event::None;
        }
        if !s.in_line {
            s.in_line = true;
            s.in_name = true;
        }
        if s.in_name {
            if b == b':' {
                s.in_name = false;
                s.data = s.name == b"data";
                s.first = true;
            } else if s.name.len() < MAX_FIELD_NAME {
                s.name.push(b);
            }
            return Event::None;
        }
        if !s.data {
            return Event::None;
        }
        if std::mem::take(&mut s.first) && b == b' ' {
            return Event::None;
        }
        self.json.byte(b)
    }

    /// The response's digests (from the members read).
    fn outcome(&self) -> Seen {
        let j = &self.json;
        if let Some(e) = j.field(Field::Error) {
            let d = error_digest(e, self.classes);
            return Seen::Result(Outcome {
                result: d,
                content: d,
                failed: true,
                rpc_error: true,
            });
        }
        let content = j.field(Field::Content).map_or(0, |c| self.digest(c));
        let failed = j.field(Field::IsError).is_some_and(|c| c.bytes == b"true");
        let structured = j.field(Field::Structured).map_or(0, |c| self.digest(c));
        Seen::Result(Outcome {
            result: result_digest(content, failed, structured),
            content,
            failed,
            rpc_error: false,
        })
    }
}

/// The digest of a whole result from its parts' (`structured`: 0 when it
/// has no structured content).
pub fn result_digest(content: u64, failed: bool, structured: u64) -> u64 {
    let mut h = Fnv::default();
    h.write(&content.to_le_bytes());
    h.write(&[u8::from(failed)]);
    h.write(&structured.to_le_bytes());
    h.0
}

/// Whether a call's recorded result was all `content` (and `isError`): a
/// note, checked against `content` as it passes, can then tell the result
/// is the same again.
pub fn has_only_content(e: &crate::detect::mcp::Entry) -> bool {
    !e.unread && e.result == result_digest(e.content, e.failed, 0)
}

/// A JSON-RPC error's digest: its code and message (masked), not its
/// `data` (a server's details, a trace, a time).
fn error_digest(c: &Captured, classes: Classes) -> u64 {
    let Some(Ok(v)) = c.whole.then(|| serde_json::from_slice::<Value>(&c.bytes)) else {
        return c.raw;
    };
    let essence = serde_json::json!({"code": v.get("code"), "message": v.get("message")});
    masked(&canonical_json(&essence), classes)
}

/// A member's digest: its canonical JSON with the volatile classes masked
/// as in a tool result, or (too long to copy) its bytes as written.
pub fn digest(c: &Captured, classes: Classes) -> u64 {
    // Canonical straight from the bytes (the structural scanner the
    // request readers use): no value tree.
    let canonical = c
        .whole
        .then(|| structure::canonical(&c.bytes, (0, c.bytes.len())));
    canonical.flatten().map_or(c.raw, |s| masked(&s, classes))
}

fn masked(canonical: &str, classes: Classes) -> u64 {
    volatile::masked_digest(canonical, classes, Context::ToolResult, &|_| false)
}

#[cfg(test)]
mod tests;
