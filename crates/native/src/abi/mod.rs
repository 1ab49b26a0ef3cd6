//! The part of Envoy's dynamic-module ABI loopguard uses, written from the
//! ABI header `source/extensions/dynamic_modules/abi/abi.h` as of Envoy
//! v1.40.0 (ABI version [`ABI_VERSION`]): its types, and the callbacks
//! Envoy exports, each wrapped in a function that takes Rust values and
//! reports failure as a value. Nothing here panics, and no Envoy pointer
//! outlives the hook that lent it (what Envoy owns is copied out).
//!
//! The hooks Envoy calls (`envoy_dynamic_module_on_*`) are in `hooks.rs`.
#![allow(unsafe_code)]

use loopguard_core::state::store::StoreCall;
use std::ffi::c_void;

/// The ABI version this module is built against, returned to Envoy at
/// load: Envoy 1.40 logs "Dynamic module ABI version v0.2.0 matched".
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Envoy's per-configuration object (`envoy_dynamic_module_type_http_filter_config_envoy_ptr`).
pub type ConfigPtr = *mut c_void;
/// Envoy's per-stream object (`envoy_dynamic_module_type_http_filter_envoy_ptr`).
pub type FilterPtr = *mut c_void;
/// A scheduler Envoy allocated for the module (the module deletes it).
pub type SchedulerPtr = *mut c_void;

/// `envoy_dynamic_module_type_envoy_buffer`: bytes Envoy owns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl EnvoyBuffer {
    const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, borrowed for as long as Envoy keeps them (the hook).
    ///
    /// # Safety
    /// Envoy gave this buffer in the current hook and has not changed it.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            &[]
        } else {
            // SAFETY: Envoy promises `length` readable bytes at `ptr` for
            // the duration of the hook.
            unsafe { std::slice::from_raw_parts(self.ptr, self.length) }
        }
    }
}

/// `envoy_dynamic_module_type_module_buffer`: bytes the module owns, read
/// by Envoy during the call only.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    ptr: *const u8,
    length: usize,
}

impl ModuleBuffer {
    fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }
    const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

/// `envoy_dynamic_module_type_module_http_header`.
#[repr(C)]
struct ModuleHeader {
    key: ModuleBuffer,
    value: ModuleBuffer,
}

/// `envoy_dynamic_module_type_envoy_http_header`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key: EnvoyBuffer,
    pub value: EnvoyBuffer,
}

/// `envoy_dynamic_module_type_http_header_type`.
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum HeaderMap {
    Request = 0,
    Response = 2,
}

/// `envoy_dynamic_module_type_http_body_type`.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Body {
    ReceivedRequest = 0,
    BufferedRequest = 1,
    ReceivedResponse = 2,
}

/// `envoy_dynamic_module_type_log_level` (Trace = 0 .. Critical = 5).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum LogLevel {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

/// `envoy_dynamic_module_type_attribute_id` values read.
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum Attribute {
    SourceAddress = 24,
    XdsRouteName = 61,
}

/// `envoy_dynamic_module_type_metadata_source` values read.
#[derive(Clone, Copy)]
#[repr(u32)]
pub enum Metadata {
    Route = 1,
}

/// `envoy_dynamic_module_type_http_callout_result`: only Success (0) is
/// an answer.
pub const CALLOUT_SUCCESS: u32 = 0;
/// `envoy_dynamic_module_type_http_callout_init_result_Success`.
const CALLOUT_INIT_SUCCESS: u32 = 0;
/// `envoy_dynamic_module_type_metrics_result_Success`.
const METRICS_SUCCESS: u32 = 0;

// The status values the hooks return (`envoy_dynamic_module_type_on_http_filter_*_status`).
pub const HEADERS_CONTINUE: u32 = 0;
pub const HEADERS_STOP_ITERATION: u32 = 1;
pub const BODY_CONTINUE: u32 = 0;
pub const BODY_STOP_AND_BUFFER: u32 = 1;
pub const TRAILERS_CONTINUE: u32 = 0;
pub const TRAILERS_STOP_ITERATION: u32 = 1;

