//! Headers: a map read whole or one header at a time, values added, set
//! and removed, and the core's headers lent to Envoy.

use super::{
    envoy_dynamic_module_callback_http_add_header, envoy_dynamic_module_callback_http_get_header,
    envoy_dynamic_module_callback_http_get_headers,
    envoy_dynamic_module_callback_http_get_headers_size,
    envoy_dynamic_module_callback_http_set_header, EnvoyBuffer, EnvoyHeader, FilterPtr, HeaderMap,
    ModuleBuffer, ModuleHeader,
};

/// Every header of a map, as (name, value) borrowed from Envoy for the
/// current hook; empty when the map is not available.
///
/// # Safety
/// `filter` is the stream of the current hook; the slices are used before
/// any callback that changes the map.
pub unsafe fn headers<'a>(filter: FilterPtr, map: HeaderMap) -> Vec<(&'a [u8], &'a [u8])> {
    // SAFETY: Envoy fills at most `n` entries into the array we size.
    unsafe {
        let n = envoy_dynamic_module_callback_http_get_headers_size(filter, map as u32);
        if n == 0 {
            return Vec::new();
        }
        let mut raw = vec![
            EnvoyHeader {
                key: EnvoyBuffer::EMPTY,
                value: EnvoyBuffer::EMPTY,
            };
            n
        ];
        if !envoy_dynamic_module_callback_http_get_headers(filter, map as u32, raw.as_mut_ptr()) {
            return Vec::new();
        }
        raw.iter()
            .map(|h| (h.key.bytes(), h.value.bytes()))
            .collect()
    }
}

/// The first value of a header, copied.
pub fn header(filter: FilterPtr, map: HeaderMap, name: &str) -> Option<Vec<u8>> {
    let mut out = EnvoyBuffer::EMPTY;
    // SAFETY: Envoy writes one buffer; it is copied before returning.
    unsafe {
        envoy_dynamic_module_callback_http_get_header(
            filter,
            map as u32,
            ModuleBuffer::of(name.as_bytes()),
            &mut out,
            0,
            std::ptr::null_mut(),
        )
        .then(|| out.bytes().to_vec())
    }
}

/// Append a header value (existing values are kept).
pub fn add_header(filter: FilterPtr, map: HeaderMap, name: &str, value: &str) -> bool {
    change(filter, map, name, ModuleBuffer::of(value.as_bytes()), true)
}

/// Set a header to one value.
pub fn set_header(filter: FilterPtr, map: HeaderMap, name: &str, value: &str) -> bool {
    change(filter, map, name, ModuleBuffer::of(value.as_bytes()), false)
}

/// Remove every value of a header (a set with no value).
pub fn remove_header(filter: FilterPtr, map: HeaderMap, name: &str) -> bool {
    change(filter, map, name, ModuleBuffer::NULL, false)
}

/// Add a header value (`add`) or set the header to it.
fn change(filter: FilterPtr, map: HeaderMap, name: &str, value: ModuleBuffer, add: bool) -> bool {
    let change = if add {
        envoy_dynamic_module_callback_http_add_header
    } else {
        envoy_dynamic_module_callback_http_set_header
    };
    // SAFETY: the buffers are read during the call only; a null value
    // removes the header.
    unsafe { change(filter, map as u32, ModuleBuffer::of(name.as_bytes()), value) }
}

/// Headers as the core carries them (a name and its value), lent to Envoy.
pub(super) fn module_headers(headers: &[(&str, String)]) -> Vec<ModuleHeader> {
    headers
        .iter()
        .map(|(k, v)| ModuleHeader {
            key: ModuleBuffer::of(k.as_bytes()),
            value: ModuleBuffer::of(v.as_bytes()),
        })
        .collect()
}
