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
//! Parsing is lazy: the envelope is read once, borrowing each message as raw
//! JSON, and only the messages a caller asks for (the conversation's tail)
//! are parsed and normalised.

mod normalize;
mod tools;

pub use normalize::{canonical_json, normalize_text};
pub use tools::{ToolCall, ToolHistory};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

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

/// The fields loopguard reads; everything else is skipped unparsed.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow)]
    model: Option<&'a RawValue>,
    #[serde(default, borrow)]
    messages: Option<&'a RawValue>,
    #[serde(default, borrow)]
    input: Option<&'a RawValue>,
    #[serde(default, borrow)]
    system: Option<&'a RawValue>,
    #[serde(default, borrow)]
    instructions: Option<&'a RawValue>,
    #[serde(default, borrow)]
    tools: Option<&'a RawValue>,
    #[serde(default, borrow)]
    functions: Option<&'a RawValue>,
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
    system: Option<&'a RawValue>,
    /// The conversation in order (Responses: the input items).
    items: Items<'a>,
    /// The raw conversation array (`messages` or `input`) and the whole
    /// body, for edits at the end of the conversation.
    array: Option<&'a RawValue>,
    body: &'a [u8],
}

#[derive(Debug)]
enum Items<'a> {
    List(Vec<&'a RawValue>),
    /// Responses `input` given as one string: a single user message.
    Text(String),
}

/// One normalised message: its role and its parts in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub parts: Vec<Part>,
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

/// Recognise an LLM request. `None` when the body is not JSON or not one of
/// the understood formats. `path` helps tell Anthropic from OpenAI chat when
/// the body alone cannot.
pub fn parse<'a>(body: &'a [u8], path: &str) -> Option<Request<'a>> {
    let env: Envelope<'a> = serde_json::from_slice(body).ok()?;
    let model = env
        .model
        .and_then(|m| match serde_json::from_str(m.get()).ok()? {
            Value::String(s) => Some(s),
            _ => None,
        });
    let offers_tools = [env.tools, env.functions]
        .into_iter()
        .flatten()
        .any(|t| !matches!(t.get().trim(), "null" | "[]" | "{}"));
    if let Some(messages) = env.messages {
        let list: Vec<&'a RawValue> = serde_json::from_str(messages.get()).ok()?;
        let anthropic = env.system.is_some() || is_anthropic_path(path);
        return Some(Request {
            format: if anthropic {
                Format::Anthropic
            } else {
                Format::OpenAiChat
            },
            model,
            offers_tools,
            system: env.system,
            items: Items::List(list),
            array: Some(messages),
            body,
        });
    }
    let input = env.input?;
    let (items, array) = if input.get().starts_with('"') {
        (
            Items::Text(serde_json::from_str::<String>(input.get()).ok()?),
            None,
        )
    } else {
        let list: Vec<&'a RawValue> = serde_json::from_str(input.get()).ok()?;
        (Items::List(list), Some(input))
    };
    Some(Request {
        format: Format::OpenAiResponses,
        model,
        offers_tools,
        system: env.instructions,
        items,
        array,
        body,
    })
}

/// Anthropic's Messages API path (also under a prefix, e.g.
/// `/anthropic/v1/messages`).
pub fn is_anthropic_path(path: &str) -> bool {
    path.ends_with("/v1/messages")
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
            return Some(system_message(sys));
        }
        match &self.items {
            Items::Text(text) => Some(Message {
                role: "user".to_string(),
                parts: text_parts(text),
            }),
            Items::List(items) => {
                let raw = items.first()?;
                serde_json::from_str::<Value>(raw.get())
                    .ok()
                    .map(|v| normalize::message(&v))
            }
        }
    }

    /// The last `n` messages, normalised, oldest first. Messages that carry
    /// nothing comparable (e.g. only reasoning) still count as messages.
    pub fn tail(&self, n: usize) -> Vec<Message> {
        let mut out = Vec::with_capacity(n.min(self.len()));
        match &self.items {
            Items::Text(text) => {
                if n >= 2 {
                    if let Some(sys) = self.system {
                        out.push(system_message(sys));
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
                if n > items.len() {
                    if let Some(sys) = self.system {
                        out.push(system_message(sys));
                    }
                }
                let start = items.len().saturating_sub(n);
                for raw in items.iter().skip(start) {
                    out.push(match serde_json::from_str::<Value>(raw.get()) {
                        Ok(v) => normalize::message(&v),
                        Err(_) => Message {
                            role: String::new(),
                            parts: vec![Part::Other("invalid".to_string())],
                        },
                    });
                }
            }
        }
        out
    }
}

fn system_message(raw: &RawValue) -> Message {
    let parts = match serde_json::from_str::<Value>(raw.get()) {
        Ok(v) => normalize::content(&v),
        Err(_) => Vec::new(),
    };
    Message {
        role: "system".to_string(),
        parts,
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
