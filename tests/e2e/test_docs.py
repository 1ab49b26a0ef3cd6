"""Configurations quoted in the README and the docs are the files they
claim to be; what the CLI is shown printing is what it prints; every
relative link points to a file and heading that exist; the README stays a
front door (at most 200 lines) whose commands are real.

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
README = ROOT / "README.md"
DOCS = [
    README,
    ROOT / "ARCHITECTURE.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "examples").rglob("README.md")),
]
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
    assert any(doc == README and path == "examples/recommended/envoy.yaml" for doc, path, _, _ in QUOTED)


@pytest.mark.parametrize("doc,path,lang,block", QUOTED, ids=[f"{d.relative_to(ROOT)}:{p}" for d, p, _, _ in QUOTED])
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


# Links. A relative link `[text](path)` or `[text](path#anchor)` (or
# `#anchor` alone) must point to a file or folder that exists and, with an
# anchor, to a heading of that file: headings get GitHub's anchors (the
# text lower-cased, punctuation but `-` and `_` dropped, spaces to `-`, a
# repeated heading numbered `-1`, `-2`, ...). Links inside code are not
# links.
FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*([^()\s]+)(?:\s+\"[^\"]*\")?\s*\)")


def outside_code(text: str) -> list[str]:
    """The lines of a document, with fenced blocks blanked (kept as lines,
    so line numbers hold)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return lines


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in outside_code(doc.read_text()):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            seen[s] = seen.get(s, -1) + 1
    return {s if n == 0 else f"{s}-{n}" for s, count in seen.items() for n in range(count + 1)}


def links(doc: Path) -> list[tuple[int, str]]:
    """(line, target) of each relative link in a document."""
    text = "\n".join(re.sub(r"`[^`]*`", "``", line) for line in outside_code(doc.read_text()))
    out = []
    for m in LINK.finditer(text):
        target = m.group(2)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):
            out.append((text.count("\n", 0, m.start()) + 1, target))
    return out


def test_anchors_follow_githubs_rule():
    assert slug("Retries after provider errors (`forgive_failed_attempts`)") == "retries-after-provider-errors-forgive_failed_attempts"
    assert slug('Fingerprint (`similarity: "exact"`)') == "fingerprint-similarity-exact"
    assert slug("Headers, logs and metrics") == "headers-logs-and-metrics"


def test_docs_have_links_to_check():
    assert sum(len(links(doc)) for doc in DOCS) > 200
    assert ROOT / "ARCHITECTURE.md" in DOCS and ROOT / "CHANGELOG.md" in DOCS and ROOT / "docs" / "cli" / "replay.md" in DOCS


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_and_heading_that_exist(doc):
    broken = []
    for line, target in links(doc):
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"line {line}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"line {line}: {target}: no such heading in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}:\n" + "\n".join(broken)


# The README is the front door: short, and every command it shows is real.
def test_the_readme_is_at_most_200_lines():
    n = len(README.read_text().splitlines())
    assert n <= 200, f"README.md has {n} lines: move detail into docs/ and link it"


def makefile_targets() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9][\w.-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M)}


def test_every_make_target_the_readme_and_architecture_name_exists():
    targets = makefile_targets()
    assert {"run", "test", "run-native"} <= targets
    for doc in (README, ROOT / "ARCHITECTURE.md"):
        named = set(re.findall(r"`make ([\w-]+)", doc.read_text()))
        assert named, f"{doc.name} names no make target"
        assert named <= targets, f"{doc.name} names make targets the Makefile lacks: {sorted(named - targets)}"


def test_the_readme_demo_shows_what_the_filter_answers():
    """The README's curl loop against `make run` (envoy/envoy.yaml): the
    codes it promises follow from the policy's threshold, and the 429 it
    shows carries the policy, the count, the window and the fingerprint
    the filter computes for that request (`loopguard explain`, the filter's
    own code). tests/e2e/test_examples.py runs the same configuration in
    Envoy and trips it at the fifth identical request."""
    import os
    import subprocess
    import tempfile

    text = README.read_text()
    assert "make run" in text and "http://127.0.0.1:10000/v1/chat/completions" in text
    assert re.search(r"address: 127\.0\.0\.1, port_value: 10000 }", (ROOT / "envoy" / "envoy.yaml").read_text()), "make run listens on 10000"
    bodies = set(re.findall(r"-d '(\{.*?\})'", text))
    assert len(bodies) == 1, "the demo sends one request body, again and again"
    body = bodies.pop()
    codes = re.search(r"^# ((?:\d{3} ?)+)$", text, re.M).group(1).split()
    shown = json.loads(re.search(r'^(\{"error":.*\})$', text, re.M).group(1))["error"]
    request = {"method": "POST", "path": "/v1/chat/completions", "headers": {"content-type": "application/json"}, "body": body}
    cli = os.environ.get("LOOPGUARD_CLI", str(ROOT / "target" / "release" / "loopguard"))
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(request, f)
        f.flush()
        run = subprocess.run([cli, "explain", "--config", "envoy/envoy.yaml", "--request", f.name], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    threshold, window = map(int, re.search(r"^detection: exact; (\d+) identical in (\d+) s triggers", out, re.M).groups())
    assert codes == ["200"] * (threshold - 1) + ["429"] * (len(codes) - threshold + 1)
    assert (threshold, window) == (5, 60) and "the fifth within 60 seconds" in " ".join(text.split())
    assert re.search(rf'^policy: "{shown["policy"]}"', out, re.M)
    assert (shown["hit_count"], shown["window_seconds"]) == (threshold, window)
    assert shown["fingerprint"] == re.search(r"^fingerprint: ([0-9a-f]{32})", out, re.M).group(1)
