//! Tests of reading tap traces: made-up traces, and real ones Envoy wrote (tests/data/tap).

use super::*;
use crate::replay::input::time;
use crate::replay::record::{Recorded, Usage};
use loopguard_core::request::RequestFacts;
use serde_json::json;

fn b64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n =
            chunk.iter().fold(0u32, |acc, &b| (acc << 8) | u32::from(b)) << (8 * (3 - chunk.len()));
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ABC[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// What the tests below compare of an answer (the body is checked where
/// it matters).
#[derive(Debug, PartialEq, Eq)]
struct StatusUsage {
    status: Option<u16>,
    usage: Option<Usage>,
}

fn status_usage(r: &Recorded) -> Option<StatusUsage> {
    r.response.as_ref().map(|a| StatusUsage {
        status: a.status,
        usage: a.usage,
    })
}

fn hv(k: &str, v: &str) -> Value {
    json!({"key": k, "value": v, "raw_value": ""})
}

fn one(place: &str, doc: &Value) -> Entry {
    let mut got = read(place, doc.to_string().as_bytes());
    assert_eq!(got.len(), 1, "{got:?}");
    got.remove(0)
}

const CHAT: &str = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"Grüße, 世界"}]}"#;
const USAGE: &str = r#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":3}}"#;

fn trace(request_body: Value, response_body: Value) -> Value {
    json!({"http_buffered_trace": {
        "request": {
            "headers": [hv(":authority", "gw.example"), hv(":path", "/v1/chat/completions?x=1"),
                        hv(":method", "POST"), hv(":scheme", "https"),
                        hv("Authorization", "Bearer sk-1"), hv("content-type", "application/json")],
            "body": request_body,
            "trailers": [],
            "headers_received_time": "2026-11-25T18:40:30.096012Z"
        },
        "response": {
            "headers": [hv(":status", "200"), hv("content-type", "application/json")],
            "body": response_body,
            "trailers": [],
            "headers_received_time": "2026-11-25T18:40:30.097671Z"
        },
        "downstream_connection": {
            "local_address": {"socket_address": {"address": "127.0.0.1", "port_value": 10000}},
            "remote_address": {"socket_address": {"address": "10.1.2.3", "port_value": 42654}}
        }
    }})
}

fn check_chat(r: &Recorded) {
    assert_eq!(r.at_ms, 1_795_632_030_096);
    assert_eq!(r.request.method, "POST");
    assert_eq!(r.request.path, "/v1/chat/completions?x=1");
    assert_eq!(r.request.authority, "gw.example");
    assert_eq!(
        r.request.headers,
        vec![
            ("authorization".to_string(), b"Bearer sk-1".to_vec()),
            ("content-type".to_string(), b"application/json".to_vec()),
        ]
    );
    assert_eq!(r.request.body, CHAT.as_bytes());
    assert_eq!(r.request.source_address.as_deref(), Some("10.1.2.3:42654"));
    assert_eq!(
        status_usage(r),
        Some(StatusUsage {
            status: Some(200),
            usage: Some(Usage {
                input: 12,
                output: 3,
                ..Usage::default()
            })
        })
    );
}

#[test]
fn buffered_trace_with_bodies_as_bytes() {
    let doc = trace(
        json!({"as_bytes": b64(CHAT.as_bytes()), "truncated": false}),
        json!({"as_bytes": b64(USAGE.as_bytes()), "truncated": false}),
    );
    let r = one("trace_1.json", &doc).unwrap();
    check_chat(&r);
    assert_eq!(r.place, "trace_1.json");
    assert!(r.request.notes.is_empty(), "{:?}", r.request.notes);
}

#[test]
fn buffered_trace_with_bodies_as_string() {
    let doc = trace(json!({"as_string": CHAT}), json!({"as_string": USAGE}));
    let r = one("trace_2.json", &doc).unwrap();
    check_chat(&r);
    assert!(r.request.notes[0].contains("JSON_BODY_AS_BYTES"));
}

