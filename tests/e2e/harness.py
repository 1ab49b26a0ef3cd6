"""End-to-end harness: real Envoy processes, the one upstream server class
(`Upstream`: records every request, answers as a handler says, plainly,
streamed or slowly), the built artifacts and the CLI, helpers.

Every process started here listens on loopback only, on free ports, and is
stopped by PID when its test ends.

Time in these tests (they must pass on a busy 2-CPU machine):
- Speed is never asserted (that is `make bench`); behaviour in time is: a
  throttle's delay, a window or cooldown expiring, the hold probe releasing a
  request, a store timeout bounding a wait, a reload backoff.
- Measure a wait where it happens: Envoy's own timing of the request
  (`Envoy(timing=True)`, `Envoy.timings()`), not the client's wall clock,
  which adds the client's and the upstream's scheduling.
- Lower bounds are tight: a throttle holds at least its delay minus
  CLOCK_SLACK; a wait that one of Envoy's own timers ends (a store call's
  timeout) at least that minus TIMER_SLACK. Upper bounds leave headroom
  (ENVOY_HEADROOM on Envoy's timings, more on the client's) yet stay below
  what a wrong implementation would do (no delay, a delay of the wrong step,
  waiting for the store instead of its timeout, Envoy's default backoff
  instead of the configured one).
- A schedule (`Schedule`) records when each request was really in flight and
  asserts against that. A step that ran so late that the outcome it asserts
  is no longer certain raises `Overrun`, and `on_schedule` runs the scenario
  again with fresh fingerprints instead of failing; margins around a window
  boundary are hundreds of ms, not tens.
- Wait for something to happen by polling with a deadline (`wait_for`), not
  with a fixed sleep before the assertion. To show that nothing more
  happens (no second alert, no late count), wait for what would cause it to
  be over: `Envoy.quiet()` (no request in flight, so every counter a
  finished request moves has moved). A sleep is left only where it is the
  traffic's pace (requests spaced across a window, a slow or streaming
  upstream, time that must pass for what a test shows).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterable

import h2.config
import h2.connection
import h2.events
import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
ENVOY = os.environ.get("LOOPGUARD_ENVOY", str(ROOT / ".venv" / "envoy"))
WASM = os.environ.get(
    "LOOPGUARD_WASM", str(ROOT / "target" / "wasm32-wasip1" / "release" / "loopguard.wasm")
)
NATIVE = os.environ.get("LOOPGUARD_NATIVE", str(ROOT / "target" / "release" / "libloopguard_native.so"))
# The builds with fault injection (a request header crashes the filter),
# where `make fault-build` puts them.
FAULT_WASM = os.environ.get("LOOPGUARD_FAULT_WASM", str(ROOT / "target" / "wasm32-wasip1" / "fault" / "loopguard.wasm"))
FAULT_NATIVE = os.environ.get("LOOPGUARD_FAULT_NATIVE", str(ROOT / "target" / "fault-native" / "libloopguard_native.so"))
# The loopguard CLI (`make cli`).
CLI = os.environ.get("LOOPGUARD_CLI", str(ROOT / "target" / "release" / "loopguard"))
# Which host the suite loads loopguard in: "wasm" (the proxy-wasm module) or
# "native" (the Envoy dynamic module). Tests build their filter with
# loopguard_filter(), which follows it (and localize() turns a shipped
# example's Wasm filter into the dynamic module); tests of the Wasm VM's own
# shapes (Istio, the VM's failure policy and reload, the OCI image) are
# marked skipif(HOST == "native") and skipped under the dynamic module.
# The supported Envoy releases (envoy/versions.txt): per minor, its
# release, its dynamic-module ABI ("-": none loopguard is built for) and
# the hosts tested on it.
ENVOY_VERSIONS = {
    fields[0]: fields
    for line in (ROOT / "envoy" / "versions.txt").read_text().splitlines()
    if (fields := line.split()) and not line.startswith("#")
}


def envoy_release(envoy: str = ENVOY) -> str:
    """The release of an Envoy binary, as `envoy --version` says it."""
    out = subprocess.run([envoy, "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"version: [0-9a-f]+/(\d+\.\d+\.\d+)/", out)
    if not found:
        raise RuntimeError(f"{envoy} --version says no release: {out!r}")
    return found.group(1)


def envoy_abi(envoy: str = ENVOY) -> str:
    """The dynamic-module ABI the Envoy under test speaks (envoy/versions.txt)."""
    release = envoy_release(envoy)
    return ENVOY_VERSIONS[".".join(release.split(".")[:2])][2]


HOST = os.environ.get("LOOPGUARD_HOST", "wasm")
if HOST not in ("wasm", "native"):
    raise RuntimeError(f"LOOPGUARD_HOST must be wasm or native, not {HOST!r}")


def cli(*args: str) -> subprocess.CompletedProcess:
    """The loopguard CLI run with `args` from the repository's root."""
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


