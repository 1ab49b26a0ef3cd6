//! loopguard as an Envoy dynamic module (`libloopguard_native.so`): its
//! configurations in Envoy configuration (the `dynamic_modules` HTTP
//! filter) and in Envoy Gateway (an `EnvoyExtensionPolicy`'s
//! `spec.dynamicModule`), and what differs from the Wasm module around
//! them: stat names, verified JWT claims, per-route configuration, held
//! request headers (no Envoy flag needed), the allowlist.

use super::envoy::chain_setup;
use super::gateway::{
    buffer_moved_after, has_request_buffer, target_ref_lints, DYNAMIC_MODULES_FILTER,
};
use super::{bodies_matter, Report};
use crate::discover::{holds_policies, is_api, location, typed_filters};
use crate::documents::{as_struct, Document};
use loopguard_core::config::budget::SessionSource;
use loopguard_core::config::{Config, LimitKey};
use serde_json::Value;

pub const DYNAMIC_MODULE_FILTER_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
pub const DYNAMIC_MODULE_PER_ROUTE_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilterPerRoute";
const ROUTE_FILTER_CONFIG_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
const STRING_VALUE_TYPE: &str = "type.googleapis.com/google.protobuf.StringValue";
const BYTES_VALUE_TYPE: &str = "type.googleapis.com/google.protobuf.BytesValue";
const STRUCT_TYPE: &str = "type.googleapis.com/google.protobuf.Struct";

/// The metrics namespace that keeps the Wasm module's stat names.
const WASM_NAMESPACE: &str = "wasmcustom";
/// Envoy's metrics namespace when `metrics_namespace` is unset.
const DEFAULT_NAMESPACE: &str = "dynamicmodulescustom";
/// The runtime flag that exports a module's metrics to Prometheus without
/// the `envoy_<namespace>_` prefix (the Wasm module's `loopguard_*`).
const STRIP_PREFIX_FLAG: &str =
    "envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix";
/// Envoy Gateway's default per-connection buffer limit (ClientTrafficPolicy
/// `connection.bufferLimit`).
const EG_CONNECTION_BUFFER_LIMIT: u64 = 32768;

/// Where a native configuration was found.
#[derive(Debug, Clone, PartialEq)]
pub enum Host {
    /// A `DynamicModuleFilter` in Envoy configuration: the HTTP filter's
    /// name and the filter's `typed_config`.
    Envoy { filter: String, typed: Value },
    /// An Envoy Gateway `EnvoyExtensionPolicy`'s `spec.dynamicModule[index]`.
    Gateway { index: usize },
}

/// One configuration of the native module and where it came from.
#[derive(Debug, Clone)]
pub struct Native<'a> {
    pub doc: &'a Document,
    pub host: Host,
    /// Where in the document, for messages (`filter "loopguard"`).
    pub place: String,
    /// The bytes the module receives as its configuration, or why they
    /// cannot be known.
    pub bytes: Result<Vec<u8>, String>,
}

impl Native<'_> {
    /// `file (document): place` for messages, as for the Wasm filter.
    pub fn location(&self) -> String {
        location(self.doc, &self.place)
    }
}

/// Every configuration of the loopguard dynamic module in `docs`.
pub fn find(docs: &[Document]) -> Vec<Native<'_>> {
    let mut out = Vec::new();
    for doc in docs {
        if doc.kind() == Some("EnvoyExtensionPolicy") && is_api(doc, "gateway.envoyproxy.io") {
            out.extend(extension_policy(doc, docs));
        } else if doc.value.get("policies").is_none() {
            out.extend(module_filters(doc));
        }
    }
    out
}

fn mentions_loopguard(v: &Value, pointer: &str) -> bool {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .is_some_and(|s| s.contains("loopguard"))
}

/// DynamicModuleFilters that run loopguard in Envoy configuration.
fn module_filters(doc: &Document) -> Vec<Native<'_>> {
    typed_filters(&doc.value, DYNAMIC_MODULE_FILTER_TYPE)
        .into_iter()
        .filter(|(_, typed)| is_loopguard_filter(typed))
        .map(|(filter, typed)| Native {
            doc,
            host: Host::Envoy {
                filter: filter.clone(),
                typed: typed.clone(),
            },
            place: format!("filter \"{filter}\""),
            bytes: filter_config_bytes(typed),
        })
        .collect()
}

