//! Tool results in the body: which an item carries (a Chat `tool`
//! message's content, a Responses `function_call_output`'s output, an
//! Anthropic user turn's `tool_result` blocks), and the text at a
//! [`ResultAt`] (a result, or a turn's answer or prompt) read on demand
//! within the request's parsing budget.

use super::ResultAt;
use crate::request::llm::scan::{self, Span};
use crate::request::llm::{normalize, Part, Request};
use serde_json::Value;
use std::fmt::Write;

impl Request<'_> {
    /// The tool results an item carries, in order: a chat `tool` message's
    /// content, a Responses `function_call_output`'s output, the
    /// `tool_result` blocks of an Anthropic user message.
    pub(super) fn results_of(&self, keys: &scan::Picked) -> Vec<ResultAt> {
        let value = |span: Option<Span>| span.map_or(ResultAt::Empty, ResultAt::Value);
        let role = self.word(keys, "role");
        if role == b"tool" || role == b"function" {
            return vec![value(keys.get("content"))];
        }
        let kind = self.word(keys, "type");
        if matches!(kind, b"function_call_output" | b"custom_tool_call_output") {
            return vec![value(keys.get("output"))];
        }
        self.blocks_of(keys.get("content"), &[b"tool_result"])
            .map(|m| value(scan::get(&m, "content")))
            .collect()
    }

    /// A tool result's text, normalised (its text parts joined; media as
    /// a hash), or `None` if it cannot be read within the request's
    /// parsing budget.
    pub fn result_text(&self, at: ResultAt) -> Option<String> {
        self.read_at(at, normalize::normalize_json_str, |v, out| {
            flatten(&normalize::content(v), out)
        })
    }

    /// A tool result's text as written: a string unescaped, or the text
    /// parts of its content joined by line breaks; `None` if it cannot be
    /// read within the request's parsing budget.
    pub fn result_raw(&self, at: ResultAt) -> Option<String> {
        self.read_at(at, |raw| serde_json::from_slice(raw).ok(), texts_of)
    }

    /// What a model's reply wrote as text (a string, or its text blocks:
    /// tool calls and thinking aside), normalised; `None` if it cannot be
    /// read within the request's parsing budget.
    pub fn reply_words(&self, at: ResultAt) -> Option<String> {
        if matches!(at, ResultAt::Value(s) if !matches!(self.body.get(s.0), Some(b'"' | b'['))) {
            return None;
        }
        self.read_at(at, normalize::normalize_json_str, |v, out| {
            *out = normalize::normalize_text(&super::super::text_actions::text_blocks(v));
        })
    }

    /// The value at `at` read: a string by `string` (from its raw bytes),
    /// anything else parsed within the request's budget and written by
    /// `tree`; empty for a result with no content.
    fn read_at(
        &self,
        at: ResultAt,
        string: impl FnOnce(&[u8]) -> Option<String>,
        tree: impl FnOnce(&Value, &mut String),
    ) -> Option<String> {
        let ResultAt::Value(span) = at else {
            return Some(String::new());
        };
        let raw = self.body.get(span.0..span.1)?;
        if raw.first() == Some(&b'"') {
            return string(raw);
        }
        if !self.afford_once(span) {
            return None;
        }
        let v = serde_json::from_slice::<Value>(raw).ok()?;
        let mut out = String::new();
        tree(&v, &mut out);
        Some(out)
    }

    /// The bytes of the value at `at` in the body, read no further (a
    /// cache's key).
    pub fn result_bytes(&self, at: ResultAt) -> Option<&[u8]> {
        let ResultAt::Value(span) = at else {
            return None;
        };
        self.body.get(span.0..span.1)
    }

    /// Take from the parsing budget what [`Request::result_text`] takes
    /// for `at` (a text found in a cache is charged as if read): a string
    /// costs nothing, other content its values; false when they do not
    /// fit.
    pub fn afford_result(&self, at: ResultAt) -> bool {
        match at {
            ResultAt::Value(span) if self.body.get(span.0) != Some(&b'"') => self.afford_once(span),
            _ => true,
        }
    }
}

/// The texts in a content value (a string, text blocks, a tool result's
/// content), one line each.
fn texts_of(v: &Value, out: &mut String) {
    match v {
        Value::String(t) => {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(t);
        }
        Value::Array(items) => items.iter().for_each(|i| texts_of(i, out)),
        Value::Object(m) => {
            if let Some(t @ Value::String(_)) = m.get("text") {
                texts_of(t, out);
            } else if let Some(c) = m.get("content").or_else(|| m.get("output")) {
                texts_of(c, out);
            }
        }
        _ => {}
    }
}

/// Parts as one text: texts joined by spaces, other parts by a marker.
fn flatten(parts: &[Part], out: &mut String) {
    for p in parts {
        if !out.is_empty() {
            out.push(' ');
        }
        // (Writing to a `String` cannot fail.)
        match p {
            Part::Text(t) => out.push_str(t),
            Part::Media(h) => {
                let hex: String = h.iter().take(8).map(|b| format!("{b:02x}")).collect();
                let _ = write!(out, "<media:{hex}>");
            }
            Part::ToolCall { name, arguments } => _ = write!(out, "{name} {arguments}"),
            Part::ToolResult { content, .. } => flatten(content, out),
            Part::Other(kind) => _ = write!(out, "<{kind}>"),
        }
    }
}
