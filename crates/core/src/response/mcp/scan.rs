//! A streaming JSON scanner for one JSON-RPC message at a time: it tracks
//! where each value starts and ends, byte by byte, across chunks, and
//! copies out (bounded) the members a tool result is judged by:
//! `result.content`, `result.isError`, `result.structuredContent` and
//! `error`. Nothing is held: the caller passes every chunk on at once.

use crate::request::Fnv;

/// Containers nested deeper than this end the reading (the result is
/// unreadable; the bytes still pass).
pub const MAX_DEPTH: usize = 64;
/// Bytes of one member copied for a masked digest; a longer member is
/// judged by a digest of its bytes as written.
pub const MAX_CAPTURE: usize = 64 * 1024;
/// The longest object key compared (longer keys are none of ours).
const MAX_KEY: usize = 24;

/// The member names the reader knows: `result` and `error` at the top,
/// and the members it copies out (`error`, and `content`, `isError` and
/// `structuredContent` in `result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Other,
    Result,
    Error,
    Content,
    IsError,
    Structured,
}

/// The member a key names (`long`: longer than [`MAX_KEY`], or escaped).
fn key_of(b: &[u8], long: bool) -> Field {
    match b {
        _ if long => Field::Other,
        b"result" => Field::Result,
        b"error" => Field::Error,
        b"content" => Field::Content,
        b"isError" => Field::IsError,
        b"structuredContent" => Field::Structured,
        _ => Field::Other,
    }
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    object: bool,
    /// The key of the member being read (objects).
    key: Field,
    /// An object waits for a key (after `{` or `,`).
    expect_key: bool,
}

/// A member copied out: its bytes (up to [`MAX_CAPTURE`]) and, once it
/// is longer, a digest of all its bytes as written.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    pub bytes: Vec<u8>,
    pub whole: bool,
    /// The digest of all the bytes (a member longer than the copy).
    pub raw: u64,
    /// Values directly inside it (the blocks of `content`).
    pub items: u32,
}

impl Captured {
    /// Bytes past the copy's end: the member is judged by the digest of all
    /// its bytes from now on.
    fn overflow(&mut self, more: &[u8]) {
        let mut h = Fnv(self.raw);
        if self.whole {
            self.whole = false;
            h.write(&self.bytes);
        }
        h.write(more);
        self.raw = h.0;
    }

    /// What identifies the member's bytes (a memo's key): a word-wise hash
    /// of the copy, or the digest of a longer member's bytes.
    pub fn key(&self) -> u64 {
        if !self.whole {
            return self.raw;
        }
        let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
        let mut h: u64 = 0x0051_7cc1_b727_220a;
        let mut words = self.bytes.chunks_exact(8);
        for w in words.by_ref() {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            h = mix(h, u64::from_le_bytes(a));
        }
        let h = words
            .remainder()
            .iter()
            .fold(h, |h, &b| mix(h, u64::from(b)));
        mix(h, self.bytes.len() as u64)
    }
}

/// What one byte did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    None,
    /// The byte closes `result.content` (the `]`), which holds `items`
    /// values: the place a note goes, before this byte.
    ContentEnds,
    /// A top-level value ended with this byte.
    MessageEnds,
    /// The message cannot be read on (nested too deep, or not JSON).
    Broken,
}

#[derive(Debug, Default)]
pub struct Scanner {
    stack: Vec<Frame>,
    in_string: bool,
    escape: bool,
    string_is_key: bool,
    key: Vec<u8>,
    key_long: bool,
    scalar: bool,
    /// The member being copied, and the depth its value sits at.
    capture: Option<(Field, usize)>,
    buf: Captured,
    /// Members finished in this message.
    pub fields: Vec<(Field, Captured)>,
    /// The message has a top-level `result` or `error`.
    pub is_response: bool,
    broken: bool,
}

impl Scanner {
    /// Start on the next message (the fields read are dropped).
    pub fn reset(&mut self) {
        *self = Scanner {
            key: std::mem::take(&mut self.key),
            ..Scanner::default()
        };
        self.key.clear();
    }

    /// Inside a string value with no escape pending: what follows up to
    /// the next `"` or `\` is plain ([`Scanner::string_run`]).
    pub fn in_plain_string(&self) -> bool {
        self.in_string && !self.string_is_key && !self.escape && !self.broken
    }

    /// Plain bytes of a string value, at once (the same as feeding them one
    /// by one).
    pub fn string_run(&mut self, bytes: &[u8]) {
        if self.capture.is_none() {
            return;
        }
        let c = &mut self.buf;
        let room = MAX_CAPTURE.saturating_sub(c.bytes.len());
        let (kept, over) = bytes.split_at(room.min(bytes.len()));
        c.bytes.extend_from_slice(kept);
        if !over.is_empty() {
            c.overflow(over);
        }
    }

    /// Whether a message is half read.
    pub fn mid_message(&self) -> bool {
        !self.stack.is_empty() || self.in_string || self.scalar
    }

