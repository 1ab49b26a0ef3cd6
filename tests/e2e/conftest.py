"""pytest fixtures for the end-to-end tests: a recording upstream and a
factory of real Envoy processes whose logs are printed when a test fails."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness import ENVOY, HOST, NATIVE, WASM, Envoy, Upstream  # noqa: E402


def pytest_sessionstart(session):
    missing = [p for p in (ENVOY, NATIVE if HOST == "native" else WASM) if not os.path.exists(p)]
    if missing:
        raise pytest.UsageError(f"missing {missing}: run the tests through `make test`")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


@pytest.fixture
def upstream():
    u = Upstream()
    yield u
    u.stop()


@pytest.fixture
def start_envoy(request):
    """start_envoy(config, concurrency=2) -> a started Envoy, stopped after
    the test; its log is printed if the test failed."""
    started: list[Envoy] = []

    def start(config: dict, concurrency: int = 2, **kw) -> Envoy:  # kw: name, env, timing
        e = Envoy(config, concurrency=concurrency, **kw)
        started.append(e)
        return e.start()

    def make(config: dict, concurrency: int = 2, **kw) -> Envoy:
        e = Envoy(config, concurrency=concurrency, **kw)
        started.append(e)
        return e

    start.make = make  # an unstarted Envoy, for startup-failure tests
    yield start
    failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
    for e in started:
        e.stop()
        if failed:
            log = e.log()
            print(f"\n--- log of {e.name} (admin {e.admin}) ---\n{log[-20000:]}", file=sys.stderr)
            if e.timing_log and e.timing_log.exists():
                print(f"--- Envoy's timing of {e.name}'s requests ---\n{e.timing_log.read_text()[-5000:]}", file=sys.stderr)
        shutil.rmtree(e.dir, ignore_errors=True)