#[test]
fn proto3_camel_case_names_are_read_too() {
    let doc = json!({"httpBufferedTrace": {"request": {
        "headers": [{"key": ":method", "value": "GET"}, {"key": ":path", "value": "/v1/models"},
                    {"key": "host", "value": "h.example"}, {"key": "x-bin", "rawValue": b64(b"a\xffb")}],
        "headersReceivedTime": "2026-11-25T18:40:30Z"}}});
    let r = one("t.json", &doc).unwrap();
    assert_eq!(
        (r.request.method.as_str(), r.request.path.as_str()),
        ("GET", "/v1/models")
    );
    assert_eq!(
        r.request.authority, "h.example",
        "host stands in for a missing :authority"
    );
    assert_eq!(r.request.header("x-bin"), Some(b"a\xffb".to_vec()));
    assert!(r.request.body.is_empty());
    assert_eq!(r.response, None);
    assert_eq!(r.at_ms, 1_795_632_030_000);
}

#[test]
fn a_truncated_request_body_is_skipped_with_advice() {
    let doc = trace(
        json!({"as_bytes": b64(&CHAT.as_bytes()[..16]), "truncated": true}),
        json!({"as_bytes": b64(USAGE.as_bytes())}),
    );
    let s = one("trace_3.json", &doc).unwrap_err();
    assert_eq!(s.place, "trace_3.json");
    assert!(
        s.reason.starts_with(
            "http_buffered_trace.request.body.truncated: Envoy kept only the first 16 bytes"
        ),
        "{}",
        s.reason
    );
    assert!(s.reason.contains("max_buffered_rx_bytes"));
}

#[test]
fn a_truncated_response_body_keeps_the_request_without_usage() {
    let doc = trace(
        json!({"as_bytes": b64(CHAT.as_bytes())}),
        json!({"as_bytes": b64(&USAGE.as_bytes()[..10]), "truncated": true}),
    );
    let r = one("t.json", &doc).unwrap();
    assert_eq!(
        status_usage(&r),
        Some(StatusUsage {
            status: Some(200),
            usage: None
        })
    );
    assert!(r
        .request
        .notes
        .iter()
        .any(|n| n.contains("max_buffered_tx_bytes")));
}

#[test]
fn time_from_the_header_when_the_trace_has_none_and_advice_when_neither() {
    let mut doc = trace(json!({"as_bytes": b64(CHAT.as_bytes())}), json!({}));
    let req = &mut doc["http_buffered_trace"]["request"];
    req.as_object_mut().unwrap().remove("headers_received_time");
    req["headers"]
        .as_array_mut()
        .unwrap()
        .push(hv("x-loopguard-received-at", "1795632030123"));
    let r = one("t.json", &doc).unwrap();
    assert_eq!(r.at_ms, 1_795_632_030_123);
    assert_eq!(
        r.request.header(RECEIVED_AT_HEADER),
        None,
        "capture metadata is not a request header"
    );
    // A response without a body: the status, no usage.
    assert_eq!(
        status_usage(&r),
        Some(StatusUsage {
            status: Some(200),
            usage: None
        })
    );

    doc["http_buffered_trace"]["request"]["headers"][6] =
        hv("x-loopguard-received-at", "yesterday");
    let s = one("t.json", &doc).unwrap_err();
    assert!(
        s.reason
            .contains("x-loopguard-received-at: \"yesterday\" is not milliseconds"),
        "{}",
        s.reason
    );

    doc["http_buffered_trace"]["request"]["headers"]
        .as_array_mut()
        .unwrap()
        .pop();
    let s = one("t.json", &doc).unwrap_err();
    assert!(
        s.reason
            .starts_with("http_buffered_trace.request: no time recorded"),
        "{}",
        s.reason
    );
    assert!(s.reason.contains("record_headers_received_time: true"));
}

