//! Envoy routes where loopguard runs against the policies that select them.

use super::{quoted_list, Report};
use loopguard_core::config::{Config, PathMatch, Policy};
use loopguard_core::request::policy::path_matches;
use serde_json::Value;

/// Routes (where loopguard runs) against the policies that select them.
pub(super) fn route_lints(r: &mut Report, loc: &str, cfg: &Config, routes: &[&Value]) {
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

/// Routes an MCP policy can select, against what MCP needs of them: no
/// route timeout (Envoy's default is 15 s), since an event stream (a GET
/// stream, a result sent as SSE) stays open for as long as the session or
/// the tool call takes.
pub(super) fn mcp_route_lints(r: &mut Report, loc: &str, cfg: &Config, routes: &[&Value]) {
    for p in cfg.policies.iter().filter(|p| p.mcp.is_some()) {
        for route in routes {
            let Some(action) = route.get("route") else {
                // A redirect or a direct response: nothing streams.
                continue;
            };
            let by_name = route
                .get("name")
                .and_then(Value::as_str)
                .is_some_and(|n| p.selector.routes.iter().any(|r| r == n));
            if !(by_name || p.selector.routes.is_empty() && path_reachable(p, &[route])) {
                continue;
            }
            let which = route.get("name").and_then(Value::as_str).map_or_else(
                || format!("the route matching {}", show_match(route)),
                |n| format!("route \"{n}\""),
            );
            let timeout = action.get("timeout");
            let problem = match timeout {
                None => Some("has no timeout, so Envoy's default of 15 s applies".to_string()),
                Some(t) if is_zero_duration(t) => None,
                Some(t) => Some(format!(
                    "has timeout {}",
                    t.as_str().map_or_else(|| t.to_string(), str::to_string)
                )),
            };
            if let Some(problem) = problem {
                r.warn(loc, format!("policy \"{}\" reads MCP traffic on {which}, which {problem}: Envoy ends every response on the route at that time, so an MCP event stream (the GET stream a client keeps open, a tool result sent as server-sent events) or a tool call that lasts longer is cut (a 504, or the stream reset once it has begun); set timeout: 0s on MCP routes", p.id));
            }
        }
    }
}

/// `0s`, `0.000s`, or `{seconds: 0}`: no timeout.
fn is_zero_duration(v: &Value) -> bool {
    match v {
        Value::String(s) => s
            .trim()
            .strip_suffix('s')
            .and_then(|n| n.parse::<f64>().ok())
            .is_some_and(|n| n == 0.0),
        Value::Object(o) => {
            let n = |k: &str| o.get(k).and_then(Value::as_f64).unwrap_or(0.0);
            n("seconds") == 0.0 && n("nanos") == 0.0
        }
        _ => false,
    }
}

fn show_match(route: &Value) -> String {
    let m = route.get("match");
    let part = |k: &str| m.and_then(|m| m.get(k)).and_then(Value::as_str);
    match (part("prefix"), part("path")) {
        (Some(p), _) => format!("prefix \"{p}\""),
        (None, Some(p)) => format!("path \"{p}\""),
        _ => "its matcher".to_string(),
    }
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
