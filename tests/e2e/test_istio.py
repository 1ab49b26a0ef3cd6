"""examples/istio: the Envoy configuration Istio builds from the example
files (mesh.py: istiod's translation, istio-agent's module rewrite, the
EnvoyFilter patches), run in real Envoy with the plugin delivered over ECDS
from a file, as istiod would deliver it over ADS.

Parametrized over Istio 1.29 and 1.30 where the filter's name changes:
1.30 translates every WasmPlugin into a TrafficExtension and renames its
ECDS resource.

wasmplugin-mcp.yaml runs in front of the real MCP server of
tests/e2e/mcp_apps (server.py), driven by the Python MCP SDK client
(client.py) in both of its protocol modes."""

import copy
import json

import httpx
import pytest

import harness
import mesh
from harness import WASM
from mcp_agents import looping_agent
from mesh import IstioControlPlane, IstioProxy, Unhandled

FILES = ("gateway.yaml", "virtualservice.yaml", "wasmplugin-gateway.yaml", "wasmplugin-sidecar.yaml", "envoyfilter-buffer.yaml",
         "wasmplugin-mcp.yaml")
VERSIONS = {"1.29": "1.29.0", "1.30": "1.30.0"}
HOST = "llm.example.com"
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Is the build green?"}]}
MESSAGES = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "Is the build green?"}]}


def docs() -> list[dict]:
    return mesh.load_docs(*(mesh.ISTIO_EXAMPLES / f for f in FILES))


def gateway_proxy(version: str) -> IstioProxy:
    return IstioProxy("gateway", "istio-system", {"app": "istio-ingressgateway", "istio": "ingressgateway"}, VERSIONS[version], 80)


def sidecar_proxy(version: str) -> IstioProxy:
    return sidecar_proxy_of(VERSIONS[version])


def sidecar_proxy_of(release: str) -> IstioProxy:
    return IstioProxy("sidecar", "agents", {"app": "tools-api", "version": "v1"}, release, 8080)


def mcp_proxy(version: str) -> IstioProxy:
    return IstioProxy("sidecar", "agents", {"app": "mcp-server", "version": "v1"}, VERSIONS[version], 8000)


def start(start_envoy, cp: IstioControlPlane, upstream, **push):
    cp.push(**push)
    return start_envoy(cp.bootstrap(upstream.port))


def stat_until(e, stat: str, predicate, timeout: float = 15.0) -> None:
    """Wait until Envoy's `stat` satisfies `predicate`."""
    if not harness.wait_for(lambda: predicate(e.stats().get(stat, 0)), timeout):
        value = e.stats().get(stat, 0)
        raise AssertionError(f"{stat} = {value}, still not as expected after {timeout}s\n{e.log()[-3000:]}")


def push_and_wait(e, cp: IstioControlPlane, name: str, *, accepted: bool = True, **push) -> None:
    """Push the documents again and wait until Envoy has applied the new
    plugin configuration on its workers (accepted) or refused it."""
    s = e.stats()
    if accepted:
        success, reload = s[cp.stat(name, "update_success")], s[cp.stat(name, "config_reload")]
        cp.push(**push)
        stat_until(e, cp.stat(name, "update_success"), lambda v: v > success)
        stat_until(e, cp.stat(name, "config_reload"), lambda v: v > reload)
    else:
        fails = s[cp.stat(name, "config_fail")]
        cp.push(**push)
        stat_until(e, cp.stat(name, "config_fail"), lambda v: v > fails)


def loop(e, path: str, body: dict, n: int, key: str = "sk-istio-agent", **headers) -> list[httpx.Response]:
    with httpx.Client(base_url=e.url, headers={"host": HOST, "authorization": f"Bearer {key}", **headers}) as c:
        return [c.post(path, json=body) for _ in range(n)]


def codes(responses) -> list[int]:
    return [r.status_code for r in responses]


def pluginconfig(cp: IstioControlPlane, name: str) -> dict:
    return cp.doc("WasmPlugin", name)["spec"]["pluginConfig"]


