//! An Envoy dynamic-module HTTP filter that does nothing: the hooks
//! Envoy 1.40 (ABI v0.2.0) requires, each returning Continue. The
//! configuration and every stream are the same static dummy object, so
//! no hook allocates; nothing here can panic.

use std::ffi::c_void;

/// `envoy_dynamic_module_type_envoy_buffer` (bytes Envoy owns).
#[repr(C)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

type EnvoyPtr = *mut c_void;
type ModulePtr = *const c_void;

const ABI_VERSION: &[u8] = b"v0.2.0\0";
const CONTINUE: u32 = 0;

/// What the configuration and stream pointers point at: never read.
static DUMMY: u8 = 0;

fn dummy() -> ModulePtr {
    std::ptr::addr_of!(DUMMY).cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    ABI_VERSION.as_ptr()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _envoy: EnvoyPtr,
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> ModulePtr {
    dummy()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(_config: ModulePtr) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    _config: ModulePtr,
    _filter: EnvoyPtr,
) -> ModulePtr {
    dummy()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _end: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _end: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _f: EnvoyPtr,
    _s: ModulePtr,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _end: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _end: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _f: EnvoyPtr,
    _s: ModulePtr,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_f: EnvoyPtr, _s: ModulePtr) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(_s: ModulePtr) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _id: u64,
    _result: u32,
    _headers: *const c_void,
    _headers_len: usize,
    _chunks: *const c_void,
    _chunks_len: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _id: u64,
    _headers: *const c_void,
    _n: usize,
    _end: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _id: u64,
    _data: *const c_void,
    _n: usize,
    _end: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _id: u64,
    _trailers: *const c_void,
    _n: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _f: EnvoyPtr,
    _s: ModulePtr,
    _event: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _f: EnvoyPtr,
    _s: ModulePtr,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _f: EnvoyPtr,
    _s: ModulePtr,
) {
}
