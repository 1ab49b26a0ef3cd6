//! `loopguard explain`: for one request, which policy applies and the
//! fingerprint's components in order, with the digest the filter computes
//! (the filter's own selection and fingerprint code, see
//! [`loopguard_core::detect::fingerprint::explain`]).

pub use super::request_file::{read_request, RequestFile};
use loopguard_core::act::{decision, events};
use loopguard_core::config::{Config, Mcp, McpKey, PathMatch, Policy, Similarity};
use loopguard_core::detect::fingerprint;
use loopguard_core::detect::mcp as mcp_judge;
use loopguard_core::detect::tool_loops;
use loopguard_core::request::llm;
use loopguard_core::request::llm::volatile;
use loopguard_core::request::mcp;
use loopguard_core::request::policy::{self, Selection};
use loopguard_core::request::RequestHead;
use serde::Serialize;

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

/// A request under an MCP policy, as the filter's MCP reader sees it
/// ([`loopguard_core::request::mcp::read`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct McpFacts {
    /// `tools/call` (judged), `other` (passed on untouched), `unjudged`
    /// (passed on untouched and counted), `not_a_call` (not a POST with a
    /// body).
    pub reads: String,
    /// The JSON-RPC `method`, when the body has one.
    pub method: Option<String>,
    /// The JSON-RPC `id` as written.
    pub id: Option<String>,
    pub tool: Option<String>,
    /// The arguments as compared: canonical JSON (keys sorted, no
    /// whitespace), masked when the policy masks arguments.
    pub arguments: Option<String>,
    /// The call's digest (the tool and its canonical arguments).
    pub digest: Option<String>,
    /// Why the request passes unjudged (`batch`, `malformed`,
    /// `headers_disagree`: `loopguard_mcp_unjudged_total`'s reason).
    pub unjudged: Option<String>,
    /// What `Mcp-Method` and `Mcp-Name` say, against the body.
    pub headers: String,
    /// `MCP-Protocol-Version`.
    pub protocol: Option<String>,
    /// The tool is in `exempt_tools`: never judged, never counted.
    pub exempt: bool,
    /// Whose history the call joins: `session` or `caller`.
    pub history_key: String,
    /// The history, in words (the session shown as a digest).
    pub history: String,
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
                    tool: v.tool,
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

