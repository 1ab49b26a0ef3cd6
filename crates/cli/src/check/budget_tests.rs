//! `loopguard check` on spend caps: the core's errors with policy and
//! field, a dollar cap without prices, and `header:` session sources
//! against what the Envoy configuration around loopguard does to them.

use super::tests::{bootstrap, findings, BUFFER, ROUTER};
use serde_json::{json, Value};

/// A policy with `budget` (and `extra` top-level fields).
fn config(budget: Value, extra: Value) -> String {
    let mut c = json!({"policies": [{"id": "agents", "spec": {
        "selector": {"pathPrefix": "/v1/"}, "budget": budget}}]});
    if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    c.to_string()
}

fn prices() -> Value {
    json!({"prices": {"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10}}})
}

const SESSION_HOUR: &str =
    r#"{"name": "session-hour", "per": "session", "window_seconds": 3600, "usd": 5}"#;
const CALLER_DAY: &str =
    r#"{"name": "caller-day", "per": "caller", "window_seconds": 86400, "usd": 50}"#;

fn limits(list: &[&str]) -> Value {
    serde_json::from_str(&format!("[{}]", list.join(","))).unwrap()
}

/// The findings of `config` in an Envoy bootstrap: `filters` around
/// LOOPGUARD (then the buffer filter and the router), `routes` inline.
fn in_envoy(config: &str, before: &str, after: &str, routes: &str) -> Vec<String> {
    let filters = format!("[{before}LOOPGUARD, {BUFFER}, {after}{ROUTER}]");
    findings(&[("envoy.yaml", &bootstrap(&filters, routes, "", config))])
}

const ROUTES: &str = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}}]";
const WHERE: &str = "envoy.yaml filter \"loopguard\": warning: ";

#[test]
fn budget_errors_name_the_policy_and_the_field() {
    let cases = [
        (
            json!({"limits": [{"name": "h", "per": "session", "window_seconds": 30, "usd": 5}]}),
            "policy \"agents\": budget.limits[0].window_seconds must be >= 60 (got 30)",
        ),
        (
            json!({"limits": [{"name": "h", "per": "session", "window_seconds": 60, "usd": 5, "calls": 3}]}),
            "policy \"agents\": budget.limits[0] must give exactly one cap: usd, tokens or calls",
        ),
        (
            json!({"limits": [{"name": "Hour", "per": "session", "window_seconds": 60, "calls": 3}]}),
            "policy \"agents\": budget.limits[0].name must match [a-z0-9_-]{1,32} (got \"Hour\")",
        ),
        (
            json!({"limits": [{"name": "h", "per": "session", "window_seconds": 60, "calls": 3}], "session": ["cookie:sid"]}),
            "policy \"agents\": budget.session[0] must be header:<name>, body:<field>, jwt:<claim> or jwt_verified:<claim> (got \"cookie:sid\")",
        ),
        (
            json!({"limits": [{"name": "h", "per": "session", "window_seconds": 60, "calls": 3}], "warn_at": 1}),
            "policy \"agents\": budget.warn_at must be a number from 0 (no warning) to below 1 (got 1)",
        ),
    ];
    for (budget, message) in cases {
        let c = config(budget, json!({}));
        assert_eq!(
            findings(&[("p.json", &c)]),
            [format!("p.json: error: {message}")]
        );
        // In Envoy too, where the error stops the rest of the checks.
        assert_eq!(
            in_envoy(&c, "", "", ROUTES),
            [format!("envoy.yaml filter \"loopguard\": error: {message}")]
        );
    }
}

