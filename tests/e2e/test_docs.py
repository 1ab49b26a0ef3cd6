"""Configurations quoted in the README and the docs are the files they
claim to be.

A fenced block preceded by `<!-- same as: PATH -->` quotes the shipped
file PATH (relative to the repository). A YAML block of `http_filters` must
hold the same filters as PATH's, each equal field by field (the module's
path aside: the docs show where a user installs it, the file where `make`
builds it), with loopguard's configuration compared as parsed JSON; a JSON
block must equal PATH's loopguard configuration. So a documented setting
can never drift from the file that is measured and tested (a README that
said `near_distance` 3 beside a file with 4 was how this was found)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]
QUOTE = re.compile(r"<!-- same as: (\S+) -->\n```(\w+)\n(.*?)\n```", re.S)


def quotes() -> list[tuple[Path, str, str, str]]:
    out = []
    for doc in DOCS:
        for m in QUOTE.finditer(doc.read_text()):
            out.append((doc, m.group(1), m.group(2), m.group(3)))
    return out


def find_filters(node) -> list | None:
    """The first `http_filters` list in a parsed Envoy config."""
    if isinstance(node, dict):
        if isinstance(node.get("http_filters"), list):
            return node["http_filters"]
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = find_filters(child)
        if found is not None:
            return found
    return None


def comparable(f: dict) -> dict:
    """A filter as compared: the wasm module's location dropped, the plugin
    configuration parsed."""
    f = json.loads(json.dumps(f))
    cfg = f.get("typed_config", {}).get("config")
    if isinstance(cfg, dict):
        cfg.get("vm_config", {}).pop("code", None)
        value = cfg.get("configuration", {}).get("value")
        if isinstance(value, str):
            cfg["configuration"]["value"] = json.loads(value)
    return f


def plugin_json(path: Path) -> dict:
    filters = find_filters(yaml.safe_load(path.read_text())) or []
    wasm = next(f for f in filters if f.get("name") == "loopguard")
    return json.loads(wasm["typed_config"]["config"]["configuration"]["value"])


QUOTED = quotes()


def test_the_readme_quotes_the_recommended_setup():
    assert any(doc.name == "README.md" and path == "examples/recommended/envoy.yaml" for doc, path, _, _ in QUOTED)


@pytest.mark.parametrize("doc,path,lang,block", QUOTED, ids=[f"{d.name}:{p}" for d, p, _, _ in QUOTED])
def test_a_quoted_configuration_equals_its_file(doc, path, lang, block):
    target = ROOT / path
    assert target.is_file(), f"{doc.name} quotes {path}, which does not exist"
    if lang == "json":
        assert json.loads(block) == plugin_json(target), f"{doc.name}'s JSON differs from {path}'s configuration"
        return
    assert lang == "yaml", f"{doc.name}: a quoted block must be yaml or json, not {lang}"
    quoted = find_filters(yaml.safe_load(block))
    assert quoted, f"{doc.name}: the block quoting {path} holds no http_filters"
    shipped = {f["name"]: f for f in find_filters(yaml.safe_load(target.read_text())) or []}
    for f in quoted:
        assert f["name"] in shipped, f"{doc.name} shows filter {f['name']}, which {path} does not have"
        assert comparable(f) == comparable(shipped[f["name"]]), f"{doc.name}'s {f['name']} differs from {path}'s"
    assert [f["name"] for f in quoted] == list(shipped), f"{doc.name} shows other filters than {path}"


# A fenced block preceded by `<!-- output of: loopguard ARGS -->` shows what
# the CLI prints for ARGS, run from the repository: it must be what the CLI
# prints now (a block ending in `...` shows the first lines only).
OUTPUT = re.compile(r"<!-- output of: loopguard (.+?) -->\n```\n(.*?)\n```", re.S)


def outputs() -> list[tuple[Path, str, str]]:
    return [(doc, m.group(1), m.group(2)) for doc in DOCS for m in OUTPUT.finditer(doc.read_text())]


def test_documented_outputs_exist():
    assert len(outputs()) >= 2, "docs/cli/ shows replay's report and a sweep"


@pytest.mark.parametrize("doc,args,block", outputs(), ids=lambda v: v if isinstance(v, str) and not v.startswith("$") else None)
def test_documented_output_is_what_the_cli_prints(doc, args, block):
    import os
    import shlex
    import subprocess

    cli = os.environ.get("LOOPGUARD_CLI", str(ROOT / "target" / "release" / "loopguard"))
    lines = block.splitlines()
    assert lines[0] == f"$ loopguard {args}", f"{doc.name}: the block starts with the command it shows"
    shown = lines[1:]
    run = subprocess.run([cli, *shlex.split(args)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    printed = run.stdout.rstrip("\n").splitlines()
    if shown and shown[-1] == "...":
        shown = shown[:-1]
        printed = printed[: len(shown)]
    assert shown == printed, f"{doc.name}: loopguard {args}"
