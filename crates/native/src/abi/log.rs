//! Writing to Envoy's log.

use super::{
    envoy_dynamic_module_callback_log, envoy_dynamic_module_callback_log_enabled, LogLevel,
    ModuleBuffer,
};

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
