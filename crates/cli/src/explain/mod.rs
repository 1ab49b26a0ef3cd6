//! `loopguard explain`: for one request, which policy applies and the
//! fingerprint's components in order, with the digest the filter computes
//! (the filter's own selection and fingerprint code, see
//! [`loopguard_core::detect::fingerprint::explain`]).

pub use super::request_file::{read_request, RequestFile};
use loopguard_core::act::{decision, events};
use loopguard_core::config::{Config, PathMatch, Similarity, StepName};
use loopguard_core::detect::fingerprint;
use loopguard_core::detect::tool_loops;
use loopguard_core::request::llm;
use loopguard_core::request::policy::{self, Selection};
use loopguard_core::request::RequestHead;
use serde::Serialize;

mod mcp;
pub use mcp::McpFacts;
use mcp::{mcp_facts, render_mcp};

/// What `explain` found (`--json` prints it; the text form is rendered
/// from it).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Explanation {
    pub request: RequestLine,
    pub notes: Vec<String>,
    /// The policy that applies, if any.
    pub policy: Option<Chosen>,
    /// Why nothing is counted, when nothing is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<BodyKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_loops: Option<ToolLoopFinding>,
    /// What the MCP reader sees, under a policy with `mcp`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpFacts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detection: Option<DetectionFacts>,
    pub components: Vec<Shown>,
    pub canonical_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The key the count lives under, when it differs (shadow mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_key: Option<String>,
    /// The caller's tag: the `caller` label of loop metrics and the
    /// `caller` of events.
    pub caller: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestLine {
    pub method: String,
    /// Credential-like query values redacted.
    pub path: String,
    pub authority: String,
    pub body_bytes: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Chosen {
    pub id: String,
    /// 1-based position in the configuration.
    pub position: usize,
    pub chosen_by: String,
    pub mode: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BodyKind {
    pub format: String,
    pub model: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ToolLoopFinding {
    None(String),
    Loop {
        tier: String,
        tool: String,
        occurrences: u32,
        level: u32,
        step: String,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct DetectionFacts {
    pub similarity: String,
    pub detail: String,
    pub window_seconds: u64,
    pub threshold: u32,
    pub fallback: bool,
    pub unparsed: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Shown {
    pub name: String,
    pub value: String,
}

/// Which policy applies to `req` and, if it counts the request, the
/// fingerprint the filter computes for it.
pub fn explain(cfg: &Config, req: &RequestFile) -> Explanation {
    let head = RequestHead {
        method: &req.method,
        path: &req.path,
        authority: &req.authority,
    };
    let mut out = Explanation {
        request: RequestLine {
            method: req.method.clone(),
            path: fingerprint::redact_query(&req.path),
            authority: req.authority.clone(),
            body_bytes: req.body.len(),
        },
        notes: req.notes.clone(),
        ..Explanation::default()
    };
    let index = match policy::select(cfg, &head, req) {
        Selection::Policy(i) => i,
        Selection::None => {
            out.outcome = Some("no policy matches: the request passes untouched".to_string());
            return out;
        }
        Selection::UnknownRoutePolicy(id) => {
            out.outcome = Some(format!("the route names policy \"{id}\", which the configuration does not have: the request passes unchecked"));
            return out;
        }
    };
    let Some(p) = cfg.policies.get(index) else {
        return out;
    };
    let by_route = cfg.route_metadata && req.route_policy.is_some();
    out.policy = Some(Chosen {
        id: p.id.clone(),
        position: index + 1,
        chosen_by: if by_route {
            "route metadata (filter_metadata.loopguard.policy)".to_string()
        } else {
            format!("selector: {}", describe_selector(p))
        },
        mode: p.mode.as_str().to_string(),
    });
    if !p.is_active() {
        out.outcome = Some("the policy is switched off (enabled: false or threshold 0): the request passes untouched".to_string());
        return out;
    }
    if policy::is_exempt(cfg, p, &head, req) {
        out.outcome = Some("exempt (spec.exempt): the request is never counted".to_string());
        return out;
    }
    if req.body.len() as u64 > cfg.max_body_bytes {
        out.outcome = Some(format!(
            "the body ({} bytes) is over max_body_bytes ({}): the request passes unchecked",
            req.body.len(),
            cfg.max_body_bytes
        ));
        return out;
    }
    if let Some(m) = &p.mcp {
        let pending = fingerprint::Pending::start(cfg, p, &head, req);
        out.caller = Some(events::caller_tag(events::caller_hash(
            &p.id,
            pending.identity(),
        )));
        let (facts, outcome) = mcp_facts(p, m, req);
        out.mcp = Some(facts);
        out.outcome = Some(outcome);
        return out;
    }
    let parsed = llm::parse(&req.body, head.path_only(), p.items_needed()).ok();
    if let Some(r) = &parsed {
        out.body = Some(BodyKind {
            format: r.format.as_str().to_string(),
            model: r.model.clone(),
        });
    }
    if let (Some(tl), Some(r)) = (&p.tool_loops, &parsed) {
        out.tool_loops = Some(
            match tool_loops::judge(tl, &r.tool_history(None), r, None) {
                None => ToolLoopFinding::None("no tool loop".to_string()),
                Some(v) => ToolLoopFinding::Loop {
                    tier: v.tier.as_str().to_string(),
                    tool: v.evidence.tool,
                    occurrences: v.occurrences,
                    level: v.level,
                    step: v.step.as_str().to_string(),
                },
            },
        );
    }
    let Some(d) = &p.detection else {
        out.outcome =
            Some("loop detection is off for this policy: no fingerprint is counted".to_string());
        return out;
    };
    let e = fingerprint::explain(cfg, p, &head, req, &req.body);
    let masked = if p.volatile.classes.is_empty() {
        "unmasked"
    } else {
        "masked"
    };
    let detail = match &d.similarity {
        Similarity::Exact => String::new(),
        Similarity::LlmTail { tail_messages } => {
            format!("last {tail_messages} messages, {masked}")
        }
        Similarity::Near {
            tail_messages,
            similarity_milli,
            history,
        } => format!(
            "last {tail_messages} messages and the calls their results answer, {masked}, as a signature salted by the conversation's first user message; a repeat has the same anchor (roles, tool calls, numbers that carry meaning) and shares at least {:.3} of its words (or the same code) with one of the caller's last {history} hits",
            f64::from(*similarity_milli) / 1000.0
        ),
        Similarity::Session { header, .. } => format!("session header {header}"),
    };
    out.detection = Some(DetectionFacts {
        similarity: d.similarity.as_str().to_string(),
        detail,
        window_seconds: d.window_ms() / 1000,
        threshold: d.ladder(e.made.fallback).threshold(),
        fallback: e.made.fallback,
        unparsed: e.made.unparsed,
    });
    out.components = e
        .components
        .into_iter()
        .map(|c| Shown {
            name: c.name,
            value: c.value,
        })
        .collect();
    out.canonical_bytes = e.canonical.len();
    out.fingerprint = Some(e.made.fingerprint.hex());
    let pending = fingerprint::Pending::start(cfg, p, &head, req);
    out.caller = Some(events::caller_tag(events::caller_hash(
        &p.id,
        pending.identity(),
    )));
    let key = decision::store_key(p, &e.made.fingerprint);
    if key != e.made.fingerprint {
        out.store_key = Some(key.hex());
    }
    out
}

fn describe_selector(p: &loopguard_core::config::Policy) -> String {
    let s = &p.selector;
    let mut parts = Vec::new();
    match &s.path {
        PathMatch::Any => {}
        PathMatch::Exact(x) => parts.push(format!("pathExact {x}")),
        PathMatch::Prefix(x) => parts.push(format!("pathPrefix {x}")),
    }
    if !s.methods.is_empty() {
        parts.push(format!("methods {}", s.methods.join(",")));
    }
    if !s.hosts.is_empty() {
        parts.push(format!("hosts {}", s.hosts.join(",")));
    }
    if !s.routes.is_empty() {
        parts.push(format!("routes {}", s.routes.join(",")));
    }
    if parts.is_empty() {
        "matches every request".to_string()
    } else {
        parts.join("; ")
    }
}

/// The text form of an [`Explanation`].
pub fn render(v: &Explanation) -> String {
    let mut s = String::new();
    let r = &v.request;
    let authority = if r.authority.is_empty() {
        "-"
    } else {
        r.authority.as_str()
    };
    s.push_str(&format!(
        "request: {} {} (authority {authority}, body {} bytes)\n",
        r.method, r.path, r.body_bytes
    ));
    for n in &v.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    if let Some(p) = &v.policy {
        s.push_str(&format!(
            "policy: \"{}\" (policy {} in the configuration; {}; mode {})\n",
            p.id, p.position, p.chosen_by, p.mode
        ));
    }
    if let Some(b) = &v.body {
        let model = b
            .model
            .as_deref()
            .map_or_else(|| "(none)".to_string(), |m| format!("\"{m}\""));
        s.push_str(&format!("body: {} request, model {model}\n", b.format));
    }
    match &v.tool_loops {
        Some(ToolLoopFinding::None(text)) => s.push_str(&format!("tool loops: {text}\n")),
        Some(ToolLoopFinding::Loop {
            tier,
            tool,
            occurrences,
            level,
            step,
        }) => s.push_str(&format!(
            "tool loops: {tier} thrash on tool \"{tool}\" ({occurrences} calls): level {level}, {step}\n"
        )),
        None => {}
    }
    if let Some(m) = &v.mcp {
        render_mcp(&mut s, m);
        if let Some(c) = &v.caller {
            s.push_str(&format!(
                "caller tag: {c} (the caller label of loop metrics, and the caller of events)\n"
            ));
        }
    }
    if let Some(o) = &v.outcome {
        s.push_str(&format!("outcome: {o}\n"));
        return s;
    }
    if let Some(d) = &v.detection {
        let detail = if d.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", d.detail)
        };
        let same = if d.similarity == "near" {
            "near-identical"
        } else {
            "identical"
        };
        s.push_str(&format!(
            "detection: {}{detail}; {} {same} in {} s triggers the policy{}\n",
            d.similarity,
            d.threshold,
            d.window_seconds,
            if d.fallback {
                " (no session id: fallback threshold)"
            } else {
                ""
            }
        ));
        if d.unparsed {
            s.push_str("note: the body is not an LLM request this mode reads: it is fingerprinted exactly (counted as unparsed)\n");
        }
    }
    s.push_str("fingerprint components, in order:\n");
    let width = v.components.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for (i, c) in v.components.iter().enumerate() {
        s.push_str(&format!(
            "  {:>2}. {:<width$}  {}\n",
            i + 1,
            c.name,
            c.value
        ));
    }
    s.push_str(&format!(
        "fingerprint: {}  (SHA-256 of {} canonical bytes, first 128 bits)\n",
        v.fingerprint.as_deref().unwrap_or(""),
        v.canonical_bytes
    ));
    if let Some(k) = &v.store_key {
        s.push_str(&format!(
            "counted under: {k} (shadow mode keeps its own counts)\n"
        ));
    }
    if let Some(c) = &v.caller {
        s.push_str(&format!(
            "caller tag: {c} (the caller label of loop metrics, and the caller of events)\n"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopguard_core::detect::fingerprint::Pending;
    use loopguard_core::request::RequestFacts;

    fn config() -> Config {
        Config::parse(
            br#"{"policies": [
              {"id": "batch", "spec": {"selector": {"pathPrefix": "/v1/batch"}, "loop_detection": {"enabled": false}}},
              {"id": "agents", "spec": {"selector": {"pathPrefix": "/v1/", "methods": ["POST"]},
               "exempt": [{"key": "header:x-ci", "present": true}],
               "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "llm_tail"},
               "tool_loops": {"enabled": true}}}]}"#,
        )
        .unwrap()
    }

    const CHAT: &str =
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Is the build green?"}]}"#;

    #[test]
    fn raw_http_and_structured_requests_read_the_same() {
        let raw = format!("POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer sk-1\r\nContent-Length: {}\r\n\r\n{CHAT}", CHAT.len());
        let a = read_request("r.http", raw.as_bytes()).unwrap();
        let yaml = format!("method: post\npath: /v1/chat/completions?x=1\nheaders: {{Host: api.example.com, authorization: Bearer sk-1, content-length: \"{}\"}}\nbody: '{CHAT}'\n", CHAT.len());
        let b = read_request("r.yaml", yaml.as_bytes()).unwrap();
        assert_eq!(a.method, "POST");
        assert_eq!(a.authority, "api.example.com");
        assert_eq!(a.body, CHAT.as_bytes());
        assert_eq!(
            (
                a.method.clone(),
                a.path.clone(),
                a.body.clone(),
                a.authority.clone()
            ),
            (
                b.method.clone(),
                b.path.clone(),
                b.body.clone(),
                b.authority.clone()
            )
        );
        assert_eq!(a.header("authorization"), b.header("authorization"));
        assert!(read_request("x.yaml", b"path: /\nbody: {a: 1}\n")
            .unwrap_err()
            .contains("body must be a string"));
        assert!(read_request("x.yaml", b"path: /\nextra: 1\n")
            .unwrap_err()
            .contains("extra is not a known field"));
        assert!(read_request("x.yaml", b"method: GET\n")
            .unwrap_err()
            .contains("path is required"));
        let j = read_request("j.yaml", b"path: /v1/x\nbody_json: {b: 1, a: 2}\n").unwrap();
        assert_eq!(j.body, br#"{"a":2,"b":1}"#);
        assert_eq!(j.method, "POST");
    }

    #[test]
    fn explains_the_filters_choice_and_digest() {
        let cfg = config();
        let req = read_request("r.yaml", format!("path: /v1/chat/completions\nheaders: {{authorization: Bearer sk-1}}\nbody: '{CHAT}'\n").as_bytes()).unwrap();
        let v = explain(&cfg, &req);
        let chosen = v.policy.clone().unwrap();
        assert_eq!((chosen.id.as_str(), chosen.position), ("agents", 2));
        assert!(matches!(&v.tool_loops, Some(ToolLoopFinding::None(t)) if t == "no tool loop"));
        assert_eq!(v.body.clone().unwrap().format, "openai_chat");
        // The digest the filter computes.
        let head = RequestHead {
            method: "POST",
            path: "/v1/chat/completions",
            authority: "",
        };
        let filter = Pending::start(&cfg, &cfg.policies[1], &head, &req).finish(CHAT.as_bytes());
        assert_eq!(
            v.fingerprint.as_deref(),
            Some(filter.fingerprint.hex().as_str())
        );
        let text = render(&v);
        assert!(text.contains("policy: \"agents\" (policy 2 in the configuration; selector: pathPrefix /v1/; methods POST; mode enforce)"), "{text}");
        assert!(
            text.contains(&format!("fingerprint: {}", filter.fingerprint.hex())),
            "{text}"
        );
        assert!(
            text.contains("message[0] text  \"is the build green?\""),
            "{text}"
        );
        assert!(!text.contains("sk-1"), "the API key is never shown");

        let off = read_request("r.yaml", b"path: /v1/batch/jobs\nbody: x\n").unwrap();
        assert_eq!(explain(&cfg, &off).outcome.unwrap(), "the policy is switched off (enabled: false or threshold 0): the request passes untouched");
        let none = read_request("r.yaml", b"path: /v2/x\n").unwrap();
        assert_eq!(
            explain(&cfg, &none).outcome.unwrap(),
            "no policy matches: the request passes untouched"
        );
        let exempt = read_request(
            "r.yaml",
            format!("path: /v1/x\nheaders: {{x-ci: '1'}}\nbody: '{CHAT}'\n").as_bytes(),
        )
        .unwrap();
        assert_eq!(
            explain(&cfg, &exempt).outcome.unwrap(),
            "exempt (spec.exempt): the request is never counted"
        );
    }
}