#[test]
fn a_dollar_cap_that_ignores_unpriced_models_is_warned_of() {
    // Without prices, the built-in table prices the models: no finding.
    let c = config(
        json!({"limits": limits(&[SESSION_HOUR, CALLER_DAY]), "session": ["body:user"]}),
        json!({}),
    );
    assert!(findings(&[("p.json", &c)]).is_empty());
    let ignore = config(
        json!({"limits": limits(&[SESSION_HOUR, CALLER_DAY]), "session": ["body:user"], "unpriced": "ignore"}),
        json!({}),
    );
    let warning = |i: usize, name: &str, cap: &str, per: &str, window: u32| {
        format!("p.json: warning: policy \"agents\": budget.limits[{i}] \"{name}\" is a dollar cap (${cap} per {per} in {window} s) with budget.unpriced: ignore: a model neither \"prices\" nor the built-in table prices spends nothing against it (loopguard_budget_unpriced_total counts such calls); leave unpriced out to charge them at their provider's highest price, or cap tokens or calls as well")
    };
    assert_eq!(
        findings(&[("p.json", &ignore)]),
        [
            warning(0, "session-hour", "5.00", "session", 3600),
            warning(1, "caller-day", "50.00", "caller", 86400),
        ]
    );
    // Wherever the configuration is: here in Envoy.
    let got = in_envoy(&ignore, "", "", ROUTES);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].starts_with(&format!(
            "{WHERE}policy \"agents\": budget.limits[0] \"session-hour\" is a dollar cap"
        )),
        "{got:#?}"
    );
    // `unpriced` without a dollar cap is a configuration error.
    let tokens = config(
        json!({"limits": [{"name": "t", "per": "caller", "window_seconds": 60, "tokens": 1000}], "unpriced": "reject"}),
        json!({}),
    );
    assert_eq!(
        findings(&[("p.json", &tokens)]),
        ["p.json: error: policy \"agents\": budget.unpriced applies only to a dollar cap (a limit with usd); remove it or add one"]
    );
}

/// Session caps alone, read from the default `header:x-session-id`.
fn session_only() -> String {
    config(json!({"limits": limits(&[SESSION_HOUR])}), prices())
}

const NOTHING_SETS_IT: &str = "policy \"agents\": budget.session[0] header:x-session-id is set by nothing in this Envoy configuration before loopguard: requests carry it only if clients send it (sessions without it are not capped per session), and the policy has no per: caller cap to hold a client that leaves it out; add one as the ceiling, or set the header in a filter ahead of loopguard (header_mutation, or jwt_authn's claim_to_headers)";

#[test]
fn a_session_header_nothing_sets_is_the_clients_word() {
    assert_eq!(
        in_envoy(&session_only(), "", "", ROUTES),
        [format!("{WHERE}{NOTHING_SETS_IT}")]
    );
    // A plain policy says nothing of where its headers come from.
    assert!(findings(&[("p.json", &session_only())]).is_empty());
    // A caller cap holds a client that sends no session id.
    let with_caller = config(
        json!({"limits": limits(&[SESSION_HOUR, CALLER_DAY])}),
        prices(),
    );
    assert!(in_envoy(&with_caller, "", "", ROUTES).is_empty());
    // The budget example: a caller cap, clients send the session id.
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/budget/envoy.yaml"),
    )
    .unwrap();
    assert_eq!(findings(&[("envoy.yaml", &example)]), Vec::<String>::new());
    // Each header source is named; a body source says nothing.
    let two = config(
        json!({"limits": limits(&[SESSION_HOUR]),
               "session": ["body:user", "header:x-session-id", "header:X-LiteLLM-Trace-Id"]}),
        prices(),
    );
    let got = in_envoy(&two, "", "", ROUTES);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].contains("budget.session[1] header:x-session-id is set by nothing"),
        "{got:#?}"
    );
    assert!(
        got[1].contains("budget.session[2] header:x-litellm-trace-id is set by nothing"),
        "{got:#?}"
    );
    // No session cap: the sources are never read.
    let callers = config(json!({"limits": limits(&[CALLER_DAY])}), prices());
    assert!(in_envoy(&callers, "", "", ROUTES).is_empty());
}

