"""The shared store as the tests run it: Redis and webdis started on free
loopback ports with the shipped function and the shipped, locked-down
configuration (examples/cluster/redis.conf and webdis.json, only ports and
files moved), stopped by PID; a slow stand-in for webdis; the store's
configuration and Envoy cluster; replicas of loopguard sharing a store, and
the scenarios several files run on them; examples/cluster/run.sh.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from harness import (
    ENVOY,
    ROOT,
    ROUTER,
    Answer,
    Upstream,
    bootstrap,
    buffer_filter,
    free_port,
    load_yaml,
    localize,
    loopguard_filter,
    stop_process,
    wait_for,
)

FUNCTION = ROOT / "envoy" / "redis" / "loopguard.lua"
REDIS_CONF = ROOT / "examples" / "cluster" / "redis.conf"
WEBDIS_CONF = ROOT / "examples" / "cluster" / "webdis.json"
# The servers the store tests start (missing ones are a failure: make test
# installs them).
SERVERS = ("redis-server", "redis-cli", "webdis")
# The store as the tests configure it: a timeout generous for correctness
# tests on a busy 2-core machine (the point there is the shared count, and a
# timeout would silently count locally instead).
STORE = {"type": "redis_webdis", "cluster": "loopguard_redis", "timeout_ms": 1000}
ADMIN_USER = "loopguard-admin"
ADMIN_PASSWORD = re.search(r"^user loopguard-admin on >(\S+)", REDIS_CONF.read_text(), re.M).group(1)
# webdis authenticates as the default user with this password.
WEBDIS_PASSWORD = json.loads(WEBDIS_CONF.read_text())["redis_auth"]


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 10.0) -> None:
    """Wait until `proc` listens on the loopback `port`."""

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} at startup")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    if not wait_for(listening, timeout):
        raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}")


class Redis:
    """A redis-server with loopguard's function loaded."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="loopguard-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        # The shipped configuration with this test's port and files.
        conf = re.sub(r"^port .*$", f"port {self.port}", REDIS_CONF.read_text(), flags=re.M)
        conf += f"\ndir {self.dir}\nlogfile {self.dir / 'redis.log'}\n"
        (self.dir / "redis.conf").write_text(conf)

    def start(self) -> "Redis":
        self.proc = subprocess.Popen(
            ["redis-server", str(self.dir / "redis.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        _wait_port(self.port, self.proc, "redis-server")
        # Functions are not persisted (save ""): load on every start.
        out = self.admin("FUNCTION", "LOAD", "REPLACE", stdin=FUNCTION.read_text())
        if out.strip() != "loopguard":
            raise RuntimeError(f"FUNCTION LOAD answered {out!r}")
        return self

    def admin(self, *args: str, stdin: str | None = None) -> str:
        """Run a command as the admin user (stdin, if given, is the last
        argument, as with `redis-cli -x`)."""
        cmd = ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "--user", ADMIN_USER]
        cmd += ["--pass", ADMIN_PASSWORD, "--no-auth-warning"]
        if stdin is not None:
            cmd.append("-x")
        r = subprocess.run(cmd + list(args), input=stdin, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli {args[:2]} failed: {r.stderr}")
        return r.stdout

    def pipe(self, commands) -> list[str]:
        """Run many admin commands in one redis-cli; one answer per line."""
        cmd = ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), "--user", ADMIN_USER]
        cmd += ["--pass", ADMIN_PASSWORD, "--no-auth-warning"]
        r = subprocess.run(cmd, input="\n".join(commands) + "\n", capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"redis-cli failed: {r.stderr}")
        return r.stdout.split("\n")[:-1]

    def as_default_user(self, *args: str, password: str | None = WEBDIS_PASSWORD) -> str:
        auth = ["--pass", password, "--no-auth-warning"] if password else []
        r = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *auth, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return r.stdout + r.stderr

    def keys(self, pattern: str = "*") -> list[str]:
        # SCAN, not KEYS: the test may hold many keys.
        return self.admin("--scan", "--pattern", pattern).split()

    def dbsize(self) -> int:
        return int(self.admin("DBSIZE").strip())

    def flush(self) -> None:
        self.admin("FLUSHALL")

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Webdis:
    """webdis in front of a Redis, enabling only FCALL and PING."""

    def __init__(self, redis_port: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="loopguard-webdis-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        conf = json.loads(WEBDIS_CONF.read_text())
        conf.update(redis_port=redis_port, http_port=self.port, logfile=str(self.dir / "webdis.log"))
        (self.dir / "webdis.json").write_text(json.dumps(conf, indent=1))

    def start(self) -> "Webdis":
        self.proc = subprocess.Popen(
            ["webdis", str(self.dir / "webdis.json")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
        )
        _wait_port(self.port, self.proc, "webdis")
        return self

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def answers(self, tries: int = 4) -> bool:
        """True when `tries` PINGs in a row, each on a new connection, are
        answered. webdis runs two threads, each with its own pool of Redis
        connections that reconnect on their own schedule, and a new
        connection lands on either thread: one answered call does not mean
        the next will be."""
        for _ in range(tries):
            try:
                r = httpx.get(f"http://127.0.0.1:{self.port}/PING", timeout=2)
            except httpx.HTTPError:
                return False
            if r.status_code != 200 or r.json() != {"PING": [True, "PONG"]}:
                return False
        return True

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def webdis_cluster(port: int, name: str = "loopguard_redis") -> dict:
    """The Envoy cluster loopguard calls webdis through."""
    return {
        "name": name,
        "connect_timeout": "0.25s",
        "type": "STATIC",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}
                    ]
                }
            ],
        },
    }


