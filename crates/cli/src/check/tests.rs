//! Tests of `loopguard check`: plain policies and Envoy, Istio and Envoy Gateway setups.

use super::*;
use crate::discover::{BUFFER_TYPE, HCM_TYPE};
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
