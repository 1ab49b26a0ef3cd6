//! Envoy tap traces: the files Envoy's own `envoy.filters.http.tap` filter
//! writes with a `file_per_tap` sink in a JSON format (`JSON_BODY_AS_BYTES`
//! or `JSON_BODY_AS_STRING`), one file per request (see examples/tap).
//!
//! A buffered trace (the default) is one JSON document:
//!
//! ```json
//! {"http_buffered_trace": {
//!   "request": {"headers": [{"key": ":method", "value": "POST", "raw_value": ""}, ...],
//!               "body": {"as_bytes": "eyJtb2RlbCI6...", "truncated": false},
//!               "trailers": [], "headers_received_time": "2026-11-25T18:40:30.096012Z"},
//!   "response": {"headers": [{"key": ":status", "value": "200"}, ...], "body": {...}},
//!   "downstream_connection": {"remote_address": {"socket_address": {"address": "10.0.0.7", "port_value": 42654}}}}}
//! ```
//!
//! `headers_received_time` is there when the filter sets
//! `record_headers_received_time: true`, and `downstream_connection` with
//! `record_downstream_connection: true`. A streamed trace
//! (`output_config.streaming: true`) is a sequence of
//! `{"http_streamed_trace_segment": {...}}` documents in the one file,
//! which record no time: its requests need the `x-loopguard-received-at`
//! header (milliseconds since the epoch, e.g. set by Envoy's
//! header_mutation filter to `%START_TIME(%s%3f)%` before the tap), which
//! buffered traces may use too when they lack `headers_received_time`.
//! Field names are read as Envoy writes them (`as_bytes`) or in proto3
//! JSON's lowerCamelCase (`asBytes`), as other protobuf tools write them.

use super::{base64, time};
use crate::replay::record::{Answer, Entry, Recorded, Skipped, Usage};
use crate::request_file::RequestFile;
use serde_json::Value;

/// The request header that may carry when Envoy received the request, in
/// milliseconds since the Unix epoch; it is capture metadata, so it is not
/// kept among the request's headers.
pub const RECEIVED_AT_HEADER: &str = "x-loopguard-received-at";

const TIME_ADVICE: &str = "set record_headers_received_time: true on the tap filter, or have Envoy add the header x-loopguard-received-at: %START_TIME(%s%3f)% before the tap (header_mutation filter); see examples/tap/README.md";

/// The requests in one tap file: usually one (Envoy writes a file per
/// request); a file holding several traces names each `FILE trace N`. A
/// file that is not a usable trace is one skipped entry naming the file.
pub fn read(place: &str, bytes: &[u8]) -> Vec<Entry> {
    let whole = |reason: String| {
        vec![Err(Skipped {
            place: place.to_string(),
            reason,
        })]
    };
    let mut docs = Vec::new();
    for doc in serde_json::Deserializer::from_slice(bytes).into_iter::<Value>() {
        match doc {
            Ok(v) => docs.push(v),
            Err(e) => {
                return whole(format!(
                    "not JSON ({e}): is it a trace Envoy was still writing, or one in a PROTO_* format? Write traces with format JSON_BODY_AS_BYTES"
                ))
            }
        }
    }
    if docs.is_empty() {
        return whole(
            "empty: the file holds no trace (Envoy writes a buffered trace when its request ends)"
                .to_string(),
        );
    }
    let mut units: Vec<Unit> = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        if let Some(trace) = field(doc, "http_buffered_trace") {
            units.push(Unit::Buffered(trace));
        } else if let Some(segment) = field(doc, "http_streamed_trace_segment") {
            let id = match field(segment, "trace_id") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            let known = units.iter_mut().find_map(|u| match u {
                Unit::Streamed(have, segments) if *have == id => Some(segments),
                _ => None,
            });
            match known {
                Some(segments) => segments.push((i, segment)),
                None => units.push(Unit::Streamed(id, vec![(i, segment)])),
            }
        } else if field(doc, "socket_buffered_trace").is_some()
            || field(doc, "socket_streamed_trace_segment").is_some()
        {
            units.push(Unit::Bad(
                "a transport socket tap trace, not an HTTP one: capture with the HTTP filter envoy.filters.http.tap".to_string(),
            ));
        } else {
            units.push(Unit::Bad(
                "not an Envoy HTTP tap trace: expected http_buffered_trace (or http_streamed_trace_segment) at the top".to_string(),
            ));
        }
    }
    let several = units.len() > 1;
    units
        .into_iter()
        .enumerate()
        .map(|(n, unit)| {
            let place = if several {
                format!("{place} trace {}", n + 1)
            } else {
                place.to_string()
            };
            let got = match unit {
                Unit::Buffered(trace) => buffered(&place, trace),
                Unit::Streamed(_, segments) => streamed(&place, &segments),
                Unit::Bad(reason) => Err(reason),
            };
            got.map_err(|reason| Skipped { place, reason })
        })
        .collect()
}

