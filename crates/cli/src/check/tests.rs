//! Tests of `loopguard check`: plain policies and Envoy, Istio and Envoy Gateway setups.

use super::*;
use crate::discover::{BUFFER_TYPE, HCM_TYPE};
use crate::documents::parse;

pub(super) fn findings(files: &[(&str, &str)]) -> Vec<String> {
    let docs: Vec<Document> = files
        .iter()
        .flat_map(|(name, text)| parse(name, text).unwrap())
        .collect();
    check(&docs).iter().map(|f| f.to_string()).collect()
}

const POLICY: &str = r#"{"policies": [{"id": "agents", "spec": {"selector": {"pathPrefix": "/v1/", "routes": ["llm"]},
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}}]}"#;

pub(super) fn bootstrap(filters: &str, routes: &str, plugin_extra: &str, config: &str) -> String {
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

pub(super) const BUFFER: &str = r#"{name: envoy.filters.http.buffer, typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer, max_request_bytes: 1048576}}"#;
pub(super) const ROUTER: &str = "{name: envoy.filters.http.router}";

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
        ["x.yaml: error: holds no loopguard configuration (a policy JSON, an Envoy config with the loopguard Wasm filter or dynamic module, a WasmPlugin or an EnvoyExtensionPolicy)"]
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
    let new_form = filter(
        "extensions.istio.io/trafficextension/istio-ingress.loopguard~istio-translated-wasmplugin",
    );
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

#[test]
fn mcp_policies_and_their_routes() {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mcp/envoy.yaml"),
    )
    .unwrap();
    assert_eq!(
        findings(&[("examples/mcp/envoy.yaml", &example)]),
        Vec::<String>::new()
    );
    // A field out of range names the policy and the field.
    let bad = example.replace("\"same_result_min\": 3", "\"same_result_min\": 1");
    assert_eq!(
        findings(&[("mcp.yaml", &bad)]),
        ["mcp.yaml filter \"loopguard\": error: policy \"mcp-tools\": mcp.same_result_min must be >= 2 (got 1)"]
    );
    let bad = example.replace(
        "\"ladder\": [\"note\", \"block\"]",
        "\"ladder\": [\"block\", \"note\"]",
    );
    assert!(findings(&[("mcp.yaml", &bad)])[0]
        .contains("policy \"mcp-tools\": mcp.ladder must list its steps in the order note, block"));
    // A route timeout cuts event streams: Envoy's default 15 s, or any.
    let mcp = r#"{"hold_request_headers": true, "policies": [{"id": "tools", "spec": {"selector": {"pathPrefix": "/mcp"}, "mcp": {"enabled": true}}}]}"#;
    let setup = |routes: &str| {
        bootstrap(
            &format!("[LOOPGUARD, {ROUTER}]"),
            routes,
            "allow_on_headers_stop_iteration: true,",
            mcp,
        )
    };
    let ok = setup("[{match: {prefix: /mcp}, route: {cluster: api, timeout: 0s}}, {name: other, match: {prefix: /v1}, route: {cluster: api}}]");
    assert_eq!(findings(&[("envoy.yaml", &ok)]), Vec::<String>::new());
    let got = findings(&[(
        "envoy.yaml",
        &setup("[{name: mcp, match: {prefix: /}, route: {cluster: api}}, {match: {path: /mcp}, route: {cluster: api, timeout: 30s}}, {match: {prefix: /mcp/x}, redirect: {path_redirect: /}}]"),
    )]);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].starts_with("envoy.yaml filter \"loopguard\": warning: policy \"tools\" reads MCP traffic on route \"mcp\", which has no timeout, so Envoy's default of 15 s applies"), "{got:#?}");
    assert!(
        got[1].contains("on the route matching path \"/mcp\", which has timeout 30s"),
        "{got:#?}"
    );
    assert!(
        got[1].ends_with("set timeout: 0s on MCP routes"),
        "{got:#?}"
    );
    // {seconds: 0} is no timeout too.
    let zero = setup("[{match: {prefix: /}, route: {cluster: api, timeout: {seconds: 0}}}]");
    assert_eq!(findings(&[("envoy.yaml", &zero)]), Vec::<String>::new());
    // A tools/call is a POST.
    let get_only = mcp.replace(
        "\"pathPrefix\": \"/mcp\"",
        "\"pathPrefix\": \"/mcp\", \"methods\": [\"GET\"]",
    );
    assert_eq!(
        findings(&[("p.json", &get_only)]),
        ["p.json: warning: policy \"tools\": mcp judges tools/call requests, which are POSTs, but selector.methods lists only GET: the policy never judges a call"]
    );
}

