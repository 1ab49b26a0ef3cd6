//! Spend caps (`budget`) against what makes them work: prices for a dollar
//! cap, and, in Envoy configuration, whether a `header:` session source can
//! reach loopguard at all.
//!
//! Where Envoy sets a request header matters. Route, virtual-host and
//! route-configuration `request_headers_to_add` (and what Istio's
//! VirtualService `headers` and the Gateway API's `RequestHeaderModifier`
//! become) are applied by the router, the last filter, when the request
//! goes upstream: loopguard, an HTTP filter before it, never sees them.
//! What loopguard sees is what the client sent, as changed by the filters
//! ahead of it (`header_mutation`, `jwt_authn`'s `claim_to_headers`, Lua,
//! an external authorizer or processor) and the connection manager's
//! `early_header_mutation_extensions`.

use super::Report;
use crate::discover::{HEADER_MUTATION_TYPE, WASM_FILTER_TYPE};
use crate::documents::Document;
use loopguard_core::config::budget::{BudgetPer, Cap, SessionSource, Unpriced};
use loopguard_core::config::{Config, Policy};
use serde_json::Value;

const HEADER_MUTATION_PER_ROUTE_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutationPerRoute";
const EARLY_HEADER_MUTATION_TYPE: &str =
    "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation";
const JWT_AUTHN_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication";
const LUA_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua";
const LUA_PER_ROUTE_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.lua.v3.LuaPerRoute";
const ROUTE_FILTER_CONFIG_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.FilterConfig";
/// Filters that may set any request header, in ways the configuration
/// does not show (a service's answer, a program).
const OPAQUE: [(&str, &str); 5] = [
    (
        "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
        "ext_authz",
    ),
    (
        "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "ext_proc",
    ),
    (WASM_FILTER_TYPE, "Wasm"),
    (super::native::DYNAMIC_MODULE_FILTER_TYPE, "dynamic module"),
    (
        "type.googleapis.com/envoy.extensions.filters.http.golang.v3alpha.Config",
        "Go",
    ),
];

/// Budget findings any configuration can have, wherever it runs: a
/// dollar cap that lets unpriced models spend nothing.
pub(super) fn budget_lints(r: &mut Report, loc: &str, cfg: &Config) {
    for p in &cfg.policies {
        let Some(b) = &p.budget else {
            continue;
        };
        if b.unpriced != Unpriced::Ignore {
            continue;
        }
        for (i, l) in b.limits.iter().enumerate() {
            if let Cap::MicroUsd(cap) = l.cap {
                r.warn(loc, format!(
                    "policy \"{}\": budget.limits[{i}] \"{}\" is a dollar cap (${} per {} in {} s) with budget.unpriced: ignore: a model neither \"prices\" nor the built-in table prices spends nothing against it (loopguard_budget_unpriced_total counts such calls); leave unpriced out to charge them at their provider's highest price, or cap tokens or calls as well",
                    p.id,
                    l.name,
                    l.cap.show(cap),
                    l.per.as_str(),
                    l.window_ms / 1000
                ));
            }
        }
    }
}

/// The policy's `header:` session sources, with their place in
/// `budget.session`, when a cap counts per session.
fn session_headers(p: &Policy) -> Vec<(usize, &str)> {
    let Some(b) = p.budget.as_ref().filter(|b| b.has_per(BudgetPer::Session)) else {
        return Vec::new();
    };
    b.session
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            SessionSource::Header(h) => Some((i, h.as_str())),
            _ => None,
        })
        .collect()
}

fn has_caller_cap(p: &Policy) -> bool {
    p.budget
        .as_ref()
        .is_some_and(|b| b.has_per(BudgetPer::Caller))
}

/// What an Envoy configuration does to one request header, as loopguard
/// sees it.
#[derive(Debug, Default)]
struct Header {
    /// Set before loopguard runs (by what).
    before: Option<String>,
    /// A filter before loopguard may set it (one the configuration does
    /// not say enough about).
    maybe: Option<String>,
    /// Set only where loopguard cannot see it (route-level additions, a
    /// filter after it).
    after: Vec<String>,
    /// Taken out of requests before loopguard runs.
    removed: Option<String>,
}

