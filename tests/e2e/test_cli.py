"""The loopguard CLI (`make cli`): `check` accepts every shipped
configuration and refuses a bad one with the filter's own message,
`explain` computes the digest the filter puts in its 429, every subcommand
answers --help, and `replay` reads gzip-compressed traffic as the plain
file."""

import gzip
import json
from pathlib import Path

import httpx
import pytest
import yaml

from harness import CLI, ROOT, ROUTER, bootstrap, buffer_filter, cli, loopguard_filter, plugin, policy


@pytest.fixture(scope="module", autouse=True)
def built():
    if not Path(CLI).exists():
        pytest.fail(f"{CLI} is missing: run the tests through `make test`, which builds it (make cli)")


@pytest.mark.parametrize("sub", ["check", "explain", "replay", "schema", "redis-script"])
def test_every_subcommand_answers_help(sub):
    r, short = cli(sub, "--help"), cli(sub, "-h")
    assert (r.returncode, short.returncode) == (0, 0), r.stderr + short.stderr
    for help in (r.stdout, short.stdout):
        assert f"Usage: loopguard {sub}" in help, help
    # --help says more than -h's summary.
    assert len(r.stdout) > len(short.stdout), r.stdout
    r = cli(sub, "--no-such-option")
    assert r.returncode == 2
    assert "unexpected argument '--no-such-option' found" in r.stderr, r.stderr


def test_replay_reads_gzip_traffic_as_the_plain_file(tmp_path):
    sample = ROOT / "examples" / "replay" / "traffic.jsonl"
    packed = tmp_path / "traffic.jsonl.gz"
    packed.write_bytes(gzip.compress(sample.read_bytes()))
    reports = []
    for traffic in (sample, packed):
        r = cli("replay", "--config", "examples/recommended/envoy.yaml", "--json", str(traffic))
        assert r.returncode == 0, r.stderr
        # Not a terminal: no progress drawn.
        assert r.stderr == ""
        report = json.loads(r.stdout)
        assert report["inputs"].pop("files") == [str(traffic)]
        reports.append(report)
    assert reports[0]["inputs"]["read"] == 52
    assert reports[1] == reports[0]


def shipped_envoy_configs() -> list[Path]:
    return [ROOT / "envoy" / "envoy.yaml", *sorted(ROOT.glob("examples/*/envoy.yaml"))]