#[test]
fn a_session_header_a_filter_before_loopguard_sets_is_always_there() {
    let before = [
        // header_mutation, from a JWT claim loopguard cannot see otherwise.
        r#"{name: session, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation,
            mutations: {request_mutations: [{append: {header: {key: X-Session-Id, value: "%REQ(x-agent-run)%"}, append_action: OVERWRITE_IF_EXISTS_OR_ADD}}]}}}, "#,
        r#"{name: jwt, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication,
            providers: {idp: {issuer: i, claim_to_headers: [{header_name: x-session-id, claim_name: sid}]}}}}, "#,
        r#"{name: lua, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua,
            default_source_code: {inline_string: "function envoy_on_request(h) h:headers():add('x-session-id', 'run') end"}}}, "#,
    ];
    for b in before {
        assert_eq!(
            in_envoy(&session_only(), b, "", ROUTES),
            Vec::<String>::new(),
            "{b}"
        );
    }
    // The connection manager's early header mutation.
    let b = bootstrap(&format!("[LOOPGUARD, {BUFFER}, {ROUTER}]"), ROUTES, "", &session_only()).replace(
        "          http_filters:",
        "          early_header_mutation_extensions: [{name: m, typed_config: {\"@type\": type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation, mutations: [{append: {header: {key: x-session-id, value: v}}}]}}]\n          http_filters:",
    );
    assert_eq!(findings(&[("envoy.yaml", &b)]), Vec::<String>::new());
    // A filter that may set any header: this cannot tell.
    let ext_authz = r#"{name: authz, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz, grpc_service: {envoy_grpc: {cluster_name: api}}}}, "#;
    assert_eq!(
        in_envoy(&session_only(), ext_authz, "", ROUTES),
        Vec::<String>::new()
    );
    let lua_file = r#"{name: lua, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua, default_source_code: {filename: /etc/envoy/session.lua}}}, "#;
    assert_eq!(
        in_envoy(&session_only(), lua_file, "", ROUTES),
        Vec::<String>::new()
    );
    // A Lua script about something else sets nothing.
    let lua_other = r#"{name: lua, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua, default_source_code: {inline_string: "function envoy_on_request(h) end"}}}, "#;
    assert_eq!(
        in_envoy(&session_only(), lua_other, "", ROUTES),
        [format!("{WHERE}{NOTHING_SETS_IT}")]
    );
}

#[test]
fn a_session_header_added_on_a_route_never_reaches_loopguard() {
    // Even with a caller cap: the operator meant Envoy to set it.
    let c = config(
        json!({"limits": limits(&[SESSION_HOUR, CALLER_DAY])}),
        prices(),
    );
    let routes = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}, request_headers_to_add: [{header: {key: x-session-id, value: '%REQ(x-run)%'}}]}]";
    assert_eq!(
        in_envoy(&c, "", "", routes),
        [format!("{WHERE}policy \"agents\": budget.session[0] header:x-session-id is added by route \"llm\" (request_headers_to_add), which Envoy applies in the router, after loopguard has run: loopguard never sees that value, so requests carry the header only if clients send it (sessions without it are not capped per session); set it before loopguard instead (a header_mutation filter ahead of it, or the connection manager's early_header_mutation_extensions)")]
    );
    // On the virtual host, or by a header_mutation filter after loopguard.
    let b = bootstrap(&format!("[LOOPGUARD, {BUFFER}, {ROUTER}]"), ROUTES, "", &c).replace(
        "              domains: [\"*\"]",
        "              domains: [\"*\"]\n              request_headers_to_add: [{header: {key: x-session-id, value: v}}]",
    );
    let got = findings(&[("envoy.yaml", &b)]);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(
        got[0].contains(
            "header:x-session-id is added by virtual host \"all\" (request_headers_to_add)"
        ),
        "{got:#?}"
    );
    let after = r#"{name: copy, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation,
            mutations: {request_mutations: [{append: {header: {key: x-session-id, value: v}}}]}}}, "#;
    let got = in_envoy(&c, "", after, ROUTES);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(got[0].contains("header:x-session-id is added by header_mutation filter \"copy\" (after loopguard), which Envoy applies"), "{got:#?}");
}

