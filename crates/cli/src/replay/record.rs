//! One recorded exchange, whatever file it came from: when the request
//! arrived, the request as the filter would have seen it, and what the
//! provider answered when that was recorded.

use crate::request_file::RequestFile;
use serde_json::Value;

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

/// Tokens a response reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
}

impl Usage {
    /// Usage as the three API formats report it: Chat Completions
    /// (`prompt_tokens`, `completion_tokens`), the Responses API and
    /// Anthropic Messages (`input_tokens`, `output_tokens`; Anthropic's
    /// cache reads and writes are input too). `None` when `v` holds none of
    /// these.
    pub fn from_json(v: &Value) -> Option<Usage> {
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        let input = n("prompt_tokens").or_else(|| {
            n("input_tokens").map(|i| {
                i + n("cache_read_input_tokens").unwrap_or(0)
                    + n("cache_creation_input_tokens").unwrap_or(0)
            })
        });
        let output = n("completion_tokens").or_else(|| n("output_tokens"));
        if input.is_none() && output.is_none() {
            return None;
        }
        Some(Usage {
            input: input.unwrap_or(0),
            output: output.unwrap_or(0),
        })
    }

    /// The usage inside a response body: the JSON object's `usage`, or in
    /// a Responses API body `response.usage`, or in a server-sent event
    /// stream the last event that carried one.
    pub fn in_body(body: &[u8]) -> Option<Usage> {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            return v
                .get("usage")
                .or_else(|| v.get("response").and_then(|r| r.get("usage")))
                .and_then(Usage::from_json);
        }
        let text = std::str::from_utf8(body).ok()?;
        let mut found: Option<Usage> = None;
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            // Anthropic streams: input in message_start, output in
            // message_delta; the others carry the whole usage once.
            let usage = v
                .get("usage")
                .or_else(|| v.get("message").and_then(|m| m.get("usage")))
                .or_else(|| v.get("response").and_then(|r| r.get("usage")));
            if let Some(u) = usage.and_then(Usage::from_json) {
                let merged = found.unwrap_or_default();
                found = Some(Usage {
                    input: if u.input > 0 { u.input } else { merged.input },
                    output: if u.output > 0 {
                        u.output
                    } else {
                        merged.output
                    },
                });
            }
        }
        found
    }
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
        let chat =
            br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;
        assert_eq!(
            Usage::in_body(chat),
            Some(Usage {
                input: 12,
                output: 3
            })
        );
        let anthropic = br#"{"type":"message","usage":{"input_tokens":7,"cache_read_input_tokens":100,"output_tokens":4}}"#;
        assert_eq!(
            Usage::in_body(anthropic),
            Some(Usage {
                input: 107,
                output: 4
            })
        );
        let responses = br#"{"object":"response","usage":{"input_tokens":9,"output_tokens":2}}"#;
        assert_eq!(
            Usage::in_body(responses),
            Some(Usage {
                input: 9,
                output: 2
            })
        );
        let stream = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n";
        assert_eq!(
            Usage::in_body(stream),
            Some(Usage {
                input: 20,
                output: 30
            })
        );
        let chat_stream = b"data: {\"choices\":[]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\ndata: [DONE]\n\n";
        assert_eq!(
            Usage::in_body(chat_stream),
            Some(Usage {
                input: 5,
                output: 6
            })
        );
        assert_eq!(Usage::in_body(br#"{"choices":[]}"#), None);
        assert_eq!(Usage::in_body(b"not json"), None);
    }
}
