"""Spend caps (see test_budget.py) shared by replicas through the Redis
store: a single node and a cluster, the request right after a crossing
refused on another replica, and Redis failing (no request fails; the caps
go on from each replica's local sums)."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

import harness as h
from budgets import BUDGET_KEY, ask, budget_boot, budget_config, check_retry, release_of, spend, timed
from observing import stat
from shared_store import STORE, replicas, with_store_cluster

# Redis, redis-cli and webdis must be installed: a failure, never a skip.
pytestmark = pytest.mark.usefixtures("servers_installed")


# --- replicas sharing a Redis -------------------------------------------------------

REPLICA_BUDGET = {"limits": [
    {"name": "calls", "per": "caller", "window_seconds": 600, "calls": 3},
    {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 1_000_000},
]}


def store_ok(e: h.Envoy) -> int:
    return e.counter("loopguard.store_calls_total.result.ok")


def no_store_failure(envoys) -> None:
    for e in envoys:
        assert e.counter("loopguard.store_fallback_total") == 0, e.name
        for result in ("unavailable", "status", "reply"):
            assert e.counter(f"loopguard.store_calls_total.result.{result}") == 0, (e.name, result)
        assert e.counter("loopguard.budget_unrecorded_total") == 0, e.name


def test_two_replicas_share_a_budget_through_redis(shared, provider, start_envoy):
    """3 calls per caller, the caller's calls alternating A, B, A: B alone
    served one, yet once A's spending is in Redis the 4th call, on B, is
    refused (and so is the 5th, on A). Each call's spending is in Redis
    before its client has the whole response (the chunk that completes the
    usage waits for the add: docs/redis.md); the test still waits for both
    store calls of each call to be counted before the next is sent (the
    request sent at once is test_the_request_right_after_...). Redis holds
    the key's exact sums under the caller's hash tag, with an expiry within
    the window."""
    redis, webdis = shared
    a, b = replicas(start_envoy, provider, webdis.port, budget_config(REPLICA_BUDGET, store=STORE), hold=True)
    clients = [openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-fleet-budget", max_retries=2) for e in (a, b)]
    first = None
    for i in range(3):
        _, start, end = timed(lambda: clients[i % 2].chat.completions.create(model="gpt-4o", messages=ask()))
        first = first or (start, end)
        # Each served call: a check, then its spending added.
        assert h.wait_for(lambda: store_ok(a) + store_ok(b) == 2 * (i + 1), 5), (store_ok(a), store_ok(b))
    for i, e in ((3, b), (4, a)):
        start = time.time()
        with pytest.raises(openai.RateLimitError) as caught:
            clients[i % 2].chat.completions.create(model="gpt-4o", messages=ask())
        err = caught.value
        assert err.code == "budget_exceeded" and err.body["budget"] == "calls" and err.body["spent"] == "3"
        check_retry(err.response.headers, release_of(*first, 600), start, time.time(), 600)
        assert stat(e, "budget_rejected_total.policy.agents.budget.calls") == 1, e.name
    assert provider.count == 3
    no_store_failure([a, b])
    # Each replica counts what it served.
    assert [sum(spend(e, "calls").values()) for e in (a, b)] == [2, 1]
    assert sum(sum(spend(e, "tokens").values()) for e in (a, b)) == 3 * 127
    keys = redis.keys("lg:*")
    assert len(keys) == 2 and all(BUDGET_KEY.match(k) for k in keys), keys
    assert len({k.split(":")[2] for k in keys}) == 1  # one hash tag: the caller
    sums = sorted(sum(int(v) for v in redis.admin("HGETALL", k).split()[1::2]) for k in keys)
    assert sums == [3, 3 * 127]
    for k in keys:
        assert redis.admin("TYPE", k).strip() == "hash"
        assert 0 < int(redis.admin("PTTL", k)) <= 61 * 10_000


def test_the_request_right_after_the_crossing_is_refused_on_another_replica(shared, provider, start_envoy):
    """The issue's target: "No request over a cap gets through once the
    crossing response has been seen. The next request is rejected, on any
    worker and any replica sharing a store." One call per caller: the
    caller's call through A, then at once (as an agent loop does) its next
    call through B, for 5 callers: each 2nd call is refused. A holds the
    chunk that completes the usage until Redis has taken the spending, so
    the client cannot send its next call before the add has landed."""
    _, webdis = shared
    budget = {"limits": [{"name": "calls", "per": "caller", "window_seconds": 600, "calls": 1}]}
    a, b = replicas(start_envoy, provider, webdis.port, budget_config(budget, store=STORE), hold=True)
    outcomes = []
    for n in range(5):
        ca, cb = (openai.OpenAI(base_url=f"{e.url}/v1", api_key=f"sk-next-{n}", max_retries=0) for e in (a, b))
        ca.chat.completions.create(model="gpt-4o", messages=ask())
        try:
            cb.chat.completions.create(model="gpt-4o", messages=ask())
            outcomes.append(200)
        except openai.RateLimitError:
            outcomes.append(429)
    no_store_failure([a, b])
    assert outcomes == [429] * 5, f"{outcomes.count(200)} of 5 next calls through B passed the cap"


def test_two_replicas_share_budgets_on_a_redis_cluster(fresh_cluster, provider, start_envoy):
    """The same on a 3-master Redis Cluster (EVALSHA through redis_proxy, the
    script sent once more where a node answers NOSCRIPT): a caller's keys
    (its own, and those of its sessions) share its hash tag, so one call
    checks them all on one master. 2 calls per session and 3 per caller,
    alternating A and B."""
    store = {"type": "redis_webdis", "topology": "cluster", "cluster": "loopguard_redis", "timeout_ms": 1000}
    budget = {"limits": [{"name": "session-calls", "per": "session", "window_seconds": 600, "calls": 2},
                         {"name": "caller-calls", "per": "caller", "window_seconds": 600, "calls": 3}]}
    a, b = replicas(start_envoy, provider, fresh_cluster.webdis_port, budget_config(budget, store=store), hold=True)
    clients = [openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-cluster-budget", max_retries=0) for e in (a, b)]

    def call(replica: int, session: str):
        return clients[replica].chat.completions.create(model="gpt-4o", messages=ask(),
                                                        extra_headers={"x-session-id": session})

    def settled(n: int) -> None:
        assert h.wait_for(lambda: store_ok(a) + store_ok(b) >= n, 5), (store_ok(a), store_ok(b), n)

    call(0, "s-1")
    settled(2)
    call(1, "s-1")
    settled(4)
    with pytest.raises(openai.RateLimitError) as caught:
        call(0, "s-1")
    assert (caught.value.body["budget"], caught.value.body["spent"]) == ("session-calls", "2")
    call(1, "s-2")
    settled(7)
    with pytest.raises(openai.RateLimitError) as caught:
        call(0, "s-3")
    assert (caught.value.body["budget"], caught.value.body["per"], caught.value.body["spent"]) == (
        "caller-calls", "caller", "3")
    assert provider.count == 3
    no_store_failure([a, b])
    per_master = {m: ks for m, ks in fresh_cluster.keys_per_master("lg:*").items() if ks}
    assert len(per_master) == 1, per_master
    [keys] = per_master.values()
    # The caller's key and its sessions s-1 and s-2 (a refused request adds nothing).
    assert len(keys) == 3 and all(BUDGET_KEY.match(k) for k in keys), keys
    assert len({k.split(":")[2] for k in keys}) == 1


# --- Redis failing ------------------------------------------------------------------


def test_redis_down_never_fails_a_request(own_backend, provider, start_envoy):
    """Redis stops mid-run. With on_error: local, a caller already at its
    cap on this Envoy is still refused (from this Envoy's own sums), and a
    caller under it passes; with on_error: allow, a caller at its cap
    passes unchecked. No request fails; the store calls, the fallbacks and
    the spending Redis did not get are counted. Once Redis is back, checks
    go to Redis again."""
    redis, webdis = own_backend
    budget = {"limits": [{"name": "calls", "per": "caller", "window_seconds": 600, "calls": 2}]}
    local = start_envoy(with_store_cluster(budget_boot(budget_config(budget, store=STORE), provider.port), webdis.port),
                        name="on-error-local")
    allow = start_envoy(with_store_cluster(
        budget_boot(budget_config(budget, store={**STORE, "on_error": "allow"}), provider.port), webdis.port),
        name="on-error-allow")
    codes = []

    def post(e: h.Envoy, key: str) -> httpx.Response:
        r = httpx.post(f"{e.url}/v1/chat/completions", json={"model": "gpt-4o", "messages": ask()},
                       headers={"authorization": f"Bearer {key}"}, timeout=10)
        codes.append(r.status_code)
        return r

    assert [post(local, "sk-x").status_code for _ in range(2)] == [200, 200]
    assert [post(allow, "sk-z").status_code for _ in range(2)] == [200, 200]
    assert h.wait_for(lambda: store_ok(local) == 4 and store_ok(allow) == 4, 5)
    no_store_failure([local, allow])

    redis.stop()
    refused = post(local, "sk-x")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert refused.json()["error"]["spent"] == "2"
    assert post(local, "sk-y").status_code == 200
    assert post(allow, "sk-z").status_code == 200
    assert post(allow, "sk-z").status_code == 200
    assert all(c in (200, 429) for c in codes), codes
    assert provider.count == 2 + 2 + 1 + 2

    def failed(e: h.Envoy) -> int:
        return sum(e.counter(f"loopguard.store_calls_total.result.{r}") for r in ("unavailable", "status", "reply"))

    # Each check failed and fell back; each served call's spending could
    # not be added in Redis (counted once its add has failed).
    assert local.counter("loopguard.store_fallback_total.action.local") == 2
    assert allow.counter("loopguard.store_fallback_total.action.allow") == 2
    assert h.wait_for(lambda: local.counter("loopguard.budget_unrecorded_total") == 1
                      and allow.counter("loopguard.budget_unrecorded_total") == 2, 5), (
        local.counter("loopguard.budget_unrecorded_total"), allow.counter("loopguard.budget_unrecorded_total"))
    assert failed(local) == 2 + 1 and failed(allow) == 2 + 2
    assert stat(local, "budget_rejected_total.policy.agents.budget.calls") == 1
    assert stat(allow, "budget_rejected_total.policy.agents.budget.calls") == 0
    assert "budgets are checked against this Envoy's own spending" in local.log()
    assert "budgets are passed unchecked" in allow.log()

    # Redis is back (same port, the function loaded again): checks go to
    # Redis again. It kept nothing (the shipped redis.conf persists
    # nothing), so the first check answered by Redis lets sk-x through
    # although this Envoy's own sums hold its 2 calls: Redis decides again.
    redis.start()
    probes: list[tuple[httpx.Response, int]] = []

    def checked_in_redis() -> bool:
        """One probe (a call of sk-x): answered from Redis, or refused from
        the local sums while Redis is still away."""
        before, fallbacks = store_ok(local), local.counter("loopguard.store_fallback_total")
        probes.append((post(local, "sk-x"), fallbacks))
        if store_ok(local) > before:
            return True
        assert probes[-1][0].status_code == 429  # still from the local sums
        return False

    # A probe every 0.5 s until one is answered from Redis.
    assert h.wait_for(checked_in_redis, timeout=20, interval=0.5), "checks did not go to Redis again"
    r, fallbacks = probes[-1]
    assert r.status_code == 200
    assert local.counter("loopguard.store_fallback_total") == fallbacks
    assert all(c in (200, 429) for c in codes), codes
