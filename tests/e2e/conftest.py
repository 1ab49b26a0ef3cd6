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
