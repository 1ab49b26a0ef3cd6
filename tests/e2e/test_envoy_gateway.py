"""examples/envoy-gateway: the Envoy configuration Envoy Gateway (and the
Envoy AI Gateway) build from the example files (mesh.py), run in real Envoy.

The module reaches Envoy as Envoy Gateway serves it: a remote source on
`wasm_cluster` with the module's sha256. A loopback HTTP server stands in
for Envoy Gateway's module server (and for its download of the HTTP URL or
the OCI image: it serves the built module).

extension-policy-mcp.yaml runs in front of the real MCP server of
tests/e2e/mcp_apps (server.py), driven by the Python MCP SDK client
(client.py) in both of its protocol modes.

envoyproxy-native.yaml and extension-policy-native.yaml (Envoy Gateway's
dynamic modules) always run the native module, libloopguard_native.so,
whatever LOOPGUARD_HOST is: the allowlist's path becomes the built module."""

import copy
import hashlib
import json
from pathlib import Path

import httpx
import pytest

import mesh
from mcp_agents import looping_agent
from harness import NATIVE, WASM, EnvoyFailed, envoy_abi
from mesh import ModuleServer, Unhandled, envoy_gateway_config

BASE = ("httproute.yaml", "envoyproxy.yaml", "request-buffer.yaml")
POLICIES = ("extension-policy.yaml", "extension-policy-http.yaml")
MODULE = Path(WASM).read_bytes()
MODULE_SHA256 = hashlib.sha256(MODULE).hexdigest()
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Is the build green?"}]}
MESSAGES = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Is the build green?"}]}
WASM_FILTER = "envoy.filters.http.wasm/envoyextensionpolicy/agents/loopguard/wasm/0"
AI_WASM_FILTER = "envoy.filters.http.wasm/envoyextensionpolicy/agents/loopguard-ai/wasm/0"
MCP_WASM_FILTER = "envoy.filters.http.wasm/envoyextensionpolicy/agents/loopguard-mcp/wasm/0"
NATIVE_FILES = ("httproute.yaml", "envoyproxy-native.yaml", "extension-policy-native.yaml")
NATIVE_FILTER = "envoy.filters.http.dynamic_modules/envoyextensionpolicy/agents/loopguard/dynamic-module/0"
STRIP_PREFIX_FLAG = "envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix"


def docs(*files: str) -> list[dict]:
    return mesh.load_docs(*(mesh.EG_EXAMPLES / f for f in files))


def default_order(d: list[dict]) -> list[dict]:
    """The documents with envoyproxy.yaml's filterOrder taken out."""
    d = copy.deepcopy(d)
    next(x for x in d if x["kind"] == "EnvoyProxy")["spec"].pop("filterOrder")
    return d


@pytest.fixture
def module_server():
    server = ModuleServer(MODULE)
    yield server
    server.stop()


def loop(e, host: str, path: str, body: dict, n: int, key: str = "sk-eg-agent", **headers) -> list[httpx.Response]:
    with httpx.Client(base_url=e.url, headers={"host": host, "authorization": f"Bearer {key}", **headers}) as c:
        return [c.post(path, json=body) for _ in range(n)]


def codes(responses) -> list[int]:
    return [r.status_code for r in responses]


def example_config(d: list[dict], policy: str) -> dict:
    eep = next(x for x in d if x["kind"] == "EnvoyExtensionPolicy" and x["metadata"]["name"] == policy)
    return eep["spec"]["wasm"][0]["config"]


def native_example_config(d: list[dict]) -> dict:
    eep = next(x for x in d if x["kind"] == "EnvoyExtensionPolicy")
    return eep["spec"]["dynamicModule"][0]["config"]


def built_native_module() -> str:
    """The native module, which Envoy Gateway's dynamic-module examples load
    whatever LOOPGUARD_HOST is."""
    if not Path(NATIVE).is_file():
        pytest.fail(f"the native module {NATIVE} is missing: `make build` builds it (envoyproxy-native.yaml and "
                    "extension-policy-native.yaml load it into Envoy)")
    return NATIVE


# --- translation ---------------------------------------------------------------


