"""Bodies: decided once complete (end of stream or HTTP/2 trailers); bodies
above max_body_bytes are not fingerprinted, pass, and are counted."""

import httpx

from harness import bootstrap, h2_post, plugin, policy


def test_body_less_requests_are_decided_in_the_headers_phase(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port))
    with httpx.Client(base_url=e.url) as c:
        assert [c.get("/v1/status").status_code for _ in range(3)] == [200, 429, 429]
    assert upstream.count == 1


def test_declared_oversize_body_passes_unfingerprinted(upstream, start_envoy):
    cfg = plugin([policy(threshold=2)], max_body_bytes=1024)
    e = start_envoy(bootstrap(cfg, upstream.port, buffer_bytes=4 << 20))
    big = b"x" * 4096
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/v1/big", content=big).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    assert e.counter("loopguard.bodies_skipped_total.reason.too_large") == 3
    assert [len(r["body"]) for r in upstream.requests] == [4096] * 3


def chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_chunked_upload_crossing_the_limit_stops_buffering_and_passes(upstream, start_envoy):
    cfg = plugin([policy(threshold=2)], max_body_bytes=1024)
    e = start_envoy(bootstrap(cfg, upstream.port, buffer_bytes=4 << 20))
    data = b"y" * 8192
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/v1/chunked", content=chunks(data, 512)).status_code for _ in range(2)]
    assert codes == [200, 200]
    assert e.counter("loopguard.bodies_skipped_total.reason.too_large") == 2
    assert [r["body"] for r in upstream.requests] == [data, data]


def test_chunked_upload_under_the_limit_is_fingerprinted_like_any_body(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port))
    data = b'{"model":"m","input":"' + b"z" * 3000 + b'"}'
    with httpx.Client(base_url=e.url) as c:
        first = c.post("/v1/c", content=chunks(data, 700))
        # Same bytes with a content-length: the same request.
        second = c.post("/v1/c", content=data)
    assert (first.status_code, second.status_code) == (200, 429)
    assert upstream.requests[0]["body"] == data


def test_http2_request_with_trailers_is_decided_in_the_trailers_phase(upstream, start_envoy):
    e = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port))
    codes = [h2_post(e.port, "/v1/h2", b'{"a":1}', trailers=[("x-checksum", "abc")]) for _ in range(3)]
    assert codes == [200, 429, 429]
    assert upstream.count == 1
    assert upstream.requests[0]["body"] == b'{"a":1}'
    # Plain HTTP/2 without trailers behaves the same.
    assert [h2_post(e.port, "/v1/h2b", b"{}") for _ in range(2)] == [200, 429]
