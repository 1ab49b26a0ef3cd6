//! A trace's request and response as a replay entry: time, request, the provider's answer.

use super::fields::{lossy, Message};
use super::RECEIVED_AT_HEADER;
use crate::replay::record::{usage_in_body, Answer, Recorded, MCP_LOOP_HEADER};
use crate::request_file::RequestFile;

const TIME_ADVICE: &str = "set record_headers_received_time: true on the tap filter, or have Envoy add the header x-loopguard-received-at: %START_TIME(%s%3f)% before the tap (header_mutation filter); see examples/tap/README.md";

/// The entry of a trace's request and response.
pub(super) fn recorded(
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
    let mut content_type = None;
    let mut by_loopguard = false;
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
            "content-type" => {
                content_type.get_or_insert_with(|| lossy(value));
            }
            MCP_LOOP_HEADER => by_loopguard = true,
            _ => {}
        }
    }
    let usage = if m.body.truncated {
        notes.push(format!("{at}.body.truncated: the provider's token usage was not read; raise the tap's output_config.max_buffered_tx_bytes above the largest response body"));
        None
    } else {
        match &encoding {
            Some(e) if !e.eq_ignore_ascii_case("identity") => {
                if !m.body.bytes.is_empty() {
                    notes.push(format!(
                        "the response body is {e}-encoded: the provider's token usage was not read"
                    ));
                }
                None
            }
            _ => usage_in_body(&m.body.bytes),
        }
    };
    let mut answer = Answer {
        status,
        usage,
        content_type,
        by_loopguard,
        ..Answer::default()
    };
    // The body as it passed the tap, encoded or not (a tap before
    // loopguard records what loopguard sent on: replay takes its own note
    // out again).
    answer.keep_body(m.body.bytes, m.body.truncated);
    Ok(Some(answer))
}
