//! Envoy's callbacks as a unit test sees them: none is available (every
//! lookup finds nothing, every change is refused), so the host's code
//! links and runs without Envoy.
#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

use super::{
    ConfigPtr, EnvoyBuffer, EnvoyHeader, FilterPtr, ModuleBuffer, ModuleHeader, SchedulerPtr,
};

pub unsafe fn envoy_dynamic_module_callback_log(_level: u32, _message: ModuleBuffer) {}

pub unsafe fn envoy_dynamic_module_callback_log_enabled(_level: u32) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_get_header(
    _filter: FilterPtr,
    _map: u32,
    _key: ModuleBuffer,
    _result: *mut EnvoyBuffer,
    _index: usize,
    _count: *mut usize,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_get_headers_size(
    _filter: FilterPtr,
    _map: u32,
) -> usize {
    0
}

pub unsafe fn envoy_dynamic_module_callback_http_get_headers(
    _filter: FilterPtr,
    _map: u32,
    _result: *mut EnvoyHeader,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_add_header(
    _filter: FilterPtr,
    _map: u32,
    _key: ModuleBuffer,
    _value: ModuleBuffer,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_set_header(
    _filter: FilterPtr,
    _map: u32,
    _key: ModuleBuffer,
    _value: ModuleBuffer,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_get_body_size(
    _filter: FilterPtr,
    _body: u32,
) -> usize {
    0
}

pub unsafe fn envoy_dynamic_module_callback_http_get_body_chunks_size(
    _filter: FilterPtr,
    _body: u32,
) -> usize {
    0
}

pub unsafe fn envoy_dynamic_module_callback_http_get_body_chunks(
    _filter: FilterPtr,
    _body: u32,
    _result: *mut EnvoyBuffer,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_append_body(
    _filter: FilterPtr,
    _body: u32,
    _data: ModuleBuffer,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_drain_body(
    _filter: FilterPtr,
    _body: u32,
    _bytes: usize,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_received_buffered_request_body(
    _filter: FilterPtr,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_send_response(
    _filter: FilterPtr,
    _status: u32,
    _headers: *mut ModuleHeader,
    _headers_len: usize,
    _body: ModuleBuffer,
    _details: ModuleBuffer,
) {
}

pub unsafe fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
    _filter: FilterPtr,
    _key: ModuleBuffer,
    _value: ModuleBuffer,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
    _filter: FilterPtr,
    _attribute: u32,
    _result: *mut EnvoyBuffer,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_get_metadata_string(
    _filter: FilterPtr,
    _source: u32,
    _namespace: ModuleBuffer,
    _key: ModuleBuffer,
    _result: *mut EnvoyBuffer,
) -> bool {
    false
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_continue_decoding(_filter: FilterPtr) {}
pub unsafe fn envoy_dynamic_module_callback_http_filter_continue_encoding(_filter: FilterPtr) {}

pub unsafe fn envoy_dynamic_module_callback_http_filter_scheduler_new(
    _filter: FilterPtr,
) -> SchedulerPtr {
    std::ptr::null_mut()
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
    _scheduler: SchedulerPtr,
    _event: u64,
) {
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_scheduler_delete(_scheduler: SchedulerPtr) {
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
    _config: ConfigPtr,
) -> SchedulerPtr {
    std::ptr::null_mut()
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
    _scheduler: SchedulerPtr,
    _event: u64,
) {
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
    _scheduler: SchedulerPtr,
) {
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_http_callout(
    _filter: FilterPtr,
    _id: *mut u64,
    _cluster: ModuleBuffer,
    _headers: *mut ModuleHeader,
    _headers_len: usize,
    _body: ModuleBuffer,
    _timeout_ms: u64,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_http_callout(
    _config: ConfigPtr,
    _id: *mut u64,
    _cluster: ModuleBuffer,
    _headers: *mut ModuleHeader,
    _headers_len: usize,
    _body: ModuleBuffer,
    _timeout_ms: u64,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_define_counter(
    _config: ConfigPtr,
    _name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _labels_len: usize,
    _id: *mut usize,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
    _config: ConfigPtr,
    _name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _labels_len: usize,
    _id: *mut usize,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
    _config: ConfigPtr,
    _name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _labels_len: usize,
    _id: *mut usize,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
    _config: ConfigPtr,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _labels_len: usize,
    _value: u64,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
    _config: ConfigPtr,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _labels_len: usize,
    _value: u64,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
    _config: ConfigPtr,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _labels_len: usize,
    _value: u64,
) -> u32 {
    1
}

pub unsafe fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
    _config: ConfigPtr,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _labels_len: usize,
    _value: u64,
) -> u32 {
    1
}