/// A DynamicModuleFilter that runs loopguard: its `filter_name` or the
/// module (`lib<name>.so` by name, a file or a URL) names it, or its
/// configuration has policies.
fn is_loopguard_filter(typed: &Value) -> bool {
    [
        "/filter_name",
        "/dynamic_module_config/name",
        "/dynamic_module_config/module/local/filename",
        "/dynamic_module_config/module/remote/http_uri/uri",
    ]
    .iter()
    .any(|p| mentions_loopguard(typed, p))
        || holds_policies(filter_config_bytes(typed))
}

/// The bytes Envoy hands the module: a StringValue's or BytesValue's
/// value as it is, a Struct as JSON (every number a double).
pub fn filter_config_bytes(typed: &Value) -> Result<Vec<u8>, String> {
    let Some(c) = typed.get("filter_config") else {
        return Err("the dynamic module filter has no filter_config: loopguard needs its configuration (a google.protobuf.StringValue holding the JSON)".to_string());
    };
    match c.get("@type").and_then(Value::as_str) {
        Some(STRING_VALUE_TYPE) => Ok(c
            .get("value")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .as_bytes()
            .to_vec()),
        Some(BYTES_VALUE_TYPE) => {
            let text = c.get("value").and_then(Value::as_str).unwrap_or_default();
            crate::replay::input::base64(text).map_err(|_| {
                "filter_config is a google.protobuf.BytesValue whose value is not base64 (JSON and YAML carry bytes as base64)".to_string()
            })
        }
        Some(STRUCT_TYPE) => {
            let value = c
                .get("value")
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default()));
            serde_json::to_vec(&as_struct(&value)).map_err(|e| e.to_string())
        }
        other => Err(format!(
            "filter_config must be a google.protobuf.StringValue (or BytesValue, or Struct) holding loopguard's configuration (got {})",
            other.unwrap_or("no @type")
        )),
    }
}

/// The loopguard entries of an EnvoyExtensionPolicy's `spec.dynamicModule`:
/// a `filterName` or module name naming loopguard, an allowlisted module
/// whose file or URL names it, or a `config` with policies. `config`
/// reaches the module as the JSON it is (a StringValue).
fn extension_policy<'a>(doc: &'a Document, docs: &[Document]) -> Vec<Native<'a>> {
    let Some(list) = doc
        .value
        .pointer("/spec/dynamicModule")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .enumerate()
        .filter(|(_, m)| {
            mentions_loopguard(m, "/filterName")
                || mentions_loopguard(m, "/name")
                || m.get("name")
                    .and_then(Value::as_str)
                    .and_then(|n| allowlisted(docs, n))
                    .is_some_and(|(_, e)| {
                        mentions_loopguard(e, "/source/local/path")
                            || mentions_loopguard(e, "/source/remote/url")
                    })
                || m.get("config").and_then(|c| c.get("policies")).is_some()
        })
        .map(|(i, m)| Native {
            doc,
            host: Host::Gateway { index: i },
            place: format!("spec.dynamicModule[{i}].config"),
            bytes: match m.get("config") {
                None => Err(format!(
                    "spec.dynamicModule[{i}].config is missing: loopguard needs a configuration"
                )),
                Some(c) => serde_json::to_vec(c).map_err(|e| e.to_string()),
            },
        })
        .collect()
}

/// The EnvoyProxy whose `spec.dynamicModules` allowlist registers `name`,
/// and the entry.
fn allowlisted<'d>(docs: &'d [Document], name: &str) -> Option<(&'d Document, &'d Value)> {
    docs.iter()
        .filter(|d| d.kind() == Some("EnvoyProxy"))
        .find_map(|d| {
            d.value
                .pointer("/spec/dynamicModules")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|e| e.get("name").and_then(Value::as_str) == Some(name))
                .map(|e| (d, e))
        })
}