/// One trace of a file.
enum Unit<'a> {
    Buffered(&'a Value),
    /// A trace id and its segments (with their index among the file's
    /// documents).
    Streamed(String, Vec<(usize, &'a Value)>),
    Bad(String),
}

/// A request or response as the trace recorded it.
#[derive(Default)]
struct Message {
    headers: Vec<(String, Vec<u8>)>,
    body: Body,
}

#[derive(Default)]
struct Body {
    bytes: Vec<u8>,
    truncated: bool,
    /// Read from `as_string` (JSON_BODY_AS_STRING), where Envoy writes
    /// bytes that are not UTF-8 as spaces.
    as_string: bool,
}

impl Body {
    fn append(&mut self, more: Body) {
        self.bytes.extend(more.bytes);
        self.truncated |= more.truncated;
        self.as_string |= more.as_string;
    }
}

fn buffered(place: &str, trace: &Value) -> Result<Recorded, String> {
    let at = "http_buffered_trace";
    if !trace.is_object() {
        return Err(format!("{at}: not an object"));
    }
    let req = field(trace, "request").ok_or_else(|| format!("{at}.request is missing"))?;
    let request = message(req, &format!("{at}.request"))?;
    let received = match field(req, "headers_received_time") {
        Some(Value::String(s)) => {
            Some(time::rfc3339(s).map_err(|e| format!("{at}.request.headers_received_time: {e}"))?)
        }
        Some(other) => {
            return Err(format!(
                "{at}.request.headers_received_time: not RFC 3339 text (got {other})"
            ))
        }
        None => None,
    };
    let response = match field(trace, "response") {
        Some(resp) => Some(message(resp, &format!("{at}.response"))?),
        None => None,
    };
    let source = field(trace, "downstream_connection")
        .and_then(|c| field(c, "remote_address"))
        .and_then(socket_address);
    recorded(
        place,
        &format!("{at}.request"),
        request,
        received,
        response,
        source,
        &format!("{at}.response"),
    )
}

fn streamed(place: &str, segments: &[(usize, &Value)]) -> Result<Recorded, String> {
    let (mut request_headers, mut response_headers) = (None, None);
    let (mut request_body, mut response_body) = (Body::default(), Body::default());
    for &(i, seg) in segments {
        let at = format!("segments[{i}].http_streamed_trace_segment");
        if let Some(h) = field(seg, "request_headers") {
            let list = field(h, "headers").unwrap_or(&Value::Null);
            let parsed = headers(list, &format!("{at}.request_headers.headers"))?;
            request_headers.get_or_insert(parsed);
        }
        if let Some(b) = field(seg, "request_body_chunk") {
            request_body.append(body(b, &format!("{at}.request_body_chunk"))?);
        }
        if let Some(h) = field(seg, "response_headers") {
            let list = field(h, "headers").unwrap_or(&Value::Null);
            let parsed = headers(list, &format!("{at}.response_headers.headers"))?;
            response_headers.get_or_insert(parsed);
        }
        if let Some(b) = field(seg, "response_body_chunk") {
            response_body.append(body(b, &format!("{at}.response_body_chunk"))?);
        }
    }
    let at = "http_streamed_trace_segment";
    let Some(headers) = request_headers else {
        return Err(format!(
            "{at}: no request_headers segment (an incomplete trace?)"
        ));
    };
    let request = Message {
        headers,
        body: request_body,
    };
    let response = response_headers.map(|headers| Message {
        headers,
        body: response_body,
    });
    recorded(
        place,
        &format!("{at}.request"),
        request,
        None,
        response,
        None,
        &format!("{at}.response"),
    )
}

/// The entry of a trace's request and response.
fn recorded(
    place: &str,
    at: &str,
    request: Message,
    received: Option<u64>,
    response: Option<Message>,
    source_address: Option<String>,
    response_at: &str,
) -> Result<Recorded, String> {
    if request.body.truncated {
        return Err(format!(
            "{at}.body.truncated: Envoy kept only the first {} bytes of the request body, which would fingerprint differently; raise the tap's output_config.max_buffered_rx_bytes (default 1 KiB) above the largest request body",
            request.body.bytes.len()
        ));
    }
    let mut r = RequestFile {
        source_address,
        ..RequestFile::default()
    };
    let mut header_time = None;
    let mut host = None;
    for (name, value) in request.headers {
        match name.as_str() {
            ":method" => r.method = lossy(&value).to_ascii_uppercase(),
            ":path" => r.path = lossy(&value),
            ":authority" => r.authority = lossy(&value),
            n if n.starts_with(':') => {}
            RECEIVED_AT_HEADER => header_time = Some(value),
            _ => {
                if name == "host" {
                    host.get_or_insert_with(|| lossy(&value));
                }
                r.headers.push((name, value));
            }
        }
    }
    if r.method.is_empty() {
        return Err(format!("{at}.headers: no :method"));
    }
    if r.path.is_empty() {
        return Err(format!("{at}.headers: no :path"));
    }
    if r.authority.is_empty() {
        r.authority = host.unwrap_or_default();
    }
    let at_ms = match (received, header_time) {
        (Some(ms), _) => ms,
        (None, Some(v)) => {
            let text = lossy(&v);
            text.trim().parse::<u64>().map_err(|_| {
                format!("{at}.headers: {RECEIVED_AT_HEADER}: {text:?} is not milliseconds since the Unix epoch (Envoy's %START_TIME(%s%3f)%)")
            })?
        }
        (None, None) => {
            return Err(format!(
                "{at}: no time recorded (no headers_received_time, no {RECEIVED_AT_HEADER} header): {TIME_ADVICE}"
            ))
        }
    };
    if request.body.as_string && !request.body.bytes.is_empty() {
        r.notes.push(
            "the body was read from as_string (JSON_BODY_AS_STRING), where Envoy writes bytes that are not UTF-8 as spaces; capture with JSON_BODY_AS_BYTES for the exact bytes".to_string(),
        );
    }
    r.body = request.body.bytes;
    let response = match response {
        None => None,
        Some(m) => answer(m, response_at, &mut r.notes)?,
    };
    Ok(Recorded {
        at_ms,
        request: r,
        response,
        place: place.to_string(),
    })
}

/// What the provider answered; `None` if the trace has no response
/// headers (the request got no answer while it was tapped).
fn answer(m: Message, at: &str, notes: &mut Vec<String>) -> Result<Option<Answer>, String> {
    if m.headers.is_empty() {
        return Ok(None);
    }
    let mut status = None;
    let mut encoding = None;
    for (name, value) in &m.headers {
        match name.as_str() {
            ":status" => {
                let text = lossy(value);
                status = Some(
                    text.trim()
                        .parse::<u16>()
                        .map_err(|_| format!("{at}.headers: :status {text:?} is not a number"))?,
                );
            }
            "content-encoding" => encoding = Some(lossy(value)),
            _ => {}
        }
    }
    let usage = if m.body.truncated {
        notes.push(format!("{at}.body.truncated: the provider's token usage was not read; raise the tap's output_config.max_buffered_tx_bytes above the largest response body"));
        None
    } else {
        match encoding {
            Some(e) if !e.eq_ignore_ascii_case("identity") => {
                if !m.body.bytes.is_empty() {
                    notes.push(format!(
                        "the response body is {e}-encoded: the provider's token usage was not read"
                    ));
                }
                None
            }
            _ => Usage::in_body(&m.body.bytes),
        }
    };
    Ok(Some(Answer { status, usage }))
}

/// A HttpBufferedTrace.Message: headers (names lower-cased, in order) and
/// body.
fn message(v: &Value, at: &str) -> Result<Message, String> {
    if !v.is_object() {
        return Err(format!("{at}: not an object"));
    }
    let headers = match field(v, "headers") {
        Some(list) => headers(list, &format!("{at}.headers"))?,
        None => Vec::new(),
    };
    let body = match field(v, "body") {
        Some(b) => body(b, &format!("{at}.body"))?,
        None => Body::default(),
    };
    Ok(Message { headers, body })
}

/// A list of HeaderValue: `key`, and `value` (text) or `raw_value`
/// (base64 bytes).
fn headers(list: &Value, at: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let items = match list {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => return Err(format!("{at}: not a list (got {other})")),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, h) in items.iter().enumerate() {
        if !h.is_object() {
            return Err(format!("{at}[{i}]: not an object with key and value"));
        }
        let key = match field(h, "key") {
            Some(Value::String(k)) if !k.is_empty() => k.to_ascii_lowercase(),
            Some(Value::String(_)) | None => return Err(format!("{at}[{i}]: key is missing")),
            Some(_) => return Err(format!("{at}[{i}]: key is not a string")),
        };
        let value = match field(h, "value") {
            Some(Value::String(s)) => s.as_bytes().to_vec(),
            None => Vec::new(),
            Some(_) => return Err(format!("{at}[{i}]: value is not a string")),
        };
        let value = match field(h, "raw_value") {
            Some(Value::String(raw)) if value.is_empty() && !raw.is_empty() => {
                base64::decode(raw).map_err(|e| format!("{at}[{i}]: raw_value: {e}"))?
            }
            Some(Value::String(_)) | None => value,
            Some(_) => return Err(format!("{at}[{i}]: raw_value is not a string")),
        };
        out.push((key, value));
    }
    Ok(out)
}

/// A Body: `as_bytes` (base64) or `as_string`, and `truncated`.
fn body(v: &Value, at: &str) -> Result<Body, String> {
    if !v.is_object() {
        return Err(format!("{at}: not an object"));
    }
    let truncated = match field(v, "truncated") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("{at}.truncated: not true or false (got {other})")),
    };
    let (bytes, as_string) = match (field(v, "as_bytes"), field(v, "as_string")) {
        (Some(Value::String(b)), _) => (
            base64::decode(b).map_err(|e| format!("{at}.as_bytes: {e}"))?,
            false,
        ),
        (Some(_), _) => return Err(format!("{at}.as_bytes: not a string")),
        (None, Some(Value::String(s))) => (s.as_bytes().to_vec(), true),
        (None, Some(_)) => return Err(format!("{at}.as_string: not a string")),
        (None, None) => (Vec::new(), false),
    };
    Ok(Body {
        bytes,
        truncated,
        as_string,
    })
}

