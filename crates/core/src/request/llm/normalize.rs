//! Normalisation: the same conversation written with other case, spacing,
//! call ids or key order gives the same messages.

use super::{result_parts, role_parts, scan, text_parts, Message, Part};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Text normalised as it is fed, one character at a time.
struct Normalizer {
    out: String,
    pending_space: bool,
}

impl Normalizer {
    fn new(capacity: usize) -> Normalizer {
        Normalizer {
            out: String::with_capacity(capacity),
            pending_space: false,
        }
    }

    fn push(&mut self, c: char) {
        if c.is_whitespace() {
            self.pending_space = !self.out.is_empty();
        } else {
            if self.pending_space {
                self.out.push(' ');
                self.pending_space = false;
            }
            self.out.extend(c.to_lowercase());
        }
    }
}

/// The normalised text of a JSON string literal (`raw`, quotes included),
/// unescaped as it is read: one allocation, the size of the text, never a
/// copy of the string first (a huge string costs its size once). `None` if
/// `raw` is not a valid JSON string.
pub fn normalize_json_str(raw: &[u8]) -> Option<String> {
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if memchr::memchr(b'\\', inner).is_none() {
        let s = std::str::from_utf8(inner).ok()?;
        // A character below U+0020 is that byte (UTF-8 continuation and
        // lead bytes are all 0x80 and above).
        if inner.iter().any(|&b| b < 0x20) {
            return None;
        }
        return Some(normalize_text(s));
    }
    let mut n = Normalizer::new(inner.len());
    let mut rest = inner;
    while !rest.is_empty() {
        let run = rest.iter().position(|&b| b == b'\\').unwrap_or(rest.len());
        let (text, tail) = rest.split_at(run);
        for c in std::str::from_utf8(text).ok()?.chars() {
            if u32::from(c) < 0x20 {
                return None;
            }
            n.push(c);
        }
        rest = tail;
        let Some((&b'\\', after)) = rest.split_first() else {
            break;
        };
        let (&e, after) = after.split_first()?;
        rest = after;
        let c = match e {
            b'u' => {
                let (unit, after) = hex4(rest)?;
                rest = after;
                if (0xD800..0xDC00).contains(&unit) {
                    // A high surrogate must be followed by a low one.
                    let after = rest.strip_prefix(b"\\u")?;
                    let (low, after) = hex4(after)?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return None;
                    }
                    rest = after;
                    char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?
                } else {
                    char::from_u32(unit)?
                }
            }
            _ => scan::short_escape(e)?,
        };
        n.push(c);
    }
    Some(n.out)
}

/// Four hex digits (a `\u` escape's code unit) and what follows them.
fn hex4(b: &[u8]) -> Option<(u32, &[u8])> {
    let digits = b.get(..4)?;
    let s = std::str::from_utf8(digits).ok()?;
    let unit = u32::from_str_radix(s, 16).ok()?;
    Some((unit, b.get(4..)?))
}

/// Lower-case, whitespace runs collapsed to one space, trimmed.
pub fn normalize_text(s: &str) -> String {
    if s.is_ascii() {
        return normalize_ascii(s);
    }
    let mut n = Normalizer::new(s.len());
    for c in s.chars() {
        n.push(c);
    }
    n.out
}

/// [`normalize_text`] of ASCII text: the runs between whitespace that
/// needs rewriting (anything but one space between two words) are copied
/// whole, and lower-cased at the end in one pass.
fn normalize_ascii(s: &str) -> String {
    let b = s.as_bytes();
    let n = b.len();
    let ws = |i: usize| {
        b.get(i)
            .is_some_and(|&c| c.is_ascii_whitespace() || c == 0x0b)
    };
    let mut out = String::with_capacity(n);
    let mut j = 0;
    while ws(j) {
        j += 1;
    }
    // `b[seg..j]` is still to be copied; `b[seg]` is not whitespace.
    let mut seg = j;
    while let Some(&c) = b.get(j) {
        if plain_words(b.get(j..j + 8), b.get(j + 8)) {
            j += 8;
            continue;
        }
        if c > b' ' || !ws(j) {
            j += 1;
            continue;
        }
        if c == b' ' && j + 1 < n && !ws(j + 1) {
            // One space between two words: kept as it is.
            j += 2;
            continue;
        }
        out.push_str(s.get(seg..j).unwrap_or_default());
        let mut k = j;
        while ws(k) {
            k += 1;
        }
        if k < n {
            out.push(' ');
        }
        seg = k;
        j = k;
    }
    out.push_str(s.get(seg..).unwrap_or_default());
    out.make_ascii_lowercase();
    out
}

/// Whether eight ASCII bytes (then `next`) are words with single spaces
/// between them, kept as they are: no byte below 0x20, and every space
/// followed by a byte above it. Eight bytes at a time (SWAR); each byte
/// has its high bit set before the subtraction, so none borrows from the
/// next.
fn plain_words(chunk: Option<&[u8]>, next: Option<&u8>) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let Some(chunk) = chunk else {
        return false;
    };
    let mut word = [0u8; 8];
    word.copy_from_slice(chunk);
    let v = u64::from_le_bytes(word);
    // High bit of each byte: below 0x20, and at most 0x20.
    let below = !((v | HIGHS).wrapping_sub(ONES * 0x20)) & HIGHS;
    let at_most = !((v | HIGHS).wrapping_sub(ONES * 0x21)) & HIGHS;
    if below != 0 || at_most & (at_most >> 8) != 0 {
        return false;
    }
    // A space last: the byte after it must be a word's.
    at_most >> 63 == 0 || next.is_some_and(|&c| c > b' ')
}

