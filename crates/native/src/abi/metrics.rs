//! Metrics: counters, gauges and histograms defined while the
//! configuration loads, and changed from any thread.

use super::{
    envoy_dynamic_module_callback_http_filter_config_decrement_gauge,
    envoy_dynamic_module_callback_http_filter_config_define_counter,
    envoy_dynamic_module_callback_http_filter_config_define_gauge,
    envoy_dynamic_module_callback_http_filter_config_define_histogram,
    envoy_dynamic_module_callback_http_filter_config_increment_counter,
    envoy_dynamic_module_callback_http_filter_config_increment_gauge,
    envoy_dynamic_module_callback_http_filter_config_record_histogram_value, ConfigPtr,
    ModuleBuffer, METRICS_SUCCESS,
};
use loopguard_core::host::Kind;

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

/// Define a metric (only while the configuration loads); its id.
pub fn define_metric(config: ConfigPtr, kind: Kind, name: &str, labels: &[&str]) -> Option<usize> {
    let mut id = 0usize;
    let name = ModuleBuffer::of(name.as_bytes());
    let define = match kind {
        Kind::Counter => envoy_dynamic_module_callback_http_filter_config_define_counter,
        Kind::Gauge => envoy_dynamic_module_callback_http_filter_config_define_gauge,
        Kind::Histogram => envoy_dynamic_module_callback_http_filter_config_define_histogram,
    };
    // SAFETY: every buffer is read during the call only.
    let code = with_buffers(labels, |ptr, len| unsafe {
        define(config, name, ptr, len, &mut id)
    });
    (code == METRICS_SUCCESS).then_some(id)
}

/// Change a metric (any thread: Envoy's stats are atomic): add `value` to
/// a counter or gauge (with `down`, take it from a gauge), or record it
/// into a histogram. `labels` are the values of a labelled metric's
/// labels, in order (empty otherwise).
pub fn metric(
    config: ConfigPtr,
    kind: Kind,
    id: usize,
    labels: &[&str],
    down: bool,
    value: u64,
) -> bool {
    let change = match (kind, down) {
        (Kind::Counter, _) => envoy_dynamic_module_callback_http_filter_config_increment_counter,
        (Kind::Gauge, true) => envoy_dynamic_module_callback_http_filter_config_decrement_gauge,
        (Kind::Gauge, _) => envoy_dynamic_module_callback_http_filter_config_increment_gauge,
        (Kind::Histogram, _) => {
            envoy_dynamic_module_callback_http_filter_config_record_histogram_value
        }
    };
    // SAFETY: every buffer is read during the call only.
    let code = with_buffers(labels, |ptr, len| unsafe {
        change(config, id, ptr, len, value)
    });
    code == METRICS_SUCCESS
}
