"""An MCP client (official Python SDK, streamable HTTP) that runs a script of steps.

    python client.py --url URL --script FILE_OR_JSON [--timeout S] [--step-timeout S] [--mode auto|legacy]
                     [--header "Name: value" ...]

The script is a JSON list (inline, or a file holding it) of steps:
    {"call": "search", "args": {"query": "x"}}    a tools/call
    {"call": ..., "args": ..., "progress": true}  the same with a progress callback
                                                  (the SDK then sends params._meta.progressToken)
    {"list_tools": true}                          a tools/list
    {"sleep": 0.5}                                pause (prints nothing)
For each call/list step one JSON line goes to stdout:
    {"step": i, "tool": name, "is_error": bool, "text": first text content or null,
     "texts": every text content block, in order,
     "structured": structuredContent or null, "exception": null or "Type: message", "code": int or null}
    {"step": i, "tools": [names]}            (list_tools; "exception" too when it failed)
An exception on one step is recorded and the script goes on. The whole run is
bounded by --timeout (then {"timeout": true} and exit 2); a failed connect prints
{"step": "connect", "exception": ...} and exits 1; otherwise exit 0.

--mode is the SDK's Client(mode=...): "auto" (the SDK default: probe
server/discover, use the 2026-07-28 stateless protocol when the server speaks
it, else the initialize handshake) or "legacy" (initialize handshake only).

--header (repeatable) adds an HTTP header to every request the client sends
(an Authorization header, for example, makes the client a caller of its own).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from typing import Any

import anyio

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def load_script(arg: str) -> list[dict[str, Any]]:
    text = arg if arg.lstrip().startswith("[") else open(arg, encoding="utf-8").read()
    script = json.loads(text)
    if not isinstance(script, list):
        raise SystemExit("--script: a JSON list of steps")
    return script


def describe(exc: BaseException) -> str:
    # ExceptionGroups from anyio task groups hide the real error: show the first leaf.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = str(exc)
    if not message and isinstance(exc, TimeoutError):
        message = "no answer within the step timeout"
    return f"{type(exc).__name__}: {message}"


def error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if code is None:
        code = getattr(getattr(exc, "error", None), "code", None)
    return code if isinstance(code, int) else None


async def _ignore_progress(progress: float, total: float | None, message: str | None) -> None:
    pass


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


async def run_steps(client: Client, args: argparse.Namespace, script: list[dict[str, Any]]) -> None:
    for i, step in enumerate(script):
        if "sleep" in step:
            await anyio.sleep(float(step["sleep"]))
        elif step.get("list_tools"):
            try:
                with anyio.fail_after(args.step_timeout):
                    res = await client.list_tools(cache_mode="refresh")
                emit({"step": i, "tools": [t.name for t in res.tools]})
            except Exception as exc:  # noqa: BLE001
                emit({"step": i, "tools": None, "exception": describe(exc), "code": error_code(exc)})
        elif "call" in step:
            line: dict[str, Any] = {"step": i, "tool": step["call"], "is_error": False, "text": None,
                                    "texts": [], "structured": None, "exception": None, "code": None}
            try:
                with anyio.fail_after(args.step_timeout):
                    res = await client.call_tool(step["call"], step.get("args") or {},
                                                 progress_callback=_ignore_progress if step.get("progress") else None)
                line["is_error"] = bool(res.is_error)
                line["texts"] = [c.text for c in res.content if getattr(c, "type", None) == "text"]
                line["text"] = line["texts"][0] if line["texts"] else None
                line["structured"] = res.structured_content
            except Exception as exc:  # noqa: BLE001
                line["exception"] = describe(exc)
                line["code"] = error_code(exc)
            emit(line)
        else:
            emit({"step": i, "exception": f"ValueError: unknown step {step!r}"})


def parse_headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for v in values:
        name, sep, value = v.partition(":")
        if not sep or not name.strip():
            raise SystemExit(f"--header: 'Name: value', not {v!r}")
        headers[name.strip()] = value.strip()
    return headers


@contextlib.asynccontextmanager
async def transport_with_headers(url: str, headers: dict[str, str]):
    """The SDK's streamable HTTP transport over an HTTP client that sends
    `headers` with every request."""
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


async def run(args: argparse.Namespace, script: list[dict[str, Any]]) -> int:
    headers = parse_headers(args.header)
    server: Any = transport_with_headers(args.url, headers) if headers else args.url
    client = Client(server, mode=args.mode, read_timeout_seconds=args.step_timeout)
    connected = False
    try:
        async with client:
            connected = True
            await run_steps(client, args, script)
    except Exception as exc:  # noqa: BLE001
        if not connected:
            emit({"step": "connect", "exception": describe(exc), "code": error_code(exc)})
            return 1
        # the steps ran; an error while closing the session does not change the outcome
    return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--script", required=True, help="JSON list of steps, or a file holding it")
    p.add_argument("--timeout", type=float, default=60.0, help="bound on the whole run (s)")
    p.add_argument("--step-timeout", type=float, default=None, help="bound on one step (s); default min(10, timeout)")
    p.add_argument("--mode", default="auto", help="SDK Client mode: auto (default), legacy, or a modern version")
    p.add_argument("--header", action="append", default=[], help="'Name: value' sent with every request (repeatable)")
    args = p.parse_args()
    if args.step_timeout is None:
        args.step_timeout = min(10.0, args.timeout)
    script = load_script(args.script)

    def expire() -> None:  # the whole run is bounded, even if the SDK hangs
        emit({"timeout": True})
        os._exit(2)

    watchdog = threading.Timer(args.timeout, expire)
    watchdog.daemon = True
    watchdog.start()
    rc = anyio.run(run, args, script)
    sys.stdout.flush()
    os._exit(rc)  # never wait on lingering SDK tasks/threads


if __name__ == "__main__":
    main()
