"""Load on the Redis Cluster store: three real Envoy replicas, 16
connections, one hot caller and 10,000 distinct ones. No increment is lost
(the hits in Redis equal the requests sent within the window), near-mode
records stay exact and bounded under contention, and the keys are spread
over every master. The figures printed here are the ones docs/redis.md
quotes (bytes per fingerprint, throughput through the whole path)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from harness import bootstrap, plugin, policy
from redis_cluster import RedisCluster
from shared_store import with_store_cluster

STORE = {"type": "redis_webdis", "topology": "cluster", "cluster": "loopguard_redis", "timeout_ms": 2000}
CONNECTIONS = 16


def fleet(start_envoy, upstream, cluster: RedisCluster, cfg: dict) -> list:
    """Three replicas. Envoy answers for the provider (a direct response):
    the test's Python upstream would drop connections under this load, and
    what is measured is the store."""
    envoys = []
    for i in range(3):
        config = with_store_cluster(bootstrap(cfg, upstream.port), cluster.webdis_port)
        hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        for route in hcm["route_config"]["virtual_hosts"][0]["routes"]:
            route.pop("route", None)
            route["direct_response"] = {"status": 200, "body": {"inline_string": '{"choices": []}'}}
        envoys.append(start_envoy(config, name=f"replica-{i}"))
    return envoys


def spray(envoys, requests: list[tuple[bytes, dict]]) -> tuple[list[int], float]:
    """Send every (body, headers) over CONNECTIONS connections, connection i
    on replica i % 3; the statuses, and the seconds it took."""
    clients = [httpx.Client(base_url=envoys[i % 3].url, timeout=30) for i in range(CONNECTIONS)]
    statuses = [0] * len(requests)

    def worker(i: int) -> None:
        for j in range(i, len(requests), CONNECTIONS):
            body, headers = requests[j]
            statuses[j] = clients[i].post("/v1/chat/completions", content=body, headers=headers).status_code

    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            list(pool.map(worker, range(CONNECTIONS)))
    finally:
        for c in clients:
            c.close()
    return statuses, time.monotonic() - t0


def total(envoys, name: str) -> int:
    return sum(e.counter(name) for e in envoys)


def healthy(envoys, calls: int) -> None:
    """Every call answered by Redis: none failed, none counted locally."""
    assert total(envoys, "loopguard.store_calls_total.result.ok") == calls
    for name in ("unavailable", "reply", "status"):
        assert total(envoys, f"loopguard.store_calls_total.result.{name}") == 0, name
    assert total(envoys, "loopguard.store_fallback_total") == 0
    assert total(envoys, "loopguard.store_fail_open_total") == 0


def the_key(cluster: RedisCluster, suffix: str) -> str:
    keys = [k for ks in cluster.keys_per_master(f"lg:*:{suffix}").values() for k in ks]
    assert len(keys) == 1, keys
    return keys[0]


def test_a_hot_caller_spraying_16_connections_over_three_replicas_loses_no_increment(cluster, upstream, start_envoy):
    cluster.flush()
    # A threshold the burst never reaches: the log keeps every hit, so its
    # length is the count of hits Redis recorded.
    envoys = fleet(start_envoy, upstream, cluster, plugin([policy("hot", threshold=1024, window=300)], store=STORE))
    n = 1000
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "the same request"}]}).encode()
    headers = {"authorization": "Bearer sk-hot-caller", "content-type": "application/json"}
    statuses, seconds = spray(envoys, [(body, headers)] * n)
    assert statuses == [200] * n
    healthy(envoys, n)
    key = the_key(cluster, "w")
    assert int(cluster.admin(cluster.master_of(key), "ZCARD", key).strip()) == n
    print(f"\nhot caller: {n} identical requests over {CONNECTIONS} connections and 3 replicas in {seconds:.1f} s "
          f"({n / seconds:.0f} req/s through loopguard -> webdis -> redis_proxy -> Redis Cluster); {n} hits in Redis")


def test_ten_thousand_callers_spread_over_every_master(cluster, upstream, start_envoy):
    cluster.flush()
    envoys = fleet(start_envoy, upstream, cluster, plugin([policy("many", threshold=5, window=300)], store=STORE))
    n = 10_000
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).encode()
    before = {p: used_memory(cluster, p) for p in cluster.masters()}
    reqs = [(body, {"authorization": f"Bearer sk-caller-{i}", "content-type": "application/json"}) for i in range(n)]
    statuses, seconds = spray(envoys, reqs)
    assert statuses == [200] * n
    healthy(envoys, n)
    per_master = cluster.keys_per_master("lg:*")
    counts = {p: len(keys) for p, keys in per_master.items()}
    assert sum(counts.values()) == n, counts
    assert all(k.endswith(":w") for keys in per_master.values() for k in keys)
    # 16384 slots in three ranges: each master holds about a third.
    assert all(0.25 * n < c < 0.42 * n for c in counts.values()), counts
    grown = sum(used_memory(cluster, p) - before[p] for p in before)
    sample = [k for keys in per_master.values() for k in keys[:50]]
    usage = [int(cluster.admin(cluster.master_of(k), "MEMORY", "USAGE", k).strip()) for k in sample]
    per_key = sum(usage) / len(usage)
    assert per_key < 400, per_key
    print(f"\n{n} callers: {n / seconds:.0f} req/s; keys per master {sorted(counts.values())}; "
          f"a fingerprint seen once: {per_key:.0f} bytes (MEMORY USAGE), {grown / n:.0f} bytes of used_memory per caller")


def test_near_records_under_contention_stay_exact_and_bounded(cluster, upstream, start_envoy):
    cluster.flush()
    history = 64
    cfg = plugin(
        [policy("near", threshold=history, window=300, similarity="near", near_history=history, action="warn")],
        store=STORE,
    )
    envoys = fleet(start_envoy, upstream, cluster, cfg)
    n = 400
    reqs = []
    for i in range(n):
        # One caller and model, the same conversation again and again.
        text = "Find the bug in parser.py and fix it."
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
        reqs.append((body, {"authorization": "Bearer sk-near-hot", "content-type": "application/json"}))
    statuses, seconds = spray(envoys, reqs)
    assert set(statuses) == {200}
    healthy(envoys, n)
    # One record for the caller, its history bounded at near_history; the
    # script is atomic on its shard, so there are no lost races to retry.
    hist = the_key(cluster, "n")
    assert int(cluster.admin(cluster.master_of(hist), "ZCARD", hist).strip()) == history
    assert total(envoys, "loopguard.store_cas_retries_total") == 0
    # The near count saturates at the history: warned from the 64th hit on.
    warned = total(envoys, "loopguard.warned_total")
    assert n - history - 8 <= warned <= n - history + 1, warned
    print(f"\nnear, one caller over {CONNECTIONS} connections: {n} hits in {seconds:.1f} s, history {history} kept, "
          f"{warned} warned, 0 store failures, 0 CAS retries (one atomic script per hit)")


def used_memory(cluster: RedisCluster, port: int) -> int:
    info = cluster.admin(port, "INFO", "memory")
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("used_memory:")))