def ecds_config(cp: IstioControlPlane, name: str) -> dict:
    """The filter configuration Envoy was sent (the ECDS file)."""
    response = json.loads(cp.ecds_path(cp.plugin(name).resource).read_text())
    assert len(response["resources"]) == 1
    resource = response["resources"][0]
    assert resource["name"] == cp.plugin(name).resource
    return resource["typed_config"]


# --- translation ---------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_names_chain_and_patches_follow_the_istio_version(version, tmp_path):
    gw = IstioControlPlane(docs(), gateway_proxy(version), tmp_path)
    sc = IstioControlPlane(docs(), sidecar_proxy(version), tmp_path)
    if version == "1.29":
        resource = "extensions.istio.io/wasmplugin/istio-system.loopguard-gateway"
        plugin_name = "istio-system.loopguard-gateway"
        sidecar = "extensions.istio.io/wasmplugin/agents.loopguard-sidecar"
        patch = 0
    else:
        resource = "extensions.istio.io/trafficextension/istio-system.loopguard-gateway~istio-translated-wasmplugin"
        plugin_name = "istio-system.loopguard-gateway~istio-translated-wasmplugin"
        sidecar = "extensions.istio.io/trafficextension/agents.loopguard-sidecar~istio-translated-wasmplugin"
        patch = 1

    # Each proxy gets only its own plugin. Of the two buffer patches, exactly
    # the one anchored on this version's name applies: the buffer right
    # after loopguard; then the warn headers' header_mutation after it.
    assert [p.resource for p in gw.plugins] == [resource]
    assert gw.filter_names == [resource, "envoy.filters.http.buffer", "envoy.filters.http.header_mutation",
                               "envoy.filters.http.grpc_stats", "envoy.filters.http.fault", "envoy.filters.http.cors", "envoy.filters.http.router"]
    assert gw.applied_patches == [f"loopguard-gateway-buffer#{patch}", "loopguard-gateway-buffer#2"]
    assert gw.http_filters[1]["typed_config"]["max_request_bytes"] == 1048576
    assert [p.resource for p in sc.plugins] == [sidecar]
    assert sc.filter_names == [sidecar, "envoy.filters.http.buffer", "envoy.filters.http.grpc_stats", "envoy.filters.http.fault",
                               "envoy.filters.http.cors", "envoy.filters.http.router"]
    assert sc.applied_patches == [f"loopguard-sidecar-buffer#{patch}"]
    assert sc.http_filters[1]["typed_config"]["max_request_bytes"] == 262144

    # The listener's filter: config discovery only, no default config.
    ecds = gw.http_filters[0]
    assert set(ecds) == {"name", "config_discovery"}
    assert ecds["config_discovery"]["type_urls"] == [mesh.WASM_TYPE, mesh.RBAC_TYPE]
    assert ecds["config_discovery"]["config_source"]["initial_fetch_timeout"] == "0s"

    # What istiod sends, then what istio-agent hands Envoy.
    plugin = gw.plugin("loopguard-gateway")
    assert plugin.plugin_name == plugin_name
    sent = plugin.wasm["config"]
    assert sent["name"] == plugin_name
    assert sent["root_id"] == "loopguard"
    assert sent["failure_policy"] == "FAIL_RELOAD"
    assert "fail_open" not in sent and "vm_id" not in sent["vm_config"]
    assert sent["vm_config"]["code"]["remote"]["http_uri"]["uri"] == "oci://ghcr.io/loopguard/loopguard:0.1.0"
    assert mesh.is_sha256_hex(sent["vm_config"]["code"]["remote"]["sha256"])
    assert sent["vm_config"]["environment_variables"]["key_values"]["ISTIO_META_WASM_IMAGE_PULL_POLICY"] == "IfNotPresent"
    value = sent["configuration"]["value"]
    assert json.loads(value) == pluginconfig(gw, "loopguard-gateway")
    assert value.startswith('{"$schema":"https://raw.githubusercontent.com/loopguard/loopguard/main/schema/loopguard.schema.json","max_body_bytes":1048576,"max_tracked_fingerprints":65536,"policies":[{"id":"agents","spec":{"loop_detection":{"cooldown_seconds":30,')
    local = mesh.agent_rewrite(plugin, WASM)["config"]
    assert local["vm_config"] == {"runtime": "envoy.wasm.runtime.v8", "code": {"local": {"filename": WASM}}}
    assert local["configuration"] == sent["configuration"]
    # The sidecar plugin is FAIL_OPEN.
    assert sc.plugin("loopguard-sidecar").wasm["config"]["failure_policy"] == "FAIL_OPEN"

    # The Envoy routes the policy selects by name exist under those names.
    names = [r["name"] for vh in gw.route_config["virtual_hosts"] for r in vh["routes"]]
    assert names == ["llm.chat", "llm.messages", "models", "other"]
    selected = pluginconfig(gw, "loopguard-gateway")["policies"][0]["spec"]["selector"]["routes"]
    assert set(selected) <= set(names)
    assert [r["name"] for vh in sc.route_config["virtual_hosts"] for r in vh["routes"]] == ["default"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_patch_anchored_on_the_wrong_name_inserts_nothing(version, tmp_path):
    """Istio drops an INSERT_AFTER whose subFilter matches no filter: with
    both buffer patches anchored on the other version's name, no buffer (and
    so no header_mutation, anchored on the buffer) is inserted, silently."""
    d = docs()
    other = "1.30" if version == "1.29" else "1.29"
    wrong = IstioControlPlane(docs(), gateway_proxy(other), tmp_path).plugin("loopguard-gateway").resource
    ef = next(x for x in d if x["kind"] == "EnvoyFilter" and x["metadata"]["name"] == "loopguard-gateway-buffer")
    for cp in ef["spec"]["configPatches"][:2]:
        cp["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"] = wrong
    cp = IstioControlPlane(d, gateway_proxy(version), tmp_path)
    assert cp.applied_patches == []
    assert cp.filter_names == [cp.plugin("loopguard-gateway").resource, "envoy.filters.http.grpc_stats", "envoy.filters.http.fault",
                               "envoy.filters.http.cors", "envoy.filters.http.router"]


def test_patches_survive_an_in_place_upgrade(tmp_path):
    """The filter's name follows istiod's version; proxyVersion matches the
    proxy's. A 1.29 gateway served by a 1.30 istiod (in-place upgrade,
    before the gateway restarts) gets the 1.30 name: the example's patches
    still insert the buffer, while patches selected by proxyVersion would
    pick the 1.29 anchor and insert nothing."""
    skewed = IstioControlPlane(docs(), gateway_proxy("1.29"), tmp_path, istiod_version="1.30.0")
    assert skewed.plugins[0].resource.startswith("extensions.istio.io/trafficextension/")
    assert skewed.filter_names[1:3] == ["envoy.filters.http.buffer", "envoy.filters.http.header_mutation"]

    d = docs()
    ef = next(x for x in d if x["kind"] == "EnvoyFilter" and x["metadata"]["name"] == "loopguard-gateway-buffer")
    gated = [r"^1\.2[6-9].*", r"^1\.(3[0-9]|[4-9][0-9]).*"]
    for cp, regex in zip(ef["spec"]["configPatches"], gated):
        cp["match"]["proxy"] = {"proxyVersion": regex}
    assert IstioControlPlane(d, gateway_proxy("1.30"), tmp_path).applied_patches == ["loopguard-gateway-buffer#1", "loopguard-gateway-buffer#2"]
    assert IstioControlPlane(d, gateway_proxy("1.29"), tmp_path, istiod_version="1.30.0").applied_patches == []


def test_translation_refuses_fields_it_does_not_handle(tmp_path):
    def translate(edit, kind="WasmPlugin", name="loopguard-gateway"):
        d = docs()
        edit(next(x for x in d if x["kind"] == kind and x["metadata"]["name"] == name))
        return IstioControlPlane(d, gateway_proxy("1.30"), tmp_path)

    refused = [
        (lambda w: w["spec"]["vmConfig"].update(foo=1) if "vmConfig" in w["spec"] else w["spec"].update(vmConfig={"foo": 1}), "spec.vmConfig.foo"),
        (lambda w: w["spec"].update(imagePullPolicy="Never"), "imagePullPolicy Never"),
        (lambda w: w["spec"].update(failStrategy="FAIL_LATER"), "failStrategy FAIL_LATER"),
        (lambda w: w["spec"].update(sha256="ABC"), "sha256 must be 64 lower-case hex characters"),
        (lambda w: w["spec"].update(url="ftp://example.com/loopguard.wasm"), "url scheme ftp"),
        (lambda w: w["spec"].update(type="NETWORK"), "type NETWORK"),
        (lambda w: w["metadata"].update(annotations={"a": "b"}), "metadata.annotations"),
    ]
    for edit, message in refused:
        with pytest.raises(Unhandled, match=message.replace("(", r"\(")):
            translate(edit)
    with pytest.raises(Unhandled, match=r"http\[0\].retries"):
        translate(lambda v: v["spec"]["http"][0].update(retries={"attempts": 3}), "VirtualService", "llm-api")
    with pytest.raises(Unhandled, match="operation MERGE"):
        translate(lambda f: f["spec"]["configPatches"][1]["patch"].update(operation="MERGE"), "EnvoyFilter", "loopguard-gateway-buffer")
    # Informational fields pass; workload selection is honoured.
    assert translate(lambda w: w["metadata"].update(labels={"team": "platform"})).plugins
    assert not translate(lambda w: w["spec"]["selector"]["matchLabels"].update(istio="egressgateway")).plugins
    assert not translate(lambda w: w["spec"]["match"][0].update(mode="SERVER")).plugins
    assert not translate(lambda w: w["spec"]["match"][0].update(ports=[{"number": 443}])).plugins
    assert translate(lambda w: w["spec"]["match"][0].update(ports=[{"number": 80}])).plugins
    # targetRefs: for Kubernetes Gateway API gateways only.
    assert not translate(lambda w: (w["spec"].pop("selector"), w["spec"].update(targetRefs=[{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "llm"}]))).plugins


def test_plugin_config_json_is_printed_as_istio_prints_it():
    """golang/protobuf jsonpb of a Struct: keys sorted, compact, numbers as
    doubles printed by encoding/json, HTML-safe strings."""
    value = {"b": 5, "a": [1.5, "<&>", True, None], "c": 1e21, "d": 1e-7, "e": 65536.0, "f": {"z": 0, "y": "é"}}
    assert mesh.struct_json(value) == '{"a":[1.5,"\\u003c\\u0026\\u003e",true,null],"b":5,"c":1e+21,"d":1e-7,"e":65536,"f":{"y":"é","z":0}}'
    assert mesh.struct_json(value, numbers="python") == '{"a":[1.5,"\\u003c\\u0026\\u003e",true,null],"b":5.0,"c":1e+21,"d":1e-7,"e":65536.0,"f":{"y":"é","z":0.0}}'


# --- in Envoy ------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_gateway_plugin_judges_the_selected_routes(version, upstream, start_envoy, tmp_path):
    cp = IstioControlPlane(docs(), gateway_proxy(version), tmp_path / "ecds")
    e = start(start_envoy, cp, upstream)
    plugin = cp.plugin("loopguard-gateway")
    s = e.stats()
    assert s[cp.stat("loopguard-gateway", "config_reload")] >= 1
    assert s[cp.stat("loopguard-gateway", "config_fail")] == 0
    assert s[cp.stat("loopguard-gateway", "update_rejected")] == 0
    # failStrategy FAIL_RELOAD reached Envoy as failure_policy and was accepted.
    sent = ecds_config(cp, "loopguard-gateway")
    assert sent["config"]["failure_policy"] == "FAIL_RELOAD"
    assert "environment_variables" not in sent["config"]["vm_config"]
    assert "configured 1 policy (agents), tracking up to 65536 fingerprints" in e.log()
    mesh.mark_loaded(cp.plugin_docs)

    # OpenAI-style loop on route llm.chat: warned at 3 and 4 (the client and
    # the upstream see it; a forged warning header never reaches the
    # upstream), rejected from 5, in OpenAI's error shape.
    chat = loop(e, "/v1/chat/completions", CHAT, 1, **{"x-loopguard-warning": "forged"})
    chat += loop(e, "/v1/chat/completions", CHAT, 5)
    assert codes(chat) == [200, 200, 200, 200, 429, 429]
    seen = upstream.requests[:]
    assert len(seen) == 4
    assert [r["headers"].get("x-loopguard-warning") for r in seen] == [None, None, "loop_warn", "loop_warn"]
    assert [r["headers"].get("x-loopguard-loop-count") for r in seen] == [None, None, "3", "4"]
    assert seen[2]["headers"]["x-loopguard-policy"] == "agents"
    assert chat[2].headers["x-loopguard-warning"] == "loop_warn"
    err = chat[4].json()["error"]
    assert (err["code"], err["policy"], err["hit_count"], err["cooldown_seconds"]) == ("recursive_loop_detected", "agents", 5, 30)
    assert chat[4].headers["x-should-retry"] == "false"
    # The filter runs under the plugin name Istio gave it.
    assert f"wasm log {plugin.plugin_name} loopguard: " in e.log()

    # Anthropic-style loop on route llm.messages: Anthropic's error shape.
    messages = loop(e, "/v1/messages", MESSAGES, 5)
    assert codes(messages) == [200, 200, 200, 200, 429]
    assert messages[4].json()["error"]["type"] == "rate_limit_error"
    assert len(upstream.requests) == 8

    # Routes "models" and "other" are not selected: the same loop passes.
    assert codes(loop(e, "/v1/models", CHAT, 6)) == [200] * 6
    assert codes(loop(e, "/v1/embeddings", CHAT, 6)) == [200] * 6
    assert len(upstream.requests) == 20


@pytest.mark.parametrize("version", VERSIONS)
def test_changed_plugin_config_is_applied_live_and_keeps_counts(version, upstream, start_envoy, tmp_path):
    """kubectl apply of an edited WasmPlugin: istiod pushes the new plugin
    config over ECDS; the same Envoy applies it without restarting, and the
    counts of a loop already under way are kept (same table size)."""
    cp = IstioControlPlane(docs(), gateway_proxy(version), tmp_path / "ecds")
    e = start(start_envoy, cp, upstream)
    pid = e.proc.pid
    assert codes(loop(e, "/v1/chat/completions", CHAT, 2)) == [200, 200]

    config = pluginconfig(cp, "loopguard-gateway")
    config["policies"][0]["spec"]["loop_detection"] = {
        "enabled": True, "window_seconds": 60, "similarity": "llm_tail", "tail_messages": 3,
        "threshold_identical_requests": 3, "action": "reject",
    }
    push_and_wait(e, cp, "loopguard-gateway")
    third = loop(e, "/v1/chat/completions", CHAT, 1)[0]
    assert third.status_code == 429
    assert third.json()["error"]["hit_count"] == 3
    assert "cooldown_seconds" not in third.json()["error"]
    assert e.proc.pid == pid and e.proc.poll() is None
    assert len(upstream.requests) == 2


def test_counts_survive_the_istio_upgrade_that_renames_the_plugin(upstream, start_envoy, tmp_path):
    """istiod 1.30 renames every WasmPlugin's filter (and the plugin name
    the filter sees: `~istio-translated-wasmplugin` is appended). loopguard
    drops that suffix from the namespace of its counts, so a loop under way
    when the proxies move to the new name is still counted: one Envoy
    process here holds the 1.29-named and the 1.30-named plugin side by
    side, on two listeners sharing its shared data."""
    old = IstioControlPlane(docs(), gateway_proxy("1.29"), tmp_path / "ecds-1.29")
    new = IstioControlPlane(docs(), gateway_proxy("1.30"), tmp_path / "ecds-1.30")
    assert old.plugin("loopguard-gateway").plugin_name != new.plugin("loopguard-gateway").plugin_name
    old.push()
    new.push()
    cfg = old.bootstrap(upstream.port)
    second = new.bootstrap(upstream.port)["static_resources"]["listeners"][0]
    second["name"] = "istio-1.30"
    cfg["static_resources"]["listeners"].append(second)
    e = start_envoy(cfg)
    assert codes(loop(e, "/v1/chat/completions", CHAT, 4)) == [200] * 4
    e.port = e.listener_ports[1]
    # The 5th identical request, through the renamed plugin: rejected.
    fifth = loop(e, "/v1/chat/completions", CHAT, 1)[0]
    assert fifth.status_code == 429
    assert fifth.json()["error"]["hit_count"] == 5
    assert len(upstream.requests) == 4


@pytest.mark.parametrize("version", VERSIONS)
def test_invalid_pushed_config_is_refused_and_the_last_good_one_stays(version, upstream, start_envoy, tmp_path):
    cp = IstioControlPlane(docs(), gateway_proxy(version), tmp_path / "ecds")
    e = start(start_envoy, cp, upstream)
    good = copy.deepcopy(pluginconfig(cp, "loopguard-gateway"))
    detection = pluginconfig(cp, "loopguard-gateway")["policies"][0]["spec"]["loop_detection"]

    detection.pop("escalation")
    detection.pop("cooldown_seconds")
    detection.update(threshold_identical_requests=1, action="reject")
    push_and_wait(e, cp, "loopguard-gateway", accepted=False)
    assert 'invalid configuration: policy "agents": loop_detection.threshold_identical_requests must be >= 2 (got 1)' in e.log()

    cp.doc("WasmPlugin", "loopguard-gateway")["spec"]["pluginConfig"] = copy.deepcopy(good)
    pluginconfig(cp, "loopguard-gateway")["policies"][0]["spec"]["loop_detection"]["treshold"] = 3
    push_and_wait(e, cp, "loopguard-gateway", accepted=False)
    assert 'invalid configuration: policy "agents": loop_detection.treshold is not a known field' in e.log()
    assert e.stats()[cp.stat("loopguard-gateway", "update_rejected")] == 2

    # Traffic keeps the example's configuration: warned at 3, rejected at 5.
    responses = loop(e, "/v1/chat/completions", CHAT, 5)
    assert codes(responses) == [200, 200, 200, 200, 429]
    assert responses[2].headers["x-loopguard-warning"] == "loop_warn"
    assert e.proc.poll() is None


def test_numbers_printed_as_5_or_5_0_are_accepted_and_fractions_refused(upstream, start_envoy, tmp_path):
    """Istio prints pluginConfig's numbers as Go does (`5`); a control plane
    using Python's protobuf prints `5.0`. loopguard accepts both; a
    fractional value is refused, naming the field."""
    cp = IstioControlPlane(docs(), gateway_proxy("1.30"), tmp_path / "ecds")
    e = start(start_envoy, cp, upstream)
    assert '"window_seconds":60}' in ecds_config(cp, "loopguard-gateway")["config"]["configuration"]["value"]
    assert codes(loop(e, "/v1/chat/completions", CHAT, 2)) == [200, 200]

    push_and_wait(e, cp, "loopguard-gateway", numbers="python")
    value = ecds_config(cp, "loopguard-gateway")["config"]["configuration"]["value"]
    assert '"window_seconds":60.0}' in value and '"max_tracked_fingerprints":65536.0,' in value
    assert e.stats()[cp.stat("loopguard-gateway", "config_fail")] == 0
    # Same table size: the loop's two hits are still counted.
    assert codes(loop(e, "/v1/chat/completions", CHAT, 3)) == [200, 200, 429]

    pluginconfig(cp, "loopguard-gateway")["policies"][0]["spec"]["loop_detection"]["window_seconds"] = 60.5
    push_and_wait(e, cp, "loopguard-gateway", accepted=False)
    assert 'policy "agents": loop_detection.window_seconds must be a whole number from 1 to 86400 (got 60.5)' in e.log()


def test_module_istio_agent_cannot_fetch_is_replaced_by_rbac(upstream, start_envoy, tmp_path):
    """If istio-agent cannot fetch the module, it sends Envoy an RBAC filter
    in loopguard's place: deny-all for the gateway (FAIL_RELOAD: every route
    answers 403, not only loopguard's), allow-all for the FAIL_OPEN sidecar
    (traffic flows, unchecked). Once the module can be fetched, the next
    push installs loopguard."""
    gw = IstioControlPlane(docs(), gateway_proxy("1.30"), tmp_path / "gw")
    e = start(start_envoy, gw, upstream, module=None)
    assert ecds_config(gw, "loopguard-gateway") == {"@type": mesh.RBAC_TYPE, "rules": {}, "rules_stat_prefix": "wasm-default-deny"}
    assert codes(loop(e, "/v1/chat/completions", CHAT, 2)) == [403, 403]
    assert codes(loop(e, "/v1/models", CHAT, 1)) == [403]
    assert len(upstream.requests) == 0
    push_and_wait(e, gw, "loopguard-gateway")
    assert codes(loop(e, "/v1/chat/completions", CHAT, 5)) == [200, 200, 200, 200, 429]

    sc = IstioControlPlane(docs(), sidecar_proxy("1.30"), tmp_path / "sc")
    e2 = start(start_envoy, sc, upstream, module=None)
    assert ecds_config(sc, "loopguard-sidecar") == {"@type": mesh.RBAC_TYPE, "rules_stat_prefix": "wasm-default-allow"}
    with httpx.Client(base_url=e2.url, headers={"x-agent-id": "agent-7"}) as c:
        assert [c.post("/tools/search", json={"q": "build"}).status_code for _ in range(4)] == [200] * 4


@pytest.mark.parametrize("version", VERSIONS)
def test_sidecar_plugin_judges_inbound_tool_calls(version, upstream, start_envoy, tmp_path):
    cp = IstioControlPlane(docs(), sidecar_proxy(version), tmp_path / "ecds")
    e = start(start_envoy, cp, upstream)
    assert e.stats()[cp.stat("loopguard-sidecar", "config_reload")] >= 1
    assert ecds_config(cp, "loopguard-sidecar")["config"]["failure_policy"] == "FAIL_OPEN"
    assert "configured 1 policy (tool-calls), tracking up to 16384 fingerprints" in e.log()
    mesh.mark_loaded(cp.plugin_docs)

    call = {"tool": "search", "arguments": {"query": "build status"}}
    with httpx.Client(base_url=e.url) as c:
        agent1 = [c.post("/tools/search", json=call, headers={"x-agent-id": "agent-1"}) for _ in range(4)]
        agent2 = [c.post("/tools/search", json=call, headers={"x-agent-id": "agent-2"}) for _ in range(2)]
        reads = [c.get("/tools/search", headers={"x-agent-id": "agent-1"}) for _ in range(4)]
    assert codes(agent1) == [200, 200, 429, 429]
    assert agent1[2].json()["error"]["policy"] == "tool-calls"
    assert codes(agent2) == [200, 200]  # another agent, its own count
    assert codes(reads) == [200] * 4  # only POSTs are selected
    assert len(upstream.requests) == 2 + 2 + 4
    assert f"wasm log {cp.plugin('loopguard-sidecar').plugin_name} loopguard: " in e.log()


# --- the native module -------------------------------------------------------------

# Istio 1.31 is the first whose proxy builds in the dynamic_modules filter.
NATIVE_ISTIO = "1.31.0"


def test_native_envoyfilter_judges_inbound_tool_calls(upstream, start_envoy, tmp_path):
    """envoyfilter-native.yaml on its own: the module inserted before the
    router of the tools-api sidecars' inbound listener, loaded from the
    path the example names (pointed at the built module), judging as the
    sidecar WasmPlugin does, with no buffer filter (the module holds the
    headers itself)."""
    docs_native = mesh.load_docs(mesh.ISTIO_EXAMPLES / "envoyfilter-native.yaml")
    cp = IstioControlPlane(docs_native, sidecar_proxy_of(NATIVE_ISTIO), tmp_path / "ecds")
    assert cp.filter_names[-2:] == ["loopguard", "envoy.filters.http.router"]
    assert cp.applied_patches == ["loopguard-native#0"]
    assert "envoy.filters.http.buffer" not in cp.filter_names
    [native] = [f for f in cp.http_filters if f["name"] == "loopguard"]
    module = native["typed_config"]["dynamic_module_config"]["module"]["local"]
    assert module["filename"] == "/etc/istio/loopguard/libloopguard_native.so"
    module["filename"] = harness.NATIVE
    e = start_envoy(cp.bootstrap(upstream.port))
    assert f"Dynamic module ABI version {harness.envoy_abi()} matched" in e.log()
    assert "loopguard: configured 1 policy (tool-calls)" in e.log()
    mesh.mark_loaded(docs_native)
    call = {"tool": "search", "arguments": {"query": "build status"}}
    with httpx.Client(base_url=e.url) as c:
        agent1 = [c.post("/tools/search", json=call, headers={"x-agent-id": "agent-1"}) for _ in range(4)]
        agent2 = [c.post("/tools/search", json=call, headers={"x-agent-id": "agent-2"}) for _ in range(2)]
    assert codes(agent1) == [200, 200, 429, 429]
    assert agent1[2].json()["error"]["policy"] == "tool-calls"
    assert codes(agent2) == [200, 200]
    assert len(upstream.requests) == 2 + 2
    assert e.counter("loopguard.rejected_total.policy.tool-calls") == 2


# --- MCP -------------------------------------------------------------------------

def answered_by_envoy(e) -> int:
    """Requests Envoy answered without sending them upstream: downstream
    requests on the listener minus requests to the upstream clusters."""
    s = e.stats()
    down = sum(v for k, v in s.items() if k.startswith("http.") and k.endswith(".downstream_rq_total") and not k.startswith("http.admin."))
    return down - sum(v for k, v in s.items() if k.startswith("cluster.") and k.endswith(".upstream_rq_total"))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("version", VERSIONS)
def test_mcp_plugin_blocks_a_looping_agent_on_the_mcp_servers_sidecar(version, mode, mcp_server, start_envoy, tmp_path):
    """wasmplugin-mcp.yaml: the plugin reaches only the MCP server's
    sidecar, with the buffer right after it (the patch for this version's
    name) standing in for held headers, which a WasmPlugin cannot ask for;
    the inbound route has no timeout. A real MCP client's 4th identical
    call is blocked and never reaches the server; tools/list and another
    call pass."""
    cp = IstioControlPlane(docs(), mcp_proxy(version), tmp_path / "ecds")
    (plugin,) = cp.plugins
    if version == "1.29":
        assert plugin.resource == "extensions.istio.io/wasmplugin/agents.loopguard-mcp"
        patch = 0
    else:
        assert plugin.resource == "extensions.istio.io/trafficextension/agents.loopguard-mcp~istio-translated-wasmplugin"
        patch = 1
    assert cp.filter_names == [plugin.resource, "envoy.filters.http.buffer", "envoy.filters.http.grpc_stats", "envoy.filters.http.fault",
                               "envoy.filters.http.cors", "envoy.filters.http.router"]
    assert cp.applied_patches == [f"loopguard-mcp-buffer#{patch}"]
    config = pluginconfig(cp, "loopguard-mcp")
    assert "hold_request_headers" not in config and "allow_on_headers_stop_iteration" not in plugin.wasm["config"]
    assert cp.http_filters[1]["typed_config"]["max_request_bytes"] >= config["max_body_bytes"]
    assert plugin.wasm["config"]["failure_policy"] == "FAIL_OPEN"
    assert [r["route"]["timeout"] for vh in cp.route_config["virtual_hosts"] for r in vh["routes"]] == ["0s"]

    e = start(start_envoy, cp, mcp_server)
    assert e.stats()[cp.stat("loopguard-mcp", "config_fail")] == 0
    assert "configured 1 policy (mcp-tools), tracking up to " in e.log()
    mesh.mark_loaded(cp.plugin_docs)
    looping_agent(f"{e.url}/mcp", mode, mcp_server)
    # The blocked call's headers never went upstream either: the buffer
    # held them (without it, Envoy opens an upstream request for it, whose
    # body never follows).
    assert answered_by_envoy(e) == 1
    assert e.counter("loopguard.mcp_calls_total") == 5  # 4 searches and the read
    assert e.counter("loopguard.mcp_loops_total") == 2  # the note and the block
    assert f"wasm log {plugin.plugin_name} loopguard: " in e.log()


# --- every example is exercised ---------------------------------------------------


def test_every_istio_example_is_translated_and_its_loopguard_config_loaded(request):
    """Runs last: every YAML file in examples/istio went through the
    translation, and every loopguard configuration in them was loaded by a
    real Envoy in the tests above."""
    mesh.assert_examples_covered(request, mesh.ISTIO_EXAMPLES, set(FILES) | {"envoyfilter-native.yaml"})
