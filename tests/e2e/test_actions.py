"""Actions in real Envoy: throttle (delays measured by Envoy), warn (headers
to the client and the upstream), the escalation ladder, cooldown, shadow
mode and exemptions. Timing is asserted as harness.py's docstring says."""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from harness import (
    CLOCK_SLACK,
    ENVOY_HEADROOM,
    ROUTER,
    Schedule,
    bootstrap,
    buffer_filter,
    on_schedule,
    plugin,
    policy,
    wait_for,
    warn_header_mutation,
    loopguard_filter,
)


def timed(client, method, path, **kw):
    t0 = time.monotonic()
    r = client.request(method, path, **kw)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("target_ms", [100, 500, 1000])
def test_throttle_holds_the_request_for_its_delay(upstream, start_envoy, target_ms):
    # Threshold 2: the 2nd identical request is delayed 2 x step.
    cfg = plugin([policy(threshold=2, action="throttle", throttle_step_ms=target_ms // 2, throttle_max_delay_ms=10_000)])
    e = start_envoy(bootstrap(cfg, upstream.port), timing=True)
    with httpx.Client(base_url=e.url, timeout=10) as c:
        assert c.post("/v1/t", content=b"{}").status_code == 200  # allowed
        r, took = timed(c, "POST", "/v1/t", content=b"{}")
    assert r.status_code == 200
    assert r.headers["x-loopguard-delay-ms"] == str(target_ms)
    assert r.headers["x-loopguard-loop-count"] == "2"
    # Envoy held the whole request that long before it went upstream, by
    # Envoy's own clock: at least the delay, and not a step more (at 500 and
    # 1000 ms the headroom is under a step), whatever the client's scheduling.
    delay = target_ms / 1000
    held = e.timings(2)[1].held
    assert delay - CLOCK_SLACK <= held <= delay + ENVOY_HEADROOM, f"Envoy held it {held:.4f}s"
    assert took >= delay - CLOCK_SLACK, f"the client waited {took:.4f}s"
    assert upstream.count == 2
    assert e.counter("loopguard.throttled_total") == 1
    assert e.counter("loopguard.throttle_pending") == 0


def test_throttle_escalates_with_each_repeat_up_to_the_cap(upstream, start_envoy):
    cfg = plugin([policy(threshold=2, action="throttle", throttle_step_ms=50, throttle_max_delay_ms=180)])
    e = start_envoy(bootstrap(cfg, upstream.port))
    with httpx.Client(base_url=e.url, timeout=10) as c:
        c.get("/v1/esc")
        delays = [int(c.get("/v1/esc").headers["x-loopguard-delay-ms"]) for _ in range(4)]
    assert delays == [100, 150, 180, 180]


def test_two_hundred_parallel_throttled_requests_all_complete(upstream, start_envoy):
    cfg = plugin([policy(threshold=2, action="throttle", throttle_step_ms=2, throttle_max_delay_ms=400)])
    e = start_envoy(bootstrap(cfg, upstream.port, direct_response=True), concurrency=2)
    with httpx.Client(base_url=e.url) as c:
        assert c.post("/v1/par", content=b"same").status_code == 200

    def one(_):
        with httpx.Client(base_url=e.url, timeout=15) as c:
            r = c.post("/v1/par", content=b"same")
            return r.status_code, int(r.headers.get("x-loopguard-delay-ms", "0"))

    with ThreadPoolExecutor(200) as pool:
        results = list(pool.map(one, range(200)))
    assert [code for code, _ in results] == [200] * 200
    # Every one was throttled, the delays escalating with the count.
    delays = sorted(d for _, d in results)
    assert delays[0] == 4 and delays[-1] == 400
    assert e.counter("loopguard.throttled_total") == 200
    assert e.counter("loopguard.throttle_pending") == 0


def test_client_leaving_while_throttled_is_dropped_from_the_queue(upstream, start_envoy):
    cfg = plugin([policy(threshold=2, action="throttle", throttle_step_ms=1000, throttle_max_delay_ms=2000)])
    e = start_envoy(bootstrap(cfg, upstream.port))
    with httpx.Client(base_url=e.url) as c:
        assert c.get("/v1/leave").status_code == 200
    for _ in range(5):
        # Each is held 2 s: the client gives up long before.
        with pytest.raises(httpx.TimeoutException):
            httpx.get(f"{e.url}/v1/leave", timeout=0.2)
    last_left = time.monotonic()
    # Envoy may still be catching up with the clients that left.
    wait_for(lambda: e.counter("loopguard.throttled_total") == 5 and e.counter("loopguard.throttle_pending") == 0)
    assert e.counter("loopguard.throttle_pending") == 0
    assert e.counter("loopguard.throttled_total") == 5
    # Envoy is healthy and the upstream never saw the abandoned requests,
    # not even once their 2 s delay had passed.
    assert httpx.get(f"{e.admin}/ready").status_code == 200
    time.sleep(max(0.0, last_left + 2.0 + 0.5 - time.monotonic()))  # the time is the point: past the delay
    assert upstream.count == 1


def test_warn_headers_reach_client_and_upstream_with_and_without_a_body(upstream, start_envoy):
    cfg = plugin([policy("warn-p", threshold=2, action="warn")])
    filters = [loopguard_filter(cfg), buffer_filter(), warn_header_mutation(), ROUTER]
    e = start_envoy(bootstrap(None, upstream.port, http_filters=filters))
    with httpx.Client(base_url=e.url) as c:
        first = c.post("/v1/w", content=b'{"q": 1}')
        second = c.post("/v1/w", content=b'{"q": 1}')  # decided in the body phase
        c.get("/v1/g")
        third = c.get("/v1/g")  # decided in the headers phase
        spoof = c.post("/v1/other", content=b"x", headers={"x-loopguard-warning": "forged"})
    assert first.status_code == second.status_code == third.status_code == 200
    assert "x-loopguard-warning" not in first.headers
    for r in (second, third):
        assert r.headers["x-loopguard-warning"] == "loop_warn"
        assert r.headers["x-loopguard-loop-count"] == "2"
        assert r.headers["x-loopguard-policy"] == "warn-p"
    seen = [r["headers"] for r in upstream.requests]
    assert "x-loopguard-warning" not in seen[0]
    for h in (seen[1], seen[3]):
        assert (h["x-loopguard-warning"], h["x-loopguard-loop-count"], h["x-loopguard-policy"]) == ("loop_warn", "2", "warn-p")
    # A client cannot forge the warning the upstream sees.
    assert "x-loopguard-warning" not in seen[4]
    assert e.counter("loopguard.warned_total") == 2


def test_warn_without_header_mutation_reaches_upstream_only_for_bodyless_requests(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy(threshold=2, action="warn")]), upstream.port))
    with httpx.Client(base_url=e.url) as c:
        for _ in range(2):
            c.post("/v1/b", content=b"x")
            c.get("/v1/g")
    seen = {(r["method"], i): r["headers"] for i, r in enumerate(upstream.requests)}
    assert "x-loopguard-warning" not in seen[("POST", 2)]
    assert seen[("GET", 3)]["x-loopguard-warning"] == "loop_warn"


