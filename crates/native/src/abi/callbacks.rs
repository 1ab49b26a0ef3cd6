//! The callbacks Envoy exports that loopguard calls, declared once as the
//! ABI header has them. A build for Envoy links them; a unit test, which
//! runs without Envoy, gets a stand-in for each that finds nothing and
//! refuses every change (`false`, `0`, a null pointer, or status 1).

use super::{
    ConfigPtr, EnvoyBuffer, EnvoyHeader, FilterPtr, ModuleBuffer, ModuleHeader, SchedulerPtr,
};

/// Declares each callback (callbacks of one signature share its
/// declaration: `pub fn a | b(...)`) as an `extern "C"` import, or, in unit
/// tests, as a stand-in returning [`Absent::ABSENT`].
macro_rules! callbacks {
    ($(pub fn $($name:ident)|+ ($($args:tt)*) $(-> $ret:ty)?;)*) => {
        $(callbacks!(@names [$($name)+] ($($args)*) [$($ret)?]);)*
    };
    (@names [$($name:ident)+] $args:tt $ret:tt) => {
        $(callbacks!(@one $name $args $ret);)+
    };
    (@one $name:ident ($($arg:ident: $ty:ty),* $(,)?) [$($ret:ty)?]) => {
        #[cfg(not(test))]
        extern "C" {
            pub fn $name($($arg: $ty),*) $(-> $ret)?;
        }
        #[cfg(test)]
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
        pub unsafe fn $name($(_: $ty),*) $(-> $ret)? {
            Absent::ABSENT
        }
    };
}

/// What a callback answers when there is no Envoy.
#[cfg(test)]
trait Absent {
    const ABSENT: Self;
}

#[cfg(test)]
impl Absent for () {
    const ABSENT: Self = ();
}

#[cfg(test)]
impl Absent for bool {
    const ABSENT: Self = false;
}

#[cfg(test)]
impl Absent for usize {
    const ABSENT: Self = 0;
}

/// A status: 1 is an error in every status enum the callbacks return.
#[cfg(test)]
impl Absent for u32 {
    const ABSENT: Self = 1;
}

#[cfg(test)]
impl<T> Absent for *mut T {
    const ABSENT: Self = std::ptr::null_mut();
}

callbacks! {
    pub fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
    pub fn envoy_dynamic_module_callback_log_enabled(level: u32) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterPtr,
        map: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        count: *mut usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterPtr,
        map: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterPtr,
        map: u32,
        result: *mut EnvoyHeader,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_add_header
        | envoy_dynamic_module_callback_http_set_header(
        filter: FilterPtr,
        map: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_body_size(filter: FilterPtr, body: u32) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterPtr,
        body: u32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterPtr,
        body: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterPtr,
        body: u32,
        data: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterPtr,
        body: u32,
        bytes: usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        filter: FilterPtr,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterPtr,
        status: u32,
        headers: *mut ModuleHeader,
        headers_len: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    pub fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: FilterPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterPtr,
        attribute: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: FilterPtr,
        source: u32,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding
        | envoy_dynamic_module_callback_http_filter_continue_encoding(filter: FilterPtr);
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new
        | envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        filter_or_config: FilterPtr,
    ) -> SchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit
        | envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        scheduler: SchedulerPtr,
        event: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete
        | envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
        scheduler: SchedulerPtr,
    );
    pub fn envoy_dynamic_module_callback_http_filter_http_callout
        | envoy_dynamic_module_callback_http_filter_config_http_callout(
        filter_or_config: FilterPtr,
        id: *mut u64,
        cluster: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_len: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter
        | envoy_dynamic_module_callback_http_filter_config_define_gauge
        | envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: ConfigPtr,
        name: ModuleBuffer,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        id: *mut usize,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter
        | envoy_dynamic_module_callback_http_filter_config_increment_gauge
        | envoy_dynamic_module_callback_http_filter_config_decrement_gauge
        | envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
        config: ConfigPtr,
        id: usize,
        labels: *mut ModuleBuffer,
        labels_len: usize,
        value: u64,
    ) -> u32;
}
