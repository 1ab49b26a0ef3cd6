//! The conversation read into normalised messages, on demand: its length,
//! its first message and task, its tail. A plain text item is read straight
//! from the bytes, any other is parsed within the request's budget. Also
//! who wrote an item, told from its `role` and `type`.

use super::scan::{self, Span};
use super::{normalize, role_parts, text_parts, Items, Message, Part, Request};
use serde_json::Value;

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
            Items::Text(text) => Some(user_text(text)),
            Items::List(_) => self.item(0),
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
            Items::Text(text) => return vec![user_text(text)],
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
            if is_prompt_role(role) {
                prompts.push(i);
                continue;
            }
            let Some(m) = self.item(i) else { break };
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
        let read = prompts.into_iter().filter_map(|i| self.item(i));
        out.extend(read.filter(Message::is_prompt));
        out
    }

    /// Whether parsing ran out of its budget ([`MAX_PARSED_VALUES`]): the
    /// body is then refused, whatever was read of it.
    ///
    /// [`MAX_PARSED_VALUES`]: super::MAX_PARSED_VALUES
    pub fn over_budget(&self) -> bool {
        self.over_budget.get()
    }

    /// Take `span`'s values from the budget before parsing it into a tree;
    /// false (and the request over budget) when they do not fit.
    /// [`Request::afford`] for a value read as a whole again and again (a
    /// result read as lines, then as words): charged the first time only.
    pub(super) fn afford_once(&self, span: Span) -> bool {
        if self.charged.borrow().contains(&span) {
            return !self.over_budget.get();
        }
        let ok = self.afford(span);
        if ok {
            self.charged.borrow_mut().push(span);
        }
        ok
    }

    pub(super) fn afford(&self, span: Span) -> bool {
        if self.over_budget.get() {
            return false;
        }
        let n = scan::count_nodes(self.body, span, self.budget.get());
        self.over_budget.set(n.is_none());
        self.budget.set(self.budget.get() - n.unwrap_or(0));
        n.is_some()
    }

    /// The conversation's items (`None`: it is one string).
    pub(super) fn list(&self) -> Option<&scan::Elements> {
        match &self.items {
            Items::List(items) => Some(items),
            Items::Text(_) => None,
        }
    }

    /// One conversation item, normalised (an unreadable one becomes an
    /// opaque marker, so it still counts and still differs from real ones).
    pub(super) fn item(&self, index: usize) -> Option<Message> {
        let items = self.list()?;
        let mut m = match self.plain_item(index) {
            Some(m) => m,
            None => normalize::message(&self.parse(items.get(index)?.0)?),
        };
        self.read_text_actions(index, &mut m);
        Some(m)
    }

    /// The common message, `{"role": ..., "content": "<text>"}` (plus fields
    /// that do not matter, like `name` or `tool_call_id`), read straight
    /// from the bytes; `None` sends anything richer to the full parser.
    pub(super) fn plain_item(&self, index: usize) -> Option<Message> {
        let items = self.list()?;
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
        let body = (!text.is_empty()).then_some(Part::Text(text)).into_iter();
        let parts = role_parts(&role, body.collect());
        Some(Message { role, parts })
    }

    pub(super) fn system_message(&self, span: Span) -> Option<Message> {
        let parts = normalize::content(&self.parse(span)?);
        Some(Message::new("system", parts))
    }

    /// The value at `span` parsed into a tree, once its values are taken
    /// from the budget ([`Request::afford`]).
    fn parse(&self, span: Span) -> Option<Value> {
        if !self.afford(span) {
            return None;
        }
        serde_json::from_slice(self.slice(span)?).ok()
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

    /// The last `n` messages before item `end` (the request sent then;
    /// `usize::MAX`: the whole conversation), normalised, oldest first
    /// (messages that carry nothing comparable, like reasoning, still
    /// count). `None` when one of them cannot be read (not JSON inside,
    /// invalid UTF-8): the request is then not treated as an LLM call.
    pub fn tail_before(&self, n: usize, end: usize) -> Option<Vec<Message>> {
        let mut out = Vec::with_capacity(n.min(self.len()));
        match &self.items {
            Items::Text(text) => {
                if let Some(sys) = self.system.filter(|_| n >= 2) {
                    out.push(self.system_message(sys)?);
                }
                if n >= 1 {
                    out.push(user_text(text));
                }
            }
            Items::List(items) => {
                let end = end.min(items.len());
                if let Some(sys) = self.system.filter(|_| n > end) {
                    out.push(self.system_message(sys)?);
                }
                let start = end.saturating_sub(n);
                for i in start..end {
                    out.push(self.item(i)?);
                }
            }
        }
        Some(out)
    }
}

impl Request<'_> {
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
}

/// Responses `input` given as one string: a single user message.
fn user_text(text: &str) -> Message {
    Message::new("user", text_parts(text))
}

/// A system or developer message's role.
pub(super) fn is_prompt_role(role: &[u8]) -> bool {
    role.eq_ignore_ascii_case(b"system") || role.eq_ignore_ascii_case(b"developer")
}
