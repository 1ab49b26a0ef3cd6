//! What clients, upstreams and operators see of a decision: the 429, the
//! warning headers, the log lines.

use super::decision::{Decision, Notice, Rejection, Verdict};
use serde_json::json;

/// A local reply for the host to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

pub type Headers = Vec<(&'static str, String)>;

/// Whole seconds, rounded up, at least 1 (the `Retry-After` header).
pub fn retry_after_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// 429 in the OpenAI error shape, so OpenAI SDKs raise `RateLimitError`
/// with a readable message. `x-should-retry: false` stops the OpenAI and
/// Anthropic SDKs from retrying the 429 on their own: each blind retry would
/// be one more hit of the loop.
pub fn rejection(r: &Rejection) -> LocalReply {
    let n = &r.notice;
    let retry_after = retry_after_seconds(r.retry_after_ms);
    let mut error = json!({
        "message": format!(
            "Blocked: identical request sent {} times in {} seconds. This usually indicates an agent retry loop.",
            n.count, n.window_seconds
        ),
        "type": "loop_detected",
        "code": "recursive_loop_detected",
        "param": null,
        "policy": n.policy_id,
        "fingerprint": n.fingerprint.hex(),
        "hit_count": n.count,
        "window_seconds": n.window_seconds,
        "retry_after_seconds": retry_after,
    });
    if r.cooldown_seconds > 0 {
        error["cooldown_seconds"] = json!(r.cooldown_seconds);
    }
    LocalReply {
        status: 429,
        headers: vec![
            ("content-type", "application/json".to_string()),
            ("retry-after", retry_after.to_string()),
            ("x-should-retry", "false".to_string()),
            ("x-loopguard-policy", n.policy_id.clone()),
        ],
        body: json!({ "error": error }).to_string(),
    }
}

/// The warning headers of a warn verdict, for the upstream request and the
/// client's response alike.
pub fn warning_headers(n: &Notice) -> Headers {
    vec![
        ("x-loopguard-warning", "loop_warn".to_string()),
        ("x-loopguard-loop-count", n.count.to_string()),
        ("x-loopguard-policy", n.policy_id.clone()),
    ]
}

/// The response headers of a throttled request.
pub fn throttle_headers(n: &Notice, delay_ms: u64) -> Headers {
    vec![
        ("x-loopguard-delay-ms", delay_ms.to_string()),
        ("x-loopguard-loop-count", n.count.to_string()),
        ("x-loopguard-policy", n.policy_id.clone()),
    ]
}

/// The Envoy filter-state name a published header travels under:
/// `x-loopguard-loop-count` -> `loopguard_loop_count` (Envoy shows it as
/// `wasm.loopguard_loop_count`).
pub fn filter_state_name(header: &str) -> String {
    header.trim_start_matches("x-").replace('-', "_")
}

/// Headers a decision adds to the request forwarded upstream.
pub fn upstream_headers(d: &Decision) -> Headers {
    match &d.verdict {
        Verdict::Warn(n) if !d.shadow => warning_headers(n),
        _ => Vec::new(),
    }
}

/// Headers a decision adds to the response the client gets (a 429 carries
/// its own). Shadow mode adds none.
pub fn response_headers(d: &Decision) -> Headers {
    if d.shadow {
        return Vec::new();
    }
    match &d.verdict {
        Verdict::Warn(n) => warning_headers(n),
        Verdict::Throttle { notice, delay_ms } => throttle_headers(notice, *delay_ms),
        Verdict::Allow | Verdict::Reject(_) => Vec::new(),
    }
}

/// The log line of a decision, if it deserves one: shadow mode logs every
/// would-be action; enforce mode logs the first request of each step (later
/// repeats of a running loop are counted in metrics, not logged).
pub fn log_line(d: &Decision) -> Option<String> {
    let n = d.verdict.notice()?;
    let action = d.verdict.action()?.as_str();
    if d.shadow {
        let detail = match &d.verdict {
            Verdict::Throttle { delay_ms, .. } => format!(" delay_ms={delay_ms}"),
            _ => String::new(),
        };
        return Some(format!(
            "shadow: would_{action} policy=\"{}\" fingerprint={} count={}{detail}",
            n.policy_id, n.fingerprint, n.count
        ));
    }
    if !n.first {
        return None;
    }
    let what = match &d.verdict {
        Verdict::Warn(_) => "warning".to_string(),
        Verdict::Throttle { delay_ms, .. } => format!("throttling ({delay_ms} ms)"),
        _ => "rejecting".to_string(),
    };
    Some(format!(
        "loop detected: policy \"{}\" fingerprint {} sent {} times in {} s; {what}",
        n.policy_id, n.fingerprint, n.count, n.window_seconds
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::fingerprint::Fingerprint;
    use serde_json::Value;

    fn notice(first: bool) -> Notice {
        Notice {
            policy_id: "llm-policy".into(),
            fingerprint: Fingerprint([0x9f; 16]),
            count: 5,
            window_seconds: 60,
            first,
        }
    }

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
            notice: notice(true),
            retry_after_ms: 36_200,
            cooldown_seconds: 0,
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
        assert!(e.get("cooldown_seconds").is_none());
        let with_cooldown = rejection(&Rejection {
            cooldown_seconds: 30,
            ..r
        });
        let v: Value = serde_json::from_str(&with_cooldown.body).unwrap();
        assert_eq!(v["error"]["cooldown_seconds"], 30);
    }

    #[test]
    fn headers_per_verdict_and_none_in_shadow() {
        let warn = Decision {
            verdict: Verdict::Warn(notice(true)),
            shadow: false,
        };
        let expected = vec![
            ("x-loopguard-warning", "loop_warn".to_string()),
            ("x-loopguard-loop-count", "5".to_string()),
            ("x-loopguard-policy", "llm-policy".to_string()),
        ];
        assert_eq!(upstream_headers(&warn), expected);
        assert_eq!(response_headers(&warn), expected);
        let throttle = Decision {
            verdict: Verdict::Throttle {
                notice: notice(true),
                delay_ms: 500,
            },
            shadow: false,
        };
        assert!(upstream_headers(&throttle).is_empty());
        assert_eq!(
            response_headers(&throttle)[0],
            ("x-loopguard-delay-ms", "500".to_string())
        );
        for v in [
            Verdict::Warn(notice(true)),
            Verdict::Throttle {
                notice: notice(true),
                delay_ms: 1,
            },
        ] {
            let shadow = Decision {
                verdict: v,
                shadow: true,
            };
            assert!(upstream_headers(&shadow).is_empty());
            assert!(response_headers(&shadow).is_empty());
        }
    }

    #[test]
    fn filter_state_names() {
        assert_eq!(
            filter_state_name("x-loopguard-warning"),
            "loopguard_warning"
        );
        assert_eq!(
            filter_state_name("x-loopguard-loop-count"),
            "loopguard_loop_count"
        );
    }

    #[test]
    fn log_lines() {
        let reject = |first| Decision {
            verdict: Verdict::Reject(Rejection {
                notice: notice(first),
                retry_after_ms: 1,
                cooldown_seconds: 0,
            }),
            shadow: false,
        };
        assert_eq!(
            log_line(&reject(true)).unwrap(),
            format!("loop detected: policy \"llm-policy\" fingerprint {} sent 5 times in 60 s; rejecting", "9f".repeat(16))
        );
        assert_eq!(log_line(&reject(false)), None);
        let shadow = Decision {
            verdict: Verdict::Throttle {
                notice: notice(false),
                delay_ms: 300,
            },
            shadow: true,
        };
        assert_eq!(
            log_line(&shadow).unwrap(),
            format!(
                "shadow: would_throttle policy=\"llm-policy\" fingerprint={} count=5 delay_ms=300",
                "9f".repeat(16)
            )
        );
        assert_eq!(
            log_line(&Decision {
                verdict: Verdict::Allow,
                shadow: true
            }),
            None
        );
    }
}
