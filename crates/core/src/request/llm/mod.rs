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
//!
//! The request's types are here; reading it is split by stage:
//! - `recognise`: the format, told from the body's shape, and the envelope;
//! - `messages`: conversation items read into normalised messages on demand;
//! - `steps`: tails that begin on a whole step, and where model turns began;
//! - `text_actions`: actions a reply writes in its text, read as calls;
//! - `tools`: the model's tool calls and their results, across the history;
//! - `edits`: a note and a `tool_choice` written into the body without
//!   re-serialising it.

pub mod actions;
mod edits;
mod messages;
pub(crate) mod normalize;
mod recognise;
pub mod scan;
mod steps;
pub mod stream_options;
mod text_actions;
mod tools;
pub mod volatile;

pub use normalize::{canonical_json, normalize_text};
pub use recognise::{is_anthropic_path, is_llm_api_path, model_of, parse};
pub use tools::{CallCache, ModelTurn, ResultAt, ToolCall, ToolHistory};

use scan::{Elements, Refusal, Span};
use std::cell::Cell;

/// Values a request may parse into trees (conversation items that are more
/// than plain text, tool calls): what keeps a crafted body from costing
/// more memory than its own bytes.
pub const MAX_PARSED_VALUES: usize = 32_768;

/// The body fields that set a call's output limit, first found wins:
/// OpenAI Chat's, its older name, the Responses API's (Anthropic's
/// `max_tokens` too).
pub const OUTPUT_LIMIT_FIELDS: [&str; 3] =
    ["max_completion_tokens", "max_tokens", "max_output_tokens"];

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
    /// The output limit it sets (`max_completion_tokens`, `max_tokens`,
    /// `max_output_tokens`).
    pub output_limit: Option<u64>,
    /// `"stream": true`.
    pub stream: bool,
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
    /// Values already charged to the budget to read as a whole (a result
    /// read again, as lines or words, is not charged twice).
    charged: std::cell::RefCell<Vec<Span>>,
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
    fn new(role: &str, parts: Vec<Part>) -> Message {
        let role = role.to_string();
        Message { role, parts }
    }

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

fn text_parts(text: &str) -> Vec<Part> {
    let t = normalize_text(text);
    (!t.is_empty())
        .then_some(Part::Text(t))
        .into_iter()
        .collect()
}

/// A tool result's parts (not marked as an error).
fn result_parts(content: Vec<Part>) -> Vec<Part> {
    vec![Part::ToolResult {
        content,
        is_error: false,
    }]
}

/// A message's parts, by its (lower-case) role: a `tool` or `function`
/// message's content is its result (keyed by its content, never by
/// `tool_call_id`).
fn role_parts(role: &str, content: Vec<Part>) -> Vec<Part> {
    match role {
        "tool" | "function" => result_parts(content),
        _ => content,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod text_action_tests;
