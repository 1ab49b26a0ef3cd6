"""The cluster store's path on its own (no loopguard yet): HTTP to webdis,
Envoy's redis_proxy, a 3-master/3-replica Redis Cluster, all from the
shipped configuration in examples/cluster/cluster. Calls are sent as
loopguard sends them: a POST body `EVAL/<script>/<n keys>/<keys>/<args>`
with every part percent-encoded."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
import uuid

import httpx
import pytest

from harness import wait_for
from redis_cluster import RedisCluster
from shared_store import run_example


# Redis, redis-cli and webdis must be installed: a failure, never a skip.
pytestmark = pytest.mark.usefixtures("servers_installed")


@pytest.fixture(autouse=True)
def flushed(request):
    """The module's cluster flushed for each test that uses it, with the
    redis_proxy's and webdis's logs if the test failed (fresh_cluster)."""
    if "cluster" in request.fixturenames:
        request.getfixturevalue("fresh_cluster")


def encode_arg(arg: str) -> str:
    """As loopguard encodes a webdis argument (crates/core/src/state/redis/wire.rs
    encode_arg): all but unreserved characters and `:{}` percent-encoded."""
    keep = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_~:{}")
    return "".join(chr(b) if b in keep else f"%{b:02X}" for b in arg.encode())


def command(*parts: str) -> str:
    return "/".join([parts[0], *(encode_arg(p) for p in parts[1:])])


def call(cluster: RedisCluster, *parts: str, timeout: float = 5.0) -> httpx.Response:
    """POST one command to webdis, as loopguard does."""
    return httpx.post(f"http://127.0.0.1:{cluster.webdis_port}/", content=command(*parts), timeout=timeout)


def tag() -> str:
    return uuid.uuid4().hex


# Sets each key to its argument; answers the keys and the argument.
SET_BOTH = "for i, k in ipairs(KEYS) do redis.call('SET', k, ARGV[1]) end return {KEYS[1], KEYS[#KEYS], ARGV[1]}"
INCR_LIKE = "local n = tonumber(redis.call('GET', KEYS[1]) or '0') + 1 redis.call('SET', KEYS[1], n) return n"


def test_eval_with_a_hash_tag_lands_on_the_master_owning_its_slot(cluster):
    t = tag()
    keys = [f"lg:path:{{{t}}}:w", f"lg:path:{{{t}}}:cd"]
    # '/', '?', '.', '+' and spaces survive the encoding.
    arg = "a/b?c.d+e f"
    r = call(cluster, "EVAL", SET_BOTH, "2", *keys, arg)
    assert r.status_code == 200, r.text
    assert r.json() == {"EVAL": [keys[0], keys[1], arg]}
    owner = cluster.master_of(keys[0])
    assert cluster.master_of(keys[1]) == owner
    placed = cluster.keys_per_master()
    assert placed[owner] == sorted(keys)
    assert all(not ks for port, ks in placed.items() if port != owner), placed


def test_evalsha_of_an_unloaded_script_answers_noscript_until_an_eval_caches_it(cluster):
    key = f"lg:path:{{{tag()}}}:w"
    sha = hashlib.sha1(INCR_LIKE.encode()).hexdigest()
    noscript = {"EVALSHA": [False, "NOSCRIPT No matching script. Please use EVAL."]}
    assert call(cluster, "EVALSHA", sha, "1", key).json() == noscript
    # The fallback loopguard uses: EVAL runs the script and caches it on the
    # node, under the SHA1 of its exact bytes.
    assert call(cluster, "EVAL", INCR_LIKE, "1", key).json() == {"EVAL": 1}
    assert call(cluster, "EVALSHA", sha, "1", key).json() == {"EVALSHA": 2}
    # The cache is per node and memory only: flushed (as after a failover
    # or a restart), EVALSHA answers NOSCRIPT again; the key survives.
    cluster.script_flush()
    assert call(cluster, "EVALSHA", sha, "1", key).json() == noscript
    assert call(cluster, "EVAL", INCR_LIKE, "1", key).json() == {"EVAL": 3}


def test_webdis_refuses_every_command_but_evalsha_eval_and_ping(cluster):
    key = f"lg:path:{{{tag()}}}:w"
    assert call(cluster, "PING").json() == {"PING": [True, "PONG"]}
    refused = [
        ("FCALL", "loopguard_hit", "1", key, "1"),
        ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('f', function() return 1 end)"),
        ("GET", key),
        ("SET", key, "1"),
        ("KEYS", "*"),
        ("FLUSHALL",),
        ("SCRIPT", "FLUSH"),
        ("SCRIPT", "LOAD", INCR_LIKE),
        ("CLUSTER", "NODES"),
        ("CONFIG", "GET", "*"),
        ("EVAL_RO", INCR_LIKE, "1", key),
    ]
    for parts in refused:
        r = call(cluster, *parts)
        assert (r.status_code, r.text) == (403, ""), parts
    assert cluster.keys_per_master() == {p: [] for p in cluster.masters()}


def test_a_cross_slot_eval_answers_crossslot(cluster):
    keys = [f"lg:path:{{{tag()}}}:w", f"lg:path:{{{tag()}}}:w"]
    assert len({cluster.keyslot(k) for k in keys}) == 2
    r = call(cluster, "EVAL", SET_BOTH, "2", *keys, "x")
    assert r.json() == {"EVAL": [False, "CROSSSLOT Keys in request don't hash to the same slot"]}
    assert cluster.keys_per_master() == {p: [] for p in cluster.masters()}


def test_redis_acl_confines_scripts_to_lg_keys_and_the_listed_commands(cluster):
    t = tag()
    # A declared key outside lg:*.
    r = call(cluster, "EVAL", "return redis.call('GET', KEYS[1])", "1", f"other:{{{t}}}")
    no_key = "NOPERM this user has no permissions to access one of the keys used as arguments"
    assert r.json() == {"EVAL": [False, no_key]}
    # An undeclared key outside lg:* in the same slot, written inside the script.
    r = call(cluster, "EVAL", f"return redis.call('SET', 'other:{{{t}}}', 1)", "1", f"lg:path:{{{t}}}:w")
    (reply,) = r.json().values()
    assert reply[0] is False and "can't access at least one of the keys" in reply[1], reply
    # A command the loopguard script does not use, on an lg: key.
    r = call(cluster, "EVAL", "return redis.call('DEL', KEYS[1])", "1", f"lg:path:{{{t}}}:w")
    (reply,) = r.json().values()
    assert reply[0] is False and "can't run this command" in reply[1], reply
    assert all(cluster.admin(p, "DBSIZE").strip() == "0" for p in cluster.masters())


def test_nodes_and_the_proxy_refuse_everyone_but_their_users(cluster):
    """Sent straight to a node as the redis_proxy's user, what the script
    does not need is refused by Redis's ACL; the default user is off; the
    redis_proxy listener wants webdis's password first."""
    node = cluster.masters()[0]
    for parts in (
        ["FLUSHALL"],
        ["KEYS", "*"],
        ["SCRIPT", "FLUSH"],
        ["SCRIPT", "LOAD", "return 1"],
        ["FCALL", "loopguard_hit", "0"],
        ["FUNCTION", "LIST"],
        ["CONFIG", "SET", "maxmemory", "0"],
        ["CLUSTER", "NODES"],
        ["CLUSTER", "FAILOVER"],
        ["PING"],
        ["DEL", "lg:x"],
    ):
        answer = cluster.as_proxy_user(node, *parts).strip()
        assert answer.startswith("NOPERM this user has no permissions to run the"), (parts, answer)
    assert cluster.as_proxy_user(node, "GET", "other").strip() == (
        "NOPERM this user has no permissions to access one of the keys used as arguments"
    )
    # The discovery command Envoy needs.
    assert "127.0.0.1" in cluster.as_proxy_user(node, "CLUSTER", "SLOTS")
    assert "NOAUTH" in cluster.as_user(node, "default", "", "PING")
    with socket.create_connection(("127.0.0.1", cluster.proxy_port), timeout=5) as s:
        s.sendall(b"*2\r\n$4\r\nPING\r\n$1\r\nx\r\n")
        assert s.recv(100) == b"-NOAUTH Authentication required.\r\n"
        s.sendall(b"*2\r\n$4\r\nAUTH\r\n$5\r\nwrong\r\n")
        assert s.recv(100) == b"-ERR invalid password\r\n"