/// The native module's setup around one of its configurations.
pub(super) fn native_setup(r: &mut Report, docs: &[Document], n: &Native<'_>, cfg: &Config) {
    let loc = n.location();
    jwt_lints(r, &loc, cfg);
    match &n.host {
        Host::Envoy { filter, typed } => envoy_setup(r, docs, &loc, filter, typed, cfg),
        Host::Gateway { index } => gateway_setup(r, docs, n.doc, &loc, *index, cfg),
    }
}

/// Verified JWT claims: the module cannot read them.
fn jwt_lints(r: &mut Report, loc: &str, cfg: &Config) {
    let why = format!(
        "Envoy's dynamic-module ABI reads only top-level metadata keys, and jwt_authn nests the verified claims under \"{}\"",
        cfg.jwt_payload_in_metadata
    );
    let fix = |claim: &str| {
        let header = claim_header(claim);
        format!("have jwt_authn copy the claim into a header (claim_to_headers: [{{header_name: {header}, claim_name: {claim}}}]) and use \"header:{header}\", or run the Wasm module")
    };
    for p in &cfg.policies {
        for k in &p.limit_keys {
            if let LimitKey::JwtVerified(claim) = k {
                r.error(loc, format!("policy \"{}\": limit_keys lists \"jwt_verified:{claim}\", which is not available in the native module: {why}, so the key is absent on every request and all callers share one count; {}", p.id, fix(claim)));
            }
        }
        for e in &p.exempt {
            if let LimitKey::JwtVerified(claim) = &e.key {
                r.error(loc, format!("policy \"{}\": exempt key \"jwt_verified:{claim}\" is not available in the native module: {why}, so the key is absent on every request (present: false exempts every request, values never match); {}", p.id, fix(claim)));
            }
        }
        let Some(b) = &p.budget else {
            continue;
        };
        for (list, sources) in [("session", &b.session), ("user", &b.user)] {
            for (i, s) in sources.iter().enumerate() {
                if let SessionSource::JwtVerified(claim) = s {
                    r.error(loc, format!("policy \"{}\": budget.{list}[{i}] \"jwt_verified:{claim}\" is not available in the native module: {why}, so it never names a {list}; {}", p.id, fix(claim)));
                }
            }
        }
    }
}

/// A header name for a claim (`sub` -> `x-jwt-sub`, `https://x.io/org`
/// -> `x-jwt-https-x-io-org`).
fn claim_header(claim: &str) -> String {
    let mut name = String::from("x-jwt");
    for part in claim
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|p| !p.is_empty())
    {
        name.push('-');
        name.push_str(&part.to_ascii_lowercase());
    }
    name
}

fn envoy_setup(
    r: &mut Report,
    docs: &[Document],
    loc: &str,
    filter: &str,
    typed: &Value,
    cfg: &Config,
) {
    let namespace = typed
        .pointer("/dynamic_module_config/metrics_namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    if namespace != Some(WASM_NAMESPACE) {
        let shown = namespace.map_or_else(
            || format!("unset (Envoy's default: {DEFAULT_NAMESPACE})"),
            |n| format!("\"{n}\""),
        );
        let prefix = namespace.unwrap_or(DEFAULT_NAMESPACE);
        r.warn(loc, format!("dynamic_module_config.metrics_namespace is {shown}, not wasmcustom: loopguard's stats are then named {prefix}.loopguard.* instead of wasmcustom.loopguard.*, and the stats_tags of docs/observability.md, the Grafana dashboard and the alert rules, written for those, miss them; set metrics_namespace: wasmcustom"));
    }
    if strips_stat_prefix(docs) == Some(false) {
        let prefix = namespace.unwrap_or(DEFAULT_NAMESPACE);
        r.warn(loc, format!("the bootstrap's layered_runtime does not set {STRIP_PREFIX_FLAG}: true: Envoy then exports loopguard's metrics to Prometheus as envoy_{prefix}_loopguard_* instead of loopguard_*, the names the Grafana dashboard and the alert rules query; set it in a static_layer"));
    }
    // A dynamic module may hold request headers without any Envoy flag.
    chain_setup(r, docs, loc, filter, cfg, cfg.hold_request_headers);
}

