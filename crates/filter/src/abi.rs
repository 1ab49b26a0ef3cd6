//! Fallible wrappers over the proxy-wasm host ABI.
//!
//! The proxy-wasm 0.2 SDK's wrappers panic on statuses they do not expect
//! (and on header values that are not UTF-8). A panic inside a wasm filter
//! kills its VM, so every host call loopguard makes on the request path goes
//! through these wrappers instead: each returns the host's status as an
//! error value and never panics.

use loopguard_core::host::{CallReply, HeaderBlock, Kind};
use std::ptr::{null, null_mut};

/// A proxy-wasm status code other than Ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError(pub u32);

pub const STATUS_OK: u32 = 0;
pub const STATUS_NOT_FOUND: u32 = 1;
pub const STATUS_CAS_MISMATCH: u32 = 8;

pub type HostResult<T> = Result<T, HostError>;

pub const MAP_REQUEST_HEADERS: u32 = 0;
pub const MAP_RESPONSE_HEADERS: u32 = 2;
const MAP_HTTP_CALL_RESPONSE_HEADERS: u32 = 6;
const METRIC_GAUGE: u32 = 1;
const METRIC_HISTOGRAM: u32 = 2;
pub const BUFFER_REQUEST_BODY: u32 = 0;
pub const BUFFER_RESPONSE_BODY: u32 = 1;
const BUFFER_HTTP_CALL_RESPONSE_BODY: u32 = 4;
pub const BUFFER_PLUGIN_CONFIGURATION: u32 = 7;
const METRIC_COUNTER: u32 = 0;

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_buffer_data: *mut *mut u8,
        return_buffer_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(
        map_type: u32,
        return_map_data: *mut *mut u8,
        return_map_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_value_data: *mut *mut u8,
        return_value_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        status_code_details_data: *const u8,
        status_code_details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(
        metric_type: u32,
        name_data: *const u8,
        name_size: usize,
        return_id: *mut u32,
    ) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_get_log_level(return_level: *mut u32) -> u32;
    fn proxy_add_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_set_property(
        path_data: *const u8,
        path_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer_type: u32,
        start: usize,
        size: usize,
        buffer_data: *const u8,
        buffer_size: usize,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
}

fn status(code: u32) -> HostResult<()> {
    (code == STATUS_OK).then_some(()).ok_or(HostError(code))
}

/// What a getter returned: the host's buffer, `None` when not found. The
/// buffer is ours: the host allocated it through the module's
/// `proxy_on_memory_allocate` (exported by the proxy-wasm crate, which
/// allocates it as a `Vec<u8>` of exactly that size).
///
/// # Safety
/// `data` must be null or come from the host with `size` bytes.
unsafe fn returned(code: u32, data: *mut u8, size: usize) -> HostResult<Option<Vec<u8>>> {
    match code {
        STATUS_OK if data.is_null() => Ok(Some(Vec::new())),
        STATUS_OK => Ok(Some(Vec::from_raw_parts(data, size, size))),
        STATUS_NOT_FOUND => Ok(None),
        other => Err(HostError(other)),
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the host refuses).
pub fn now_ms() -> u64 {
    let mut nanos: u64 = 0;
    // SAFETY: the host writes one u64 into `nanos`.
    status(unsafe { proxy_get_current_time_nanoseconds(&mut nanos) })
        .map_or(0, |()| nanos / 1_000_000)
}

/// All headers of a map (the request's, or the response's in the response
/// phase) from one call (`None`: the host refused, or its encoding is
/// malformed).
pub fn header_block(map: u32) -> Option<HeaderBlock> {
    let mut data = null_mut();
    let mut size = 0;
    // SAFETY: out-pointers are valid; the returned buffer is ours.
    let code = unsafe { proxy_get_header_map_pairs(map, &mut data, &mut size) };
    let pairs = unsafe { returned(code, data, size) }.ok()?;
    HeaderBlock::parse(pairs.unwrap_or_default())
}

/// The response to an HTTP call (in its callback): its `:status` (`None`
/// when the response has no headers: the call failed or timed out) and
/// its body.
pub fn http_call_reply(num_headers: usize, body_size: usize) -> CallReply {
    let status = (num_headers > 0).then(|| {
        map_value(MAP_HTTP_CALL_RESPONSE_HEADERS, ":status")
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default()
    });
    let body = buffer(BUFFER_HTTP_CALL_RESPONSE_BODY, body_size).unwrap_or_default();
    CallReply { status, body }
}

/// The response's `:status` (in the response headers phase).
pub fn response_status() -> Option<Vec<u8>> {
    map_value(MAP_RESPONSE_HEADERS, ":status")
}

/// A header's value (`None`: not found, or the host refused).
fn map_value(map: u32, name: &str) -> Option<Vec<u8>> {
    let mut data = null_mut();
    let mut size = 0;
    // SAFETY: out-pointers are valid; the returned buffer is ours.
    let code =
        unsafe { proxy_get_header_map_value(map, name.as_ptr(), name.len(), &mut data, &mut size) };
    unsafe { returned(code, data, size) }.ok().flatten()
}

/// `len` bytes of a buffer from its start: the buffered request body, the
/// response body chunk passing now (with the filter letting each chunk
/// through, the buffer holds only the newest), the body of the response to
/// an HTTP call (in its callback), or the plugin configuration.
pub fn buffer(kind: u32, len: usize) -> HostResult<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let mut data = null_mut();
    let mut size = 0;
    // SAFETY: out-pointers are valid; the returned buffer is ours.
    let code = unsafe { proxy_get_buffer_bytes(kind, 0, len, &mut data, &mut size) };
    Ok(unsafe { returned(code, data, size) }?.unwrap_or_default())
}

/// An Envoy attribute (`["source", "address"]`, `["plugin_name"]`, ...);
/// `None`: no value, or the host refused.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    let serialized = path.join("\0");
    let mut data = null_mut();
    let mut size = 0;
    // SAFETY: out-pointers are valid; the returned buffer is ours.
    let code =
        unsafe { proxy_get_property(serialized.as_ptr(), serialized.len(), &mut data, &mut size) };
    // A property the host has no value for comes back as no buffer.
    let found = !data.is_null();
    unsafe { returned(code, data, size) }
        .ok()
        .flatten()
        .filter(|_| found)
}