#[test]
fn a_session_header_removed_before_loopguard_is_never_seen() {
    let c = config(
        json!({"limits": limits(&[SESSION_HOUR, CALLER_DAY])}),
        prices(),
    );
    let strip = r#"{name: strip, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation,
            mutations: {request_mutations: [{remove: x-session-id}]}}}, "#;
    assert_eq!(
        in_envoy(&c, strip, "", ROUTES),
        [format!("{WHERE}policy \"agents\": budget.session[0] header:x-session-id is removed by header_mutation filter \"strip\" before loopguard runs: loopguard never sees it there, and sessions it would name are not capped per session")]
    );
    let b = bootstrap(&format!("[LOOPGUARD, {BUFFER}, {ROUTER}]"), ROUTES, "", &c).replace(
        "            virtual_hosts:",
        "            internal_only_headers: [x-session-id]\n            virtual_hosts:",
    );
    let got = findings(&[("envoy.yaml", &b)]);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(got[0].contains("header:x-session-id is removed by the route configuration's internal_only_headers (on requests from outside) before loopguard runs"), "{got:#?}");
}

#[test]
fn a_session_header_a_mesh_route_adds_never_reaches_loopguard() {
    let plugin = format!(
        "apiVersion: extensions.istio.io/v1alpha1\nkind: WasmPlugin\nmetadata: {{name: loopguard, namespace: gw}}\nspec:\n  pluginName: loopguard\n  failStrategy: FAIL_RELOAD\n  pluginConfig: {}\n",
        config(json!({"limits": limits(&[SESSION_HOUR, CALLER_DAY])}), prices()).replace("\"selector\":{\"pathPrefix\":\"/v1/\"}", "\"selector\":{\"pathPrefix\":\"/v1/\",\"methods\":[\"GET\"]}")
    );
    let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: llm, namespace: gw}\nspec:\n  http:\n  - name: llm\n    headers: {request: {set: {x-session-id: run}}}\n    route: [{destination: {host: api}}]\n";
    let got = findings(&[("wp.yaml", &plugin), ("vs.yaml", vs)]);
    assert_eq!(got, ["wp.yaml (WasmPlugin gw/loopguard) spec.pluginConfig: warning: policy \"agents\": budget.session[0] header:x-session-id is added by VirtualService \"gw/llm\" route \"llm\" (headers.request), which Envoy applies in the router, after loopguard has run: loopguard never sees that value, so requests carry the header only if clients send it (sessions without it are not capped per session); set it in a filter that runs before loopguard instead"]);
    let eep = format!(
        "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyExtensionPolicy\nmetadata: {{name: loopguard, namespace: llm}}\nspec:\n  targetRefs: [{{group: gateway.networking.k8s.io, kind: HTTPRoute, name: llm}}]\n  wasm:\n  - name: loopguard\n    rootID: loopguard\n    failOpen: true\n    code: {{type: Image, image: {{url: \"oci://r/loopguard:0.1.0\"}}}}\n    config: {}\n",
        config(json!({"limits": limits(&[SESSION_HOUR, CALLER_DAY])}), prices()).replace("\"selector\":{\"pathPrefix\":\"/v1/\"}", "\"selector\":{\"pathPrefix\":\"/v1/\",\"methods\":[\"GET\"]}")
    );
    let route = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: llm, namespace: llm}\nspec:\n  rules:\n  - backendRefs: [{name: api, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: X-Session-Id, value: run}]}}]}]\n";
    let got = findings(&[("eep.yaml", &eep), ("route.yaml", route)]);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(
        got[0].contains(
            "header:x-session-id is added by HTTPRoute \"llm/llm\" (RequestHeaderModifier)"
        ),
        "{got:#?}"
    );
}
