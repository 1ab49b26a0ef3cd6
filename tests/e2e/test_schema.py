"""schema/loopguard.schema.json (generated from the configuration types):
every shipped configuration follows it, and what it refuses the filter
refuses too."""

import json
import subprocess

import jsonschema
import pytest
import yaml

from harness import CLI, ROOT

SCHEMA = json.loads((ROOT / "schema" / "loopguard.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"


def shipped_configs() -> list[tuple[str, dict]]:
    """Every loopguard configuration in the repository's configs and
    examples: (where, the configuration as the filter gets it)."""
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            if node.get("@type") == WASM_TYPE and "configuration" in node.get("config", {}):
                value = node["config"]["configuration"].get("value", "")
                if '"policies"' in value:
                    found.append((where, json.loads(value)))
            for v in node.values():
                walk(v, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    for path in [ROOT / "envoy" / "envoy.yaml", *sorted(ROOT.glob("examples/**/envoy.yaml"))]:
        walk(yaml.safe_load(path.read_text()), str(path.relative_to(ROOT)))
    for path in sorted(ROOT.glob("examples/istio/*.yaml")) + sorted(ROOT.glob("examples/envoy-gateway/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc.get("kind") == "WasmPlugin":
                found.append((f"{path.relative_to(ROOT)} {doc['metadata']['name']}", doc["spec"]["pluginConfig"]))
            for w in doc.get("spec", {}).get("wasm", []) if doc.get("kind") == "EnvoyExtensionPolicy" else []:
                found.append((f"{path.relative_to(ROOT)} {w['name']}", w["config"]))
    return found


CONFIGS = shipped_configs()


def test_every_shipped_configuration_was_found():
    assert len(CONFIGS) >= 15
    assert all(c.get("$schema", "").endswith("/schema/loopguard.schema.json") for _, c in CONFIGS), "every example references the schema"


@pytest.mark.parametrize("where,config", CONFIGS, ids=[w for w, _ in CONFIGS])
def test_shipped_configuration_follows_the_schema(where, config):
    errors = [e.message for e in VALIDATOR.iter_errors(config)]
    assert errors == [], where


BAD = {
    "unknown field": {"policies": [{"id": "p", "spec": {"selector": {}, "loop_detecton": {}}}]},
    "wrong enum": {"policies": [{"id": "p", "spec": {"selector": {}, "mode": "audit", "tool_loops": {"enabled": True}}}]},
    "out of range": {"max_body_bytes": 0, "policies": [{"id": "p", "spec": {"selector": {}, "tool_loops": {"enabled": True}}}]},
    "fraction": {"policies": [{"id": "p", "spec": {"selector": {}, "loop_detection": {"enabled": True, "window_seconds": 1.5, "threshold_identical_requests": 2}}}]},
    "bad id": {"policies": [{"id": "no spaces", "spec": {"selector": {}, "tool_loops": {"enabled": True}}}]},
    "missing policies": {"max_body_bytes": 1024},
}


@pytest.mark.parametrize("name", BAD)
def test_what_the_schema_refuses_the_filter_refuses(name, tmp_path):
    config = BAD[name]
    assert list(VALIDATOR.iter_errors(config)), f"the schema accepts {name}"
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(config))
    r = subprocess.run([CLI, "check", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and ": error: " in r.stdout, r.stdout