COMPLETION = {
    "id": "chatcmpl-e2e",
    "object": "chat.completion",
    "created": 1767225600,
    "model": "e2e-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def stuck_model(request: dict) -> tuple[int, dict]:
    """A model stuck in a loop: whatever the conversation says, it calls the
    same tool with the same arguments again (with a fresh call id, as real
    models do). Speaks OpenAI Chat Completions and Anthropic Messages."""
    call = uuid.uuid4().hex[:24]
    if request["path"].endswith("/v1/messages"):
        return 200, {
            "id": f"msg_{call}",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-5-5",
            "content": [
                {"type": "text", "text": "Let me check the build status."},
                {"type": "tool_use", "id": f"toolu_{call}", "name": "get_build_status", "input": {"branch": "main"}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 10},
        }
    return 200, {
        "id": f"chatcmpl-{call}",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{call}",
                            "type": "function",
                            "function": {"name": "get_build_status", "arguments": "{\"branch\": \"main\"}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


_EPHEMERAL = _ephemeral_range()
_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a port the
    kernel hands out for binding to 0 can be taken as the source port of
    an outgoing connection before the server that was meant to get it
    binds (Envoy then fails with "address already in use"). Ports are not
    handed out twice in one run. Parallel workers (pytest-xdist's gw0,
    gw1, ...) each draw from a slice of their own, so two workers never
    hand out the same port."""

    low = max(1024, _EPHEMERAL[0] - 12000)
    high = _EPHEMERAL[0] - 1
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit() and workers > 1:
        span = (high - low) // workers
        low += int(worker[2:]) * span
        high = low + span - 1
    with _ports_lock:
        for _ in range(200):
            port = random.randint(low, high)
            if port in _handed_out:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- upstream ----------------------------------------------------------------


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    """A request's whole body, chunked (trailers skipped) or of its
    content-length, read by a test server's handler."""
    if "chunked" not in (handler.headers.get("transfer-encoding") or "").lower():
        length = int(handler.headers.get("content-length") or 0)
        return handler.rfile.read(length) if length else b""
    body = b""
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return body
        body += handler.rfile.read(size)
        handler.rfile.readline()


class LocalServer(ThreadingHTTPServer):
    """A test HTTP server on loopback. Envoy opens a connection per
    concurrent request: a burst of them must not overflow the listen backlog
    (5 by default; a dropped SYN is retried after 1 s, past Envoy's 1 s
    connect timeout: a 503)."""

    request_queue_size = 256
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)


@dataclass
class Answer:
    """An upstream's answer to one request. `body` goes with a
    content-length (a dict or a list as JSON, application/json unless
    `headers` name another type). `chunks`, when given instead, are sent
    as a chunked stream, each flushed as it comes, so an iterator that waits
    between them sets the stream's pace (see `paced`); one that waits before
    its first holds the stream open after its headers. `close` ends the
    connection after the answer, as a server ending an event stream does."""

    status: int = 200
    body: bytes | str | dict | list = b""
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Iterable[bytes | str] | None = None
    close: bool = False

    def payload(self) -> bytes:
        if isinstance(self.body, (dict, list)):
            self.headers.setdefault("content-type", "application/json")
            return json.dumps(self.body).encode()
        return self.body.encode() if isinstance(self.body, str) else self.body


def paced(chunks: Iterable[bytes | str], seconds: float) -> Iterable[bytes | str]:
    """`chunks`, each followed by a pause of `seconds`: a stream's pace (a
    model writing its answer a piece at a time, so that the filter sees the
    pieces one by one)."""
    for chunk in chunks:
        yield chunk
        time.sleep(seconds)


ALL_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


class Upstream:
    """The tests' one upstream server: a real HTTP/1.1 server on loopback
    that records every request it gets and answers like an
    OpenAI-compatible API, or as `responder(request)` says: a status and a
    JSON-able body, or an `Answer` (any headers and body, streamed, or as
    slowly as the responder takes). A request is a dict of method, path,
    headers (lower-case names) and body (bytes, de-chunked). Methods not in
    `methods` are answered 501, as a server that does not implement them."""

    def __init__(
        self,
        responder: Callable[[dict], "tuple[int, object] | Answer"] | None = None,
        methods: Iterable[str] = ALL_METHODS,
    ) -> None:
        self.requests: list[dict] = []
        self.arrivals: list[dict] = []
        self.lock = threading.Lock()
        self.responder = responder
        self.methods = set(methods)
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # One segment per write: no 40 ms Nagle + delayed-ACK stall
            # between the response headers and body.
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:  # quiet
                pass

            def _handle(self) -> None:
                if self.command not in upstream.methods:
                    self.send_error(501, f"Unsupported method ({self.command!r})")
                    return
                # Recorded as soon as the headers arrive: a request whose
                # headers reached the upstream counts even if its body never
                # does (a request loopguard rejected after its headers went).
                with upstream.lock:
                    upstream.arrivals.append({"method": self.command, "path": self.path})
                body = read_body(self)
                request = {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                }
                with upstream.lock:
                    upstream.requests.append(request)
                try:
                    self._send(upstream.answer(request))
                except OSError:
                    self.close_connection = True  # the client (Envoy) went away

            def _send(self, answer: Answer) -> None:
                payload = answer.payload()
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                if answer.chunks is None:
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                else:
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for chunk in answer.chunks:
                        data = chunk.encode() if isinstance(chunk, str) else chunk
                        if data:  # an empty chunk would end the stream
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                            self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                if answer.close:
                    self.close_connection = True

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle

        self.server = LocalServer(Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, request: dict) -> Answer:
        if self.responder is None:
            return Answer(200, COMPLETION)
        out = self.responder(request)
        if isinstance(out, Answer):
            return out
        status, body = out
        return Answer(status, json.dumps(body), {"content-type": "application/json"})

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    @property
    def arrived(self) -> int:
        """Requests whose headers reached the upstream, complete or not."""
        with self.lock:
            return len(self.arrivals)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- Envoy configuration -----------------------------------------------------


def wasm_filter(plugin_config: dict | str, name: str = "loopguard", vm_id: str = "loopguard", hold: bool = False) -> dict:
    """The loopguard Wasm filter. With hold, the one-filter setup: Envoy lets
    the filter hold the request headers until it has judged the body
    (allow_on_headers_stop_iteration) and the configuration says so."""
    if hold and isinstance(plugin_config, dict):
        plugin_config = {**plugin_config, "hold_request_headers": True}
    value = plugin_config if isinstance(plugin_config, str) else json.dumps(plugin_config)
    f = {
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": name,
                "root_id": "loopguard",
                "failure_policy": "FAIL_OPEN",
                "vm_config": {
                    "vm_id": vm_id,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": WASM}},
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": value,
                },
            },
        },
    }
    if hold:
        f["typed_config"]["config"]["allow_on_headers_stop_iteration"] = True
    return f


def native_filter(plugin_config: dict | str, name: str = "loopguard", hold: bool = False, module: str | None = None) -> dict:
    """The loopguard dynamic module: the same configuration as the Wasm
    filter's. `metrics_namespace: wasmcustom` keeps the Wasm module's stat
    names (see NATIVE_RUNTIME for the Prometheus ones). A dynamic module may
    hold the request headers without any Envoy flag, so hold only sets
    hold_request_headers."""
    if hold and isinstance(plugin_config, dict):
        plugin_config = {**plugin_config, "hold_request_headers": True}
    value = plugin_config if isinstance(plugin_config, str) else json.dumps(plugin_config)
    return {
        "name": name,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"module": {"local": {"filename": module or NATIVE}}, "metrics_namespace": "wasmcustom"},
            "filter_name": name,
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": value},
        },
    }


