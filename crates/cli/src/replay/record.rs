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
}
