//! Any bytes as an MCP POST body, with any mirrored headers (`Mcp-Method`,
//! `Mcp-Name`, `Mcp-Session-Id`, `MCP-Protocol-Version`, present or not,
//! any bytes): `request::mcp::read` never panics; the same body reads the
//! same way twice; the headers can only turn a call into `HeadersDisagree`,
//! never change what it is; a call's `id` is one JSON string or number, the
//! one the body holds (and its tool the body's), and echoes back into a
//! JSON-RPC reply that parses; and the same JSON written again (members in
//! another order, other whitespace, every string and number as written)
//! reads as the same message: the same call, digest and id.
#![no_main]
use libfuzzer_sys::fuzz_target;
use loopguard_core::config::Classes;
use loopguard_core::request::mcp::{self, Head, Message, Unjudged, MAX_ID_BYTES};
use loopguard_core::request::RequestFacts;
use serde_json::value::RawValue;
use serde_json::Value;

const HEADERS: [&str; 4] = [
    "mcp-method",
    "mcp-name",
    "mcp-session-id",
    "mcp-protocol-version",
];

struct Facts<'a> {
    headers: Vec<(&'static str, &'a [u8])>,
}

impl RequestFacts for Facts<'_> {
    fn header(&self, name: &str) -> Option<Vec<u8>> {
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_vec())
    }
    fn source_address(&self) -> Option<String> {
        None
    }
    fn verified_claim(&self, _payload_key: &str, _claim: &str) -> Option<Vec<u8>> {
        None
    }
    fn route_name(&self) -> Option<String> {
        None
    }
    fn route_policy(&self) -> Option<String> {
        None
    }
}

/// The same JSON written again: every object's members in reverse order,
/// whitespace as `spaced` says, every string and number byte for byte as
/// the body writes it (the canonical arguments keep their spelling: only
/// key order and whitespace are the same call). `dup` is set when an object
/// has a key twice (as written, or once unescaped), which makes member
/// order matter.
fn rewrite(b: &[u8], i: &mut usize, out: &mut Vec<u8>, spaced: bool, dup: &mut bool) {
    let ws = |b: &[u8], i: &mut usize| {
        while b
            .get(*i)
            .is_some_and(|c| matches!(c, b' ' | b'\t' | b'\n' | b'\r'))
        {
            *i += 1;
        }
    };
    let sep: &[u8] = if spaced { b" \n\t" } else { b"" };
    ws(b, i);
    match b.get(*i) {
        Some(b'{') => {
            *i += 1;
            let mut members: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            loop {
                ws(b, i);
                if b.get(*i) == Some(&b'}') {
                    *i += 1;
                    break;
                }
                let mut key = Vec::new();
                string(b, i, &mut key);
                ws(b, i);
                *i += 1; // ':'
                let mut value = Vec::new();
                rewrite(b, i, &mut value, spaced, dup);
                // Written the same, or the same once unescaped.
                let name = serde_json::from_slice::<String>(&key).ok();
                *dup |= members
                    .iter()
                    .any(|(k, _)| *k == key || serde_json::from_slice::<String>(k).ok() == name);
                members.push((key, value));
                ws(b, i);
                if b.get(*i) == Some(&b',') {
                    *i += 1;
                }
            }
            out.push(b'{');
            for (n, (k, v)) in members.iter().rev().enumerate() {
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(sep);
                out.extend_from_slice(k);
                out.extend_from_slice(sep);
                out.push(b':');
                out.extend_from_slice(sep);
                out.extend_from_slice(v);
            }
            out.extend_from_slice(sep);
            out.push(b'}');
        }
        Some(b'[') => {
            *i += 1;
            out.push(b'[');
            let mut n = 0;
            loop {
                ws(b, i);
                if b.get(*i) == Some(&b']') {
                    *i += 1;
                    break;
                }
                if n > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(sep);
                rewrite(b, i, out, spaced, dup);
                n += 1;
                ws(b, i);
                if b.get(*i) == Some(&b',') {
                    *i += 1;
                }
            }
            out.extend_from_slice(sep);
            out.push(b']');
        }
        Some(b'"') => string(b, i, out),
        Some(_) => {
            while b
                .get(*i)
                .is_some_and(|c| !matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                out.push(b[*i]);
                *i += 1;
            }
        }
        None => {}
    }
}