def test_300_keys_spread_over_all_three_masters(cluster):
    keys = [f"lg:x:{{{tag()}}}:w" for _ in range(300)]
    with httpx.Client(base_url=f"http://127.0.0.1:{cluster.webdis_port}", timeout=5) as client:
        for k in keys:
            r = client.post("/", content=command("EVAL", SET_BOTH, "1", k, "1"))
            assert r.json() == {"EVAL": [k, k, "1"]}
    owners = cluster.slot_owners()
    expected: dict[int, list[str]] = {p: [] for p in cluster.masters()}
    for k, slot in zip(keys, cluster.keyslots(keys)):
        expected[owners[slot]].append(k)
    placed = cluster.keys_per_master()
    assert placed == {p: sorted(ks) for p, ks in expected.items()}
    # 100 each on average (binomial, sd 8): 60 is five sd below.
    assert len(placed) == 3 and all(len(ks) >= 60 for ks in placed.values()), {p: len(ks) for p, ks in placed.items()}


def test_an_ask_redirect_during_a_slot_migration_is_followed(cluster):
    """While a slot moves between masters, the old owner answers ASK for a
    key it does not hold; redis_proxy must send ASKING to the new one (the
    proxy user's +asking)."""
    key = f"lg:path:{{{tag()}}}:w"
    slot = str(cluster.keyslot(key))
    source = cluster.master_of(key)
    target = next(p for p in cluster.masters() if p != source)
    ids = {n.port: n.id for n in cluster.nodes()}
    try:
        cluster.admin(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[source])
        cluster.admin(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[target])
        r = call(cluster, "EVAL", SET_BOTH, "1", key, "moved")
        assert r.json() == {"EVAL": [key, key, "moved"]}
        assert cluster.admin(target, "CLUSTER", "COUNTKEYSINSLOT", slot).strip() == "1"
        assert cluster.admin(source, "CLUSTER", "COUNTKEYSINSLOT", slot).strip() == "0"
        assert cluster.proxy_stat("upstream_internal_redirect_succeeded_total") >= 1
    finally:
        cluster.admin(target, "CLUSTER", "SETSLOT", slot, "STABLE")
        cluster.admin(source, "CLUSTER", "SETSLOT", slot, "STABLE")
        cluster.admin(target, "FLUSHALL")


