//! What clients, upstreams and operators see of a decision: every guard's
//! refusal built by one function in the called API's shape (OpenAI's or
//! Anthropic's error, MCP's `isError` result or a JSON-RPC error), the
//! warning headers, the log lines.

use crate::act::decision::{Decision, Rejection, Verdict};
use crate::detect::tool_loops::{self, ToolVerdict};
use crate::request::llm;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// Whose error shape a 429 takes: the API being called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// OpenAI's (also what OpenAI-compatible gateways and SDKs expect).
    #[default]
    OpenAi,
    /// Anthropic's Messages API (`/v1/messages`).
    Anthropic,
}

impl Api {
    pub fn for_path(path: &str) -> Api {
        if llm::is_anthropic_path(path) {
            Api::Anthropic
        } else {
            Api::OpenAi
        }
    }
}

/// A local reply for the host to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    pub status: u32,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

pub type Headers = Vec<(&'static str, String)>;

/// What an HTTP API's refusal says it is: its `code`, and the error
/// types OpenAI's and Anthropic's SDKs read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// A request or conversation repeated (`recursive_loop_detected`).
    RepeatedRequest,
    /// A tool loop (`tool_loop_detected`).
    ToolLoop,
    /// A spend cap reached (`budget_exceeded`).
    BudgetExceeded,
    /// A model no price names, refused (`model_unpriced`).
    ModelUnpriced,
}

impl Code {
    /// The `code`, OpenAI's error `type` and Anthropic's.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Code::RepeatedRequest => (
                "recursive_loop_detected",
                "loop_detected",
                "rate_limit_error",
            ),
            Code::ToolLoop => ("tool_loop_detected", "loop_detected", "rate_limit_error"),
            Code::BudgetExceeded => ("budget_exceeded", "budget_exceeded", "rate_limit_error"),
            Code::ModelUnpriced => ("model_unpriced", "permission_denied", "permission_error"),
        }
    }
}

/// The shape a refusal takes: the called API's.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    /// An HTTP API's error (OpenAI's or Anthropic's) with this code, which
    /// its SDK raises without retrying.
    Api(Api, Code),
    /// A JSON-RPC `result` with `isError: true` for the request's `id`, so
    /// the MCP session goes on and the model reads the text.
    McpResult(&'a RawValue),
    /// A JSON-RPC `error` with this code for the request's `id`.
    McpError(&'a RawValue, i64),
}

/// What a guard refuses, whatever shape it takes.
#[derive(Debug, Clone)]
pub struct Refusal<'a> {
    pub policy_id: &'a str,
    pub status: u32,
    pub message: String,
    /// Loopguard's fields, beside the message.
    pub details: Value,
    /// When to come back (`retry-after`; the HTTP APIs' shapes add
    /// `retry-after-ms`).
    pub retry_after_ms: Option<u64>,
    /// The guard's own header (`x-loopguard-tool-loop`, ...).
    pub header: Option<(&'static str, String)>,
}

/// Set a member of a JSON object (a no-op on anything else).
pub(crate) fn insert(v: &mut Value, key: &str, value: Value) {
    if let Some(o) = v.as_object_mut() {
        o.insert(key.to_string(), value);
    }
}

/// Whole seconds, rounded up, at least 1 (the `Retry-After` header).
pub fn retry_after_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

/// A refusal in `shape`. The HTTP APIs' shapes put loopguard's details
/// beside OpenAI's `message`, `type` and `code` or, with the code, under
/// Anthropic's `loopguard`, and carry `x-should-retry: false`, which stops
/// both SDKs from retrying on their own (each blind retry would be one more
/// hit of the loop). The MCP shapes put them under `_meta.loopguard` or
/// the error's `data.loopguard`.
pub fn refuse(shape: Shape, mut r: Refusal) -> LocalReply {
    let mut headers = vec![("content-type", "application/json".to_string())];
    let body = match shape {
        Shape::Api(api, code) => {
            if let Some(ms) = r.retry_after_ms {
                headers.push(("retry-after", retry_after_seconds(ms).to_string()));
                headers.push(("retry-after-ms", ms.to_string()));
            }
            headers.push(("x-should-retry", "false".to_string()));
            let (code, openai_type, anthropic_type) = code.names();
            match api {
                Api::OpenAi => {
                    let mut error = json!({
                        "message": r.message, "type": openai_type, "code": code, "param": null,
                    });
                    if let (Some(e), Value::Object(d)) = (error.as_object_mut(), r.details) {
                        e.extend(d);
                    }
                    json!({ "error": error })
                }
                Api::Anthropic => {
                    insert(&mut r.details, "code", json!(code));
                    json!({
                        "type": "error",
                        "error": {"type": anthropic_type, "message": r.message},
                        "loopguard": r.details,
                    })
                }
            }
        }
        Shape::McpResult(id) => json!({"jsonrpc": "2.0", "id": id, "result": {
            "content": [{"type": "text", "text": r.message}],
            "isError": true,
            "resultType": "complete",
            "_meta": {"loopguard": r.details},
        }}),
        Shape::McpError(id, error_code) => json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": error_code,
            "message": r.message,
            "data": {"loopguard": r.details},
        }}),
    };
    headers.push(("x-loopguard-policy", r.policy_id.to_string()));
    headers.extend(r.header);
    if let (Shape::McpResult(_) | Shape::McpError(..), Some(ms)) = (shape, r.retry_after_ms) {
        headers.push(("retry-after", retry_after_seconds(ms).to_string()));
    }
    LocalReply {
        status: r.status,
        headers,
        body: body.to_string(),
    }
}

