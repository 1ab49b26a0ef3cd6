//! MCP over streamable HTTP: what a JSON-RPC POST to an MCP endpoint asks
//! for. A `tools/call` becomes a [`ToolCall`]: its `id` (echoed by a reply
//! loopguard answers itself), its tool and a digest of the call (the tool
//! name and its arguments in canonical JSON, never the whole `params`: a
//! client may put a fresh `_meta.progressToken` in every call).
//!
//! The body decides; the headers protocol version 2026-07-28 mirrors it in
//! (`Mcp-Method`, `Mcp-Name`) must agree with it, or the request is passed
//! on untouched (and counted): loopguard never judges a call whose
//! headers and body tell two stories. Batches (protocol 2025-03-26) pass
//! on untouched, as does anything that is not one JSON-RPC request.

use super::llm::normalize::canonical_json;
use super::llm::scan::{self, Span};
use super::llm::volatile::{self, Context};
use super::{Fnv, RequestFacts};
use crate::config::Classes;
use serde_json::Value;

/// The longest JSON-RPC `id` echoed back (longer ones pass untouched).
pub const MAX_ID_BYTES: usize = 256;
/// The longest tool name read (MCP names are at most 128 characters).
pub const MAX_TOOL_NAME_BYTES: usize = 256;
/// The longest header value kept (session ids are short).
const MAX_HEADER_BYTES: usize = 256;

/// What the request headers say about an MCP message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    /// `Mcp-Session-Id` (protocol versions with sessions).
    pub session: Option<String>,
    /// `Mcp-Method` (protocol 2026-07-28).
    pub method: Option<String>,
    /// `Mcp-Name` (protocol 2026-07-28): the tool of a `tools/call`.
    pub name: Option<String>,
    /// `MCP-Protocol-Version`.
    pub protocol: Option<String>,
}

fn header(facts: &dyn RequestFacts, name: &str) -> Option<String> {
    let v = facts.header(name)?;
    if v.len() > MAX_HEADER_BYTES {
        // Kept as a digest: still one session, never a huge copy.
        let mut h = Fnv::default();
        h.write(&v);
        return Some(format!("#{:016x}", h.0));
    }
    Some(String::from_utf8_lossy(&v).trim().to_string())
}

impl Head {
    pub fn read(facts: &dyn RequestFacts) -> Head {
        Head {
            session: header(facts, "mcp-session-id").filter(|s| !s.is_empty()),
            method: header(facts, "mcp-method"),
            name: header(facts, "mcp-name"),
            protocol: header(facts, "mcp-protocol-version"),
        }
    }
}

/// A `tools/call` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The request's `id` as written (a JSON string or number).
    pub id: String,
    pub tool: String,
    /// The tool and its canonical arguments (masked as the policy says).
    pub digest: u64,
}

/// Why a POST is passed on without being judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unjudged {
    /// A JSON array: a batch (protocol 2025-03-26).
    Batch,
    /// Not JSON, not a JSON-RPC request, or a `tools/call` without a tool
    /// name or with an id too long to echo.
    Malformed,
    /// `Mcp-Method` or `Mcp-Name` says something else than the body.
    HeadersDisagree,
    /// Nested deeper than 64, or an object or array larger than the
    /// scanner reads (4,096 members, 65,536 elements).
    TooComplex,
}

impl Unjudged {
    pub fn as_str(self) -> &'static str {
        match self {
            Unjudged::Batch => "batch",
            Unjudged::Malformed => "malformed",
            Unjudged::HeadersDisagree => "headers_disagree",
            Unjudged::TooComplex => "too_complex",
        }
    }
}

/// What one POST body is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A `tools/call` to judge.
    Call(ToolCall),
    /// Any other request or notification (`initialize`, `tools/list`,
    /// `notifications/*`), or a response the client sends the server:
    /// always passed on.
    Other,
    /// Passed on untouched, and counted.
    Unjudged(Unjudged),
}