// --- the native module (libloopguard_native.so) ------------------------------

use super::native::{DYNAMIC_MODULE_FILTER_TYPE, DYNAMIC_MODULE_PER_ROUTE_TYPE};

/// loopguard's DynamicModuleFilter: `module_extra` goes into
/// `dynamic_module_config`, `filter_config` is the whole Any.
fn native_filter_with(module_extra: &str, filter_config: &str) -> String {
    format!(
        r#"{{name: loopguard, typed_config: {{"@type": {DYNAMIC_MODULE_FILTER_TYPE}, dynamic_module_config: {{{module_extra} module: {{local: {{filename: /etc/envoy/modules/libloopguard_native.so}}}}}}, filter_name: loopguard, filter_config: {filter_config}}}}}"#
    )
}

fn native_filter(module_extra: &str, config: &str) -> String {
    native_filter_with(
        module_extra,
        &format!(
            r#"{{"@type": type.googleapis.com/google.protobuf.StringValue, value: {}}}"#,
            serde_json::to_string(config).unwrap()
        ),
    )
}

const STRIP_PREFIX: &str = "layered_runtime: {layers: [{name: static, static_layer: {envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix: true}}]}\n";
const WASM_NAMESPACE: &str = "metrics_namespace: wasmcustom,";

/// A bootstrap with `filters` (NATIVE stands for loopguard's module with
/// `metrics_namespace: wasmcustom` and `config`) and the runtime flag.
fn native_bootstrap(filters: &str, routes: &str, config: &str) -> String {
    bootstrap(
        &filters.replace("NATIVE", &native_filter(WASM_NAMESPACE, config)),
        routes,
        "",
        config,
    ) + STRIP_PREFIX
}

#[test]
fn the_native_example_and_a_bad_field_in_it() {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/native/envoy.yaml"),
    )
    .unwrap();
    assert_eq!(
        findings(&[("examples/native/envoy.yaml", &example)]),
        Vec::<String>::new()
    );
    // Validated as the Wasm configuration is: the policy and the field.
    let bad = example.replace(
        "\"threshold_identical_requests\": 5",
        "\"threshold_identical_requests\": 1",
    );
    assert_eq!(
        findings(&[("native.yaml", &bad)]),
        ["native.yaml filter \"loopguard\": error: policy \"llm-policy\": loop_detection.threshold_identical_requests must be >= 2 (got 1); use 0 to switch the policy off"]
    );
    let unknown = example.replace(
        "\"similarity\": \"exact\"",
        "\"similarity\": \"exact\", \"treshold\": 3",
    );
    assert!(findings(&[("native.yaml", &unknown)])[0]
        .starts_with("native.yaml filter \"loopguard\": error: policy \"llm-policy\": loop_detection.treshold is not a known field"));
}

#[test]
fn a_native_setup_gets_the_wasm_setups_route_and_buffer_checks() {
    let routes = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}}]";
    // Holding needs no Envoy flag natively: the one-filter setup is clean.
    let hold = POLICY.replacen('{', "{\"hold_request_headers\": true, ", 1);
    let b = native_bootstrap(&format!("[NATIVE, {ROUTER}]"), routes, &hold);
    assert_eq!(findings(&[("envoy.yaml", &b)]), Vec::<String>::new());
    // So is the buffer-filter setup.
    let b = native_bootstrap(&format!("[NATIVE, {BUFFER}, {ROUTER}]"), routes, POLICY);
    assert_eq!(findings(&[("envoy.yaml", &b)]), Vec::<String>::new());
    // The same route and buffer findings as for the Wasm filter.
    let b = native_bootstrap(
        &format!("[{BUFFER}, NATIVE, {ROUTER}]"),
        "[{name: other, match: {prefix: /v2/}, route: {cluster: api}}]",
        POLICY,
    );
    let got = findings(&[("envoy.yaml", &b)]);
    let expect = [
        "envoy.yaml filter \"loopguard\": warning: the buffer filter runs before loopguard",
        "envoy.yaml filter \"loopguard\": warning: policy \"agents\": selector.routes lists \"llm\", but no route where loopguard runs has such a name: the policy never applies",
    ];
    assert_eq!(got.len(), expect.len(), "{got:#?}");
    for (g, e) in got.iter().zip(expect) {
        assert!(g.starts_with(e), "{g} should start with {e}");
    }
}