# Prometheus names as the Wasm module's (loopguard_*): the dynamic module's
# metrics namespace registered as a custom stat namespace.
NATIVE_RUNTIME = {
    "layers": [
        {"name": "static", "static_layer": {"envoy.reloadable_features.dynamic_modules_strip_custom_stat_prefix": True}}
    ]
}


def native_stats_config() -> dict:
    """The stats tags examples/native/envoy.yaml ships."""
    return load_yaml(ROOT / "examples" / "native" / "envoy.yaml")["stats_config"]


def loopguard_filter(plugin_config: dict | str, name: str = "loopguard", vm_id: str = "loopguard", hold: bool = False,
                     host: str | None = None) -> dict:
    """loopguard in `host`, by default the host the suite runs (HOST)."""
    if (host or HOST) == "native":
        return native_filter(plugin_config, name=name, hold=hold)
    return wasm_filter(plugin_config, name=name, vm_id=vm_id, hold=hold)


WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
NATIVE_TYPE = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"


def _plugin_config_holder(f: dict) -> dict:
    """The StringValue holding a loopguard filter's JSON configuration, in
    either host's shape (Wasm: typed_config.config.configuration; dynamic
    module: typed_config.filter_config)."""
    tc = f["typed_config"]
    if tc.get("@type") == NATIVE_TYPE:
        return tc["filter_config"]
    return tc["config"]["configuration"]