/// What the MCP reader makes of `req`, and what the filter then does.
fn mcp_facts(p: &Policy, m: &Mcp, req: &RequestFile) -> (McpFacts, String) {
    let head = mcp::Head::read(req);
    let mut f = McpFacts {
        protocol: head.protocol.clone(),
        ..McpFacts::default()
    };
    f.headers = match (&head.method, &head.name) {
        (None, None) => "no Mcp-Method or Mcp-Name header (protocol versions before 2026-07-28 send none): the body alone tells".to_string(),
        (method, name) => {
            let shown = |h: &str, v: &Option<String>| match v {
                Some(v) => format!("{h} \"{v}\""),
                None => format!("no {h}"),
            };
            format!(
                "{} and {}",
                shown("Mcp-Method", method),
                shown("Mcp-Name", name)
            )
        }
    };
    let session = head.session.as_deref().map(|s| {
        let mut h = loopguard_core::request::Fnv::default();
        h.write(s.as_bytes());
        format!("#{:08x}", h.0 >> 32)
    });
    f.history_key = match (m.key, &session) {
        (McpKey::Session, Some(_)) => "session",
        _ => "caller",
    }
    .to_string();
    // A caller known by nothing else is told apart by its address.
    let anonymous = p.limit_keys.is_empty() && loopguard_core::request::api_key(req).is_none();
    let address = match (anonymous, req.source_address.as_deref()) {
        (true, Some(a)) => format!(
            " (no limit keys, no API key: told apart by its address {})",
            loopguard_core::request::address_without_port(a)
        ),
        (true, None) => " (no limit keys, no API key: told apart by its address, which this request does not give)".to_string(),
        (false, _) => String::new(),
    };
    f.history = match (m.key, &session) {
        (McpKey::Session, Some(s)) => {
            format!("the caller's{address} session (Mcp-Session-Id, shown as digest {s}); key \"session\"")
        }
        (McpKey::Session, None) => format!("the caller's own{address}: no Mcp-Session-Id (protocol 2026-07-28 is stateless, or the session is not open yet); key \"session\""),
        (McpKey::Caller, _) => format!("the caller's{address}, whatever session it opens; key \"caller\""),
    };
    if req.method != "POST" || req.body.is_empty() {
        f.reads = "not_a_call".to_string();
        return (f, "only a POST with a body carries a call (GET opens the event stream, DELETE ends a session): the request passes untouched".to_string());
    }
    // Shown only: the reader below decides.
    let rpc = serde_json::from_slice::<serde_json::Value>(&req.body).ok();
    f.method = rpc
        .as_ref()
        .and_then(|v| v.get("method"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    f.id = rpc
        .as_ref()
        .and_then(|v| v.get("id"))
        .map(|id| id.to_string());
    f.tool = rpc
        .as_ref()
        .and_then(|v| v.pointer("/params/name"))
        .and_then(serde_json::Value::as_str)
        .filter(|_| f.method.as_deref() == Some("tools/call"))
        .map(str::to_string);
    let agree = |ok: bool| {
        if ok {
            ": they agree with the body"
        } else {
            ": they disagree with the body"
        }
    };
    let outcome = match mcp::read(&req.body, &head, m.arguments_mask) {
        mcp::Message::Call(call) => {
            let value = rpc.as_ref().and_then(|v| v.pointer("/params/arguments"));
            let args = value
                .filter(|a| !a.is_null())
                .map_or_else(|| "{}".to_string(), serde_json::Value::to_string);
            let mut shown =
                volatile::mask(&args, m.arguments_mask, volatile::Context::Arguments).into_owned();
            // The arguments are shown as serde_json writes them canonically;
            // the reader's own digest says whether that is what it compared.
            if mcp::call_digest(&call.tool, value, m.arguments_mask) != call.digest {
                shown.push_str(
                    " (as parsed here; the reader's canonical form differs, the digest is its own)",
                );
            }
            f.reads = "tools/call".to_string();
            f.id = Some(call.id.clone());
            f.arguments = Some(shown);
            f.digest = Some(format!("{:016x}", call.digest));
            f.tool = Some(call.tool.clone());
            if head.method.is_some() || head.name.is_some() {
                f.headers.push_str(agree(true));
            }
            if mcp_judge::exempt(m, &call.tool) {
                f.exempt = true;
                format!("the tool \"{}\" is in exempt_tools: the call is never judged, and neither counts nor breaks a run of other calls", call.tool)
            } else {
                let ladder: Vec<&str> = m.ladder.iter().map(|s| s.as_str()).collect();
                let cycles = if m.cycle_min == 0 {
                    "cycles are not looked for".to_string()
                } else {
                    format!("a cycle of 2 or 3 calls {} rounds", m.cycle_min)
                };
                format!(
                    "judged against the history of its last calls and their results: the same call with the same result {} times, failing the same way {} times, or {cycles} reaches the ladder ({}), one step a repeat after that; a history idle {} s starts again",
                    m.same_result_min,
                    m.same_error_min,
                    ladder.join(", "),
                    m.window_ms / 1000
                )
            }
        }
        mcp::Message::Other => {
            f.reads = "other".to_string();
            if head.method.is_some() {
                f.headers.push_str(agree(true));
            }
            let what = match &f.method {
                Some(method) => format!("a {method} request or notification"),
                None => "a JSON-RPC response the client sends back".to_string(),
            };
            format!("{what}, not a tools/call: the request passes untouched")
        }
        mcp::Message::Unjudged(why) => {
            f.reads = "unjudged".to_string();
            f.unjudged = Some(why.as_str().to_string());
            if why == mcp::Unjudged::HeadersDisagree {
                f.headers.push_str(agree(false));
            }
            // By its name: the reasons grow with the reader.
            let detail = match why.as_str() {
                "batch" => "a JSON array: a batch (protocol 2025-03-26)",
                "malformed" => "not one JSON-RPC 2.0 request, or a tools/call without an id it can echo, params or a tool name",
                "headers_disagree" => "Mcp-Method or Mcp-Name says something else than the body",
                "too_complex" => "nested deeper than 64, or an object or array larger than the reader reads",
                _ => "the reader does not judge it",
            };
            format!(
                "{detail}: the request passes untouched, counted in loopguard_mcp_unjudged_total (reason {})",
                why.as_str()
            )
        }
    };
    (f, outcome)
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

fn render_mcp(s: &mut String, m: &McpFacts) {
    let reads = match m.reads.as_str() {
        "tools/call" => format!(
            "tools/call, id {}, tool \"{}\"",
            m.id.as_deref().unwrap_or("-"),
            m.tool.as_deref().unwrap_or("")
        ),
        "other" => format!(
            "{} (not a tools/call){}",
            m.method.as_deref().unwrap_or("a response"),
            m.id.as_deref()
                .map(|i| format!(", id {i}"))
                .unwrap_or_default()
        ),
        "unjudged" => format!(
            "unjudged ({}){}{}",
            m.unjudged.as_deref().unwrap_or(""),
            m.method
                .as_deref()
                .map(|x| format!(", method {x}"))
                .unwrap_or_default(),
            m.tool
                .as_deref()
                .map(|t| format!(", tool \"{t}\" in the body"))
                .unwrap_or_default()
        ),
        _ => "no call (not a POST with a body)".to_string(),
    };
    s.push_str(&format!("mcp: {reads}\n"));
    if let Some(a) = &m.arguments {
        s.push_str(&format!("mcp arguments (canonical, as compared): {a}\n"));
    }
    if let Some(d) = &m.digest {
        s.push_str(&format!(
            "mcp call digest: {d} (the tool and its canonical arguments; params._meta is not part of it)\n"
        ));
    }
    s.push_str(&format!("mcp headers: {}\n", m.headers));
    if let Some(p) = &m.protocol {
        s.push_str(&format!("mcp protocol version: {p}\n"));
    }
    s.push_str(&format!("mcp history: {}: {}\n", m.history_key, m.history));
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

    const MCP: &str = r#"{"policies": [{"id": "mcp-tools", "spec": {"selector": {"pathPrefix": "/mcp"},
        "mcp": {"enabled": true, "ladder": ["note", "block"], "exempt_tools": ["ping"], "key": "session"}}}]}"#;

    fn mcp_explain(cfg: &str, yaml: &str) -> (Explanation, String) {
        let cfg = Config::parse(cfg.as_bytes()).unwrap();
        let req = read_request("r.yaml", yaml.as_bytes()).unwrap();
        let v = explain(&cfg, &req);
        let text = render(&v);
        (v, text)
    }

    #[test]
    fn an_mcp_call_as_the_reader_sees_it() {
        let call = r#"{"method":"tools/call","params":{"name":"search","arguments":{"q":"x","n":2},"_meta":{"progressToken":7}},"jsonrpc":"2.0","id":"r-7"}"#;
        let (v, text) = mcp_explain(
            MCP,
            &format!("path: /mcp\nheaders: {{mcp-session-id: 6b51c303, mcp-protocol-version: '2025-11-25', authorization: Bearer sk-1}}\nbody: '{call}'\n"),
        );
        let m = v.mcp.clone().unwrap();
        assert_eq!(m.reads, "tools/call");
        assert_eq!(m.id.as_deref(), Some("\"r-7\""));
        assert_eq!(m.tool.as_deref(), Some("search"));
        assert_eq!(m.arguments.as_deref(), Some(r#"{"n":2,"q":"x"}"#));
        // The filter's digest: the tool and canonical arguments, never _meta.
        let head = mcp::Head::read(&read_request("r.yaml", b"path: /mcp\n").unwrap());
        let want = match mcp::read(
            call.as_bytes(),
            &head,
            loopguard_core::config::Classes::NONE,
        ) {
            mcp::Message::Call(c) => c.digest,
            other => panic!("{other:?}"),
        };
        assert_eq!(m.digest, Some(format!("{want:016x}")));
        assert_eq!(m.history_key, "session");
        assert!(!m.exempt);
        assert!(
            text.contains("mcp: tools/call, id \"r-7\", tool \"search\"\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!("mcp call digest: {want:016x} (")),
            "{text}"
        );
        assert!(
            text.contains("mcp headers: no Mcp-Method or Mcp-Name header"),
            "{text}"
        );
        assert!(
            text.contains("mcp protocol version: 2025-11-25\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "mcp history: session: the caller's session (Mcp-Session-Id, shown as digest #"
            ),
            "{text}"
        );
        assert!(
            !text.contains("6b51c303") && !text.contains("sk-1"),
            "{text}"
        );
        assert!(text.contains("outcome: judged against the history of its last calls and their results: the same call with the same result 3 times"), "{text}");
        assert!(text.contains("reaches the ladder (note, block)"), "{text}");
        assert!(text.contains("caller tag: "), "{text}");
        // The same call on protocol 2026-07-28: mirrored headers, no session.
        let (v, text) = mcp_explain(
            MCP,
            &format!("path: /mcp\nheaders: {{mcp-method: tools/call, mcp-name: search}}\nbody: '{call}'\n"),
        );
        let m = v.mcp.unwrap();
        assert_eq!(m.digest, Some(format!("{want:016x}")));
        assert_eq!(m.history_key, "caller");
        assert!(text.contains("mcp headers: Mcp-Method \"tools/call\" and Mcp-Name \"search\": they agree with the body"), "{text}");
        // With key caller, a session does not matter.
        let (v, _) = mcp_explain(
            &MCP.replace("\"key\": \"session\"", "\"key\": \"caller\""),
            &format!("path: /mcp\nheaders: {{mcp-session-id: s1}}\nbody: '{call}'\n"),
        );
        assert_eq!(v.mcp.unwrap().history_key, "caller");
        // A caller known by nothing else: its address.
        let (v, text) = mcp_explain(
            MCP,
            &format!("path: /mcp\nsource_address: '10.0.0.7:41234'\nbody: '{call}'\n"),
        );
        assert!(
            v.mcp
                .unwrap()
                .history
                .contains("told apart by its address 10.0.0.7"),
            "{text}"
        );
    }

    #[test]
    fn what_mcp_passes_untouched_and_why() {
        let outcome = |yaml: &str| {
            let (v, text) = mcp_explain(MCP, yaml);
            (v.mcp.unwrap(), v.outcome.unwrap(), text)
        };
        let (m, o, text) = outcome("path: /mcp\nheaders: {mcp-method: tools/call, mcp-name: read}\nbody: '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"search\"}}'\n");
        assert_eq!(
            (m.reads.as_str(), m.unjudged.as_deref()),
            ("unjudged", Some("headers_disagree"))
        );
        assert!(
            o.ends_with("counted in loopguard_mcp_unjudged_total (reason headers_disagree)"),
            "{o}"
        );
        assert!(
            text.contains(
                "mcp: unjudged (headers_disagree), method tools/call, tool \"search\" in the body"
            ),
            "{text}"
        );
        assert!(
            text.contains("Mcp-Name \"read\": they disagree with the body"),
            "{text}"
        );
        let (m, o, _) = outcome(
            "path: /mcp\nbody: '[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\"}]'\n",
        );
        assert_eq!(m.unjudged.as_deref(), Some("batch"));
        assert!(o.starts_with("a JSON array: a batch"), "{o}");
        let (m, _, _) = outcome("path: /mcp\nbody: '{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}'\n");
        assert_eq!(m.unjudged.as_deref(), Some("malformed"));
        let (m, o, text) = outcome(
            "path: /mcp\nbody: '{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}'\n",
        );
        assert_eq!(
            (m.reads.as_str(), m.method.as_deref()),
            ("other", Some("tools/list"))
        );
        assert_eq!(
            o,
            "a tools/list request or notification, not a tools/call: the request passes untouched"
        );
        assert!(
            text.contains("mcp: tools/list (not a tools/call), id 2\n"),
            "{text}"
        );
        let (m, o, _) = outcome("path: /mcp\nbody: '{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"ping\"}}'\n");
        assert!(m.exempt);
        assert!(o.starts_with("the tool \"ping\" is in exempt_tools"), "{o}");
        let (m, o, _) = outcome("method: GET\npath: /mcp\nheaders: {accept: text/event-stream}\n");
        assert_eq!(m.reads, "not_a_call");
        assert!(
            o.starts_with("only a POST with a body carries a call"),
            "{o}"
        );
    }
}