#[test]
fn native_stat_names_differ_without_the_wasm_namespace_and_the_runtime_flag() {
    let routes = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}}]";
    let hold = POLICY.replacen('{', "{\"hold_request_headers\": true, ", 1);
    let unset = bootstrap(
        &format!("[{}, {ROUTER}]", native_filter("", &hold)),
        routes,
        "",
        &hold,
    ) + STRIP_PREFIX;
    assert_eq!(
        findings(&[("envoy.yaml", &unset)]),
        ["envoy.yaml filter \"loopguard\": warning: dynamic_module_config.metrics_namespace is unset (Envoy's default: dynamicmodulescustom), not wasmcustom: loopguard's stats are then named dynamicmodulescustom.loopguard.* instead of wasmcustom.loopguard.*, and the stats_tags of docs/observability.md, the Grafana dashboard and the alert rules, written for those, miss them; set metrics_namespace: wasmcustom"]
    );
    let other = bootstrap(
        &format!(
            "[{}, {ROUTER}]",
            native_filter("metrics_namespace: lg,", &hold)
        ),
        routes,
        "",
        &hold,
    ) + STRIP_PREFIX;
    assert!(findings(&[("envoy.yaml", &other)])[0].contains(
        "metrics_namespace is \"lg\", not wasmcustom: loopguard's stats are then named lg.loopguard.*"
    ));
    // The runtime flag, flat or nested; only a bootstrap is looked at.
    let no_flag =
        native_bootstrap(&format!("[NATIVE, {ROUTER}]"), routes, &hold).replace(STRIP_PREFIX, "");
    assert_eq!(
        findings(&[("envoy.yaml", &no_flag)]),
        ["envoy.yaml filter \"loopguard\": warning: the bootstrap's layered_runtime does not set envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix: true: Envoy then exports loopguard's metrics to Prometheus as envoy_wasmcustom_loopguard_* instead of loopguard_*, the names the Grafana dashboard and the alert rules query; set it in a static_layer"]
    );
    let nested = no_flag.clone()
        + "layered_runtime: {layers: [{name: s, static_layer: {envoy: {reloadable_features: {dynamic_modules_strip_custom_stat_prefix: true}}}}]}\n";
    assert_eq!(findings(&[("envoy.yaml", &nested)]), Vec::<String>::new());
    let listener_only = format!(
        "name: main\nfilter_chains:\n- filters:\n  - name: envoy.filters.network.http_connection_manager\n    typed_config:\n      \"@type\": {HCM_TYPE}\n      http_filters: [{}, {ROUTER}]\n",
        native_filter(WASM_NAMESPACE, &hold)
    );
    assert_eq!(
        findings(&[("listener.yaml", &listener_only)]),
        Vec::<String>::new()
    );
}

