"""A real MCP server (official Python SDK, MCPServer) for the end-to-end tests.

    python server.py --port P [--json] [--stateless]

Streamable HTTP on http://127.0.0.1:P/mcp. --json answers POSTs with
application/json instead of an SSE stream; --stateless runs without sessions
(no Mcp-Session-Id). Prints "ready" on stdout once the port accepts
connections.

Tools (each counts its real executions, see GET /calls):
  search(query)  deterministic text for the query
  poll(job)      a result that changes on every call (progress counter)
  fail(path)     always fails the same way (isError true, same text)
  read(path)     deterministic file-like text (A->B->A cycles with search)
  weather(city)  deterministic structured content (a dict)

Extra HTTP routes: GET /calls -> {"tool": count, ...}; POST /calls/reset.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from collections import Counter
from typing import Any

import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

CALLS: Counter[str] = Counter()
POLLS: Counter[str] = Counter()

mcp = MCPServer("loopguard-e2e", version="1.0.0")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:8]


@mcp.tool(structured_output=False)
def search(query: str) -> str:
    """Search the corpus; the same query always gives the same results."""
    CALLS["search"] += 1
    h = _digest("search", query)
    return f"3 results for '{query}': doc-{h}-1, doc-{h}-2, doc-{h}-3"


@mcp.tool(structured_output=False)
def poll(job: str) -> str:
    """Poll a job; every call reports more progress."""
    CALLS["poll"] += 1
    POLLS[job] += 1
    n = POLLS[job]
    return f"job {job}: {min(n * 10, 100)}% done (poll #{n})"


@mcp.tool(structured_output=False)
def fail(path: str) -> str:
    """Always fails, with the same message every time."""
    CALLS["fail"] += 1
    raise ToolError(f"permission denied: {path}")


@mcp.tool(structured_output=False)
def read(path: str) -> str:
    """Read a file; the same path always gives the same content."""
    CALLS["read"] += 1
    return f"# {path}\nline 1 of {path} ({_digest('read', path)})\nline 2\n"


@mcp.tool()
def weather(city: str) -> dict[str, Any]:
    """Current weather for a city, as structured content (deterministic)."""
    CALLS["weather"] += 1
    h = int(_digest("weather", city), 16)
    return {"city": city, "temperature_c": h % 35, "conditions": ["sunny", "cloudy", "rain"][h % 3]}


@mcp.custom_route("/calls", methods=["GET"])
async def calls(_: Request) -> Response:
    return JSONResponse(dict(CALLS))


@mcp.custom_route("/calls/reset", methods=["POST"])
async def calls_reset(_: Request) -> Response:
    CALLS.clear()
    POLLS.clear()
    return JSONResponse({})


async def _serve(args: argparse.Namespace) -> None:
    app = mcp.streamable_http_app(
        streamable_http_path="/mcp",
        json_response=args.json,
        stateless_http=args.stateless,
        host="127.0.0.1",
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level=args.log_level))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task  # startup failed: raise its error
            sys.exit(1)
        await asyncio.sleep(0.02)
    print("ready", flush=True)
    await task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--json", action="store_true", help="application/json responses instead of SSE")
    p.add_argument("--stateless", action="store_true", help="stateless HTTP: no Mcp-Session-Id")
    p.add_argument("--log-level", default="warning")
    asyncio.run(_serve(p.parse_args()))


if __name__ == "__main__":
    main()
