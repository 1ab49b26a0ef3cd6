//! LLM request bodies: which API they speak, the model, and the
//! conversation, normalised so that loops repeat exactly.
//!
//! Understood formats, recognised from the body's shape:
//! - OpenAI Chat Completions: `model`, `messages`, `tools`;
//! - OpenAI Responses: `model`, `input` (a string or items), `instructions`,
//!   `tools`;
//! - Anthropic Messages: `model`, `system`, `messages` of content blocks,
//!   `tools`.
//!
//! Parsing is lazy: one structural pass ([`scan`]) finds the envelope's
//! fields and the conversation's items without building them; only the
//! values loopguard needs (the model, the conversation's tail, the model's
//! tool calls) are parsed for real.

pub mod actions;
pub(crate) mod normalize;
pub mod scan;
mod tools;
pub mod volatile;

pub use normalize::{canonical_json, normalize_text};
pub use tools::{CallCache, ModelTurn, ResultAt, ToolCall, ToolHistory};

use scan::{Elements, Refusal, Span};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::cell::Cell;

/// Values a request may parse into trees (conversation items that are more
/// than plain text, tool calls): what keeps a crafted body from costing
/// more memory than its own bytes.
pub const MAX_PARSED_VALUES: usize = 32_768;

/// Why a body was not read as an LLM request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRead {
    /// Not JSON, or not one of the understood formats.
    NotLlm,
    /// Refused by the scanner's bounds (see [`scan::Refusal`]).
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::OpenAiChat => "openai_chat",
            Format::OpenAiResponses => "openai_responses",
            Format::Anthropic => "anthropic",
        }
    }
}

/// A recognised LLM request, its messages still raw.
#[derive(Debug)]
pub struct Request<'a> {
    pub format: Format,
    /// The model as sent (`None` when the body names none).
    pub model: Option<String>,
    /// The request offers the model tools.
    pub offers_tools: bool,
    /// The system prompt given outside the messages (Anthropic `system`,
    /// Responses `instructions`), counted as the conversation's first
    /// message.
    system: Option<Span>,
    /// The conversation in order (Responses: the input items): the first
    /// item and the last ones the policy reads, each with its members read
    /// while splitting the conversation.
    items: Items,
    /// The conversation array (`messages` or `input`) and `tool_choice`,
    /// for edits.
    array: Option<Span>,
    tool_choice: Option<Span>,
    body: &'a [u8],
    /// Values still allowed to be parsed into trees.
    budget: Cell<usize>,
    /// Set once the budget ran out: the body is then refused.
    over_budget: Cell<bool>,
    /// Items whose text actions were read ([`Request::text_actions_of`]).
    actions_memo: std::cell::RefCell<Vec<(usize, Vec<actions::TextAction>)>>,
}

/// (The list variant is large: a request holds one, inside its own state.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Items {
    List(Elements),
    /// Responses `input` given as one string: a single user message.
    Text(String),
}

/// One normalised message: its role and its parts in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub parts: Vec<Part>,
}

impl Message {
    /// A system or developer prompt.
    pub fn is_prompt(&self) -> bool {
        matches!(self.role.as_str(), "system" | "developer")
    }

    /// Written by a person or the system, not by the model or a tool: the
    /// request's intent, which masking and SimHash folding leave as it is.
    pub fn is_authored(&self) -> bool {
        self.role == "user" || self.is_prompt()
    }

    /// Only tool results (a `tool` message, a `function_call_output`, a
    /// user turn of `tool_result` blocks).
    pub fn is_results(&self) -> bool {
        !self.parts.is_empty()
            && self
                .parts
                .iter()
                .all(|p| matches!(p, Part::ToolResult { .. }))
    }

