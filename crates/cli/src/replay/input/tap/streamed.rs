//! A streamed trace (`http_streamed_trace_segment`s): its segments assembled into one request.

use super::entry::recorded;
use super::fields::{body, field, headers, Body, Message};
use crate::replay::record::Recorded;
use serde_json::Value;

pub(super) fn streamed(place: &str, segments: &[(usize, &Value)]) -> Result<Recorded, String> {
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
