"""Redis and webdis fixtures for the shared-store tests (the servers are
shared_store.Redis and Webdis, started with the shipped configuration).

- `backend`: a Redis and its webdis, started once per test module.
- `shared`: `backend` flushed for the test (the function stays loaded).
- `own_backend`: a Redis and webdis of the test's own, for tests that stop
  them.
- `servers_installed`: fails (never skips) the module's tests when a server
  is missing; a module asks for it with
  `pytestmark = pytest.mark.usefixtures("servers_installed")`."""

from __future__ import annotations

import shutil

import pytest

from shared_store import SERVERS, Redis, Webdis


@pytest.fixture(scope="module")
def servers_installed():
    """These tests need real servers: missing ones are a failure, never a
    skip (make test installs them)."""
    missing = [s for s in SERVERS if shutil.which(s) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run the tests through `make test`, which installs them")


def _started():
    redis = Redis().start()
    webdis = Webdis(redis.port).start()
    return redis, webdis


@pytest.fixture(scope="module")
def backend():
    """(redis, webdis), for the module."""
    redis, webdis = _started()
    yield redis, webdis
    webdis.cleanup()
    redis.cleanup()


@pytest.fixture
def shared(backend):
    """A flushed Redis (the function stays loaded) and its webdis."""
    redis, webdis = backend
    redis.flush()
    return redis, webdis


@pytest.fixture
def own_backend():
    """A Redis and webdis of this test's own, for tests that stop them."""
    redis, webdis = _started()
    yield redis, webdis
    webdis.cleanup()
    redis.cleanup()