@pytest.mark.parametrize("policy_file", POLICIES)
def test_translation_orders_filters_and_enables_loopguard_on_the_targeted_route_only(policy_file):
    d = docs(*BASE, policy_file)
    eg = envoy_gateway_config(d, module_sha256=MODULE_SHA256)
    # envoyproxy.yaml's filterOrder puts the buffer after loopguard...
    assert eg.filter_names == [WASM_FILTER, "envoy.filters.http.buffer", "envoy.filters.http.router"]
    # ...which Envoy Gateway otherwise runs first.
    assert envoy_gateway_config(default_order(d), module_sha256=MODULE_SHA256).filter_names == [
        "envoy.filters.http.buffer", WASM_FILTER, "envoy.filters.http.router"]
    assert all(f.get("disabled") for f in eg.http_filters[:2])
    # request-buffer.yaml also names the AI Gateway's route, absent here.
    assert eg.unresolved_targets == ["BackendTrafficPolicy/llm-request-buffer -> HTTPRoute/llm-ai"]

    # Enabled (empty FilterConfig) and buffered on every llm-api route,
    # untouched on internal-api.
    llm = [r for r in eg.routes if r["name"].startswith("httproute/agents/llm-api/")]
    internal = [r for r in eg.routes if r["name"].startswith("httproute/agents/internal-api/")]
    assert [r["name"] for r in llm] == [
        "httproute/agents/llm-api/rule/0/match/0/llm_example_com",
        "httproute/agents/llm-api/rule/0/match/1/llm_example_com",
        "httproute/agents/llm-api/rule/1/match/0/llm_example_com",
    ]
    for r in llm:
        assert r["typed_per_filter_config"][WASM_FILTER] == {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}
        assert r["typed_per_filter_config"]["envoy.filters.http.buffer"]["buffer"] == {"max_request_bytes": 1 << 20}
    assert llm[0]["metadata"]["filter_metadata"]["envoy-gateway"]["resources"][0]["sectionName"] == "llm-calls"
    assert [r["match"] for r in internal] == [{"path_separated_prefix": "/v1"}]
    assert "typed_per_filter_config" not in internal[0]

    # The filter Envoy gets: the module from Envoy Gateway's server, checked
    # against the module's own sha256 (not the digest the policy carries).
    (w,) = eg.wasms
    cfg = w.filter["typed_config"]["config"]
    assert cfg["name"] == "loopguard" and cfg["root_id"] == "loopguard"
    assert cfg["vm_config"]["vm_id"] == "envoyextensionpolicy/agents/loopguard/wasm/0"
    remote = cfg["vm_config"]["code"]["remote"]
    assert remote["sha256"] == MODULE_SHA256
    assert remote["http_uri"]["cluster"] == "wasm_cluster" and remote["http_uri"]["timeout"] == "10s"
    assert remote["http_uri"]["uri"].startswith(mesh.EG_WASM_SERVICE + "/") and remote["http_uri"]["uri"].endswith(".wasm")
    assert cfg["fail_open"] is True
    assert json.loads(cfg["configuration"]["value"]) == example_config(d, "loopguard")
    assert mesh.is_sha256_hex(w.declared_sha256) and w.declared_sha256 != MODULE_SHA256
    if policy_file == "extension-policy.yaml":
        # Image: the digest is the image's manifest digest (what `make image`
        # prints); Envoy Gateway extracts the module and computes its sha256.
        assert w.code_type == "Image" and w.original_url == "oci://ghcr.io/loopguard/loopguard:0.1.0"
    else:
        assert w.code_type == "HTTP" and w.original_url.startswith("https://") and w.original_url.endswith("/loopguard.wasm")


