//! The part of Envoy's dynamic-module ABI loopguard uses, written from the
//! ABI header `source/extensions/dynamic_modules/abi/abi.h` as of Envoy
//! v1.40.0 (ABI v0.2.0) and checked against v1.39's (ABI v0.1.0; see
//! [`ABI_VERSION`]): its types, and the callbacks
//! Envoy exports, each wrapped in a function that takes Rust values and
//! reports failure as a value. Nothing here panics, and no Envoy pointer
//! outlives the hook that lent it (what Envoy owns is copied out).
//!
//! The hooks Envoy calls (`envoy_dynamic_module_on_*`) are in `hooks.rs`.
//!
//! This file holds the types and constants; `callbacks.rs` declares the
//! callbacks (with a stand-in for each in unit tests), and the
//! wrappers are grouped by what they touch: `log.rs`, `headers.rs`,
//! `body.rs`, `stream.rs` (a local reply, filter state, attributes and
//! metadata, resuming), `scheduler.rs`, `callout.rs` and `metrics.rs`.
#![allow(unsafe_code)]

// What precedes the version in `ABI_MARK`: the core's, which `loopguard
// check` reads.
use loopguard_core::host::NATIVE_ABI_MARK_PREFIX as ABI_MARK_PREFIX;
use std::ffi::c_void;

/// The ABI this build speaks, after a prefix that `loopguard check
/// --envoy` finds in the module's file (so a build for another release's
/// ABI is reported).
#[cfg(not(feature = "abi-v0-1-0"))]
const ABI_MARK: &[u8] = b"loopguard-dynamic-module-abi=v0.2.0\0";

/// Envoy 1.39's ABI (feature `abi-v0-1-0`; `make build ENVOY_VERSION=1.39`).
/// Its header (`abi.h` at `ENVOY_DYNAMIC_MODULES_ABI_VERSION "v0.1.0"`)
/// declares every type, enum value, hook and callback this module uses
/// exactly as v0.2.0's does: the bindings below serve both, and only the
/// version the module announces differs. Envoy 1.39 logs "Dynamic module
/// ABI version v0.1.0 matched"; nothing loopguard does degrades there.
#[cfg(feature = "abi-v0-1-0")]
const ABI_MARK: &[u8] = b"loopguard-dynamic-module-abi=v0.1.0\0";

/// The ABI version this module is built against (NUL-terminated),
/// returned to Envoy at load: Envoy 1.40 logs "Dynamic module ABI version
/// v0.2.0 matched".
pub const ABI_VERSION: &[u8] = ABI_MARK.split_at(ABI_MARK_PREFIX.len()).1;

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
        // SAFETY: Envoy promises `length` readable bytes at `ptr` for the
        // duration of the hook.
        unsafe { slice(self.ptr, self.length) }
    }
}

/// `n` items Envoy lent at `ptr` (none when it is null or `n` is 0).
///
/// # Safety
/// Unless null, `ptr` points to `n` items that live as long as `'a`.
pub unsafe fn slice<'a, T>(ptr: *const T, n: usize) -> &'a [T] {
    if ptr.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: the caller's guarantee.
        unsafe { std::slice::from_raw_parts(ptr, n) }
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

// Envoy's callbacks, as the module links them (stand-ins in unit tests).
mod callbacks;
use callbacks::*;

mod body;
mod callout;
mod headers;
mod log;
mod metrics;
mod scheduler;
mod stream;

pub use body::*;
pub use callout::*;
pub use headers::*;
pub use log::*;
pub use metrics::*;
pub use scheduler::*;
pub use stream::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_envoy_reads_is_the_mark_after_its_prefix() {
        assert!(ABI_MARK.starts_with(ABI_MARK_PREFIX.as_bytes()));
        assert!(ABI_VERSION.starts_with(b"v0."), "{ABI_VERSION:?}");
        assert_eq!(
            ABI_VERSION.iter().position(|&b| b == 0),
            Some(ABI_VERSION.len() - 1)
        );
    }
}
