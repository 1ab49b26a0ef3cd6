//! `loopguard check`: validate every loopguard configuration in the given
//! files with the filter's own validation, then look at the setup around
//! it for mistakes that make loopguard silently do less than intended.

use super::discover::{self, Found, Origin, BUFFER_TYPE, HCM_TYPE, HEADER_MUTATION_TYPE};
use super::documents::Document;
use loopguard_core::act::hold::HOLD_PROBE_MS;
use loopguard_core::config::{Action, Config, PathMatch, Policy, ToolStep};
use loopguard_core::request::policy::path_matches;
use serde_json::Value;

/// Envoy's default `per_connection_buffer_limit_bytes`.
const ENVOY_DEFAULT_BUFFER_LIMIT: u64 = 1 << 20;
const BUFFER_FILTER: &str = "envoy.filters.http.buffer";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub location: String,
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{}: {sev}: {}", self.location, self.message)
    }
}

struct Report(Vec<Finding>);

impl Report {
    fn error(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Error, location, message);
    }
    fn warn(&mut self, location: impl Into<String>, message: impl Into<String>) {
        self.push(Severity::Warning, location, message);
    }
    fn push(
        &mut self,
        severity: Severity,
        location: impl Into<String>,
        message: impl Into<String>,
    ) {
        self.0.push(Finding {
            severity,
            location: location.into(),
            message: message.into(),
        });
    }
}

/// Kinds that only support a loopguard setup (checked against it, not
/// required to hold a configuration).
const SUPPORTING_KINDS: [&str; 7] = [
    "EnvoyFilter",
    "VirtualService",
    "Gateway",
    "HTTPRoute",
    "EnvoyProxy",
    "BackendTrafficPolicy",
    "AIGatewayRoute",
];

/// Check every document of every file given together.
pub fn check(docs: &[Document]) -> Vec<Finding> {
    let mut r = Report(Vec::new());
    let found = discover::find(docs);
    let mut configs: Vec<(&Found<'_>, Config)> = Vec::new();
    for f in &found {
        match &f.bytes {
            Err(why) => r.error(f.location(), why.clone()),
            Ok(bytes) => match Config::parse(bytes) {
                Ok(cfg) => configs.push((f, cfg)),
                Err(e) => r.error(f.location(), e.to_string()),
            },
        }
    }
    // A file with nothing loopguard in it was probably given by mistake.
    let mut files: Vec<&str> = Vec::new();
    for d in docs {
        if !files.contains(&d.file.as_str()) {
            files.push(&d.file);
        }
    }
    for file in files {
        let has_config = found.iter().any(|f| f.doc.file == file);
        let supports = docs
            .iter()
            .filter(|d| d.file == file)
            .any(|d| d.kind().is_some_and(|k| SUPPORTING_KINDS.contains(&k)) || has_hcm(&d.value));
        if !has_config && !supports {
            r.error(
                file,
                "holds no loopguard configuration (a policy JSON, an Envoy config with the loopguard Wasm filter, a WasmPlugin or an EnvoyExtensionPolicy)",
            );
        }
    }
    for (f, cfg) in &configs {
        match &f.origin {
            Origin::Plain => {}
            Origin::Envoy { filter, plugin } => envoy_setup(&mut r, docs, f, filter, plugin, cfg),
            Origin::WasmPlugin => istio_setup(&mut r, docs, f, cfg),
            Origin::ExtensionPolicy { index } => gateway_setup(&mut r, docs, f, *index, cfg),
        }
    }
    envoy_filter_anchors(&mut r, docs);
    r.0
}

/// Whether requests with a body reach an active policy (then loopguard
/// decides after the body: the headers must wait for it).
fn bodies_matter(cfg: &Config) -> bool {
    cfg.policies.iter().any(|p| {
        p.is_active()
            && (p.selector.methods.is_empty()
                || p.selector.methods.iter().any(|m| {
                    !matches!(m.as_str(), "GET" | "HEAD" | "DELETE" | "OPTIONS" | "TRACE")
                }))
    })
}

/// Whether some policy adds headers meant for the upstream (warn, tool-loop
/// nudges and directives).
fn warns_upstream(cfg: &Config) -> bool {
    cfg.policies.iter().any(|p| {
        p.detection
            .as_ref()
            .is_some_and(|d| d.steps.iter().any(|s| s.action == Action::Warn))
            || p.tool_loops.as_ref().is_some_and(|t| {
                t.ladder
                    .iter()
                    .any(|s| matches!(s, ToolStep::Nudge | ToolStep::Directive))
            })
    })
}

// --- Envoy ------------------------------------------------------------------

/// An HTTP connection manager: its filters, its inline routes (`None` when
/// they come from RDS), and its listener's buffer limit.
struct Hcm<'a> {
    filters: Vec<&'a Value>,
    routes: Option<Vec<&'a Value>>,
    buffer_limit: Option<u64>,
}

