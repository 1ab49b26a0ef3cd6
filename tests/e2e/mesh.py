"""The Envoy configuration Istio and Envoy Gateway build from the examples in
examples/istio and examples/envoy-gateway, for real Envoy to run.

No istiod, istio-agent or Envoy Gateway controller runs in the tests. This
module reproduces, from the example files themselves, the part of their
output that decides what loopguard does: the filter, its configuration, its
place in the HTTP filter chain, the routes it is enabled on. The behaviour is
taken from their sources (named in each docstring): Istio 1.29 and 1.30,
Envoy Gateway 1.6 to 1.9, Envoy AI Gateway 1.0 to 1.1.

Every kind has an allow-list of the fields the translation handles. A field
outside it raises `Unhandled`: an example cannot carry a setting that would
change Envoy's configuration without the translation (and so the tests)
handling it. Fields that only pick workloads or fetch the module are handled
without appearing in Envoy's configuration (checked, e.g. a digest's form);
purely informational ones (metadata.labels) are listed as IGNORED.

Left out on purpose, as they do not change what loopguard sees: istio-proxy's
own filters (metadata exchange, istio.stats, alpn), Istio's route retry
policies and decorators, Envoy Gateway's cluster tuning and its listener
tuning other than the per-connection buffer limit (where a body held by
loopguard waits).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import yaml

from harness import NATIVE, ROOT, ROUTER, WASM, Answer, Upstream

ISTIO_EXAMPLES = ROOT / "examples" / "istio"
EG_EXAMPLES = ROOT / "examples" / "envoy-gateway"

WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
DYNAMIC_MODULE_TYPE = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
RBAC_TYPE = "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"
HCM_NAME = "envoy.filters.network.http_connection_manager"
HCM_TYPE = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"

# --- documents and allow-lists -------------------------------------------------


class Unhandled(ValueError):
    """An example carries a field the translation does not handle."""


LEAF = "leaf"  # a scalar the translation reads
ANY = "any"  # content passed through whole (the plugin configuration, a patch value)
IGNORED = "ignored"  # informational: changes nothing in Envoy's configuration


class MapOf:
    """A mapping with arbitrary keys whose values follow `schema`."""

    def __init__(self, schema) -> None:
        self.schema = schema


def check_fields(node, schema, where: str) -> None:
    if schema in (ANY, IGNORED):
        return
    if schema == LEAF:
        if isinstance(node, (dict, list)):
            raise Unhandled(f"{where} has content the translation does not handle: {node!r}")
        return
    if isinstance(schema, list):
        if not isinstance(node, list):
            raise Unhandled(f"{where} must be a list")
        for i, item in enumerate(node):
            check_fields(item, schema[0], f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        raise Unhandled(f"{where} must be a mapping")
    if isinstance(schema, MapOf):
        for key, value in node.items():
            check_fields(value, schema.schema, f"{where}.{key}")
        return
    for key, value in node.items():
        if key not in schema:
            raise Unhandled(f"{where}.{key} is not handled by the translation (it may change Envoy's configuration)")
        check_fields(value, schema[key], f"{where}.{key}")


METADATA = {"name": LEAF, "namespace": LEAF, "labels": IGNORED}


# Which example files the tests translated, and which of them had their
# loopguard configuration loaded by a real Envoy: {path: {"translated", "loaded"}}.
USED: dict[Path, set[str]] = {}


def load_docs(*paths: Path) -> list[dict]:
    docs = []
    for path in paths:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if doc is not None:
                doc.setdefault("metadata", {}).setdefault("namespace", "default")
                doc["_file"] = Path(path).name
                doc["_path"] = Path(path).resolve()
                docs.append(doc)
    return docs


def mark(docs: list[dict], what: str) -> None:
    for d in docs:
        if "_path" in d:
            USED.setdefault(d["_path"], set()).add(what)


def carries_loopguard_config(doc: dict) -> bool:
    if doc["kind"] == "WasmPlugin":
        return bool(doc["spec"].get("pluginConfig"))
    if doc["kind"] == "EnvoyExtensionPolicy":
        return any("config" in w for w in doc["spec"].get("wasm", []) + doc["spec"].get("dynamicModule", []))
    if doc["kind"] == "EnvoyFilter":
        # A patch inserting the dynamic module with its configuration.
        return any("filter_config" in cp["patch"].get("value", {}).get("typed_config", {}) for cp in doc["spec"]["configPatches"])
    return False


def assert_examples_covered(request, folder: Path, expected: set[str]) -> None:
    """For the last test of a module: every YAML file in `folder` (exactly
    `expected`) went through a translation, and every loopguard
    configuration in them was loaded by a real Envoy in the module's other
    tests (which must all have run and passed)."""
    import pytest

    module_tests = [i for i in request.session.items if i.module is request.module and i is not request.node]
    ran = {i.nodeid for i in module_tests if getattr(i, "rep_call", None) is not None and i.rep_call.passed}
    defined = {n for n in dir(request.module) if n.startswith("test_")} - {request.node.originalname}
    collected = {i.originalname for i in module_tests}
    if defined - collected or len(ran) != len(module_tests):
        pytest.skip("run the whole module (every test passing) to check example coverage")
    files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    assert {p.name for p in files} == expected
    for path in files:
        used = USED.get(path.resolve(), set())
        assert "translated" in used, f"{path.name} is not exercised by a test"
        for doc in load_docs(path):
            if carries_loopguard_config(doc):
                assert "loaded" in used, f"the loopguard configuration in {path.name} was not loaded by Envoy"


def mark_loaded(docs: list[dict]) -> None:
    """Record that a real Envoy loaded the loopguard configuration of these
    documents (call once the test has seen loopguard accept it)."""
    mark([d for d in docs if carries_loopguard_config(d)], "loaded")


def validate(doc: dict, schemas: dict[str, tuple[tuple[str, ...], dict]]) -> None:
    """Check `doc` against the allow-list of its kind (and its apiVersion)."""
    kind = doc.get("kind")
    if kind not in schemas:
        raise Unhandled(f"{doc.get('_file')}: kind {kind} is not handled by the translation")
    api_versions, spec = schemas[kind]
    if doc.get("apiVersion") not in api_versions:
        raise Unhandled(f"{doc.get('_file')}: {kind} apiVersion {doc.get('apiVersion')} is not handled")
    body = {k: v for k, v in doc.items() if not k.startswith("_")}
    check_fields(body, {"apiVersion": LEAF, "kind": LEAF, "metadata": METADATA, "spec": spec}, f"{doc['_file']}: {kind} {doc['metadata']['name']}")


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def labels_match(selector: dict | None, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def is_sha256_hex(value) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{64}", value) is not None


# --- JSON as the control planes print it ---------------------------------------


def _go_float(f: float) -> str:
    """encoding/json's float64: shortest round-trip digits, 'f' form between
    1e-6 and 1e21, else 'e' form with a two-digit exponent trimmed."""
    if f != f or f in (float("inf"), float("-inf")):
        raise ValueError("NaN and infinities are not JSON numbers")
    a = abs(f)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        mant, _, exp = repr(f).partition("e")
        sign, digits = exp[0], exp[1:].lstrip("0") or "0"
        return f"{mant}e{sign}{digits}"
    text = format(Decimal(repr(f)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _go_string(s: str) -> str:
    """encoding/json's string: HTML-safe (<, >, & as \\u003c...), U+2028 and
    U+2029 escaped, other non-ASCII kept."""
    out = json.dumps(s, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        out = out.replace(ch, esc)
    return out


def struct_json(value, numbers: str = "go") -> str:
    """A YAML value as Istio passes a WasmPlugin's pluginConfig to the plugin.

    istiod holds pluginConfig as a protobuf Struct and prints it with
    golang/protobuf's jsonpb (pkg/util/protomarshal.ToJSON): compact, keys
    sorted, every number a double printed by encoding/json (5.0 -> `5`),
    strings HTML-escaped. numbers="python" prints them as Python's protobuf
    json_format does, integral doubles as `5.0`: what another control plane
    may send."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{_go_string(str(k))}:{struct_json(value[k], numbers)}" for k in sorted(value, key=str)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(struct_json(v, numbers) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        f = float(value)
        return repr(f) if numbers == "python" and f == int(f) and abs(f) < 1e16 else _go_float(f)
    if isinstance(value, str):
        return _go_string(value)
    raise Unhandled(f"pluginConfig value {value!r} has no protobuf Struct form")


def k8s_json(value) -> str:
    """A JSON field of a Kubernetes object (e.g. EnvoyExtensionPolicy
    wasm[].config, an apiextensions JSON) as a controller reads it back:
    compact, keys sorted, integers kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- Istio ---------------------------------------------------------------------

ISTIO_ROOT_NAMESPACE = "istio-system"

WASMPLUGIN = {
    "selector": {"matchLabels": MapOf(LEAF)},
    "targetRefs": [{"group": LEAF, "kind": LEAF, "name": LEAF, "namespace": LEAF}],
    "match": [{"mode": LEAF, "ports": [{"number": LEAF}]}],
    "url": LEAF,
    "sha256": LEAF,
    "imagePullPolicy": LEAF,
    "imagePullSecret": LEAF,
    "pluginName": LEAF,
    "phase": LEAF,
    "priority": LEAF,
    "failStrategy": LEAF,
    "type": LEAF,
    "pluginConfig": ANY,
    "vmConfig": {"env": [{"name": LEAF, "value": LEAF, "valueFrom": LEAF}]},
}
ENVOYFILTER = {
    "workloadSelector": {"labels": MapOf(LEAF)},
    "priority": LEAF,
    "configPatches": [
        {
            "applyTo": LEAF,
            "match": {
                "context": LEAF,
                "proxy": {"proxyVersion": LEAF},
                "listener": {
                    "name": LEAF,
                    "portNumber": LEAF,
                    "filterChain": {"filter": {"name": LEAF, "subFilter": {"name": LEAF}}},
                },
            },
            "patch": {"operation": LEAF, "value": ANY},
        }
    ],
}
VIRTUALSERVICE = {
    "hosts": [LEAF],
    "gateways": [LEAF],
    "http": [
        {
            "name": LEAF,
            "match": [{"name": LEAF, "uri": {"exact": LEAF, "prefix": LEAF}, "method": {"exact": LEAF}}],
            "route": [{"destination": {"host": LEAF, "port": {"number": LEAF}}}],
            "timeout": LEAF,
        }
    ],
}
ISTIO_GATEWAY = {
    "selector": MapOf(LEAF),
    "servers": [{"port": {"number": LEAF, "name": LEAF, "protocol": LEAF}, "hosts": [LEAF]}],
}
ISTIO_SCHEMAS = {
    "WasmPlugin": (("extensions.istio.io/v1alpha1",), WASMPLUGIN),
    "EnvoyFilter": (("networking.istio.io/v1alpha3",), ENVOYFILTER),
    "VirtualService": (("networking.istio.io/v1", "networking.istio.io/v1beta1"), VIRTUALSERVICE),
    "Gateway": (("networking.istio.io/v1", "networking.istio.io/v1beta1"), ISTIO_GATEWAY),
}

# Istio's HTTP filter chain places plugins by phase (listener_builder.go):
# AUTHN plugins, authn filters, AUTHZ plugins, RBAC, STATS plugins,
# UNSPECIFIED plugins, then grpc_stats, fault, cors, telemetry, router.
PHASE_ORDER = {"AUTHN": 0, "AUTHZ": 1, "STATS": 2, "UNSPECIFIED_PHASE": 3}
FAIL_STRATEGIES = {"FAIL_CLOSE": "FAIL_CLOSED", "FAIL_OPEN": "FAIL_OPEN", "FAIL_RELOAD": "FAIL_RELOAD"}
URL_SCHEMES = ("oci", "http", "https", "file")
PULL_POLICIES = ("IfNotPresent", "Always")
ISTIO_META_PREFIX = "ISTIO_META_"


def istio_minor(version: str) -> int:
    major, minor = version.split(".")[:2]
    assert major == "1", version
    return int(minor)


def wasmplugin_names(doc: dict, version: str) -> tuple[str, str]:
    """(ECDS resource = HTTP filter name, PluginConfig.name) of a WasmPlugin.

    Istio 1.26-1.29 (pilot/pkg/model/extensions.go): resource
    extensions.istio.io/wasmplugin/<ns>.<name>, plugin name <ns>.<name>.
    Istio 1.30+ translates each WasmPlugin into a TrafficExtension named
    <name>~istio-translated-wasmplugin (pilot/pkg/config/kube/extensions/
    translate.go): resource extensions.istio.io/trafficextension/<ns>.<that>,
    plugin name <ns>.<that>."""
    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    minor = istio_minor(version)
    if minor < 26:
        raise Unhandled(f"Istio {version}: only 1.26 and later are translated")
    if minor >= 30:
        name = f"{name}~istio-translated-wasmplugin"
        return f"extensions.istio.io/trafficextension/{ns}.{name}", f"{ns}.{name}"
    return f"extensions.istio.io/wasmplugin/{ns}.{name}", f"{ns}.{name}"


@dataclass
class IstioProxy:
    """The proxy Istio builds configuration for: an ingress gateway or a
    sidecar (its inbound side). `port` is the listener's port as Istio sees
    it (the Gateway server's port, the workload's inbound port). `version`
    is the proxy's own Istio version, which EnvoyFilter proxyVersion
    matches; the filter names follow istiod's version."""

    kind: str  # "gateway" | "sidecar"
    namespace: str
    labels: dict
    version: str  # ISTIO_VERSION of the proxy, e.g. "1.30.0"
    port: int

    @property
    def context(self) -> str:
        return "GATEWAY" if self.kind == "gateway" else "SIDECAR_INBOUND"

    @property
    def mode(self) -> str:
        # workloadModeForListenerClass: gateways and sidecar outbound are
        # CLIENT, sidecar inbound is SERVER.
        return "CLIENT" if self.kind == "gateway" else "SERVER"


@dataclass
class IstioPlugin:
    resource: str  # ECDS resource name = HTTP filter name
    plugin_name: str
    phase: str
    priority: int
    wasm: dict  # envoy.extensions.filters.http.wasm.v3.Wasm as istiod sends it
    source: str  # file:name of the WasmPlugin


def wasmplugin_selects(doc: dict, proxy: IstioProxy) -> bool:
    """Whether a WasmPlugin attaches to the proxy's listener
    (PushContext.TrafficExtensionsByListenerInfo, policyattachment.go,
    matchTrafficSelectorCommon). selector, targetRefs and match[] decide
    which proxies get the filter; none of them appears in its config."""
    spec, ns = doc["spec"], doc["metadata"]["namespace"]
    if ns not in (proxy.namespace, ISTIO_ROOT_NAMESPACE):
        return False
    gateway_name = proxy.labels.get("gateway.networking.k8s.io/gateway-name")
    if spec.get("targetRefs"):
        # Only Kubernetes Gateway API gateways attach by targetRef; every
        # other workload ignores a policy that has one.
        if gateway_name is None or ns != proxy.namespace:
            return False
        for ref in spec["targetRefs"]:
            if ref.get("kind") != "Gateway" or ref.get("group") != "gateway.networking.k8s.io":
                raise Unhandled(f"WasmPlugin {ns}/{doc['metadata']['name']}: targetRef {ref} (only Gateway is translated)")
        if not any(ref["name"] == gateway_name and ref.get("namespace", ns) == ns for ref in spec["targetRefs"]):
            return False
    elif not labels_match(spec.get("selector", {}).get("matchLabels"), proxy.labels):
        return False
    matches = spec.get("match") or []
    if not matches:
        return True
    for m in matches:
        mode = m.get("mode", "UNDEFINED")
        if mode not in ("UNDEFINED", "CLIENT", "SERVER", "CLIENT_AND_SERVER"):
            raise Unhandled(f"WasmPlugin match mode {mode}")
        ports = [p["number"] for p in m.get("ports", [])]
        if mode in ("UNDEFINED", "CLIENT_AND_SERVER", proxy.mode) and (not ports or proxy.port in ports):
            return True
    return False


def istiod_wasm_plugin(doc: dict, version: str) -> IstioPlugin:
    """What istiod sends for one WasmPlugin: the ECDS resource
    (TrafficExtensionWrapper.buildWasmConfig in 1.30, WasmPluginWrapper.
    buildPluginConfig in 1.29): root_id = pluginName, configuration =
    pluginConfig as JSON in a StringValue, failure_policy from failStrategy,
    the module as a remote source for istio-agent to fetch, pull settings in
    ISTIO_META_* VM environment variables for istio-agent."""
    spec, meta = doc["spec"], doc["metadata"]
    where = f"{doc['_file']}: WasmPlugin {meta['name']}"
    resource, plugin_name = wasmplugin_names(doc, version)

    url = spec.get("url")
    if not url:
        raise Unhandled(f"{where}: url is required")
    scheme = url.split("://", 1)[0] if "://" in url else "oci"
    if scheme not in URL_SCHEMES:
        raise Unhandled(f"{where}: url scheme {scheme} (Istio fetches {', '.join(URL_SCHEMES)})")
    sha = spec.get("sha256")
    if sha is not None and not is_sha256_hex(sha):
        raise Unhandled(f"{where}: sha256 must be 64 lower-case hex characters (for oci:// the manifest digest without 'sha256:'), got {sha!r}")
    pull_policy = spec.get("imagePullPolicy")
    if pull_policy is not None and pull_policy not in PULL_POLICIES:
        raise Unhandled(f"{where}: imagePullPolicy {pull_policy}")
    if spec.get("type", "HTTP") != "HTTP":
        raise Unhandled(f"{where}: type {spec['type']} (only HTTP filters are translated)")
    phase = spec.get("phase", "UNSPECIFIED_PHASE")
    if phase not in PHASE_ORDER:
        raise Unhandled(f"{where}: phase {phase}")
    priority = spec.get("priority")
    if priority is not None and not isinstance(priority, int):
        raise Unhandled(f"{where}: priority must be an integer")
    fail = spec.get("failStrategy", "FAIL_CLOSE")
    if fail not in FAIL_STRATEGIES:
        raise Unhandled(f"{where}: failStrategy {fail}")
    if fail == "FAIL_RELOAD" and istio_minor(version) < 27:
        raise Unhandled(f"{where}: failStrategy FAIL_RELOAD needs Istio 1.27 (the 1.26 API has no such value)")

    env_values = {}
    if spec.get("imagePullSecret"):
        env_values["ISTIO_META_WASM_IMAGE_PULL_SECRET"] = spec["imagePullSecret"]
    if pull_policy:
        env_values["ISTIO_META_WASM_IMAGE_PULL_POLICY"] = pull_policy
    env_values["ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION"] = "1"
    host_keys = []
    for env in spec.get("vmConfig", {}).get("env", []):
        source = env.get("valueFrom", "INLINE")
        if source == "INLINE":
            env_values[env["name"]] = env.get("value", "")
        elif source == "HOST":
            host_keys.append(env["name"])
        else:
            raise Unhandled(f"{where}: vmConfig.env valueFrom {source}")
    environment: dict = {"key_values": env_values}
    if host_keys:
        environment["host_env_keys"] = host_keys

    if scheme == "file":
        code = {"local": {"filename": url[len("file://"):]}}
    else:
        remote = {"http_uri": {"uri": url if "://" in url else f"oci://{url}", "cluster": "_", "timeout": "30s"}}
        remote["sha256"] = sha or "nil"
        code = {"remote": remote}
    plugin_config = spec.get("pluginConfig")
    config: dict = {
        "name": plugin_name,
        "root_id": spec.get("pluginName", ""),
        "vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": code, "environment_variables": environment},
        "failure_policy": FAIL_STRATEGIES[fail],
    }
    if plugin_config:
        config["configuration"] = {"@type": STRING_VALUE, "value": struct_json(plugin_config)}
    return IstioPlugin(
        resource=resource,
        plugin_name=plugin_name,
        phase=phase,
        priority=priority if priority is not None else -(2**31),
        wasm={"@type": WASM_TYPE, "config": config},
        source=f"{doc['_file']}:{meta['name']}",
    )