def test_translation_refuses_fields_it_does_not_handle():
    def translate(edit, kind, name):
        d = docs(*BASE, "extension-policy.yaml", "ai-gateway.yaml")
        edit(next(x for x in d if x["kind"] == kind and x["metadata"]["name"] == name))
        return envoy_gateway_config(d, module_sha256=MODULE_SHA256)

    cases = [
        (lambda p: p["spec"].update(extProc=[{"backendRefs": [{"name": "x"}]}]), "EnvoyExtensionPolicy", "loopguard", "spec.extProc"),
        (lambda p: p["spec"]["wasm"][0]["code"]["image"].update(tls={"caCertificateRef": {"name": "ca"}}), "EnvoyExtensionPolicy", "loopguard", "image.tls"),
        (lambda p: p["spec"]["wasm"][0]["code"]["image"].update(sha256="sha256:" + "0" * 64), "EnvoyExtensionPolicy", "loopguard", "sha256 must be 64"),
        (lambda p: p["spec"]["wasm"][0]["code"].update(type="Inline"), "EnvoyExtensionPolicy", "loopguard", "code type Inline"),
        (lambda r: r["spec"]["rules"][0].update(filters=[{"type": "RequestHeaderModifier"}]), "HTTPRoute", "llm-api", r"rules\[0\].filters"),
        (lambda r: r["spec"]["rules"][1]["matches"][0].update(path={"type": "RegularExpression", "value": "/v1/.*"}), "HTTPRoute", "llm-api", "path type RegularExpression"),
        (lambda b: b["spec"].update(rateLimit={"type": "Local"}), "BackendTrafficPolicy", "llm-request-buffer", "spec.rateLimit"),
        (lambda b: b["spec"]["requestBuffer"].update(limit="1.5Mi"), "BackendTrafficPolicy", "llm-request-buffer", "requestBuffer.limit"),
        (lambda e: e["spec"].update(provider={"type": "Kubernetes", "kubernetes": {"envoyService": {"type": "NodePort"}}}), "EnvoyProxy", "loopguard-proxy", "kubernetes.envoyService"),
        (lambda e: e["spec"].update(provider={"type": "Custom"}), "EnvoyProxy", "loopguard-proxy", "provider type Custom"),
        (lambda e: e["spec"]["filterOrder"][0].update(after="envoy.filters.http.wasm_typo"), "EnvoyProxy", "loopguard-proxy", "wasm_typo"),
        (lambda a: a["spec"].update(llmRequestCosts=[{"metadataKey": "tokens", "type": "TotalToken"}]), "AIGatewayRoute", "llm-ai", "spec.llmRequestCosts"),
        (lambda a: a["spec"]["rules"][0]["backendRefs"][0].update(modelNameOverride="gpt-4o"), "AIGatewayRoute", "llm-ai", "modelNameOverride"),
        (lambda g: g["spec"]["listeners"][0].update(protocol="HTTPS"), "Gateway", "agents-gateway", "protocol HTTPS"),
    ]
    for edit, kind, name, message in cases:
        with pytest.raises(Unhandled, match=message):
            translate(edit, kind, name)
    # Informational fields pass.
    assert translate(lambda r: r["metadata"].update(labels={"team": "agents"}), "HTTPRoute", "llm-api").wasms


def test_ai_gateway_ext_proc_goes_after_the_buffer_so_loopguard_sees_the_original_request():
    d = docs(*BASE, "extension-policy.yaml", "ai-gateway.yaml")
    eg = envoy_gateway_config(d, module_sha256=MODULE_SHA256)
    assert eg.filter_names == [AI_WASM_FILTER, WASM_FILTER, "envoy.filters.http.buffer", mesh.AI_GATEWAY_EXT_PROC, "envoy.filters.http.router"]
    assert eg.unresolved_targets == []
    # Without envoyproxy.yaml's filter order, the AI Gateway's processor
    # (which rewrites the request for the chosen provider) runs first.
    default = envoy_gateway_config(default_order(d), module_sha256=MODULE_SHA256)
    assert default.filter_names == ["envoy.filters.http.buffer", mesh.AI_GATEWAY_EXT_PROC, AI_WASM_FILTER, WASM_FILTER, "envoy.filters.http.router"]
    # The generated HTTPRoute llm-ai: one route per model rule plus the
    # route-not-found rule, loopguard-ai enabled and the buffer on all of them.
    ai = [r for r in eg.routes if r["name"].startswith("httproute/agents/llm-ai/")]
    assert [r["match"].get("headers") for r in ai] == [
        [{"name": "x-ai-eg-model", "string_match": {"exact": "gpt-4o-mini"}}],
        [{"name": "x-ai-eg-model", "string_match": {"exact": "claude-sonnet-4-5"}}],
        None,
    ]
    for r in ai:
        assert set(r["typed_per_filter_config"]) == {AI_WASM_FILTER, "envoy.filters.http.buffer"}
    assert ai[2]["direct_response"]["status"] == 404


# --- in Envoy ------------------------------------------------------------------


