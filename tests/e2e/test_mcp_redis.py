"""MCP call histories in the shared store: two real Envoys counting in one
real Redis through real webdis, in front of one MCP server.

With the stateless MCP protocol nothing pins an agent to a replica: its
identical `tools/call`s alternate between them, and are one history all the
same. The 3rd call's real result carries a note and the 4th is answered by
loopguard, as on one replica, so the server runs the call 3 times. With
Redis down the calls pass, and a loop that stays on one replica is still
stopped there (`store.on_error: local`).
"""

from __future__ import annotations

import json
import shutil
import uuid

import httpx
import pytest

from harness import bootstrap, wait_for
from mcp_agents import RawUpstream
from shared_store import STORE, no_fallback, replicas, with_store_cluster

pytestmark = pytest.mark.usefixtures("servers_installed")

NOTE = "[loopguard] Note: "
BLOCKED = "[loopguard] This call was not run: "
PLUGIN = {"store": STORE, "policies": [{"id": "mcp", "spec": {
    "selector": {"pathPrefix": "/mcp"}, "mcp": {"enabled": True}}}]}


def call(url: str, key: str, rid: int, answer: str = "json") -> httpx.Response:
    """One stateless `tools/call` (no session: the caller's API key and
    address make its history)."""
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": "search", "arguments": {"q": key}}})
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "authorization": f"Bearer sk-{key}", "mcp-protocol-version": "2026-07-28", "x-answer": answer}
    return httpx.post(f"{url}/mcp", content=body, headers=headers, timeout=15)


def result_of(r: httpx.Response) -> dict:
    """The JSON-RPC result of a JSON or event-stream answer."""
    assert r.status_code == 200, r.text[:300]
    if r.headers["content-type"].startswith("text/event-stream"):
        datas = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        msgs = [json.loads(d) for d in datas]
        [msg] = [m for m in msgs if "result" in m]
        return msg["result"]
    return r.json()["result"]


def shape(r: httpx.Response) -> str:
    """What the client got: the server's result, with a note, or blocked."""
    result = result_of(r)
    texts = [c["text"] for c in result["content"]]
    if result.get("isError") and texts[0].startswith(BLOCKED):
        return "blocked"
    if len(texts) == 2 and texts[1].startswith(NOTE):
        return "noted"
    assert texts == ["same"], texts
    return "real"


def loop(urls: list[str], up: RawUpstream, answer: str) -> tuple[list[str], int]:
    """Six identical calls of one new caller, sent to `urls` in turn: what
    each got, and how often the server ran the call."""
    key = uuid.uuid4().hex[:10]
    at = up.count
    got = [shape(call(urls[i % len(urls)], key, i + 1, answer)) for i in range(6)]
    return got, up.count - at


EXPECTED = ["real", "real", "noted", "blocked", "blocked", "blocked"]


@pytest.mark.parametrize("answer", ["json", "sse"])
def test_a_loop_alternating_over_two_replicas_is_answered_at_the_same_call_as_on_one(
        shared, mcp_upstream, start_envoy, answer):
    redis, webdis = shared
    a, b = replicas(start_envoy, mcp_upstream, webdis.port, PLUGIN)
    alone = loop([a.url], mcp_upstream, answer)
    spread = loop([a.url, b.url], mcp_upstream, answer)
    assert alone == spread == (EXPECTED, 3)
    no_fallback([a, b])
    for e in (a, b):
        assert e.counter("loopguard.store_calls_total.result.ok") >= 6, e.name
        assert e.counter("loopguard.mcp_unjudged_total.policy.mcp.reason.store_error") == 0
    # Each replica acted on the loop it saw: a note on one, blocks on both.
    assert a.counter("loopguard.mcp_loops_total.policy.mcp.tier.identical.step.block") >= 1
    assert b.counter("loopguard.mcp_loops_total.policy.mcp.tier.identical.step.block") >= 1
    # Histories in Redis: digests under the plugin's namespace, expiring.
    keys = redis.keys("lg:loopguard:{m*")
    assert keys and all(k.endswith((":h", ":r")) for k in keys), keys
    assert all(0 < int(redis.admin("PTTL", k)) <= 600_000 for k in keys)


def test_with_redis_down_mcp_calls_pass_and_a_loop_on_one_replica_is_still_stopped(
        own_backend, mcp_upstream, start_envoy):
    redis, webdis = own_backend
    a, b = replicas(start_envoy, mcp_upstream, webdis.port, PLUGIN)
    redis.stop()
    # On one replica: its own history, the same ladder.
    assert loop([a.url], mcp_upstream, "json") == (EXPECTED, 3)
    assert a.counter("loopguard.store_fallback_total.action.local") >= 6
    # Spread over both, each judges what it saw: still stopped, later.
    got, ran = loop([a.url, b.url], mcp_upstream, "json")
    assert (got, ran) == (["real"] * 4 + ["noted"] * 2, 6)
    assert "redis store" in a.log()


def test_with_on_error_allow_a_failed_store_lets_mcp_calls_pass_unjudged(own_backend, mcp_upstream, start_envoy):
    redis, webdis = own_backend
    plugin = {**PLUGIN, "store": {**STORE, "on_error": "allow"}}
    e = start_envoy(with_store_cluster(bootstrap(plugin, mcp_upstream.port), webdis.port))
    webdis.stop()
    assert loop([e.url], mcp_upstream, "json") == (["real"] * 6, 6)
    assert e.counter("loopguard.mcp_unjudged_total.policy.mcp.reason.store_error") >= 6
    assert e.counter("loopguard.store_fallback_total.action.allow") >= 6
    assert wait_for(lambda: "MCP calls are passed unchecked" in e.log(), timeout=5)
    shutil.rmtree(e.dir, ignore_errors=True)
