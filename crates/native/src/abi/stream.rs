//! What else a stream's hooks ask of Envoy: a local reply, a filter-state
//! value, a string attribute or metadata value, and resuming a request or
//! response a hook stopped.

use super::headers::module_headers;
use super::{
    envoy_dynamic_module_callback_http_filter_continue_decoding,
    envoy_dynamic_module_callback_http_filter_continue_encoding,
    envoy_dynamic_module_callback_http_filter_get_attribute_string,
    envoy_dynamic_module_callback_http_get_metadata_string,
    envoy_dynamic_module_callback_http_send_response,
    envoy_dynamic_module_callback_http_set_filter_state_bytes, Attribute, EnvoyBuffer, FilterPtr,
    Metadata, ModuleBuffer,
};
use loopguard_core::host::LocalReply;

/// Answer the request locally (Envoy's `sendLocalReply`). Envoy may end
/// and destroy the stream inside this call, so it is the last thing a hook
/// does with its stream.
pub fn send_response(filter: FilterPtr, reply: &LocalReply, details: &str) {
    let mut h = module_headers(&reply.headers);
    // SAFETY: every buffer is read during the call only.
    unsafe {
        envoy_dynamic_module_callback_http_send_response(
            filter,
            reply.status,
            h.as_mut_ptr(),
            h.len(),
            ModuleBuffer::of(reply.body.as_bytes()),
            ModuleBuffer::of(details.as_bytes()),
        )
    }
}

/// Set a filter-state value (bytes, read by `%FILTER_STATE(key:PLAIN)%`).
pub fn set_filter_state(filter: FilterPtr, key: &str, value: &[u8]) -> bool {
    // SAFETY: the buffers are read during the call only.
    unsafe {
        envoy_dynamic_module_callback_http_set_filter_state_bytes(
            filter,
            ModuleBuffer::of(key.as_bytes()),
            ModuleBuffer::of(value),
        )
    }
}

/// A string attribute, copied.
pub fn attribute(filter: FilterPtr, attribute: Attribute) -> Option<Vec<u8>> {
    let mut out = EnvoyBuffer::EMPTY;
    // SAFETY: Envoy writes one buffer; it is copied before returning.
    unsafe {
        envoy_dynamic_module_callback_http_filter_get_attribute_string(
            filter,
            attribute as u32,
            &mut out,
        )
        .then(|| out.bytes().to_vec())
    }
}

/// A string in metadata (`namespace`, top-level `key`), copied.
pub fn metadata_string(
    filter: FilterPtr,
    source: Metadata,
    namespace: &str,
    key: &str,
) -> Option<Vec<u8>> {
    let mut out = EnvoyBuffer::EMPTY;
    // SAFETY: Envoy writes one buffer; it is copied before returning.
    unsafe {
        envoy_dynamic_module_callback_http_get_metadata_string(
            filter,
            source as u32,
            ModuleBuffer::of(namespace.as_bytes()),
            ModuleBuffer::of(key.as_bytes()),
            &mut out,
        )
        .then(|| out.bytes().to_vec())
    }
}

/// Resume a request (or, with `response`, a response) a hook stopped (a
/// repeated call is ignored by Envoy).
pub fn resume(filter: FilterPtr, response: bool) {
    let resume = if response {
        envoy_dynamic_module_callback_http_filter_continue_encoding
    } else {
        envoy_dynamic_module_callback_http_filter_continue_decoding
    };
    // SAFETY: on the stream's worker thread, while the stream lives.
    unsafe { resume(filter) }
}