@pytest.mark.parametrize("policy_file", POLICIES)
def test_loop_is_rejected_on_the_targeted_route_and_passes_on_another(policy_file, upstream, start_envoy, module_server):
    d = docs(*BASE, policy_file)
    eg = envoy_gateway_config(d, module_sha256=MODULE_SHA256)
    e = start_envoy(eg.bootstrap(upstream.port, module_server.port))
    assert module_server.requests and set(module_server.requests) == {"/" + eg.wasms[0].filter["typed_config"]["config"]["vm_config"]["code"]["remote"]["http_uri"]["uri"].rsplit("/", 1)[1]}
    assert "configured 1 policy (agents), tracking up to 65536 fingerprints" in e.log()
    mesh.mark_loaded([x for x in d if x["kind"] == "EnvoyExtensionPolicy"])

    # (a) llm-api: the 4th identical call within 60 s is rejected, in the
    # API's error shape; the upstream saw only the 3 allowed ones.
    chat = loop(e, "llm.example.com", "/v1/chat/completions", CHAT, 5)
    assert codes(chat) == [200, 200, 200, 429, 429]
    err = chat[3].json()["error"]
    assert (err["code"], err["policy"], err["hit_count"], err["cooldown_seconds"]) == ("recursive_loop_detected", "agents", 4, 30)
    assert len(upstream.requests) == 3
    messages = loop(e, "llm.example.com", "/v1/messages", MESSAGES, 4)
    assert codes(messages) == [200, 200, 200, 429]
    assert messages[3].json()["error"]["type"] == "rate_limit_error"
    assert len(upstream.requests) == 6

    # (b) internal-api, another HTTPRoute: loopguard is disabled there.
    assert codes(loop(e, "internal.example.com", "/v1/chat/completions", CHAT, 6)) == [200] * 6
    assert len(upstream.requests) == 12


def test_wrong_sha256_is_refused(upstream, start_envoy, module_server):
    """(c) Envoy checks the module it fetches against sha256 and does not run
    one that differs. Here the server answers 200 with the real module, but
    Envoy was given the example's placeholder digest."""
    d = docs(*BASE, "extension-policy.yaml")
    wrong = next(x for x in d if x["kind"] == "EnvoyExtensionPolicy")["spec"]["wasm"][0]["code"]["image"]["sha256"]
    assert wrong != MODULE_SHA256

    # Envoy Gateway up to 1.8: Envoy's default fetch retry (one), then the
    # plugin fails to load. The example's failOpen: true lets traffic pass
    # unchecked (no loop is caught, loopguard counts no request)...
    eg = envoy_gateway_config(d, module_sha256=wrong, eg_minor=8)
    e = start_envoy(eg.bootstrap(upstream.port, module_server.port))
    log = e.log()
    assert len(module_server.requests) == 2
    assert "Retry limit exceeded for fetching data from remote data source" in log
    assert "Plugin loopguard failed to load" in log
    assert "configured 1 policy" not in log
    assert codes(loop(e, "llm.example.com", "/v1/chat/completions", CHAT, 6)) == [200] * 6
    assert e.counter("loopguard.requests_total") == 0
    assert len(upstream.requests) == 6

    # ...and with failOpen: false the targeted routes answer 503, the other
    # routes are untouched.
    upstream.requests.clear()
    module_server.requests.clear()
    closed = copy.deepcopy(d)
    next(x for x in closed if x["kind"] == "EnvoyExtensionPolicy")["spec"]["wasm"][0]["failOpen"] = False
    eg = envoy_gateway_config(closed, module_sha256=wrong, eg_minor=8)
    e = start_envoy(eg.bootstrap(upstream.port, module_server.port))
    assert codes(loop(e, "llm.example.com", "/v1/chat/completions", CHAT, 2)) == [503, 503]
    assert len(upstream.requests) == 0
    assert codes(loop(e, "internal.example.com", "/v1/chat/completions", CHAT, 2)) == [200, 200]

    # Envoy Gateway 1.9 gives the fetch a retry policy (10 retries, 1-30 s
    # backoff): while it retries, the listener is not ready and Envoy
    # serves nothing.
    module_server.requests.clear()
    eg9 = envoy_gateway_config(d, module_sha256=wrong, eg_minor=9)
    e9 = start_envoy.make(eg9.bootstrap(upstream.port, module_server.port))
    with pytest.raises(EnvoyFailed, match="did not become ready"):
        e9.start(timeout=4)
    assert len(module_server.requests) >= 2
    assert "configured 1 policy" not in e9.log()