def plugin_config_of(f: dict) -> dict:
    """A loopguard http filter's JSON configuration (either host)."""
    return json.loads(_plugin_config_holder(f)["value"])


def set_plugin_config(f: dict, cfg: dict | str) -> None:
    """Replace a loopguard http filter's JSON configuration (either host)."""
    _plugin_config_holder(f)["value"] = cfg if isinstance(cfg, str) else json.dumps(cfg)


def is_loopguard_filter(f: dict) -> bool:
    """An http filter that is loopguard, in either host."""
    tc = f.get("typed_config", {})
    if tc.get("@type") == NATIVE_TYPE:
        return True
    if tc.get("@type") != WASM_TYPE:
        return False
    code = tc.get("config", {}).get("vm_config", {}).get("code", {})
    return str(code.get("local", {}).get("filename", "")).endswith("loopguard.wasm")


def as_host(f: dict, host: str | None = None) -> dict:
    """A loopguard Wasm http filter as the same filter in `host` (HOST by
    default): under native, the dynamic module with the same name and JSON
    configuration (hold_request_headers in the JSON is all a dynamic module
    needs to hold the headers). Other filters are returned unchanged."""
    if (host or HOST) != "native" or f.get("typed_config", {}).get("@type") != WASM_TYPE or not is_loopguard_filter(f):
        return f
    return native_filter(_plugin_config_holder(f)["value"], name=f["name"])


def pass_env(f: dict, keys: list[str]) -> None:
    """Let loopguard read these environment variables of Envoy's process: the
    Wasm VM sees only those named in vm_config.environment_variables; the
    dynamic module runs in Envoy's process and reads them as they are."""
    tc = f["typed_config"]
    if tc.get("@type") == WASM_TYPE:
        tc["config"]["vm_config"]["environment_variables"] = {"host_env_keys": list(keys)}


def buffer_filter(max_request_bytes: int = 1 << 20) -> dict:
    return {
        "name": "envoy.filters.http.buffer",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
            "max_request_bytes": max_request_bytes,
        },
    }


ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
}


def bootstrap(
    plugin_config: dict | str | None,
    upstream_port: int,
    *,
    buffer_bytes: int | None = 1 << 20,
    http_filters: list[dict] | None = None,
    direct_response: bool = False,
    hold: bool = False,
    buffer_limit: int | None = None,
    host: str | None = None,
) -> dict:
    """A bootstrap with one listener: loopguard -> buffer -> router -> upstream.
    With direct_response, Envoy itself answers 200 in place of the upstream
    (the filter chain runs all the same): for floods where a Python upstream
    would be the bottleneck. Ports for the listener and admin are filled in
    by Envoy(). With hold, the one-filter setup (no buffer filter);
    buffer_limit sets the listener's per_connection_buffer_limit_bytes, which
    bounds the body Envoy buffers for a held request. `host` picks the
    filter's host (the suite's by default)."""
    route: dict = {"cluster": "upstream", "timeout": "30s"}
    action = {"direct_response": {"status": 200, "body": {"inline_string": "{}"}}} if direct_response else {"route": route}
    if http_filters is None:
        http_filters = []
        if plugin_config is not None:
            http_filters.append(loopguard_filter(plugin_config, hold=hold, host=host))
        if buffer_bytes is not None and not hold:
            http_filters.append(buffer_filter(buffer_bytes))
        http_filters.append(ROUTER)
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "main",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                    **({"per_connection_buffer_limit_bytes": buffer_limit} if buffer_limit else {}),
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "main",
                                        "codec_type": "AUTO",
                                        "route_config": {
                                            "name": "main",
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": [
                                                        {"match": {"prefix": "/"}, **action}
                                                    ],
                                                }
                                            ],
                                        },
                                        "http_filters": http_filters,
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "upstream",
                    "connect_timeout": "1s",
                    "type": "STATIC",
                    "load_assignment": {
                        "cluster_name": "upstream",
                        "endpoints": [
                            {
                                "lb_endpoints": [
                                    {
                                        "endpoint": {
                                            "address": {
                                                "socket_address": {
                                                    "address": "127.0.0.1",
                                                    "port_value": upstream_port,
                                                }
                                            }
                                        }
                                    }
                                ]
                            }
                        ]
                    },
                }
            ],
        },
    }


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def localize(config: dict, upstream_ports: dict[str, int] | None = None, *, native: bool = True) -> dict:
    """Make a shipped example runnable here: the wasm path becomes the built
    module (and the dynamic module's path the built one), every listener and
    the admin move to free loopback ports (a listener that other clusters
    point at keeps that link), and the named clusters are pointed at local
    upstreams without TLS. Under the native host (unless `native` is false)
    loopguard's Wasm filters become the dynamic module with the same
    configuration (as_host)."""
    cfg = copy.deepcopy(config)
    port_map: dict[int, int] = {}

    def remap(sock: dict) -> None:
        old = sock.get("port_value", 0)
        if old not in port_map:
            port_map[old] = free_port()
        sock["port_value"] = port_map[old]
        sock["address"] = "127.0.0.1"

    remap(cfg["admin"]["address"]["socket_address"])
    for listener in cfg["static_resources"].get("listeners", []):
        remap(listener["address"]["socket_address"])

    def walk(node):
        if isinstance(node, dict):
            if "filename" in node and str(node["filename"]).endswith("loopguard.wasm"):
                node["filename"] = WASM
            elif "filename" in node and str(node["filename"]).endswith("libloopguard_native.so"):
                node["filename"] = NATIVE
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(cfg)
    if HOST == "native" and native:
        for hcm in _connection_managers(cfg):
            hcm["http_filters"] = [as_host(f) for f in hcm.get("http_filters", [])]
    for cluster in cfg["static_resources"].get("clusters", []):
        name = cluster["name"]
        if upstream_ports and name in upstream_ports:
            cluster.pop("transport_socket", None)
            cluster["type"] = "STATIC"
            cluster["load_assignment"] = {
                "cluster_name": name,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {
                                            "address": "127.0.0.1",
                                            "port_value": upstream_ports[name],
                                        }
                                    }
                                }
                            }
                        ]
                    }
                ],
            }
        else:
            for ep in _endpoints(cluster):
                sock = ep["endpoint"]["address"]["socket_address"]
                if sock.get("port_value") in port_map:
                    sock["port_value"] = port_map[sock["port_value"]]
    return cfg