    /// The model's turn that calls tools, or a part of it (a Responses
    /// `function_call` or `reasoning` item).
    pub fn is_model_step(&self) -> bool {
        !self.is_authored()
            && !self.is_results()
            && self
                .parts
                .iter()
                .any(|p| matches!(p, Part::ToolCall { .. } | Part::Other(_)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Lower-cased, whitespace collapsed and trimmed; never empty.
    Text(String),
    /// SHA-256 of an image's (or audio clip's, or file's) URL or data.
    Media([u8; 32]),
    /// A tool call: name and canonical arguments (never its call id).
    ToolCall { name: String, arguments: String },
    /// A tool result, keyed by its normalised content (never by the id of
    /// the call it answers).
    ToolResult { content: Vec<Part>, is_error: bool },
    /// A block of a kind loopguard does not read, by its type name.
    Other(String),
}

/// Recognise an LLM request, keeping the first conversation item and the
/// last `keep` (what the policy reads; memory is proportional to it, not to
/// the body). `Err` when the body is not JSON or not one of the understood
/// formats, or when the scanner refused it ([`scan`]'s bounds). `path`
/// helps tell Anthropic from OpenAI chat when the body alone cannot.
pub fn parse<'a>(body: &'a [u8], path: &str, keep: usize) -> Result<Request<'a>, NotRead> {
    read(body, path, keep).ok_or_else(|| match scan::refusal(body) {
        Some(r) => NotRead::Refused(r),
        None => NotRead::NotLlm,
    })
}

fn read<'a>(body: &'a [u8], path: &str, keep: usize) -> Option<Request<'a>> {
    let start = scan::skip_ws(body, 0);
    let (top, arrays) =
        scan::members_split(body, (start, body.len()), &["messages", "input"], keep)?;
    let mut arrays = arrays;
    let mut split = |key: &str| {
        let at = arrays.iter().position(|(k, _)| *k == key.as_bytes())?;
        Some(arrays.swap_remove(at).1)
    };
    // One object and only whitespace after it.
    let end = top.last().map_or(start, |(_, v)| v.1);
    let close = body.get(scan::skip_ws(body, end)..)?;
    if scan::skip_ws(close, 1) != close.len() || close.first() != Some(&b'}') {
        return None;
    }
    let field = |name: &str| scan::get(&top, name);
    let slice = |s: Span| body.get(s.0..s.1);
    let model = field("model")
        .and_then(slice)
        .and_then(|raw| serde_json::from_slice::<String>(raw).ok());
    let offers_tools = ["tools", "functions"]
        .iter()
        .filter_map(|k| field(k).and_then(slice))
        .any(|raw| !matches!(raw, b"null" | b"[]" | b"{}"));
    let tool_choice = field("tool_choice");
    let request = |format, system, items, array| Request {
        format,
        model: model.clone(),
        offers_tools,
        system,
        items,
        array,
        tool_choice,
        body,
        budget: Cell::new(MAX_PARSED_VALUES),
        over_budget: Cell::new(false),
        actions_memo: Default::default(),
    };
    if let Some(messages) = field("messages") {
        let list = split("messages")?;
        let system = field("system");
        let anthropic = system.is_some() || is_anthropic_path(path);
        let format = if anthropic {
            Format::Anthropic
        } else {
            Format::OpenAiChat
        };
        return Some(request(format, system, Items::List(list), Some(messages)));
    }
    let input = field("input")?;
    let (items, array) = match body.get(input.0)? {
        b'"' => (
            Items::Text(serde_json::from_slice::<String>(slice(input)?).ok()?),
            None,
        ),
        b'[' => (Items::List(split("input")?), Some(input)),
        _ => return None,
    };
    Some(request(
        Format::OpenAiResponses,
        field("instructions"),
        items,
        array,
    ))
}

/// Anthropic's Messages API path (also under a prefix, e.g.
/// `/anthropic/v1/messages`).
pub fn is_anthropic_path(path: &str) -> bool {
    path.ends_with("/v1/messages")
}