/// A string, byte for byte.
fn string(b: &[u8], i: &mut usize, out: &mut Vec<u8>) {
    out.push(b'"');
    *i += 1;
    while let Some(&c) = b.get(*i) {
        *i += 1;
        out.push(c);
        if c == b'\\' {
            if let Some(&e) = b.get(*i) {
                out.push(e);
                *i += 1;
            }
        } else if c == b'"' {
            break;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // Byte 0: which headers are present (bits 0-3), the mask (bits 4-5),
    // whether the body is written around pieces (bits 6-7); then the
    // present headers' values and the body (or its pieces), separated by
    // 0xff.
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let mask = match (sel >> 4) & 3 {
        0 => Classes::NONE,
        1 => Classes::defaults(),
        _ => Classes::all(),
    };
    let mut parts = rest.split(|&b| b == 0xff);
    let mut headers = Vec::new();
    for (i, name) in HEADERS.iter().enumerate() {
        if sel & (1 << i) != 0 {
            headers.push((*name, parts.next().unwrap_or_default()));
        }
    }
    let body: Vec<u8> = if sel & 0x40 != 0 {
        // A call written around the pieces, to reach the reading of calls:
        // the id as written, the tool name in quotes, the arguments and
        // `_meta` as written (and the method, in quotes, with bit 7).
        let mut piece = || String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let (id, name, args, meta) = (piece(), piece(), piece(), piece());
        let method = if sel & 0x80 != 0 {
            piece()
        } else {
            "tools/call".to_string()
        };
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{{"name":"{name}","arguments":{args},"_meta":{meta}}}}}"#
        )
        .into_bytes()
    } else {
        // The body is the rest (0xff is never in UTF-8 JSON: nothing is lost).
        parts.collect::<Vec<_>>().join(&0xff)
    };
    let head = Head::read(&Facts { headers });
    let none = Head {
        session: head.session.clone(),
        protocol: head.protocol.clone(),
        ..Head::default()
    };

    let msg = mcp::read(&body, &head, mask);
    assert_eq!(
        mcp::read(&body, &head, mask),
        msg,
        "the same body read twice"
    );

    // Headers only ever refuse a call; without them it is the same call.
    let bare = mcp::read(&body, &none, mask);
    match &msg {
        Message::Unjudged(Unjudged::HeadersDisagree) => {
            assert!(head.method.is_some() || head.name.is_some());
            assert!(bare != Message::Unjudged(Unjudged::HeadersDisagree));
        }
        other => assert_eq!(&bare, other, "headers that agree change nothing"),
    }

    // The body as a JSON parser reads it, and the same JSON written again
    // (members in reverse order, other whitespace). With a key twice in an
    // object, a parser keeps the last and loopguard reads the first: the
    // comparisons with the parser leave such bodies out (reported).
    let parsed = serde_json::from_slice::<Value>(&body).ok();
    let mut dup = false;
    let forms: Vec<Vec<u8>> = match &parsed {
        None => Vec::new(),
        Some(_) => [false, true]
            .into_iter()
            .map(|spaced| {
                let mut again = Vec::new();
                rewrite(&body, &mut 0, &mut again, spaced, &mut dup);
                again
            })
            .collect(),
    };
    let parsed = parsed.filter(|_| !dup);

    if let Message::Call(call) = &msg {
        if let Some(n) = &head.name {
            assert_eq!(n, &call.tool);
        }
        // The id is one JSON string or number, as the body writes it.
        assert!(call.id.len() <= MAX_ID_BYTES);
        let raw: &RawValue = serde_json::from_str(&call.id).expect("the id is JSON");
        assert_eq!(raw.get(), call.id);
        let first = call.id.as_bytes()[0];
        assert!(
            first == b'"' || first == b'-' || first.is_ascii_digit(),
            "id {}",
            call.id
        );
        // Echoed into a reply (as a blocked call's answer is), it parses,
        // and it is the body's id; the tool is the body's.
        let reply = format!(
            r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[],"isError":true}}}}"#,
            call.id
        );
        // (JSON as written: a number past f64's range, 1e400, is JSON that
        // serde_json's Value refuses.)
        serde_json::from_str::<&RawValue>(&reply).expect("the echoed reply is JSON");
        if let Ok(id) = serde_json::from_str::<Value>(&call.id) {
            let reply: Value = serde_json::from_str(&reply).expect("the echoed reply parses");
            assert!(id.is_string() || id.is_number());
            assert_eq!(reply["id"], id);
            if let Some(v) = &parsed {
                assert_eq!(v["id"], id, "the id is the body's");
                assert_eq!(
                    v["params"]["name"].as_str(),
                    Some(call.tool.as_str()),
                    "the tool is the body's"
                );
            }
        }
    }

    // Written again, the same message: the same call (tool, digest, id).
    if parsed.is_some() {
        for again in forms {
            let m = mcp::read(&again, &head, mask);
            assert_eq!(m, msg, "{}", String::from_utf8_lossy(&again));
        }
    }
});