/// Whether the bootstrap in the files sets the runtime flag that strips a
/// module's metrics namespace from Prometheus names: `None` when no
/// bootstrap is among them or a runtime layer other than a static one may
/// set it.
fn strips_stat_prefix(docs: &[Document]) -> Option<bool> {
    let bootstraps: Vec<&Document> = docs
        .iter()
        .filter(|d| {
            d.kind().is_none()
                && (d.value.get("static_resources").is_some()
                    || d.value.get("dynamic_resources").is_some())
        })
        .collect();
    if bootstraps.is_empty() {
        return None;
    }
    let mut set = false;
    for d in bootstraps {
        for layer in d
            .value
            .pointer("/layered_runtime/layers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            match layer.get("static_layer") {
                Some(s) => {
                    set |= runtime_value(s, STRIP_PREFIX_FLAG)
                        .is_some_and(|v| v.as_bool() == Some(true) || v.as_str() == Some("true"));
                }
                None => return None,
            }
        }
    }
    Some(set)
}

/// A runtime key in a static layer, written flat (`a.b.c: x`) or nested
/// (`a: {b: {c: x}}`), or any mix.
fn runtime_value<'v>(layer: &'v Value, key: &str) -> Option<&'v Value> {
    if let Some(v) = layer.get(key) {
        return Some(v);
    }
    key.match_indices('.').find_map(|(i, _)| {
        let head = key.get(..i)?;
        let rest = key.get(i + 1..)?;
        runtime_value(layer.get(head)?, rest)
    })
}

fn gateway_setup(
    r: &mut Report,
    docs: &[Document],
    policy: &Document,
    loc: &str,
    index: usize,
    cfg: &Config,
) {
    let entry = policy
        .value
        .pointer(&format!("/spec/dynamicModule/{index}"))
        .unwrap_or(&Value::Null);
    let name = entry.get("name").and_then(Value::as_str).unwrap_or("");
    let proxies: Vec<String> = docs
        .iter()
        .filter(|d| d.kind() == Some("EnvoyProxy"))
        .map(Document::object_name)
        .collect();
    if !proxies.is_empty() && allowlisted(docs, name).is_none() {
        r.error(loc, format!("spec.dynamicModule[{index}].name \"{name}\" is in the spec.dynamicModules allowlist of no EnvoyProxy in the files checked ({}): Envoy Gateway rejects the policy (dynamic module \"{name}\" is not registered) and loopguard does not run; register it in the Gateway's EnvoyProxy: {{name: {name}, source: {{type: Local, local: {{path: /etc/envoy/modules/libloopguard_native.so}}}}}}", proxies.join(", ")));
    }
    if entry
        .get("filterName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        r.warn(loc, format!("spec.dynamicModule[{index}].filterName is unset: Envoy then passes loopguard an empty filter name, and it keeps this policy's counts under \"default\", shared with every other loopguard filter without one; set filterName: loopguard (the name counts are kept under, as wasm[].name for the Wasm module)"));
    }
    if cfg.hold_request_headers {
        let limit = held_body_limit(docs);
        if limit < cfg.max_body_bytes {
            let source = if limit == EG_CONNECTION_BUFFER_LIMIT {
                format!("the listener's per-connection buffer limit ({EG_CONNECTION_BUFFER_LIMIT} bytes by default in Envoy Gateway)")
            } else {
                format!("{limit} bytes (the largest requestBuffer.limit or connection.bufferLimit in the files checked)")
            };
            r.warn(loc, format!("held request bodies are buffered up to {source}, below max_body_bytes ({}): Envoy answers 413 between the two; add a BackendTrafficPolicy with spec.requestBuffer.limit of at least max_body_bytes (its buffer filter runs before dynamic modules and raises the limit) or a ClientTrafficPolicy with spec.connection.bufferLimit", cfg.max_body_bytes));
        }
    } else if bodies_matter(cfg) {
        if !has_request_buffer(docs) {
            r.warn(loc, "neither \"hold_request_headers\": true nor a BackendTrafficPolicy with spec.requestBuffer in the files checked: the upstream receives the headers of a request before loopguard has judged its body; set \"hold_request_headers\": true (the native module holds them without any Envoy flag)");
        } else if !buffer_moved_after(docs, DYNAMIC_MODULES_FILTER) {
            r.warn(loc, "Envoy Gateway runs the buffer filter before dynamic modules by default, where it does not hold the request for loopguard: set \"hold_request_headers\": true (the native module holds the headers without any Envoy flag), or add an EnvoyProxy with spec.filterOrder [{name: envoy.filters.http.buffer, after: envoy.filters.http.dynamic_modules}]; else the upstream sees requests loopguard rejects");
        }
    }
    super::budget::mesh_session_header_lints(r, loc, cfg, docs);
    target_ref_lints(r, docs, policy, loc);
}

