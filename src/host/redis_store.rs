//! The shared store: Redis, through webdis, through an Envoy cluster. One
//! call per hit; the request waits paused for the answer (at most the
//! store's timeout) and resumes in the call's callback.

use super::abi;
use super::root::Plugin;
use crate::core::config::RedisStore;
use crate::core::fingerprint::Fingerprint;
use crate::core::redis::{self, RedisError};
use crate::core::window::{WindowQuery, WindowState};
use std::time::Duration;

/// Send one hit to Redis; the answer arrives in the stream's
/// `on_http_call_response`.
pub fn dispatch(
    plugin: &Plugin,
    store: &RedisStore,
    key: &Fingerprint,
    query: &WindowQuery,
) -> Result<u32, RedisError> {
    let body = redis::call_body(key, query, &plugin.next_nonce());
    let headers = vec![
        (":method", "POST"),
        (":path", store.path.as_str()),
        (":authority", store.authority.as_str()),
        ("content-type", "text/plain"),
    ];
    proxy_wasm::hostcalls::dispatch_http_call(
        &store.cluster,
        headers,
        Some(body.as_bytes()),
        vec![],
        Duration::from_millis(store.timeout_ms),
    )
    .map_err(|status| {
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
