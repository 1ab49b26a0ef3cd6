//! What the client sees when loopguard answers in place of the upstream.

use super::decision::Rejection;
use serde_json::json;

/// A local reply for the host to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

/// Whole seconds, rounded up, at least 1 (the `Retry-After` header).
pub fn retry_after_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// 429 in the OpenAI error shape, so OpenAI SDKs raise `RateLimitError`
/// with a readable message. `x-should-retry: false` stops the OpenAI and
/// Anthropic SDKs from retrying the 429 on their own: each blind retry would
/// be one more hit of the loop.
pub fn rejection(r: &Rejection) -> LocalReply {
    let retry_after = retry_after_seconds(r.retry_after_ms);
    let body = json!({
        "error": {
            "message": format!(
                "Blocked: identical request sent {} times in {} seconds. This usually indicates an agent retry loop.",
                r.hit_count, r.window_seconds
            ),
            "type": "loop_detected",
            "code": "recursive_loop_detected",
            "param": null,
            "policy": r.policy_id,
            "fingerprint": r.fingerprint.hex(),
            "hit_count": r.hit_count,
            "window_seconds": r.window_seconds,
            "retry_after_seconds": retry_after,
        }
    });
    LocalReply {
        status: 429,
        headers: vec![
            ("content-type", "application/json".to_string()),
            ("retry-after", retry_after.to_string()),
            ("x-should-retry", "false".to_string()),
            ("x-loopguard-policy", r.policy_id.clone()),
        ],
        body: body.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fingerprint::Fingerprint;
    use serde_json::Value;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(1000), 1);
        assert_eq!(retry_after_seconds(1001), 2);
        assert_eq!(retry_after_seconds(36_200), 37);
        assert_eq!(retry_after_seconds(0), 1);
    }

    #[test]
    fn openai_shaped_429() {
        let r = Rejection {
            policy_id: "llm-policy".into(),
            fingerprint: Fingerprint([0x9f; 16]),
            hit_count: 5,
            window_seconds: 60,
            retry_after_ms: 36_200,
            first: true,
        };
        let reply = rejection(&r);
        assert_eq!(reply.status, 429);
        let h = |k: &str| {
            reply
                .headers
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(h("retry-after"), Some("37"));
        assert_eq!(h("x-should-retry"), Some("false"));
        assert_eq!(h("content-type"), Some("application/json"));
        let v: Value = serde_json::from_str(&reply.body).unwrap();
        let e = &v["error"];
        assert_eq!(e["message"], "Blocked: identical request sent 5 times in 60 seconds. This usually indicates an agent retry loop.");
        assert_eq!(e["type"], "loop_detected");
        assert_eq!(e["code"], "recursive_loop_detected");
        assert!(e["param"].is_null());
        assert_eq!(e["policy"], "llm-policy");
        assert_eq!(e["fingerprint"], "9f".repeat(16));
        assert_eq!(e["hit_count"], 5);
        assert_eq!(e["window_seconds"], 60);
        assert_eq!(e["retry_after_seconds"], 37);
    }
}