#[test]
fn verified_jwt_claims_are_not_available_natively() {
    let routes = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}}]";
    let jwt = r#"{"hold_request_headers": true, "policies": [{"id": "tenants", "spec": {"selector": {"pathPrefix": "/v1/"},
        "limit_keys": ["jwt_verified:sub"], "exempt": [{"key": "jwt_verified:batch", "present": true}],
        "loop_detection": {"enabled": true, "window_seconds": 60, "threshold_identical_requests": 3}}}]}"#;
    let b = native_bootstrap(&format!("[NATIVE, {ROUTER}]"), routes, jwt);
    assert_eq!(
        findings(&[("envoy.yaml", &b)]),
        [
            "envoy.yaml filter \"loopguard\": error: policy \"tenants\": limit_keys lists \"jwt_verified:sub\", which is not available in the native module: Envoy's dynamic-module ABI reads only top-level metadata keys, and jwt_authn nests the verified claims under \"jwt_payload\", so the key is absent on every request and all callers share one count; have jwt_authn copy the claim into a header (claim_to_headers: [{header_name: x-jwt-sub, claim_name: sub}]) and use \"header:x-jwt-sub\", or run the Wasm module",
            "envoy.yaml filter \"loopguard\": error: policy \"tenants\": exempt key \"jwt_verified:batch\" is not available in the native module: Envoy's dynamic-module ABI reads only top-level metadata keys, and jwt_authn nests the verified claims under \"jwt_payload\", so the key is absent on every request (present: false exempts every request, values never match); have jwt_authn copy the claim into a header (claim_to_headers: [{header_name: x-jwt-batch, claim_name: batch}]) and use \"header:x-jwt-batch\", or run the Wasm module",
        ]
    );
    // Budget sources too: a user named by a verified claim.
    let users = r#"{"hold_request_headers": true, "policies": [{"id": "tenants", "spec": {"selector": {"pathPrefix": "/v1/"},
        "budget": {"limits": [{"name": "m", "per": "user", "window_seconds": 2592000, "calls": 1000}],
            "user": ["jwt_verified:email", "body:user"]}}}]}"#;
    let b = native_bootstrap(&format!("[NATIVE, {ROUTER}]"), routes, users);
    let got = findings(&[("envoy.yaml", &b)]);
    assert!(
        got.iter().any(|f| f.starts_with("envoy.yaml filter \"loopguard\": error: policy \"tenants\": budget.user[0] \"jwt_verified:email\" is not available in the native module")
            && f.contains("so it never names a user; have jwt_authn copy the claim into a header (claim_to_headers: [{header_name: x-jwt-email, claim_name: email}])")),
        "{got:#?}"
    );
    // The Wasm filter reads them.
    let wasm = bootstrap(
        &format!("[LOOPGUARD, {ROUTER}]"),
        routes,
        "allow_on_headers_stop_iteration: true,",
        jwt,
    );
    assert_eq!(findings(&[("envoy.yaml", &wasm)]), Vec::<String>::new());
}

