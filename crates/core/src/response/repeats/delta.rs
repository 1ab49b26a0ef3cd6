//! The output text of one streamed event, found by searching for the keys
//! that hold it rather than walking the JSON: each event costs a few
//! substring searches. A quote inside a JSON string is escaped, so an
//! unescaped `"key"` followed by `:` is a key wherever it appears.

use crate::request::llm::scan::{after_colon, short_escape, skip_string};
use std::borrow::Cow;

/// The output text delta of one event's data (the bytes after `data:`, as
/// sent), unescaped, if it carries one:
/// - OpenAI Chat Completions: `delta.content` of a chunk whose choice has
///   index 0 (a request asking for several answers interleaves them);
/// - the Responses API: `{"type":"response.output_text.delta", ...,
///   "delta":"..."}`;
/// - Anthropic Messages: `{"type":"content_block_delta", ...,
///   "delta":{"type":"text_delta","text":"..."}}`.
///
/// `None` for any other event (role and usage chunks, tool-call argument
/// deltas, reasoning and thinking, `[DONE]`, `ping`, `message_start`...),
/// an empty delta, or data that is not such JSON.
pub fn output_delta(data: &[u8]) -> Option<Cow<'_, str>> {
    let obj = Some(data.trim_ascii()).filter(|o| o.first() == Some(&b'{'))?;
    let text = if find(obj, b"\"type\"").is_some() {
        if let Some(at) = find(obj, b"\"content_block_delta\"") {
            // Anthropic: only text deltas (not thinking or tool input).
            let rest = obj.get(at..)?;
            find(rest, b"\"text_delta\"")?;
            string_after_key(rest, b"\"text\"")?
        } else {
            // The Responses API names each event's type; only output
            // text. (A Chat chunk with a `type` is a tool call's.)
            let at = find(obj, b"\"response.output_text.delta\"")?;
            string_after_key(obj.get(at..)?, b"\"delta\"")
                .or_else(|| string_after_key(obj, b"\"delta\""))?
        }
    } else {
        // Chat Completions: the first choice's delta.
        if let Some(i) = find(obj, b"\"index\"") {
            let rest = obj.get(i + 7..)?;
            let v = rest.get(skip_ws(rest, skip_ws(rest, 0) + 1)..)?;
            if !v.starts_with(b"0") || v.get(1).is_some_and(u8::is_ascii_digit) {
                return None;
            }
        }
        let at = find(obj, b"\"delta\"")?;
        string_after_key(obj.get(at..)?, b"\"content\"")?
    };
    unescape(text).filter(|t| !t.is_empty())
}

/// The keys and values searched for, each with its searcher built once.
const NEEDLES: [&[u8]; 8] = [
    b"\"content_block_delta\"",
    b"\"text_delta\"",
    b"\"text\"",
    b"\"type\"",
    b"\"response.output_text.delta\"",
    b"\"delta\"",
    b"\"index\"",
    b"\"content\"",
];

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    static FINDERS: std::sync::OnceLock<Vec<memchr::memmem::Finder<'static>>> =
        std::sync::OnceLock::new();
    let finders = FINDERS.get_or_init(|| NEEDLES.iter().map(memchr::memmem::Finder::new).collect());
    let finder = NEEDLES.iter().position(|n| *n == needle);
    finder
        .and_then(|i| finders.get(i))
        .map_or_else(|| memchr::memmem::find(hay, needle), |f| f.find(hay))
}

fn skip_ws(b: &[u8], mut at: usize) -> usize {
    while b.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// The raw string (quotes included) that is the value of the first `key`
/// (quoted) in `s` whose value is a string.
fn string_after_key<'a>(s: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
    let mut from = 0;
    while let Some(at) = s.get(from..).and_then(|r| find(r, key)) {
        from += at + key.len();
        // Not a string: null, a number, an array (logprobs' `content`)...
        let Some(start) = after_colon(s, from).filter(|&i| s.get(i) == Some(&b'"')) else {
            continue;
        };
        return s.get(start..skip_string(s, start)?);
    }
    None
}

/// The text of a raw JSON string (quotes included), borrowed when it has
/// no escape. A lone surrogate becomes U+FFFD; `None` if it is not a valid
/// string.
fn unescape(raw: &[u8]) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    if !inner.contains(&b'\\') {
        return std::str::from_utf8(inner).ok().map(Cow::Borrowed);
    }
    let mut out = String::with_capacity(inner.len());
    let mut rest = inner;
    while !rest.is_empty() {
        let plain = rest.iter().position(|&b| b == b'\\').unwrap_or(rest.len());
        out.push_str(std::str::from_utf8(rest.get(..plain)?).ok()?);
        rest = rest.get(plain..)?;
        let Some((&escape, after)) = rest.get(1..).and_then(<[u8]>::split_first) else {
            // Nothing left, or a backslash ending the string.
            return rest.is_empty().then_some(Cow::Owned(out));
        };
        rest = after;
        out.push(match escape {
            b'u' => {
                let unit = hex4(rest)?;
                rest = rest.get(4..)?;
                // A low surrogate is looked for only after a high one.
                let high = (0xD800..0xDC00).contains(&unit);
                let low = high.then(|| rest.strip_prefix(b"\\u").and_then(hex4));
                let code = match low.flatten().filter(|low| (0xDC00..0xE000).contains(low)) {
                    Some(low) => {
                        rest = rest.get(6..)?;
                        0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                    }
                    _ => unit,
                };
                char::from_u32(code).unwrap_or('\u{FFFD}')
            }
            _ => short_escape(escape)?,
        });
    }
    Some(Cow::Owned(out))
}

/// The value of the four hex digits `b` starts with.
fn hex4(b: &[u8]) -> Option<u32> {
    b.get(..4)?
        .iter()
        .try_fold(0u32, |n, &c| Some(n * 16 + char::from(c).to_digit(16)?))
}
