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
