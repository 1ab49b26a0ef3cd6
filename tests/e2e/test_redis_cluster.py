"""loopguard on a Redis Cluster: three real Envoy replicas count in one
3-master, 3-replica Redis Cluster through webdis and Envoy's redis_proxy,
calling the Lua library as a script (EVALSHA, EVAL once a node answers
NOSCRIPT). The failover and load tests are test_redis_failover.py and
test_redis_cluster_load.py."""

from __future__ import annotations

import re

import httpx

from harness import ROOT, bootstrap, cli, load_yaml, plugin, plugin_config_of, policy
from shared_store import example_trips_the_sdk_on_the_5th, replicas

# The store as the cluster example ships it, with a timeout generous for a
# busy 2-core machine (a timeout would silently count locally instead).
STORE = {"type": "redis_webdis", "topology": "cluster", "cluster": "loopguard_redis", "timeout_ms": 1000}
# lg:<plugin name>:{<fingerprint digest>}:<w|cd|ev>
FP_KEY = re.compile(r"^lg:loopguard:\{([0-9a-f]{32})\}:(w|cd|ev)$")


def total(envoys, name: str) -> int:
    return sum(e.counter(name) for e in envoys)


def no_fallback(envoys) -> None:
    for e in envoys:
        assert e.counter("loopguard.store_fallback_total") == 0, e.name
        assert e.counter("loopguard.store_calls_total.result.unavailable") == 0, e.name
        assert e.counter("loopguard.store_calls_total.result.reply") == 0, e.name


def test_loops_spread_over_three_replicas_trip_at_the_global_nth_on_every_shard(fresh_cluster, upstream, start_envoy):
    """24 callers each loop over the three replicas in turn: every loop is
    rejected at its 5th request overall, though no replica saw more than 2
    of its first 5, and their keys live on all three masters."""
    envoys = replicas(start_envoy, upstream, fresh_cluster.webdis_port, plugin([policy("spread", threshold=5, limit_keys=["header:authorization"])], store=STORE), n=3)
    clients = [httpx.Client(base_url=e.url) for e in envoys]
    try:
        for caller in range(24):
            codes = []
            for i in range(7):
                r = clients[(caller + i) % 3].post(
                    "/v1/chat/completions",
                    content=b'{"prompt": "same body"}',
                    headers={"authorization": f"Bearer sk-caller-{caller}"},
                )
                codes.append(r.status_code)
                if r.status_code == 429:
                    assert r.json()["error"]["code"] == "recursive_loop_detected"
            assert codes == [200] * 4 + [429] * 3, (caller, codes)
    finally:
        for c in clients:
            c.close()
    assert total(envoys, "loopguard.store_calls_total.result.ok") == 24 * 7
    assert total(envoys, "loopguard.rejected_total") == 24 * 3
    assert total(envoys, "loopguard.detected_total") == 24
    no_fallback(envoys)
    # Each loop's keys share one hash tag, so one master holds them all;
    # the 24 loops are spread over every master.
    per_master = fresh_cluster.keys_per_master()
    assert len(per_master) == 3
    digests_by_master = {}
    for port, keys in per_master.items():
        assert all(FP_KEY.match(k) for k in keys), keys
        digests_by_master[port] = {FP_KEY.match(k).group(1) for k in keys}
        assert digests_by_master[port], f"master {port} holds no loop"
    all_digests = [d for ds in digests_by_master.values() for d in ds]
    assert len(all_digests) == len(set(all_digests)) == 24, "a loop's keys are split over masters"
    # Nothing about the callers is stored: digests only.
    dump = " ".join(k for keys in per_master.values() for k in keys)
    assert "sk-caller" not in dump and "same body" not in dump