def test_redis_proxy_and_webdis_restarts(cluster):
    key = f"lg:path:{{{tag()}}}:w"
    assert call(cluster, "EVAL", INCR_LIKE, "1", key).json() == {"EVAL": 1}
    cluster.stop_proxy()
    # webdis without its Redis side answers 503 with an empty body.
    r = call(cluster, "EVAL", INCR_LIKE, "1", key)
    assert (r.status_code, r.text) == (503, "")
    cluster.start_proxy()
    # webdis reconnects by itself.

    def answered() -> bool:
        nonlocal r
        r = call(cluster, "EVAL", INCR_LIKE, "1", key)
        return r.status_code == 200

    wait_for(answered, timeout=10)
    assert r.json() == {"EVAL": 2}
    cluster.stop_webdis()
    with pytest.raises(httpx.ConnectError):
        call(cluster, "PING")
    cluster.start_webdis()
    assert call(cluster, "EVAL", INCR_LIKE, "1", key).json() == {"EVAL": 3}


NOSCRIPT = [False, "NOSCRIPT No matching script. Please use EVAL."]


def _poll(cluster: RedisCluster, keys: list[str], stop: threading.Event, results: list) -> None:
    """Call like loopguard until stopped: EVALSHA, then EVAL on NOSCRIPT.
    Records (time, key, answer): the script's count, "NOSCRIPT", or what
    went wrong."""
    sha = hashlib.sha1(INCR_LIKE.encode()).hexdigest()

    def send(client: httpx.Client, *parts: str):
        try:
            r = client.post("/", content=command(*parts))
        except httpx.HTTPError as e:
            return repr(e)
        return r.json().get(parts[0], r.text) if r.status_code == 200 else f"HTTP {r.status_code}"

    with httpx.Client(base_url=f"http://127.0.0.1:{cluster.webdis_port}", timeout=5) as client:
        while not stop.is_set():
            for k in keys:
                t = time.monotonic()
                answer = send(client, "EVALSHA", sha, "1", k)
                if answer == NOSCRIPT:
                    results.append((t, k, "NOSCRIPT"))
                    answer = send(client, "EVAL", INCR_LIKE, "1", k)
                results.append((t, k, answer))
            time.sleep(0.03)  # the poller's pace


def _errors(results: list) -> list:
    return [x for x in results if x[2] != "NOSCRIPT" and not isinstance(x[2], int)]


