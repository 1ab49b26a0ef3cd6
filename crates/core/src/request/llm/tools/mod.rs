//! The tool calls in a conversation's history, and the byte-level edits that
//! speak back to the model (a note at the end of the conversation, a
//! `tool_choice`).
//!
//! Edits never re-serialise the body: they insert or replace bytes at the
//! end of the conversation (and at `tool_choice`), so every earlier byte
//! stays identical and provider prompt caches keyed on the prefix still hit.

use super::scan::{self, Span};
use super::{normalize, Format, Items, Request};
use serde_json::Value;
use std::collections::HashMap;
use std::rc::Rc;

/// Tool calls of model items already parsed, keyed by the item's exact
/// bytes (looked up by CRC, confirmed by comparison). Bounded: it starts
/// over when it holds more than 2 MB of items.
#[derive(Debug, Default)]
pub struct CallCache {
    entries: HashMap<u32, Vec<CachedItem>>,
    bytes: usize,
}

/// An item's call-holding bytes and the calls parsed from them.
type CachedItem = (Vec<u8>, Vec<(Rc<str>, Rc<str>)>);

const CALL_CACHE_BYTES: usize = 2 << 20;
/// Model items whose call-holding bytes exceed this are parsed without the
/// cache (their bytes are not copied as a key).
const MAX_CACHED_ITEM: usize = 64 << 10;

impl CallCache {
    fn get(&self, raw: &[u8]) -> Option<&[(Rc<str>, Rc<str>)]> {
        self.entries
            .get(&crc32fast::hash(raw))?
            .iter()
            .find(|(r, _)| r.as_slice() == raw)
            .map(|(_, calls)| calls.as_slice())
    }

    fn put(&mut self, raw: &[u8], calls: Vec<(Rc<str>, Rc<str>)>) {
        if self.bytes + raw.len() > CALL_CACHE_BYTES {
            self.entries.clear();
            self.bytes = 0;
        }
        if raw.len() <= CALL_CACHE_BYTES {
            self.bytes += raw.len();
            self.entries
                .entry(crc32fast::hash(raw))
                .or_default()
                .push((raw.to_vec(), calls));
        }
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.entries.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One tool call the model made, in conversation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: Rc<str>,
    /// Canonical arguments (sorted keys, no whitespace).
    pub arguments: Rc<str>,
    /// The assistant turn it belongs to (0-based, in order).
    pub turn: usize,
    /// Where its result is in the body (read on demand with
    /// [`Request::result_text`]); `None` when the request holds none.
    pub result: Option<ResultAt>,
}

/// A tool result's place in the body: the span of its content value, or
/// a result with no content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultAt {
    Value(Span),
    Empty,
}

/// The tool calls of a conversation and its newest assistant turn.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolHistory {
    pub calls: Vec<ToolCall>,
    /// The newest assistant turn, with or without tool calls.
    pub newest_turn: Option<usize>,
    /// Every assistant turn in order (index = turn).
    pub turns: Vec<ModelTurn>,
}

/// One assistant turn: how many tool calls it made, where its text answer
/// is and where the user's message it answers is (both read on demand with
/// [`Request::result_text`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModelTurn {
    pub calls: usize,
    pub answer: Option<ResultAt>,
    /// The last user message before this turn, if one came after the
    /// previous turn.
    pub prompt: Option<ResultAt>,
}

