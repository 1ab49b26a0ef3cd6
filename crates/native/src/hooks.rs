//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`, signatures
//! from the v1.40.0 ABI header). Each one only finds its configuration or
//! stream and hands over; each runs inside [`guard`], so a panic never
//! crosses into Envoy: it fails the one request it happened in (a 500 on
//! the request path) and the stream is left alone from then on.
#![allow(unsafe_code, clippy::not_unsafe_ptr_arg_deref)]

use crate::abi::{self, ConfigPtr, EnvoyBuffer, EnvoyHeader, FilterPtr, LogLevel};
use crate::config::FilterConfig;
use crate::stream::Stream;
use crate::worker;
use loopguard_core::host::{CallReply, LocalReply, Step};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

type ConfigModule = *const c_void;
type StreamModule = *const c_void;

/// Run `f`; on a panic, `on_panic` (what the request becomes).
fn guard<T>(f: impl FnOnce() -> T, on_panic: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| on_panic())
}

/// The stream behind Envoy's module pointer.
///
/// # Safety
/// `p` came from [`envoy_dynamic_module_on_http_filter_new`] and is not
/// destroyed; Envoy calls a stream's hooks on one thread, one at a time.
unsafe fn stream<'a>(p: StreamModule) -> Option<&'a mut Stream> {
    // SAFETY: the caller's guarantee.
    unsafe { (p as *mut Stream).as_mut() }
}

/// A panic on the request path: the request gets a 500, the stream is
/// left alone from then on.
fn fail_request(p: StreamModule) {
    // SAFETY: as in `stream`.
    if let Some(s) = unsafe { stream(p) }.filter(|s| !s.failed) {
        s.failed = true;
        let reply = LocalReply {
            status: 500,
            headers: vec![("content-type", "text/plain".to_string())],
            body: "loopguard: internal error\n".to_string(),
        };
        abi::send_response(s.filter, &reply, "loopguard_panic");
    }
}

/// A panic outside the request path: the stream is left alone.
fn poison(p: StreamModule) {
    // SAFETY: as in `stream`.
    if let Some(s) = unsafe { stream(p) } {
        s.failed = true;
    }
}

/// Run `f` on the stream behind `s` (`idle` without one); on a panic,
/// `on_panic(s)`, and the hook answers `failed`.
fn on_stream<T>(
    s: StreamModule,
    idle: T,
    failed: T,
    on_panic: fn(StreamModule),
    f: impl FnOnce(&mut Stream) -> T,
) -> T {
    guard(
        // SAFETY (all stream hooks): Envoy's module pointer for a live stream.
        || unsafe { stream(s) }.map_or(idle, f),
        || {
            on_panic(s);
            failed
        },
    )
}

/// Run `f` on the configuration behind `p`; a panic fails nothing.
fn on_config(p: ConfigModule, f: impl FnOnce(&FilterConfig)) {
    guard(
        // SAFETY: a live configuration (Envoy drops events for gone ones).
        || unsafe { (p as *const Arc<FilterConfig>).as_ref() }.map_or((), |c| f(c)),
        || (),
    )
}

/// A hook's status for a step: `go` on, or `stop`.
fn status(step: Step, go: u32, stop: u32) -> u32 {
    match step {
        Step::Continue => go,
        Step::Pause => stop,
    }
}