/// The `model` a body names, found without parsing it (for pricing a
/// request no LLM mode read): the first `"model"` key whose value is a
/// plain string. (An unescaped quoted key can only be a key: quotes inside
/// JSON strings are escaped.)
pub fn model_of(body: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"\"model\"";
    let mut from = 0;
    while let Some(at) = body.get(from..).and_then(|b| memchr::memmem::find(b, KEY)) {
        from += at + KEY.len();
        let rest = body.get(from..)?.trim_ascii_start();
        let Some(value) = rest.strip_prefix(b":") else {
            continue;
        };
        let Some(value) = value.trim_ascii_start().strip_prefix(b"\"") else {
            continue;
        };
        let end = memchr::memchr2(b'"', b'\\', value)?;
        if value.get(end) != Some(&b'"') || end == 0 || end > 256 {
            return None;
        }
        return std::str::from_utf8(value.get(..end)?)
            .ok()
            .map(str::to_string);
    }
    None
}

/// Whether a path (query excluded) is one of the LLM APIs loopguard reads:
/// OpenAI Chat Completions, Completions and Responses, Anthropic Messages.
pub fn is_llm_api_path(path: &str) -> bool {
    [
        "/chat/completions",
        "/completions",
        "/responses",
        "/messages",
    ]
    .iter()
    .any(|end| path.ends_with(end))
}

