"""Failover, measured: three real Envoy replicas count loops in a 3-master,
3-replica Redis Cluster (webdis -> Envoy redis_proxy) while a master is
killed, the redis_proxy Envoy restarts, and webdis restarts. No request
fails because of the store: while a shard is away its hits are counted in
each replica's own table (on_error: local, counted in the metrics), and the
shared count carries on once the shard is back. The figures printed here
are the ones docs/redis.md quotes."""

from __future__ import annotations

import threading
import time

import httpx

from harness import plugin, policy, wait_for
from redis_cluster import RedisCluster
from shared_store import replicas

STORE = {
    "type": "redis_webdis",
    "topology": "cluster",
    "cluster": "loopguard_redis",
    "timeout_ms": 500,
    "on_error": "local",
}
THRESHOLD = 5
CONFIG = plugin([policy("agents", threshold=THRESHOLD, limit_keys=["header:authorization"])], store=STORE)
# The test's own bound on every loop it runs.
DEADLINE_S = 40.0
# Rounds of 6 new callers in a row without a failed store call: each caller's
# key is on the killed master's shard one time in three, so 3 quiet rounds
# leave a (2/3)^18 chance that the shard was not asked at all.
QUIET_ROUNDS = 3


class Fleet:
    """Three loopguard replicas and one client per replica; a caller's
    identical request goes to the replicas in turn."""

    def __init__(self, start_envoy, upstream, cluster: RedisCluster) -> None:
        self.cluster = cluster
        self.envoys = replicas(start_envoy, upstream, cluster.webdis_port, CONFIG, n=3)
        self.clients = [httpx.Client(base_url=e.url, timeout=10) for e in self.envoys]
        self.sent: dict[str, int] = {}
        self.lock = threading.Lock()

    def send(self, caller: str, replica: int | None = None) -> httpx.Response:
        """The caller's next request: to `replica`, or to the next replica."""
        with self.lock:
            n = self.sent.get(caller, 0)
            self.sent[caller] = n + 1
        r = self.clients[n % 3 if replica is None else replica].post(
            "/v1/chat/completions",
            content=b'{"model": "m", "messages": [{"role": "user", "content": "same"}]}',
            headers={"authorization": f"Bearer {caller}", "content-type": "application/json"},
        )
        # No request fails because of the store: the upstream's 200, or
        # loopguard's own 429 with its JSON error.
        assert r.status_code in (200, 429), (caller, r.status_code, r.text[:200])
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "recursive_loop_detected"
        return r

    def loop(self, caller: str, n: int) -> list[int]:
        return [self.send(caller).status_code for _ in range(n)]

    def counter(self, name: str) -> int:
        return sum(e.counter(name) for e in self.envoys)

    def store_failures(self) -> int:
        return self.counter("loopguard.store_calls_total.result.unavailable") + self.counter(
            "loopguard.store_calls_total.result.reply"
        )

    def close(self) -> None:
        for c in self.clients:
            c.close()


def key_of(fleet: Fleet, caller: str) -> str:
    """Send the caller's first request and find the log key it made (the
    only new `:w` key): the caller's key and so its master."""
    before = {k for keys in fleet.cluster.keys_per_master("lg:*:w").values() for k in keys}
    assert fleet.send(caller).status_code == 200
    after = {k for keys in fleet.cluster.keys_per_master("lg:*:w").values() for k in keys}
    (key,) = after - before
    return key


def zcard(cluster: RedisCluster, key: str) -> int:
    return int(cluster.admin(cluster.master_of(key), "ZCARD", key).strip())


