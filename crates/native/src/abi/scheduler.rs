//! Schedulers: a stream's (its events come back on its worker thread) and
//! the configuration's (on the main thread), made, committed to and
//! deleted.

use super::{
    envoy_dynamic_module_callback_http_filter_config_scheduler_commit,
    envoy_dynamic_module_callback_http_filter_config_scheduler_delete,
    envoy_dynamic_module_callback_http_filter_config_scheduler_new,
    envoy_dynamic_module_callback_http_filter_scheduler_commit,
    envoy_dynamic_module_callback_http_filter_scheduler_delete,
    envoy_dynamic_module_callback_http_filter_scheduler_new, ConfigPtr, FilterPtr, SchedulerPtr,
};

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