def test_ai_gateway_route_gets_its_own_loopguard(upstream, start_envoy, module_server):
    """ai-gateway.yaml next to extension-policy.yaml: two loopguard filters,
    each enabled on its own HTTPRoute. The AI Gateway's external processor
    does not run here: the client sends the x-ai-eg-model header it would
    set from the request body."""
    d = docs(*BASE, "extension-policy.yaml", "ai-gateway.yaml")
    eg = envoy_gateway_config(d, module_sha256=MODULE_SHA256)
    e = start_envoy(eg.bootstrap(upstream.port, module_server.port))
    log = e.log()
    assert "configured 1 policy (ai-agents), tracking up to 65536 fingerprints" in log
    assert "configured 1 policy (agents), tracking up to 65536 fingerprints" in log
    mesh.mark_loaded([x for x in d if x["kind"] == "EnvoyExtensionPolicy"])

    ai = loop(e, "ai.example.com", "/v1/chat/completions", CHAT, 5, **{"x-ai-eg-model": "gpt-4o-mini"})
    assert codes(ai) == [200, 200, 200, 429, 429]
    assert ai[3].json()["error"]["policy"] == "ai-agents"
    llm = loop(e, "llm.example.com", "/v1/chat/completions", CHAT, 4)
    assert codes(llm) == [200, 200, 200, 429]
    assert llm[3].json()["error"]["policy"] == "agents"
    assert len(upstream.requests) == 6
    # No model header: the generated route-not-found rule answers.
    missing = loop(e, "ai.example.com", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "other"}]}, 1)[0]
    assert missing.status_code == 404 and "No matching route found" in missing.text


# --- MCP -------------------------------------------------------------------------

def answered_by_envoy(e) -> int:
    """Requests Envoy answered without sending them upstream: downstream
    requests on the listener minus requests to the backend clusters (the
    module server's wasm_cluster left out)."""
    s = e.stats()
    down = sum(v for k, v in s.items() if k.startswith("http.") and k.endswith(".downstream_rq_total") and not k.startswith("http.admin."))
    up = sum(v for k, v in s.items() if k.startswith("cluster.httproute/") and k.endswith(".upstream_rq_total"))
    return down - up


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_mcp_route_blocks_a_looping_agent(mode, mcp_server, start_envoy, module_server):
    """extension-policy-mcp.yaml next to extension-policy.yaml: the MCP
    HTTPRoute gets its own loopguard and the request buffer (which
    envoyproxy.yaml puts after loopguard, standing in for held headers,
    which an EnvoyExtensionPolicy cannot ask for) and no route timeout; the
    LLM routes do not get the MCP filter. A real MCP client's 4th identical
    call is blocked and never reaches the server, not even its headers;
    tools/list and another call pass."""
    d = docs(*BASE, "extension-policy.yaml", "extension-policy-mcp.yaml")
    eg = envoy_gateway_config(d, module_sha256=MODULE_SHA256)
    assert eg.filter_names == [MCP_WASM_FILTER, WASM_FILTER, "envoy.filters.http.buffer", "envoy.filters.http.router"]
    (route,) = [r for r in eg.routes if r["name"].startswith("httproute/agents/mcp/")]
    assert route["match"] == {"path_separated_prefix": "/mcp"}
    assert route["route"]["timeout"] == "0s"
    config = example_config(d, "loopguard-mcp")
    assert "hold_request_headers" not in config
    assert route["typed_per_filter_config"]["envoy.filters.http.buffer"]["buffer"]["max_request_bytes"] >= config["max_body_bytes"]
    assert set(route["typed_per_filter_config"]) == {MCP_WASM_FILTER, "envoy.filters.http.buffer"}
    assert all(MCP_WASM_FILTER not in r.get("typed_per_filter_config", {}) for r in eg.routes if r is not route)
    mcp_filter = next(w for w in eg.wasms if w.filter_name == MCP_WASM_FILTER).filter["typed_config"]["config"]
    assert mcp_filter["name"] == "loopguard-mcp" and mcp_filter["fail_open"] is True
    assert "allow_on_headers_stop_iteration" not in mcp_filter

    # server.py listens on 127.0.0.1 and refuses any other Host (the MCP
    # SDK's DNS-rebinding protection answers 421): the client asks for
    # mcp.example.com, which picks the route, and the route hands the
    # server the host it expects (in a cluster the server listens on its
    # pod address, without that protection).
    route["route"]["host_rewrite_literal"] = f"127.0.0.1:{mcp_server.port}"
    e = start_envoy(eg.bootstrap(mcp_server.port, module_server.port))
    log = e.log()
    assert "configured 1 policy (mcp-tools), tracking up to " in log
    assert "configured 1 policy (agents), tracking up to 65536 fingerprints" in log
    mesh.mark_loaded([x for x in d if x["kind"] == "EnvoyExtensionPolicy"])
    looping_agent(f"{e.url}/mcp", mode, mcp_server, Host="mcp.example.com")
    assert answered_by_envoy(e) == 1
    assert e.counter("loopguard.mcp_calls_total") == 5  # 4 searches and the read
    assert e.counter("loopguard.mcp_loops_total") == 2  # the note and the block
    assert "wasm log loopguard-mcp loopguard envoyextensionpolicy/agents/loopguard-mcp/wasm/0: " in e.log()  # the plugin name


