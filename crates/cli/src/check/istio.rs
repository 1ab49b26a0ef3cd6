//! Istio setups: the WasmPlugin, EnvoyFilters anchored on it, VirtualService routes.

use super::envoy::{filter_type, is_buffer};
use super::{bodies_matter, quoted_list, warns_upstream, Report};
use crate::discover::{Found, HEADER_MUTATION_TYPE};
use crate::documents::Document;
use loopguard_core::config::Config;
use serde_json::Value;

/// The HTTP filter (and ECDS resource) name istiod gives a WasmPlugin:
/// Istio 1.26-1.29, then 1.30 and later.
pub fn istio_filter_names(ns: &str, name: &str) -> [String; 2] {
    [
        format!("extensions.istio.io/wasmplugin/{ns}.{name}"),
        format!("extensions.istio.io/trafficextension/{ns}.{name}~istio-translated-wasmplugin"),
    ]
}

pub(super) fn istio_setup(r: &mut Report, docs: &[Document], f: &Found<'_>, cfg: &Config) {
    let loc = f.location();
    let spec = f.doc.value.get("spec").cloned().unwrap_or(Value::Null);
    if cfg.hold_request_headers {
        r.error(&loc, "hold_request_headers needs the Wasm filter's allow_on_headers_stop_iteration, which a WasmPlugin cannot set: remove it and insert the buffer filter after the plugin with an EnvoyFilter");
    }
    match spec.get("failStrategy").and_then(Value::as_str) {
        Some("FAIL_RELOAD") | Some("FAIL_OPEN") => {}
        other => r.warn(&loc, format!("failStrategy is {}: a VM crash makes the proxy answer 503 to every later request on that worker; FAIL_RELOAD (Istio 1.27+) reloads the VM", other.unwrap_or("unset (FAIL_CLOSE)"))),
    }
    let names = istio_filter_names(f.doc.namespace(), f.doc.name());
    if bodies_matter(cfg) {
        let patches = envoy_filter_patches(docs);
        let buffered = patches.iter().any(|(_, p)| {
            names.contains(&p.anchor) && p.operation == "INSERT_AFTER" && is_buffer(p.value)
        });
        let mutated = patches
            .iter()
            .any(|(_, p)| filter_type(p.value) == HEADER_MUTATION_TYPE);
        if buffered && warns_upstream(cfg) && !mutated {
            r.warn(&loc, "a policy warns or nudges, but no EnvoyFilter in the files checked adds the header_mutation filter that copies loopguard's x-loopguard-* headers into requests with a body: the upstream sees them only on body-less requests");
        }
        if !buffered {
            r.warn(&loc, format!("no EnvoyFilter in the files checked inserts envoy.filters.http.buffer right after this plugin's filter (INSERT_AFTER on subFilter \"{}\" for Istio 1.26-1.29, \"{}\" from 1.30): the upstream would receive the headers of a request before loopguard has judged its body", names[0], names[1]));
        }
    }
    super::budget::mesh_session_header_lints(r, &loc, cfg, docs);
    let services: Vec<&Document> = docs
        .iter()
        .filter(|d| d.kind() == Some("VirtualService"))
        .collect();
    if !services.is_empty() {
        let mut routes: Vec<String> = Vec::new();
        for vs in services {
            for http in vs
                .value
                .pointer("/spec/http")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let base = http.get("name").and_then(Value::as_str).unwrap_or("");
                let matches = http.get("match").and_then(Value::as_array);
                match matches {
                    Some(ms) if !ms.is_empty() => {
                        for m in ms {
                            match m.get("name").and_then(Value::as_str) {
                                Some(mn) if !mn.is_empty() => routes.push(format!("{base}.{mn}")),
                                _ => routes.push(base.to_string()),
                            }
                        }
                    }
                    _ => routes.push(base.to_string()),
                }
            }
        }
        for p in &cfg.policies {
            let missing: Vec<&String> = p
                .selector
                .routes
                .iter()
                .filter(|n| !routes.contains(n))
                .collect();
            if !missing.is_empty() {
                r.warn(&loc, format!("policy \"{}\": selector.routes lists {}, but no VirtualService route in the files checked is named so (Istio names a route after http[].name, plus \".<match name>\" when the match has one)", p.id, quoted_list(&missing)));
            }
        }
    }
}

struct Patch<'a> {
    anchor: String,
    operation: String,
    value: &'a Value,
}

fn envoy_filter_patches(docs: &[Document]) -> Vec<(&Document, Patch<'_>)> {
    let mut out = Vec::new();
    for d in docs.iter().filter(|d| d.kind() == Some("EnvoyFilter")) {
        for p in d
            .value
            .pointer("/spec/configPatches")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(anchor) = p
                .pointer("/match/listener/filterChain/filter/subFilter/name")
                .and_then(Value::as_str)
            else {
                continue;
            };
            out.push((
                d,
                Patch {
                    anchor: anchor.to_string(),
                    operation: p
                        .pointer("/patch/operation")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    value: p.pointer("/patch/value").unwrap_or(&Value::Null),
                },
            ));
        }
    }
    out
}

/// EnvoyFilters anchored on a WasmPlugin filter name that no WasmPlugin
/// in the files produces: Istio drops such patches without a word.
pub(super) fn envoy_filter_anchors(r: &mut Report, docs: &[Document]) {
    let plugins: Vec<&Document> = docs
        .iter()
        .filter(|d| d.kind() == Some("WasmPlugin"))
        .collect();
    let known: Vec<String> = plugins
        .iter()
        .flat_map(|d| istio_filter_names(d.namespace(), d.name()))
        .collect();
    for (d, p) in envoy_filter_patches(docs) {
        if !p.anchor.starts_with("extensions.istio.io/") {
            continue;
        }
        let loc = format!("{} ({})", d.file, d.describe());
        let well_formed = p.anchor.starts_with("extensions.istio.io/wasmplugin/")
            || (p
                .anchor
                .starts_with("extensions.istio.io/trafficextension/")
                && p.anchor.ends_with("~istio-translated-wasmplugin"));
        if !well_formed {
            r.warn(&loc, format!("subFilter \"{}\" is not a name istiod gives a WasmPlugin's filter (extensions.istio.io/wasmplugin/<ns>.<name> in Istio 1.26-1.29, extensions.istio.io/trafficextension/<ns>.<name>~istio-translated-wasmplugin from 1.30): the patch would silently do nothing", p.anchor));
        } else if !plugins.is_empty() && !known.contains(&p.anchor) {
            r.warn(&loc, format!("subFilter \"{}\" matches none of the WasmPlugins in the files checked ({}): Istio would drop this patch silently", p.anchor, known.join(", ")));
        }
    }
}