def test_a_master_killed_mid_run_fails_open_then_detection_resumes(own_cluster, upstream, start_envoy):
    fleet = Fleet(start_envoy, upstream, own_cluster)
    try:
        # 1. Loops under way: 18 callers, 3 hits each, spread over the
        #    replicas and (by their digests) over the masters.
        keys = {f"sk-before-{i}": None for i in range(18)}
        for caller in keys:
            keys[caller] = key_of(fleet, caller)
            assert fleet.loop(caller, 2) == [200, 200]
        masters = {k: own_cluster.master_of(k) for k in keys.values()}
        victim = max(set(masters.values()), key=lambda m: list(masters.values()).count(m))
        on_victim = [c for c, k in keys.items() if masters[k] == victim]
        assert len(on_victim) >= 3, masters
        acknowledged = {c: zcard(own_cluster, keys[c]) for c in on_victim}
        assert set(acknowledged.values()) == {3}
        assert fleet.store_failures() == 0
        noscript_before = fleet.counter("loopguard.store_calls_total.result.noscript")

        # 2. Kill the master; keep sending new loops (their keys on every
        #    shard) until the replica has taken over and Envoy routes to it:
        #    no store call failed in the last QUIET_ROUNDS rounds after the
        #    promotion. (Envoy learns the new topology from a node it picks at
        #    random among those it knows, the dead one included, so how long
        #    that takes varies from run to run.)
        promoted: dict[str, float] = {}
        kill = own_cluster.kill_master(victim)

        def watch() -> None:
            promoted["at"] = own_cluster.wait_promoted(kill.replica, timeout=30)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        gap_codes: list[tuple[float, str, int]] = []
        round_ = 0
        quiet = 0
        last_failed_at = kill.at
        while time.monotonic() - kill.at < DEADLINE_S:
            failures_before = fleet.store_failures()
            for i in range(6):
                caller = f"sk-gap-{round_}-{i}"
                for _ in range(2):
                    r = fleet.send(caller)
                    gap_codes.append((time.monotonic() - kill.at, caller, r.status_code))
            round_ += 1
            if fleet.store_failures() > failures_before:
                last_failed_at, quiet = time.monotonic(), 0
            elif "at" in promoted:
                quiet += 1
            if quiet >= QUIET_ROUNDS and time.monotonic() - promoted["at"] > 1.0:
                break
            time.sleep(0.1)  # the rounds' pace
        watcher.join(timeout=1)
        assert "at" in promoted, "the replica was not promoted"
        assert quiet >= QUIET_ROUNDS, f"store calls still failed {DEADLINE_S} s after the kill"
        promotion_s = promoted["at"] - kill.at
        routed_s = max(0.0, last_failed_at - promoted["at"])
        failed = fleet.store_failures()
        fallbacks = fleet.counter("loopguard.store_fallback_total.action.local")
        # What the gap cost: store calls failed, each counted locally instead.
        assert failed > 0, "the dead shard's keys never failed: was the victim's slot range hit?"
        assert fallbacks == failed
        assert fleet.counter("loopguard.store_fail_open_total") == 0
        assert all(code == 200 for _, _, code in gap_codes), "two hits per gap caller: never a loop"

        # 3. After the promotion: the loops under way continue from the
        #    counts the replica had (asynchronous replication: hits in flight
        #    at the kill may be lost; none were in flight here).
        kept = {c: zcard(own_cluster, keys[c]) for c in on_victim}
        lost = sum(acknowledged[c] - kept[c] for c in on_victim)
        for caller in on_victim:
            missing = acknowledged[caller] - kept[caller]
            assert fleet.loop(caller, 2 + missing) == [200] * (1 + missing) + [429], caller
        # The new master had no script cached: it got it in full once (a
        # call or two in flight at once may each meet NOSCRIPT), and then
        # by SHA1.
        noscript = fleet.counter("loopguard.store_calls_total.result.noscript") - noscript_before
        assert 1 <= noscript <= 3, noscript
        # New loops on every shard: exact again, rejected at the 5th overall.
        after_failures = fleet.store_failures()
        for i in range(12):
            assert fleet.loop(f"sk-after-{i}", 6) == [200] * 4 + [429] * 2
        assert fleet.store_failures() == after_failures

        failed_times = sorted(t for t, _, _ in gap_codes)
        print(
            f"\nfailover: master :{victim} killed; replica :{kill.replica} promoted after {promotion_s:.1f} s; "
            f"last failed store call {routed_s:.1f} s after the promotion; "
            f"{len(gap_codes)} requests during the run of the gap, none failed; "
            f"{failed} store calls failed and were counted locally ({fallbacks} fallbacks); "
            f"{lost} of {sum(acknowledged.values())} acknowledged hits on the killed master lost; "
            f"{noscript} NOSCRIPT resends; gap traffic ran {failed_times[-1]:.1f} s"
        )
    finally:
        fleet.close()


def test_redis_proxy_and_webdis_restarts_fail_open_and_sharing_resumes(own_cluster, upstream, start_envoy):
    fleet = Fleet(start_envoy, upstream, own_cluster)
    try:
        assert fleet.loop("sk-warm", 6) == [200] * 4 + [429] * 2
        for what, stop, start in [
            ("redis_proxy", own_cluster.stop_proxy, own_cluster.start_proxy),
            ("webdis", own_cluster.stop_webdis, own_cluster.start_webdis),
        ]:
            failed_before = fleet.store_failures()
            ok_before = fleet.counter("loopguard.store_calls_total.result.ok")
            stop()
            # While it is away: each replica counts on its own. A loop
            # spread over the 3 replicas needs 5 hits on one replica, so it
            # goes on longer, but no request fails.
            codes = fleet.loop(f"sk-{what}-down", 6)
            assert codes == [200] * 6, codes
            assert fleet.counter("loopguard.store_calls_total.result.ok") == ok_before
            # A loop on one replica is still caught by its own table.
            one = [fleet.send(f"sk-{what}-one", replica=0).status_code for _ in range(6)]
            assert one == [200] * 4 + [429] * 2, one
            failed = fleet.store_failures() - failed_before
            assert failed == 12
            t0 = time.monotonic()
            start()
            # webdis reconnects to redis_proxy by itself: the first shared
            # answer comes within a second or so.

            def shared_again() -> bool:
                """A probe (a caller of its own) answered from the store."""
                probe = fleet.send(f"sk-{what}-probe-{int((time.monotonic() - t0) * 1000)}")
                assert probe.status_code == 200
                return fleet.counter("loopguard.store_calls_total.result.ok") > ok_before

            assert wait_for(shared_again, timeout=15), f"sharing did not resume after the {what} restart"
            recovered = time.monotonic() - t0
            # Every connection webdis holds is back, not only the one that answered.
            assert wait_for(own_cluster.webdis.answers, timeout=10), f"webdis did not reconnect every thread after the {what} restart"
            assert fleet.loop(f"sk-{what}-after", 6) == [200] * 4 + [429] * 2
            print(f"\n{what} restart: {failed} store calls failed open while it was away; shared counts again {recovered:.2f} s after its start")
    finally:
        fleet.close()