#[test]
fn broken_traces_name_the_field() {
    let reason = |doc: Value| one("trace.json", &doc).unwrap_err().reason;
    let mut doc = trace(json!({"as_bytes": b64(CHAT.as_bytes())}), json!({}));
    doc["http_buffered_trace"]["request"]["headers"][2]["value"] = json!(7);
    assert_eq!(
        reason(doc.clone()),
        "http_buffered_trace.request.headers[2]: value is not a string"
    );
    doc["http_buffered_trace"]["request"]["headers"][2] = json!({"value": "POST"});
    assert_eq!(
        reason(doc.clone()),
        "http_buffered_trace.request.headers[2]: key is missing"
    );
    doc["http_buffered_trace"]["request"]["headers"][2] = hv(":method", "POST");
    doc["http_buffered_trace"]["request"]["body"] = json!({"as_bytes": "***"});
    assert!(
        reason(doc.clone()).starts_with("http_buffered_trace.request.body.as_bytes: not base64")
    );
    doc["http_buffered_trace"]["request"]["body"] = json!({"as_bytes": "", "truncated": "no"});
    assert!(reason(doc.clone())
        .starts_with("http_buffered_trace.request.body.truncated: not true or false"));
    doc["http_buffered_trace"]["request"]["body"] = json!({});
    doc["http_buffered_trace"]["request"]["headers_received_time"] = json!("noon");
    assert!(reason(doc.clone()).starts_with(
        "http_buffered_trace.request.headers_received_time: \"noon\" is not an RFC 3339 time"
    ));
    doc["http_buffered_trace"]["request"]["headers_received_time"] = json!("2026-11-25T18:40:30Z");
    doc["http_buffered_trace"]["response"]["headers"][0] = hv(":status", "OK");
    assert_eq!(
        reason(doc.clone()),
        "http_buffered_trace.response.headers: :status \"OK\" is not a number"
    );
    doc["http_buffered_trace"]["request"]["headers"]
        .as_array_mut()
        .unwrap()
        .remove(1);
    assert_eq!(
        reason(doc.clone()),
        "http_buffered_trace.request.headers: no :path"
    );
    assert_eq!(
        reason(json!({"http_buffered_trace": {}})),
        "http_buffered_trace.request is missing"
    );
    assert!(reason(json!({"socket_buffered_trace": {}})).contains("not an HTTP one"));
    assert!(reason(json!({"log": {"entries": []}})).starts_with("not an Envoy HTTP tap trace"));

    let whole = |bytes: &[u8]| {
        read("trace.json", bytes)[0]
            .as_ref()
            .unwrap_err()
            .reason
            .clone()
    };
    assert!(whole(b"{\"http_buffered_trace\": {\"request\": ").starts_with("not JSON"));
    assert!(whole(b"http_buffered_trace {}").starts_with("not JSON"));
    assert!(whole(b"  \n").starts_with("empty"));
}

#[test]
fn streamed_segments_are_assembled() {
    let seg = |piece: Value| json!({"http_streamed_trace_segment": piece});
    let mut file = String::new();
    for s in [
        seg(json!({"trace_id": "7", "request_headers": {"headers": [
            hv(":authority", "gw"), hv(":path", "/v1/chat/completions"), hv(":method", "POST"),
            hv("x-loopguard-received-at", "1795632030123")]}})),
        seg(
            json!({"trace_id": "7", "request_body_chunk": {"as_bytes": b64(&CHAT.as_bytes()[..9])}}),
        ),
        seg(
            json!({"trace_id": "7", "request_body_chunk": {"as_bytes": b64(&CHAT.as_bytes()[9..])}}),
        ),
        seg(json!({"trace_id": "7", "response_headers": {"headers": [hv(":status", "429")]}})),
        seg(json!({"trace_id": "7", "response_body_chunk": {"as_string": USAGE}})),
    ] {
        file.push_str(&serde_json::to_string_pretty(&s).unwrap());
        file.push('\n');
    }
    let got = read("trace_7.json", file.as_bytes());
    assert_eq!(got.len(), 1);
    let r = got[0].as_ref().unwrap();
    assert_eq!(r.at_ms, 1_795_632_030_123);
    assert_eq!(r.request.body, CHAT.as_bytes());
    assert_eq!(r.place, "trace_7.json");
    assert_eq!(
        status_usage(r),
        Some(StatusUsage {
            status: Some(429),
            usage: Some(Usage {
                input: 12,
                output: 3,
                ..Usage::default()
            })
        })
    );

    // Without the header a streamed trace has no time.
    let no_time = file.replace("x-loopguard-received-at", "x-other");
    let s = read("trace_7.json", no_time.as_bytes())[0]
        .clone()
        .unwrap_err();
    assert!(
        s.reason
            .starts_with("http_streamed_trace_segment.request: no time recorded"),
        "{}",
        s.reason
    );
    // A broken segment is named by its place in the file.
    let broken = file.replace("\"429\"", "429");
    let s = read("trace_7.json", broken.as_bytes())[0]
        .clone()
        .unwrap_err();
    assert_eq!(s.reason, "segments[3].http_streamed_trace_segment.response_headers.headers[0]: value is not a string");
}

