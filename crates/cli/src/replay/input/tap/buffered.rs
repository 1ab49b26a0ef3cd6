//! A buffered trace (`http_buffered_trace`): one JSON document per request.

use super::entry::recorded;
use super::fields::{body, field, headers, Body, Message};
use crate::replay::input::time;
use crate::replay::record::Recorded;
use serde_json::Value;

pub(super) fn buffered(place: &str, trace: &Value) -> Result<Recorded, String> {
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
