//! Bodies: their size, their slices in place in Envoy's buffer, and bytes
//! drained or appended.

use super::{
    envoy_dynamic_module_callback_http_append_body, envoy_dynamic_module_callback_http_drain_body,
    envoy_dynamic_module_callback_http_get_body_chunks,
    envoy_dynamic_module_callback_http_get_body_chunks_size,
    envoy_dynamic_module_callback_http_get_body_size,
    envoy_dynamic_module_callback_http_received_buffered_request_body, Body, EnvoyBuffer,
    FilterPtr, ModuleBuffer,
};

/// The size of a body (0 when it is not available).
pub fn body_size(filter: FilterPtr, body: Body) -> usize {
    // SAFETY: no pointers kept.
    unsafe { envoy_dynamic_module_callback_http_get_body_size(filter, body as u32) }
}

/// A body's slices, in place in Envoy's buffer, for the current hook.
///
/// # Safety
/// `filter` is the stream of the current hook; the slices are used before
/// any callback that changes the body.
pub unsafe fn body_chunks<'a>(filter: FilterPtr, body: Body) -> Vec<&'a [u8]> {
    // SAFETY: Envoy fills at most `n` slices into the array we size.
    unsafe {
        let n = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, body as u32);
        if n == 0 {
            return Vec::new();
        }
        let mut raw = vec![EnvoyBuffer::EMPTY; n];
        if !envoy_dynamic_module_callback_http_get_body_chunks(
            filter,
            body as u32,
            raw.as_mut_ptr(),
        ) {
            return Vec::new();
        }
        raw.iter().map(|b| b.bytes()).collect()
    }
}

/// Whether the chunk of this request body hook is an earlier filter's
/// buffered body (then it is the whole body, not an addition to it).
pub fn received_buffered_request_body(filter: FilterPtr) -> bool {
    // SAFETY: no pointers.
    unsafe { envoy_dynamic_module_callback_http_received_buffered_request_body(filter) }
}

pub fn drain_body(filter: FilterPtr, body: Body, n: usize) -> bool {
    // SAFETY: no pointers kept.
    unsafe { envoy_dynamic_module_callback_http_drain_body(filter, body as u32, n) }
}

pub fn append_body(filter: FilterPtr, body: Body, data: &[u8]) -> bool {
    // SAFETY: the buffer is read during the call only.
    unsafe {
        envoy_dynamic_module_callback_http_append_body(filter, body as u32, ModuleBuffer::of(data))
    }
}
