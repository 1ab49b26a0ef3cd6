//! The shared store: Redis, through webdis, through an Envoy cluster. One
//! call per hit; the request waits paused for the answer (at most the
//! store's timeout) and resumes in the call's callback.
//!
//! Calls are made on behalf of the root context, not the stream: Envoy
//! cancels a stream's own calls when its client leaves, and then never
//! answers them, which would leave the SDK's token-to-context entry behind
//! for good (and, once Envoy's call ids wrap, a duplicate-token panic). A
//! root-owned call is always answered (or timed out); the SDK then routes
//! the answer to the stream, or drops it if the stream is gone.

use crate::abi;
use crate::root::Plugin;
use loopguard_core::config::RedisStore;
use loopguard_core::fingerprint::Fingerprint;
use loopguard_core::redis::{self, RedisError};
use loopguard_core::window::{WindowQuery, WindowState};
use std::time::Duration;

/// Send one hit to Redis; the answer arrives in the stream's
/// `on_http_call_response`.
pub fn dispatch(
    plugin: &Plugin,
    stream_id: u32,
    store: &RedisStore,
    key: &Fingerprint,
    query: &WindowQuery,
) -> Result<u32, RedisError> {
    let body = redis::call_body(&plugin.name, key, query, &plugin.next_nonce());
    let headers = vec![
        (":method", "POST"),
        (":path", store.path.as_str()),
        (":authority", store.authority.as_str()),
        ("content-type", "text/plain"),
    ];
    abi::set_effective_context(plugin.root_id).map_err(|e| {
        RedisError::Unavailable(format!(
            "cannot act as the root context (host status {})",
            e.0
        ))
    })?;
    let sent = proxy_wasm::hostcalls::dispatch_http_call(
        &store.cluster,
        headers,
        Some(body.as_bytes()),
        vec![],
        Duration::from_millis(store.timeout_ms),
    );
    // Back to the stream for the rest of its callback.
    let _ = abi::set_effective_context(stream_id);
    sent.map_err(|status| {
        RedisError::Unavailable(format!(
            "Envoy refused the call ({status:?}): is \"{}\" a cluster in the bootstrap?",
            store.cluster
        ))
    })
}

/// The answer to a call, in its callback. No headers means no response
/// (timeout, reset, no healthy webdis).
pub fn read_reply(num_headers: usize, body_size: usize) -> Result<WindowState, RedisError> {
    if num_headers == 0 {
        return Err(RedisError::Unavailable(
            "no answer within the timeout, or the connection failed".to_string(),
        ));
    }
    let status = abi::http_call_response_header(":status")
        .ok()
        .flatten()
        .map(|v| String::from_utf8_lossy(&v).into_owned())
        .unwrap_or_default();
    let body = abi::http_call_response_body(body_size).map_err(|e| {
        RedisError::Unavailable(format!(
            "the answer's body is unreadable (host status {})",
            e.0
        ))
    })?;
    redis::parse_reply(&status, &body)
}
