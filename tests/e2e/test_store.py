"""The slot table in Envoy shared data: exact across worker threads, bounded
in memory."""

import re
from concurrent.futures import ThreadPoolExecutor

import httpx

from harness import bootstrap, plugin, policy


def parallel(url: str, jobs: list, threads: int = 16) -> list[int]:
    """Send jobs [(path, body)] over `threads` keep-alive connections."""
    chunks = [jobs[i::threads] for i in range(threads)]

    def run(chunk):
        with httpx.Client(base_url=url, timeout=30) as c:
            return [c.post(path, content=body).status_code for path, body in chunk]

    with ThreadPoolExecutor(threads) as pool:
        return [code for codes in pool.map(run, chunks) for code in codes]


def worker_connections(envoy) -> dict[str, int]:
    out = {}
    for name, value in envoy.stats().items():
        m = re.match(r"listener\.127\.0\.0\.1_\d+\.(worker_\d+)\.downstream_cx_total$", name)
        if m:
            out[m.group(1)] = value
    return out


def test_exact_count_across_four_workers(upstream, start_envoy):
    """599 identical requests from 16 parallel connections spread over four
    worker threads: every one is counted exactly once. With a threshold of
    600 they all pass (no double count) and the 600th is rejected (no lost
    hit)."""
    n = 600
    e = start_envoy(bootstrap(plugin([policy(threshold=n, window=300)]), upstream.port), concurrency=4)
    codes = parallel(e.url, [("/v1/hot", b"same body")] * (n - 1))
    assert codes == [200] * (n - 1)
    busy = {w: c for w, c in worker_connections(e).items() if c > 0}
    assert len(busy) >= 2, f"connections did not spread over workers: {busy}"
    with httpx.Client(base_url=e.url) as c:
        r = c.post("/v1/hot", content=b"same body")
    assert r.status_code == 429
    assert r.json()["error"]["hit_count"] == n
    assert e.counter("loopguard.store_fail_open_total") == 0
    assert upstream.count == n - 1


def test_flood_of_unique_fingerprints_stays_bounded(upstream, start_envoy):
    """A table of 64 fingerprints takes a flood of thousands of distinct
    requests: evictions are counted, memory stays flat, and a real loop is
    still caught afterwards."""
    cfg = plugin([policy(threshold=3, window=60)], max_tracked_fingerprints=64)
    e = start_envoy(bootstrap(cfg, upstream.port, direct_response=True), concurrency=2)
    warm = parallel(e.url, [(f"/v1/u?i={i}", b"x") for i in range(2000)], threads=4)
    assert warm == [200] * 2000
    before_alloc, before_rss = e.memory_allocated(), e.rss_bytes()
    flood = parallel(e.url, [(f"/v1/u?i={i}", b"x") for i in range(2000, 8000)], threads=4)
    assert flood == [200] * 6000
    grown_alloc = e.memory_allocated() - before_alloc
    grown_rss = e.rss_bytes() - before_rss
    # 6000 more fingerprints than the table holds: the table does not grow.
    assert grown_alloc < 1_000_000, f"heap grew by {grown_alloc} bytes"
    assert grown_rss < 4_000_000, f"RSS grew by {grown_rss} bytes"
    assert e.counter("loopguard.fingerprints_evicted_total") >= 8000 - 64 - 64
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/v1/loop", content=b"again").status_code for _ in range(4)]
    assert codes == [200, 200, 429, 429]
