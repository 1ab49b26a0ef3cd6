"""The one-filter setup: Envoy's allow_on_headers_stop_iteration lets
loopguard hold a request's headers until it has judged the body
(`hold_request_headers`), so no buffer or header_mutation filter is needed.
Proven here: the upstream never sees a rejected request, warn and tool-loop
headers reach the upstream directly, bodies up to max_body_bytes work
(chunked too), throttles hold, and a configuration that asks to hold
headers without Envoy's setting is detected instead of hanging requests."""

import json
import socket
import threading
import time

import httpx
import pytest

from harness import (
    CLOCK_SLACK,
    ENVOY_HEADROOM,
    HOST,
    ROUTER,
    Upstream,
    bootstrap,
    h2_post,
    plugin,
    policy,
    stuck_model,
    wasm_filter,
)

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Is the build green?"}]}


def read_file_loop(n: int) -> list[dict]:
    """A conversation in which the model called read_file on the same path
    n times."""
    msgs = [{"role": "user", "content": "read the config"}]
    for i in range(n):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "/etc/app.conf"}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "no change"})
    return msgs


def chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_a_rejected_request_never_reaches_the_upstream(upstream, start_envoy):
    cfg = bootstrap(plugin([policy(threshold=3, similarity="llm_tail")]), upstream.port, hold=True)
    names = [f["name"] for f in cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]]
    assert names == ["loopguard", "envoy.filters.http.router"], "one filter: no buffer, no header_mutation"
    e = start_envoy(cfg)
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-hold"}) as c:
        codes = [c.post("/v1/chat/completions", json=CHAT).status_code for _ in range(5)]
        # Body-less requests are judged in the headers phase as before.
        gets = [c.get("/v1/models").status_code for _ in range(4)]
    assert codes == [200, 200, 429, 429, 429]
    assert gets == [200, 200, 429, 429]
    # Not even the headers of a rejected request went upstream.
    assert upstream.count == upstream.arrived == 4
    assert [json.loads(r["body"]) for r in upstream.requests[:2]] == [CHAT, CHAT]
    assert e.counter("loopguard.hold_released_total") == 0