#[cfg(not(test))]
extern "C" {
    fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_log_enabled(level: u32) -> bool;
    fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterPtr,
        map: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        count: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_headers_size(filter: FilterPtr, map: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterPtr,
        map: u32,
        result: *mut EnvoyHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_add_header(
        filter: FilterPtr,
        map: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterPtr,
        map: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_size(filter: FilterPtr, body: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterPtr,
        body: u32,
    ) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterPtr,
        body: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterPtr,
        body: u32,
        data: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterPtr,
        body: u32,
        bytes: usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_received_buffered_request_body(filter: FilterPtr)
        -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterPtr,
        status: u32,
        headers: *mut ModuleHeader,
        headers_len: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: FilterPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterPtr,
        attribute: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: FilterPtr,
        source: u32,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterPtr);
    fn envoy_dynamic_module_callback_http_filter_continue_encoding(filter: FilterPtr);
    fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: FilterPtr) -> SchedulerPtr;
    fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: SchedulerPtr,
        event: u64,
    );
    fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        config: ConfigPtr,
    ) -> SchedulerPtr;
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: SchedulerPtr,
        event: u64,
    );
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: SchedulerPtr);
    fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterPtr,
        id: *mut u64,
        cluster: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_len: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: ConfigPtr,
        id: *mut u64,
        cluster: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_len: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: ConfigPtr,
        name: ModuleBuffer,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: ConfigPtr,
        name: ModuleBuffer,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: ConfigPtr,
        name: ModuleBuffer,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: ConfigPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        config: ConfigPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        config: ConfigPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
        config: ConfigPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        value: u64,
    ) -> u32;
}

// Unit tests run without Envoy: every callback answers "unavailable".
#[cfg(test)]
mod absent;
#[cfg(test)]
use absent::*;

/// Write to Envoy's log (the `dynamic_modules` logger).
pub fn log(level: LogLevel, message: &str) {
    // SAFETY: the buffer is read during the call only.
    unsafe { envoy_dynamic_module_callback_log(level as u32, ModuleBuffer::of(message.as_bytes())) }
}

/// Whether Envoy would write a message at `level`.
pub fn log_enabled(level: LogLevel) -> bool {
    // SAFETY: no pointers.
    unsafe { envoy_dynamic_module_callback_log_enabled(level as u32) }
}

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
    // SAFETY: the buffers are read during the call only.
    unsafe {
        envoy_dynamic_module_callback_http_add_header(
            filter,
            map as u32,
            ModuleBuffer::of(name.as_bytes()),
            ModuleBuffer::of(value.as_bytes()),
        )
    }
}

/// Set a header to one value.
pub fn set_header(filter: FilterPtr, map: HeaderMap, name: &str, value: &str) -> bool {
    // SAFETY: the buffers are read during the call only.
    unsafe {
        envoy_dynamic_module_callback_http_set_header(
            filter,
            map as u32,
            ModuleBuffer::of(name.as_bytes()),
            ModuleBuffer::of(value.as_bytes()),
        )
    }
}

/// Remove every value of a header (a set with no value).
pub fn remove_header(filter: FilterPtr, map: HeaderMap, name: &str) -> bool {
    // SAFETY: as set_header; a null value removes the header.
    unsafe {
        envoy_dynamic_module_callback_http_set_header(
            filter,
            map as u32,
            ModuleBuffer::of(name.as_bytes()),
            ModuleBuffer::NULL,
        )
    }
}

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

/// Drop the first `n` bytes of a body.
pub fn drain_body(filter: FilterPtr, body: Body, n: usize) -> bool {
    // SAFETY: no pointers kept.
    unsafe { envoy_dynamic_module_callback_http_drain_body(filter, body as u32, n) }
}

/// Append bytes to a body.
pub fn append_body(filter: FilterPtr, body: Body, data: &[u8]) -> bool {
    // SAFETY: the buffer is read during the call only.
    unsafe {
        envoy_dynamic_module_callback_http_append_body(filter, body as u32, ModuleBuffer::of(data))
    }
}

