//! Reading responses: what the answer to a request tells loopguard.
//!
//! An attempt the provider failed (a `5xx` or a `429`: overloaded, rate
//! limited, down) is one an SDK retries on its own, with the same body:
//! the OpenAI and Anthropic SDKs retry twice by default. Such a retry is not
//! a loop, so the failed attempt's hit is taken back (up to the policy's
//! `forgive_failed_attempts` per fingerprint and window), and a client that
//! keeps sending after successes is still counted. The status is read on
//! the response path, from what Envoy received: a client cannot claim a
//! failure it did not get (its `x-stainless-retry-count` header could say
//! anything, and is never read as evidence).

pub mod mcp;
pub mod repeats;
pub mod stream_usage;
pub mod usage;

/// The response headers a request whose usage is read needs: the host
/// reads [`RESPONSE_HEADERS`] and hands them over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponseHead<'a> {
    pub content_type: Option<&'a str>,
    /// LiteLLM's `x-litellm-response-cost`: what the call cost, in dollars.
    pub reported_cost: Option<&'a str>,
}

/// The response headers [`ResponseHead`] holds, as the host reads them
/// (those a request wants: [`crate::flow::Request::response_headers_wanted`]).
pub const RESPONSE_HEADERS: [&str; 2] = ["content-type", "x-litellm-response-cost"];

impl<'a> ResponseHead<'a> {
    /// From the values of [`RESPONSE_HEADERS`], in order.
    pub fn of(values: &'a [Option<String>]) -> ResponseHead<'a> {
        let at = |i: usize| values.get(i).and_then(|v| v.as_deref());
        ResponseHead {
            content_type: at(0),
            reported_cost: at(1),
        }
    }
}

/// A failed attempt the provider may still bill: the gateway gave up
/// waiting (`504`, or `408`) while the model may still be generating.
pub fn may_be_billed(status: u32) -> bool {
    matches!(status, 408 | 504)
}

/// Whether a response status says the provider failed the attempt: any
/// `5xx` (`529` overloaded included) and `429`.
pub fn failed_attempt(status: u32) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// The status of a `:status` header value.
pub fn status(value: &[u8]) -> Option<u32> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_5xx_and_429() {
        for s in [500, 502, 503, 504, 529, 429] {
            assert!(failed_attempt(s), "{s}");
        }
        for s in [200, 201, 204, 301, 400, 401, 404, 408, 413, 422, 600] {
            assert!(!failed_attempt(s), "{s}");
        }
        assert_eq!(status(b"503"), Some(503));
        assert_eq!(status(b" 200 "), Some(200));
        assert_eq!(status(b"x"), None);
    }
}