def _endpoints(cluster: dict):
    for group in cluster.get("load_assignment", {}).get("endpoints", []):
        yield from group.get("lb_endpoints", [])


def _connection_managers(config: dict):
    for listener in config.get("static_resources", {}).get("listeners", []):
        for chain in listener.get("filter_chains", []):
            for f in chain.get("filters", []):
                if f.get("name") == "envoy.filters.network.http_connection_manager":
                    yield f["typed_config"]


# --- time --------------------------------------------------------------------

# loopguard reads the clock in whole milliseconds (and Envoy's timers and
# access log use other clocks than the client's): a delay may look up to
# about 1 ms short from outside. Lower bounds allow this much.
CLOCK_SLACK = 0.003
# Envoy's own timers (a store call's timeout) count from its event loop's
# cached time, which is stale by however long the loop has been busy: such a
# wait can end a few ms before it is due by a precise clock (3.5 ms seen with
# both CPUs saturated). loopguard's own waits (throttle, hold probe) compare
# against the real time and need only CLOCK_SLACK.
TIMER_SLACK = 0.02
# Headroom above a wait that Envoy timed itself. Envoy's timers fire late on
# a busy machine by a few ms (at most ~10 ms measured with both CPUs
# saturated by `stress`); this is 25 times that, and still below what a wrong
# delay (a step too many, a doubled delay) would show in the tests using it.
ENVOY_HEADROOM = 0.25


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is true or `timeout` has passed; its last
    answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


# An access log line per request with Envoy's own timing of it (see
# Envoy.timings): durations between the stream's timestamps in microseconds,
# "-" or null where a stream never reached a point (a local reply never
# reaches the upstream).
TIMING_LOG_FORMAT = {
    "path": "%REQ(:PATH)%",
    "status": "%RESPONSE_CODE%",
    "start": "%START_TIME(%s.%6f)%",
    "held": "%COMMON_DURATION(DS_RX_END:US_TX_BEG:us)%",
    "headers_held": "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%",
    "to_reply": "%COMMON_DURATION(DS_RX_END:DS_TX_BEG:us)%",
    "total": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
}


def _seconds(value) -> float | None:
    try:
        return int(value) / 1e6
    except (TypeError, ValueError):
        return None


@dataclass
class Timing:
    """One request as Envoy timed it, in seconds; None where the stream
    never got there."""

    path: str
    status: int
    start: float  # when its first byte arrived (Unix time)
    held: float | None  # from the whole request received to its first byte sent upstream
    headers_held: float | None  # from its first byte received to its first byte sent upstream
    to_reply: float | None  # from the whole request received to the first byte of the answer
    total: float | None  # from its first byte received to the last byte of the answer

    @property
    def waited(self) -> float | None:
        """How long Envoy kept the whole request before letting it go on:
        upstream, or answered locally (a reject) if it never went there."""
        return self.held if self.held is not None else self.to_reply

    @property
    def end(self) -> float:
        """When the last byte of the answer left (Unix time)."""
        return self.start + (self.total or 0.0)

    @classmethod
    def parse(cls, line: str) -> "Timing":
        d = json.loads(line)
        return cls(
            path=d["path"],
            status=int(d["status"]),
            start=float(d["start"]),
            held=_seconds(d["held"]),
            headers_held=_seconds(d["headers_held"]),
            to_reply=_seconds(d["to_reply"]),
            total=_seconds(d["total"]),
        )


class Overrun(Exception):
    """A scheduled step ran too late (or took too long) for the outcome its
    test asserts to be certain: the scenario is run again (on_schedule)."""


@dataclass
class Sent:
    """A request sent on a Schedule: Envoy (and Redis) saw it at some moment
    between `start` and `end` (seconds since the schedule began)."""

    start: float
    end: float
    response: httpx.Response

    def within(self, seconds: float, of: "Sent") -> bool:
        """Certainly seen less than `seconds` after `of`."""
        return self.end - of.start < seconds - CLOCK_SLACK

    def past(self, seconds: float, of: "Sent") -> bool:
        """Certainly seen at least `seconds` after `of`."""
        return self.start - of.end >= seconds + CLOCK_SLACK

    def since(self, of: "Sent") -> tuple[float, float]:
        """The least and the most time that can have passed between `of`
        and this request where they were seen."""
        return self.start - of.end, self.end - of.start


class Schedule:
    """Requests at planned moments, each recorded with when it was really in
    flight. `at` never fails: a step that ran late is judged by `ensure`
    before anything is asserted about it."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def at(self, seconds: float) -> None:
        """Wait until `seconds` after the start (at once if that is past)."""
        delay = seconds - self.now()
        if delay > 0:
            time.sleep(delay)

    def send(self, request) -> Sent:
        """Send `request()` (returning an httpx.Response) now."""
        start = self.now()
        response = request()
        return Sent(start, self.now(), response)

    def ensure(self, certain: bool, what: str) -> None:
        """The timing a step needs for its outcome to be certain; if it did
        not hold, the scenario is void (Overrun), not failed."""
        if not certain:
            raise Overrun(f"{what} did not hold (schedule at {self.now():.3f} s)")


def on_schedule(scenario, tries: int = 3):
    """Run `scenario(attempt)` until one run keeps to its schedule. A run
    that overran (Overrun) is run again with the next attempt number, which
    the scenario puts into its requests so that each run has fingerprints of
    its own; an assertion failure fails at once. Fails only if every try
    overran."""
    overruns = []
    for attempt in range(tries):
        try:
            return scenario(attempt)
        except Overrun as e:
            overruns.append(f"try {attempt + 1}: {e}")
            warnings.warn(f"re-planned a schedule that overran: {e}", stacklevel=2)
    raise AssertionError(f"every run of the schedule overran, so nothing could be judged: {overruns}")


def sliding_window_boundary(s: Schedule, hit) -> None:
    """The core issue's boundary case, N=3, W=2 s. A fixed window starting
    at the first hit would reset at t=2.0 and allow the request at 2.2; the
    sliding window still holds the hits at 1.2 and 1.6 (the latter was
    itself rejected, and still counts). `hit(i)` sends the i-th request (to
    one Envoy, or to replicas sharing a store); times are from the first
    hit's answer, so the first hit is certainly at or before t=0. The
    schedule is the traffic's pace."""
    first = s.send(lambda: hit(0))
    assert first.response.status_code == 200
    s.at(first.end + 1.2)
    second = s.send(lambda: hit(1))
    assert second.response.status_code == 200
    s.at(first.end + 1.6)
    third = s.send(lambda: hit(2))
    s.ensure(third.within(2.0, of=first), "the 3rd hit within the window of the 1st")
    assert third.response.status_code == 429
    # The 1st hit has left the window (by construction), the 2nd and 3rd
    # have not.
    s.at(first.end + 2.2)
    fourth = s.send(lambda: hit(3))
    s.ensure(fourth.within(2.0, of=second), "the 4th hit within the window of the 2nd")
    s.ensure(fourth.within(1.0, of=third), "the 4th hit less than 1 s after the 3rd")
    r = fourth.response
    assert r.status_code == 429
    # Allowed again once the 2nd newest hit (t=1.6) leaves: at 3.6, i.e.
    # 1.4 s from now, rounded up; in ms, as measured.
    assert r.headers["retry-after"] == "2"
    least, most = fourth.since(third)
    ms = int(r.headers["retry-after-ms"])
    assert (2 - most - CLOCK_SLACK) * 1000 <= ms <= (2 - least + CLOCK_SLACK) * 1000, (ms, least, most)
    # Once the hit at 1.6 has left (at 3.9 as planned), only the hit at 2.2
    # is in the window: allowed again.
    s.at(max(first.end + 3.9, third.end + 2.0 + 0.3))
    assert s.send(lambda: hit(4)).response.status_code == 200