def agent_rewrite(plugin: IstioPlugin, module: str | None) -> dict:
    """What istio-agent does with the ECDS resource before Envoy gets it
    (pkg/wasm/convert.go): the remote module, once downloaded (here: the
    built module stands in for the download, `module`), becomes a local
    file; the ISTIO_META_* variables are stripped. If the module cannot be
    fetched (module=None), the filter is replaced by an RBAC filter under the
    same name: deny-all, or allow-all when the failure policy is FAIL_OPEN.
    Returns the TypedExtensionConfig's typed_config."""
    wasm = copy.deepcopy(plugin.wasm)
    cfg = wasm["config"]
    vm = cfg["vm_config"]
    if "remote" in vm["code"]:
        if module is None:
            if cfg.get("failure_policy") == "FAIL_OPEN":
                return {"@type": RBAC_TYPE, "rules_stat_prefix": "wasm-default-allow"}
            return {"@type": RBAC_TYPE, "rules": {}, "rules_stat_prefix": "wasm-default-deny"}
        vm["code"] = {"local": {"filename": module}}
    env = vm.get("environment_variables", {})
    kv = {k: v for k, v in env.get("key_values", {}).items() if not k.startswith(ISTIO_META_PREFIX)}
    if kv:
        env["key_values"] = kv
    else:
        env.pop("key_values", None)
    if not env:
        vm.pop("environment_variables", None)
    return wasm


