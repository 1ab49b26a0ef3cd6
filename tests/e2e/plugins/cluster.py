"""Redis Cluster fixtures: a 3-master, 3-replica Redis Cluster behind
Envoy's redis_proxy and webdis (redis_cluster.RedisCluster).

- `cluster`: started once per test module.
- `fresh_cluster`: `cluster` flushed for the test; the redis_proxy's and
  webdis's logs are printed if the test failed.
- `own_cluster`: a cluster of the test's own, for tests that kill, fail
  over or restart its nodes."""

from __future__ import annotations

import sys

import pytest

from plugins.envoy import failed
from redis_cluster import RedisCluster


@pytest.fixture(scope="module")
def cluster():
    c = RedisCluster().start()
    print(f"cluster, redis_proxy and webdis up in {c.startup_seconds:.1f} s", file=sys.stderr)
    yield c
    c.cleanup()


@pytest.fixture
def fresh_cluster(request, cluster):
    cluster.flush()
    yield cluster
    if failed(request):
        print(f"\n--- redis_proxy log ---\n{cluster.proxy_log()[-10000:]}", file=sys.stderr)
        print(f"--- webdis log ---\n{cluster.webdis_log()[-5000:]}", file=sys.stderr)


@pytest.fixture
def own_cluster():
    c = RedisCluster().start()
    yield c
    c.cleanup()
