"""Bodies: decided once complete (end of stream or HTTP/2 trailers); bodies
above max_body_bytes are not fingerprinted, pass, and are counted.

Two Envoys, shared by the tests with the same configuration (plain, or with
a 1 KiB max_body_bytes): each test sends to paths of its own, reads the
upstream's requests to those paths only, and reads counters as deltas."""

import httpx
import pytest

from harness import bootstrap, h2_post, plugin, policy


@pytest.fixture
def plain_envoy(shared_upstream, shared_envoy):
    return shared_envoy(bootstrap(plugin([policy(threshold=2)]), shared_upstream.port))


@pytest.fixture
def limited_envoy(shared_upstream, shared_envoy):
    """max_body_bytes 1 KiB, with a buffer filter that takes bodies far larger."""
    cfg = plugin([policy(threshold=2)], max_body_bytes=1024)
    return shared_envoy(bootstrap(cfg, shared_upstream.port, buffer_bytes=4 << 20))


def sent(upstream, *paths: str) -> list[dict]:
    """The requests to these paths that reached the upstream."""
    return [r for r in upstream.requests if r["path"] in paths]


def test_body_less_requests_are_decided_in_the_headers_phase(shared_upstream, plain_envoy):
    e = plain_envoy
    with httpx.Client(base_url=e.url) as c:
        assert [c.get("/v1/status").status_code for _ in range(3)] == [200, 429, 429]
    assert len(sent(shared_upstream, "/v1/status")) == 1


def test_declared_oversize_body_passes_unfingerprinted(shared_upstream, limited_envoy):
    e = limited_envoy
    skipped = e.counter("loopguard.bodies_skipped_total.reason.too_large")
    big = b"x" * 4096
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/v1/big", content=big).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    assert e.counter("loopguard.bodies_skipped_total.reason.too_large") - skipped == 3
    assert [len(r["body"]) for r in sent(shared_upstream, "/v1/big")] == [4096] * 3


def chunks(data: bytes, size: int):
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_chunked_upload_crossing_the_limit_stops_buffering_and_passes(shared_upstream, limited_envoy):
    e = limited_envoy
    skipped = e.counter("loopguard.bodies_skipped_total.reason.too_large")
    data = b"y" * 8192
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/v1/chunked", content=chunks(data, 512)).status_code for _ in range(2)]
    assert codes == [200, 200]
    assert e.counter("loopguard.bodies_skipped_total.reason.too_large") - skipped == 2
    assert [r["body"] for r in sent(shared_upstream, "/v1/chunked")] == [data, data]


def test_chunked_upload_under_the_limit_is_fingerprinted_like_any_body(shared_upstream, plain_envoy):
    e = plain_envoy
    data = b'{"model":"m","input":"' + b"z" * 3000 + b'"}'
    with httpx.Client(base_url=e.url) as c:
        first = c.post("/v1/c", content=chunks(data, 700))
        # Same bytes with a content-length: the same request.
        second = c.post("/v1/c", content=data)
    assert (first.status_code, second.status_code) == (200, 429)
    assert sent(shared_upstream, "/v1/c")[0]["body"] == data


def test_http2_request_with_trailers_is_decided_in_the_trailers_phase(shared_upstream, plain_envoy):
    e = plain_envoy
    codes = [h2_post(e.port, "/v1/h2", b'{"a":1}', trailers=[("x-checksum", "abc")]) for _ in range(3)]
    assert codes == [200, 429, 429]
    assert len(sent(shared_upstream, "/v1/h2")) == 1
    assert sent(shared_upstream, "/v1/h2")[0]["body"] == b'{"a":1}'
    # Plain HTTP/2 without trailers behaves the same.
    assert [h2_post(e.port, "/v1/h2b", b"{}") for _ in range(2)] == [200, 429]