/// `header:` session sources around one HTTP connection manager that runs
/// loopguard: `hcm` is its configuration, `filters` its HTTP filters and
/// `at` loopguard's place among them.
pub(super) fn session_header_lints(
    r: &mut Report,
    loc: &str,
    cfg: &Config,
    hcm: &Value,
    filters: &[&Value],
    at: usize,
) {
    let route_config = hcm.get("route_config");
    for p in &cfg.policies {
        let headers = session_headers(p);
        if headers.is_empty() {
            continue;
        }
        let seen: Vec<(usize, &str, Header)> = headers
            .iter()
            .map(|&(i, h)| (i, h, header_in(h, hcm, route_config, filters, at)))
            .collect();
        // Every request has a session when one source is always set (or
        // may be: then this cannot tell).
        let settled = seen
            .iter()
            .any(|(_, _, s)| s.before.is_some() || s.maybe.is_some());
        for (i, h, s) in &seen {
            let source = format!("policy \"{}\": budget.session[{i}] header:{h}", p.id);
            if let Some(by) = &s.removed {
                r.warn_once(loc, format!(
                    "{source} is removed by {by} before loopguard runs: loopguard never sees it there, and sessions it would name are not capped per session"
                ));
                continue;
            }
            if s.before.is_some() || s.maybe.is_some() {
                continue;
            }
            if let Some(first) = s.after.first() {
                r.warn_once(loc, format!(
                    "{source} is added by {first}, which Envoy applies in the router, after loopguard has run: loopguard never sees that value, so requests carry the header only if clients send it (sessions without it are not capped per session); set it before loopguard instead (a header_mutation filter ahead of it, or the connection manager's early_header_mutation_extensions)"
                ));
            } else if !settled && !has_caller_cap(p) {
                r.warn_once(loc, format!(
                    "{source} is set by nothing in this Envoy configuration before loopguard: requests carry it only if clients send it (sessions without it are not capped per session), and the policy has no per: caller cap to hold a client that leaves it out; add one as the ceiling, or set the header in a filter ahead of loopguard (header_mutation, or jwt_authn's claim_to_headers)"
                ));
            }
        }
    }
}

/// What the connection manager `hcm` (routes `route_config`, HTTP filters
/// `filters` with loopguard at `at`) does to request header `h`.
fn header_in(
    h: &str,
    hcm: &Value,
    route_config: Option<&Value>,
    filters: &[&Value],
    at: usize,
) -> Header {
    let mut s = Header::default();
    // In the order Envoy applies them: a later step undoes an earlier one.
    let set = |s: &mut Header, by: String| {
        s.removed = None;
        s.before.get_or_insert(by);
    };
    let remove = |s: &mut Header, by: String| {
        s.before = None;
        s.removed.get_or_insert(by);
    };
    if let Some(rc) = route_config {
        if list(rc, "internal_only_headers")
            .iter()
            .any(|v| v.as_str().is_some_and(|n| n.eq_ignore_ascii_case(h)))
        {
            remove(
                &mut s,
                "the route configuration's internal_only_headers (on requests from outside)"
                    .to_string(),
            );
        }
        s.after.extend(route_additions(rc, h));
    }
    for early in list(hcm, "early_header_mutation_extensions") {
        let typed = early.get("typed_config").unwrap_or(&Value::Null);
        if type_of(typed) == EARLY_HEADER_MUTATION_TYPE {
            let mutations = list(typed, "mutations");
            if appends(mutations, h) {
                set(
                    &mut s,
                    "the connection manager's early_header_mutation_extensions".to_string(),
                );
            } else if removes(mutations, h) {
                remove(
                    &mut s,
                    "the connection manager's early_header_mutation_extensions".to_string(),
                );
            }
        }
    }
    for (i, f) in filters.iter().enumerate() {
        let name = f.get("name").and_then(Value::as_str).unwrap_or("");
        let typed = f.get("typed_config").unwrap_or(&Value::Null);
        let kind = type_of(typed);
        if i > at {
            if kind == HEADER_MUTATION_TYPE && appends(request_mutations(typed), h) {
                s.after.push(format!(
                    "header_mutation filter \"{name}\" (after loopguard)"
                ));
            }
            continue;
        }
        if i == at {
            continue;
        }
        let by = |what: &str| format!("{what} filter \"{name}\"");
        match kind {
            HEADER_MUTATION_TYPE => {
                let per_route = route_config
                    .map(|rc| per_route_configs(rc, name))
                    .unwrap_or_default();
                if appends(request_mutations(typed), h)
                    || per_route.iter().any(|c| {
                        type_of(c) == HEADER_MUTATION_PER_ROUTE_TYPE
                            && appends(request_mutations(c), h)
                    })
                {
                    set(&mut s, by("header_mutation"));
                } else if removes(request_mutations(typed), h) {
                    remove(&mut s, by("header_mutation"));
                }
            }
            JWT_AUTHN_TYPE => {
                if jwt_sets(typed, h) {
                    set(&mut s, by("jwt_authn"));
                }
            }
            LUA_TYPE => match lua_mentions(typed, route_config, name, h) {
                Some(true) => set(&mut s, by("Lua")),
                Some(false) => {}
                None => {
                    s.maybe.get_or_insert_with(|| by("Lua"));
                }
            },
            other => {
                if let Some((_, what)) = OPAQUE.iter().find(|(t, _)| *t == other) {
                    s.maybe.get_or_insert_with(|| by(what));
                }
            }
        }
    }
    s
}

