"""The sliding window in real time (windows of 2 s). Each step is planned
with hundreds of ms of margin around the boundary it tests, and judged by
when its request was really in flight (harness.Schedule): a step that ran too
late to prove its point re-plans the scenario rather than failing it."""

import httpx

from harness import Schedule, bootstrap, on_schedule, plugin, policy, sliding_window_boundary


def n3_w2(upstream, shared_envoy):
    """N=3, W=2 s: one Envoy shared by the two tests below (each sends to
    paths of its own, /v1/w/... and /v1/t/..., and reads only those)."""
    return shared_envoy(bootstrap(plugin([policy(threshold=3, window=2)]), upstream.port))


def test_sliding_not_fixed_window_and_rejected_hits_count(shared_upstream, shared_envoy):
    upstream = shared_upstream
    e = n3_w2(upstream, shared_envoy)

    def scenario(attempt):
        path = f"/v1/w/{attempt}"
        with httpx.Client(base_url=e.url) as c:
            sliding_window_boundary(Schedule(), lambda i: c.post(path, content=b"same"))
        assert [r["path"] for r in upstream.requests].count(path) == 3

    on_schedule(scenario)


def test_not_a_ttl_refreshed_on_every_hit(shared_upstream, shared_envoy):
    """Hits 1.1 s apart with N=3, W=2 s: each sees only one earlier hit in its
    window, so a loop this slow is never stopped. A counter whose TTL is
    refreshed on every hit would block the third."""
    e = n3_w2(shared_upstream, shared_envoy)

    def scenario(attempt):
        codes, hits = [], []
        with httpx.Client(base_url=e.url) as c:
            s = Schedule()
            for i in range(5):
                # 1.1 s after the previous hit, and never less than a window
                # after the one before it.
                if hits:
                    s.at(max(hits[-1].end + 1.1, hits[-2].end + 2.0 + 0.1 if len(hits) > 1 else 0.0))
                hits.append(s.send(lambda: c.post(f"/v1/t/{attempt}", content=b"same")))
                if len(hits) > 1:
                    # Less than a window apart: a refreshed TTL never lapses.
                    s.ensure(hits[-1].within(2.0, of=hits[-2]), "consecutive hits less than a window apart")
                codes.append(hits[-1].response.status_code)
        assert codes == [200] * 5

    on_schedule(scenario)


def test_window_expiry_allows_again_after_retry_after(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy(threshold=2, window=1)]), upstream.port))

    def scenario(attempt):
        with httpx.Client(base_url=e.url) as c:
            s = Schedule()
            hit = lambda: s.send(lambda: c.post(f"/v1/e/{attempt}", content=b"x"))  # noqa: E731
            first = hit()
            assert first.response.status_code == 200
            second = hit()
            s.ensure(second.within(1.0, of=first), "the 2nd hit within the 1 s window of the 1st")
            r = second.response
            assert r.status_code == 429
            assert r.headers["retry-after"] == "1"
            s.at(second.end + 0.5)
            third = hit()
            s.ensure(third.within(1.0, of=second), "the 3rd hit within the window of the 2nd")
            assert third.response.status_code == 429
            # The hit just rejected is the newest; it leaves 1 s after it was made.
            s.at(third.end + 1.2)
            assert hit().response.status_code == 200

    on_schedule(scenario)
