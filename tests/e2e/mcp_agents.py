"""The real MCP apps the end-to-end tests drive (tests/e2e/mcp_apps): the
Python SDK's server on a free loopback port, and the official SDK clients
(Python, in either protocol mode, and TypeScript) running a script of
steps; the looping agent the mesh shapes are checked with; and
`RawUpstream`, an MCP-ish upstream for odd and hostile traffic.

Every process started here listens on loopback only and is stopped by PID."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from harness import ROOT, Answer, Upstream, free_port, stop_process, wait_for

APPS = Path(__file__).resolve().parent / "mcp_apps"
# The tools server.py serves.
TOOLS = {"search", "poll", "fail", "read", "weather"}


class McpServer:
    """mcp_apps/server.py on a free loopback port: `json` answers, or event
    streams (`sse`; JSON all the same to 2026-07-28 clients). Started at
    once; with `wait`, ready before the constructor returns (else call
    `ready()`, say once Envoys started alongside are up)."""

    def __init__(self, mode: str = "sse", wait: bool = True) -> None:
        self.mode = mode
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"loopguard-mcp-{mode}-"))
        self.out = self.dir / "server.log"
        args = [sys.executable, str(APPS / "server.py"), "--port", str(self.port)]
        if mode == "json":
            args.append("--json")
        with open(self.out, "wb") as log:
            self.proc = subprocess.Popen(args, cwd=APPS, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.ready()

    def ready(self) -> None:
        up = wait_for(lambda: "ready" in self.log() or self.proc.poll() is not None, timeout=30)
        if not up or self.proc.poll() is not None:
            log = self.log()
            self.stop()
            raise RuntimeError(f"server.py --{self.mode} did not start:\n{log}")

    def log(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def calls(self) -> dict[str, int]:
        """How many times each tool really ran."""
        return httpx.get(f"http://127.0.0.1:{self.port}/calls", timeout=5).json()

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


def ran(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The tools that ran between two /calls readings, with how often."""
    return {t: after.get(t, 0) - before.get(t, 0) for t in TOOLS if after.get(t, 0) != before.get(t, 0)}


_node: dict[str, str | None] = {}