fn type_of(typed: &Value) -> &str {
    typed.get("@type").and_then(Value::as_str).unwrap_or("")
}

fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A `request_headers_to_add` list names `h`.
fn adds(v: &Value, h: &str) -> bool {
    list(v, "request_headers_to_add").iter().any(|o| {
        o.pointer("/header/key")
            .and_then(Value::as_str)
            .is_some_and(|k| k.eq_ignore_ascii_case(h))
    })
}

/// Where a route configuration adds `h` to requests (applied by the
/// router): the configuration itself, its virtual hosts, their routes and
/// weighted clusters.
fn route_additions(rc: &Value, h: &str) -> Vec<String> {
    let mut out = Vec::new();
    let named = |v: &Value, what: &str| match v.get("name").and_then(Value::as_str) {
        Some(n) => format!("{what} \"{n}\""),
        None => format!("a {what}"),
    };
    if adds(rc, h) {
        out.push("the route configuration (request_headers_to_add)".to_string());
    }
    for vh in list(rc, "virtual_hosts") {
        if adds(vh, h) {
            out.push(format!(
                "{} (request_headers_to_add)",
                named(vh, "virtual host")
            ));
        }
        for route in list(vh, "routes") {
            let weighted = route
                .pointer("/route/weighted_clusters/clusters")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| adds(c, h)));
            if adds(route, h) || weighted {
                out.push(format!(
                    "{} (request_headers_to_add)",
                    named(route, "route")
                ));
            }
        }
    }
    out
}

/// A list of header mutations (`config.common.mutation_rules.v3`) appends
/// `h`.
fn appends(mutations: &[Value], h: &str) -> bool {
    mutations.iter().any(|m| {
        m.pointer("/append/header/key")
            .and_then(Value::as_str)
            .is_some_and(|k| k.eq_ignore_ascii_case(h))
    })
}

/// A list of header mutations removes `h`.
fn removes(mutations: &[Value], h: &str) -> bool {
    mutations.iter().any(|m| {
        m.get("remove")
            .and_then(Value::as_str)
            .is_some_and(|k| k.eq_ignore_ascii_case(h))
    })
}

/// A header_mutation filter's (or per-route) request mutations.
fn request_mutations(typed: &Value) -> &[Value] {
    typed
        .pointer("/mutations/request_mutations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// A jwt_authn provider copies a claim (or the payload) into `h`.
fn jwt_sets(typed: &Value, h: &str) -> bool {
    let Some(providers) = typed.get("providers").and_then(Value::as_object) else {
        return false;
    };
    let is = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .is_some_and(|k| k.eq_ignore_ascii_case(h))
    };
    providers.values().any(|p| {
        is(p.get("forward_payload_header"))
            || list(p, "claim_to_headers")
                .iter()
                .any(|c| is(c.get("header_name")))
    })
}

/// Whether a Lua filter's code (or a per-route script's) mentions `h`:
/// `None` when some of its code is in a file this cannot read.
fn lua_mentions(typed: &Value, route_config: Option<&Value>, name: &str, h: &str) -> Option<bool> {
    let mut sources: Vec<&Value> = Vec::new();
    if let Some(code) = typed.get("inline_code") {
        sources.push(code);
    }
    if let Some(d) = typed.get("default_source_code") {
        sources.push(d);
    }
    if let Some(m) = typed.get("source_codes").and_then(Value::as_object) {
        sources.extend(m.values());
    }
    let per_route = route_config
        .map(|rc| per_route_configs(rc, name))
        .unwrap_or_default();
    sources.extend(
        per_route
            .iter()
            .filter(|c| type_of(c) == LUA_PER_ROUTE_TYPE)
            .filter_map(|c| c.get("source_code")),
    );
    let needle = h.to_ascii_lowercase();
    let mut unknown = false;
    for s in sources {
        let text = match s {
            Value::String(t) => Some(t.clone()),
            _ => s
                .get("inline_string")
                .and_then(Value::as_str)
                .map(str::to_string),
        };
        match text {
            Some(t) if t.to_ascii_lowercase().contains(&needle) => return Some(true),
            Some(_) => {}
            None => unknown = true,
        }
    }
    if unknown {
        None
    } else {
        Some(false)
    }
}

/// The per-route configurations a route configuration gives the filter
/// named `name` (on virtual hosts and routes; a `FilterConfig` unwrapped).
fn per_route_configs<'a>(rc: &'a Value, name: &str) -> Vec<&'a Value> {
    let mut out = Vec::new();
    let mut take = |v: &'a Value| {
        if let Some(c) = v.pointer(&format!(
            "/typed_per_filter_config/{}",
            name.replace('~', "~0").replace('/', "~1")
        )) {
            out.push(if type_of(c) == ROUTE_FILTER_CONFIG_TYPE {
                c.get("config").unwrap_or(&Value::Null)
            } else {
                c
            });
        }
    };
    for vh in list(rc, "virtual_hosts") {
        take(vh);
        for route in list(vh, "routes") {
            take(route);
        }
    }
    out
}