fn has_hcm(v: &Value) -> bool {
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

fn filter_type(f: &Value) -> &str {
    f.pointer("/typed_config/@type")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn is_buffer(f: &Value) -> bool {
    filter_type(f) == BUFFER_TYPE || filter_name(f) == BUFFER_FILTER
}

fn envoy_setup(
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
    let holds = cfg.hold_request_headers && flag;
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

/// Routes (where loopguard runs) against the policies that select them.
fn route_lints(r: &mut Report, loc: &str, cfg: &Config, routes: &[&Value]) {
    let names: Vec<&str> = routes
        .iter()
        .filter_map(|x| x.get("name").and_then(Value::as_str))
        .collect();
    for route in routes {
        let Some(named) = route
            .pointer("/metadata/filter_metadata/loopguard/policy")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let which = route
            .get("name")
            .and_then(Value::as_str)
            .map_or_else(|| "a route".to_string(), |n| format!("route \"{n}\""));
        if !cfg.route_metadata {
            r.warn(loc, format!("{which} names policy \"{named}\" in filter_metadata.loopguard, but the configuration lacks \"route_metadata\": true, so the metadata is ignored"));
        } else if cfg.policy_index(named).is_none() {
            r.warn(loc, format!("{which} names policy \"{named}\", which the configuration does not have: its requests pass unchecked"));
        }
    }
    for p in &cfg.policies {
        if !p.selector.routes.is_empty() {
            let missing: Vec<&String> = p
                .selector
                .routes
                .iter()
                .filter(|n| !names.contains(&n.as_str()))
                .collect();
            if missing.len() == p.selector.routes.len() {
                r.warn(loc, format!("policy \"{}\": selector.routes lists {}, but no route where loopguard runs has such a name: the policy never applies", p.id, quoted_list(&missing)));
                continue;
            } else if !missing.is_empty() {
                r.warn(loc, format!("policy \"{}\": selector.routes lists {}, which no route where loopguard runs is named", p.id, quoted_list(&missing)));
            }
        }
        if !routes.is_empty() && !path_reachable(p, routes) {
            r.warn(loc, format!("policy \"{}\": no route where loopguard runs can match its path selector {}: the policy never applies", p.id, show_path(&p.selector.path)));
        }
    }
}

fn quoted_list(names: &[&String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{n}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn show_path(p: &PathMatch) -> String {
    match p {
        PathMatch::Any => "(any)".to_string(),
        PathMatch::Exact(x) => format!("pathExact \"{x}\""),
        PathMatch::Prefix(x) => format!("pathPrefix \"{x}\""),
    }
}

/// Whether some route could carry a path the policy's selector matches.
/// Conservative: a route with a matcher this does not read counts as
/// reachable.
fn path_reachable(p: &Policy, routes: &[&Value]) -> bool {
    routes.iter().any(|route| {
        let m = route.get("match");
        let prefix = m.and_then(|m| m.get("prefix")).and_then(Value::as_str);
        let exact = m.and_then(|m| m.get("path")).and_then(Value::as_str);
        match (&p.selector.path, prefix, exact) {
            (PathMatch::Any, _, _) => true,
            (_, None, None) => true,
            (PathMatch::Exact(x), Some(rp), _) => x.starts_with(rp),
            (PathMatch::Exact(x), None, Some(e)) => x == e,
            (PathMatch::Prefix(pp), Some(rp), _) => {
                pp.starts_with(rp) || rp.starts_with(pp.as_str())
            }
            (rule @ PathMatch::Prefix(_), None, Some(e)) => path_matches(rule, e),
        }
    })
}

// --- Istio ------------------------------------------------------------------

/// The HTTP filter (and ECDS resource) name istiod gives a WasmPlugin:
/// Istio 1.26-1.29, then 1.30 and later.
pub fn istio_filter_names(ns: &str, name: &str) -> [String; 2] {
    [
        format!("extensions.istio.io/wasmplugin/{ns}.{name}"),
        format!("extensions.istio.io/trafficextension/{ns}.{name}~istio-translated-wasmplugin"),
    ]
}

fn istio_setup(r: &mut Report, docs: &[Document], f: &Found<'_>, cfg: &Config) {
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
fn envoy_filter_anchors(r: &mut Report, docs: &[Document]) {
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

// --- Envoy Gateway ----------------------------------------------------------

fn gateway_setup(r: &mut Report, docs: &[Document], f: &Found<'_>, index: usize, cfg: &Config) {
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
        let buffered = docs.iter().any(|d| {
            d.kind() == Some("BackendTrafficPolicy")
                && d.value.pointer("/spec/requestBuffer").is_some()
        });
        let reordered = docs.iter().any(|d| {
            d.kind() == Some("EnvoyProxy")
                && d.value
                    .pointer("/spec/filterOrder")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|o| {
                        o.get("name").and_then(Value::as_str) == Some(BUFFER_FILTER)
                            && o.get("after").and_then(Value::as_str)
                                == Some("envoy.filters.http.wasm")
                    })
        });
        if !buffered {
            r.warn(&loc, "no BackendTrafficPolicy with spec.requestBuffer in the files checked: without the buffer filter the upstream receives the headers of a request before loopguard has judged its body");
        } else if !reordered {
            r.warn(&loc, "Envoy Gateway runs the buffer filter before wasm by default: add an EnvoyProxy with spec.filterOrder [{name: envoy.filters.http.buffer, after: envoy.filters.http.wasm}] (Envoy Gateway 1.6+), else the upstream sees requests loopguard rejects");
        }
    }
    let routes: Vec<&str> = docs
        .iter()
        .filter(|d| matches!(d.kind(), Some("HTTPRoute") | Some("AIGatewayRoute")))
        .map(|d| d.name())
        .collect();
    if !routes.is_empty() {
        for t in f
            .doc
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
                r.warn(&loc, format!("targetRefs names HTTPRoute \"{name}\", which is not among the HTTPRoutes (or AIGatewayRoutes, whose HTTPRoute has the same name) in the files checked"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::documents::parse;

    fn findings(files: &[(&str, &str)]) -> Vec<String> {
        let docs: Vec<Document> = files
            .iter()
            .flat_map(|(name, text)| parse(name, text).unwrap())
            .collect();
        check(&docs).iter().map(|f| f.to_string()).collect()
    }

    const POLICY: &str = r#"{"policies": [{"id": "agents", "spec": {"selector": {"pathPrefix": "/v1/", "routes": ["llm"]},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}}]}"#;

    fn bootstrap(filters: &str, routes: &str, plugin_extra: &str, config: &str) -> String {
        format!(
            r#"
static_resources:
  listeners:
  - name: main
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": {HCM_TYPE}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes: {routes}
          http_filters: {filters}
  clusters: [{{name: api}}]
"#
        )
        .replace(
            "LOOPGUARD",
            &format!(
                r#"{{name: loopguard, typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm, config: {{root_id: loopguard, failure_policy: FAIL_RELOAD, {plugin_extra} configuration: {{"@type": type.googleapis.com/google.protobuf.StringValue, value: {}}}}}}}}}"#,
                serde_json::to_string(config).unwrap()
            ),
        )
    }

    const BUFFER: &str = r#"{name: envoy.filters.http.buffer, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, max_request_bytes: 1048576}}"#;
    const ROUTER: &str = "{name: envoy.filters.http.router}";

    #[test]
    fn a_plain_policy_is_validated_with_the_filters_messages() {
        assert!(findings(&[("p.json", POLICY)]).is_empty());
        let bad = POLICY.replace(
            "\"threshold_identical_requests\": 3",
            "\"threshold_identical_requests\": 1",
        );
        assert_eq!(
            findings(&[("p.json", &bad)]),
            ["p.json: error: policy \"agents\": loop_detection.threshold_identical_requests must be >= 2 (got 1); use 0 to switch the policy off"]
        );
        assert_eq!(
            findings(&[("x.yaml", "a: 1")]),
            ["x.yaml: error: holds no loopguard configuration (a policy JSON, an Envoy config with the loopguard Wasm filter, a WasmPlugin or an EnvoyExtensionPolicy)"]
        );
    }

    #[test]
    fn a_good_envoy_setup_has_no_findings() {
        let routes = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}}]";
        let b = bootstrap(
            &format!("[LOOPGUARD, {BUFFER}, {ROUTER}]"),
            routes,
            "",
            POLICY,
        );
        assert_eq!(findings(&[("envoy.yaml", &b)]), Vec::<String>::new());
        // The one-filter setup needs no buffer filter.
        let hold = POLICY.replacen('{', "{\"hold_request_headers\": true, ", 1);
        let b = bootstrap(
            &format!("[LOOPGUARD, {ROUTER}]"),
            routes,
            "allow_on_headers_stop_iteration: true,",
            &hold,
        );
        assert_eq!(findings(&[("envoy.yaml", &b)]), Vec::<String>::new());
    }

    #[test]
    fn setups_that_silently_do_less() {
        let routes = "[{name: other, match: {prefix: /v2/}, route: {cluster: api}, metadata: {filter_metadata: {loopguard: {policy: agents}}}}]";
        let b = bootstrap(
            &format!("[{BUFFER}, LOOPGUARD, {ROUTER}]"),
            routes,
            "",
            POLICY,
        );
        let got = findings(&[("envoy.yaml", &b)]);
        let expect = [
            "the buffer filter runs before loopguard",
            "route \"other\" names policy \"agents\" in filter_metadata.loopguard, but the configuration lacks \"route_metadata\": true",
            "policy \"agents\": selector.routes lists \"llm\", but no route where loopguard runs has such a name: the policy never applies",
        ];
        assert_eq!(got.len(), expect.len(), "{got:#?}");
        for (g, e) in got.iter().zip(expect) {
            assert!(
                g.starts_with("envoy.yaml filter \"loopguard\": warning: "),
                "{g}"
            );
            assert!(g.contains(e), "{g} should contain {e}");
        }
        let b = bootstrap(
            &format!("[LOOPGUARD, {ROUTER}]"),
            "[{name: llm, match: {prefix: /v2/}}]",
            "",
            POLICY,
        );
        let got = findings(&[("envoy.yaml", &b)]);
        assert!(
            got[0].contains("no buffer filter after loopguard"),
            "{got:#?}"
        );
        assert!(
            got[1].contains(
                "no route where loopguard runs can match its path selector pathPrefix \"/v1/\""
            ),
            "{got:#?}"
        );
        // Holding without Envoy's flag is an error.
        let hold = POLICY.replacen('{', "{\"hold_request_headers\": true, ", 1);
        let b = bootstrap(
            &format!("[LOOPGUARD, {BUFFER}, {ROUTER}]"),
            "[{name: llm, match: {prefix: /}}]",
            "",
            &hold,
        );
        let got = findings(&[("envoy.yaml", &b)]);
        assert!(got[0].contains("error: hold_request_headers is set but the Wasm filter's config lacks allow_on_headers_stop_iteration"), "{got:#?}");
    }

    #[test]
    fn istio_anchor_names_and_buffer() {
        let plugin = r#"
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: {name: loopguard, namespace: istio-ingress}
spec:
  pluginName: loopguard
  failStrategy: FAIL_RELOAD
  pluginConfig:
    policies:
    - id: agents
      spec:
        selector: {routes: [llm]}
        loop_detection: {enabled: true, window_seconds: 60, threshold_identical_requests: 3}
"#;
        let filter = |anchor: &str| {
            format!(
                r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {{name: buffer, namespace: istio-ingress}}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {{name: "{anchor}"}}
    patch:
      operation: INSERT_AFTER
      value: {{name: envoy.filters.http.buffer, typed_config: {{"@type": {BUFFER_TYPE}, max_request_bytes: 1048576}}}}
"#
            )
        };
        let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: llm}\nspec:\n  http:\n  - name: llm\n    route: [{destination: {host: api}}]\n";
        let good = filter("extensions.istio.io/wasmplugin/istio-ingress.loopguard");
        assert_eq!(
            findings(&[("wp.yaml", plugin), ("ef.yaml", &good), ("vs.yaml", vs)]),
            Vec::<String>::new()
        );
        let new_form = filter("extensions.istio.io/trafficextension/istio-ingress.loopguard~istio-translated-wasmplugin");
        assert_eq!(
            findings(&[("wp.yaml", plugin), ("ef.yaml", &new_form)]),
            Vec::<String>::new()
        );
        let wrong = filter("extensions.istio.io/wasmplugin/default.loopguard");
        let got = findings(&[("wp.yaml", plugin), ("ef.yaml", &wrong)]);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(got[0].starts_with("wp.yaml (WasmPlugin istio-ingress/loopguard) spec.pluginConfig: warning: no EnvoyFilter"), "{got:#?}");
        assert!(got[1].starts_with("ef.yaml (EnvoyFilter istio-ingress/buffer): warning: subFilter \"extensions.istio.io/wasmplugin/default.loopguard\" matches none"), "{got:#?}");
        let vs_other = vs.replace("- name: llm", "- name: chat");
        let got = findings(&[
            ("wp.yaml", plugin),
            ("ef.yaml", &good),
            ("vs.yaml", &vs_other),
        ]);
        assert!(
            got[0].contains("selector.routes lists \"llm\", but no VirtualService route"),
            "{got:#?}"
        );
        // Struct numbers: 3 arrives as 3.0 and is accepted; 2.5 is not.
        let frac = plugin.replace(
            "threshold_identical_requests: 3",
            "threshold_identical_requests: 2.5",
        );
        let got = findings(&[("wp.yaml", &frac), ("ef.yaml", &good)]);
        assert_eq!(got, ["wp.yaml (WasmPlugin istio-ingress/loopguard) spec.pluginConfig: error: policy \"agents\": loop_detection.threshold_identical_requests must be a whole number from 0 to 1024 (got 2.5)"]);
    }

    #[test]
    fn envoy_gateway_buffer_order_and_fail_open() {
        let eep = r#"
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyExtensionPolicy
metadata: {name: loopguard, namespace: llm}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: llm}]
  wasm:
  - name: loopguard
    rootID: loopguard
    failOpen: true
    code: {type: Image, image: {url: "oci://r/loopguard:0.1.0"}}
    config:
      policies:
      - {id: agents, spec: {selector: {pathPrefix: /v1/}, loop_detection: {enabled: true, window_seconds: 60, threshold_identical_requests: 3}}}
"#;
        let btp = "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: b}\nspec: {requestBuffer: {limit: 1Mi}}\n";
        let proxy = "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyProxy\nmetadata: {name: p}\nspec: {filterOrder: [{name: envoy.filters.http.buffer, after: envoy.filters.http.wasm}]}\n";
        let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: llm}\nspec: {}\n";
        assert_eq!(
            findings(&[
                ("eep.yaml", eep),
                ("btp.yaml", btp),
                ("proxy.yaml", proxy),
                ("route.yaml", route)
            ]),
            Vec::<String>::new()
        );
        let got = findings(&[("eep.yaml", eep), ("btp.yaml", btp)]);
        assert!(
            got[0].contains("runs the buffer filter before wasm by default"),
            "{got:#?}"
        );
        let closed = eep.replace("failOpen: true", "failOpen: false");
        let got = findings(&[
            ("eep.yaml", &closed),
            ("btp.yaml", btp),
            ("proxy.yaml", proxy),
        ]);
        assert!(got[0].contains("failOpen is not true"), "{got:#?}");
    }
}