/// A member's value by key; of a key given twice, the last (what the JSON
/// parsers of MCP servers keep: Python's, JavaScript's).
fn last(members: &[scan::Member<'_>], key: &str) -> Option<Span> {
    members
        .iter()
        .rev()
        .find(|(k, _)| *k == key.as_bytes())
        .map(|(_, s)| *s)
}

/// Read one POST body (the whole of it). The body is walked by the
/// conversation readers' structural scanner (bounded in depth and in
/// members, no value tree), and the arguments are written out in canonical
/// JSON straight from the bytes.
pub fn read(body: &[u8], head: &Head, arguments_mask: Classes) -> Message {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        return Message::Unjudged(Unjudged::Batch);
    }
    if scan::refusal(body).is_some() {
        return Message::Unjudged(Unjudged::TooComplex);
    }
    let malformed = Message::Unjudged(Unjudged::Malformed);
    // The scanner checks structure, not the grammar: only a body that is
    // JSON is a call (its id is echoed in a reply), checked without
    // building anything.
    // One JSON value (so checked): an object from its first byte to its
    // last.
    if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_err() || first != Some(&b'{') {
        return malformed;
    }
    // The object's members end at its closing brace, whatever follows.
    let Some(top) = scan::members(body, (0, body.len())) else {
        return malformed;
    };
    let jsonrpc = last(&top, "jsonrpc").and_then(|s| scan::plain_str(body, s));
    if jsonrpc != Some(b"2.0".as_slice()) {
        return malformed;
    }
    let Some(method) = last(&top, "method") else {
        // A response or error the client sends back (to a server's
        // request): nothing to judge.
        return Message::Other;
    };
    let Some(method) = scan::string(body, method) else {
        return malformed;
    };
    if head.method.as_deref().is_some_and(|m| m != method) {
        return Message::Unjudged(Unjudged::HeadersDisagree);
    }
    if method != "tools/call" {
        return Message::Other;
    }
    let (Some(id), Some(params)) = (last(&top, "id"), last(&top, "params")) else {
        // A tools/call without an id is a notification nobody answers, or
        // has no params: not a call a server would run.
        return malformed;
    };
    let id = body
        .get(id.0..id.1)
        .and_then(|b| std::str::from_utf8(b).ok())
        .map(str::trim)
        .unwrap_or("");
    // A string or a number a JSON parser reads as one (no lone surrogate,
    // no number out of range): it is echoed byte for byte in a reply.
    let id_ok = id.len() <= MAX_ID_BYTES
        && matches!(
            serde_json::from_str::<Value>(id),
            Ok(Value::String(_) | Value::Number(_))
        );
    let Some(params) = scan::members(body, params) else {
        return malformed;
    };
    let tool = last(&params, "name").and_then(|s| scan::string(body, s));
    let Some(tool) = tool.filter(|s| id_ok && (1..=MAX_TOOL_NAME_BYTES).contains(&s.len())) else {
        return malformed;
    };
    if head.name.as_deref().is_some_and(|n| n != tool) {
        return Message::Unjudged(Unjudged::HeadersDisagree);
    }
    let arguments = match last(&params, "arguments").map(|span| scan::canonical(body, span)) {
        Some(None) => return malformed,
        arguments => arguments.flatten(),
    };
    Message::Call(ToolCall {
        digest: canonical_digest(&tool, arguments.as_deref(), arguments_mask),
        id: id.to_string(),
        tool,
    })
}

/// A call's digest: its tool and its arguments in canonical JSON (key
/// order and whitespace do not matter; absent, `null` and `{}` arguments
/// are the same call), masked by `mask` when the policy opts in.
pub fn call_digest(tool: &str, arguments: Option<&Value>, mask: Classes) -> u64 {
    canonical_digest(tool, arguments.map(canonical_json).as_deref(), mask)
}