def test_warn_headers_reach_the_upstream_directly_and_forged_ones_are_dropped(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy("warn-p", threshold=2, action="warn")]), upstream.port, hold=True))
    forged = {"x-loopguard-warning": "forged", "x-loopguard-policy": "forged", "x-loopguard-tool-loop": "forged"}
    with httpx.Client(base_url=e.url) as c:
        responses = [c.post("/v1/w", content=b'{"same": true}', headers=forged) for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert "x-loopguard-warning" not in responses[0].headers
    for r in responses[1:]:
        # The count is kept up to what the policy needs (its threshold).
        assert (r.headers["x-loopguard-warning"], r.headers["x-loopguard-loop-count"]) == ("loop_warn", "2")
    seen = [r["headers"] for r in upstream.requests]
    # The client's forged headers never reach the upstream.
    assert not any(k.startswith("x-loopguard") for k in seen[0])
    for h in seen[1:]:
        assert (h["x-loopguard-warning"], h["x-loopguard-loop-count"], h["x-loopguard-policy"]) == ("loop_warn", "2", "warn-p")
        assert "x-loopguard-tool-loop" not in h
    # The body went upstream unchanged, with its length.
    assert all(r["body"] == b'{"same": true}' and r["headers"]["content-length"] == "14" for r in upstream.requests)


def test_bodies_up_to_max_body_bytes_are_judged_and_larger_ones_pass(upstream, start_envoy):
    """Envoy buffers a held request's body up to the listener's
    per_connection_buffer_limit_bytes: raise it with max_body_bytes."""
    cfg = plugin([policy(threshold=2)], max_body_bytes=3 << 20)
    e = start_envoy(bootstrap(cfg, upstream.port, hold=True, buffer_limit=4 << 20))
    big = b"a" * (3 << 20)
    bigger = b"b" * ((3 << 20) + 1)
    with httpx.Client(base_url=e.url, timeout=30) as c:
        at_limit = [c.post("/v1/big", content=big).status_code for _ in range(2)]
        chunked = [c.post("/v1/chunked", content=chunks(big[: 1 << 20], 64 << 10)).status_code for _ in range(2)]
        over = [c.post("/v1/bigger", content=bigger).status_code for _ in range(2)]
        over_chunked = [c.post("/v1/bigger-chunked", content=chunks(bigger, 256 << 10)).status_code for _ in range(2)]
    assert at_limit == [200, 429]
    assert chunked == [200, 429]
    assert over == [200, 200]
    assert over_chunked == [200, 200]
    assert e.counter("loopguard.bodies_skipped_total.reason.too_large") == 4
    bodies = [r["body"] for r in upstream.requests]
    assert bodies == [big, big[: 1 << 20], bigger, bigger, bigger, bigger]


def test_a_throttled_body_request_is_held_then_forwarded(upstream, start_envoy):
    cfg = plugin([policy(threshold=2, action="throttle", throttle_step_ms=150, throttle_max_delay_ms=1000)])
    e = start_envoy(bootstrap(cfg, upstream.port, hold=True), timing=True)
    with httpx.Client(base_url=e.url) as c:
        c.post("/v1/t", content=b"{}")
        t0 = time.monotonic()
        r = c.post("/v1/t", content=b"{}")
        took = time.monotonic() - t0
    assert r.status_code == 200
    assert r.headers["x-loopguard-delay-ms"] == "300"
    # Nothing went upstream, not even the headers, until the delay had
    # passed: by Envoy's clock, from the whole request received.
    held = e.timings(2)[1].held
    assert 0.3 - CLOCK_SLACK <= held <= 0.3 + ENVOY_HEADROOM, held
    assert took >= 0.3 - CLOCK_SLACK, took
    assert upstream.count == 2


def test_tool_loop_notes_and_headers_without_buffer_or_header_mutation(start_envoy):
    stuck = Upstream(responder=stuck_model)
    try:
        tool = {"id": "agents", "spec": {"selector": {"pathPrefix": "/v1"}, "tool_loops": {"enabled": True}}}
        e = start_envoy(bootstrap(plugin([tool]), stuck.port, hold=True))
        msgs = read_file_loop(3)
        body = json.dumps({"model": "gpt-4o-mini", "messages": msgs}).encode()
        r = httpx.post(f"{e.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200
        assert r.headers["x-loopguard-tool-loop"] == "identical;tool=read_file;level=1"
        got = stuck.requests[0]
        assert got["headers"]["x-loopguard-tool-loop"] == "identical;tool=read_file;level=1"
        # The note was appended and content-length set to the new size.
        assert int(got["headers"]["content-length"]) == len(got["body"]) > len(body)
        sent = json.loads(got["body"])
        assert sent["messages"][:-1] == msgs
        assert "called the tool `read_file` 3 times" in sent["messages"][-1]["content"]
    finally:
        stuck.stop()


@pytest.mark.skipif(HOST == "native", reason="the Wasm filter without allow_on_headers_stop_iteration: a dynamic module may always hold")
def test_holding_without_envoys_setting_is_detected_and_released(upstream, start_envoy):
    """hold_request_headers without allow_on_headers_stop_iteration: Envoy
    would never deliver the body. A held request is released after 1 s; the
    third released request (no body ever confirmed) turns holding off with
    one error line, and loops are still caught (judged after the headers
    went upstream)."""
    cfg = plugin([policy(threshold=3)], hold_request_headers=True)
    e = start_envoy(bootstrap(None, upstream.port, http_filters=[wasm_filter(cfg), ROUTER]), concurrency=1, timing=True)
    with httpx.Client(base_url=e.url, timeout=10) as c:
        took = []
        for i in range(3):
            t0 = time.monotonic()
            assert c.post("/v1/p", content=b'{"n": %d}' % i).status_code == 200
            took.append(time.monotonic() - t0)
        rest = [c.post("/v1/p", content=b'{"n": 1}').status_code for _ in range(3)]
    assert rest == [200, 429, 429]
    # By Envoy's clock: the first three were held for the 1 s probe (from
    # their first byte to their headers going upstream), then released; the
    # next three were no longer held: each was answered in less than half
    # the probe.
    timed = e.timings(6)
    held = [t.headers_held for t in timed[:3]]
    assert all(1.0 - CLOCK_SLACK <= h <= 1.0 + ENVOY_HEADROOM for h in held), held
    answered = [t.total for t in timed[3:]]
    assert all(a < 0.5 for a in answered), answered
    assert all(t >= 1.0 - CLOCK_SLACK for t in took), took
    assert e.counter("loopguard.hold_released_total") == 3
    log = e.log()
    assert log.count("Envoy delivered no body to 3 requests held in the headers phase") == 1
    assert "set allow_on_headers_stop_iteration: true" in log
    # Without held headers (and without a buffer filter) the rejected
    # requests' headers went upstream before the verdict; their bodies never
    # did.
    bodies = [r["body"] for r in upstream.requests]
    assert bodies[:4] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}', b'{"n": 1}']
    assert all(b == b"" for b in bodies[4:])


@pytest.mark.skipif(HOST == "native", reason="the Wasm filter without allow_on_headers_stop_iteration: a dynamic module may always hold")
def test_the_probe_releases_held_requests_while_new_ones_keep_arriving(upstream, start_envoy):
    """Without Envoy's setting, a burst of held requests, one every 1-2 ms
    (faster than the 5 ms tick; loopguard arms the tick once rather than on
    every request): the first one is still answered about 1 s after it was
    sent, not when the burst stops."""
    cfg = plugin([policy(threshold=1000)], hold_request_headers=True)
    e = start_envoy(bootstrap(None, upstream.port, http_filters=[wasm_filter(cfg), ROUTER]), concurrency=1, timing=True)
    request = b"POST /v1/burst HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
    first = b"POST /v1/burst/first HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"
    socks: list[socket.socket] = []
    first_answer: list[float] = []
    t0 = time.monotonic()

    def wait_first(s: socket.socket) -> None:
        s.settimeout(10)
        if s.recv(64).startswith(b"HTTP/1.1 200"):
            first_answer.append(time.monotonic() - t0)

    try:
        while time.monotonic() - t0 < 2.5:  # a request every ~1-2 ms
            s = socket.create_connection(("127.0.0.1", e.port))
            s.sendall(request if socks else first)
            socks.append(s)
            if len(socks) == 1:
                watcher = threading.Thread(target=wait_first, args=(s,))
                watcher.start()
            time.sleep(0.001)
        burst = time.monotonic() - t0
        burst_ended = time.time()  # the clock of Envoy's start times
        watcher.join(10)
        assert first_answer, "the first held request was never answered"
        # The client saw the answer before the burst ended...
        assert first_answer[0] < burst, (first_answer, burst)
    finally:
        for s in socks:
            s.close()
    # ...and by Envoy's clock the first request was held for the 1 s probe
    # (a busy worker fires the tick late; here, with the burst on Envoy's
    # one worker, by up to ~0.3 s), and released while requests were still
    # arriving, not once the burst (2.5 s) was over.
    (timed,) = e.timings(1, path="/v1/burst/first")
    assert timed.headers_held >= 1.0 - CLOCK_SLACK, timed
    assert timed.start + timed.headers_held < burst_ended, (timed, burst_ended)
    assert e.counter("loopguard.hold_released_total") >= 3


def test_tunnels_are_judged_on_their_headers_and_never_held(upstream, start_envoy):
    """A WebSocket upgrade sends nothing until it is answered: judged in the
    headers phase, never held for a body that cannot come."""
    cfg = bootstrap(plugin([policy(threshold=3)]), upstream.port, hold=True)
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["upgrade_configs"] = [{"upgrade_type": "websocket"}]
    e = start_envoy(cfg, concurrency=1)
    ws = {"connection": "upgrade", "upgrade": "websocket", "sec-websocket-version": "13", "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ=="}
    with httpx.Client(base_url=e.url, timeout=10) as c:
        codes = [c.get("/v1/realtime", headers=ws).status_code for _ in range(4)]
    # The test upstream does not speak WebSocket and answers 200; what
    # matters is that loopguard counted the upgrade requests at once.
    assert codes == [200, 200, 429, 429]
    assert e.counter("loopguard.hold_released_total") == 0
    assert upstream.arrived == 2


def test_held_request_with_trailers_and_no_data(upstream, start_envoy):
    """HTTP/2 with trailers right after the headers: no body callback, the
    trailers end the request; it is judged and the probe confirmed."""
    e = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port, hold=True), concurrency=1)
    codes = [h2_post(e.port, "/v1/t", b"", trailers=[("x-checksum", "0")]) for _ in range(3)]
    with_data = [h2_post(e.port, "/v1/d", b'{"a":1}', trailers=[("x-checksum", "1")]) for _ in range(2)]
    assert codes == [200, 429, 429]
    assert with_data == [200, 429]
    assert upstream.arrived == 2
    assert e.counter("loopguard.hold_released_total") == 0


