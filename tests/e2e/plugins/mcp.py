"""MCP server fixtures: tests/e2e/mcp_apps/server.py (the Python SDK's
server) on free loopback ports (mcp_agents.McpServer).

- `mcp_server`: answering with event streams (JSON all the same to
  2026-07-28 clients), for the module.
- `mcp_servers`: {"json": ..., "sse": ...}, one server answering in each
  mode, for the module.
- `mcp_upstream`: a raw MCP upstream (mcp_agents.RawUpstream) answering
  every `tools/call` with the same result, counting the calls it ran, for
  the module."""

from __future__ import annotations

import pytest

from mcp_agents import McpServer, RawUpstream


@pytest.fixture(scope="module")
def mcp_server():
    server = McpServer("sse")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def mcp_servers():
    started = {}
    try:
        for mode in ("json", "sse"):
            started[mode] = McpServer(mode)
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def mcp_upstream():
    up = RawUpstream()
    try:
        yield up
    finally:
        up.stop()
