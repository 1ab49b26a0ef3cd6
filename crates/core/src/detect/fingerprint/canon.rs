//! The canonical encoding: framed components written into a sink (the
//! filter's SHA-256 stream, a plain buffer, or a [`Trace`] that also notes
//! what each component is, for `loopguard explain`).

use super::show::show_bytes;
use super::Fingerprint;
use crate::request::llm::{Message, Part};
use sha2::{Digest, Sha256};

/// One component of a fingerprint as `explain` shows it: what it is and
/// its value (text quoted, other bytes in hex, secrets redacted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    pub value: String,
}

impl Component {
    pub(super) fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Component {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// Where framed components go: a SHA-256 stream, a plain buffer, or a
/// [`Trace`] that also notes what each component is.
pub trait Sink: Clone {
    fn put(&mut self, b: &[u8]);
    /// Note what the next bytes are (only a trace keeps it).
    #[inline]
    fn note(&mut self, _c: impl FnOnce() -> Component) {}
    /// Note components described elsewhere (a framed identity).
    #[inline]
    fn note_all(&mut self, _c: &[Component]) {}
}

/// A sink whose bytes are read back (the caller's identity is framed once
/// and absorbed into several digests).
pub trait Buffer: Sink + Default {
    /// An empty buffer with room for `n` bytes.
    fn sized(_n: usize) -> Self {
        Self::default()
    }
    fn bytes(&self) -> &[u8];
    fn components(&self) -> &[Component] {
        &[]
    }
}

/// A sink that ends in a digest: the filter's SHA-256 stream, or a trace.
pub trait Hashing: Sink + Default {
    /// Where the caller's identity is framed.
    type Buffer: Buffer;
    /// What is left besides the digest (a trace's components).
    type Residue;
    fn finish_digest(self) -> (Fingerprint, Self::Residue);
}

impl Sink for Sha256 {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.update(b);
    }
}

impl Hashing for Sha256 {
    type Buffer = Vec<u8>;
    type Residue = ();
    fn finish_digest(self) -> (Fingerprint, ()) {
        (truncate(&self.finalize()), ())
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

impl Buffer for Vec<u8> {
    fn sized(n: usize) -> Self {
        Vec::with_capacity(n)
    }
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// The canonical bytes of a fingerprint and what each component is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    pub bytes: Vec<u8>,
    pub components: Vec<Component>,
}

impl Sink for Trace {
    fn put(&mut self, b: &[u8]) {
        self.bytes.extend_from_slice(b);
    }
    fn note(&mut self, c: impl FnOnce() -> Component) {
        self.components.push(c());
    }
    fn note_all(&mut self, c: &[Component]) {
        self.components.extend_from_slice(c);
    }
}

impl Buffer for Trace {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn components(&self) -> &[Component] {
        &self.components
    }
}

impl Hashing for Trace {
    type Buffer = Trace;
    type Residue = Trace;
    fn finish_digest(self) -> (Fingerprint, Trace) {
        (truncate(&<Sha256 as Digest>::digest(&self.bytes)), self)
    }
}

pub(super) fn truncate(full: &[u8]) -> Fingerprint {
    Fingerprint(full.first_chunk().copied().unwrap_or_default())
}

/// Writes framed components: every field is length-prefixed and every
/// optional or variant value tagged, so the encoding is unambiguous.
#[derive(Clone)]
pub(super) struct Canon<S>(pub(super) S);

impl<S: Hashing> Canon<S> {
    pub(super) fn new(domain: &[u8]) -> Self {
        let mut c = Canon(S::default());
        c.0.note(|| Component::new("domain", show_bytes(domain)));
        c.field(domain);
        c
    }

    pub(super) fn finish(self) -> (Fingerprint, S::Residue) {
        self.0.finish_digest()
    }
}

impl<S: Sink> Canon<S> {
    pub(super) fn tag(&mut self, t: u8) {
        self.0.put(&[t]);
    }
    pub(super) fn count(&mut self, n: usize) {
        self.0.put(&(n as u32).to_le_bytes());
    }
    /// A length-prefixed byte string.
    pub(super) fn field(&mut self, b: &[u8]) {
        self.count(b.len());
        self.0.put(b);
    }
    /// A tag, then a length-prefixed byte string.
    pub(super) fn tagged(&mut self, t: u8, b: &[u8]) {
        self.tag(t);
        self.field(b);
    }
    /// Note a component under `name` (its value made only when tracing).
    pub(super) fn note<V: Into<String>>(&mut self, name: &str, value: impl FnOnce() -> V) {
        self.0.note(|| Component::new(name, value()));
    }
    /// A length-prefixed byte string, noted under `name`.
    pub(super) fn named(&mut self, name: &str, b: &[u8]) {
        self.note(name, || show_bytes(b));
        self.field(b);
    }
    pub(super) fn optional(&mut self, v: Option<&[u8]>) {
        match v {
            None => self.tag(TAG_ABSENT),
            Some(b) => self.tagged(TAG_PRESENT, b),
        }
    }
    /// An optional value, noted under `name`.
    pub(super) fn named_optional(&mut self, name: &str, v: Option<&[u8]>) {
        self.note(name, || {
            v.map_or_else(|| "(absent)".to_string(), show_bytes)
        });
        self.optional(v);
    }
    /// The caller's identity, framed elsewhere: its components, then its
    /// bytes as one field.
    pub(super) fn identity<B: Buffer>(&mut self, id: &B) {
        self.0.note_all(id.components());
        self.field(id.bytes());
    }
}

pub(super) const TAG_ABSENT: u8 = 0;
pub(super) const TAG_PRESENT: u8 = 1;
pub(super) const TAG_LIMIT_KEYS: u8 = 2;
pub(super) const TAG_API_KEY: u8 = 3;

pub(super) fn write_message<S: Sink>(c: &mut Canon<S>, m: &Message, index: usize) {
    note_message(&mut c.0, m, "message", index);
    c.field(m.role.as_bytes());
    write_parts(c, &m.parts);
}

/// Note a message and its parts (explain), in the order they are hashed;
/// near mode notes the opening and the tail that went into its SimHash
/// this way without hashing them.
pub(super) fn note_message<S: Sink>(sink: &mut S, m: &Message, list: &str, index: usize) {
    sink.note(|| Component::new(labelled(list, index, "role"), show_bytes(m.role.as_bytes())));
    note_parts(sink, &m.parts, list, index);
}

fn note_parts<S: Sink>(sink: &mut S, parts: &[Part], list: &str, index: usize) {
    for p in parts {
        sink.note(|| {
            let (what, value) = match p {
                Part::Text(t) => ("text", show_bytes(t.as_bytes())),
                Part::Media(h) => ("media sha256", show_bytes(h)),
                Part::ToolCall { name, arguments } => (
                    "tool call",
                    format!(
                        "{} {}",
                        show_bytes(name.as_bytes()),
                        show_bytes(arguments.as_bytes())
                    ),
                ),
                Part::ToolResult { is_error, .. } => (
                    "tool result",
                    if *is_error { "(error)" } else { "(ok)" }.into(),
                ),
                Part::Other(kind) => ("other block", show_bytes(kind.as_bytes())),
            };
            Component::new(labelled(list, index, what), value)
        });
        if let Part::ToolResult { content, .. } = p {
            note_parts(sink, content, list, index);
        }
    }
}

/// A component's label (built only when tracing: the hashing sinks never
/// call the closures that use it): which list (the tail's messages, the
/// opening's), which item, what part.
fn labelled(list: &str, index: usize, what: &str) -> String {
    format!("{list}[{index}] {what}")
}

fn write_parts<S: Sink>(c: &mut Canon<S>, parts: &[Part]) {
    c.count(parts.len());
    for p in parts {
        match p {
            Part::Text(t) => c.tagged(1, t.as_bytes()),
            Part::Media(h) => c.tagged(2, h),
            Part::ToolCall { name, arguments } => {
                c.tagged(3, name.as_bytes());
                c.field(arguments.as_bytes());
            }
            Part::ToolResult { content, is_error } => {
                c.tag(4);
                c.tag(u8::from(*is_error));
                write_parts(c, content);
            }
            Part::Other(kind) => c.tagged(5, kind.as_bytes()),
        }
    }
}
