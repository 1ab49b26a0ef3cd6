//! Envoy Gateway setups: the EnvoyExtensionPolicy, request buffering and order, HTTPRoutes.

use super::{bodies_matter, Report, BUFFER_FILTER};
use crate::discover::Found;
use crate::documents::Document;
use loopguard_core::config::Config;
use serde_json::Value;

/// The filter types Envoy Gateway orders loopguard's filter by.
pub(super) const WASM_FILTER: &str = "envoy.filters.http.wasm";
pub(super) const DYNAMIC_MODULES_FILTER: &str = "envoy.filters.http.dynamic_modules";

pub(super) fn gateway_setup(
    r: &mut Report,
    docs: &[Document],
    f: &Found<'_>,
    index: usize,
    cfg: &Config,
) {
    let loc = f.location();
    let entry = f
        .doc
        .value
        .pointer(&format!("/spec/wasm/{index}"))
        .cloned()
        .unwrap_or(Value::Null);
    if cfg.hold_request_headers {
        r.error(&loc, "hold_request_headers needs the Wasm filter's allow_on_headers_stop_iteration, which Envoy Gateway cannot set: remove it, buffer requests with a BackendTrafficPolicy requestBuffer and move the buffer filter after wasm with EnvoyProxy filterOrder");
    }
    if entry.get("failOpen").and_then(Value::as_bool) != Some(true) {
        r.warn(&loc, format!("spec.wasm[{index}].failOpen is not true: Envoy Gateway then runs the filter FAIL_CLOSED, so a VM crash answers 503 to every later request on that worker until Envoy restarts (Envoy Gateway cannot set FAIL_RELOAD)"));
    }
    if bodies_matter(cfg) {
        if !has_request_buffer(docs) {
            r.warn(&loc, "no BackendTrafficPolicy with spec.requestBuffer in the files checked: without the buffer filter the upstream receives the headers of a request before loopguard has judged its body");
        } else if !buffer_moved_after(docs, WASM_FILTER) {
            r.warn(&loc, "Envoy Gateway runs the buffer filter before wasm by default: add an EnvoyProxy with spec.filterOrder [{name: envoy.filters.http.buffer, after: envoy.filters.http.wasm}] (Envoy Gateway 1.6+), else the upstream sees requests loopguard rejects");
        }
    }
    super::budget::mesh_session_header_lints(r, &loc, cfg, docs);
    target_ref_lints(r, docs, f.doc, &loc);
}

/// Whether some BackendTrafficPolicy in the files buffers requests.
pub(super) fn has_request_buffer(docs: &[Document]) -> bool {
    docs.iter().any(|d| {
        d.kind() == Some("BackendTrafficPolicy") && d.value.pointer("/spec/requestBuffer").is_some()
    })
}

/// Whether some EnvoyProxy's filterOrder moves the buffer filter after the
/// filters of type `after`.
pub(super) fn buffer_moved_after(docs: &[Document], after: &str) -> bool {
    docs.iter().any(|d| {
        d.kind() == Some("EnvoyProxy")
            && d.value
                .pointer("/spec/filterOrder")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|o| {
                    o.get("name").and_then(Value::as_str) == Some(BUFFER_FILTER)
                        && o.get("after").and_then(Value::as_str) == Some(after)
                })
    })
}

/// The policy's targetRefs against the HTTPRoutes in the files.
pub(super) fn target_ref_lints(r: &mut Report, docs: &[Document], policy: &Document, loc: &str) {
    let routes: Vec<&str> = docs
        .iter()
        .filter(|d| matches!(d.kind(), Some("HTTPRoute") | Some("AIGatewayRoute")))
        .map(|d| d.name())
        .collect();
    if routes.is_empty() {
        return;
    }
    for t in policy
        .value
        .pointer("/spec/targetRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if t.get("kind").and_then(Value::as_str) != Some("HTTPRoute") {
            continue;
        }
        let name = t.get("name").and_then(Value::as_str).unwrap_or("");
        if !routes.contains(&name) {
            r.warn(loc, format!("targetRefs names HTTPRoute \"{name}\", which is not among the HTTPRoutes (or AIGatewayRoutes, whose HTTPRoute has the same name) in the files checked"));
        }
    }
}