def test_escalation_ladder_warns_then_throttles_then_rejects(upstream, start_envoy):
    ladder = [{"at": 3, "action": "warn"}, {"at": 5, "action": "throttle"}, {"at": 8, "action": "reject"}]
    cfg = plugin([policy("ladder", threshold=None, window=60, escalation=ladder, throttle_step_ms=20, throttle_max_delay_ms=1000)])
    e = start_envoy(bootstrap(cfg, upstream.port))
    seen = []
    with httpx.Client(base_url=e.url, timeout=10) as c:
        for _ in range(9):
            r, took = timed(c, "POST", "/v1/l", content=b"same")
            seen.append((r.status_code, r.headers.get("x-loopguard-warning"), r.headers.get("x-loopguard-delay-ms"), took))
    assert [s[0] for s in seen] == [200] * 7 + [429, 429]
    assert [s[1] for s in seen[:7]] == [None, None, "loop_warn", "loop_warn", None, None, None]
    assert [s[2] for s in seen[:7]] == [None] * 4 + ["100", "120", "140"]
    # The client waited at least each delay (the lower bound is what a
    # busy machine cannot break).
    assert [s[3] >= int(s[2]) / 1000 - CLOCK_SLACK for s in seen[4:7]] == [True] * 3, [s[3] for s in seen[4:7]]
    # Retry-After of the ladder's reject: until the 8th step is no longer
    # reached, i.e. until the 7th newest hit (the 2nd request) leaves the 60 s window.
    assert upstream.count == 7
    assert e.counter("loopguard.warned_total") == 2
    assert e.counter("loopguard.throttled_total") == 3
    assert e.counter("loopguard.rejected_total") == 2


def test_ladder_retry_after_is_time_until_no_longer_rejected(upstream, start_envoy):
    ladder = [{"at": 2, "action": "warn"}, {"at": 3, "action": "reject"}]
    cfg = plugin([policy(threshold=None, window=3, escalation=ladder)])
    e = start_envoy(bootstrap(cfg, upstream.port))

    def scenario(attempt):
        with httpx.Client(base_url=e.url) as c:
            s = Schedule()
            hit = lambda: s.send(lambda: c.get(f"/v1/r/{attempt}"))  # noqa: E731
            first = hit()
            s.at(first.end + 1.2)
            second = hit()
            third = hit()
            s.ensure(third.within(3.0, of=first), "three hits within one 3 s window")
            s.ensure(third.within(1.0, of=second), "the 3rd hit less than 1 s after the 2nd")
            assert second.response.headers["x-loopguard-warning"] == "loop_warn"
            r = third.response
            assert r.status_code == 429
            # The 2nd newest hit (t=1.2) leaves at 4.2, about 3 s from now;
            # a warn-level count (2) is no longer a reject.
            assert r.headers["retry-after"] == "3"
            least, most = third.since(second)
            ms = int(r.headers["retry-after-ms"])
            assert (3 - most - CLOCK_SLACK) * 1000 <= ms <= (3 - least + CLOCK_SLACK) * 1000, (ms, least, most)
            # Once that time has passed, it is allowed again.
            s.at(third.end + ms / 1000 + 0.1)
            assert hit().response.status_code == 200

    on_schedule(scenario)