def test_a_client_leaving_before_its_body_leaves_nothing_behind(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port, hold=True), concurrency=1)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", e.port)) as s:
            s.sendall(b"POST /v1/gone HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{")
    time.sleep(1.5)  # the time is the point: past the probe's 1 s watch, a request still kept would be released
    with httpx.Client(base_url=e.url) as c:
        assert [c.post("/v1/after", content=b"{}").status_code for _ in range(2)] == [200, 429]
    assert upstream.arrived == 1
    assert e.counter("loopguard.hold_released_total") == 0


def test_held_body_above_the_listener_buffer_limit_is_answered_413(upstream, start_envoy):
    """max_body_bytes above per_connection_buffer_limit_bytes: Envoy stops a
    held body at its own limit (`loopguard check` warns about this)."""
    cfg = plugin([policy(threshold=2)], max_body_bytes=3 << 20)
    e = start_envoy(bootstrap(cfg, upstream.port, hold=True))
    with httpx.Client(base_url=e.url, timeout=30) as c:
        r = c.post("/v1/big", content=b"z" * (2 << 20))
        small = c.post("/v1/big", content=b"z" * (512 << 10))
    assert r.status_code == 413
    assert small.status_code == 200
    assert upstream.arrived == 1


def test_tool_loop_reject_in_the_one_filter_setup(start_envoy):
    stuck = Upstream(responder=stuck_model)
    try:
        tool = {"id": "agents", "spec": {"selector": {"pathPrefix": "/v1"}, "tool_loops": {"enabled": True, "ladder": ["reject"]}}}
        e = start_envoy(bootstrap(plugin([tool]), stuck.port, hold=True))
        msgs = read_file_loop(3)
        r = httpx.post(f"{e.url}/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": msgs})
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "tool_loop_detected"
        assert stuck.arrived == 0
    finally:
        stuck.stop()


@pytest.mark.parametrize("hold", [False, True], ids=["buffer-filter", "one-filter"])
def test_both_setups_reject_the_same_loop_identically(upstream, start_envoy, hold):
    e = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port, hold=hold))
    with httpx.Client(base_url=e.url) as c:
        rs = [c.post("/v1/same", content=b'{"q": 1}') for _ in range(3)]
    assert [r.status_code for r in rs] == [200, 429, 429]
    assert rs[1].json()["error"]["code"] == "recursive_loop_detected"
    assert upstream.count == 1
