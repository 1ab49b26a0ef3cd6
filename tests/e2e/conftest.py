"""The end-to-end suite's configuration: its helper modules are importable
(and their assertions explained on failure, as in the tests), and its
fixtures are the plugins in plugins/ (see plugins/__init__.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# The helpers hold assertions of their own (a scenario, a check of a 429):
# rewritten like the tests' so that a failure shows the values.
pytest.register_assert_rewrite(
    "agent_runs",
    "budgets",
    "framework_scripts",
    "harness",
    "llm_provider",
    "mcp_agents",
    "mesh",
    "observing",
    "recommended",
    "redis_cluster",
    "replaying",
    "scripted_model",
    "shared_store",
)

pytest_plugins = [
    "plugins.envoy",
    "plugins.redis",
    "plugins.cluster",
    "plugins.mcp",
    "plugins.providers",
]

# The files that take longest (`--durations` on this 2-core machine: a
# flood then a window's expiry, 1,418 real runs replayed, paced streams,
# the registry, the Prometheus scrapes, the MCP clients). make test runs a
# file to a parallel worker, in collection order: these start first, so the
# workers end together instead of one running a long file alone at the end.
LONGEST_FIRST = [
    "test_redis.py",
    "test_realruns.py",
    "test_budget_streams.py",
    "test_mcp.py",
    "test_image.py",
    "test_monitoring.py",
    "test_retries.py",
    "test_redis_cluster_path.py",
    "test_redis_failover.py",
    "test_envoy_gateway.py",
]


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
