//! Recognising an LLM request: its format, told from the body's shape (and
//! from the path where the shape cannot tell), and its envelope (the model,
//! whether tools are offered, where the conversation is); and the checks
//! that need no parse (the API path, the model a body names).

use super::scan::{self, after_colon, Span};
use super::{Format, Items, NotRead, Request, MAX_PARSED_VALUES};
use std::cell::Cell;

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
    let (top, mut arrays) =
        scan::members_split(body, (start, body.len()), &["messages", "input"], keep)?;
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
    let model = field("model").and_then(|s| scan::string(body, s));
    let offers_tools = ["tools", "functions"]
        .iter()
        .filter_map(|k| field(k).and_then(slice))
        .any(|raw| !matches!(raw, b"null" | b"[]" | b"{}"));
    let tool_choice = field("tool_choice");
    let output_limit = super::OUTPUT_LIMIT_FIELDS
        .iter()
        .find_map(|k| field(k).and_then(slice))
        .and_then(|raw| std::str::from_utf8(raw).ok()?.parse::<u64>().ok());
    let stream = field("stream").and_then(slice) == Some(b"true");
    let request = |format, system, items, array| Request {
        format,
        model: model.clone(),
        offers_tools,
        output_limit,
        stream,
        system,
        items,
        array,
        tool_choice,
        body,
        budget: Cell::new(MAX_PARSED_VALUES),
        over_budget: Cell::new(false),
        actions_memo: Default::default(),
        charged: Default::default(),
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
        b'"' => (Items::Text(scan::string(body, input)?), None),
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
        let Some(start) = after_colon(body, from).filter(|&v| body.get(v) == Some(&b'"')) else {
            continue;
        };
        let value = body.get(start + 1..)?;
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
/// OpenAI Chat Completions, Completions and Responses, Anthropic Messages
/// (`/completions` ends Chat Completions' path too).
pub fn is_llm_api_path(path: &str) -> bool {
    ["/completions", "/responses", "/messages"]
        .iter()
        .any(|end| path.ends_with(end))
}