def ecds_http_filter(resource: str, path: str) -> dict:
    """The listener's HTTP filter for a plugin (extension/extensionfilter.go):
    config discovery, no default config, initial fetch timeout 0 (the
    listener waits for it). Istio's config source is ADS; here it is the
    file `path`."""
    return {
        "name": resource,
        "config_discovery": {
            "config_source": {"path_config_source": {"path": path}, "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
            "type_urls": [WASM_TYPE, RBAC_TYPE],
        },
    }


def envoyfilter_selects(doc: dict, proxy: IstioProxy) -> bool:
    ns = doc["metadata"]["namespace"]
    if ns not in (proxy.namespace, ISTIO_ROOT_NAMESPACE):
        return False
    return labels_match(doc["spec"].get("workloadSelector", {}).get("labels"), proxy.labels)


def check_envoyfilter(doc: dict) -> None:
    """The values the translation handles, in every patch (applied or not)."""
    for i, cp in enumerate(doc["spec"]["configPatches"]):
        where = f"EnvoyFilter {doc['metadata']['name']} configPatches[{i}]"
        if cp.get("applyTo") != "HTTP_FILTER":
            raise Unhandled(f"{where}: applyTo {cp.get('applyTo')} (only HTTP_FILTER is translated)")
        match, patch = cp.get("match", {}), cp["patch"]
        if patch.get("operation") not in ("INSERT_AFTER", "INSERT_BEFORE"):
            raise Unhandled(f"{where}: operation {patch.get('operation')}")
        if match.get("context", "ANY") not in ("ANY", "GATEWAY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND"):
            raise Unhandled(f"{where}: context {match['context']}")
        if match.get("listener", {}).get("name") is not None:
            raise Unhandled(f"{where}: listener.name (Istio's listener names are not modelled)")
        value = patch.get("value")
        if not isinstance(value, dict) or set(value) != {"name", "typed_config"} or "@type" not in value["typed_config"]:
            raise Unhandled(f"{where}: patch.value must be an HTTP filter with a name and a typed_config")


def apply_envoy_filters(filters: list[dict], docs: list[dict], proxy: IstioProxy) -> tuple[list[dict], list[str]]:
    """EnvoyFilter HTTP_FILTER patches on the proxy's HTTP connection manager
    (networking/core/envoyfilter/listener_patch.go): EnvoyFilters ordered by
    priority, root namespace first, then creation; their patches in order; a patch
    applies when its context, proxyVersion regex (matched against the
    proxy's Istio version) and listener match hold. INSERT_AFTER and
    INSERT_BEFORE with a subFilter insert next to the first filter of exactly
    that name, and do nothing if there is none; without a subFilter they
    append (INSERT_AFTER) or prepend. Returns the chain and the patches that
    changed it ("<EnvoyFilter name>#<index>")."""
    out = list(filters)
    applied = []
    # PushContext.EnvoyFilters: by priority, root namespace first, then
    # creation time (here: the order of the documents, as kubectl applies them).
    selected = [(i, d) for i, d in enumerate(docs) if envoyfilter_selects(d, proxy)]
    efs = [d for _, d in sorted(selected, key=lambda t: (t[1]["spec"].get("priority", 0), t[1]["metadata"]["namespace"] != ISTIO_ROOT_NAMESPACE, t[0]))]
    for doc in docs:
        check_envoyfilter(doc)
    for doc in efs:
        for i, cp in enumerate(doc["spec"]["configPatches"]):
            match, patch = cp.get("match", {}), cp["patch"]
            op = patch["operation"]
            if match.get("context", "ANY") not in ("ANY", proxy.context):
                continue
            regex = match.get("proxy", {}).get("proxyVersion")
            if regex is not None and not re.search(regex, proxy.version):
                continue
            listener = match.get("listener", {})
            if listener.get("portNumber") not in (None, proxy.port):
                continue
            flt = listener.get("filterChain", {}).get("filter", {})
            if flt.get("name") not in (None, HCM_NAME):
                continue
            anchor = flt.get("subFilter", {}).get("name")
            value = copy.deepcopy(patch["value"])
            if anchor is None:
                out = out + [value] if op == "INSERT_AFTER" else [value] + out
                applied.append(f"{doc['metadata']['name']}#{i}")
                continue
            for j, existing in enumerate(out):
                if existing["name"] == anchor:
                    out.insert(j + 1 if op == "INSERT_AFTER" else j, value)
                    applied.append(f"{doc['metadata']['name']}#{i}")
                    break
    return out, applied


def istio_gateway_routes(docs: list[dict], proxy: IstioProxy) -> tuple[dict, dict[str, str]]:
    """The gateway's route configuration for its HTTP server port
    (route/route.go BuildHTTPRoutesForVirtualService, TranslateRoute,
    TranslateRouteMatch): one virtual host per VirtualService host, routes in
    order, one per http[] entry and match, named http.name, plus "." and the
    match's name if it has one; uri exact -> path, prefix -> prefix (not
    path-separated for VirtualServices), method -> :method header; each
    destination -> outbound|port||host. Returns (route_config, clusters:
    {cluster name: destination host})."""
    gateways = [g for g in of_kind(docs, "Gateway") if labels_match(g["spec"]["selector"], proxy.labels) and g["metadata"]["namespace"] == proxy.namespace]
    names = set()
    hosts_on_port = []
    for g in gateways:
        for server in g["spec"]["servers"]:
            if server["port"]["number"] != proxy.port:
                continue
            if server["port"].get("protocol") != "HTTP":
                raise Unhandled(f"Gateway {g['metadata']['name']}: protocol {server['port'].get('protocol')} (only HTTP is translated)")
            names.add(f"{g['metadata']['namespace']}/{g['metadata']['name']}")
            hosts_on_port += [h.split("/")[-1] for h in server["hosts"]]
    vhosts = []
    clusters: dict[str, str] = {}
    for vs in of_kind(docs, "VirtualService"):
        ns = vs["metadata"]["namespace"]
        refs = {g if "/" in g else f"{ns}/{g}" for g in vs["spec"].get("gateways", [])}
        if not refs & names:
            continue
        routes = []
        for http in vs["spec"]["http"]:
            for m in http.get("match") or [None]:
                name = http.get("name", "")
                if m is not None and m.get("name"):
                    name = f"{name}.{m['name']}"
                match: dict = {"prefix": "/", "case_sensitive": True}
                if m is not None:
                    uri = m.get("uri", {})
                    if "exact" in uri:
                        match = {"path": uri["exact"], "case_sensitive": True}
                    elif "prefix" in uri:
                        match = {"prefix": uri["prefix"], "case_sensitive": True}
                    if "method" in m:
                        match["headers"] = [{"name": ":method", "string_match": {"exact": m["method"]["exact"]}}]
                dests = http["route"]
                if len(dests) != 1:
                    raise Unhandled(f"VirtualService {vs['metadata']['name']}: {len(dests)} destinations (weights are not translated)")
                d = dests[0]["destination"]
                cluster = f"outbound|{d['port']['number']}||{d['host']}"
                clusters[cluster] = d["host"]
                routes.append({"name": name, "match": match, "route": {"cluster": cluster, "timeout": http.get("timeout", "0s")}})
            if not http.get("match"):
                break  # a catch-all: later entries can never match
        for host in vs["spec"]["hosts"]:
            if host not in hosts_on_port and "*" not in hosts_on_port:
                continue
            vhosts.append({"name": f"{host}:{proxy.port}", "domains": [host, f"{host}:*"], "routes": routes})
    return {"name": f"http.{proxy.port}", "virtual_hosts": vhosts}, clusters


def istio_sidecar_inbound_routes(proxy: IstioProxy) -> tuple[dict, dict[str, str]]:
    """A sidecar's inbound route configuration (httproute.go
    buildSidecarInboundHTTPRouteConfig): one route named "default" to the
    workload; VirtualServices do not apply."""
    cluster = f"inbound|{proxy.port}||"
    route = {"name": "default", "match": {"prefix": "/"}, "route": {"cluster": cluster, "timeout": "0s"}}
    return {"name": cluster, "virtual_hosts": [{"name": f"inbound|http|{proxy.port}", "domains": ["*"], "routes": [route]}]}, {cluster: "workload"}


class IstioControlPlane:
    """istiod (of `istiod_version`, by default the proxy's) + istio-agent for
    one proxy, from example documents.

    The listener (static in the bootstrap, as LDS would deliver it) holds an
    ECDS filter per selected WasmPlugin, in Istio's phase order, then the
    EnvoyFilter patches. `push()` plays a WasmPlugin change: it translates
    the current documents again and writes each plugin's ECDS resource to
    its file (temp file + rename, which Envoy watches)."""

    def __init__(self, docs: list[dict], proxy: IstioProxy, ecds_dir: Path, module: str | None = WASM, istiod_version: str | None = None) -> None:
        for d in docs:
            validate(d, ISTIO_SCHEMAS)
        self.docs = docs
        self.proxy = proxy
        self.istiod_version = istiod_version or proxy.version
        self.ecds_dir = Path(ecds_dir)
        self.module = module
        self.versions: dict[str, int] = {}
        self.plugins = self.translate_plugins()
        base = [ecds_http_filter(p.resource, str(self.ecds_path(p.resource))) for p in self.plugins]
        base += [
            {"name": "envoy.filters.http.grpc_stats", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig", "emit_filter_state": True, "stats_for_all_methods": False}},
            {"name": "envoy.filters.http.fault", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault"}},
            {"name": "envoy.filters.http.cors", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors"}},
            ROUTER,
        ]
        self.http_filters, self.applied_patches = apply_envoy_filters(base, of_kind(docs, "EnvoyFilter"), proxy)
        if proxy.kind == "gateway":
            self.route_config, self.clusters = istio_gateway_routes(docs, proxy)
        else:
            self.route_config, self.clusters = istio_sidecar_inbound_routes(proxy)
        mark(docs, "translated")

    def translate_plugins(self) -> list[IstioPlugin]:
        plugins = [istiod_wasm_plugin(d, self.istiod_version) for d in of_kind(self.docs, "WasmPlugin") if wasmplugin_selects(d, self.proxy)]
        # sortByPriority: by phase, then higher priority first; stable.
        return sorted(plugins, key=lambda p: (PHASE_ORDER[p.phase], -p.priority))

    @property
    def filter_names(self) -> list[str]:
        return [f["name"] for f in self.http_filters]

    def ecds_path(self, resource: str) -> Path:
        return self.ecds_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", resource) + ".json")

    def plugin(self, name: str) -> IstioPlugin:
        """The translated plugin of the WasmPlugin named `name`."""
        return next(p for p in self.plugins if p.source.endswith(f":{name}"))

    def doc(self, kind: str, name: str) -> dict:
        """A document, to edit before the next push()."""
        return next(d for d in of_kind(self.docs, kind) if d["metadata"]["name"] == name)

    @property
    def plugin_docs(self) -> list[dict]:
        """The WasmPlugins this proxy gets."""
        return [d for d in of_kind(self.docs, "WasmPlugin") if wasmplugin_selects(d, self.proxy)]

    def stat(self, name: str, counter: str) -> str:
        """The name of an ECDS counter of plugin `name` in Envoy's /stats."""
        return f"extension_config_discovery.http_filter.{self.plugin(name).resource}.{counter}"

    def push(self, *, numbers: str = "go", module: str | None | bool = True, raw_config: str | None = None) -> None:
        """Translate the documents again and publish every plugin's ECDS
        resource. numbers: how pluginConfig's numbers are printed;
        module=None: istio-agent cannot fetch the module; raw_config replaces
        the configuration string (as another control plane would send it)."""
        self.ecds_dir.mkdir(parents=True, exist_ok=True)
        for p in self.translate_plugins():
            doc = next(d for d in of_kind(self.docs, "WasmPlugin") if p.source == f"{d['_file']}:{d['metadata']['name']}")
            if numbers != "go" and "configuration" in p.wasm["config"]:
                p.wasm["config"]["configuration"]["value"] = struct_json(doc["spec"]["pluginConfig"], numbers)
            if raw_config is not None:
                p.wasm["config"]["configuration"]["value"] = raw_config
            typed = agent_rewrite(p, self.module if module is True else module)
            self.versions[p.resource] = self.versions.get(p.resource, 0) + 1
            response = {
                "version_info": str(self.versions[p.resource]),
                "resources": [{"@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig", "name": p.resource, "typed_config": typed}],
            }
            path = self.ecds_path(p.resource)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(response))
            os.rename(tmp, path)

    def bootstrap(self, upstream_port: int) -> dict:
        """An Envoy bootstrap: this proxy's listener, every route cluster
        pointed at `upstream_port` on loopback. Run push() first."""
        hcm = {
            "@type": HCM_TYPE,
            "stat_prefix": "outbound_0.0.0.0_8080" if self.proxy.kind == "gateway" else "inbound_0.0.0.0_8080",
            "route_config": self.route_config,
            "http_filters": self.http_filters,
        }
        return bootstrap([listener("istio", hcm)], [static_cluster(c, upstream_port) for c in self.clusters], node={"id": f"{'router' if self.proxy.kind == 'gateway' else 'sidecar'}~127.0.0.1~loopguard-e2e.{self.proxy.namespace}~{self.proxy.namespace}.svc.cluster.local", "cluster": "loopguard-e2e", "metadata": {"ISTIO_VERSION": self.proxy.version}})


# --- Envoy Gateway -------------------------------------------------------------

TARGET_REF = {"group": LEAF, "kind": LEAF, "name": LEAF}
PARENT_REF = {"group": LEAF, "kind": LEAF, "name": LEAF, "namespace": LEAF, "sectionName": LEAF}
HEADER_MATCH = {"type": LEAF, "name": LEAF, "value": LEAF}
EG_GATEWAY = {
    "gatewayClassName": LEAF,
    "infrastructure": {"parametersRef": {"group": LEAF, "kind": LEAF, "name": LEAF}},
    "listeners": [{"name": LEAF, "protocol": LEAF, "port": LEAF, "hostname": LEAF}],
}
HTTPROUTE = {
    "parentRefs": [PARENT_REF],
    "hostnames": [LEAF],
    "rules": [
        {
            "name": LEAF,
            "matches": [{"path": {"type": LEAF, "value": LEAF}, "headers": [HEADER_MATCH]}],
            "backendRefs": [{"group": LEAF, "kind": LEAF, "name": LEAF, "namespace": LEAF, "port": LEAF, "weight": LEAF}],
            "timeouts": {"request": LEAF},
        }
    ],
}
EEP = {
    "targetRefs": [TARGET_REF],
    "wasm": [
        {
            "name": LEAF,
            "rootID": LEAF,
            "code": {
                "type": LEAF,
                "http": {"url": LEAF, "sha256": LEAF},
                "image": {"url": LEAF, "sha256": LEAF, "pullSecretRef": {"group": LEAF, "kind": LEAF, "name": LEAF, "namespace": LEAF}},
                "pullPolicy": LEAF,
            },
            "config": ANY,
            "failOpen": LEAF,
            "env": {"hostKeys": [LEAF]},
        }
    ],
    "dynamicModule": [{"name": LEAF, "filterName": LEAF, "config": ANY}],
}
BTP = {"targetRefs": [TARGET_REF], "requestBuffer": {"limit": LEAF}}
ENVOYPROXY = {
    "filterOrder": [{"name": LEAF, "before": LEAF, "after": LEAF}],
    # The proxy's image only picks the Envoy binary (the tests run Envoy 1.40).
    "provider": {"type": LEAF, "kubernetes": {"envoyDeployment": {"container": {"image": LEAF}}}},
    "dynamicModules": [{"name": LEAF, "source": {"type": LEAF, "local": {"path": LEAF}}, "doNotClose": LEAF, "loadGlobally": LEAF}],
    "bootstrap": {"type": LEAF, "jsonPatches": [{"op": LEAF, "path": LEAF, "value": ANY}]},
}
CTP = {"targetRefs": [{**TARGET_REF, "sectionName": LEAF}], "connection": {"bufferLimit": LEAF}}
AIGATEWAYROUTE = {
    "parentRefs": [PARENT_REF],
    "hostnames": [LEAF],
    "rules": [
        {
            "name": LEAF,
            "matches": [{"headers": [HEADER_MATCH]}],
            "backendRefs": [{"name": LEAF, "namespace": LEAF, "weight": LEAF}],
            "timeouts": {"request": LEAF},
        }
    ],
}
EG_SCHEMAS = {
    "Gateway": (("gateway.networking.k8s.io/v1",), EG_GATEWAY),
    "HTTPRoute": (("gateway.networking.k8s.io/v1",), HTTPROUTE),
    "EnvoyExtensionPolicy": (("gateway.envoyproxy.io/v1alpha1",), EEP),
    "BackendTrafficPolicy": (("gateway.envoyproxy.io/v1alpha1",), BTP),
    "EnvoyProxy": (("gateway.envoyproxy.io/v1alpha1",), ENVOYPROXY),
    "ClientTrafficPolicy": (("gateway.envoyproxy.io/v1alpha1",), CTP),
    "AIGatewayRoute": (("aigateway.envoyproxy.io/v1beta1",), AIGATEWAYROUTE),
}

# newOrderedHTTPFilter (internal/xds/translator/httpfilters.go): the default
# order of the filter types; wasm filters 200 + their index.
EG_FILTER_ORDER = {
    "envoy.filters.http.custom_response": 0,
    "envoy.filters.http.health_check": 1,
    "envoy.filters.http.fault": 2,
    "envoy.filters.http.cors": 3,
    "envoy.filters.http.csrf": 4,
    "envoy.filters.http.header_mutation": 5,
    "envoy.filters.http.ext_authz": 6,
    "envoy.filters.http.api_key_auth": 7,
    "envoy.filters.http.basic_auth": 8,
    "envoy.filters.http.oauth2": 9,
    "envoy.filters.http.jwt_authn": 10,
    "envoy.filters.http.stateful_session": 11,
    "envoy.filters.http.buffer": 12,
    "envoy.filters.http.lua": 13,
    "envoy.filters.http.ext_proc": 100,
    "envoy.filters.http.wasm": 200,
    "envoy.filters.http.dynamic_modules": 250,
    "envoy.filters.http.geoip": 300,
    "envoy.filters.http.rbac": 301,
    "envoy.filters.http.local_ratelimit": 302,
    "envoy.filters.http.ratelimit": 303,
    "envoy.filters.http.bandwidth_limit": 304,
    "envoy.filters.http.grpc_web": 305,
    "envoy.filters.http.grpc_stats": 306,
    "envoy.filters.http.credential_injector": 307,
    "envoy.filters.http.compressor": 308,
    "envoy.filters.http.dynamic_forward_proxy": 309,
    "envoy.filters.http.router": 310,
}
AI_GATEWAY_EXT_PROC = "envoy.filters.http.ext_proc/aigateway"
EG_WASM_SERVICE = "http://envoy-gateway.envoy-gateway-system.svc.cluster.local:18002"
QUANTITY = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _order(name: str) -> int:
    for prefix, order in EG_FILTER_ORDER.items():
        if name.startswith(prefix):
            if prefix in ("envoy.filters.http.ext_proc", "envoy.filters.http.wasm", "envoy.filters.http.lua", "envoy.filters.http.dynamic_modules"):
                return order + int(name.rsplit("/", 1)[-1])
            return order
    return 50


def eg_sort_filters(filters: list[dict], filter_order: list[dict]) -> list[dict]:
    """sortHTTPFilters: the default order (then by name), then each
    EnvoyProxy filterOrder entry moves every filter whose name starts with
    `name` before the first filter of `before`, or after the last filter of
    `after` (keeping their order)."""
    out = sorted(filters, key=lambda f: (_order(f["name"]), f["name"]))
    for pos in filter_order:
        moving = [f for f in out if f["name"].startswith(pos["name"])]
        if not moving:
            continue
        rest = [f for f in out if all(f is not m for m in moving)]
        if "before" in pos:
            anchors = [i for i, f in enumerate(out) if f["name"].startswith(pos["before"])]
            if anchors:
                i = next(k for k, f in enumerate(rest) if f is out[anchors[0]])
                out = rest[:i] + moving + rest[i:]
        elif "after" in pos:
            anchors = [i for i, f in enumerate(out) if f["name"].startswith(pos["after"])]
            if anchors and all(out[anchors[-1]] is not m for m in moving):
                i = next(k for k, f in enumerate(rest) if f is out[anchors[-1]])
                out = rest[: i + 1] + moving + rest[i + 1 :]
        else:
            raise Unhandled(f"filterOrder entry {pos} has neither before nor after")
    return out


def ai_gateway_insert_ext_proc(filters: list[dict]) -> list[dict]:
    """Where the Envoy AI Gateway inserts its router-level ext_proc
    (internal/extensionserver/post_translate_modify.go,
    insertAIGatewayExtProcFilter): before the first ext_proc, wasm, lua,
    rbac, local_ratelimit, ratelimit, custom_response, credential_injector,
    compressor or router filter; but right after the last buffer filter if
    one sits at or after that point. A placeholder filter stands for it (the
    tests do not run the AI Gateway's external processor)."""
    prefixes = ("envoy.filters.http.ext_proc", "envoy.filters.http.wasm", "envoy.filters.http.lua", "envoy.filters.http.rbac",
                "envoy.filters.http.local_ratelimit", "envoy.filters.http.ratelimit", "envoy.filters.http.custom_response",
                "envoy.filters.http.credential_injector", "envoy.filters.http.compressor", "envoy.filters.http.router")
    index = next(i for i, f in enumerate(filters) if f["name"].startswith(prefixes))
    buffers = [i for i, f in enumerate(filters) if f["name"].startswith("envoy.filters.http.buffer")]
    if buffers and buffers[-1] >= index:
        index = buffers[-1] + 1
    return filters[:index] + [{"name": AI_GATEWAY_EXT_PROC, "placeholder": True}] + filters[index:]


def quantity_bytes(limit, what: str = "requestBuffer.limit") -> int:
    m = re.fullmatch(r"([1-9][0-9]*)([EPTGMK]i|[EPTGMk])?", str(limit))
    if not m or (m.group(2) or "") not in QUANTITY:
        raise Unhandled(f"{what} {limit!r}")
    return int(m.group(1)) * QUANTITY[m.group(2) or ""]


def aigatewayroute_to_httproute(doc: dict) -> dict:
    """The HTTPRoute the AI Gateway controller generates for an
    AIGatewayRoute (internal/controller/ai_gateway_route.go newHTTPRoute):
    same name and namespace, parentRefs and hostnames copied, each rule's
    header matches with a path prefix of the root prefix ("/"), the rule's
    timeouts (default request 60s), and a last rule "route-not-found" that
    answers 404. The host-rewrite HTTPRouteFilter each rule gets only sets
    the upstream Host and is not modelled."""
    spec = doc["spec"]
    rules = []
    for rule in spec["rules"]:
        rules.append({
            "name": rule.get("name"),
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}, "headers": m.get("headers", [])} for m in rule.get("matches", [])],
            "backendRefs": [{"name": b["name"]} for b in rule.get("backendRefs", [])],
            "timeouts": {"request": rule.get("timeouts", {}).get("request", "60s")},
        })
    rules.append({"name": "route-not-found", "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                  "_direct_response": {"status": 404, "body": {"inline_string": "No matching route found. It is likely because the model specified in your request is not configured in the Gateway."}}})
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": doc["metadata"]["name"], "namespace": doc["metadata"]["namespace"]},
        "spec": {"parentRefs": spec.get("parentRefs", []), "hostnames": spec.get("hostnames", []), "rules": rules},
        "_file": doc["_file"],
        "_generated_from": "AIGatewayRoute",
    }


# The parts of Envoy Gateway's default bootstrap (internal/xds/bootstrap/
# bootstrap.yaml.tpl, 1.9) that the tests' Envoy keeps: its stats tags (none
# for loopguard's stats) and its runtime layer. An EnvoyProxy's bootstrap
# JSONPatch applies to them; a patch elsewhere raises Unhandled (admin, xDS
# and the stats listener are the tests' own).
EG_BOOTSTRAP = {
    "stats_config": {
        "use_all_default_tags": True,
        "stats_tags": [
            {"regex": "\\.zone(\\.(([^\\.]+)\\.))", "tag_name": "from_zone"},
            {"regex": "\\.zone\\.[^\\.]+\\.(([^\\.]+)\\.)", "tag_name": "to_zone"},
            {"regex": "^cluster(\\..+\\.(.+))\\.total_match_count$", "tag_name": "socket_match_name"},
            {"regex": "circuit_breakers\\.((.+?)\\.).+", "tag_name": "priority"},
        ],
    },
    "layered_runtime": {
        "layers": [
            {"name": "global_config", "static_layer": {"re2.max_program_size.error_level": 4294967295, "re2.max_program_size.warn_level": 1000}},
        ]
    },
}


def eg_bootstrap(eg_minor: int) -> dict:
    """EG_BOOTSTRAP as Envoy Gateway `eg_minor` renders it (up to 1.8 its
    runtime layer also sets use_eds_cache_for_ads)."""
    b = copy.deepcopy(EG_BOOTSTRAP)
    if eg_minor < 9:
        layer = b["layered_runtime"]["layers"][0]["static_layer"]
        b["layered_runtime"]["layers"][0]["static_layer"] = {"envoy.restart_features.use_eds_cache_for_ads": True, **layer}
    return b


# xds/translator/listener.go tcpListenerPerConnectionBufferLimitBytes: the
# listener's buffer unless a ClientTrafficPolicy sets connection.bufferLimit.
EG_LISTENER_BUFFER_LIMIT = 32768


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise Unhandled(f"bootstrap JSONPatch path {path!r} is not a JSON pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def json_patch(doc: dict, patches: list[dict]) -> dict:
    """RFC 6902 add, replace and remove (internal/utils/jsonpatch, which
    Envoy Gateway applies to its bootstrap as JSON)."""
    doc = copy.deepcopy(doc)
    for p in patches:
        op, tokens = p["op"], _pointer(p["path"])
        if op not in ("add", "replace", "remove"):
            raise Unhandled(f"bootstrap JSONPatch op {op}")
        if tokens[0] not in EG_BOOTSTRAP:
            raise Unhandled(f"bootstrap JSONPatch path {p['path']}: the translation models only {sorted(EG_BOOTSTRAP)} of Envoy Gateway's bootstrap")
        parent = doc
        for t in tokens[:-1]:
            try:
                parent = parent[int(t)] if isinstance(parent, list) else parent[t]
            except (KeyError, IndexError, ValueError):
                raise Unhandled(f"bootstrap JSONPatch path {p['path']}: {t} does not exist (Envoy Gateway refuses the patch)")
        last = tokens[-1]
        if isinstance(parent, list):
            i = len(parent) if last == "-" and op == "add" else int(last)
            if op == "add":
                parent.insert(i, copy.deepcopy(p["value"]))
            elif op == "replace":
                parent[i] = copy.deepcopy(p["value"])
            else:
                del parent[i]
        else:
            if op != "add" and last not in parent:
                raise Unhandled(f"bootstrap JSONPatch {op} {p['path']}: no such member")
            if op == "remove":
                del parent[last]
            else:
                parent[last] = copy.deepcopy(p["value"])
    return doc


@dataclass
class EgDynamicModule:
    filter_name: str  # the HCM filter's name
    ir_name: str
    policy: str  # <ns>/<policy name>
    module: str  # the allowlist entry's name
    declared_path: str  # source.local.path in the EnvoyProxy
    filter: dict


@dataclass
class EgWasm:
    filter_name: str
    ir_name: str
    policy: str
    code_type: str
    original_url: str
    declared_sha256: str | None
    filter: dict


@dataclass
class EnvoyGatewayConfig:
    http_filters: list[dict]
    routes: list[dict]  # Envoy routes, in the order of their virtual hosts
    virtual_hosts: list[dict]
    clusters: list[str]
    wasms: list[EgWasm]
    unresolved_targets: list[str] = field(default_factory=list)
    ai_gateway: bool = False
    dynamic_modules: list[EgDynamicModule] = field(default_factory=list)
    # EnvoyExtensionPolicy -> why Envoy Gateway refused it (its routes answer 500).
    refused_policies: dict[str, str] = field(default_factory=dict)
    buffer_limit: int = EG_LISTENER_BUFFER_LIMIT  # the listener's per_connection_buffer_limit_bytes
    bootstrap_base: dict = field(default_factory=lambda: copy.deepcopy(EG_BOOTSTRAP))  # after the EnvoyProxy's JSONPatch
    envoy_image: str | None = None  # the EnvoyProxy's container image, if it sets one

    @property
    def filter_names(self) -> list[str]:
        return [f["name"] for f in self.http_filters]

    def route(self, name_prefix: str) -> dict:
        return next(r for r in self.routes if r["name"].startswith(name_prefix))

    def bootstrap(self, upstream_port: int, module_server_port: int | None = None) -> dict:
        """The gateway's listener (placeholders dropped: the AI Gateway's
        ext_proc is not run) with its per-connection buffer limit, every
        backend cluster pointed at `upstream_port`, and wasm_cluster (Envoy
        Gateway's module server) at `module_server_port` (needed only with
        Wasm modules), all on loopback; Envoy Gateway's stats_config and
        layered_runtime, as the EnvoyProxy's bootstrap patch left them."""
        hcm = {
            "@type": HCM_TYPE,
            "stat_prefix": "http-10080",
            "route_config": {"name": "agents/agents-gateway/http", "virtual_hosts": self.virtual_hosts},
            "http_filters": [f for f in self.http_filters if not f.get("placeholder")],
        }
        clusters = [static_cluster(c, upstream_port) for c in self.clusters]
        if module_server_port is not None:
            clusters.append(static_cluster("wasm_cluster", module_server_port))
        elif self.wasms:
            raise ValueError("Wasm modules are fetched from Envoy Gateway's module server: give module_server_port")
        lst = listener("envoy-gateway", hcm)
        lst["per_connection_buffer_limit_bytes"] = self.buffer_limit
        return {**bootstrap([lst], clusters), **copy.deepcopy(self.bootstrap_base)}


def envoy_gateway_config(docs: list[dict], *, module_sha256: str | None = None, eg_minor: int = 9, native_module: str = NATIVE) -> EnvoyGatewayConfig:
    """What Envoy Gateway (with the AI Gateway's extension server if an
    AIGatewayRoute is present) sends for the gateway's HTTP listener.

    - Routes (gatewayapi/route.go, xds/translator/route.go): per HTTPRoute,
      hostname, rule and match, named
      httproute/<ns>/<name>/rule/<i>/match/<j>/<host with dots as _>; Exact
      -> path, PathPrefix "/" -> prefix, other prefixes ->
      path_separated_prefix without a trailing "/", header matches exact;
      each rule's backends -> one cluster httproute/<ns>/<name>/rule/<i>;
      rule names in the route's envoy-gateway metadata; timeouts.request
      -> the route timeout. Virtual host per hostname.
    - EnvoyExtensionPolicy wasm[i] (gatewayapi/envoyextensionpolicy.go,
      xds/translator/wasm.go): one HCM filter
      envoy.filters.http.wasm/envoyextensionpolicy/<ns>/<policy>/wasm/<i>,
      disabled, enabled on each route of the targeted HTTPRoutes (or every
      route of a targeted Gateway) by an empty FilterConfig; PluginConfig
      name = wasm.name (or the generated name), vm_id = the generated name,
      root_id = rootID, code = remote from Envoy Gateway's module server
      (wasm_cluster, timeout 10s) with the module's sha256 (for Image
      sources not the manifest digest the policy carries), config as JSON
      in a StringValue, fail_open = failOpen, env.hostKeys -> host_env_keys.
      Envoy Gateway 1.9 adds a retry policy to the fetch (10 retries, 1-30 s
      backoff).
    - BackendTrafficPolicy requestBuffer (xds/translator/request_buffer.go):
      one HCM filter envoy.filters.http.buffer, disabled, and
      BufferPerRoute{max_request_bytes} on each targeted route.
    - EnvoyExtensionPolicy dynamicModule[i] (gatewayapi/envoyextensionpolicy.go
      buildDynamicModules, xds/translator/dynamicmodule.go; Envoy Gateway
      1.8+): the module is looked up by name in the EnvoyProxy's
      dynamicModules allowlist (a name it lacks: the policy is refused and
      its routes answer 500); one HCM filter
      envoy.filters.http.dynamic_modules/envoyextensionpolicy/<ns>/<policy>/dynamic-module/<i>,
      disabled, enabled per route like wasm; DynamicModuleFilter with
      dynamic_module_config {module: {local: {filename: source.local.path}},
      do_not_close, load_globally} (no metrics_namespace: the stats are
      dynamicmodulescustom.<filter_name>.*), filter_name = filterName,
      filter_config = config as JSON in a StringValue. A path to
      libloopguard_native.so becomes `native_module` (the built module).
    - EnvoyProxy (the Gateway's infrastructure.parametersRef): filterOrder;
      bootstrap JSONPatch applied to Envoy Gateway's default bootstrap
      (bootstrap/util.go jsonPatchBootstrap; EG_BOOTSTRAP); provider's
      container image recorded (it picks the Envoy binary).
    - ClientTrafficPolicy connection.bufferLimit (gatewayapi/
      clienttrafficpolicy.go, xds/translator/listener.go): the listener's
      per_connection_buffer_limit_bytes, 32768 without one.
    - AIGatewayRoute: its generated HTTPRoute, and the AI Gateway's ext_proc
      inserted into the sorted chain.
    """
    for d in docs:
        validate(d, EG_SCHEMAS)
    gateways = of_kind(docs, "Gateway")
    if len(gateways) != 1:
        raise Unhandled(f"expected one Gateway, got {len(gateways)}")
    gw = gateways[0]
    gw_ns, gw_name = gw["metadata"]["namespace"], gw["metadata"]["name"]
    for lst in gw["spec"]["listeners"]:
        if lst["protocol"] != "HTTP":
            raise Unhandled(f"Gateway listener {lst['name']}: protocol {lst['protocol']} (only HTTP is translated)")
        if lst.get("hostname"):
            raise Unhandled(f"Gateway listener {lst['name']}: hostname (not translated)")
    if len(gw["spec"]["listeners"]) != 1:
        raise Unhandled("only a Gateway with one listener is translated")
    listener_name = gw["spec"]["listeners"][0]["name"]

    filter_order: list[dict] = []
    registry: dict[str, dict] = {}  # the EnvoyProxy's dynamicModules allowlist
    bootstrap_base = eg_bootstrap(eg_minor)
    envoy_image = None
    params = gw["spec"].get("infrastructure", {}).get("parametersRef")
    if params is not None:
        if (params.get("group"), params.get("kind")) != ("gateway.envoyproxy.io", "EnvoyProxy"):
            raise Unhandled(f"Gateway parametersRef {params}")
        eps = [e for e in of_kind(docs, "EnvoyProxy") if e["metadata"]["name"] == params["name"] and e["metadata"]["namespace"] == gw_ns]
        if not eps:
            raise Unhandled(f"Gateway {gw_name} refers to EnvoyProxy {params['name']}, which is not in the documents")
        if len(eps) > 1:
            raise Unhandled(f"EnvoyProxy {params['name']} is given twice ({', '.join(e['_file'] for e in eps)}): applying one replaces the other")
        ep_spec = eps[0]["spec"]
        filter_order = ep_spec.get("filterOrder", [])
        provider = ep_spec.get("provider")
        if provider is not None:
            if provider.get("type") != "Kubernetes":
                raise Unhandled(f"EnvoyProxy provider type {provider.get('type')}")
            envoy_image = provider.get("kubernetes", {}).get("envoyDeployment", {}).get("container", {}).get("image")
        for m in ep_spec.get("dynamicModules", []):
            if eg_minor < 8:
                raise Unhandled("EnvoyProxy dynamicModules needs Envoy Gateway 1.8 or later")
            if m["source"].get("type", "Local") != "Local" or "local" not in m["source"]:
                raise Unhandled(f"EnvoyProxy dynamicModules {m['name']}: only a Local source is translated")
            registry[m["name"]] = m
        if "bootstrap" in ep_spec:
            if ep_spec["bootstrap"].get("type") != "JSONPatch":
                raise Unhandled(f"EnvoyProxy bootstrap type {ep_spec['bootstrap'].get('type')} (only JSONPatch is translated)")
            bootstrap_base = json_patch(bootstrap_base, ep_spec["bootstrap"].get("jsonPatches", []))
        for pos in filter_order:
            for key in ("name", "before", "after"):
                if key in pos and pos[key] not in EG_FILTER_ORDER:
                    raise Unhandled(f"filterOrder {key} {pos[key]} is not a filter type Envoy Gateway knows")
            if eg_minor < 6 and "envoy.filters.http.buffer" in pos.values():
                raise Unhandled("filterOrder accepts the buffer filter from Envoy Gateway 1.6 on")

    httproutes = of_kind(docs, "HTTPRoute") + [aigatewayroute_to_httproute(d) for d in of_kind(docs, "AIGatewayRoute")]
    ai_gateway = bool(of_kind(docs, "AIGatewayRoute"))

    def attached(route: dict) -> bool:
        for ref in route["spec"].get("parentRefs", []):
            if ref.get("kind", "Gateway") != "Gateway" or ref.get("group", "gateway.networking.k8s.io") != "gateway.networking.k8s.io":
                raise Unhandled(f"HTTPRoute {route['metadata']['name']}: parentRef {ref}")
            if ref["name"] == gw_name and ref.get("namespace", route["metadata"]["namespace"]) == gw_ns and ref.get("sectionName", listener_name) == listener_name:
                return True
        return False

    httproutes = [r for r in httproutes if attached(r)]
    names = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in httproutes}

    def targets(policy: dict) -> tuple[set, list[str]]:
        ns = policy["metadata"]["namespace"]
        hit, missing = set(), []
        for ref in policy["spec"].get("targetRefs", []):
            if ref.get("group") != "gateway.networking.k8s.io" or ref.get("kind") not in ("HTTPRoute", "Gateway"):
                raise Unhandled(f"{policy['kind']} {policy['metadata']['name']}: targetRef {ref}")
            if ref["kind"] == "Gateway":
                if ref["name"] == gw_name and ns == gw_ns:
                    hit |= names
                else:
                    missing.append(f"Gateway/{ref['name']}")
            elif (ns, ref["name"]) in names:
                hit.add((ns, ref["name"]))
            else:
                missing.append(f"HTTPRoute/{ref['name']}")  # ignored, as Envoy Gateway does (status: target not found)
        return hit, missing

    unresolved: list[str] = []
    http_filters: list[dict] = []
    per_route: dict[tuple, dict] = {}  # (ns, route name) -> typed_per_filter_config
    wasms: list[EgWasm] = []
    dynamic_modules: list[EgDynamicModule] = []
    refused: dict[str, str] = {}
    failed_routes: set = set()
    for policy in of_kind(docs, "EnvoyExtensionPolicy"):
        ns, pname = policy["metadata"]["namespace"], policy["metadata"]["name"]
        hit, missing = targets(policy)
        unresolved += [f"EnvoyExtensionPolicy/{pname} -> {m}" for m in missing]
        if not hit:
            continue
        if policy["spec"].get("dynamicModule") and eg_minor < 8:
            raise Unhandled("EnvoyExtensionPolicy dynamicModule needs Envoy Gateway 1.8 or later")
        missing_modules = [dm["name"] for dm in policy["spec"].get("dynamicModule", []) if dm["name"] not in registry]
        if missing_modules:
            # An error in a dynamic module fails the policy: its routes
            # answer 500, none of its extensions is added.
            refused[f"{ns}/{pname}"] = f"dynamic module {missing_modules[0]!r} is not registered in the EnvoyProxy dynamicModules allowlist"
            failed_routes |= hit
            continue
        for idx, w in enumerate(policy["spec"].get("wasm", [])):
            ir_name = f"envoyextensionpolicy/{ns}/{pname}/wasm/{idx}"
            code = w["code"]
            ctype = code["type"]
            if module_sha256 is None:
                raise ValueError("a Wasm module needs module_sha256")
            if ctype == "HTTP":
                src = code["http"]
                original = src["url"]
                if not original.startswith(("http://", "https://")):
                    raise Unhandled(f"EnvoyExtensionPolicy {pname} wasm[{idx}]: http.url {original}")
            elif ctype == "Image":
                src = code["image"]
                original = src["url"] if src["url"].startswith("oci://") else f"oci://{src['url']}"
                if "@" not in original and ":" not in original[len("oci://"):].rsplit("/", 1)[-1]:
                    original += ":latest"
            else:
                raise Unhandled(f"EnvoyExtensionPolicy {pname} wasm[{idx}]: code type {ctype}")
            if src.get("sha256") is not None and not is_sha256_hex(src["sha256"]):
                raise Unhandled(f"EnvoyExtensionPolicy {pname} wasm[{idx}]: sha256 must be 64 lower-case hex characters, got {src['sha256']!r}")
            if code.get("pullPolicy") not in (None, "IfNotPresent", "Always"):
                raise Unhandled(f"EnvoyExtensionPolicy {pname} wasm[{idx}]: pullPolicy {code['pullPolicy']}")
            serving = f"{EG_WASM_SERVICE}/{base64.urlsafe_b64encode(hashlib.sha256(original.encode()).digest()).decode()}.wasm"
            remote: dict = {"http_uri": {"uri": serving, "cluster": "wasm_cluster", "timeout": "10s"}, "sha256": module_sha256}
            if eg_minor >= 9:
                remote["retry_policy"] = {"num_retries": 10, "retry_back_off": {"base_interval": "1s", "max_interval": "30s"}}
            vm: dict = {"vm_id": ir_name, "runtime": "envoy.wasm.runtime.v8", "code": {"remote": remote}}
            if w.get("env", {}).get("hostKeys"):
                vm["environment_variables"] = {"host_env_keys": w["env"]["hostKeys"]}
            cfg: dict = {
                "name": w.get("name", ir_name),
                "vm_config": vm,
                "configuration": {"@type": STRING_VALUE, "value": k8s_json(w["config"]) if "config" in w else ""},
                "fail_open": bool(w.get("failOpen", False)),
            }
            if "rootID" in w:
                cfg["root_id"] = w["rootID"]
            fname = f"envoy.filters.http.wasm/{ir_name}"
            flt = {"name": fname, "disabled": True, "typed_config": {"@type": WASM_TYPE, "config": cfg}}
            http_filters.append(flt)
            wasms.append(EgWasm(fname, ir_name, f"{ns}/{pname}", ctype, original, src.get("sha256"), flt))
            for key in hit:
                per_route.setdefault(key, {})[fname] = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}
        for idx, dm in enumerate(policy["spec"].get("dynamicModule", [])):
            ir_name = f"envoyextensionpolicy/{ns}/{pname}/dynamic-module/{idx}"
            entry = registry[dm["name"]]
            declared = entry["source"]["local"]["path"]
            module_config: dict = {"module": {"local": {"filename": native_module if Path(declared).name == "libloopguard_native.so" else declared}}}
            if entry.get("doNotClose"):
                module_config["do_not_close"] = True
            if entry.get("loadGlobally"):
                module_config["load_globally"] = True
            typed: dict = {"@type": DYNAMIC_MODULE_TYPE, "dynamic_module_config": module_config}
            if dm.get("filterName"):
                typed["filter_name"] = dm["filterName"]
            if "config" in dm:
                typed["filter_config"] = {"@type": STRING_VALUE, "value": k8s_json(dm["config"])}
            fname = f"envoy.filters.http.dynamic_modules/{ir_name}"
            flt = {"name": fname, "disabled": True, "typed_config": typed}
            http_filters.append(flt)
            dynamic_modules.append(EgDynamicModule(fname, ir_name, f"{ns}/{pname}", dm["name"], declared, flt))
            for key in hit:
                per_route.setdefault(key, {})[fname] = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}

    buffer_limit = EG_LISTENER_BUFFER_LIMIT
    ctps = []
    for policy in of_kind(docs, "ClientTrafficPolicy"):
        for ref in policy["spec"].get("targetRefs", []):
            if ref.get("group") != "gateway.networking.k8s.io" or ref.get("kind") != "Gateway":
                raise Unhandled(f"ClientTrafficPolicy {policy['metadata']['name']}: targetRef {ref}")
            if ref["name"] == gw_name and policy["metadata"]["namespace"] == gw_ns and ref.get("sectionName", listener_name) == listener_name:
                ctps.append(policy)
            else:
                unresolved.append(f"ClientTrafficPolicy/{policy['metadata']['name']} -> Gateway/{ref['name']}")
    if len(ctps) > 1:
        raise Unhandled("more than one ClientTrafficPolicy applies to the listener (Envoy Gateway keeps the oldest)")
    for policy in ctps:
        limit = policy["spec"].get("connection", {}).get("bufferLimit")
        if limit is not None:
            buffer_limit = quantity_bytes(limit, "connection.bufferLimit")
            if buffer_limit > 2**32 - 1:
                raise Unhandled(f"connection.bufferLimit {limit} is above 4294967295 (Envoy Gateway refuses it)")

    buffered = False
    for policy in of_kind(docs, "BackendTrafficPolicy"):
        hit, missing = targets(policy)
        unresolved += [f"BackendTrafficPolicy/{policy['metadata']['name']} -> {m}" for m in missing]
        limit = policy["spec"].get("requestBuffer", {}).get("limit")
        if limit is None or not hit:
            continue
        if eg_minor < 4:
            raise Unhandled("requestBuffer needs Envoy Gateway 1.4 or later")
        max_bytes = quantity_bytes(limit)
        if not buffered:
            http_filters.append({"name": "envoy.filters.http.buffer", "disabled": True, "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "max_request_bytes": max_bytes}})
            buffered = True
        for key in hit:
            per_route.setdefault(key, {})["envoy.filters.http.buffer"] = {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.BufferPerRoute", "buffer": {"max_request_bytes": max_bytes}}

    http_filters.append(ROUTER)
    http_filters = eg_sort_filters(http_filters, filter_order)
    if ai_gateway:
        http_filters = ai_gateway_insert_ext_proc(http_filters)

    vhosts: dict[str, dict] = {}
    clusters: list[str] = []
    all_routes: list[dict] = []
    for r in httproutes:
        ns, name = r["metadata"]["namespace"], r["metadata"]["name"]
        prefix = f"httproute/{ns}/{name}/"
        for host in r["spec"].get("hostnames") or ["*"]:
            vh = vhosts.setdefault(host, {"name": f"{gw_ns}/{gw_name}/{listener_name}/{host.replace('.', '_')}", "domains": [host], "routes": []})
            for i, rule in enumerate(r["spec"]["rules"]):
                cluster = f"{prefix}rule/{i}"
                if "_direct_response" not in rule:
                    if not rule.get("backendRefs"):
                        raise Unhandled(f"HTTPRoute {name} rule {i}: no backendRefs")
                    for b in rule["backendRefs"]:
                        if b.get("kind", "Service") not in ("Service", "Backend") or "weight" in b and len(rule["backendRefs"]) > 1:
                            raise Unhandled(f"HTTPRoute {name} rule {i}: backendRef {b}")
                    if cluster not in clusters:
                        clusters.append(cluster)
                for j, m in enumerate(rule.get("matches") or [{"path": {"type": "PathPrefix", "value": "/"}}]):
                    path = m.get("path", {"type": "PathPrefix", "value": "/"})
                    ptype, value = path.get("type", "PathPrefix"), path.get("value", "/")
                    if ptype == "Exact":
                        match: dict = {"path": value}
                    elif ptype == "PathPrefix":
                        match = {"prefix": "/"} if value == "/" else {"path_separated_prefix": value.rstrip("/")}
                    else:
                        raise Unhandled(f"HTTPRoute {name}: path type {ptype}")
                    headers = []
                    for h in m.get("headers", []):
                        if h.get("type", "Exact") != "Exact":
                            raise Unhandled(f"HTTPRoute {name}: header match type {h['type']}")
                        headers.append({"name": h["name"], "string_match": {"exact": h["value"]}})
                    if headers:
                        match["headers"] = headers
                    resource = {"kind": "HTTPRoute", "name": name, "namespace": ns}
                    if rule.get("name"):
                        resource["sectionName"] = rule["name"]
                    route: dict = {
                        "name": f"{prefix}rule/{i}/match/{j}/{host.replace('.', '_')}",
                        "match": match,
                        "metadata": {"filter_metadata": {"envoy-gateway": {"resources": [resource]}}},
                    }
                    if (ns, name) in failed_routes:
                        route["direct_response"] = {"status": 500}
                    elif "_direct_response" in rule:
                        route["direct_response"] = rule["_direct_response"]
                    else:
                        action: dict = {"cluster": cluster}
                        if rule.get("timeouts", {}).get("request"):
                            action["timeout"] = rule["timeouts"]["request"]
                        route["route"] = action
                    if per_route.get((ns, name)):
                        route["typed_per_filter_config"] = copy.deepcopy(per_route[(ns, name)])
                    vh["routes"].append((_precedence(match), len(vh["routes"]), route))
                    all_routes.append(route)
    virtual_hosts = []
    for vh in vhosts.values():
        vh["routes"] = [r for _, _, r in sorted(vh["routes"], key=lambda t: (t[0], t[1]))]
        virtual_hosts.append(vh)
    mark(docs, "translated")
    return EnvoyGatewayConfig(http_filters, all_routes, virtual_hosts, clusters, wasms, unresolved, ai_gateway,
                              dynamic_modules, refused, buffer_limit, bootstrap_base, envoy_image)


def _precedence(match: dict) -> tuple:
    """Gateway API route precedence within a host: exact paths, then longer
    prefixes, then more header matches."""
    if "path" in match:
        return (0, -len(match["path"]), -len(match.get("headers", [])))
    prefix = match.get("path_separated_prefix", match.get("prefix", "/"))
    return (1, -len(prefix), -len(match.get("headers", [])))


class ModuleServer:
    """Envoy Gateway's module server stand-in: serves `data` at any path on
    loopback and records the paths downloaded."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.requests: list[str] = []
        self.upstream = Upstream(self.respond, methods=("GET",))
        self.port = self.upstream.port

    def respond(self, request: dict) -> Answer:
        self.requests.append(request["path"])
        return Answer(200, self.data, {"content-type": "application/wasm"})

    def stop(self) -> None:
        self.upstream.stop()


# --- Envoy bootstrap -----------------------------------------------------------


def listener(name: str, hcm: dict) -> dict:
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
        "filter_chains": [{"filters": [{"name": HCM_NAME, "typed_config": hcm}]}],
    }


def static_cluster(name: str, port: int) -> dict:
    return {
        "name": name,
        "connect_timeout": "1s",
        "type": "STATIC",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}],
        },
    }


def bootstrap(listeners: list[dict], clusters: list[dict], node: dict | None = None) -> dict:
    return {
        "node": node or {"id": "loopguard-e2e", "cluster": "loopguard-e2e"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }
