"""The one-filter setup: Envoy's allow_on_headers_stop_iteration lets
loopguard hold a request's headers until it has judged the body
(`hold_request_headers`), so no buffer or header_mutation filter is needed.
Proven here: the upstream never sees a rejected request, warn and tool-loop
headers reach the upstream directly, bodies up to max_body_bytes work
(chunked too), throttles hold, and a configuration that asks to hold
headers without Envoy's setting is detected instead of hanging requests."""

import json
import time

import httpx
import pytest

from harness import ROUTER, Upstream, bootstrap, plugin, policy, stuck_model, wasm_filter

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Is the build green?"}]}


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
    assert upstream.count == 4
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
    e = start_envoy(bootstrap(cfg, upstream.port, hold=True))
    with httpx.Client(base_url=e.url) as c:
        c.post("/v1/t", content=b"{}")
        t0 = time.monotonic()
        r = c.post("/v1/t", content=b"{}")
        took = time.monotonic() - t0
    assert r.status_code == 200
    assert r.headers["x-loopguard-delay-ms"] == "300"
    assert 0.275 <= took <= 0.6, took
    assert upstream.count == 2


def test_tool_loop_notes_and_headers_without_buffer_or_header_mutation(start_envoy):
    stuck = Upstream(responder=stuck_model)
    try:
        tool = {"id": "agents", "spec": {"selector": {"pathPrefix": "/v1"}, "tool_loops": {"enabled": True}}}
        e = start_envoy(bootstrap(plugin([tool]), stuck.port, hold=True))
        msgs = [{"role": "user", "content": "read the config"}]
        for i in range(3):
            msgs.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "/etc/app.conf"}'}}]})
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "no change"})
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


def test_holding_without_envoys_setting_is_detected_and_released(upstream, start_envoy):
    """hold_request_headers without allow_on_headers_stop_iteration: Envoy
    would never deliver the body. The first held request on each worker is
    released after 1 s, holding turns off with one error line, and loops
    are still caught (judged after the headers went upstream)."""
    cfg = plugin([policy(threshold=3)], hold_request_headers=True)
    e = start_envoy(bootstrap(None, upstream.port, http_filters=[wasm_filter(cfg), ROUTER]), concurrency=1)
    with httpx.Client(base_url=e.url, timeout=10) as c:
        t0 = time.monotonic()
        first = c.post("/v1/p", content=b'{"n": 1}')
        first_took = time.monotonic() - t0
        t0 = time.monotonic()
        rest = [c.post("/v1/p", content=b'{"n": 1}').status_code for _ in range(3)]
        rest_took = time.monotonic() - t0
    assert first.status_code == 200
    assert 0.95 <= first_took <= 1.6, first_took
    assert rest == [200, 429, 429]
    assert rest_took < 0.5, rest_took
    assert e.counter("loopguard.hold_released_total") == 1
    log = e.log()
    assert log.count("Envoy delivered no body to a request held in the headers phase") == 1
    assert "set allow_on_headers_stop_iteration: true" in log
    # Without held headers (and without a buffer filter) the rejected
    # requests' headers went upstream before the verdict; their bodies never
    # did.
    bodies = [r["body"] for r in upstream.requests]
    assert bodies[:2] == [b'{"n": 1}'] * 2
    assert all(b == b"" for b in bodies[2:])


@pytest.mark.parametrize("hold", [False, True], ids=["buffer-filter", "one-filter"])
def test_both_setups_reject_the_same_loop_identically(upstream, start_envoy, hold):
    e = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port, hold=hold))
    with httpx.Client(base_url=e.url) as c:
        rs = [c.post("/v1/same", content=b'{"q": 1}') for _ in range(3)]
    assert [r.status_code for r in rs] == [200, 429, 429]
    assert rs[1].json()["error"]["code"] == "recursive_loop_detected"
    assert upstream.count == 1