def require_node() -> None:
    """The TypeScript client needs node and `make mcp-tools` (which `make e2e`
    runs): installed here if missing; skipped only if that cannot be done."""
    if "reason" not in _node:
        reason = None
        if shutil.which("node") is None:
            reason = "node is not installed (the TypeScript MCP client needs Node.js >= 20)"
        elif not (APPS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
            r = subprocess.run(["make", "mcp-tools"], cwd=ROOT, capture_output=True, text=True, timeout=600)
            if r.returncode != 0 or not (APPS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
                reason = f"tests/e2e/mcp_apps/node_modules is missing and `make mcp-tools` failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        _node["reason"] = reason
    if _node["reason"]:
        pytest.skip(_node["reason"])


def run_client(kind: str, url: str, script: list[dict], key: str, headers: dict[str, str] | None = None) -> dict[int, dict]:
    """Run a script with one SDK client (`python-auto`: 2026-07-28,
    stateless; `python-legacy`: 2025-11-25, sessions; `ts`) as the caller
    `key` (its API key, `sk-<key>`), with more request `headers`; its
    output lines by step. The script must run to its end."""
    if kind == "ts":
        require_node()
        cmd = ["node", str(APPS / "client.mjs")]
    else:
        cmd = [sys.executable, str(APPS / "client.py"), "--mode", kind.removeprefix("python-")]
    cmd += ["--url", url, "--script", json.dumps(script), "--timeout", "40", "--step-timeout", "10",
            "--header", f"Authorization: Bearer sk-{key}"]
    cmd += [arg for name, value in (headers or {}).items() for arg in ("--header", f"{name}: {value}")]
    r = subprocess.run(cmd, cwd=APPS, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{kind} client exited with {r.returncode}:\n{r.stdout}\n{r.stderr[-3000:]}"
    steps = {}
    for line in r.stdout.splitlines():
        if line.strip():
            out = json.loads(line)
            steps[out["step"]] = out
    wanted = [i for i, s in enumerate(script) if "sleep" not in s]
    assert sorted(steps) == wanted, f"{kind}: not every step answered:\n{r.stdout}\n{r.stderr[-3000:]}"
    return steps


def looping_agent(url: str, mode: str, server: McpServer, **headers: str) -> None:
    """A real MCP client (the Python SDK, `mode` auto: 2026-07-28 stateless,
    JSON answers; legacy: 2025-11-25 sessions, SSE answers) that calls the
    same search 4 times: the 3rd result carries loopguard's note, the 4th
    call is answered by loopguard (isError) and never reaches the server;
    tools/list before, between and after, and a different call after it,
    pass."""
    t = uuid.uuid4().hex[:10]
    search = {"call": "search", "args": {"query": f"loop {t}"}}
    tools = {"list_tools": True}
    script = [tools, search, search, search, tools, search, tools, {"call": "read", "args": {"path": f"/src/{t}.py"}}]
    before = server.calls()
    steps = run_client(f"python-{mode}", url, script, t, headers)
    for i in (0, 4, 6):
        assert set(steps[i]["tools"]) == TOOLS, steps[i]
    for i in (1, 2, 3, 7):
        assert steps[i]["exception"] is None and steps[i]["is_error"] is False, steps[i]
    found = steps[1]["text"]
    assert found.startswith(f"3 results for 'loop {t}': doc-") and steps[1]["texts"] == steps[2]["texts"] == [found]
    assert steps[3]["texts"][0] == found and len(steps[3]["texts"]) == 2, steps[3]
    assert steps[3]["texts"][1].startswith("[loopguard] Note: this is the 3rd call in a row of the tool `search`"), steps[3]
    assert steps[5]["exception"] is None and steps[5]["is_error"] is True, steps[5]
    assert steps[5]["texts"] == [steps[5]["text"]]
    assert steps[5]["text"].startswith("[loopguard] This call was not run: this is the 4th call in a row of the tool `search`"), steps[5]
    assert steps[7]["text"].startswith(f"# /src/{t}.py\n"), steps[7]
    after = server.calls()
    assert {tool: after.get(tool, 0) - before.get(tool, 0) for tool in TOOLS} == {
        "search": 3, "read": 1, "poll": 0, "fail": 0, "weather": 0}


def rpc_result(rid, text: str, seq: int) -> dict:
    # The sequence number is outside the compared result (content, isError,
    # structuredContent): the same result every time, yet each answer can
    # be told from the others.
    return {"jsonrpc": "2.0", "id": rid,
            "result": {"content": [{"type": "text", "text": text}], "isError": False, "_meta": {"seq": seq}}}


class RawUpstream:
    """A loopback MCP-ish upstream that records every request (method,
    path, headers, body) and the exact body bytes it answered. The request
    header x-answer chooses the answer: json (default: a JSON-RPC result,
    the same text for every call), sse (the same result as an event stream,
    after a ping and a progress notification), html (200 text/html), 500
    (the same JSON-RPC result with status 500), sse-forever (200
    text/event-stream: pings and notifications every 50 ms for
    x-stream-seconds, never the response). GET opens a short event stream;
    DELETE answers 200."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.sent: list[bytearray] = []
        self.lock = threading.Lock()
        self.upstream = Upstream(self.respond, methods=("GET", "POST", "DELETE"))
        self.port = self.upstream.port

    def respond(self, request: dict) -> Answer:
        body = request["body"]
        sent = bytearray()
        with self.lock:
            seq = len(self.requests)
            self.requests.append(request)
            self.sent.append(sent)
        answer = request["headers"].get("x-answer", "json")
        if request["method"] == "GET":
            return self._stream(sent, b": open\n\n", 0.2)
        if request["method"] == "DELETE":
            return self._send(request, 200, "application/json", b"{}", sent)
        if answer == "sse-forever":
            return self._stream(sent, None, float(request["headers"].get("x-stream-seconds", "3")))
        if answer == "sse":
            msg = json.loads(body)
            note = {"jsonrpc": "2.0", "method": "notifications/progress",
                    "params": {"progressToken": msg["id"], "progress": 1, "message": "working"}}
            events = [b": ping\n\n", b"event: message\ndata: " + json.dumps(note).encode() + b"\n\n",
                      b"event: message\ndata: " + json.dumps(rpc_result(msg["id"], "same", seq)).encode() + b"\n\n"]
            return self._stream(sent, b"".join(events), 0)
        if answer == "html":
            return self._send(request, 200, "text/html", b"<html><body>oops</body></html>", sent)
        try:
            msg = json.loads(body)
        except ValueError:
            msg = None
        if isinstance(msg, list):
            out = [rpc_result(m.get("id") if isinstance(m, dict) else None, "same", seq) for m in msg]
        elif isinstance(msg, dict):
            out = rpc_result(msg.get("id"), "same", seq)
        else:
            out = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error", "data": seq}}
        return self._send(request, 500 if answer == "500" else 200, "application/json", json.dumps(out).encode(), sent)

    @staticmethod
    def _send(request: dict, status: int, ctype: str, payload: bytes, sent: bytearray) -> Answer:
        headers = {"content-type": ctype}
        # Like a server behind a compressing middleware: gzip when the
        # request allows it. (What was sent is recorded as the client reads
        # it, decompressed.)
        plain = payload
        if request["method"] == "POST" and "gzip" in (request["headers"].get("accept-encoding") or ""):
            payload = gzip.compress(payload)
            headers["content-encoding"] = "gzip"
        # Recorded before it is written: the client may read the answer, and
        # the test look for it here, before this thread runs again.
        sent += plain
        return Answer(status, payload, headers)

    @staticmethod
    def _stream(sent: bytearray, first: bytes | None, seconds: float) -> Answer:
        """An event stream: `first`, then for `seconds` a ping or a progress
        notification every 50 ms (the stream's pace); the connection closes
        after it."""

        def chunks():
            if first:
                sent.extend(first)  # recorded first, as in _send
                yield first
            end = time.monotonic() + seconds
            n = 0
            while time.monotonic() < end:
                n += 1
                if n % 2:
                    data = b": ping %d\n\n" % n
                else:
                    note = {"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": 1, "progress": n, "message": "still working"}}
                    data = b"event: message\ndata: " + json.dumps(note).encode() + b"\n\n"
                sent.extend(data)
                yield data
                time.sleep(0.05)  # the stream's pace

        return Answer(200, headers={"content-type": "text/event-stream", "cache-control": "no-cache"},
                      chunks=chunks(), close=True)

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def stop(self) -> None:
        self.upstream.stop()