impl Request<'_> {
    /// Every tool call in the history the request keeps (its last items,
    /// see [`super::parse`]), in order, with the assistant turn it belongs
    /// to (counted from the oldest kept item). Only the model's tool calls
    /// are parsed; texts are skipped unread. With a cache, model items seen
    /// before (a conversation resends its history every turn) are not
    /// parsed again. Calls that would exceed the request's parsing budget
    /// are not read (see [`Request::over_budget`]).
    pub fn tool_history(&self, mut cache: Option<&mut CallCache>) -> ToolHistory {
        let Items::List(items) = &self.items else {
            return ToolHistory::default();
        };
        let mut out = ToolHistory::default();
        let mut turn: Option<usize> = None;
        let mut previous_was_model = false;
        // Calls of the newest model turn still waiting for their results,
        // which follow in order.
        let mut awaiting: std::collections::VecDeque<usize> = Default::default();
        // The newest user message since the last model turn.
        let mut prompt: Option<ResultAt> = None;
        // The calls awaiting results were written in the reply's text: the
        // next user message is their observation.
        let mut awaiting_text = false;
        for (_, (_, keys)) in items.kept() {
            let Some(keys) = keys.as_ref() else {
                previous_was_model = false;
                continue;
            };
            if !self.written_by_model(keys) {
                previous_was_model = false;
                // What a user wrote; a text action's observation is a
                // tool's output, not a user's message.
                if (awaiting.is_empty() || !awaiting_text) && self.word(keys, "role") == b"user" {
                    if let Some(span) = keys.get("content") {
                        prompt = Some(ResultAt::Value(span));
                    }
                }
                if !awaiting.is_empty() {
                    let role = self.word(keys, "role");
                    if awaiting_text && is_prompt_role(role) {
                        // A harness's reminder between a text action and
                        // its output: the output is still to come.
                        continue;
                    }
                    let mut results = self.results_of(keys);
                    if results.is_empty() && awaiting_text && role == b"user" {
                        // A text action's observation: the user message
                        // that follows answers every action of the reply.
                        if let Some(span) = keys.get("content") {
                            results = vec![ResultAt::Value(span); awaiting.len()];
                        }
                    }
                    for at in results {
                        let Some(i) = awaiting.pop_front() else { break };
                        if let Some(call) = out.calls.get_mut(i) {
                            call.result = Some(at);
                        }
                    }
                    awaiting_text = false;
                }
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
            if turn != Some(t) {
                awaiting.clear();
                out.turns.push(ModelTurn {
                    prompt: prompt.take(),
                    ..ModelTurn::default()
                });
            }
            turn = Some(t);
            previous_was_model = true;
            let kind = self.word(keys, "type");
            if kind.is_empty() || kind == b"message" {
                // Its text (a string, or blocks whose text parts count).
                if let (Some(span), Some(current)) = (keys.get("content"), out.turns.last_mut()) {
                    let raw = self.body.get(span.0..span.1).unwrap_or_default();
                    if raw != b"null" && raw != b"\"\"" && raw != b"[]" {
                        current.answer = Some(ResultAt::Value(span));
                    }
                }
            }
            let Some(key) = self.call_bytes(keys, kind) else {
                // A text reply: its text may carry actions.
                if let Some(n) = self.text_actions(keys, &mut cache, t, &mut out, &mut awaiting) {
                    awaiting_text = n > 0;
                } else {
                    break;
                }
                continue;
            };
            let cached = key
                .as_deref()
                .and_then(|key| cache.as_deref()?.get(key))
                .map(<[_]>::to_vec);
            let calls = match cached {
                Some(calls) => calls,
                None => {
                    let held = [
                        "tool_calls",
                        "function_call",
                        "content",
                        "arguments",
                        "input",
                    ];
                    if held
                        .iter()
                        .filter_map(|k| keys.get(k))
                        .any(|span| !self.afford(span))
                    {
                        break;
                    }
                    let calls: Vec<(Rc<str>, Rc<str>)> = self
                        .calls_of(&keys.members(), kind)
                        .into_iter()
                        .map(|(n, a)| (Rc::from(n), Rc::from(a)))
                        .collect();
                    if let (Some(c), Some(key)) = (cache.as_deref_mut(), key.as_deref()) {
                        c.put(key, calls.clone());
                    }
                    calls
                }
            };
            if calls.is_empty() && kind != b"reasoning" {
                // Content blocks without a call: their text may carry
                // actions.
                if let Some(n) = self.text_actions(keys, &mut cache, t, &mut out, &mut awaiting) {
                    awaiting_text = n > 0;
                } else {
                    break;
                }
                continue;
            }
            awaiting_text = false;
            if let Some(current) = out.turns.last_mut() {
                current.calls += calls.len();
            }
            for (name, arguments) in calls {
                awaiting.push_back(out.calls.len());
                out.calls.push(ToolCall {
                    name,
                    arguments,
                    turn: t,
                    result: None,
                });
            }
        }
        out.newest_turn = turn;
        out
    }

    /// Read the actions a model item writes in its text (see
    /// [`super::actions`]) as calls of turn `turn`, waiting for their
    /// observation; how many, or `None` when the text would exceed the
    /// request's parsing budget. Parsed once per item's bytes with a cache.
    fn text_actions(
        &self,
        keys: &scan::Picked,
        cache: &mut Option<&mut CallCache>,
        turn: usize,
        out: &mut ToolHistory,
        awaiting: &mut std::collections::VecDeque<usize>,
    ) -> Option<usize> {
        let Some(span) = keys.get("content") else {
            return Some(0);
        };
        let raw = self.body.get(span.0..span.1).unwrap_or_default();
        if !may_read_actions(raw) {
            return Some(0);
        }
        let mut key = Vec::with_capacity(raw.len() + 5);
        key.extend_from_slice(raw);
        key.extend_from_slice(b"\x04text");
        let cached = cache
            .as_deref()
            .and_then(|c| c.get(&key))
            .map(<[_]>::to_vec);
        let calls = match cached {
            Some(calls) => calls,
            None => {
                let Ok(text) = self.reply_text(span) else {
                    return None;
                };
                let text = text.unwrap_or_default();
                let calls: Vec<(Rc<str>, Rc<str>)> = super::actions::read(&text)
                    .into_iter()
                    .map(|a| (Rc::from(a.name), Rc::from(a.arguments)))
                    .collect();
                if let Some(c) = cache.as_deref_mut() {
                    c.put(&key, calls.clone());
                }
                calls
            }
        };
        if let Some(current) = out.turns.last_mut() {
            current.calls += calls.len();
        }
        let n = calls.len();
        for (name, arguments) in calls {
            awaiting.push_back(out.calls.len());
            out.calls.push(ToolCall {
                name,
                arguments,
                turn,
                result: None,
            });
        }
        Some(n)
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

    /// The tool results an item carries, in order: a chat `tool` message's
    /// content, a Responses `function_call_output`'s output, the
    /// `tool_result` blocks of an Anthropic user message.
    fn results_of(&self, keys: &scan::Picked) -> Vec<ResultAt> {
        let value = |span: Option<Span>| span.map_or(ResultAt::Empty, ResultAt::Value);
        let role = self.word(keys, "role");
        if role == b"tool" || role == b"function" {
            return vec![value(keys.get("content"))];
        }
        let kind = self.word(keys, "type");
        if matches!(kind, b"function_call_output" | b"custom_tool_call_output") {
            return vec![value(keys.get("output"))];
        }
        let Some(blocks) = keys
            .get("content")
            .filter(|s| self.body.get(s.0) == Some(&b'['))
            .and_then(|s| scan::elements(self.body, s))
        else {
            return Vec::new();
        };
        blocks
            .into_iter()
            .filter_map(|b| scan::members(self.body, b))
            .filter(|m| {
                scan::get(m, "type")
                    .and_then(|s| scan::plain_str(self.body, s))
                    .is_some_and(|t| t == b"tool_result")
            })
            .map(|m| value(scan::get(&m, "content")))
            .collect()
    }

    /// A tool result's text, normalised (its text parts joined; media as
    /// a hash), or `None` if it cannot be read within the request's
    /// parsing budget.
    pub fn result_text(&self, at: ResultAt) -> Option<String> {
        let ResultAt::Value(span) = at else {
            return Some(String::new());
        };
        let raw = self.body.get(span.0..span.1)?;
        if raw.first() == Some(&b'"') {
            return normalize::normalize_json_str(raw);
        }
        if !self.afford(span) {
            return None;
        }
        let v = serde_json::from_slice::<Value>(raw).ok()?;
        let mut out = String::new();
        flatten(&normalize::content(&v), &mut out);
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
            ResultAt::Value(span) if self.body.get(span.0) != Some(&b'"') => self.afford(span),
            _ => true,
        }
    }

    /// Whether the model wrote this item, by its `role` or `type`.
    pub(super) fn written_by_model(&self, keys: &scan::Picked) -> bool {
        let role = self.word(keys, "role");
        role.eq_ignore_ascii_case(b"assistant")
            || matches!(
                self.word(keys, "type"),
                b"function_call" | b"custom_tool_call" | b"reasoning"
            )
    }

    /// A key that is a plain word (`role`, `type`), or empty.
    pub(super) fn word(&self, keys: &scan::Picked, key: &str) -> &[u8] {
        keys.get(key)
            .and_then(|s| scan::plain_str(self.body, s))
            .unwrap_or_default()
    }

    /// The parts of a model item that can hold tool calls, as one key for
    /// the call cache: a function-call item's name and arguments, a chat
    /// message's `tool_calls` and `function_call`, an Anthropic message's
    /// content blocks (a plain text content holds no calls).
    fn call_bytes(&self, keys: &scan::Picked, kind: &[u8]) -> Option<Option<Vec<u8>>> {
        let names: &[&str] = if matches!(kind, b"function_call" | b"custom_tool_call") {
            &["name", "arguments", "input"]
        } else {
            &["tool_calls", "function_call", "content"]
        };
        let mut parts: Vec<&[u8]> = Vec::with_capacity(3);
        for key in names {
            if let Some((start, end)) = keys.get(key) {
                let raw = self.body.get(start..end).unwrap_or_default();
                if *key == "content" && raw.first() != Some(&b'[') || raw == b"null" {
                    continue;
                }
                parts.push(raw);
            }
        }
        if parts.is_empty() {
            return None;
        }
        let len = parts.iter().map(|p| p.len() + 4).sum::<usize>() + 1 + kind.len();
        if len > MAX_CACHED_ITEM {
            // Calls, but too large an item to copy as a cache key.
            return Some(None);
        }
        let mut out = Vec::with_capacity(len);
        for raw in parts {
            out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
            out.extend_from_slice(raw);
        }
        out.push(kind.len() as u8);
        out.extend_from_slice(kind);
        Some(Some(out))
    }

    /// The tool calls of one model item: Responses `function_call` items,
    /// chat `tool_calls` (and the legacy `function_call`), Anthropic
    /// `tool_use` blocks in the content. Only names and arguments are
    /// parsed.
    fn calls_of(&self, members: &[(&[u8], Span)], kind: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if matches!(kind, b"function_call" | b"custom_tool_call") {
            let args = scan::get(members, "arguments").or_else(|| scan::get(members, "input"));
            out.push(self.call(members, args));
            return out;
        }
        let object = |s: Span| scan::members(self.body, s);
        if let Some(calls) =
            scan::get(members, "tool_calls").and_then(|s| scan::elements(self.body, s))
        {
            for c in calls {
                let Some(call) = object(c) else { continue };
                // {"id", "type", "function": {"name", "arguments"}}
                let function = scan::get(&call, "function").and_then(object);
                let f = function.as_deref().unwrap_or(&call);
                out.push(self.call(f, scan::get(f, "arguments")));
            }
        }
        if let Some(f) = scan::get(members, "function_call").and_then(object) {
            out.push(self.call(&f, scan::get(&f, "arguments")));
        }
        if let Some(blocks) =
            scan::get(members, "content").and_then(|s| scan::elements(self.body, s))
        {
            for b in blocks {
                let Some(block) = object(b) else { continue };
                let is_call = scan::get(&block, "type")
                    .and_then(|s| scan::plain_str(self.body, s))
                    .is_some_and(|t| t == b"tool_use" || t == b"server_tool_use");
                if is_call {
                    out.push(self.call(&block, scan::get(&block, "input")));
                }
            }
        }
        out
    }

    /// A call's name and canonical arguments, from the members of the object
    /// holding `name`, and the arguments' span.
    fn call(&self, members: &[(&[u8], Span)], args: Option<Span>) -> (String, String) {
        let text = |s: Span| self.body.get(s.0..s.1);
        let name = scan::get(members, "name")
            .and_then(|s| match scan::plain_str(self.body, s) {
                Some(plain) => std::str::from_utf8(plain).ok().map(str::to_string),
                None => serde_json::from_slice::<String>(text(s)?).ok(),
            })
            .unwrap_or_default();
        let arguments = match args.and_then(text) {
            None => normalize::canonical_arguments(&Value::Null),
            Some(raw) if raw.first() == Some(&b'"') => {
                match serde_json::from_slice::<String>(raw) {
                    Ok(inner) => normalize::canonical_text(&inner),
                    Err(_) => String::new(),
                }
            }
            Some(raw) => match args.and_then(|s| scan::canonical(self.body, s)) {
                Some(c) => c,
                None => String::from_utf8_lossy(raw).trim().to_string(),
            },
        };
        (name, arguments)
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
        let choice_edit = match self.tool_choice {
            Some((start, end)) => Edit {
                at: start,
                remove: end - start,
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
        let (_, end) = self.array?;
        let close = end.checked_sub(1)?;
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
            Items::List(l) => l.last(),
            Items::Text(_) => None,
        };
        let Some(last) = last else {
            return self.append_item(&format!("{{\"role\":\"user\",\"content\":[{block}]}}"));
        };
        let members = scan::members(self.body, last)?;
        let is_user = scan::get(&members, "role")
            .and_then(|s| scan::plain_str(self.body, s))
            .is_some_and(|r| r.eq_ignore_ascii_case(b"user"));
        match scan::get(&members, "content") {
            Some(content) if is_user && self.body.get(content.0) == Some(&b'[') => {
                let empty = scan::elements(self.body, content)?.is_empty();
                Some(Edit {
                    at: content.1.checked_sub(1)?,
                    remove: 0,
                    insert: if empty { block } else { format!(",{block}") },
                })
            }
            Some(content) if is_user && self.body.get(content.0) == Some(&b'"') => {
                let original = std::str::from_utf8(self.body.get(content.0..content.1)?).ok()?;
                Some(Edit {
                    at: content.0,
                    remove: content.1 - content.0,
                    insert: format!("[{{\"type\":\"text\",\"text\":{original}}},{block}]"),
                })
            }
            _ => self.append_item(&format!("{{\"role\":\"user\",\"content\":[{block}]}}")),
        }
    }
}

/// Whether a reply's content, as bytes, is read for text actions: not
/// longer than [`super::actions::MAX_TEXT_BYTES`], and showing a marker of
/// one (a cheap test before decoding it).
fn may_read_actions(raw: &[u8]) -> bool {
    raw.len() <= super::actions::MAX_TEXT_BYTES && may_hold_action(raw)
}

/// Whether a content's bytes show a marker of a text action.
fn may_hold_action(raw: &[u8]) -> bool {
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

/// A system or developer message's role.
pub(super) fn is_prompt_role(role: &[u8]) -> bool {
    role.eq_ignore_ascii_case(b"system") || role.eq_ignore_ascii_case(b"developer")
}

/// The text blocks of a content array (Chat and Anthropic `text`,
/// Responses `output_text`), joined by line ends.
fn text_blocks(v: &Value) -> String {
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

/// A byte edit: at `at`, drop `remove` bytes and put `insert` there.
#[derive(Debug)]
struct Edit {
    at: usize,
    remove: usize,
    insert: String,
}

/// Parts as one text: texts joined by spaces, other parts by a marker.
fn flatten(parts: &[super::Part], out: &mut String) {
    use super::Part;
    for p in parts {
        if !out.is_empty() {
            out.push(' ');
        }
        match p {
            Part::Text(t) => out.push_str(t),
            Part::Media(h) => {
                out.push_str("<media:");
                for b in h.iter().take(8) {
                    out.push_str(&format!("{b:02x}"));
                }
                out.push('>');
            }
            Part::ToolCall { name, arguments } => {
                out.push_str(name);
                out.push(' ');
                out.push_str(arguments);
            }
            Part::ToolResult { content, .. } => flatten(content, out),
            Part::Other(kind) => {
                out.push('<');
                out.push_str(kind);
                out.push('>');
            }
        }
    }
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

#[cfg(test)]
mod marker_tests {
    use super::may_hold_action;

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
            proptest::prop_assert_eq!(may_hold_action(raw.as_bytes()), reference(raw.as_bytes()));
        }
    }
}
