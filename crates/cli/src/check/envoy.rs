//! Envoy configurations around the loopguard filter (Wasm, or the native
//! module: native.rs): flags, buffer filter, limits, clusters.

use super::routes::{mcp_route_lints, route_lints};
use super::{bodies_matter, warns_upstream, Report, BUFFER_FILTER};
use crate::discover::{Found, BUFFER_TYPE, HCM_TYPE, HEADER_MUTATION_TYPE};
use crate::documents::Document;
use loopguard_core::act::hold::HOLD_PROBE_MS;
use loopguard_core::config::Config;
use serde_json::Value;

/// Envoy's default `per_connection_buffer_limit_bytes`.
const ENVOY_DEFAULT_BUFFER_LIMIT: u64 = 1 << 20;

/// An HTTP connection manager: its filters, its inline routes (`None` when
/// they come from RDS), and its listener's buffer limit.
struct Hcm<'a> {
    /// The connection manager's configuration.
    config: &'a Value,
    filters: Vec<&'a Value>,
    routes: Option<Vec<&'a Value>>,
    buffer_limit: Option<u64>,
}

pub(super) fn has_hcm(v: &Value) -> bool {
    let mut found = Vec::new();
    hcms_in(v, None, &mut found);
    !found.is_empty()
}

fn hcms_in<'a>(v: &'a Value, limit: Option<u64>, out: &mut Vec<Hcm<'a>>) {
    match v {
        Value::Object(o) => {
            let limit = if o.contains_key("filter_chains") {
                o.get("per_connection_buffer_limit_bytes")
                    .and_then(Value::as_u64)
            } else {
                limit
            };
            if o.get("@type").and_then(Value::as_str) == Some(HCM_TYPE) {
                let filters = o
                    .get("http_filters")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().collect())
                    .unwrap_or_default();
                let routes = o.get("route_config").map(|rc| {
                    rc.get("virtual_hosts")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .filter_map(|vh| vh.get("routes").and_then(Value::as_array))
                        .flatten()
                        .collect()
                });
                out.push(Hcm {
                    config: v,
                    filters,
                    routes,
                    buffer_limit: limit,
                });
                return;
            }
            for value in o.values() {
                hcms_in(value, limit, out);
            }
        }
        Value::Array(a) => {
            for value in a {
                hcms_in(value, limit, out);
            }
        }
        _ => {}
    }
}

fn filter_name(f: &Value) -> &str {
    f.get("name").and_then(Value::as_str).unwrap_or("")
}

pub(super) fn filter_type(f: &Value) -> &str {
    f.pointer("/typed_config/@type")
        .and_then(Value::as_str)
        .unwrap_or("")
}

pub(super) fn is_buffer(f: &Value) -> bool {
    filter_type(f) == BUFFER_TYPE || filter_name(f) == BUFFER_FILTER
}

pub(super) fn envoy_setup(
    r: &mut Report,
    docs: &[Document],
    f: &Found<'_>,
    filter: &str,
    plugin: &Value,
    cfg: &Config,
) {
    let loc = f.location();
    let flag = plugin
        .get("allow_on_headers_stop_iteration")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if cfg.hold_request_headers && !flag {
        r.error(
            &loc,
            format!(
                "hold_request_headers is set but the Wasm filter's config lacks allow_on_headers_stop_iteration: true (Envoy 1.35+): Envoy would not deliver the bodies of held requests, so loopguard would release the first one after {HOLD_PROBE_MS} ms and stop holding"
            ),
        );
    }
    if flag && !cfg.hold_request_headers {
        r.warn(
            &loc,
            "allow_on_headers_stop_iteration is set but the configuration lacks \"hold_request_headers\": true: loopguard does not hold request headers and needs the buffer filter after it",
        );
    }
    match plugin.get("failure_policy").and_then(Value::as_str) {
        Some("FAIL_RELOAD") | Some("FAIL_OPEN") => {}
        _ if plugin.get("fail_open").and_then(Value::as_bool) == Some(true) => {}
        other => r.warn(
            &loc,
            format!(
                "failure_policy is {}: if the VM ever crashes, every later request on that worker is answered 503 until Envoy restarts; FAIL_RELOAD reloads the VM on the next request",
                other.unwrap_or("unset (FAIL_CLOSED)")
            ),
        ),
    }
    chain_setup(r, docs, &loc, filter, cfg, cfg.hold_request_headers && flag);
}

