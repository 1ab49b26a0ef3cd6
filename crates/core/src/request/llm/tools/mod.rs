//! The tool calls in a conversation's history: each call the model made,
//! the turn it belongs to and where its result is, read in one walk over
//! the kept items; a cache keeps the calls of model items already parsed.
//! A model item's calls are parsed in [`calls`], results found in
//! [`results`].

mod calls;
mod results;

use super::messages::is_prompt_role;
use super::scan::{self, Span};
use super::text_actions::may_read_actions;
use super::{Format, Items, Request};
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

/// A call's name and canonical arguments.
type Call = (Rc<str>, Rc<str>);
/// An item's call-holding bytes and the calls parsed from them.
type CachedItem = (Vec<u8>, Vec<Call>);

const CALL_CACHE_BYTES: usize = 2 << 20;
/// Model items whose call-holding bytes exceed this are parsed without the
/// cache (their bytes are not copied as a key).
const MAX_CACHED_ITEM: usize = 64 << 10;

impl CallCache {
    fn get(&self, raw: &[u8]) -> Option<&[Call]> {
        self.entries
            .get(&crc32fast::hash(raw))?
            .iter()
            .find(|(r, _)| r.as_slice() == raw)
            .map(|(_, calls)| calls.as_slice())
    }

    fn put(&mut self, raw: &[u8], calls: Vec<Call>) {
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
}

#[cfg(test)]
impl CallCache {
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
                let role = self.word(keys, "role");
                // What a user wrote; a text action's observation is a
                // tool's output, not a user's message.
                if (awaiting.is_empty() || !awaiting_text) && role == b"user" {
                    prompt = keys.get("content").map(ResultAt::Value).or(prompt);
                }
                if !awaiting.is_empty() {
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
            let t = turn.map_or(0, |t| t + usize::from(!continues));
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
            let key = self.call_bytes(keys, kind);
            let native = match &key {
                None => Some(Vec::new()),
                Some(key) => cached(&mut cache, key.as_deref(), || {
                    let held = [
                        "tool_calls",
                        "function_call",
                        "content",
                        "arguments",
                        "input",
                    ];
                    let mut spans = held.iter().filter_map(|k| keys.get(k));
                    if spans.any(|span| !self.afford(span)) {
                        return None;
                    }
                    let calls = self.calls_of(&keys.members(), kind).into_iter();
                    Some(calls.map(|(n, a)| (Rc::from(n), Rc::from(a))).collect())
                }),
            };
            let Some(native) = native else { break };
            // A text reply, or content blocks without a call: their text may
            // carry actions.
            let from_text = key.is_none() || (native.is_empty() && kind != b"reasoning");
            let calls = if from_text {
                self.text_actions(keys, &mut cache)
            } else {
                Some(native)
            };
            let Some(calls) = calls else { break };
            awaiting_text = from_text && !calls.is_empty();
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

    /// The actions a model item writes in its text (see [`super::actions`]),
    /// as calls; `None` when the text would exceed the request's parsing
    /// budget. Parsed once per item's bytes with a cache.
    fn text_actions(
        &self,
        keys: &scan::Picked,
        cache: &mut Option<&mut CallCache>,
    ) -> Option<Vec<Call>> {
        let Some(span) = keys.get("content") else {
            return Some(Vec::new());
        };
        let raw = self.body.get(span.0..span.1).unwrap_or_default();
        if !may_read_actions(raw) {
            return Some(Vec::new());
        }
        let key = [raw, &b"\x04text"[..]].concat();
        cached(cache, Some(&key), || {
            let text = self.reply_text(span).ok()?.unwrap_or_default();
            let actions = super::actions::read(&text).into_iter();
            let calls = actions.map(|a| (a.name.into(), a.arguments.into()));
            Some(calls.collect())
        })
    }
}

/// The calls `cache` holds for `key`, else those `parse` gives, then
/// cached (`None`: `parse` gave up).
fn cached(
    cache: &mut Option<&mut CallCache>,
    key: Option<&[u8]>,
    parse: impl FnOnce() -> Option<Vec<Call>>,
) -> Option<Vec<Call>> {
    if let Some(calls) = key.and_then(|key| cache.as_deref()?.get(key)) {
        return Some(calls.to_vec());
    }
    let calls = parse()?;
    if let (Some(c), Some(key)) = (cache.as_deref_mut(), key) {
        c.put(key, calls.clone());
    }
    Some(calls)
}
