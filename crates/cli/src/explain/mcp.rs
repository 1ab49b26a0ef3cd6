//! `explain` on a request under an MCP policy: what the filter's MCP reader
//! makes of it (method, id, tool, the call as compared, the mirrored headers,
//! whose history it joins) and what the filter then does.

use super::RequestFile;
use loopguard_core::config::{Mcp, McpKey, Policy, StepName};
use loopguard_core::detect::mcp as mcp_judge;
use loopguard_core::request::llm::volatile;
use loopguard_core::request::mcp;
use serde::Serialize;

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

/// What the MCP reader makes of `req`, and what the filter then does.
pub(super) fn mcp_facts(p: &Policy, m: &Mcp, req: &RequestFile) -> (McpFacts, String) {
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

pub(super) fn render_mcp(s: &mut String, m: &McpFacts) {
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
    use crate::explain::{explain, read_request, render, Explanation};
    use loopguard_core::config::Config;

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