/// The 429 of a repeated request or conversation, in the error shape of
/// the API being called, so its SDK raises its own rate-limit error with a
/// readable message: OpenAI's `RateLimitError` (`code` =
/// `recursive_loop_detected`) or Anthropic's `rate_limit_error`.
pub fn rejection(r: &Rejection, api: Api) -> LocalReply {
    let n = &r.notice;
    let retry_after_ms = r.retry_after_ms.max(1);
    let message = if n.turns {
        format!(
            "Blocked: the last {} turns of this conversation are near-identical. This usually indicates an agent stuck in a loop: change course before sending it again.",
            n.count
        )
    } else {
        format!(
            "Blocked: {} request sent {} times in {} seconds. This usually indicates an agent retry loop.",
            if n.near { "near-identical" } else { "identical" },
            n.count,
            n.window_seconds
        )
    };
    let mut details = json!({
        "policy": n.policy_id,
        "fingerprint": n.fingerprint.hex(),
        "hit_count": n.count,
        "window_seconds": n.window_seconds,
        "retry_after_seconds": retry_after_seconds(retry_after_ms),
    });
    if r.cooldown_seconds > 0 {
        insert(&mut details, "cooldown_seconds", json!(r.cooldown_seconds));
    }
    if n.turns {
        insert(&mut details, "repeated_turns", json!(n.count));
    }
    let refusal = Refusal {
        policy_id: &n.policy_id,
        status: 429,
        message,
        details,
        retry_after_ms: Some(retry_after_ms),
        header: None,
    };
    refuse(Shape::Api(api, Code::RepeatedRequest), refusal)
}

/// The 429 of a tool loop that reached the ladder's reject step, in the
/// error shape of the API being called, with `code: "tool_loop_detected"`.
/// The same conversation is rejected again whenever it is sent, so it
/// carries no `retry-after`: the agent has to change course.
pub fn tool_loop_rejection(policy_id: &str, v: &ToolVerdict, api: Api) -> LocalReply {
    let shown = tool_loops::shown_tool(v);
    let tool = shown.clone().unwrap_or_default();
    let n = v.occurrences;
    let message = match v.tier {
        tool_loops::Tier::Identical | tool_loops::Tier::Failing => format!(
            "Blocked: the agent called the tool `{tool}` {n} times with the same arguments. This usually indicates an agent tool loop; change approach instead of retrying."
        ),
        tool_loops::Tier::Pattern => format!(
            "Blocked: the agent called the tool `{tool}` {n} times with varying arguments without progress. This usually indicates an agent tool loop; change approach instead of retrying."
        ),
        tool_loops::Tier::Cycle => format!(
            "Blocked: the agent repeated the same sequence of tool calls ({tool}) {n} times with the same results. This usually indicates an agent tool loop; change approach instead of retrying."
        ),
        tool_loops::Tier::Answer => format!(
            "Blocked: the model gave essentially the same answer {n} times in a row. This usually indicates a loop; change the conversation instead of retrying."
        ),
        tool_loops::Tier::Turn => format!(
            "Blocked: the agent wrote the same reply and called the tool `{tool}` the same way {n} times in a row, whatever it returned. This usually indicates an agent loop; change approach instead of retrying."
        ),
    };
    let mut details = json!({
        "policy": policy_id,
        "tier": v.tier.as_str(),
        "level": v.level,
        "occurrences": v.occurrences,
    });
    // An answer loop names no tool.
    if let Some(shown) = shown {
        insert(&mut details, "tool", json!(shown));
    }
    let refusal = Refusal {
        policy_id,
        status: 429,
        message,
        details,
        retry_after_ms: None,
        header: Some(("x-loopguard-tool-loop", tool_loops::header_value(v))),
    };
    refuse(Shape::Api(api, Code::ToolLoop), refusal)
}