/// [`call_digest`] of arguments already in canonical JSON.
fn canonical_digest(tool: &str, arguments: Option<&str>, mask: Classes) -> u64 {
    let args = arguments.filter(|a| *a != "null").unwrap_or("{}");
    let args = volatile::mask(args, mask, Context::Arguments);
    let mut h = Fnv::default();
    h.write(tool.as_bytes());
    h.write(&[0]);
    h.write(args.as_bytes());
    h.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(body: &Value) -> ToolCall {
        match read(body.to_string().as_bytes(), &Head::default(), Classes::NONE) {
            Message::Call(c) => c,
            other => panic!("not a call: {other:?}"),
        }
    }

    #[test]
    fn a_call_is_its_tool_and_canonical_arguments_not_its_meta() {
        let a = call(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "search", "arguments": {"q": "x", "n": 2},
                       "_meta": {"progressToken": 1}}}));
        let b = call(
            &json!({"jsonrpc": "2.0", "id": "abc", "method": "tools/call",
            "params": {"_meta": {"progressToken": 7}, "arguments": {"n": 2, "q": "x"},
                       "name": "search"}}),
        );
        assert_eq!(a.digest, b.digest);
        assert_eq!((a.id.as_str(), b.id.as_str()), ("1", "\"abc\""));
        assert_eq!(a.tool, "search");
        let other = call(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "search", "arguments": {"q": "y", "n": 2}}}));
        assert_ne!(a.digest, other.digest);
        let spaced = br#" { "jsonrpc" : "2.0", "id" : 9, "method" : "tools/call",
            "params" : { "name" : "search", "arguments" : { "n" : 2, "q" : "x" } } } "#;
        let Message::Call(c) = read(spaced, &Head::default(), Classes::NONE) else {
            panic!("whitespace changes nothing");
        };
        assert_eq!(c.digest, a.digest);
    }

    #[test]
    fn the_body_and_a_value_give_one_digest() {
        let args = json!({"q": "x \"y\"", "n": [1, 2.5, -3], "o": {"b": true, "a": null}});
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "s", "arguments": args}});
        assert_eq!(
            call(&body).digest,
            call_digest("s", Some(&args), Classes::NONE)
        );
    }

    #[test]
    fn absent_null_and_empty_arguments_are_one_call() {
        let d = |args: Option<Value>| {
            let mut params = json!({"name": "list"});
            if let Some(a) = args {
                params["arguments"] = a;
            }
            call(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
                .digest
        };
        assert_eq!(d(None), d(Some(Value::Null)));
        assert_eq!(d(None), d(Some(json!({}))));
    }

    #[test]
    fn other_methods_notifications_and_responses_pass() {
        for body in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            json!({"jsonrpc": "2.0", "id": 5, "result": {}}),
        ] {
            let m = read(body.to_string().as_bytes(), &Head::default(), Classes::NONE);
            assert_eq!(m, Message::Other, "{body}");
        }
    }

    #[test]
    fn odd_bodies_are_unjudged_with_a_reason() {
        let un = |b: &[u8], head: &Head| match read(b, head, Classes::NONE) {
            Message::Unjudged(u) => u,
            other => panic!("{}: {other:?}", String::from_utf8_lossy(b)),
        };
        let none = Head::default();
        assert_eq!(
            un(
                br#" [{"jsonrpc":"2.0","id":1,"method":"tools/call"}]"#,
                &none
            ),
            Unjudged::Batch
        );
        for bad in [
            &b"not json"[..],
            br#"{"jsonrpc":"1.0","id":1,"method":"tools/call","params":{"name":"a"}}"#,
            br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"a"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":""}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}"#,
            br#"{"jsonrpc":"2.0","id":{"x":1},"method":"tools/call","params":{"name":"a"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
        ] {
            assert_eq!(un(bad, &none), Unjudged::Malformed);
        }
        let long_id = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"tools/call","params":{{"name":"a"}}}}"#,
            "x".repeat(MAX_ID_BYTES)
        );
        assert_eq!(un(long_id.as_bytes(), &none), Unjudged::Malformed);
        let deep = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a","arguments":{}1{}}}}}"#,
            "[".repeat(5000),
            "]".repeat(5000)
        );
        assert_eq!(un(deep.as_bytes(), &none), Unjudged::TooComplex);
        let keys: Vec<String> = (0..5000).map(|i| format!(r#""k{i}":0"#)).collect();
        let many = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"a","arguments":{{{}}}}}}}"#,
            keys.join(",")
        );
        assert_eq!(un(many.as_bytes(), &none), Unjudged::TooComplex);
    }

    #[test]
    fn a_key_given_twice_reads_as_servers_read_it_and_ids_are_json() {
        // The last of a key given twice, as Python's and JavaScript's
        // parsers keep it.
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"search","name":"read"}}"#;
        let Message::Call(c) = read(body, &Head::default(), Classes::NONE) else {
            panic!("the last method is tools/call");
        };
        assert_eq!(c.tool, "read");
        // A body that is not JSON (an id that is no JSON value, a raw
        // control character in a string) is no call.
        for bad in [
            &br#"{"jsonrpc":"2.0","id":e1,"method":"tools/call","params":{"name":"a"}}"#[..],
            b"{\"jsonrpc\":\"2.0\",\"id\":\"a\x01\",\"method\":\"tools/call\",\"params\":{\"name\":\"a\"}}",
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":{"x":01}}}"#,
            br#"{"jsonrpc":"2.0","id":"\ud800","method":"tools/call","params":{"name":"a"}}"#,
            br#"{"jsonrpc":"2.0","id":1e400,"method":"tools/call","params":{"name":"a"}}"#,
        ] {
            assert_eq!(
                read(bad, &Head::default(), Classes::NONE),
                Message::Unjudged(Unjudged::Malformed),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn mirrored_headers_must_agree_with_the_body() {
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search"}}"#;
        let head = |m: &str, n: &str| Head {
            method: Some(m.to_string()),
            name: Some(n.to_string()),
            ..Head::default()
        };
        assert!(matches!(
            read(body, &head("tools/call", "search"), Classes::NONE),
            Message::Call(_)
        ));
        for h in [head("tools/list", "search"), head("tools/call", "read")] {
            assert_eq!(
                read(body, &h, Classes::NONE),
                Message::Unjudged(Unjudged::HeadersDisagree)
            );
        }
        // A tools/list with a matching Mcp-Method passes as any other.
        let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
        assert_eq!(
            read(list, &head("tools/list", ""), Classes::NONE),
            Message::Other
        );
    }

    #[test]
    fn masked_arguments_are_an_opt_in() {
        let body = |ts: &str| {
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "log", "arguments": {"at": ts}}})
            .to_string()
        };
        let digest =
            |ts: &str, mask: Classes| match read(body(ts).as_bytes(), &Head::default(), mask) {
                Message::Call(c) => c.digest,
                other => panic!("{other:?}"),
            };
        let (a, b) = ("2026-11-26T10:00:00Z", "2026-11-26T10:05:00Z");
        assert_ne!(digest(a, Classes::NONE), digest(b, Classes::NONE));
        assert_eq!(
            digest(a, Classes::defaults()),
            digest(b, Classes::defaults())
        );
    }
}
