"""A Redis Cluster behind Envoy's redis_proxy and webdis, for the cluster
store tests: six redis-server nodes (3 masters, 3 replicas), one Envoy
running only the redis_proxy listener, and webdis in front of it, all on
free loopback ports and stopped by PID. The shipped, locked-down
configuration of examples/cluster/cluster (redis-node.conf, redis-proxy.yaml,
webdis.json) is used with only ports and files moved.

    loopguard ─HTTP─> webdis ─RESP─> Envoy redis_proxy ─> Redis Cluster
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness import ROOT, Envoy, free_port, stop_process, wait_for
from shared_store import Webdis, _wait_port, webdis_cluster

EXAMPLE = ROOT / "examples" / "cluster" / "cluster"
NODE_CONF = EXAMPLE / "redis-node.conf"
PROXY_CONF = EXAMPLE / "redis-proxy.yaml"
WEBDIS_CONF = EXAMPLE / "webdis.json"


def _user_password(user: str) -> str:
    return re.search(rf"^user {re.escape(user)} on >(\S+)", NODE_CONF.read_text(), re.M).group(1)


ADMIN_USER = "loopguard-admin"
ADMIN_PASSWORD = _user_password(ADMIN_USER)
# The user Envoy's redis_proxy logs in to every node as.
PROXY_USER = "loopguard-proxy"
PROXY_PASSWORD = _user_password(PROXY_USER)
# webdis authenticates to the redis_proxy listener with this password.
WEBDIS_PASSWORD = json.loads(WEBDIS_CONF.read_text())["redis_auth"]

MASTERS = 3
NODES = 6


@dataclass
class Node:
    """A node as the cluster sees it (CLUSTER NODES)."""

    port: int
    id: str
    role: str  # "master" or "replica"
    master_port: int | None  # a replica's master
    slots: list[tuple[int, int]]  # a master's slot ranges
    failed: bool
    myself: bool  # the node that answered


@dataclass
class Kill:
    """A master killed with SIGKILL, and the replica expected to take over."""

    port: int
    replica: int
    at: float  # time.monotonic() of the kill


class _ProxyWebdis(Webdis):
    """webdis in front of the redis_proxy listener, from the cluster's
    webdis.json (EVALSHA, EVAL and PING only)."""

    def __init__(self, proxy_port: int, port: int, directory: Path) -> None:
        self.dir = directory
        self.port = port
        self.proc = None
        conf = json.loads(WEBDIS_CONF.read_text())
        conf.update(redis_port=proxy_port, http_port=port, logfile=str(directory / "webdis.log"))
        (directory / "webdis.json").write_text(json.dumps(conf, indent=1))


class RedisCluster:
    """Six nodes, the redis_proxy Envoy and webdis; `start()` brings them up,
    `cleanup()` stops every process by PID and removes the files."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="loopguard-redis-cluster-"))
        self.ports = [free_port() for _ in range(NODES)]
        self.procs: dict[int, subprocess.Popen | None] = {p: None for p in self.ports}
        self.proxy_port = free_port()
        self.proxy_admin_port = free_port()
        self.webdis_port = free_port()
        self.proxy: Envoy | None = None
        self._proxies: list[Envoy] = []
        self.webdis: _ProxyWebdis | None = None
        self.startup_seconds: float | None = None
        shipped = [int(p) for p in re.findall(r"^port (\d+)", NODE_CONF.read_text(), re.M)]
        assert len(shipped) == 1, "redis-node.conf should name one port"
        for port in self.ports:
            node_dir = self.dir / f"node-{port}"
            node_dir.mkdir()
            # The shipped node configuration with this node's ports and files.
            # The cluster bus gets a free port of its own (Redis's default,
            # port + 10000, may be taken here).
            conf = re.sub(r"^port .*$", f"port {port}", NODE_CONF.read_text(), flags=re.M)
            conf += f"\ncluster-port {free_port()}\ndir {node_dir}\nlogfile {node_dir / 'redis.log'}\n"
            (node_dir / "redis.conf").write_text(conf)
        (self.dir / "webdis").mkdir()

    # --- startup -------------------------------------------------------------

    def start(self) -> "RedisCluster":
        t0 = time.monotonic()
        try:
            for port in self.ports:
                self._start_node(port)
            for port in self.ports:
                _wait_port(port, self.procs[port], f"redis-server :{port}")
            self._create()
            self.start_proxy()
            self.start_webdis()
        except BaseException:
            self.cleanup()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _start_node(self, port: int) -> None:
        node_dir = self.dir / f"node-{port}"
        self.procs[port] = subprocess.Popen(
            ["redis-server", str(node_dir / "redis.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=node_dir,
        )

    def _create(self) -> None:
        """redis-cli --cluster create (as the admin): the first three nodes
        become masters, one replica each; then wait until the cluster has
        settled (wait_ok)."""
        r = subprocess.run(
            ["redis-cli", "--user", ADMIN_USER, "--pass", ADMIN_PASSWORD, "--no-auth-warning", "--cluster", "create"]
            + [f"127.0.0.1:{p}" for p in self.ports]
            + ["--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode != 0 or "[OK] All 16384 slots covered" not in r.stdout:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{r.stdout}\n{r.stderr}")
        self.wait_ok()

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Wait until the live nodes agree: each says cluster_state:ok, each
        master (they vote in failovers) sees every live node as that node
        sees itself (role and master, none failing), every node sees 3
        masters serving all slots, and every replica's link to its master is
        up."""
        last = ""

        def agreed() -> bool:
            nonlocal last
            try:
                last = self._disagreement()
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                last = str(e)
            return not last

        if not wait_for(agreed, timeout, interval=0.1):
            raise RuntimeError(f"the cluster did not settle within {timeout} s: {last}")

    def _disagreement(self) -> str:
        """What is not settled yet ("" when all is)."""
        alive = self.alive()
        views = {p: self._parse_nodes(self.admin(p, "CLUSTER", "NODES")) for p in alive}
        truth = {p: next((n.role, n.master_port) for n in view if n.myself) for p, view in views.items()}
        for p in alive:
            if "cluster_state:ok" not in self.admin(p, "CLUSTER", "INFO"):
                return f"{p} is not ok"
            seen = {n.port: n for n in views[p]}
            for q in alive if truth[p][0] == "master" else []:
                n = seen.get(q)
                if n is None or n.failed or (n.role, n.master_port) != truth[q]:
                    return f"{p} sees {q} as {n}, not {truth[q]}"
            masters = [n for n in views[p] if n.role == "master" and n.slots and not n.failed]
            if len(masters) != MASTERS or sum(b - a + 1 for n in masters for a, b in n.slots) != 16384:
                return f"{p} sees masters {masters}"
            if truth[p][0] == "replica" and "master_link_status:up" not in self.admin(p, "INFO", "replication"):
                return f"replica {p} is not in sync"
        return ""

    # --- redis-cli -------------------------------------------------------------

    def admin(self, port: int, *args: str, stdin: str | None = None) -> str:
        """Run a command on one node as the admin user (stdin, if given, is
        the last argument, as with `redis-cli -x`)."""
        cmd = ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "--user", ADMIN_USER, "--pass", ADMIN_PASSWORD]
        cmd += ["--no-auth-warning"] + (["-x"] if stdin is not None else [])
        r = subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli -p {port} {' '.join(args[:2])} failed: {r.stdout}{r.stderr}")
        return r.stdout

    def as_user(self, port: int, user: str, password: str, *args: str) -> str:
        """Run a command on one node as `user`: the answer or the error."""
        r = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), "--user", user, "--pass", password, "--no-auth-warning"]
            + list(args),
            capture_output=True,
            text=True,
            timeout=10,
        )
        return r.stdout + r.stderr

    def as_proxy_user(self, port: int, *args: str) -> str:
        """Run a command on one node as the redis_proxy's user."""
        return self.as_user(port, PROXY_USER, PROXY_PASSWORD, *args)

    # --- topology ----------------------------------------------------------------

    def alive(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc is not None and proc.poll() is None]

    @staticmethod
    def _parse_nodes(text: str) -> list[Node]:
        nodes = []
        for line in text.strip().splitlines():
            f = line.split()
            port = int(f[1].split("@")[0].rsplit(":", 1)[1])
            flags = f[2].split(",")
            slots = []
            for s in f[8:]:
                if s.startswith("["):  # a slot being migrated or imported
                    continue
                a, _, b = s.partition("-")
                slots.append((int(a), int(b or a)))
            nodes.append(
                Node(
                    port=port,
                    id=f[0],
                    role="master" if "master" in flags else "replica",
                    master_port=None,
                    slots=slots,
                    failed="fail" in flags or "fail?" in flags,
                    myself="myself" in flags,
                )
            )
        by_id = {n.id: n for n in nodes}
        for line, n in zip(text.strip().splitlines(), nodes):
            master_id = line.split()[3]
            if n.role == "replica" and master_id in by_id:
                n.master_port = by_id[master_id].port
        return nodes

    def nodes(self, via: int | None = None) -> list[Node]:
        """Every node with its role, as a live node (or `via`) sees it."""
        return self._parse_nodes(self.admin(via or self.alive()[0], "CLUSTER", "NODES"))

    def masters(self) -> list[int]:
        """The ports of the masters serving slots, lowest first slot first."""
        masters = [n for n in self.nodes() if n.role == "master" and n.slots and not n.failed]
        return [n.port for n in sorted(masters, key=lambda n: n.slots[0][0])]

    def replica_of(self, master: int) -> int:
        replica = next((n.port for n in self.nodes() if n.role == "replica" and n.master_port == master), None)
        if replica is None:
            raise RuntimeError(f"master {master} has no replica")
        return replica

    def keyslot(self, key: str) -> int:
        return int(self.admin(self.alive()[0], "CLUSTER", "KEYSLOT", key).strip())

    def keyslots(self, keys: list[str]) -> list[int]:
        """The slots of many keys, in one redis-cli."""
        cmd = ["redis-cli", "-p", str(self.alive()[0]), "--user", ADMIN_USER, "--pass", ADMIN_PASSWORD]
        lines = "".join(f"CLUSTER KEYSLOT {k}\n" for k in keys)
        r = subprocess.run(cmd + ["--no-auth-warning"], input=lines, capture_output=True, text=True, timeout=30)
        slots = [int(x) for x in r.stdout.split()]
        if r.returncode != 0 or len(slots) != len(keys):
            raise RuntimeError(f"CLUSTER KEYSLOT failed: {r.stdout[-500:]}{r.stderr}")
        return slots

    def slot_owners(self) -> dict[int, int]:
        """slot -> port of the live master serving it."""
        owners = {}
        for n in self.nodes():
            if n.role == "master" and not n.failed:
                for a, b in n.slots:
                    owners.update(dict.fromkeys(range(a, b + 1), n.port))
        return owners

    def master_of(self, key: str) -> int:
        """The port of the master serving the slot of `key`."""
        slot = self.keyslot(key)
        for n in self.nodes():
            if n.role == "master" and not n.failed and any(a <= slot <= b for a, b in n.slots):
                return n.port
        raise RuntimeError(f"no live master serves slot {slot} of {key!r}")

    def keys_per_master(self, pattern: str = "lg:*") -> dict[int, list[str]]:
        """The keys matching `pattern` on each master (SCAN)."""
        return {p: sorted(self.admin(p, "--scan", "--pattern", pattern).split()) for p in self.masters()}

    def flush(self) -> None:
        """FLUSHALL on every master (the replicas follow)."""
        for p in self.masters():
            self.admin(p, "FLUSHALL")

    def script_flush(self) -> None:
        """Forget every cached script on every master: the next EVALSHA
        answers NOSCRIPT, as after a failover or a restart."""
        for p in self.masters():
            self.admin(p, "SCRIPT", "FLUSH")

    # --- faults ----------------------------------------------------------------

    def kill_master(self, port: int) -> Kill:
        """SIGKILL a master; its replica should take over after
        cluster-node-timeout (5 s) plus the election (~1 s)."""
        replica = self.replica_of(port)
        proc = self.procs[port]
        assert proc is not None and proc.poll() is None, f"node {port} is not running"
        os.kill(proc.pid, signal.SIGKILL)
        at = time.monotonic()
        proc.wait(5)
        return Kill(port=port, replica=replica, at=at)

    def wait_promoted(self, replica_port: int, timeout: float = 20.0) -> float:
        """Wait until `replica_port` is a master serving slots and the
        cluster is ok; return time.monotonic() when it was seen a master."""
        deadline = time.monotonic() + timeout

        def master() -> bool:
            try:
                me = next(n for n in self.nodes(via=replica_port) if n.port == replica_port)
            except (RuntimeError, subprocess.TimeoutExpired):
                return False
            return me.role == "master" and bool(me.slots)

        if not wait_for(master, timeout):
            raise RuntimeError(f"node {replica_port} was not promoted within {timeout} s")
        seen = time.monotonic()
        self.wait_ok(max(1.0, deadline - time.monotonic()))
        return seen

    def restart_node(self, port: int, timeout: float = 20.0) -> None:
        """Start a stopped node again with its own nodes.conf: it rejoins, as
        a replica of whoever took over its slots."""
        assert port not in self.alive(), f"node {port} is running"
        self._start_node(port)
        _wait_port(port, self.procs[port], f"redis-server :{port}")
        self.wait_ok(timeout)

    def stop_node(self, port: int) -> None:
        stop_process(self.procs[port])

    def start_proxy(self) -> Envoy:
        """Start the redis_proxy Envoy (again) on its ports; ready once it has
        discovered the cluster."""
        cfg = yaml.safe_load(PROXY_CONF.read_text())
        cfg["admin"]["address"]["socket_address"].update(address="127.0.0.1", port_value=self.proxy_admin_port)
        (listener,) = cfg["static_resources"]["listeners"]
        (proxy_filter,) = listener["filter_chains"][0]["filters"]
        passwords = [p["inline_string"] for p in proxy_filter["typed_config"]["downstream_auth_passwords"]]
        assert passwords == [WEBDIS_PASSWORD], "webdis.json's redis_auth should be redis-proxy.yaml's password"
        listener["address"]["socket_address"].update(address="127.0.0.1", port_value=self.proxy_port)
        (cluster,) = cfg["static_resources"]["clusters"]
        (group,) = cluster["load_assignment"]["endpoints"]
        assert len(group["lb_endpoints"]) == NODES, "redis-proxy.yaml should list every node as a seed"
        for ep, port in zip(group["lb_endpoints"], self.ports):
            ep["endpoint"]["address"]["socket_address"].update(address="127.0.0.1", port_value=port)
        self.proxy = Envoy(cfg, concurrency=1, name="redis_proxy")
        self._proxies.append(self.proxy)
        return self.proxy.start()

    def stop_proxy(self) -> None:
        if self.proxy:
            self.proxy.stop()

    def proxy_stat(self, name: str) -> int:
        """A statistic of the redis_proxy's cluster (e.g.
        upstream_internal_redirect_succeeded_total)."""
        (cluster,) = yaml.safe_load(PROXY_CONF.read_text())["static_resources"]["clusters"]
        return self.proxy.stats()[f"cluster.{cluster['name']}.{name}"]

    def proxy_log(self) -> str:
        return "\n".join(e.log() for e in self._proxies)

    def start_webdis(self) -> None:
        self.webdis = _ProxyWebdis(self.proxy_port, self.webdis_port, self.dir / "webdis")
        self.webdis.start()

    def stop_webdis(self) -> None:
        if self.webdis:
            self.webdis.stop()

    def webdis_log(self) -> str:
        try:
            return (self.dir / "webdis" / "webdis.log").read_text(errors="replace")
        except OSError:
            return ""

    def store_cluster(self, name: str = "loopguard_redis") -> dict:
        """The Envoy cluster loopguard calls this cluster's webdis through."""
        return webdis_cluster(self.webdis_port, name)

    def cleanup(self) -> None:
        self.stop_webdis()
        for e in self._proxies:
            e.stop()
            shutil.rmtree(e.dir, ignore_errors=True)
        for port in self.ports:
            stop_process(self.procs[port])
            self.procs[port] = None
        shutil.rmtree(self.dir, ignore_errors=True)
