//! Schedulers: a stream's (its events come back on its worker thread) and
//! the configuration's (on the main thread), made, committed to and
//! deleted.

use super::{
    envoy_dynamic_module_callback_http_filter_config_scheduler_new,
    envoy_dynamic_module_callback_http_filter_scheduler_new, ConfigPtr, FilterPtr, SchedulerPtr,
};

// Committing to a scheduler (from any thread) and deleting one are Envoy's
// callbacks as they are, unsafe: the scheduler is live and not deleted
// concurrently, and it is deleted once, with no commit in flight.
pub use super::callbacks::{
    envoy_dynamic_module_callback_http_filter_config_scheduler_commit as config_scheduler_commit,
    envoy_dynamic_module_callback_http_filter_config_scheduler_delete as config_scheduler_delete,
    envoy_dynamic_module_callback_http_filter_scheduler_commit as scheduler_commit,
    envoy_dynamic_module_callback_http_filter_scheduler_delete as scheduler_delete,
};

/// A scheduler for a stream: commits come back as
/// `on_http_filter_scheduled` on its worker thread.
pub fn scheduler_new(filter: FilterPtr) -> Option<SchedulerPtr> {
    // SAFETY: on the stream's worker thread, in a hook.
    let s = unsafe { envoy_dynamic_module_callback_http_filter_scheduler_new(filter) };
    (!s.is_null()).then_some(s)
}

/// A scheduler for a configuration: commits come back as
/// `on_http_filter_config_scheduled` on the main thread.
pub fn config_scheduler_new(config: ConfigPtr) -> Option<SchedulerPtr> {
    // SAFETY: on the main thread, in the configuration hook.
    let s = unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_new(config) };
    (!s.is_null()).then_some(s)
}
