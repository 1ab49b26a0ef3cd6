//! One recorded exchange, whatever file it came from: when the request
//! arrived, the request as the filter would have seen it, and what the
//! provider answered when that was recorded.

use crate::request_file::RequestFile;

/// A request read from a traffic file.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// When the request arrived, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub request: RequestFile,
    /// The provider's answer, when the file recorded it.
    pub response: Option<Answer>,
    /// Where it came from (`file:line` or `file entry N`), for the report.
    pub place: String,
}

/// What the provider answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub status: Option<u16>,
    pub usage: Option<Usage>,
    /// The response's `content-type`, when recorded.
    pub content_type: Option<String>,
    /// The response body's first [`MAX_RESPONSE_BODY`] bytes, when the
    /// body was recorded (`Some` of nothing: recorded empty). Replay feeds
    /// it to the engine's response path (an MCP result is read from it).
    pub body: Option<Vec<u8>>,
    /// The body holds only the start of the response: the recorder cut it
    /// (a tap's `truncated`, a HAR `content.size` above its text) or it
    /// was longer than [`MAX_RESPONSE_BODY`].
    pub body_cut: bool,
    /// loopguard answered the request itself (a blocked MCP call, its
    /// JSON-RPC error or 429): the recording was made in front of
    /// loopguard, and the server never saw the call.
    pub by_loopguard: bool,
}

/// Bytes of a recorded response body kept for the response path (the
/// rest is dropped and the body marked cut).
pub const MAX_RESPONSE_BODY: usize = 1 << 20;

/// The response header loopguard's own MCP answers carry.
pub const MCP_LOOP_HEADER: &str = loopguard_core::act::mcp_reply::HEADER;

impl Answer {
    /// Keep `bytes` as the recorded body (at most [`MAX_RESPONSE_BODY`] of
    /// them; `cut`: the recorder kept only the start).
    pub fn keep_body(&mut self, mut bytes: Vec<u8>, cut: bool) {
        self.body_cut = cut;
        if bytes.len() > MAX_RESPONSE_BODY {
            bytes.truncate(MAX_RESPONSE_BODY);
            bytes.shrink_to_fit();
            self.body_cut = true;
        }
        if !self.by_loopguard {
            self.by_loopguard = loopguard_answered(&bytes);
        }
        self.body = Some(bytes);
    }
}

/// Whether a JSON body is one of loopguard's own MCP answers (a blocked
/// result with `_meta.loopguard`, a JSON-RPC error with `data.loopguard`).
fn loopguard_answered(body: &[u8]) -> bool {
    if !body.trim_ascii_start().starts_with(b"{") || !contains(body, b"\"loopguard\"") {
        return false;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    v.pointer("/result/_meta/loopguard").is_some() || v.pointer("/error/data/loopguard").is_some()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Tokens a response reported (the core's reader, the one the filter
/// uses on the response path).
pub use loopguard_core::response::usage::Usage;
use loopguard_core::response::usage::{Framing, UsageReader};

/// The usage a recorded response body reported: a JSON body (Chat
/// Completions, the Responses API, Anthropic Messages) or a server-sent
/// event stream of any of them.
pub fn usage_in_body(body: &[u8]) -> Option<Usage> {
    let framing = if body.trim_ascii_start().starts_with(b"{") {
        Framing::Json
    } else {
        Framing::EventStream
    };
    let mut reader = UsageReader::new(framing);
    reader.feed(body);
    reader.finish()
}

/// An entry replay could not use, and why (reported; the rest goes on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub place: String,
    pub reason: String,
}

/// What a traffic reader yields, entry by entry.
pub type Entry = Result<Recorded, Skipped>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_in_each_format() {
        let io = |b: &[u8]| usage_in_body(b).map(|u| (u.input, u.output));
        let chat =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;
        assert_eq!(io(chat), Some((12, 3)));
        let anthropic = br#"{"type":"message","usage":{"input_tokens":7,"cache_read_input_tokens":100,"output_tokens":4}}"#;
        assert_eq!(io(anthropic), Some((107, 4)));
        let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n";
        assert_eq!(io(stream), Some((20, 30)));
        assert_eq!(io(br#"{"choices":[]}"#), None);
        assert_eq!(io(b"not json"), None);
    }

    #[test]
    fn a_body_is_kept_bounded_and_loopguards_own_answers_are_told() {
        let mut a = Answer::default();
        a.keep_body(vec![b'x'; MAX_RESPONSE_BODY + 5], false);
        assert_eq!(a.body.as_ref().map(Vec::len), Some(MAX_RESPONSE_BODY));
        assert!(a.body_cut && !a.by_loopguard);
        let mut a = Answer::default();
        a.keep_body(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true,"_meta":{"loopguard":{"step":"block"}}}}"#.to_vec(), false);
        assert!(a.by_loopguard && !a.body_cut);
        let mut a = Answer::default();
        a.keep_body(br#"{"jsonrpc":"2.0","id":1,"error":{"code":-31000,"message":"m","data":{"loopguard":{}}}}"#.to_vec(), false);
        assert!(a.by_loopguard);
        // A server's result that merely mentions loopguard is its own.
        let mut a = Answer::default();
        a.keep_body(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\"loopguard\""}]}}"#.to_vec(), false);
        assert!(!a.by_loopguard);
    }
}
