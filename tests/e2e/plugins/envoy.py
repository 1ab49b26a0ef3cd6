"""Envoy fixtures: `start_envoy` starts real Envoy processes with loopguard
in the host the suite runs (LOOPGUARD_HOST) and stops them after the test,
printing their logs if it failed; `shared_envoy` starts one Envoy per test
module and configuration, shared by the module's tests (with the module's
`shared_upstream`); the recording `upstream` and an alert `receiver`. Also:
the built artifacts are checked before anything runs, and each test's
outcome is kept on its item (rep_setup, rep_call, rep_teardown) for
fixtures that print more when a test failed."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from harness import ENVOY, HOST, NATIVE, WASM, Envoy, Upstream


def pytest_sessionstart(session):
    missing = [p for p in (ENVOY, NATIVE if HOST == "native" else WASM) if not os.path.exists(p)]
    if missing:
        raise pytest.UsageError(f"missing {missing}: run the tests through `make test`")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


def failed(request) -> bool:
    """Whether the test of this fixture request failed (in its call)."""
    rep = getattr(request.node, "rep_call", None)
    return rep is not None and rep.failed


@pytest.fixture
def upstream():
    """An upstream answering every request like an OpenAI-compatible API,
    recording them (harness.Upstream)."""
    u = Upstream()
    yield u
    u.stop()


@pytest.fixture
def receiver():
    """A webhook receiver: answers every alert 200 {"ok": true} and records it."""
    r = Upstream(responder=lambda req: (200, {"ok": True}))
    yield r
    r.stop()


@pytest.fixture
def start_envoy(request):
    """start_envoy(config, concurrency=2) -> a started Envoy, stopped after
    the test; its log is printed if the test failed. start_envoy.make(...)
    -> an unstarted Envoy (for startup-failure tests)."""
    started: list[Envoy] = []

    def start(config: dict, concurrency: int = 2, **kw) -> Envoy:  # kw: name, env, timing
        e = Envoy(config, concurrency=concurrency, **kw)
        started.append(e)
        return e.start()

    def make(config: dict, concurrency: int = 2, **kw) -> Envoy:
        e = Envoy(config, concurrency=concurrency, **kw)
        started.append(e)
        return e

    start.make = make
    yield start
    show = failed(request)
    for e in started:
        e.stop()
        if show:
            log = e.log()
            print(f"\n--- log of {e.name} (admin {e.admin}) ---\n{log[-20000:]}", file=sys.stderr)
            if e.timing_log and e.timing_log.exists():
                print(f"--- Envoy's timing of {e.name}'s requests ---\n{e.timing_log.read_text()[-5000:]}", file=sys.stderr)
        shutil.rmtree(e.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_upstream():
    """An upstream like `upstream`, shared by the tests of a module (with
    shared_envoy): each test reads only the requests to its own paths."""
    u = Upstream()
    yield u
    u.stop()


@pytest.fixture(scope="module")
def _shared_envoys():
    """The Envoys shared_envoy started in this module, by configuration;
    stopped when the module's last test is done."""
    started: dict[str, Envoy] = {}
    yield started
    for e in started.values():
        e.stop()
        shutil.rmtree(e.dir, ignore_errors=True)


@pytest.fixture
def shared_envoy(request, _shared_envoys):
    """shared_envoy(config, concurrency=2) -> a started Envoy, shared with the
    module's other tests that ask for the same configuration (one start
    instead of one per test): a test that uses it sends requests (callers,
    paths, bodies) no other test of the module sends, and reads counters as
    deltas. Its log is printed if a test that used it failed."""
    used: list[Envoy] = []

    def start(config: dict, concurrency: int = 2) -> Envoy:
        key = json.dumps([config, concurrency], sort_keys=True)
        e = _shared_envoys.get(key)
        if e is None:
            e = Envoy(config, concurrency=concurrency, name=f"shared envoy {len(_shared_envoys) + 1}")
            try:
                e.start()
            except BaseException:
                e.stop()
                shutil.rmtree(e.dir, ignore_errors=True)
                raise
            _shared_envoys[key] = e
        used.append(e)
        return e

    yield start
    if failed(request):
        for e in used:
            print(f"\n--- log of {e.name} (admin {e.admin}), shared with the module's other tests ---\n{e.log()[-20000:]}", file=sys.stderr)