/// What the HTTP filter chains around loopguard's filter (named `filter`,
/// Wasm or native) and the clusters do to it: the buffer filter, limits,
/// routes. `holds`: loopguard holds request headers until it has judged
/// the body.
pub(super) fn chain_setup(
    r: &mut Report,
    docs: &[Document],
    loc: &str,
    filter: &str,
    cfg: &Config,
    holds: bool,
) {
    let loc = loc.to_string();
    let mut all: Vec<Hcm<'_>> = Vec::new();
    for d in docs {
        hcms_in(&d.value, None, &mut all);
    }
    let with_loopguard = all
        .iter()
        .filter_map(|h| Some((h, h.filters.iter().position(|x| filter_name(x) == filter)?)));
    for (hcm, at) in with_loopguard {
        if bodies_matter(cfg) && !holds {
            let after = hcm.filters.iter().skip(at + 1).find(|x| is_buffer(x));
            match after {
                Some(buffer) => {
                    let limit = buffer
                        .pointer("/typed_config/max_request_bytes")
                        .and_then(Value::as_u64);
                    if let Some(limit) = limit.filter(|l| *l < cfg.max_body_bytes) {
                        r.warn(&loc, format!("the buffer filter after loopguard answers 413 above max_request_bytes {limit}, below max_body_bytes {}: raise it to cover the largest body loopguard should judge", cfg.max_body_bytes));
                    }
                }
                None if hcm.filters.iter().take(at).any(|x| is_buffer(x)) => r.warn(
                    &loc,
                    "the buffer filter runs before loopguard: loopguard then passes the request headers on before it has judged the body, so the upstream sees (the start of) requests loopguard rejects; place envoy.filters.http.buffer right after loopguard, or use the one-filter setup (hold_request_headers)",
                ),
                None => r.warn(
                    &loc,
                    "no buffer filter after loopguard although its policies judge request bodies: the upstream receives the headers of a request before loopguard has judged its body; place envoy.filters.http.buffer right after loopguard, or use the one-filter setup (hold_request_headers)",
                ),
            }
            if warns_upstream(cfg)
                && !hcm
                    .filters
                    .iter()
                    .skip(at + 1)
                    .any(|x| filter_type(x) == HEADER_MUTATION_TYPE)
            {
                r.warn(
                    &loc,
                    "a policy warns or nudges, but no header_mutation filter after loopguard copies its x-loopguard-* headers into requests with a body: the upstream sees them only on body-less requests (see docs/actions.md, warn)",
                );
            }
        }
        super::budget::session_header_lints(r, &loc, cfg, hcm.config, &hcm.filters, at);
        if holds {
            let limit = hcm.buffer_limit.unwrap_or(ENVOY_DEFAULT_BUFFER_LIMIT);
            if limit < cfg.max_body_bytes {
                r.warn(&loc, format!("held request bodies are buffered up to the listener's per_connection_buffer_limit_bytes ({limit}), below max_body_bytes ({}): Envoy answers 413 between the two; raise the listener limit", cfg.max_body_bytes));
            }
        }
        if let Some(routes) = &hcm.routes {
            // Routes where the filter runs.
            let disabled_by_default = hcm
                .filters
                .get(at)
                .and_then(|x| x.get("disabled"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let enabled: Vec<&Value> = routes
                .iter()
                .copied()
                .filter(|route| {
                    match route.pointer(&format!(
                        "/typed_per_filter_config/{}",
                        pointer_escape(filter)
                    )) {
                        Some(pf) => pf.get("disabled").and_then(Value::as_bool) != Some(true),
                        None => !disabled_by_default,
                    }
                })
                .collect();
            route_lints(r, &loc, cfg, &enabled);
            mcp_route_lints(r, &loc, cfg, &enabled);
        }
    }
    let has_cds = docs
        .iter()
        .any(|d| d.value.pointer("/dynamic_resources/cds_config").is_some());
    let clusters: Vec<&str> = docs
        .iter()
        .filter_map(|d| {
            d.value
                .pointer("/static_resources/clusters")
                .and_then(Value::as_array)
        })
        .flatten()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    if !has_cds && !clusters.is_empty() {
        let mut named = Vec::new();
        if let loopguard_core::config::StoreConfig::RedisWebdis(s) = &cfg.store {
            named.push(("store.cluster", s.cluster.as_str()));
        }
        if let Some(w) = &cfg.webhook {
            named.push(("alerts.webhook.cluster", w.cluster.as_str()));
        }
        for (field, cluster) in named {
            if !clusters.contains(&cluster) {
                r.warn(&loc, format!("{field} names cluster \"{cluster}\", which this configuration does not define"));
            }
        }
    }
}

/// JSON pointer escaping of one path segment.
fn pointer_escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}
