//! The byte-level edits that speak back to the model: a note at the end of
//! the conversation, in the request's own format, and a `tool_choice` that
//! makes the model answer in text.
//!
//! Edits never re-serialise the body: they insert or replace bytes at the
//! end of the conversation (and at `tool_choice`), so every earlier byte
//! stays identical and provider prompt caches keyed on the prefix still hit.

use super::{scan, scan::Span, Format, Request};

impl Request<'_> {
    /// The body with `note` appended as the conversation's last word, in
    /// the request's own format: an OpenAI `system` message (Chat), a
    /// `developer` input item (Responses), or a text block in the final
    /// user turn (Anthropic, keeping roles alternating). `None` if the body
    /// has no conversation array to append to.
    pub fn with_note(&self, note: &str) -> Option<Vec<u8>> {
        Some(apply(self.body, vec![self.note_edit(note)?]))
    }

    /// The body with `note` appended (as [`Request::with_note`]) and
    /// `tool_choice` set so the model must answer in text.
    pub fn with_note_and_no_tools(&self, note: &str) -> Option<Vec<u8>> {
        let note_edit = self.note_edit(note)?;
        let none = match self.format {
            Format::Anthropic => "{\"type\":\"none\"}",
            _ => "\"none\"",
        };
        let choice_edit = match self.tool_choice {
            Some(span) => (span, none.to_string()),
            None => {
                let at = object_end(self.body)?;
                ((at, at), format!(",\"tool_choice\":{none}"))
            }
        };
        Some(apply(self.body, vec![note_edit, choice_edit]))
    }

    fn note_edit(&self, note: &str) -> Option<Edit> {
        let text = serde_json::to_string(note).ok()?;
        let role = match self.format {
            Format::OpenAiChat => "system",
            Format::OpenAiResponses => "developer",
            Format::Anthropic => return self.anthropic_note(&text),
        };
        self.append_item(&format!("{{\"role\":\"{role}\",\"content\":{text}}}"))
    }

    /// Insert one item at the end of the conversation array.
    fn append_item(&self, item: &str) -> Option<Edit> {
        let (_, end) = self.array?;
        append(end, self.list()?.is_empty(), item.to_string())
    }

    /// A text block at the end of the final user turn, or a new user turn
    /// if the conversation ends with the assistant.
    fn anthropic_note(&self, text: &str) -> Option<Edit> {
        let block = format!("{{\"type\":\"text\",\"text\":{text}}}");
        let last = self.list().and_then(|l| l.last());
        let Some(last) = last else {
            return self.append_item(&format!("{{\"role\":\"user\",\"content\":[{block}]}}"));
        };
        let members = scan::members(self.body, last)?;
        let is_user = scan::get(&members, "role")
            .and_then(|s| scan::plain_str(self.body, s))
            .is_some_and(|r| r.eq_ignore_ascii_case(b"user"));
        match scan::get(&members, "content") {
            Some(content) if is_user && self.body.get(content.0) == Some(&b'[') => append(
                content.1,
                scan::elements(self.body, content)?.is_empty(),
                block,
            ),
            Some(content) if is_user && self.body.get(content.0) == Some(&b'"') => {
                let original = std::str::from_utf8(self.body.get(content.0..content.1)?).ok()?;
                let blocks = format!("[{{\"type\":\"text\",\"text\":{original}}},{block}]");
                Some((content, blocks))
            }
            _ => self.append_item(&format!("{{\"role\":\"user\",\"content\":[{block}]}}")),
        }
    }
}

/// A byte edit: the bytes of the span replaced by the text.
type Edit = (Span, String);

/// `item` inserted before the `]` of an array that ends at `end`, after a
/// comma unless the array is `empty`.
fn append(end: usize, empty: bool, item: String) -> Option<Edit> {
    let at = end.checked_sub(1)?;
    Some(((at, at), if empty { item } else { format!(",{item}") }))
}

/// Apply non-overlapping edits, last first so earlier offsets hold.
fn apply(body: &[u8], mut edits: Vec<Edit>) -> Vec<u8> {
    edits.sort_by_key(|((at, _), _)| std::cmp::Reverse(*at));
    let mut out = body.to_vec();
    for ((at, end), insert) in edits {
        let end = end.min(out.len());
        out.splice(at.min(out.len())..end, insert.into_bytes());
    }
    out
}

/// The offset of the top-level object's closing brace.
fn object_end(body: &[u8]) -> Option<usize> {
    let at = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    (body.get(at) == Some(&b'}')).then_some(at)
}
