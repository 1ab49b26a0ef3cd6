//! Actions written in a reply's text, found in a request ([`actions`] reads
//! the text itself): which replies are read (a cheap test of their bytes
//! first), their text, each item's actions kept for the next look, and how
//! they enter the normalised messages (a reply becomes its calls, the user
//! message after it their result).

use super::messages::is_prompt_role;
use super::scan::Span;
use super::{actions, result_parts, Items, Message, Part, Request};
use serde_json::Value;

impl Request<'_> {
    /// Actions written in text read as what they are
    /// ([`actions`]): a model's reply that writes its action becomes that
    /// call (its narration around it is not compared: two turns that do
    /// the same are the same step, however the model words them), and the
    /// user message after such a reply (its observation) becomes its result.
    pub(super) fn read_text_actions(&self, index: usize, m: &mut Message) {
        let no_calls = || {
            !m.parts
                .iter()
                .any(|p| matches!(p, Part::ToolCall { .. } | Part::ToolResult { .. }))
        };
        if m.role == "assistant" && no_calls() {
            let found = self.text_actions_of(index);
            if !found.is_empty() {
                m.parts.retain(|p| !matches!(p, Part::Text(_)));
            }
            m.parts.extend(found.into_iter().map(|a| Part::ToolCall {
                name: a.name,
                arguments: a.arguments,
            }));
        } else if m.role == "user" && no_calls() && self.follows_text_action(index) {
            m.parts = result_parts(std::mem::take(&mut m.parts));
        }
    }

    /// Whether item `index` comes after a reply that wrote actions in its
    /// text, with at most a harness's reminders (system or developer
    /// messages) in between: it is then their observation.
    fn follows_text_action(&self, index: usize) -> bool {
        let Items::List(items) = &self.items else {
            return false;
        };
        for j in (index.saturating_sub(4)..index).rev() {
            let Some(keys) = items.get(j).and_then(|e| e.1.as_ref()) else {
                return false;
            };
            if !is_prompt_role(self.word(keys, "role")) {
                return !self.text_actions_of(j).is_empty();
            }
        }
        false
    }

    /// The actions a kept model item writes in its text (none for an item
    /// with native calls, or not kept).
    pub(super) fn text_actions_of(&self, index: usize) -> Vec<actions::TextAction> {
        if let Some((_, found)) = self.actions_memo.borrow().iter().find(|(i, _)| *i == index) {
            return found.clone();
        }
        let found = self.read_text_actions_of(index);
        let mut memo = self.actions_memo.borrow_mut();
        if memo.len() >= 64 {
            memo.clear();
        }
        memo.push((index, found.clone()));
        found
    }

    fn read_text_actions_of(&self, index: usize) -> Vec<actions::TextAction> {
        let Items::List(items) = &self.items else {
            return Vec::new();
        };
        let keys = items.get(index).and_then(|e| e.1.as_ref()).filter(|keys| {
            self.word(keys, "role").eq_ignore_ascii_case(b"assistant")
                && keys.get("tool_calls").is_none()
                && keys.get("function_call").is_none()
        });
        let content = keys.and_then(|k| k.get("content"));
        let text = content.and_then(|s| self.reply_text(s).ok().flatten());
        text.map_or_else(Vec::new, |text| actions::read(&text))
    }

    /// The text of a model reply's content at `span`, to read for actions:
    /// `None` when it is longer than [`super::actions::MAX_TEXT_BYTES`] or
    /// shows no marker of one; `Err` when its blocks do not fit the
    /// request's parsing budget.
    pub(super) fn reply_text(&self, span: Span) -> Result<Option<String>, ()> {
        let raw = self.body.get(span.0..span.1).unwrap_or_default();
        if !may_read_actions(raw) {
            return Ok(None);
        }
        match raw.first() {
            Some(b'"') => Ok(serde_json::from_slice::<String>(raw).ok()),
            Some(b'[') if self.afford(span) => Ok(serde_json::from_slice::<Value>(raw)
                .ok()
                .map(|v| text_blocks(&v))),
            Some(b'[') => Err(()),
            _ => Ok(None),
        }
    }
}

/// Whether a reply's content, as bytes, is read for text actions: not
/// longer than [`super::actions::MAX_TEXT_BYTES`], and showing a marker of
/// one (a cheap test before decoding it).
pub(super) fn may_read_actions(raw: &[u8]) -> bool {
    if raw.len() > super::actions::MAX_TEXT_BYTES {
        return false;
    }
    // Any of "```", "<function=", "<execute", "<solution>", "Action:" or
    // "_": one pass for `_`, one over the bytes that start the others (no
    // searcher is built per call).
    if memchr::memchr(b'_', raw).is_some() {
        return true;
    }
    let mut from = 0;
    while let Some(at) = raw
        .get(from..)
        .and_then(|r| memchr::memchr3(b'`', b'<', b'A', r))
    {
        let rest = raw.get(from + at..).unwrap_or_default();
        if rest.starts_with(b"```")
            || rest.starts_with(b"<function=")
            || rest.starts_with(b"<execute")
            || rest.starts_with(b"<solution>")
            || rest.starts_with(b"Action:")
        {
            return true;
        }
        from += at + 1;
    }
    false
}

/// The text blocks of a content array (Chat and Anthropic `text`,
/// Responses `output_text`), joined by line ends.
pub(super) fn text_blocks(v: &Value) -> String {
    let Some(blocks) = v.as_array() else {
        return v.as_str().unwrap_or_default().to_string();
    };
    blocks
        .iter()
        .filter(|b| {
            matches!(
                b.get("type").and_then(Value::as_str),
                Some("text" | "output_text")
            )
        })
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod marker_tests {
    use super::may_read_actions;

    fn reference(raw: &[u8]) -> bool {
        let has = |n: &[u8]| memchr::memmem::find(raw, n).is_some();
        has(b"```")
            || has(b"<function=")
            || has(b"<execute")
            || has(b"<solution>")
            || has(b"Action:")
            || has(b"_")
    }

    const PIECES: [&str; 16] = [
        "`",
        "``",
        "```",
        "<",
        "<function",
        "=",
        "<execute",
        "<solution",
        ">",
        "Action",
        ":",
        "A",
        "_",
        " text ",
        "\"",
        "\u{e9}",
    ];

    proptest::proptest! {
        #[test]
        fn markers_are_found_as_before(picks in proptest::collection::vec(0usize..PIECES.len(), 0..12)) {
            let raw: String = picks.iter().filter_map(|&i| PIECES.get(i).copied()).collect();
            proptest::prop_assert_eq!(may_read_actions(raw.as_bytes()), reference(raw.as_bytes()));
        }
    }
}