def test_a_node_without_the_script_gets_it_in_full_once(fresh_cluster, upstream, start_envoy):
    """After SCRIPT FLUSH (as after a failover, whose new master never had
    the script), the first call of each master answers NOSCRIPT: loopguard
    sends it again with the whole script, the request is decided as
    usual, and later calls go by SHA1 again."""
    envoys = replicas(start_envoy, upstream, fresh_cluster.webdis_port, plugin([policy("p", threshold=3, limit_keys=["header:authorization"])], store=STORE), n=1)
    (e,) = envoys
    with httpx.Client(base_url=e.url) as c:

        def loop(caller: str) -> list[int]:
            return [
                c.post("/v1/x", content=b"same", headers={"authorization": caller}).status_code for _ in range(4)
            ]

        assert loop("warm") == [200, 200, 429, 429]
        warm = e.counter("loopguard.store_calls_total.result.noscript")
        fresh_cluster.script_flush()
        # Loops on several masters, so every master meets the script again.
        for caller in range(9):
            assert loop(f"after-flush-{caller}") == [200, 200, 429, 429]
        resent = e.counter("loopguard.store_calls_total.result.noscript") - warm
        masters_used = sum(1 for keys in fresh_cluster.keys_per_master().values() if any("{" in k for k in keys))
        assert resent == masters_used == 3, (resent, masters_used)
        assert e.counter("loopguard.store_calls_total.result.ok") == 40
        # Once more: every master has it cached now.
        assert loop("cached") == [200, 200, 429, 429]
        assert e.counter("loopguard.store_calls_total.result.noscript") - warm == 3
    no_fallback(envoys)


def test_the_cluster_example_and_the_openai_sdk(fresh_cluster, start_envoy):
    """examples/cluster/cluster/envoy.yaml as shipped (ports moved): an
    agent whose identical call goes to two replicas in turn gets the SDK's
    RateLimitError on the 5th call overall."""
    path = ROOT / "examples" / "cluster" / "cluster" / "envoy.yaml"
    example = load_yaml(path)
    hcm = example["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    wasm = next(f for f in hcm["http_filters"] if f["name"] == "loopguard")
    assert plugin_config_of(wasm)["store"]["topology"] == "cluster"
    envoys = example_trips_the_sdk_on_the_5th(start_envoy, path, fresh_cluster.webdis_port)
    no_fallback(envoys)


def test_topology_on_a_local_store_stops_the_filter_naming_the_field(start_envoy, upstream):
    e = start_envoy.make(bootstrap(plugin([policy()], store={"topology": "cluster"}), upstream.port))
    log = e.expect_startup_failure()
    assert 'store.topology applies only to the "redis_webdis" store' in log


def test_an_unknown_topology_stops_the_filter_naming_the_field(start_envoy, upstream):
    store = {"type": "redis_webdis", "cluster": "loopguard_redis", "topology": "sentinel"}
    e = start_envoy.make(bootstrap(plugin([policy()], store=store), upstream.port))
    log = e.expect_startup_failure()
    assert 'store.topology must be "single" or "cluster"' in log



def test_a_script_loaded_ahead_from_the_cli_is_the_one_loopguard_calls(fresh_cluster, upstream, start_envoy):
    """`loopguard redis-script` prints the script the filter sends: loaded
    on every master with SCRIPT LOAD, Redis names it by the SHA1 that
    `--sha1` prints, and loopguard's calls then never meet NOSCRIPT."""
    script = cli("redis-script").stdout
    sha1 = cli("redis-script", "--sha1").stdout.strip()
    fresh_cluster.script_flush()
    for port in fresh_cluster.masters():
        assert fresh_cluster.admin(port, "SCRIPT", "LOAD", stdin=script).strip() == sha1
    (e,) = replicas(start_envoy, upstream, fresh_cluster.webdis_port, plugin([policy("p", threshold=3, limit_keys=["header:authorization"])], store=STORE), n=1)
    with httpx.Client(base_url=e.url) as c:
        for caller in range(9):
            codes = [c.post("/v1/x", content=b"same", headers={"authorization": f"k{caller}"}).status_code for _ in range(4)]
            assert codes == [200, 200, 429, 429]
    assert e.counter("loopguard.store_calls_total.result.ok") == 36
    assert e.counter("loopguard.store_calls_total.result.noscript") == 0