/// How much of a held request body Envoy buffers under Envoy Gateway: the
/// largest requestBuffer limit (its buffer filter runs before dynamic
/// modules, unless an EnvoyProxy moves it after them) or ClientTrafficPolicy
/// bufferLimit in the files, else Envoy Gateway's default.
fn held_body_limit(docs: &[Document]) -> u64 {
    let buffer_first = !buffer_moved_after(docs, DYNAMIC_MODULES_FILTER);
    docs.iter()
        .filter_map(|d| match d.kind() {
            Some("BackendTrafficPolicy") if buffer_first => {
                let b = d.value.pointer("/spec/requestBuffer")?;
                // A limit this cannot read counts as enough.
                Some(b.get("limit").and_then(quantity).unwrap_or(u64::MAX))
            }
            Some("ClientTrafficPolicy") => d
                .value
                .pointer("/spec/connection/bufferLimit")
                .map(|q| quantity(q).unwrap_or(u64::MAX)),
            _ => None,
        })
        .max()
        .unwrap_or(EG_CONNECTION_BUFFER_LIMIT)
}

/// A Kubernetes quantity in bytes (`1Mi`, `32768`, `1M`).
fn quantity(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let s = v.as_str()?.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits);
    let factor: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    number.parse::<u64>().ok()?.checked_mul(factor)
}

/// Per-route configurations for loopguard's module: it takes none, and
/// Envoy refuses the configuration that carries one.
pub(super) fn per_route_lints(r: &mut Report, docs: &[Document], natives: &[Native<'_>]) {
    let filters: Vec<&str> = natives
        .iter()
        .filter_map(|n| match &n.host {
            Host::Envoy { filter, .. } => Some(filter.as_str()),
            Host::Gateway { .. } => None,
        })
        .collect();
    for d in docs {
        per_route_in(r, d, &d.value, &filters);
    }
}

fn per_route_in(r: &mut Report, doc: &Document, v: &Value, filters: &[&str]) {
    match v {
        Value::Object(o) => {
            if let Some(per_filter) = o.get("typed_per_filter_config").and_then(Value::as_object) {
                for (key, config) in per_filter {
                    let inner = if config.get("@type").and_then(Value::as_str)
                        == Some(ROUTE_FILTER_CONFIG_TYPE)
                    {
                        config.get("config").unwrap_or(&Value::Null)
                    } else {
                        config
                    };
                    let per_route = inner.get("@type").and_then(Value::as_str)
                        == Some(DYNAMIC_MODULE_PER_ROUTE_TYPE);
                    let ours = filters.contains(&key.as_str())
                        || [
                            "/dynamic_module_config/name",
                            "/per_route_config_name",
                            "/filter_name",
                        ]
                        .iter()
                        .any(|p| mentions_loopguard(inner, p));
                    if per_route && ours {
                        let owner = match o.get("name").and_then(Value::as_str) {
                            Some(n) if o.contains_key("domains") => format!("virtual host \"{n}\""),
                            Some(n) => format!("route \"{n}\""),
                            None => "a route".to_string(),
                        };
                        r.error(
                            location(doc, &format!("typed_per_filter_config \"{key}\"")),
                            format!("{owner} carries a DynamicModuleFilterPerRoute for loopguard, which takes no per-route configuration: Envoy refuses the configuration that carries it (\"Failed to initialize per-route dynamic module\"); choose policies by route name (selector.routes) or route metadata (filter_metadata.loopguard.policy), and switch loopguard off on a route with {{\"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true}}"),
                        );
                    }
                }
            }
            for value in o.values() {
                per_route_in(r, doc, value, filters);
            }
        }
        Value::Array(a) => {
            for value in a {
                per_route_in(r, doc, value, filters);
            }
        }
        _ => {}
    }
}