/// Every header loopguard may add to a request for the upstream. The
/// upstream trusts them, so loopguard removes any a client sent.
pub const REQUEST_HEADERS: [&str; 4] = [
    "x-loopguard-warning",
    "x-loopguard-loop-count",
    "x-loopguard-policy",
    "x-loopguard-tool-loop",
];

/// The Envoy filter-state name a published header travels under:
/// `x-loopguard-loop-count` -> `loopguard_loop_count` (Envoy shows it as
/// `wasm.loopguard_loop_count`).
pub fn filter_state_name(header: &str) -> String {
    header.trim_start_matches("x-").replace('-', "_")
}

/// Whether a decision's [`response_headers`] go to the request forwarded
/// upstream too: a warning's do (not in shadow mode), a throttle's only
/// reach the client.
pub fn headers_go_upstream(d: &Decision) -> bool {
    matches!(d.verdict, Verdict::Warn(_)) && !d.shadow
}

/// Headers a decision adds to the response the client gets (a 429 carries
/// its own): a warning's (for the upstream request too) or a throttle's.
/// Shadow mode adds none.
pub fn response_headers(d: &Decision) -> Headers {
    let (first, n) = match &d.verdict {
        _ if d.shadow => return Vec::new(),
        Verdict::Warn(n) => (("x-loopguard-warning", "loop_warn".to_string()), n),
        Verdict::Throttle { notice, delay_ms } => {
            (("x-loopguard-delay-ms", delay_ms.to_string()), notice)
        }
        Verdict::Allow | Verdict::Reject(_) => return Vec::new(),
    };
    vec![
        first,
        ("x-loopguard-loop-count", n.count.to_string()),
        ("x-loopguard-policy", n.policy_id.clone()),
    ]
}