def test_a_graceful_failover_costs_no_errors_through_webdis(cluster):
    """CLUSTER FAILOVER on a replica: redis_proxy follows MOVED until its
    next refresh, so every call succeeds and counts once; the new master
    has no scripts cached (replicas never do), so it answers one NOSCRIPT,
    which EVAL answers."""
    t = tag()
    key = f"lg:path:{{{t}}}:w"
    master = cluster.master_of(key)
    replica = cluster.replica_of(master)
    other = next(f"lg:path:{{{x}}}:w" for x in iter(tag, None) if cluster.master_of(f"lg:path:{{{x}}}:w") != master)
    cluster.script_flush()
    results: list = []
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(cluster, [key, other], stop, results), daemon=True)
    poller.start()
    try:
        # The old master has met the key (and answered its NOSCRIPT) first.
        assert wait_for(lambda: any(x[1] == key and isinstance(x[2], int) for x in results), timeout=5), results[:5]
        assert cluster.admin(replica, "CLUSTER", "FAILOVER").strip() == "OK"
        cluster.wait_promoted(replica, timeout=8)
        assert cluster.master_of(key) == replica
        # The poller calls on across the switch: 20 more calls on the key.
        switched = len(results)
        assert wait_for(lambda: sum(1 for x in results[switched:] if x[1] == key) >= 20, timeout=10), results[switched:]
    finally:
        stop.set()
        poller.join(10)
    assert not _errors(results), _errors(results)[:10]
    on_key = [x for x in results if x[1] == key and x[2] != "NOSCRIPT"]
    assert len(on_key) > 20
    # Every hit counted once, in order, across the switch.
    assert [x[2] for x in on_key] == list(range(1, len(on_key) + 1))
    assert [x[1] for x in results if x[2] == "NOSCRIPT"].count(key) == 2  # the first call, then the new master


def test_a_killed_master_is_replaced_by_its_replica_and_rejoins_as_a_replica(cluster):
    """kill -9 of a master: its keys answer errors until the replica takes
    over (cluster-node-timeout 5 s plus the election), then work again;
    the restarted node comes back as a replica."""
    key = f"lg:path:{{{tag()}}}:w"
    assert call(cluster, "EVAL", INCR_LIKE, "1", key).json() == {"EVAL": 1}
    kill = cluster.kill_master(cluster.master_of(key))
    r = call(cluster, "EVAL", INCR_LIKE, "1", key)
    assert r.json() == {"EVAL": [False, "upstream failure"]}
    promoted = cluster.wait_promoted(kill.replica, timeout=20)
    assert 4.0 < promoted - kill.at < 20

    def counted() -> bool:
        nonlocal r
        r = call(cluster, "EVAL", INCR_LIKE, "1", key)
        return r.json() == {"EVAL": 2}

    wait_for(counted, timeout=10)
    assert r.json() == {"EVAL": 2}, r.text
    cluster.restart_node(kill.port)
    me = next(n for n in cluster.nodes() if n.port == kill.port)
    assert (me.role, me.master_port) == ("replica", kill.replica)


# The fixed ports of `CLUSTER=1 examples/cluster/run.sh`: nodes and their
# cluster bus, redis_proxy and its admin, webdis, the two replicas.
RUN_SH_PORTS = [*range(6400, 6407), *range(16401, 16407), 9930, 7390, 10010, 10011, 10020, 10021, 9910, 9920]


def test_run_sh_cluster_mode_brings_up_the_cluster_redis_proxy_and_webdis():
    """`CLUSTER=1 examples/cluster/run.sh` (what `make run-cluster CLUSTER=1`
    runs) on its fixed ports: the cluster side answers through webdis as
    configured; SIGTERM stops everything it started. (The loopguard replicas
    are test_redis.py's subject.)"""
    with run_example(
        RUN_SH_PORTS, lambda line: line.startswith("run-cluster: Redis Cluster") and "are up" in line, CLUSTER="1"
    ):
        webdis = "http://127.0.0.1:7390/"
        for t in ("a", "b", "c", "d"):
            key = f"lg:demo:{{{t}}}:w"
            r = httpx.post(webdis, content=command("EVAL", SET_BOTH, "1", key, t), timeout=5)
            assert r.json() == {"EVAL": [key, key, t]}, r.text
        assert httpx.post(webdis, content=command("FLUSHALL"), timeout=5).status_code == 403
