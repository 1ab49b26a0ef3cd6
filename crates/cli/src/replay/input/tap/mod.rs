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

mod buffered;
mod entry;
mod fields;
mod streamed;
#[cfg(test)]
mod tests;

use crate::replay::record::{Entry, Skipped};
use buffered::buffered;
use fields::field;
use serde_json::Value;
use streamed::streamed;

/// The request header that may carry when Envoy received the request, in
/// milliseconds since the Unix epoch; it is capture metadata, so it is not
/// kept among the request's headers.
pub const RECEIVED_AT_HEADER: &str = "x-loopguard-received-at";

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
