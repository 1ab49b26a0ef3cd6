"""The sliding window in real time (windows of 2 s; every timing has at
least 150 ms of margin around the boundary it tests)."""

import time

import httpx

from harness import bootstrap, plugin, policy


class Clock:
    def __init__(self):
        self.t0 = time.monotonic()

    def at(self, seconds: float) -> None:
        delay = self.t0 + seconds - time.monotonic()
        assert delay > -0.05, f"fell behind schedule by {-delay:.3f}s"
        if delay > 0:
            time.sleep(delay)


def test_sliding_not_fixed_window_and_rejected_hits_count(upstream, start_envoy):
    """N=3, W=2 s. A fixed window starting at the first hit would reset at
    t=2.0 and allow the request at 2.2; the sliding window still holds the
    hits at 1.2 and 1.6 (the latter was itself rejected, and still counts)."""
    e = start_envoy(bootstrap(plugin([policy(threshold=3, window=2)]), upstream.port))
    with httpx.Client(base_url=e.url) as c:
        clock = Clock()
        hit = lambda: c.post("/v1/w", content=b"same")  # noqa: E731
        clock.at(0.0)
        assert hit().status_code == 200
        clock.at(1.2)
        assert hit().status_code == 200
        clock.at(1.6)
        assert hit().status_code == 429
        clock.at(2.2)
        r = hit()
        assert r.status_code == 429
        # Allowed again once the 2nd newest hit (t=1.6) leaves: at 3.6, i.e.
        # 1.4 s from now, rounded up.
        assert r.headers["retry-after"] == "2"
        # At 3.9 only the hit at 2.2 is in the window: allowed again.
        clock.at(3.9)
        assert hit().status_code == 200
    assert upstream.count == 3


def test_not_a_ttl_refreshed_on_every_hit(upstream, start_envoy):
    """Hits 1.1 s apart with N=3, W=2 s: each sees only one earlier hit in its
    window, so a loop this slow is never stopped. A counter whose TTL is
    refreshed on every hit would block the third."""
    e = start_envoy(bootstrap(plugin([policy(threshold=3, window=2)]), upstream.port))
    codes = []
    with httpx.Client(base_url=e.url) as c:
        clock = Clock()
        for i in range(5):
            clock.at(i * 1.1)
            codes.append(c.post("/v1/t", content=b"same").status_code)
    assert codes == [200] * 5


def test_window_expiry_allows_again_after_retry_after(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy(threshold=2, window=1)]), upstream.port))
    with httpx.Client(base_url=e.url) as c:
        assert c.post("/v1/e", content=b"x").status_code == 200
        r = c.post("/v1/e", content=b"x")
        assert r.status_code == 429
        assert r.headers["retry-after"] == "1"
        time.sleep(0.7)
        assert c.post("/v1/e", content=b"x").status_code == 429
        # The hit just rejected is the newest; it leaves 1 s after it was made.
        time.sleep(1.2)
        assert c.post("/v1/e", content=b"x").status_code == 200