/// Headers as the core carries them (a name and its value), lent to Envoy.
fn module_headers(headers: &[(&str, String)]) -> Vec<ModuleHeader> {
    headers
        .iter()
        .map(|(k, v)| ModuleHeader {
            key: ModuleBuffer::of(k.as_bytes()),
            value: ModuleBuffer::of(v.as_bytes()),
        })
        .collect()
}

/// Answer the request locally (Envoy's `sendLocalReply`).
pub fn send_response(
    filter: FilterPtr,
    status: u32,
    headers: &[(&str, String)],
    body: &[u8],
    details: &str,
) {
    let mut h = module_headers(headers);
    // SAFETY: every buffer is read during the call only.
    unsafe {
        envoy_dynamic_module_callback_http_send_response(
            filter,
            status,
            h.as_mut_ptr(),
            h.len(),
            ModuleBuffer::of(body),
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

/// Resume a request a hook stopped (a repeated call is ignored by Envoy).
pub fn continue_decoding(filter: FilterPtr) {
    // SAFETY: on the stream's worker thread, while the stream lives.
    unsafe { envoy_dynamic_module_callback_http_filter_continue_decoding(filter) }
}

/// Resume a response a hook stopped (a repeated call is ignored by Envoy).
pub fn continue_encoding(filter: FilterPtr) {
    // SAFETY: on the stream's worker thread, while the stream lives.
    unsafe { envoy_dynamic_module_callback_http_filter_continue_encoding(filter) }
}

/// A scheduler for a stream: commits come back as
/// `on_http_filter_scheduled` on its worker thread.
pub fn scheduler_new(filter: FilterPtr) -> Option<SchedulerPtr> {
    // SAFETY: on the stream's worker thread, in a hook.
    let s = unsafe { envoy_dynamic_module_callback_http_filter_scheduler_new(filter) };
    (!s.is_null()).then_some(s)
}

/// Post an event to the scheduler's stream (any thread).
///
/// # Safety
/// `s` is a live scheduler, not deleted concurrently.
pub unsafe fn scheduler_commit(s: SchedulerPtr, event: u64) {
    // SAFETY: the caller guarantees `s` lives.
    unsafe { envoy_dynamic_module_callback_http_filter_scheduler_commit(s, event) }
}

/// # Safety
/// `s` is a live scheduler, deleted once, with no commit in flight.
pub unsafe fn scheduler_delete(s: SchedulerPtr) {
    // SAFETY: the caller guarantees single, exclusive deletion.
    unsafe { envoy_dynamic_module_callback_http_filter_scheduler_delete(s) }
}

/// A scheduler for a configuration: commits come back as
/// `on_http_filter_config_scheduled` on the main thread.
pub fn config_scheduler_new(config: ConfigPtr) -> Option<SchedulerPtr> {
    // SAFETY: on the main thread, in the configuration hook.
    let s = unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_new(config) };
    (!s.is_null()).then_some(s)
}

/// # Safety
/// `s` is a live configuration scheduler.
pub unsafe fn config_scheduler_commit(s: SchedulerPtr, event: u64) {
    // SAFETY: the caller guarantees `s` lives.
    unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_commit(s, event) }
}

/// # Safety
/// `s` is a live configuration scheduler, deleted once.
pub unsafe fn config_scheduler_delete(s: SchedulerPtr) {
    // SAFETY: the caller guarantees single deletion.
    unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_delete(s) }
}

/// Why Envoy refused a callout (its
/// `envoy_dynamic_module_type_http_callout_init_result`).
fn refused(code: u32) -> String {
    match code {
        1 => "missing :method, :path or host".to_string(),
        2 => "no such cluster".to_string(),
        3 => "duplicate callout id".to_string(),
        4 => "cannot create the request (no healthy host?)".to_string(),
        n => format!("init result {n}"),
    }
}

/// Send `call` through an Envoy cluster with one of Envoy's callout
/// callbacks (`send` gets the id to fill, the cluster, the headers, the
/// body and the timeout): the call's id, or why Envoy refused it.
fn callout(
    call: &StoreCall,
    send: impl FnOnce(*mut u64, ModuleBuffer, *mut ModuleHeader, usize, ModuleBuffer, u64) -> u32,
) -> Result<u64, String> {
    let mut h = module_headers(&call.headers);
    let mut id = 0u64;
    let code = send(
        &mut id,
        ModuleBuffer::of(call.cluster.as_bytes()),
        h.as_mut_ptr(),
        h.len(),
        ModuleBuffer::of(&call.body),
        call.timeout_ms,
    );
    if code == CALLOUT_INIT_SUCCESS {
        Ok(id)
    } else {
        Err(refused(code))
    }
}