def test_cooldown_rejects_until_it_ends_even_after_the_window_clears(upstream, start_envoy):
    cfg = plugin([policy("cool", threshold=2, window=1, cooldown_seconds=3)])
    e = start_envoy(bootstrap(cfg, upstream.port))

    def scenario(attempt):
        with httpx.Client(base_url=e.url) as c:
            s = Schedule()
            hit = lambda: s.send(lambda: c.get(f"/v1/c/{attempt}"))  # noqa: E731
            assert hit().response.status_code == 200
            trip = hit()  # trips: the cooldown starts now
            r = trip.response
            assert r.status_code == 429
            assert r.headers["retry-after"] == "3"
            assert r.json()["error"]["cooldown_seconds"] == 3
            s.at(trip.end + 1.6)  # the window (1 s) is clear, the cooldown is not
            later = hit()
            s.ensure(later.within(2.0, of=trip), "the second reject less than 2 s after the trip")
            r = later.response
            assert r.status_code == 429
            assert r.headers["retry-after"] == "2"  # ~1.4 s of cooldown left
            least, most = later.since(trip)
            ms = int(r.headers["retry-after-ms"])
            assert (3 - most - CLOCK_SLACK) * 1000 <= ms <= (3 - least + CLOCK_SLACK) * 1000, (ms, least, most)
            # That reject did not extend the cooldown: it ends 3 s after the
            # trip, long before 3 s after that reject.
            s.at(trip.end + 3.3)
            after = hit()
            s.ensure(after.within(3.0, of=later), "the last request less than 3 s after the second reject")
            assert after.response.status_code == 200

    on_schedule(scenario)


def test_shadow_mode_enforces_nothing_and_shows_no_header(upstream, start_envoy):
    cfg = plugin([policy("watch", threshold=2, mode="shadow"), policy("warned", threshold=2, action="warn", mode="shadow", selector={"pathPrefix": "/w"})])
    cfg["policies"].reverse()
    e = start_envoy(bootstrap(cfg, upstream.port))
    with httpx.Client(base_url=e.url) as c:
        rs = [c.post("/v1/s", content=b"same") for _ in range(4)] + [c.get("/w/x") for _ in range(2)]
    assert [r.status_code for r in rs] == [200] * 6
    for r in rs:
        assert not any(k.startswith("x-loopguard") for k in r.headers)
    for r in upstream.requests:
        assert not any(k.startswith("x-loopguard") for k in r["headers"])
    assert upstream.count == 6
    log = e.log()
    assert log.count('shadow: would_reject policy="watch"') == 3
    assert log.count('shadow: would_warn policy="warned"') == 1
    # Counts are capped at what the policy needs to decide (its threshold).
    assert 'would_reject policy="watch" fingerprint=' in log and "count=2" in log
    assert e.counter("loopguard.shadow_total") == 4
    assert e.counter("loopguard.rejected_total") == 0


def test_top_level_shadow_overrides_every_policy(upstream, start_envoy):
    cfg = plugin([policy("p", threshold=2)], shadow=True)
    e = start_envoy(bootstrap(cfg, upstream.port))
    with httpx.Client(base_url=e.url) as c:
        assert [c.get("/v1/x").status_code for _ in range(3)] == [200] * 3
    assert e.counter("loopguard.shadow_total") == 2


def test_exempt_requests_are_never_counted(upstream, start_envoy):
    exempt = [{"key": "header:x-batch-id", "present": True}, {"key": "header:x-api-key-id", "values": ["ci-runner"]}]
    e = start_envoy(bootstrap(plugin([policy(threshold=2, exempt=exempt)]), upstream.port))
    with httpx.Client(base_url=e.url) as c:
        batch = [c.post("/v1/e", content=b"same", headers={"x-batch-id": "batch-2026-11-22-1"}).status_code for _ in range(5)]
        ci = [c.post("/v1/e", content=b"same", headers={"x-api-key-id": "ci-runner"}).status_code for _ in range(5)]
        # Exempt requests left no hits behind: an ordinary one starts at 1.
        other = [c.post("/v1/e", content=b"same", headers={"x-api-key-id": "prod"}).status_code for _ in range(2)]
    assert batch == ci == [200] * 5
    assert other == [200, 429]
    assert e.counter("loopguard.exempted_total") == 10