#[test]
fn a_per_route_configuration_for_the_module_is_refused() {
    let hold = POLICY.replacen('{', "{\"hold_request_headers\": true, ", 1);
    let per_route = |config: &str| {
        format!("[{{name: llm, match: {{prefix: /v1/}}, route: {{cluster: api}}, typed_per_filter_config: {{loopguard: {config}}}}}]")
    };
    let direct = format!(
        r#"{{"@type": {DYNAMIC_MODULE_PER_ROUTE_TYPE}, dynamic_module_config: {{name: loopguard_native}}, filter_config: {{"@type": type.googleapis.com/google.protobuf.StringValue, value: "{{}}"}}}}"#
    );
    let b = native_bootstrap(&format!("[NATIVE, {ROUTER}]"), &per_route(&direct), &hold);
    assert_eq!(
        findings(&[("envoy.yaml", &b)]),
        ["envoy.yaml typed_per_filter_config \"loopguard\": error: route \"llm\" carries a DynamicModuleFilterPerRoute for loopguard, which takes no per-route configuration: Envoy refuses the configuration that carries it (\"Failed to initialize per-route dynamic module\"); choose policies by route name (selector.routes) or route metadata (filter_metadata.loopguard.policy), and switch loopguard off on a route with {\"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true}"]
    );
    // Wrapped in a FilterConfig, too.
    let wrapped = format!(
        r#"{{"@type": type.googleapis.com/envoy.config.route.v3.FilterConfig, config: {direct}}}"#
    );
    let b = native_bootstrap(&format!("[NATIVE, {ROUTER}]"), &per_route(&wrapped), &hold);
    assert_eq!(findings(&[("envoy.yaml", &b)]).len(), 1);
    // Switching it off on a route is fine, and that route is not judged.
    let off = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}}, {name: health, match: {prefix: /v2/}, route: {cluster: api}, typed_per_filter_config: {loopguard: {\"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true}}}]";
    let b = native_bootstrap(&format!("[NATIVE, {ROUTER}]"), off, &hold);
    assert_eq!(findings(&[("envoy.yaml", &b)]), Vec::<String>::new());
}

#[test]
fn native_filter_config_shapes() {
    let routes = "[{name: llm, match: {prefix: /v1/}, route: {cluster: api}}]";
    let hold = POLICY.replacen('{', "{\"hold_request_headers\": true, ", 1);
    let with = |filter_config: &str| {
        bootstrap(
            &format!(
                "[{}, {ROUTER}]",
                native_filter_with(WASM_NAMESPACE, filter_config)
            ),
            routes,
            "",
            &hold,
        ) + STRIP_PREFIX
    };
    // BytesValue: base64 of the JSON.
    let bytes = format!(
        r#"{{"@type": type.googleapis.com/google.protobuf.BytesValue, value: "{}"}}"#,
        base64(hold.as_bytes())
    );
    assert_eq!(
        findings(&[("envoy.yaml", &with(&bytes))]),
        Vec::<String>::new()
    );
    // Struct: the object inline, numbers arriving as doubles.
    let inline = "{\"@type\": type.googleapis.com/google.protobuf.Struct, value: {hold_request_headers: true, policies: [{id: agents, spec: {selector: {pathPrefix: /v1/, routes: [llm]}, loop_detection: {enabled: true, window_seconds: 60, threshold_identical_requests: 3}}}]}}";
    assert_eq!(
        findings(&[("envoy.yaml", &with(inline))]),
        Vec::<String>::new()
    );
    assert_eq!(
        findings(&[("envoy.yaml", &with(&inline.replace("requests: 3", "requests: 2.5")))]),
        ["envoy.yaml filter \"loopguard\": error: policy \"agents\": loop_detection.threshold_identical_requests must be a whole number from 0 to 1024 (got 2.5)"]
    );
    // Another type, or none at all.
    let any = "{\"@type\": type.googleapis.com/google.protobuf.Duration, value: 1s}";
    assert_eq!(
        findings(&[("envoy.yaml", &with(any))]),
        ["envoy.yaml filter \"loopguard\": error: filter_config must be a google.protobuf.StringValue (or BytesValue, or Struct) holding loopguard's configuration (got type.googleapis.com/google.protobuf.Duration)"]
    );
    let none = with("{}").replace(", filter_config: {}", "");
    assert!(findings(&[("envoy.yaml", &none)])[0]
        .contains("error: the dynamic module filter has no filter_config"));
    // Another module's filter is not loopguard's.
    let other = with("{\"@type\": type.googleapis.com/google.protobuf.StringValue, value: x}")
        .replace("filter_name: loopguard", "filter_name: waf")
        .replace("libloopguard_native.so", "libwaf.so");
    assert_eq!(findings(&[("envoy.yaml", &other)]), Vec::<String>::new());
}

fn base64(data: &[u8]) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let n = chunk.iter().fold(0u32, |a, b| (a << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
        out.push_str(&"=".repeat(3 - chunk.len()));
    }
    out
}

#[test]
fn the_envoy_gateway_native_examples_check_clean() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/envoy-gateway");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let (proxy, policy) = (
        read("envoyproxy-native.yaml"),
        read("extension-policy-native.yaml"),
    );
    assert_eq!(
        findings(&[
            ("envoyproxy-native.yaml", &proxy),
            ("extension-policy-native.yaml", &policy)
        ]),
        Vec::<String>::new()
    );
    let all: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    let all: Vec<(&str, &str)> = all.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(findings(&all), Vec::<String>::new());
}

const EG_NATIVE_POLICY: &str = r#"
apiVersion: gateway.envoyproxy.io/v1alpha1
kind: EnvoyExtensionPolicy
metadata: {name: loopguard, namespace: llm}
spec:
  targetRefs: [{group: gateway.networking.k8s.io, kind: HTTPRoute, name: llm}]
  dynamicModule:
  - name: loopguard
    filterName: loopguard
    config:
      hold_request_headers: true
      policies:
      - {id: agents, spec: {selector: {pathPrefix: /v1/}, loop_detection: {enabled: true, window_seconds: 60, threshold_identical_requests: 3}}}