    pub fn field(&self, f: Field) -> Option<&Captured> {
        self.fields.iter().find(|(g, _)| *g == f).map(|(_, c)| c)
    }

    fn copy(&mut self, b: u8) {
        if self.capture.is_none() {
            return;
        }
        let c = &mut self.buf;
        if c.bytes.len() < MAX_CAPTURE {
            c.bytes.push(b);
            return;
        }
        c.overflow(&[b]);
    }

    /// The member a value starting at `depth` is, if it is one we copy.
    fn field_at(&self, depth: usize) -> Option<Field> {
        let parent = |i: usize| self.stack.get(i).filter(|f| f.object).map(|f| f.key);
        match (depth, parent(0)?) {
            (1, Field::Error) => Some(Field::Error),
            (2, Field::Result) => parent(1)
                .filter(|f| matches!(f, Field::Content | Field::IsError | Field::Structured)),
            _ => None,
        }
    }

    fn value_starts(&mut self) {
        let depth = self.stack.len();
        if depth == 1 {
            if let Some(Field::Result | Field::Error) = self.stack.first().map(|f| f.key) {
                self.is_response = true;
            }
        }
        if let Some((_, d)) = self.capture {
            if depth == d + 1 {
                self.buf.items += 1;
            }
        } else if let Some(field) = self.field_at(depth) {
            if self.field(field).is_some() {
                // A member given twice: parsers keep the last, the reader
                // (and a note) saw the first. Not read.
                self.broken = true;
                return;
            }
            self.capture = Some((field, depth));
            self.buf = Captured {
                bytes: Vec::with_capacity(64), // its first bytes, not a grow each
                whole: true,
                raw: Fnv::default().0,
                ..Captured::default()
            };
        }
    }

    /// A value at `depth` ended: a member copied out is finished.
    fn value_ends(&mut self, depth: usize) -> Event {
        if let Some((field, _)) = self.capture.filter(|&(_, d)| d == depth) {
            self.capture = None;
            let c = std::mem::take(&mut self.buf);
            self.fields.push((field, c));
        }
        if depth == 0 {
            Event::MessageEnds
        } else {
            Event::None
        }
    }

    /// The message cannot be read on.
    fn broken(&mut self) -> Event {
        self.broken = true;
        Event::Broken
    }

    /// One byte of the message.
    pub fn byte(&mut self, b: u8) -> Event {
        if self.broken {
            return Event::Broken;
        }
        if self.in_string {
            self.copy(b);
            let is_key = self.string_is_key;
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
                self.key_long |= is_key;
            } else if b == b'"' {
                self.in_string = false;
                if !is_key {
                    return self.value_ends(self.stack.len());
                }
                if let Some(f) = self.stack.last_mut() {
                    f.key = key_of(&self.key, self.key_long);
                }
            } else if is_key && self.key.len() < MAX_KEY {
                self.key.push(b);
            } else {
                self.key_long |= is_key;
            }
            return Event::None;
        }
        if self.scalar {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.') {
                self.copy(b);
                return Event::None;
            }
            self.scalar = false;
            // A bare top-level scalar is no message of ours.
            if self.value_ends(self.stack.len()) == Event::MessageEnds {
                return Event::MessageEnds;
            }
        }
        match b {
            b'{' | b'[' => {
                if self.stack.len() >= MAX_DEPTH {
                    return self.broken();
                }
                self.value_starts();
                self.copy(b);
                self.stack.push(Frame {
                    object: b == b'{',
                    key: Field::Other,
                    expect_key: b == b'{',
                });
                Event::None
            }
            b'}' | b']' => {
                let Some(frame) = self.stack.pop() else {
                    return self.broken();
                };
                if frame.object != (b == b'}') {
                    return self.broken();
                }
                let closes_content = b == b']'
                    && matches!(self.capture, Some((Field::Content, d)) if d == self.stack.len());
                self.copy(b);
                let e = self.value_ends(self.stack.len());
                if closes_content {
                    Event::ContentEnds
                } else {
                    e
                }
            }
            b'"' => {
                let is_key = self.stack.last().is_some_and(|f| f.object && f.expect_key);
                self.string_is_key = is_key;
                if is_key {
                    self.key.clear();
                    self.key_long = false;
                } else {
                    self.value_starts();
                }
                self.in_string = true;
                self.copy(b);
                Event::None
            }
            b' ' | b'\t' | b'\n' | b'\r' => {
                self.copy(b);
                Event::None
            }
            b':' => {
                if let Some(f) = self.stack.last_mut() {
                    f.expect_key = false;
                }
                self.copy(b);
                Event::None
            }
            b',' => {
                if let Some(f) = self.stack.last_mut().filter(|f| f.object) {
                    f.expect_key = true;
                    f.key = Field::Other;
                }
                self.copy(b);
                Event::None
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                self.value_starts();
                self.scalar = true;
                self.copy(b);
                Event::None
            }
            _ => self.broken(),
        }
    }
}