# --- native dynamic module ------------------------------------------------------


def test_native_translation_loads_the_allowlisted_module_on_the_targeted_route_only():
    d = docs(*NATIVE_FILES)
    eg = envoy_gateway_config(d, native_module="/built/libloopguard_native.so")
    assert eg.filter_names == [NATIVE_FILTER, "envoy.filters.http.router"]
    (m,) = eg.dynamic_modules
    assert (m.module, m.policy, m.declared_path) == ("loopguard", "agents/loopguard", "/etc/envoy/modules/libloopguard_native.so")
    config = native_example_config(d)
    # The allowlist's module (its path replaced by the built one), loopguard's
    # key name, the configuration as JSON; no metrics_namespace, which
    # Envoy Gateway cannot set.
    assert m.filter == {
        "name": NATIVE_FILTER,
        "disabled": True,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"module": {"local": {"filename": "/built/libloopguard_native.so"}}, "do_not_close": True},
            "filter_name": "loopguard",
            "filter_config": {"@type": mesh.STRING_VALUE, "value": mesh.k8s_json(config)},
        },
    }
    assert config["hold_request_headers"] is True

    # Enabled (empty FilterConfig) on every llm-api route, not on internal-api.
    llm = [r for r in eg.routes if r["name"].startswith("httproute/agents/llm-api/")]
    internal = [r for r in eg.routes if r["name"].startswith("httproute/agents/internal-api/")]
    assert len(llm) == 3 and len(internal) == 1
    for r in llm:
        assert r["typed_per_filter_config"] == {NATIVE_FILTER: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}}
    assert "typed_per_filter_config" not in internal[0]

    # The ClientTrafficPolicy's bufferLimit is the listener's buffer, where a
    # held body waits: at least max_body_bytes. Envoy Gateway's default is 32 KiB.
    assert eg.buffer_limit == 1 << 20 >= config["max_body_bytes"]
    no_ctp = envoy_gateway_config([x for x in d if x["kind"] != "ClientTrafficPolicy"])
    assert no_ctp.buffer_limit == 32768

    # The bootstrap: Envoy Gateway's runtime layer, then the patch's; its
    # stats tags, then the patch's for loopguard; no module server (no Wasm).
    b = eg.bootstrap(1)
    assert b["layered_runtime"]["layers"] == [
        mesh.EG_BOOTSTRAP["layered_runtime"]["layers"][0],
        {"name": "loopguard", "static_layer": {STRIP_PREFIX_FLAG: True}},
    ]
    eg_tags = mesh.EG_BOOTSTRAP["stats_config"]["stats_tags"]
    assert b["stats_config"]["stats_tags"][: len(eg_tags)] == eg_tags
    added = b["stats_config"]["stats_tags"][len(eg_tags) :]
    assert [t["tag_name"] for t in added] == ["policy", "mode", "action", "tier", "step", "reason", "result", "token_type", "loop", "caller", "budget", "key", "model"]
    assert all(t["regex"].startswith("^dynamicmodulescustom\\.loopguard\\.") for t in added)
    (lst,) = b["static_resources"]["listeners"]
    assert lst["per_connection_buffer_limit_bytes"] == 1 << 20
    assert [c["name"] for c in b["static_resources"]["clusters"]] == ["httproute/agents/llm-api/rule/0", "httproute/agents/llm-api/rule/1", "httproute/agents/internal-api/rule/0"]
    assert "metrics_namespace" not in json.dumps(b)
    # The image the EnvoyProxy runs is Envoy 1.40 (the tests run Envoy 1.40).
    assert eg.envoy_image.endswith(":v1.40.0")

    # envoyproxy-native.yaml keeps envoyproxy.yaml's filter order for Wasm
    # policies: the buffer still follows a Wasm loopguard.
    wasm = envoy_gateway_config(docs("httproute.yaml", "envoyproxy-native.yaml", "request-buffer.yaml", "extension-policy.yaml"), module_sha256=MODULE_SHA256)
    assert wasm.filter_names == [WASM_FILTER, "envoy.filters.http.buffer", "envoy.filters.http.router"]
    with pytest.raises(Unhandled, match="EnvoyProxy loopguard-proxy is given twice"):
        envoy_gateway_config(docs(*NATIVE_FILES, "envoyproxy.yaml"))

    # A module no allowlist names: Envoy Gateway refuses the policy, and
    # its routes answer 500.
    refused = copy.deepcopy(d)
    next(x for x in refused if x["kind"] == "EnvoyExtensionPolicy")["spec"]["dynamicModule"][0]["name"] = "loopguard-typo"
    r = envoy_gateway_config(refused)
    assert r.filter_names == ["envoy.filters.http.router"] and r.dynamic_modules == []
    assert r.refused_policies == {"agents/loopguard": "dynamic module 'loopguard-typo' is not registered in the EnvoyProxy dynamicModules allowlist"}
    assert [x.get("direct_response") for x in r.routes] == [{"status": 500}] * 3 + [None]