"#;
const EG_NATIVE_PROXY: &str = "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: EnvoyProxy\nmetadata: {name: p, namespace: llm}\nspec: {dynamicModules: [{name: loopguard, source: {type: Local, local: {path: /etc/envoy/modules/libloopguard_native.so}}}]}\n";
const EG_CLIENT_BUFFER: &str = "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: ClientTrafficPolicy\nmetadata: {name: c, namespace: llm}\nspec: {connection: {bufferLimit: 1Mi}}\n";
const EG_ROUTE: &str =
    "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: llm, namespace: llm}\nspec: {}\n";

#[test]
fn envoy_gateway_native_policy() {
    let clean = [
        ("eep.yaml", EG_NATIVE_POLICY),
        ("proxy.yaml", EG_NATIVE_PROXY),
        ("ctp.yaml", EG_CLIENT_BUFFER),
        ("route.yaml", EG_ROUTE),
    ];
    assert_eq!(findings(&clean), Vec::<String>::new());
    let loc = "eep.yaml (EnvoyExtensionPolicy llm/loopguard) spec.dynamicModule[0].config";
    // A bad field names the policy and the field.
    let bad = EG_NATIVE_POLICY.replace("window_seconds: 60", "window_seconds: 0");
    assert_eq!(
        findings(&[("eep.yaml", &bad), ("proxy.yaml", EG_NATIVE_PROXY)]),
        [format!(
            "{loc}: error: policy \"agents\": loop_detection.window_seconds must be >= 1 (got 0)"
        )]
    );
    // The module must be in an EnvoyProxy's allowlist.
    let other = EG_NATIVE_PROXY.replace("name: loopguard", "name: waf");
    assert_eq!(
        findings(&[("eep.yaml", EG_NATIVE_POLICY), ("proxy.yaml", &other), ("ctp.yaml", EG_CLIENT_BUFFER)]),
        [format!("{loc}: error: spec.dynamicModule[0].name \"loopguard\" is in the spec.dynamicModules allowlist of no EnvoyProxy in the files checked (llm/p): Envoy Gateway rejects the policy (dynamic module \"loopguard\" is not registered) and loopguard does not run; register it in the Gateway's EnvoyProxy: {{name: loopguard, source: {{type: Local, local: {{path: /etc/envoy/modules/libloopguard_native.so}}}}}}")]
    );
    // Without filterName its counts go to "default".
    let unnamed = EG_NATIVE_POLICY.replace("    filterName: loopguard\n", "");
    let clean_unnamed: Vec<(&str, &str)> = std::iter::once(("eep.yaml", unnamed.as_str()))
        .chain(clean.iter().skip(1).copied())
        .collect();
    assert_eq!(
        findings(&clean_unnamed),
        [format!("{loc}: warning: spec.dynamicModule[0].filterName is unset: Envoy then passes loopguard an empty filter name, and it keeps this policy's counts under \"default\", shared with every other loopguard filter without one; set filterName: loopguard (the name counts are kept under, as wasm[].name for the Wasm module)")]
    );
    // Found by its allowlisted file too, even with a configuration that
    // is not one.
    let guard = EG_NATIVE_POLICY
        .replace(
            "  - name: loopguard\n    filterName: loopguard\n",
            "  - name: guard\n    filterName: g\n",
        )
        .replace("policies:", "rules:");
    let proxy = EG_NATIVE_PROXY.replace("name: loopguard", "name: guard");
    let got = findings(&[("eep.yaml", &guard), ("proxy.yaml", &proxy)]);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(got[0].starts_with(&format!("{loc}: error: ")), "{got:#?}");
    let elsewhere = proxy.replace("libloopguard_native.so", "libguard.so");
    assert_eq!(
        findings(&[("eep.yaml", &guard), ("proxy.yaml", &elsewhere)]),
        ["eep.yaml: error: holds no loopguard configuration (a policy JSON, an Envoy config with the loopguard Wasm filter or dynamic module, a WasmPlugin or an EnvoyExtensionPolicy)"]
    );
    // Held bodies wait in Envoy Gateway's 32 KiB connection buffer unless raised.
    assert_eq!(
        findings(&[("eep.yaml", EG_NATIVE_POLICY), ("proxy.yaml", EG_NATIVE_PROXY)]),
        [format!("{loc}: warning: held request bodies are buffered up to the listener's per-connection buffer limit (32768 bytes by default in Envoy Gateway), below max_body_bytes (1048576): Envoy answers 413 between the two; add a BackendTrafficPolicy with spec.requestBuffer.limit of at least max_body_bytes (its buffer filter runs before dynamic modules and raises the limit) or a ClientTrafficPolicy with spec.connection.bufferLimit")]
    );
    let btp = "apiVersion: gateway.envoyproxy.io/v1alpha1\nkind: BackendTrafficPolicy\nmetadata: {name: b}\nspec: {requestBuffer: {limit: 1Mi}}\n";
    assert_eq!(
        findings(&[
            ("eep.yaml", EG_NATIVE_POLICY),
            ("proxy.yaml", EG_NATIVE_PROXY),
            ("btp.yaml", btp)
        ]),
        Vec::<String>::new()
    );
    let small = EG_CLIENT_BUFFER.replace("1Mi", "512Ki");
    assert!(findings(&[
        ("eep.yaml", EG_NATIVE_POLICY),
        ("proxy.yaml", EG_NATIVE_PROXY),
        ("ctp.yaml", &small)
    ])[0]
        .contains("held request bodies are buffered up to 524288 bytes"));
    // Without holding, the buffer must follow the module.
    let unheld = EG_NATIVE_POLICY.replace("hold_request_headers: true", "max_body_bytes: 1048576");
    let got = findings(&[
        ("eep.yaml", &unheld),
        ("proxy.yaml", EG_NATIVE_PROXY),
        ("btp.yaml", btp),
    ]);
    assert_eq!(got.len(), 1, "{got:#?}");
    assert!(
        got[0].contains(
            "warning: Envoy Gateway runs the buffer filter before dynamic modules by default"
        ),
        "{got:#?}"
    );
    let after = EG_NATIVE_PROXY.replace(
        "spec: {",
        "spec: {filterOrder: [{name: envoy.filters.http.buffer, after: envoy.filters.http.dynamic_modules}], ",
    );
    assert_eq!(
        findings(&[
            ("eep.yaml", &unheld),
            ("proxy.yaml", &after),
            ("btp.yaml", btp)
        ]),
        Vec::<String>::new()
    );
    // Verified claims, and targetRefs, as elsewhere.
    let jwt = EG_NATIVE_POLICY.replace(
        "selector: {",
        "limit_keys: [\"jwt_verified:sub\"], selector: {",
    );
    let got = findings(&[
        ("eep.yaml", &jwt),
        ("proxy.yaml", EG_NATIVE_PROXY),
        ("ctp.yaml", EG_CLIENT_BUFFER),
        ("route.yaml", &EG_ROUTE.replace("name: llm", "name: chat")),
    ]);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got[0].contains(
            "limit_keys lists \"jwt_verified:sub\", which is not available in the native module"
        ),
        "{got:#?}"
    );
    assert!(
        got[1].contains("targetRefs names HTTPRoute \"llm\", which is not among the HTTPRoutes"),
        "{got:#?}"
    );
}

