//! Callouts: a store call sent through an Envoy cluster on behalf of a
//! stream or of the configuration, and why Envoy refused one.

use super::headers::module_headers;
use super::{
    envoy_dynamic_module_callback_http_filter_config_http_callout,
    envoy_dynamic_module_callback_http_filter_http_callout, FilterPtr, ModuleBuffer,
    CALLOUT_INIT_SUCCESS,
};
use loopguard_core::host::StoreCall;

/// Why Envoy refused a callout (its
/// `envoy_dynamic_module_type_http_callout_init_result`).
fn refused(code: u32) -> String {
    match code {
        1 => "missing :method, :path or host".to_string(),
        2 => "no such cluster".to_string(),
        3 => "duplicate callout id".to_string(),
        4 => "cannot create the request (no healthy host?)".to_string(),
        n => format!("init result {n}"),
    }
}

/// Send `call` through an Envoy cluster on behalf of a stream (`owner` is
/// its filter; answered to the stream, on its worker) or, with
/// `from_config`, of the configuration (`owner` is its `ConfigPtr`; main
/// thread, answered there): the call's id, or why Envoy refused it.
pub fn callout(owner: FilterPtr, from_config: bool, call: &StoreCall) -> Result<u64, String> {
    let send = if from_config {
        envoy_dynamic_module_callback_http_filter_config_http_callout
    } else {
        envoy_dynamic_module_callback_http_filter_http_callout
    };
    let mut h = module_headers(&call.headers);
    let mut id = 0u64;
    // SAFETY: every buffer is read during the call only.
    let code = unsafe {
        send(
            owner,
            &mut id,
            ModuleBuffer::of(call.cluster.as_bytes()),
            h.as_mut_ptr(),
            h.len(),
            ModuleBuffer::of(&call.body),
            call.timeout_ms,
        )
    };
    if code == CALLOUT_INIT_SUCCESS {
        Ok(id)
    } else {
        Err(refused(code))
    }
}