def test_native_translation_refuses_fields_it_does_not_handle():
    def translate(edit, kind):
        d = docs(*NATIVE_FILES)
        edit(next(x for x in d if x["kind"] == kind))
        return envoy_gateway_config(d)

    remote = {"type": "Remote", "remote": {"url": "https://example.com/libloopguard_native.so", "sha256": "0" * 64}}
    cases = [
        (lambda e: e["spec"]["dynamicModules"][0].update(source=remote), "EnvoyProxy", "source.remote"),
        (lambda e: e["spec"]["dynamicModules"][0]["source"].update(type="Remote"), "EnvoyProxy", "only a Local source"),
        (lambda e: e["spec"]["bootstrap"].update(type="Merge"), "EnvoyProxy", "bootstrap type Merge"),
        (lambda e: e["spec"]["bootstrap"]["jsonPatches"][0].update(path="/admin/address"), "EnvoyProxy", "models only"),
        (lambda e: e["spec"]["bootstrap"]["jsonPatches"][0].update(op="move"), "EnvoyProxy", "op move"),
        (lambda p: p["spec"]["dynamicModule"][0].update(terminalFilter=True), "EnvoyExtensionPolicy", "terminalFilter"),
        (lambda c: c["spec"]["connection"].update(bufferLimit="1.5Mi"), "ClientTrafficPolicy", "connection.bufferLimit"),
        (lambda c: c["spec"].update(timeout={"http": {"requestReceivedTimeout": "5s"}}), "ClientTrafficPolicy", "spec.timeout"),
    ]
    for edit, kind, message in cases:
        with pytest.raises(Unhandled, match=message):
            translate(edit, kind)
    # A ClientTrafficPolicy for another Gateway leaves the default buffer.
    other = translate(lambda c: c["spec"]["targetRefs"][0].update(name="other"), "ClientTrafficPolicy")
    assert other.buffer_limit == 32768 and other.unresolved_targets == ["ClientTrafficPolicy/loopguard-held-bodies -> Gateway/other"]