#[test]
fn several_traces_in_one_file_are_numbered() {
    let a = trace(json!({"as_string": CHAT}), json!({}));
    let text = format!("{a}\n{{\"nope\": 1}}\n{a}\n");
    let got = read("all.json", text.as_bytes());
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].as_ref().unwrap().place, "all.json trace 1");
    assert_eq!(got[1].as_ref().unwrap_err().place, "all.json trace 2");
    assert_eq!(got[2].as_ref().unwrap().place, "all.json trace 3");
}

// Traces Envoy 1.40 wrote (examples/tap's filter; the request a curl
// POST of CHAT-like JSON with non-ASCII text).

const REAL_CHAT: &str = r#"{"model":"m","messages":[{"role":"user","content":"Grüße, 世界"}]}"#;

#[test]
fn a_real_buffered_trace_with_bodies_as_bytes() {
    let bytes = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tap/buffered_bytes.json"
    ));
    let got = read("buffered_bytes.json", bytes);
    let r = got[0].as_ref().unwrap();
    assert_eq!(r.at_ms, time::rfc3339("2026-11-25T18:40:30.096Z").unwrap());
    assert_eq!(r.request.method, "POST");
    assert_eq!(r.request.path, "/v1/chat/completions");
    assert_eq!(r.request.authority, "localhost:19000");
    assert_eq!(r.request.body, REAL_CHAT.as_bytes());
    assert_eq!(
        r.request.header("authorization"),
        Some(b"Bearer sk-test".to_vec())
    );
    assert_eq!(r.request.header("content-length"), Some(b"70".to_vec()));
    assert_eq!(r.request.source_address.as_deref(), Some("127.0.0.1:42654"));
    assert_eq!(
        status_usage(r),
        Some(StatusUsage {
            status: Some(200),
            usage: Some(Usage {
                input: 3,
                output: 4,
                ..Usage::default()
            })
        })
    );
    assert!(r.request.notes.is_empty());
}

#[test]
fn a_real_streamed_trace_timed_by_header_mutation() {
    let bytes = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tap/streamed_with_header.json"
    ));
    let got = read("streamed_with_header.json", bytes);
    assert_eq!(got.len(), 1);
    let r = got[0].as_ref().unwrap();
    assert!(r.at_ms > 1_700_000_000_000, "{}", r.at_ms);
    assert_eq!(r.request.body, REAL_CHAT.as_bytes());
    assert_eq!(
        r.response.as_ref().unwrap().usage,
        Some(Usage {
            input: 3,
            output: 4,
            ..Usage::default()
        })
    );
}

#[test]
fn a_real_truncated_trace_with_bodies_as_string() {
    let bytes = include_bytes!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tap/string_truncated.json"
    ));
    let s = read("string_truncated.json", bytes)[0].clone().unwrap_err();
    assert!(
        s.reason.starts_with(
            "http_buffered_trace.request.body.truncated: Envoy kept only the first 16 bytes"
        ),
        "{}",
        s.reason
    );
}

#[test]
fn an_mcp_result_keeps_its_content_type_and_body() {
    let result = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[],\"isError\":false}}\n\n";
    let mut doc = trace(
        json!({"as_bytes": b64(b"{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":\"search\"}}")}),
        json!({"as_bytes": b64(result.as_bytes())}),
    );
    doc["http_buffered_trace"]["response"]["headers"][1] = hv("content-type", "text/event-stream");
    let r = one("t.json", &doc).unwrap();
    let a = r.response.unwrap();
    assert_eq!(a.content_type.as_deref(), Some("text/event-stream"));
    assert_eq!(a.body.as_deref(), Some(result.as_bytes()));
    assert!(!a.body_cut && !a.by_loopguard);
    // Cut by the tap; answered by loopguard (its header).
    doc["http_buffered_trace"]["response"]["body"] =
        json!({"as_bytes": b64(&result.as_bytes()[..12]), "truncated": true});
    doc["http_buffered_trace"]["response"]["headers"]
        .as_array_mut()
        .unwrap()
        .push(hv(
            "X-Loopguard-Mcp-Loop",
            "tier=identical; tool=search; count=4; step=block",
        ));
    let a = one("t.json", &doc).unwrap().response.unwrap();
    assert_eq!(a.body.as_deref(), Some(&result.as_bytes()[..12]));
    assert!(a.body_cut && a.by_loopguard);
}