/// A request hook: `f`'s step as `go` or `stop` (`go` without a stream);
/// a panic fails the request, which stops.
fn request_hook(s: StreamModule, go: u32, stop: u32, f: impl FnOnce(&mut Stream) -> Step) -> u32 {
    on_stream(s, go, stop, fail_request, |s| status(f(s), go, stop))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    std::panic::set_hook(Box::new(|info| {
        abi::log(LogLevel::Critical, &format!("loopguard panicked: {info}"));
    }));
    abi::ABI_VERSION.as_ptr()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    envoy: ConfigPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ConfigModule {
    guard(
        || {
            // SAFETY: Envoy's buffers, read during this hook.
            let (name, json) = unsafe { (name.bytes(), config.bytes()) };
            match FilterConfig::new(envoy, name, json) {
                Ok(c) => {
                    abi::log(LogLevel::Info, &format!("loopguard: {}", c.summary));
                    Box::into_raw(Box::new(Arc::new(c))) as ConfigModule
                }
                Err(message) => {
                    let line = format!("loopguard: invalid configuration: {message}");
                    abi::log(LogLevel::Error, &line);
                    std::ptr::null()
                }
            }
        },
        std::ptr::null,
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: ConfigModule) {
    guard(
        || {
            if !config.is_null() {
                // SAFETY: made by `config_new`, destroyed once by Envoy.
                let c = unsafe { Box::from_raw(config as *mut Arc<FilterConfig>) };
                c.alive.store(false, std::sync::atomic::Ordering::Release);
                // No more ticks through the configuration's scheduler.
                for w in c.worker_ids() {
                    crate::timer::stop(w);
                }
            }
        },
        || (),
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _envoy: ConfigPtr,
    config: ConfigModule,
    event: u64,
) {
    on_config(config, |c| c.on_main(event))
}

/// `:status` and the body of a callout's answer (`None`: no answer).
///
/// # Safety
/// The arrays are Envoy's, valid during the hook.
unsafe fn reply(
    result: u32,
    headers: *const EnvoyHeader,
    n: usize,
    chunks: *const EnvoyBuffer,
    m: usize,
) -> CallReply {
    if result != abi::CALLOUT_SUCCESS {
        return CallReply::default();
    }
    // SAFETY: the caller's guarantee; null or empty arrays read as none.
    unsafe {
        let status = abi::slice(headers, n)
            .iter()
            .find(|h| h.key.bytes() == b":status")
            .map(|h| String::from_utf8_lossy(h.value.bytes()).into_owned());
        let mut body = Vec::new();
        for c in abi::slice(chunks, m) {
            body.extend_from_slice(c.bytes());
        }
        CallReply { status, body }
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _envoy: ConfigPtr,
    config: ConfigModule,
    callout: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_len: usize,
    chunks: *const EnvoyBuffer,
    chunks_len: usize,
) {
    on_config(config, |c| {
        // SAFETY: Envoy's arrays, during this hook.
        let r = unsafe { reply(result, headers, headers_len, chunks, chunks_len) };
        c.answered(callout, r);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ConfigModule,
    filter: FilterPtr,
) -> StreamModule {
    // Never null (Envoy would call the other hooks with it anyway): a
    // stream without an engine passes everything.
    let make = || {
        // SAFETY: a live configuration (it outlives its streams).
        let w =
            unsafe { (config as *const Arc<FilterConfig>).as_ref() }.and_then(worker::for_config);
        Box::into_raw(Box::new(Stream::new(w, filter))) as StreamModule
    };
    guard(make, || {
        Box::into_raw(Box::new(Stream::new(None, filter))) as StreamModule
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _f: FilterPtr,
    s: StreamModule,
    end_of_stream: bool,
) -> u32 {
    request_hook(s, abi::HEADERS_CONTINUE, abi::HEADERS_STOP_ITERATION, |s| {
        s.on_request_headers(end_of_stream)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _f: FilterPtr,
    s: StreamModule,
    end_of_stream: bool,
) -> u32 {
    request_hook(s, abi::BODY_CONTINUE, abi::BODY_STOP_AND_BUFFER, |s| {
        s.on_request_body(end_of_stream)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _f: FilterPtr,
    s: StreamModule,
) -> u32 {
    request_hook(
        s,
        abi::TRAILERS_CONTINUE,
        abi::TRAILERS_STOP_ITERATION,
        Stream::on_request_trailers,
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    _f: FilterPtr,
    s: StreamModule,
    _end_of_stream: bool,
) -> u32 {
    on_stream(s, (), (), poison, Stream::on_response_headers);
    abi::HEADERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    _f: FilterPtr,
    s: StreamModule,
    end_of_stream: bool,
) -> u32 {
    // A paused last chunk is resumed when the shared store has the spending.
    let (go, stop) = (abi::BODY_CONTINUE, abi::BODY_STOP_AND_BUFFER);
    on_stream(s, go, go, poison, |s| {
        status(s.on_response_body(end_of_stream), go, stop)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _f: FilterPtr,
    _s: StreamModule,
) -> u32 {
    abi::TRAILERS_CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _f: FilterPtr,
    s: StreamModule,
) {
    // Inside the stream's own event (a local reply ends it at once): run
    // when that event is over, not now.
    if crate::reentry::completes_later(s as usize) {
        return;
    }
    on_stream(s, (), (), poison, Stream::on_complete)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(s: StreamModule) {
    guard(
        || {
            if !s.is_null() {
                // SAFETY: made by `filter_new`, destroyed once by Envoy.
                unsafe { Box::from_raw(s as *mut Stream) }.close();
            }
        },
        || (),
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _f: FilterPtr,
    s: StreamModule,
    callout: u64,
    result: u32,
    headers: *const EnvoyHeader,
    headers_len: usize,
    chunks: *const EnvoyBuffer,
    chunks_len: usize,
) {
    on_stream(s, (), (), fail_request, |s| {
        // SAFETY: Envoy's arrays, during this hook.
        let r = unsafe { reply(result, headers, headers_len, chunks, chunks_len) };
        s.on_store_reply(callout, r);
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _f: FilterPtr,
    s: StreamModule,
    event: u64,
) {
    // A tick this stream only carried fails no request.
    let on_panic = if event == crate::timer::TICK_EVENT {
        poison
    } else {
        fail_request
    };
    on_stream(s, (), (), on_panic, |s| s.on_scheduled(event))
}

// Hooks Envoy requires but loopguard has no use for: streamed callouts,
// write-buffer watermarks, per-route configuration (policies are chosen
// inside the filter, by route name or route metadata).

/// Hooks that do nothing, by name and argument types.
macro_rules! unused_hooks {
    ($($name:ident($($arg:ty),*);)*) => {$(
        #[no_mangle]
        pub extern "C" fn $name($(_: $arg),*) {}
    )*};
}

unused_hooks! {
    envoy_dynamic_module_on_http_filter_http_stream_headers(FilterPtr, StreamModule, u64, *const EnvoyHeader, usize, bool);
    envoy_dynamic_module_on_http_filter_http_stream_data(FilterPtr, StreamModule, u64, *const EnvoyBuffer, usize, bool);
    envoy_dynamic_module_on_http_filter_http_stream_trailers(FilterPtr, StreamModule, u64, *const EnvoyHeader, usize);
    envoy_dynamic_module_on_http_filter_http_stream_complete(FilterPtr, StreamModule, u64);
    envoy_dynamic_module_on_http_filter_http_stream_reset(FilterPtr, StreamModule, u64, u32);
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(FilterPtr, StreamModule);
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(FilterPtr, StreamModule);
    envoy_dynamic_module_on_http_filter_per_route_config_destroy(*const c_void);
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    abi::log(
        LogLevel::Error,
        "loopguard: per-route filter configuration is not used; choose policies by route name or route metadata (filter_metadata.loopguard.policy)",
    );
    std::ptr::null()
}
