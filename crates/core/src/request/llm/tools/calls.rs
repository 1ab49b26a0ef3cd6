//! A model item's tool calls, parsed in each provider's shape (Responses
//! `function_call` items, Chat `tool_calls` and the legacy
//! `function_call`, Anthropic `tool_use` blocks), names and canonical
//! arguments only; and the bytes that key an item in the call cache.

use super::MAX_CACHED_ITEM;
use crate::request::llm::scan::{self, Span};
use crate::request::llm::{normalize, Request};
use serde_json::Value;

impl Request<'_> {
    /// The parts of a model item that can hold tool calls, as one key for
    /// the call cache: a function-call item's name and arguments, a chat
    /// message's `tool_calls` and `function_call`, an Anthropic message's
    /// content blocks (a plain text content holds no calls).
    pub(super) fn call_bytes(&self, keys: &scan::Picked, kind: &[u8]) -> Option<Option<Vec<u8>>> {
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
    pub(super) fn calls_of(&self, members: &[(&[u8], Span)], kind: &[u8]) -> Vec<(String, String)> {
        if matches!(kind, b"function_call" | b"custom_tool_call") {
            let args = scan::get(members, "arguments").or_else(|| scan::get(members, "input"));
            return vec![self.call(members, args)];
        }
        let mut out = Vec::new();
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
        let blocks = self.blocks_of(
            scan::get(members, "content"),
            &[b"tool_use", b"server_tool_use"],
        );
        out.extend(blocks.map(|b| self.call(&b, scan::get(&b, "input"))));
        out
    }

    /// The objects in the array at `span` whose `type` is one of `types`
    /// (content blocks), as their members.
    pub(super) fn blocks_of<'s>(
        &'s self,
        span: Option<Span>,
        types: &'s [&[u8]],
    ) -> impl Iterator<Item = Vec<scan::Member<'s>>> + 's {
        let body = self.body;
        span.and_then(|s| scan::elements(body, s))
            .into_iter()
            .flatten()
            .filter_map(move |b| scan::members(body, b))
            .filter(move |m| {
                scan::get(m, "type")
                    .and_then(|s| scan::plain_str(body, s))
                    .is_some_and(|t| types.contains(&t))
            })
    }

    /// A call's name and canonical arguments, from the members of the object
    /// holding `name`, and the arguments' span.
    fn call(&self, members: &[(&[u8], Span)], args: Option<Span>) -> (String, String) {
        let text = |s: Span| self.body.get(s.0..s.1);
        let name = scan::get(members, "name")
            .and_then(|s| match scan::plain_str(self.body, s) {
                Some(plain) => std::str::from_utf8(plain).ok().map(str::to_string),
                None => scan::string(self.body, s),
            })
            .unwrap_or_default();
        let arguments = match args.and_then(text) {
            None => normalize::canonical_arguments(&Value::Null),
            Some(raw) if raw.first() == Some(&b'"') => serde_json::from_slice::<String>(raw)
                .map_or_else(|_| String::new(), |inner| normalize::canonical_text(&inner)),
            Some(raw) => args
                .and_then(|s| scan::canonical(self.body, s))
                .unwrap_or_else(|| String::from_utf8_lossy(raw).trim().to_string()),
        };
        (name, arguments)
    }
}