/// `findings` for a given Envoy release.
fn findings_for(envoy: &str, files: &[(&str, &str)]) -> Vec<String> {
    let docs: Vec<Document> = files
        .iter()
        .flat_map(|(name, text)| parse(name, text).unwrap())
        .collect();
    let target = versions::EnvoyTarget::parse(envoy).unwrap();
    check_for(&docs, Some(&target))
        .iter()
        .map(|f| f.to_string())
        .collect()
}

#[test]
fn a_native_module_is_checked_against_the_callbacks_and_abi_of_the_release() {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/native/envoy.yaml"),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("lg-check-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let module = |abi: &str| {
        let path = dir.join(format!("{abi}.so"));
        let mut bytes = b"\x7fELF...".to_vec();
        bytes.extend_from_slice(format!("loopguard-dynamic-module-abi={abi}\0...").as_bytes());
        std::fs::write(&path, bytes).unwrap();
        let path = path.to_string_lossy().into_owned();
        (
            example.replace("target/release/libloopguard_native.so", &path),
            path,
        )
    };
    let (v2, v2_path) = module("v0.2.0");
    let (v1, v1_path) = module("v0.1.0");
    let (v9, v9_path) = module("v0.9.0");
    let loc = "native.yaml filter \"loopguard\"";
    // Each build on its own Envoy: nothing to say.
    assert_eq!(
        findings_for("1.40.0", &[("native.yaml", &v2)]),
        Vec::<String>::new()
    );
    assert_eq!(
        findings_for("1.39", &[("native.yaml", &v1)]),
        Vec::<String>::new()
    );
    // The other ABI's build: loaded, with Envoy's warning.
    let same = "Envoy loads it with a warning that the version is deprecated (the callbacks loopguard uses are the same in both)";
    assert_eq!(
        findings_for("1.39.3", &[("native.yaml", &v2)]),
        [format!("{loc}: warning: {v2_path} is built for ABI v0.2.0, and Envoy 1.39.3 speaks v0.1.0: {same}; build it for this Envoy with `make build ENVOY_VERSION=1.39`")]
    );
    assert_eq!(
        findings_for("1.40", &[("native.yaml", &v1)]),
        [format!("{loc}: warning: {v1_path} is built for ABI v0.1.0, and Envoy 1.40 speaks v0.2.0: {same}; build it for this Envoy with `make build ENVOY_VERSION=1.40`")]
    );
    assert_eq!(
        findings_for("1.40", &[("native.yaml", &v9)]),
        [format!("{loc}: error: {v9_path} is built for ABI v0.9.0, which no release loopguard supports speaks (1.39 (ABI v0.1.0), 1.40 (ABI v0.2.0)); build it for this Envoy with `make build ENVOY_VERSION=1.40`")]
    );
    // Before 1.39 the module calls callbacks Envoy lacks.
    assert_eq!(
        findings_for("1.38", &[("native.yaml", &v1)]),
        [format!("{loc}: error: Envoy 1.38 lacks 4 of the callbacks the native module calls (among them envoy_dynamic_module_callback_http_filter_config_increment_counter), so it cannot load the module: run loopguard as the Wasm module there (the native module is built for 1.39 (ABI v0.1.0), 1.40 (ABI v0.2.0))")]
    );
    // A module file that is not loopguard's.
    std::fs::write(&v1_path, b"\x7fELF not loopguard").unwrap();
    assert_eq!(
        findings_for("1.39", &[("native.yaml", &v1)]),
        [format!("{loc}: warning: {v1_path} holds no loopguard ABI mark: it is not a loopguard build this check knows, so its ABI is unknown")]
    );
    // A module path that is not on this machine (a container's) is not read.
    let elsewhere = example.replace("target/release/", "/nonexistent/");
    assert_eq!(
        findings_for("1.39", &[("native.yaml", &elsewhere)]),
        Vec::<String>::new()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_wasm_hold_flag_needs_envoy_1_35_and_untested_releases_are_said() {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../envoy/envoy.yaml"),
    )
    .unwrap();
    assert_eq!(
        findings_for("1.36", &[("envoy.yaml", &example)]),
        Vec::<String>::new()
    );
    assert_eq!(
        findings_for("1.34.2", &[("envoy.yaml", &example)]),
        [
            "--envoy 1.34.2: warning: Envoy 1.34 is older than every release loopguard is tested on (1.36 to 1.40, envoy/versions.txt)",
            "envoy.yaml filter \"loopguard\": error: Envoy 1.34.2 has no allow_on_headers_stop_iteration (Envoy 1.35+), which hold_request_headers needs in the Wasm filter: remove both and place the buffer filter after loopguard",
        ]
    );
    assert_eq!(
        findings_for("1.41", &[("envoy.yaml", &example)]),
        ["--envoy 1.41: warning: Envoy 1.41 is newer than every release loopguard is tested on (1.36 to 1.40, envoy/versions.txt)"]
    );
}
