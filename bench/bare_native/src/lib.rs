//! The bare detector as an Envoy dynamic module (ABI v0.2.0, Envoy 1.40):
//! fingerprint = SHA-256(method, path, authorization), one key per
//! fingerprint in a process-wide table holding a count, updated with
//! compare-and-swap, as bench/bare does against Envoy's shared data
//! (get copies the value and its cas out under the lock; set writes only
//! if the cas still matches, under the lock again).
//!
//! Nothing here panics (the profile aborts on panic, so a panic must not
//! be possible): no indexing, no unwrap; a poisoned lock cannot happen
//! with panic = "abort", and is treated as "skip" anyway.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// `envoy_dynamic_module_type_envoy_buffer` (bytes Envoy owns).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// `envoy_dynamic_module_type_module_buffer` (bytes the module owns).
#[repr(C)]
pub struct ModuleBuffer {
    ptr: *const u8,
    length: usize,
}

type EnvoyPtr = *mut c_void;
type ModulePtr = *const c_void;

const ABI_VERSION: &[u8] = b"v0.2.0\0";
const CONTINUE: u32 = 0;
const REQUEST_HEADERS: u32 = 0;

extern "C" {
    fn envoy_dynamic_module_callback_http_get_header(
        filter: EnvoyPtr,
        map: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        count: *mut usize,
    ) -> bool;
}

/// What the configuration and stream pointers point at: never read.
static DUMMY: u8 = 0;

fn dummy() -> ModulePtr {
    std::ptr::addr_of!(DUMMY).cast()
}

/// The shared-data twin: key -> (value, cas), one lock for all, and a
/// process-wide cas counter (as Envoy's SharedData).
struct Shared {
    map: Mutex<HashMap<String, (Vec<u8>, u32)>>,
    next_cas: AtomicU32,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        map: Mutex::new(HashMap::new()),
        next_cas: AtomicU32::new(1),
    })
}

impl Shared {
    /// A copy of the value and its cas (0: no such key).
    fn get(&self, key: &str) -> Option<(Option<Vec<u8>>, u32)> {
        let map = self.map.lock().ok()?;
        Some(match map.get(key) {
            Some((v, cas)) => (Some(v.clone()), *cas),
            None => (None, 0),
        })
    }

    /// Write if `cas` is 0 or still the key's; false on a mismatch.
    fn set(&self, key: &str, value: &[u8], cas: u32) -> bool {
        let Ok(mut map) = self.map.lock() else {
            return false;
        };
        if let Some((_, current)) = map.get(key) {
            if cas != 0 && cas != *current {
                return false;
            }
        }
        let next = self
            .next_cas
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            .max(1);
        map.insert(key.to_string(), (value.to_vec(), next));
        true
    }
}

/// The first value of a request header, in place in Envoy's map.
///
/// # Safety
/// `filter` is the stream of the current hook; the slice is used before
/// the hook returns.
unsafe fn header<'a>(filter: EnvoyPtr, name: &str) -> Option<&'a [u8]> {
    let mut out = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
    let key = ModuleBuffer {
        ptr: name.as_ptr(),
        length: name.len(),
    };
    let found = envoy_dynamic_module_callback_http_get_header(
        filter,
        REQUEST_HEADERS,
        key,
        &mut out,
        0,
        std::ptr::null_mut(),
    );
    if !found || out.ptr.is_null() {
        return None;
    }
    Some(std::slice::from_raw_parts(out.ptr, out.length))
}

fn count(filter: EnvoyPtr) {
    let mut h = Sha256::new();
    for name in [":method", ":path", "authorization"] {
        // SAFETY: the slice is hashed before this hook returns.
        if let Some(v) = unsafe { header(filter, name) } {
            h.update((v.len() as u32).to_le_bytes());
            h.update(v);
        }
    }
    let digest = h.finalize();
    // The key as bench/bare makes it: the first 16 bytes in hex.
    let key: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let store = shared();
    for _ in 0..8 {
        let Some((value, cas)) = store.get(&key) else {
            break;
        };
        let count = value
            .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
            .map_or(0, u32::from_le_bytes);
        let next = count.wrapping_add(1).to_le_bytes();
        if store.set(&key, &next, cas) {
            break;
        }
    }
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
    f: EnvoyPtr,
    _s: ModulePtr,
    _end: bool,
) -> u32 {
    count(f);
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