impl<'a> Request<'a> {
    /// Messages in the conversation, the out-of-band system prompt
    /// included.
    pub fn len(&self) -> usize {
        let items = match &self.items {
            Items::List(l) => l.len(),
            Items::Text(_) => 1,
        };
        items + usize::from(self.system.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The conversation's first message, normalised (the out-of-band
    /// system prompt if there is one): stable across the turns of one
    /// conversation.
    pub fn first_message(&self) -> Option<Message> {
        if let Some(sys) = self.system {
            return self.system_message(sys);
        }
        match &self.items {
            Items::Text(text) => Some(Message {
                role: "user".to_string(),
                parts: text_parts(text),
            }),
            Items::List(items) => self.item(0, items.get(0)?.0),
        }
    }

    /// The conversation's task, as near mode's salt reads it: its first
    /// user message (not one of tool results) among the first
    /// [`scan::LEADING`] items or, with none there, its system prompt (out
    /// of band, or system and developer items). Stable across the turns of
    /// one conversation, different between tasks. Items the model or a
    /// tool wrote are passed over unread, and the prompts are read only
    /// when no user message stands for the task (a coding agent's system
    /// prompt of many kilobytes is not read on every request).
    pub fn task(&self) -> Vec<Message> {
        let items = match &self.items {
            Items::Text(text) => {
                return vec![Message {
                    role: "user".to_string(),
                    parts: text_parts(text),
                }]
            }
            Items::List(items) => items,
        };
        let mut prompts = Vec::new();
        for i in 0..scan::LEADING {
            let Some(e) = items.get(i) else { break };
            let role = e.1.as_ref().map_or(&b""[..], |k| self.word(k, "role"));
            if [&b"assistant"[..], b"tool", b"function"]
                .iter()
                .any(|r| role.eq_ignore_ascii_case(r))
            {
                continue;
            }
            if [&b"system"[..], b"developer"]
                .iter()
                .any(|r| role.eq_ignore_ascii_case(r))
            {
                prompts.push(i);
                continue;
            }
            let Some(m) = self.item(i, e.0) else { break };
            if m.is_prompt() {
                prompts.push(i);
            } else if m.role == "user"
                && !m.parts.iter().any(|p| matches!(p, Part::ToolResult { .. }))
            {
                return vec![m];
            }
        }
        let mut out = Vec::with_capacity(prompts.len() + 1);
        if let Some(sys) = self.system {
            out.extend(self.system_message(sys));
        }
        for i in prompts {
            if let Some(m) = items.get(i).and_then(|e| self.item(i, e.0)) {
                if m.is_prompt() {
                    out.push(m);
                }
            }
        }
        out
    }

    /// Whether parsing ran out of its budget ([`MAX_PARSED_VALUES`]): the
    /// body is then refused, whatever was read of it.
    pub fn over_budget(&self) -> bool {
        self.over_budget.get()
    }

    /// Take `span`'s values from the budget before parsing it into a tree;
    /// false (and the request over budget) when they do not fit.
    pub(super) fn afford(&self, span: Span) -> bool {
        if self.over_budget.get() {
            return false;
        }
        match scan::count_nodes(self.body, span, self.budget.get()) {
            Some(n) => {
                self.budget.set(self.budget.get() - n);
                true
            }
            None => {
                self.over_budget.set(true);
                false
            }
        }
    }

    /// One conversation item, normalised (an unreadable one becomes an
    /// opaque marker, so it still counts and still differs from real ones).
    fn item(&self, index: usize, span: Span) -> Option<Message> {
        let mut m = match self.plain_item(index) {
            Some(m) => m,
            None => {
                if !self.afford(span) {
                    return None;
                }
                let v = serde_json::from_slice::<Value>(self.slice(span)?).ok()?;
                normalize::message(&v)
            }
        };
        self.read_text_actions(index, &mut m);
        Some(m)
    }

    /// Actions written in text read as what they are
    /// ([`actions`]): a model's reply that writes its action becomes that
    /// call (its narration around it is not compared: two turns that do
    /// the same are the same step, however the model words them), and the
    /// user message after such a reply (its observation) becomes its result.
    fn read_text_actions(&self, index: usize, m: &mut Message) {
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
            for a in found {
                m.parts.push(Part::ToolCall {
                    name: a.name,
                    arguments: a.arguments,
                });
            }
        } else if m.role == "user" && no_calls() && self.follows_text_action(index) {
            let content = std::mem::take(&mut m.parts);
            m.parts = vec![Part::ToolResult {
                content,
                is_error: false,
            }];
        }
    }

    /// Whether item `index` comes after a reply that wrote actions in its
    /// text, with at most a harness's reminders (system or developer
    /// messages) in between: it is then their observation.
    fn follows_text_action(&self, index: usize) -> bool {
        let Items::List(items) = &self.items else {
            return false;
        };
        let mut j = index;
        for _ in 0..4 {
            let Some(prev) = j.checked_sub(1) else {
                return false;
            };
            j = prev;
            let Some(keys) = items.get(j).and_then(|e| e.1.as_ref()) else {
                return false;
            };
            if !tools::is_prompt_role(self.word(keys, "role")) {
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
        let Some(keys) = items.get(index).and_then(|e| e.1.as_ref()) else {
            return Vec::new();
        };
        if !self.word(keys, "role").eq_ignore_ascii_case(b"assistant")
            || keys.get("tool_calls").is_some()
            || keys.get("function_call").is_some()
        {
            return Vec::new();
        }
        let Some(span) = keys.get("content") else {
            return Vec::new();
        };
        match self.reply_text(span) {
            Ok(Some(text)) => actions::read(&text),
            _ => Vec::new(),
        }
    }

    /// The common message, `{"role": ..., "content": "<text>"}` (plus fields
    /// that do not matter, like `name` or `tool_call_id`), read straight
    /// from the bytes; `None` sends anything richer to the full parser.
    fn plain_item(&self, index: usize) -> Option<Message> {
        let Items::List(items) = &self.items else {
            return None;
        };
        let keys = items.get(index)?.1.as_ref()?;
        let rich = ["type", "tool_calls", "function_call", "arguments", "input"];
        if keys.others || rich.iter().any(|k| keys.get(k).is_some()) {
            return None;
        }
        let role = scan::plain_str(self.body, keys.get("role")?)?;
        let role = std::str::from_utf8(role).ok()?.to_ascii_lowercase();
        let raw = self.slice(keys.get("content")?)?;
        let text = match raw.first()? {
            b'"' => normalize::normalize_json_str(raw)?,
            b'n' if raw == b"null" => String::new(),
            _ => return None,
        };
        let body = if text.is_empty() {
            Vec::new()
        } else {
            vec![Part::Text(text)]
        };
        let parts = if role == "tool" || role == "function" {
            vec![Part::ToolResult {
                content: body,
                is_error: false,
            }]
        } else {
            body
        };
        Some(Message { role, parts })
    }

    fn system_message(&self, span: Span) -> Option<Message> {
        if !self.afford(span) {
            return None;
        }
        let v = serde_json::from_slice::<Value>(self.slice(span)?).ok()?;
        Some(Message {
            role: "system".to_string(),
            parts: normalize::content(&v),
        })
    }

    /// The conversation's first message as sent (the out-of-band system
    /// prompt if there is one): raw bytes, for keying the conversation
    /// without normalising it.
    pub fn first_raw(&self) -> Option<&[u8]> {
        if let Some(sys) = self.system {
            return self.slice(sys);
        }
        match &self.items {
            Items::Text(text) => Some(text.as_bytes()),
            Items::List(items) => self.slice(items.get(0)?.0),
        }
    }

    fn slice(&self, span: Span) -> Option<&'_ [u8]> {
        self.body.get(span.0..span.1)
    }

    /// The last `n` messages, normalised, oldest first (messages that
    /// carry nothing comparable, like reasoning, still count). `None` when
    /// one of them cannot be read (not JSON inside, invalid UTF-8): the
    /// request is then not treated as an LLM call.
    pub fn tail(&self, n: usize) -> Option<Vec<Message>> {
        self.tail_before(n, usize::MAX)
    }

    /// [`Request::tail`] of the conversation as it was before item `end`
    /// (the request sent then): its last `n` messages before `end`.
    pub fn tail_before(&self, n: usize, end: usize) -> Option<Vec<Message>> {
        let mut out = Vec::with_capacity(n.min(self.len()));
        match &self.items {
            Items::Text(text) => {
                if n >= 2 {
                    if let Some(sys) = self.system {
                        out.push(self.system_message(sys)?);
                    }
                }
                if n >= 1 {
                    out.push(Message {
                        role: "user".to_string(),
                        parts: text_parts(text),
                    });
                }
            }
            Items::List(items) => {
                let end = end.min(items.len());
                if n > end {
                    if let Some(sys) = self.system {
                        out.push(self.system_message(sys)?);
                    }
                }
                let start = end.saturating_sub(n);
                for i in start..end {
                    out.push(self.item(i, items.get(i)?.0)?);
                }
            }
        }
        Some(out)
    }
}

use crate::config::MAX_STEP_EXTENSION;

impl Request<'_> {
    /// The last `n` messages as whole steps: a tail that would begin with
    /// tool results reaches back over them to the calls they answer (an
    /// agent's parallel calls come back one result a message, so the last
    /// 3 messages can hold results with none of their calls, and two fan-
    /// outs to different services would look alike), at most
    /// [`MAX_STEP_EXTENSION`] messages more. Near mode compares such tails.
    pub fn tail_of_steps(&self, n: usize) -> Option<Vec<Message>> {
        self.tail_of_steps_before(n, usize::MAX)
    }

    /// [`Request::tail_of_steps`] of the conversation as it was before item
    /// `end`.
    pub fn tail_of_steps_before(&self, n: usize, end: usize) -> Option<Vec<Message>> {
        let Items::List(items) = &self.items else {
            return self.tail_before(n, end);
        };
        self.tail_of_steps_at(n, end)?
            .into_iter()
            .map(|at| match at {
                None => self.system.and_then(|sys| self.system_message(sys)),
                Some(i) => items.get(i).and_then(|e| self.item(i, e.0)),
            })
            .collect()
    }

    /// Where the messages of [`Request::tail_of_steps_before`] are, oldest
    /// first: an item's index, or `None` for the out-of-band system prompt
    /// (a caller comparing several tails reads each message once). `None`
    /// when the conversation is one string, or a message cannot be read.
    pub fn tail_of_steps_at(&self, n: usize, end: usize) -> Option<Vec<Option<usize>>> {
        let Items::List(items) = &self.items else {
            return None;
        };
        let end = end.min(items.len());
        let mut tail: Vec<Option<usize>> = Vec::with_capacity(n + 1);
        if n > end && self.system.is_some() {
            tail.push(None);
        }
        let start = end.saturating_sub(n);
        tail.extend((start..end).map(Some));
        let first_is_results = match tail.first() {
            Some(Some(i)) => items.get(*i).and_then(|e| self.item(*i, e.0))?.is_results(),
            _ => false,
        };
        if end - start < n || !first_is_results {
            return Some(tail);
        }
        let mut before = Vec::new();
        let mut next = start;
        let mut calls_seen = false;
        while next > 0 && before.len() < MAX_STEP_EXTENSION {
            let i = next - 1;
            let Some(m) = items.get(i).and_then(|e| self.item(i, e.0)) else {
                break;
            };
            // Results, then the model's turn that called them.
            let take = if calls_seen {
                m.is_model_step()
            } else if m.is_results() {
                true
            } else {
                calls_seen = m.is_model_step();
                calls_seen
            };
            if !take {
                break;
            }
            before.push(Some(i));
            next = i;
        }
        before.reverse();
        before.append(&mut tail);
        Some(before)
    }

    /// The messages a user wrote (not tool results, not a text action's
    /// observation) among the kept items `from..to`, with their indices.
    pub fn user_messages_between(&self, from: usize, to: usize) -> Vec<(usize, Message)> {
        let Items::List(items) = &self.items else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for i in from..to.min(items.len()) {
            let Some(e) = items.get(i) else { continue };
            let is_user =
                e.1.as_ref()
                    .is_some_and(|keys| self.word(keys, "role").eq_ignore_ascii_case(b"user"));
            if !is_user {
                continue;
            }
            if let Some(m) = self.item(i, e.0) {
                if !m.is_results() {
                    out.push((i, m));
                }
            }
        }
        out
    }

    /// The message at a place [`Request::tail_of_steps_at`] gave.
    pub fn message_at(&self, at: Option<usize>) -> Option<Message> {
        match (at, &self.items) {
            (None, _) => self.system.and_then(|sys| self.system_message(sys)),
            (Some(i), Items::List(items)) => items.get(i).and_then(|e| self.item(i, e.0)),
            (Some(_), Items::Text(_)) => None,
        }
    }
}

impl Request<'_> {
    /// Where the conversation's last model turns began, newest first, at
    /// most `k` of them among the kept items: the request sent before each
    /// held the items before it ([`Request::tail_before`]). Turns are
    /// counted as the tool history counts them: a Responses run of model
    /// items is one turn, each Chat or Anthropic reply another.
    pub fn turn_starts(&self, k: usize) -> Vec<usize> {
        let Items::List(items) = &self.items else {
            return Vec::new();
        };
        let model = |i: usize| {
            items
                .get(i)
                .and_then(|e| e.1.as_ref())
                .is_some_and(|keys| self.written_by_model(keys))
        };
        let mut out = Vec::new();
        let first_kept = items.kept().next().map_or(items.len(), |(i, _)| i);
        let mut i = items.len();
        while i > first_kept && out.len() < k {
            i -= 1;
            // As the tool history counts turns: a Responses run of model
            // items is one, each chat or Anthropic reply another.
            let continues = self.format == Format::OpenAiResponses && i > 0 && model(i - 1);
            if model(i) && !continues {
                out.push(i);
            }
        }
        out
    }
}

fn text_parts(text: &str) -> Vec<Part> {
    let t = normalize_text(text);
    if t.is_empty() {
        Vec::new()
    } else {
        vec![Part::Text(t)]
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod text_action_tests;