/// Send a call on behalf of a stream (answered to the stream, on its worker).
pub fn stream_callout(filter: FilterPtr, call: &StoreCall) -> Result<u64, String> {
    callout(call, |id, cluster, headers, n, body, timeout| {
        // SAFETY: every buffer is read during the call only.
        unsafe {
            envoy_dynamic_module_callback_http_filter_http_callout(
                filter, id, cluster, headers, n, body, timeout,
            )
        }
    })
}

/// Send a call on behalf of the configuration (main thread; answered there).
pub fn config_callout(config: ConfigPtr, call: &StoreCall) -> Result<u64, String> {
    callout(call, |id, cluster, headers, n, body, timeout| {
        // SAFETY: every buffer is read during the call only.
        unsafe {
            envoy_dynamic_module_callback_http_filter_config_http_callout(
                config, id, cluster, headers, n, body, timeout,
            )
        }
    })
}

/// Strings as an array of module buffers for the call `f` makes (null and
/// 0 when there are none).
fn with_buffers<T>(strings: &[&str], f: impl FnOnce(*mut ModuleBuffer, usize) -> T) -> T {
    let mut buffers: Vec<ModuleBuffer> = strings
        .iter()
        .map(|s| ModuleBuffer::of(s.as_bytes()))
        .collect();
    if buffers.is_empty() {
        f(std::ptr::null_mut(), 0)
    } else {
        f(buffers.as_mut_ptr(), buffers.len())
    }
}

/// What a metric is to Envoy.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

/// Define a metric (only while the configuration loads); its id.
pub fn define_metric(
    config: ConfigPtr,
    kind: MetricKind,
    name: &str,
    labels: &[&str],
) -> Option<usize> {
    let mut id = 0usize;
    let name = ModuleBuffer::of(name.as_bytes());
    // SAFETY: every buffer is read during the call only.
    let code = with_buffers(labels, |ptr, len| unsafe {
        match kind {
            MetricKind::Counter => envoy_dynamic_module_callback_http_filter_config_define_counter(
                config, name, ptr, len, &mut id,
            ),
            MetricKind::Gauge => envoy_dynamic_module_callback_http_filter_config_define_gauge(
                config, name, ptr, len, &mut id,
            ),
            MetricKind::Histogram => {
                envoy_dynamic_module_callback_http_filter_config_define_histogram(
                    config, name, ptr, len, &mut id,
                )
            }
        }
    });
    (code == METRICS_SUCCESS).then_some(id)
}

/// What to do to a metric.
#[derive(Clone, Copy)]
pub enum MetricOp {
    Increment,
    Decrement,
    Record,
}

/// Change a metric (any thread: Envoy's stats are atomic). `labels` are
/// the values of a labelled metric's labels, in order (empty otherwise).
pub fn metric(
    config: ConfigPtr,
    op: MetricOp,
    kind: MetricKind,
    id: usize,
    labels: &[&str],
    value: u64,
) -> bool {
    // SAFETY: every buffer is read during the call only.
    let code = with_buffers(labels, |ptr, len| unsafe {
        match (kind, op) {
            (MetricKind::Counter, _) => {
                envoy_dynamic_module_callback_http_filter_config_increment_counter(
                    config, id, ptr, len, value,
                )
            }
            (MetricKind::Gauge, MetricOp::Decrement) => {
                envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
                    config, id, ptr, len, value,
                )
            }
            (MetricKind::Gauge, _) => {
                envoy_dynamic_module_callback_http_filter_config_increment_gauge(
                    config, id, ptr, len, value,
                )
            }
            (MetricKind::Histogram, _) => {
                envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
                    config, id, ptr, len, value,
                )
            }
        }
    });
    code == METRICS_SUCCESS
}
