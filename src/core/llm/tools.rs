//! The tool calls in a conversation's history, and the byte-level edits that
//! speak back to the model (a note at the end of the conversation, a
//! `tool_choice`).
//!
//! Edits never re-serialise the body: they insert or replace bytes at the
//! end of the conversation (and at `tool_choice`), so every earlier byte
//! stays identical and provider prompt caches keyed on the prefix still hit.

use super::{normalize, Format, Items, Part, Request};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

/// One tool call the model made, in conversation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// Canonical arguments (sorted keys, no whitespace).
    pub arguments: String,
    /// The assistant turn it belongs to (0-based, in order).
    pub turn: usize,
}

/// The tool calls of a conversation and its newest assistant turn.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolHistory {
    pub calls: Vec<ToolCall>,
    /// The newest assistant turn, with or without tool calls.
    pub newest_turn: Option<usize>,
}

/// Just enough of an item to know who wrote it.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(default, borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(default, borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
}

/// The parts of a message loopguard may edit, borrowed with their
/// positions.
#[derive(Deserialize)]
struct LastMessage<'a> {
    #[serde(default, borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct ToolChoice<'a> {
    #[serde(default, borrow)]
    tool_choice: Option<&'a RawValue>,
}

impl Request<'_> {
    /// Every tool call in the history, in order, with the assistant turn it
    /// belongs to. Only the model's own items are parsed fully.
    pub fn tool_history(&self) -> ToolHistory {
        let Items::List(items) = &self.items else {
            return ToolHistory::default();
        };
        let mut out = ToolHistory::default();
        let mut turn: Option<usize> = None;
        let mut previous_was_model = false;
        for raw in items {
            let Ok(probe) = serde_json::from_str::<Probe>(raw.get()) else {
                previous_was_model = false;
                continue;
            };
            let kind = probe.kind.as_deref().unwrap_or("");
            let role = probe.role.as_deref().unwrap_or("");
            let from_model = role.eq_ignore_ascii_case("assistant")
                || matches!(kind, "function_call" | "custom_tool_call" | "reasoning");
            if !from_model {
                previous_was_model = false;
                continue;
            }
            // Responses: a run of model items (reasoning, calls, message) is
            // one turn. Chat and Anthropic: each assistant message is one.
            let continues = self.format == Format::OpenAiResponses && previous_was_model;
            let t = match (turn, continues) {
                (Some(t), true) => t,
                (Some(t), false) => t + 1,
                (None, _) => 0,
            };
            turn = Some(t);
            previous_was_model = true;
            let Ok(v) = serde_json::from_str::<Value>(raw.get()) else {
                continue;
            };
            for part in normalize::message(&v).parts {
                if let Part::ToolCall { name, arguments } = part {
                    out.calls.push(ToolCall {
                        name,
                        arguments,
                        turn: t,
                    });
                }
            }
        }
        out.newest_turn = turn;
        out
    }

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
        let choice = serde_json::from_slice::<ToolChoice>(self.body).ok()?;
        let choice_edit = match choice.tool_choice {
            Some(raw) => Edit {
                at: self.offset(raw.get())?,
                remove: raw.get().len(),
                insert: none.to_string(),
            },
            None => Edit {
                at: object_end(self.body)?,
                remove: 0,
                insert: format!(",\"tool_choice\":{none}"),
            },
        };
        Some(apply(self.body, vec![note_edit, choice_edit]))
    }

    fn note_edit(&self, note: &str) -> Option<Edit> {
        let text = serde_json::to_string(note).ok()?;
        match self.format {
            Format::OpenAiChat => {
                self.append_item(&format!("{{\"role\":\"system\",\"content\":{text}}}"))
            }
            Format::OpenAiResponses => {
                self.append_item(&format!("{{\"role\":\"developer\",\"content\":{text}}}"))
            }
            Format::Anthropic => self.anthropic_note(&text),
        }
    }

    /// Insert one item at the end of the conversation array.
    fn append_item(&self, item: &str) -> Option<Edit> {
        let array = self.array?;
        let start = self.offset(array.get())?;
        let close = start + array.get().len().checked_sub(1)?;
        let empty = match &self.items {
            Items::List(l) => l.is_empty(),
            Items::Text(_) => return None,
        };
        Some(Edit {
            at: close,
            remove: 0,
            insert: if empty {
                item.to_string()
            } else {
                format!(",{item}")
            },
        })
    }

    /// A text block at the end of the final user turn, or a new user turn
    /// if the conversation ends with the assistant.
    fn anthropic_note(&self, text: &str) -> Option<Edit> {
        let block = format!("{{\"type\":\"text\",\"text\":{text}}}");
        let last = match &self.items {
            Items::List(l) => l.last().copied(),
            Items::Text(_) => None,
        };
        let Some(last) = last else {
            return self.append_item(&format!("{{\"role\":\"user\",\"content\":[{block}]}}"));
        };
        let msg: LastMessage = serde_json::from_str(last.get()).ok()?;
        let is_user = msg
            .role
            .as_deref()
            .is_some_and(|r| r.eq_ignore_ascii_case("user"));
        match msg.content {
            Some(content) if is_user && content.get().starts_with('[') => {
                let start = self.offset(content.get())?;
                let close = start + content.get().len().checked_sub(1)?;
                let inner = content.get().get(1..content.get().len() - 1).unwrap_or("");
                let empty = inner.trim().is_empty();
                Some(Edit {
                    at: close,
                    remove: 0,
                    insert: if empty { block } else { format!(",{block}") },
                })
            }
            Some(content) if is_user && content.get().starts_with('"') => Some(Edit {
                at: self.offset(content.get())?,
                remove: content.get().len(),
                insert: format!("[{{\"type\":\"text\",\"text\":{}}},{block}]", content.get()),
            }),
            _ => self.append_item(&format!("{{\"role\":\"user\",\"content\":[{block}]}}")),
        }
    }

    /// Where a borrowed piece of the body starts in it.
    fn offset(&self, piece: &str) -> Option<usize> {
        let base = self.body.as_ptr() as usize;
        let at = (piece.as_ptr() as usize).checked_sub(base)?;
        (at + piece.len() <= self.body.len()).then_some(at)
    }
}

/// A byte edit: at `at`, drop `remove` bytes and put `insert` there.
#[derive(Debug)]
struct Edit {
    at: usize,
    remove: usize,
    insert: String,
}

/// Apply non-overlapping edits, last first so earlier offsets hold.
fn apply(body: &[u8], mut edits: Vec<Edit>) -> Vec<u8> {
    edits.sort_by_key(|e| std::cmp::Reverse(e.at));
    let mut out = body.to_vec();
    for e in edits {
        let end = (e.at + e.remove).min(out.len());
        out.splice(e.at.min(out.len())..end, e.insert.into_bytes());
    }
    out
}

/// The offset of the top-level object's closing brace.
fn object_end(body: &[u8]) -> Option<usize> {
    let at = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    (body.get(at) == Some(&b'}')).then_some(at)
}