/// An Address's `socket_address` as Envoy reports a peer (`1.2.3.4:5678`,
/// `[::1]:5678`); `None` for a pipe or an address without a port.
fn socket_address(address: &Value) -> Option<String> {
    let sock = field(address, "socket_address")?;
    let ip = field(sock, "address")?.as_str()?;
    let port = field(sock, "port_value")?.as_u64()?;
    if ip.is_empty() {
        return None;
    }
    Some(if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    })
}

/// A field by its proto name (`as_bytes`) or its JSON name (`asBytes`);
/// `null` counts as absent.
fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    let obj = v.as_object()?;
    let found = obj.get(name).or_else(|| {
        let mut camel = String::with_capacity(name.len());
        let mut upper = false;
        for c in name.chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                camel.push(c.to_ascii_uppercase());
                upper = false;
            } else {
                camel.push(c);
            }
        }
        obj.get(&camel)
    })?;
    (!found.is_null()).then_some(found)
}

fn lossy(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopguard_core::request::RequestFacts;
    use serde_json::json;

    fn b64(bytes: &[u8]) -> String {
        const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk.iter().fold(0u32, |acc, &b| (acc << 8) | u32::from(b))
                << (8 * (3 - chunk.len()));
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
            r.response,
            Some(Answer {
                status: Some(200),
                usage: Some(Usage {
                    input: 12,
                    output: 3
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
            r.response,
            Some(Answer {
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
            r.response,
            Some(Answer {
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
        assert!(reason(doc.clone())
            .starts_with("http_buffered_trace.request.body.as_bytes: not base64"));
        doc["http_buffered_trace"]["request"]["body"] = json!({"as_bytes": "", "truncated": "no"});
        assert!(reason(doc.clone())
            .starts_with("http_buffered_trace.request.body.truncated: not true or false"));
        doc["http_buffered_trace"]["request"]["body"] = json!({});
        doc["http_buffered_trace"]["request"]["headers_received_time"] = json!("noon");
        assert!(reason(doc.clone()).starts_with(
            "http_buffered_trace.request.headers_received_time: \"noon\" is not an RFC 3339 time"
        ));
        doc["http_buffered_trace"]["request"]["headers_received_time"] =
            json!("2026-11-25T18:40:30Z");
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
            r.response,
            Some(Answer {
                status: Some(429),
                usage: Some(Usage {
                    input: 12,
                    output: 3
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
        let bytes = include_bytes!("../../../tests/data/tap/buffered_bytes.json");
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
            r.response,
            Some(Answer {
                status: Some(200),
                usage: Some(Usage {
                    input: 3,
                    output: 4
                })
            })
        );
        assert!(r.request.notes.is_empty());
    }

    #[test]
    fn a_real_streamed_trace_timed_by_header_mutation() {
        let bytes = include_bytes!("../../../tests/data/tap/streamed_with_header.json");
        let got = read("streamed_with_header.json", bytes);
        assert_eq!(got.len(), 1);
        let r = got[0].as_ref().unwrap();
        assert!(r.at_ms > 1_700_000_000_000, "{}", r.at_ms);
        assert_eq!(r.request.body, REAL_CHAT.as_bytes());
        assert_eq!(
            r.response.as_ref().unwrap().usage,
            Some(Usage {
                input: 3,
                output: 4
            })
        );
    }

    #[test]
    fn a_real_truncated_trace_with_bodies_as_string() {
        let bytes = include_bytes!("../../../tests/data/tap/string_truncated.json");
        let s = read("string_truncated.json", bytes)[0].clone().unwrap_err();
        assert!(
            s.reason.starts_with(
                "http_buffered_trace.request.body.truncated: Envoy kept only the first 16 bytes"
            ),
            "{}",
            s.reason
        );
    }
}