@pytest.mark.parametrize("path", shipped_envoy_configs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_envoy_config_checks_clean(path):
    r = cli("check", "--strict", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith(": 0 errors, 0 warnings"), r.stdout
    # A config with the loopguard filter (Wasm or dynamic module) has it
    # found and checked (examples/tap has none: capture needs no loopguard).
    if any(m in path.read_text() for m in ("loopguard.wasm", "libloopguard_native.so")):
        assert not r.stdout.startswith("0 configurations"), r.stdout


@pytest.mark.parametrize("folder", ["istio", "envoy-gateway"])
def test_the_mesh_examples_check_clean_together(folder):
    files = sorted(str(p) for p in (ROOT / "examples" / folder).glob("*.yaml"))
    assert files, folder
    r = cli("check", "--strict", *files)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 errors, 0 warnings" in r.stdout


def test_check_envoy_reads_the_abi_of_the_module_file():
    """`check --envoy` on the shipped native example, whose module path is
    the one `make build` writes (a build for Envoy 1.40), read from the
    real file: clean for 1.40; for 1.39 the warning docs/cli/check.md shows
    (test_docs runs that block), an error under --strict; for 1.38, which
    lacks callbacks the module calls, an error."""
    clean = cli("check", "--strict", "--envoy", "1.40", "examples/native/envoy.yaml")
    assert clean.returncode == 0, clean.stdout
    assert clean.stdout.strip().endswith(": 0 errors, 0 warnings")
    other = cli("check", "--strict", "--envoy", "1.39.3", "examples/native/envoy.yaml")
    assert other.returncode == 1
    assert "libloopguard_native.so is built for ABI v0.2.0, and Envoy 1.39.3 speaks v0.1.0" in other.stdout
    old = cli("check", "--envoy", "1.38", "examples/native/envoy.yaml")
    assert old.returncode == 1
    assert "error: Envoy 1.38 lacks 4 of the callbacks the native module calls" in old.stdout
    wrong = cli("check", "--envoy", "latest", "examples/native/envoy.yaml")
    assert wrong.returncode == 2 and "expected an Envoy version such as 1.39 or 1.39.3" in wrong.stdout + wrong.stderr


def test_a_bad_configuration_is_refused_with_the_filters_own_message(tmp_path, start_envoy, upstream):
    bad = plugin([policy("agents", threshold=3, window=0)])
    cfg = bootstrap(bad, upstream.port)
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = cli("check", str(path))
    assert r.returncode == 1
    expected = 'policy "agents": loop_detection.window_seconds must be >= 1 (got 0)'
    assert f'{path} filter "loopguard": error: {expected}' in r.stdout, r.stdout
    # The filter refuses the same configuration with the same words.
    log = start_envoy.make(cfg).expect_startup_failure()
    assert f"invalid configuration: {expected}" in log


def test_check_warns_about_setups_that_silently_do_nothing(tmp_path, upstream):
    cfg = bootstrap(None, upstream.port, http_filters=[buffer_filter(), loopguard_filter(plugin([policy(threshold=3, selector={"routes": ["chat"]})])), ROUTER])
    route = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]
    route["name"] = "completions"
    route["metadata"] = {"filter_metadata": {"loopguard": {"policy": "p"}}}
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = cli("check", str(path))
    assert r.returncode == 0, "warnings alone do not fail"
    assert "the buffer filter runs before loopguard" in r.stdout
    assert 'route "completions" names policy "p" in filter_metadata.loopguard, but the configuration lacks "route_metadata": true' in r.stdout
    assert 'policy "p": selector.routes lists "chat", but no route where loopguard runs has such a name' in r.stdout
    assert cli("check", "--strict", str(path)).returncode == 1


def request_file(tmp_path, name: str, path: str, headers: dict, body: bytes) -> Path:
    """The request as raw HTTP/1.1, exactly the bytes the test sends."""
    lines = [f"POST {path} HTTP/1.1", "Host: gateway.example"] + [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    f = tmp_path / name
    f.write_bytes(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return f


@pytest.mark.parametrize(
    "similarity,path,body",
    [
        ("exact", "/v1/embeddings?user=u1&a=2", b'{"model":"text-embedding-3-small","input":"hello"}'),
        ("llm_tail", "/v1/chat/completions", json.dumps({"model": "gpt-4o-mini", "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Is the   BUILD green?"}]}).encode()),
        ("llm_tail", "/v1/messages", json.dumps({"model": "claude-sonnet-5-5", "max_tokens": 10, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}).encode()),
        ("near", "/v1/chat/completions", json.dumps({"model": "gpt-4o", "messages": [
            {"role": "user", "content": "Export the report."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "export", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Error 503 at 2026-11-23T13:40:01Z (request id req_8f3aK29dLm01)"}]}).encode()),
    ],
    ids=["exact", "openai-chat", "anthropic", "near"],
)
def test_explain_digest_equals_the_fingerprint_in_the_filters_429(tmp_path, start_envoy, upstream, similarity, path, body):
    cfg = plugin([policy("agents", threshold=2, similarity=similarity, selector={"pathPrefix": "/v1/"})])
    envoy_cfg = bootstrap(cfg, upstream.port)
    config_file = tmp_path / "envoy.yaml"
    config_file.write_text(yaml.safe_dump(envoy_cfg))
    headers = {"authorization": "Bearer sk-explain", "content-type": "application/json"}
    req = request_file(tmp_path, "request.http", path, headers, body)
    r = cli("explain", "--config", str(config_file), "--request", str(req), "--json")
    assert r.returncode == 0, r.stderr
    explained = json.loads(r.stdout)
    assert explained["policy"]["id"] == "agents"
    assert explained["detection"]["similarity"] == similarity
    assert "sk-explain" not in r.stdout
    e = start_envoy(envoy_cfg)
    with httpx.Client(base_url=e.url, headers={"host": "gateway.example"}) as c:
        codes = [c.post(path, content=body, headers=headers) for _ in range(2)]
    assert [x.status_code for x in codes] == [200, 429]
    rejected = codes[1].json()
    fingerprint = rejected["error"]["fingerprint"] if "fingerprint" in rejected.get("error", {}) else rejected["loopguard"]["fingerprint"]
    assert explained["fingerprint"] == fingerprint
    # The caller tag explain shows is the one the filter's loop metrics
    # carry (what an operator looks up from the dashboard).
    callers = [k for k in e.stats() if k.startswith("wasmcustom.loopguard.caller_loop_requests_total.policy.agents.caller.")]
    assert callers == [f"wasmcustom.loopguard.caller_loop_requests_total.policy.agents.caller.{explained['caller']}"]
    # The text form shows the same digest and the components in order.
    text = cli("explain", "--config", str(config_file), "--request", str(req)).stdout
    assert f"fingerprint: {fingerprint}" in text
    assert f"caller tag: {explained['caller']}" in text
    assert "fingerprint components, in order:" in text and " 1. domain" in text
    if similarity == "near":
        # The masked tail that went into the signature, the signature and
        # its anchor (its first 8 hex digits).
        shown = {c["name"]: c["value"] for c in explained["components"]}
        assert any("<datetime>" in v and "req_<id>" in v for v in shown.values()), shown
        assert len(shown["signature"]) == 112 and int(shown["signature"], 16) >= 0
        assert shown["signature anchor"] == shown["signature"][:8]
        assert "signature" in text and "<datetime>" in text
        assert "shares at least 0.350 of its words" in explained["detection"]["detail"]