/// The line a shadow-mode decision logs for each would-be action.
pub fn shadow_line(d: &Decision) -> Option<String> {
    let n = d.verdict.notice().filter(|_| d.shadow)?;
    let action = d.verdict.action()?.as_str();
    let mut fields = vec![
        ("fingerprint", n.fingerprint.to_string()),
        ("count", n.count.to_string()),
    ];
    if let Verdict::Throttle { delay_ms, .. } = &d.verdict {
        fields.push(("delay_ms", delay_ms.to_string()));
    }
    Some(super::shadow::line(action, None, &n.policy_id, &fields))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::act::decision::Notice;
    use crate::detect::fingerprint::Fingerprint;
    use serde_json::Value;

    fn notice() -> Notice {
        Notice {
            policy_id: "llm-policy".into(),
            fingerprint: Fingerprint([0x9f; 16]),
            count: 5,
            window_seconds: 60,
            near: false,
            turns: false,
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
            notice: notice(),
            retry_after_ms: 36_200,
            cooldown_seconds: 0,
        };
        let reply = rejection(&r, Api::OpenAi);
        assert_eq!(reply.status, 429);
        let h = |k: &str| {
            reply
                .headers
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(h("retry-after"), Some("37"));
        assert_eq!(h("retry-after-ms"), Some("36200"));
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
        let with_cooldown = rejection(
            &Rejection {
                cooldown_seconds: 30,
                ..r
            },
            Api::OpenAi,
        );
        let v: Value = serde_json::from_str(&with_cooldown.body).unwrap();
        assert_eq!(v["error"]["cooldown_seconds"], 30);
    }

    #[test]
    fn anthropic_shaped_429_on_the_messages_api() {
        assert_eq!(Api::for_path("/v1/messages"), Api::Anthropic);
        assert_eq!(
            Api::for_path("/proxy/anthropic/v1/messages"),
            Api::Anthropic
        );
        assert_eq!(Api::for_path("/v1/chat/completions"), Api::OpenAi);
        assert_eq!(Api::for_path("/v1/messages/count_tokens"), Api::OpenAi);
        let r = Rejection {
            notice: notice(),
            retry_after_ms: 1_500,
            cooldown_seconds: 30,
        };
        let reply = rejection(&r, Api::Anthropic);
        let h = |k: &str| {
            reply
                .headers
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(h("retry-after").as_deref(), Some("2"));
        assert_eq!(h("retry-after-ms").as_deref(), Some("1500"));
        assert_eq!(h("x-should-retry").as_deref(), Some("false"));
        let v: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Blocked: identical request sent 5 times"));
        assert_eq!(v["loopguard"]["code"], "recursive_loop_detected");
        assert_eq!(v["loopguard"]["policy"], "llm-policy");
        assert_eq!(v["loopguard"]["hit_count"], 5);
        assert_eq!(v["loopguard"]["retry_after_seconds"], 2);
        assert_eq!(v["loopguard"]["cooldown_seconds"], 30);
    }

    #[test]
    fn headers_per_verdict_and_none_in_shadow() {
        let warn = Decision {
            verdict: Verdict::Warn(notice()),
            shadow: false,
        };
        let expected = vec![
            ("x-loopguard-warning", "loop_warn".to_string()),
            ("x-loopguard-loop-count", "5".to_string()),
            ("x-loopguard-policy", "llm-policy".to_string()),
        ];
        assert!(headers_go_upstream(&warn));
        assert_eq!(response_headers(&warn), expected);
        let throttle = Decision {
            verdict: Verdict::Throttle {
                notice: notice(),
                delay_ms: 500,
            },
            shadow: false,
        };
        assert!(!headers_go_upstream(&throttle));
        assert_eq!(
            response_headers(&throttle)[0],
            ("x-loopguard-delay-ms", "500".to_string())
        );
        for v in [
            Verdict::Warn(notice()),
            Verdict::Throttle {
                notice: notice(),
                delay_ms: 1,
            },
        ] {
            let shadow = Decision {
                verdict: v,
                shadow: true,
            };
            assert!(!headers_go_upstream(&shadow));
            assert!(response_headers(&shadow).is_empty());
        }
    }

    #[test]
    fn tool_loop_429_and_event() {
        use crate::config::ToolStep;
        use crate::detect::tool_loops::Tier;
        let v = ToolVerdict {
            tier: Tier::Identical,
            evidence: crate::detect::tool_loops::Repeated {
                tool: "read_file".into(),
                arguments: Some("{}".into()),
            },
            occurrences: 5,
            level: 3,
            step: ToolStep::Reject,
        };
        let reply = tool_loop_rejection("agents", &v, Api::OpenAi);
        assert_eq!(reply.status, 429);
        assert!(reply.headers.contains(&(
            "x-loopguard-tool-loop",
            "identical;tool=read_file;level=3".to_string()
        )));
        assert!(reply
            .headers
            .contains(&("x-should-retry", "false".to_string())));
        assert!(!reply.headers.iter().any(|(k, _)| *k == "retry-after"));
        let b: Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(b["error"]["code"], "tool_loop_detected");
        assert_eq!(b["error"]["tool"], "read_file");
        assert_eq!(b["error"]["tier"], "identical");
        assert_eq!(b["error"]["level"], 3);
        let a: Value =
            serde_json::from_str(&tool_loop_rejection("agents", &v, Api::Anthropic).body).unwrap();
        assert_eq!(a["error"]["type"], "rate_limit_error");
        assert_eq!(a["loopguard"]["code"], "tool_loop_detected");
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
    fn shadow_lines() {
        let reject = |shadow| Decision {
            verdict: Verdict::Reject(Rejection {
                notice: notice(),
                retry_after_ms: 1,
                cooldown_seconds: 0,
            }),
            shadow,
        };
        assert_eq!(shadow_line(&reject(false)), None);
        assert_eq!(
            shadow_line(&reject(true)).unwrap(),
            format!(
                "shadow: would_reject policy=\"llm-policy\" fingerprint={} count=5",
                "9f".repeat(16)
            )
        );
        let throttle = Decision {
            verdict: Verdict::Throttle {
                notice: notice(),
                delay_ms: 300,
            },
            shadow: true,
        };
        assert_eq!(
            shadow_line(&throttle).unwrap(),
            format!(
                "shadow: would_throttle policy=\"llm-policy\" fingerprint={} count=5 delay_ms=300",
                "9f".repeat(16)
            )
        );
        assert_eq!(
            shadow_line(&Decision {
                verdict: Verdict::Allow,
                shadow: true
            }),
            None
        );
    }
}