def with_store_cluster(config: dict, port: int, name: str = "loopguard_redis") -> dict:
    config["static_resources"]["clusters"].append(webdis_cluster(port, name))
    return config


class SlowWebdis:
    """A stand-in for a webdis that answers every call after `delay`
    seconds (its slowness is the point): as a function call that found no
    loop. Envoy opens one connection per waiting call."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.upstream = Upstream(self.respond, methods=("POST",))
        self.port = self.upstream.port

    def respond(self, request: dict) -> Answer:
        time.sleep(self.delay)  # the store's pace
        return Answer(200, b'{"FCALL":[1,0,0,-1]}', {"content-type": "application/json"})

    def stop(self) -> None:
        self.upstream.stop()


# --- replicas sharing a store -------------------------------------------------


def replicas(start_envoy, upstream, webdis_port, cfg, n=2, concurrency=2, timing=False, **kw):
    """`n` Envoys with loopguard configured by `cfg` (its store's cluster
    pointing at `webdis_port`) in front of `upstream` (anything with a
    port); `kw` go to harness.bootstrap."""
    return [
        start_envoy(
            with_store_cluster(bootstrap(cfg, upstream.port, **kw), webdis_port),
            concurrency=concurrency,
            name=f"replica-{i}",
            timing=timing,
        )
        for i in range(n)
    ]


def named_replica(start_envoy, upstream, webdis_port, cfg, plugin_name):
    """A replica whose loopguard plugin has another name (another deployment)."""
    filters = [loopguard_filter(cfg, name=plugin_name), buffer_filter(), ROUTER]
    config = with_store_cluster(bootstrap(None, upstream.port, http_filters=filters), webdis_port)
    return start_envoy(config, name=plugin_name)


def no_fallback(envoys) -> None:
    """Every store call of every replica was answered: none fell back."""
    for e in envoys:
        assert e.counter("loopguard.store_fallback_total") == 0, e.name
        assert e.counter("loopguard.store_calls_total.result.unavailable") == 0, e.name


def example_trips_the_sdk_on_the_5th(start_envoy, example_path, webdis_port: int) -> list:
    """Two replicas of a shipped example (ports moved) in front of the
    store's webdis: an agent whose identical call goes to them in turn gets
    the SDK's RateLimitError on the 5th call overall, every call counted in
    the store. The replicas, for more checks."""
    example = load_yaml(example_path)
    envoys = [start_envoy(localize(example, {"loopguard_redis": webdis_port}), name=f"replica-{i}") for i in range(2)]
    clients = [openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-test-cluster", max_retries=0) for e in envoys]
    call = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "same question"}]}
    for i in range(4):
        assert clients[i % 2].chat.completions.create(**call).choices[0].message.content
    with pytest.raises(openai.RateLimitError) as caught:
        clients[0].chat.completions.create(**call)
    assert caught.value.code == "recursive_loop_detected"
    assert sum(e.counter("loopguard.store_calls_total.result.ok") for e in envoys) == 5
    return envoys


def port_free(port: int) -> bool:
    """Whether nothing listens on the loopback port."""
    with socket.socket() as s:
        # SO_REUSEADDR: connections in TIME_WAIT do not count, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@contextmanager
def run_example(ports: list[int], ready, **env: str):
    """examples/cluster/run.sh (what `make run-cluster` runs) on its fixed
    `ports` (skipped if any is taken), ready once `ready(line)` holds for a
    line it prints; yields its output lines. On leaving, it is stopped with
    SIGTERM and must have freed every port."""
    if not all(port_free(p) for p in ports):
        pytest.skip("the example's fixed ports are in use here")
    proc = subprocess.Popen(
        [str(ROOT / "examples" / "cluster" / "run.sh")],
        env={**os.environ, "ENVOY": ENVOY, **env},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    up = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if ready(line):
                up.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert up.wait(60), "".join(lines[-50:])
        yield lines
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) is not None
        assert all(port_free(p) for p in ports), "run.sh left a server running"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