/// Where the routes of a mesh add request header `h`: Istio
/// VirtualServices' `headers.request` (`set`, `add`) on an `http` route or
/// its destinations, Gateway API HTTPRoutes' `RequestHeaderModifier` on a
/// rule or its backends. Both become route-level additions, applied by the
/// router after loopguard.
fn mesh_additions(docs: &[Document], h: &str) -> Vec<String> {
    let mut out = Vec::new();
    for d in docs {
        match d.kind() {
            Some("VirtualService") => {
                for (i, http) in d
                    .value
                    .pointer("/spec/http")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let sets = |v: &Value| {
                        ["set", "add"].iter().any(|k| {
                            v.pointer(&format!("/headers/request/{k}"))
                                .and_then(Value::as_object)
                                .is_some_and(|m| m.keys().any(|n| n.eq_ignore_ascii_case(h)))
                        })
                    };
                    if sets(http) || list(http, "route").iter().any(sets) {
                        let route = http
                            .get("name")
                            .and_then(Value::as_str)
                            .map_or_else(|| format!("http[{i}]"), |n| format!("route \"{n}\""));
                        out.push(format!(
                            "VirtualService \"{}\" {route} (headers.request)",
                            d.object_name()
                        ));
                    }
                }
            }
            Some("HTTPRoute") => {
                let modifies = |f: &Value| {
                    f.get("type").and_then(Value::as_str) == Some("RequestHeaderModifier")
                        && ["set", "add"].iter().any(|k| {
                            f.pointer(&format!("/requestHeaderModifier/{k}"))
                                .and_then(Value::as_array)
                                .into_iter()
                                .flatten()
                                .any(|e| {
                                    e.get("name")
                                        .and_then(Value::as_str)
                                        .is_some_and(|n| n.eq_ignore_ascii_case(h))
                                })
                        })
                };
                let rules = d.value.pointer("/spec/rules").and_then(Value::as_array);
                let found = rules.into_iter().flatten().any(|rule| {
                    list(rule, "filters").iter().any(modifies)
                        || list(rule, "backendRefs")
                            .iter()
                            .any(|b| list(b, "filters").iter().any(modifies))
                });
                if found {
                    out.push(format!(
                        "HTTPRoute \"{}\" (RequestHeaderModifier)",
                        d.object_name()
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// `header:` session sources that an Istio or Envoy Gateway setup adds on
/// its routes only (where the generated filter chain is not in the files,
/// so only what the routes do is known).
pub(super) fn mesh_session_header_lints(
    r: &mut Report,
    loc: &str,
    cfg: &Config,
    docs: &[Document],
) {
    for p in &cfg.policies {
        for (i, h) in session_headers(p) {
            if let Some(first) = mesh_additions(docs, h).first() {
                r.warn_once(loc, format!(
                    "policy \"{}\": budget.session[{i}] header:{h} is added by {first}, which Envoy applies in the router, after loopguard has run: loopguard never sees that value, so requests carry the header only if clients send it (sessions without it are not capped per session); set it in a filter that runs before loopguard instead",
                    p.id
                ));
            }
        }
    }
}