def test_native_module_catches_a_loop_and_holds_large_bodies(upstream, start_envoy):
    """envoyproxy-native.yaml and extension-policy-native.yaml (with
    httproute.yaml's Gateway and routes) in Envoy 1.40 with the native
    module: the policy's threshold of identical calls gives 200s then 429
    with loopguard's error; bodies of 300 KB are held (their headers reach
    the upstream only once judged) and passed whole, and a loop of them is
    caught; the stats are where Envoy Gateway puts them."""
    module = built_native_module()
    d = docs(*NATIVE_FILES)
    eg = envoy_gateway_config(d, native_module=module)
    e = start_envoy(eg.bootstrap(upstream.port))
    log = e.log()
    assert f"Dynamic module ABI version {envoy_abi()} matched" in log
    assert "loopguard: configured 1 policy (agents), tracking up to 65536 fingerprints" in log
    mesh.mark_loaded([x for x in d if x["kind"] == "EnvoyExtensionPolicy"])
    config = native_example_config(d)
    threshold = config["policies"][0]["spec"]["loop_detection"]["threshold_identical_requests"]
    allowed = [200] * (threshold - 1)

    # (a) llm-api: the threshold-th identical call is rejected with
    # loopguard's JSON error, in the API's shape; never sent upstream.
    chat = loop(e, "llm.example.com", "/v1/chat/completions", CHAT, threshold + 1)
    assert codes(chat) == allowed + [429, 429]
    assert chat[threshold - 1].headers["content-type"].startswith("application/json")
    err = chat[threshold - 1].json()["error"]
    assert (err["code"], err["type"], err["policy"], err["hit_count"], err["cooldown_seconds"]) == ("recursive_loop_detected", "loop_detected", "agents", threshold, 30)
    messages = loop(e, "llm.example.com", "/v1/messages", MESSAGES, threshold)
    assert codes(messages) == allowed + [429]
    assert messages[-1].json()["error"]["type"] == "rate_limit_error"
    assert len(upstream.requests) == 2 * (threshold - 1)

    # (b) 300 KB bodies, above Envoy Gateway's 32 KiB default buffer, within
    # the ClientTrafficPolicy's 1 MiB: held until judged, passed whole, and
    # the repeated one caught. The rejected ones' headers never left Envoy.
    big = {**CHAT, "messages": [{"role": "user", "content": "build log:\n" + "x" * 300_000}]}
    upstream.requests.clear()
    upstream.arrivals.clear()
    held = loop(e, "llm.example.com", "/v1/chat/completions", big, threshold + 1, key="sk-eg-big")
    assert codes(held) == allowed + [429, 429]
    assert held[threshold - 1].json()["error"]["hit_count"] == threshold
    assert [json.loads(r["body"]) for r in upstream.requests] == [big] * (threshold - 1)
    assert len(upstream.arrivals) == threshold - 1

    # (c) internal-api, another HTTPRoute: loopguard is not enabled there.
    assert codes(loop(e, "internal.example.com", "/v1/chat/completions", CHAT, threshold + 2)) == [200] * (threshold + 2)

    # (d) The stats: dynamicmodulescustom.loopguard.* (Envoy Gateway sets no
    # metrics_namespace); the patch's runtime flag exports them as
    # loopguard_* and its stats tags give them the Wasm series' labels.
    judged = 2 * threshold + 1 + threshold + 1
    rejected = 2 + 1 + 2
    stats = e.stats()
    assert stats["dynamicmodulescustom.loopguard.requests_total"] == judged
    assert stats["dynamicmodulescustom.loopguard.rejected_total.policy.agents"] == rejected
    assert not any(k.startswith("wasmcustom.") for k in stats)
    prom = e.prometheus()
    assert prom["loopguard_requests_total{}"] == judged
    assert prom['loopguard_rejected_total{policy="agents"}'] == rejected
    assert prom['loopguard_detected_total{policy="agents",mode="enforce"}'] == 3  # one per loop
    assert not any(k.startswith(("envoy_dynamicmodulescustom_", "envoy_wasmcustom_", "loopguard_rejected_total_")) for k in prom)
    e.stop()

    # Without the ClientTrafficPolicy, the listener keeps Envoy Gateway's
    # 32 KiB: Envoy answers 413 to a held 300 KB body; small ones pass.
    upstream.requests.clear()
    small_buffer = envoy_gateway_config([x for x in d if x["kind"] != "ClientTrafficPolicy"], native_module=module)
    e = start_envoy(small_buffer.bootstrap(upstream.port))
    assert codes(loop(e, "llm.example.com", "/v1/chat/completions", big, 1, key="sk-eg-big")) == [413]
    assert codes(loop(e, "llm.example.com", "/v1/chat/completions", CHAT, 1)) == [200]
    assert len(upstream.requests) == 1


# --- every example is exercised ---------------------------------------------------


def test_every_envoy_gateway_example_is_translated_and_its_loopguard_config_loaded(request):
    """Runs last: every YAML file in examples/envoy-gateway went through the
    translation, and every loopguard configuration in them was loaded by a
    real Envoy in the tests above."""
    mesh.assert_examples_covered(request, mesh.EG_EXAMPLES, set(BASE + POLICIES + ("ai-gateway.yaml", "extension-policy-mcp.yaml") + NATIVE_FILES))