# --- clients -----------------------------------------------------------------


def h2_post(port: int, path: str, body: bytes, trailers=None) -> int:
    """POST over cleartext HTTP/2 (prior knowledge), optionally ending the
    stream with trailers instead of with the last DATA frame."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":path", path), (":scheme", "http"), (":authority", "localhost")])
        conn.send_data(sid, body, end_stream=not trailers)
        if trailers:
            conn.send_headers(sid, trailers, end_stream=True)
        s.sendall(conn.data_to_send())
        status = None
        while True:
            data = s.recv(65536)
            if not data:
                break
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    status = int(dict(ev.headers)[b":status"])
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    return status
            s.sendall(conn.data_to_send())
    return status


# --- Envoy process -----------------------------------------------------------


def stop_process(proc: subprocess.Popen | None) -> None:
    """Stop a process this harness started, by its PID: SIGTERM, then SIGKILL
    if it has not exited within 10 s."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class EnvoyFailed(RuntimeError):
    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n--- envoy log ---\n{log}")
        self.log = log


class Envoy:
    """One real Envoy process with a given bootstrap."""

    def __init__(
        self, config: dict, concurrency: int = 2, name: str = "envoy", env: dict | None = None, timing: bool = False
    ) -> None:
        """With timing, every HTTP connection manager also writes Envoy's own
        timing of each request to a log of its own (see timings())."""
        self.config = copy.deepcopy(config)
        if "DynamicModuleFilter" in json.dumps(self.config):
            # The native deployment shape the examples ship: the runtime
            # flag and the stats tags that give loopguard's Prometheus
            # series their labels (the Wasm VM extracts them itself).
            self.config.setdefault("layered_runtime", copy.deepcopy(NATIVE_RUNTIME))
            self.config.setdefault("stats_config", copy.deepcopy(native_stats_config()))
        self.env = env or {}
        self.concurrency = concurrency
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix="loopguard-e2e-"))
        self.timing_log = self.dir / "timing.log" if timing else None
        if self.timing_log:
            for hcm in _connection_managers(self.config):
                hcm.setdefault("access_log", []).append(
                    {
                        "name": "envoy.access_loggers.file",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                            "path": str(self.timing_log),
                            "log_format": {"json_format": TIMING_LOG_FORMAT},
                        },
                    }
                )
        self.proc: subprocess.Popen | None = None
        admin = self.config["admin"]["address"]["socket_address"]
        if not admin.get("port_value"):
            admin["port_value"] = free_port()
        self.admin_port = admin["port_value"]
        self.listener_ports: list[int] = []
        for listener in self.config["static_resources"].get("listeners", []):
            sock = listener["address"]["socket_address"]
            if not sock.get("port_value"):
                sock["port_value"] = free_port()
            self.listener_ports.append(sock["port_value"])
        self.port = self.listener_ports[0] if self.listener_ports else 0
        self.log_path = self.dir / "envoy.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def start(self, timeout: float = 30.0) -> "Envoy":
        cfg_path = self.dir / "envoy.json"
        cfg_path.write_text(json.dumps(self.config, indent=1))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [
                ENVOY,
                "-c",
                str(cfg_path),
                "--concurrency",
                str(self.concurrency),
                "--disable-hot-restart",
                "--log-level",
                "warn",
                "--component-log-level",
                "wasm:debug,dynamic_modules:debug",
                # Access logs are written within 0.2 s, not Envoy's default 10 s.
                "--file-flush-interval-msec",
                "200",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, **self.env},
        )

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise EnvoyFailed(f"envoy exited with {self.proc.returncode} at startup", self.log())
            try:
                r = httpx.get(f"{self.admin}/ready", timeout=1.0)
            except httpx.HTTPError:
                return False
            return r.status_code == 200 and all(self._accepts(p) for p in self.listener_ports)

        if wait_for(ready, timeout):
            return self
        self.stop()
        raise EnvoyFailed("envoy did not become ready", self.log())

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def expect_startup_failure(self, timeout: float = 30.0) -> str:
        """Start Envoy expecting it to refuse the configuration; return its log."""
        try:
            self.start(timeout)
        except EnvoyFailed as e:
            return e.log
        self.stop()
        raise AssertionError(f"envoy started although it should not have:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc)
        if getattr(self, "_log", None):
            self._log.close()

    # --- observation --------------------------------------------------------

    def timings(self, count: int, path: str | None = None, timeout: float = 10.0) -> list[Timing]:
        """Envoy's own timing of the requests it has finished (started with
        timing=True), to `path` if given, oldest first; waits until there
        are `count` (the log is flushed every 0.2 s)."""
        assert self.timing_log is not None, "start this Envoy with timing=True"

        def read() -> list[Timing]:
            try:
                text = self.timing_log.read_text()
            except OSError:
                return []
            timed = (Timing.parse(line) for line in text.splitlines() if line.strip())
            return [t for t in timed if path is None or t.path == path]

        if not wait_for(lambda: len(read()) >= count, timeout):
            raise AssertionError(f"{self.name} timed {len(read())} requests, not {count}, within {timeout} s")
        return sorted(read(), key=lambda t: t.start)

    def stats(self) -> dict[str, int]:
        text = httpx.get(f"{self.admin}/stats", timeout=5).text
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def counter(self, name: str) -> int:
        """A loopguard metric summed over its labels (which Envoy writes into
        the stat name: `loopguard.rejected_total.policy.p` counts in
        `loopguard.rejected_total`)."""
        full = f"wasmcustom.{name}"
        return sum(v for k, v in self.stats().items() if k == full or k.startswith(full + "."))

    def in_flight(self) -> int:
        """Requests in flight: from clients on any listener (the admin's
        own requests left out) and Envoy's own to any cluster (the
        upstream, a store, a webhook)."""
        n = 0
        for name, value in self.stats().items():
            if name.startswith("http.") and name.endswith(".downstream_rq_active") and not name.startswith("http.admin."):
                n += value
            elif name.startswith("cluster.") and name.endswith(".upstream_rq_active"):
                n += value
        return n

    def received(self) -> int:
        """Requests its listeners have received (the admin's left out)."""
        return sum(
            v
            for k, v in self.stats().items()
            if k.startswith("http.") and k.endswith(".downstream_rq_total") and not k.startswith("http.admin.")
        )

    def quiet(self, timeout: float = 10.0) -> None:
        """Wait until nothing is in flight: every request sent to it has
        been answered (or its client left) and logged, and every call of its
        own has ended; so every counter, event and log line a finished
        request brings is there, and an assertion that nothing more came can
        be made. (Alerts wait for the filter's tick: see
        observing.alerts_sent.)"""
        if not wait_for(lambda: self.in_flight() == 0, timeout):
            raise AssertionError(f"{self.name} still has {self.in_flight()} requests in flight after {timeout} s")

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def prometheus(self) -> dict[str, float]:
        """`/stats/prometheus` as {'name{labels}': value}."""
        text = httpx.get(f"{self.admin}/stats/prometheus", timeout=5).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def memory_allocated(self) -> int:
        return int(httpx.get(f"{self.admin}/memory", timeout=5).json()["allocated"])


def plugin(policies: list[dict], **top) -> dict:
    return {**top, "policies": policies}


def policy(
    pid: str = "p",
    *,
    threshold: int | None = 3,
    window: int = 60,
    selector: dict | None = None,
    limit_keys: list[str] | None = None,
    mode: str | None = None,
    exempt: list[dict] | None = None,
    **detection,
) -> dict:
    ld = {"enabled": True, "window_seconds": window, "threshold_identical_requests": threshold, **detection}
    if threshold is None:
        del ld["threshold_identical_requests"]
    spec: dict = {"selector": selector if selector is not None else {}, "loop_detection": ld}
    if limit_keys is not None:
        spec["limit_keys"] = limit_keys
    if mode is not None:
        spec["mode"] = mode
    if exempt is not None:
        spec["exempt"] = exempt
    return {"id": pid, "spec": spec}


def warn_header_mutation() -> dict:
    """Envoy's header_mutation filter copying loopguard's published warn
    decision (filter state) into the upstream request, after dropping any
    x-loopguard-* header the client sent. Place it after the buffer filter."""
    names = ["warning", "loop_count", "policy", "tool_loop"]
    ops: list[dict] = [{"remove": f"x-loopguard-{n.replace('_', '-')}"} for n in names]
    ops += [
        {
            "append": {
                "header": {"key": f"x-loopguard-{n.replace('_', '-')}", "value": f"%FILTER_STATE(wasm.loopguard_{n}:PLAIN)%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                "keep_empty_value": False,
            }
        }
        for n in names
    ]
    return {
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": ops},
        },
    }