/// JSON with object keys sorted and no insignificant whitespace.
pub fn canonical_json(v: &Value) -> String {
    // serde_json's map is ordered by key (no `preserve_order`), so its
    // compact serialisation is canonical.
    v.to_string()
}

/// Tool-call arguments, canonical: JSON (OpenAI sends a JSON string,
/// Anthropic an object) parsed and re-serialised with sorted keys;
/// arguments that are not JSON compare as trimmed strings.
pub fn canonical_arguments(v: &Value) -> String {
    match v {
        Value::String(s) => canonical_text(s),
        Value::Null => "{}".to_string(),
        other => canonical_json(other),
    }
}

/// Arguments given as JSON text (OpenAI's `arguments` string), canonical;
/// text that is not JSON compares as trimmed text.
pub fn canonical_text(s: &str) -> String {
    let b = s.as_bytes();
    scan::document(b)
        .and_then(|span| scan::canonical(b, span))
        .unwrap_or_else(|| s.trim().to_string())
}

fn str_of<'v>(v: &'v Value, key: &str) -> &'v str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// One conversation item (a chat message, an Anthropic message, or a
/// Responses input item).
pub(super) fn message(v: &Value) -> Message {
    let (role, parts) = match v.get("type").and_then(Value::as_str) {
        Some("function_call" | "custom_tool_call") => {
            let arguments = v.get("arguments").or_else(|| v.get("input"));
            ("assistant", vec![call(v, arguments)])
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            let output = v.get("output").unwrap_or(&Value::Null);
            ("tool", result_parts(content(output)))
        }
        Some("reasoning") => ("assistant", Vec::new()),
        Some(t) if t != "message" => ("", vec![Part::Other(t.to_string())]),
        _ => return chat_message(v),
    };
    Message::new(role, parts)
}

fn chat_message(v: &Value) -> Message {
    let role = str_of(v, "role").to_ascii_lowercase();
    let mut parts = role_parts(&role, content(v.get("content").unwrap_or(&Value::Null)));
    if let Some(calls) = v.get("tool_calls").and_then(Value::as_array) {
        for c in calls {
            let f = c.get("function").unwrap_or(c);
            parts.push(call(f, f.get("arguments")));
        }
    }
    if let Some(f) = v.get("function_call").filter(|f| f.is_object()) {
        parts.push(call(f, f.get("arguments")));
    }
    Message { role, parts }
}

/// A tool call: the `name` of `f`, and `arguments` canonical.
fn call(f: &Value, arguments: Option<&Value>) -> Part {
    Part::ToolCall {
        name: str_of(f, "name").to_string(),
        arguments: canonical_arguments(arguments.unwrap_or(&Value::Null)),
    }
}

/// Message content: a string, a list of blocks, or one block.
pub(super) fn content(v: &Value) -> Vec<Part> {
    match v {
        Value::String(s) => text_parts(s),
        Value::Array(blocks) => blocks.iter().flat_map(block).collect(),
        Value::Object(_) => block(v),
        _ => Vec::new(),
    }
}

/// A media block: the SHA-256 of its URL or data (empty when absent).
fn media(source: Option<&str>) -> Vec<Part> {
    vec![Part::Media(Sha256::digest(source.unwrap_or("")).into())]
}

fn block(b: &Value) -> Vec<Part> {
    let ty = match b {
        Value::String(s) => return text_parts(s),
        Value::Object(_) => b.get("type").and_then(Value::as_str).unwrap_or(""),
        _ => return Vec::new(),
    };
    match ty {
        "text" | "input_text" | "output_text" | "" => text_parts(str_of(b, "text")),
        "refusal" => text_parts(str_of(b, "refusal")),
        "image_url" => {
            let u = b.get("image_url").unwrap_or(&Value::Null);
            media(u.get("url").and_then(Value::as_str).or(u.as_str()))
        }
        "input_image" | "input_file" => media(
            ["image_url", "file_id", "file_data", "file_url"]
                .iter()
                .find_map(|k| b.get(*k).and_then(Value::as_str)),
        ),
        "input_audio" => media(b.get("input_audio").map(|a| str_of(a, "data"))),
        "image" | "document" => {
            let src = b.get("source").unwrap_or(&Value::Null);
            media(
                ["data", "url", "file_id"]
                    .iter()
                    .find_map(|k| src.get(*k).and_then(Value::as_str)),
            )
        }
        "tool_use" | "server_tool_use" => vec![call(b, b.get("input"))],
        "tool_result" => vec![Part::ToolResult {
            content: content(b.get("content").unwrap_or(&Value::Null)),
            is_error: b.get("is_error").and_then(Value::as_bool).unwrap_or(false),
        }],
        // Model-internal reasoning differs every turn (and carries
        // signatures); it says nothing about whether the agent loops.
        "thinking" | "redacted_thinking" | "reasoning" => Vec::new(),
        other => vec![Part::Other(other.to_string())],
    }
}