/// A shared-data value and its CAS version; `None` if the key is missing.
pub fn shared_get(key: &str) -> HostResult<Option<(Vec<u8>, u32)>> {
    let mut data = null_mut();
    let mut size = 0;
    let mut cas = 0;
    // SAFETY: out-pointers are valid; the returned buffer is ours.
    let code =
        unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    Ok(unsafe { returned(code, data, size) }?.map(|v| (v, cas)))
}

/// Write a shared-data value if its version is still `cas` (0 writes
/// unconditionally). `Err(HostError(STATUS_CAS_MISMATCH))` when another
/// writer won.
pub fn shared_set(key: &str, value: &[u8], cas: u32) -> HostResult<()> {
    // SAFETY: pointers and lengths describe live slices.
    status(unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    })
}

/// Answer the request locally. The caller must then return Pause.
pub fn send_local_response(
    status_code: u32,
    details: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> HostResult<()> {
    let map = serialize_map(headers);
    // SAFETY: pointers and lengths describe live buffers.
    status(unsafe {
        proxy_send_local_response(
            status_code,
            details.as_ptr(),
            details.len(),
            if body.is_empty() {
                null()
            } else {
                body.as_ptr()
            },
            body.len(),
            map.as_ptr(),
            map.len(),
            -1,
        )
    })
}

pub fn record(metric_id: u32, value: u64) -> HostResult<()> {
    // SAFETY: plain values.
    status(unsafe { proxy_record_metric(metric_id, value) })
}

pub fn define_metric(kind: Kind, name: &str) -> HostResult<u32> {
    let kind = match kind {
        Kind::Counter => METRIC_COUNTER,
        Kind::Gauge => METRIC_GAUGE,
        Kind::Histogram => METRIC_HISTOGRAM,
    };
    let mut id = 0;
    // SAFETY: out-pointer is valid.
    status(unsafe { proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Remove a header (a request header only while the request headers are
/// held: in the headers phase, or later with `hold_request_headers`; a
/// response header in the response headers phase).
pub fn remove_header(map: u32, name: &str) -> HostResult<()> {
    // SAFETY: pointer and length describe a live str.
    status(unsafe { proxy_remove_header_map_value(map, name.as_ptr(), name.len()) })
}

/// Replace the first `old_len` bytes of a body buffer with `body`: all of
/// the buffered request body, or the response body chunk at hand.
pub fn replace_body(kind: u32, old_len: usize, body: &[u8]) -> HostResult<()> {
    // SAFETY: pointer and length describe a live slice.
    status(unsafe { proxy_set_buffer_bytes(kind, 0, old_len, body.as_ptr(), body.len()) })
}

/// Add a header (as [`remove_header`], while the headers can change), or
/// with `replace` set it, replacing any value it had.
pub fn add_header(map: u32, name: &str, value: &str, replace: bool) -> HostResult<()> {
    let add = if replace {
        proxy_replace_header_map_value
    } else {
        proxy_add_header_map_value
    };
    // SAFETY: pointers and lengths describe live strs.
    status(unsafe { add(map, name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Set a stream property; Envoy keeps it as filter state `wasm.<name>`,
/// where later filters and access logs can read it.
pub fn set_filter_state(name: &str, value: &[u8]) -> HostResult<()> {
    // SAFETY: pointers and lengths describe live slices.
    status(unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Make `context_id` the context later calls act on (from the root
/// context's tick). Fails if the stream is gone.
pub fn set_effective_context(context_id: u32) -> HostResult<()> {
    // SAFETY: plain value.
    status(unsafe { proxy_set_effective_context(context_id) })
}

/// Continue the paused request or, with `response`, response of the
/// effective context (stream types HttpRequest = 0, HttpResponse = 1).
pub fn resume(response: bool) -> HostResult<()> {
    // SAFETY: plain value.
    status(unsafe { proxy_continue_stream(u32::from(response)) })
}

/// The root context's tick period (0 stops the tick).
pub fn set_tick_period_ms(period: u32) -> HostResult<()> {
    // SAFETY: plain value.
    status(unsafe { proxy_set_tick_period_milliseconds(period) })
}

pub fn increment(metric_id: u32, by: i64) -> HostResult<()> {
    // SAFETY: plain values.
    status(unsafe { proxy_increment_metric(metric_id, by) })
}

/// The proxy-wasm header map encoding: count, then (key length, value
/// length) pairs, then each key and value followed by a NUL.
fn serialize_map(pairs: &[(&str, String)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 8 + k.len() + v.len() + 2)
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Envoy's log level for wasm (0 trace .. 5 critical), if it says.
pub fn host_log_level() -> Option<u32> {
    let mut level = 0;
    // SAFETY: the host writes one u32 into `level`.
    let code = unsafe { proxy_get_log_level(&mut level) };
    (code == STATUS_OK).then_some(level)
}
