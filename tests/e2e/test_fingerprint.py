"""What makes two requests identical (exact similarity), observed through the
real filter: a pair is 'the same' when the second one of it trips a threshold
of 2, and 'different' when it does not."""

import base64
import json

import httpx
import pytest

from harness import bootstrap, plugin, policy


def jwt(claims: dict) -> str:
    enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{enc({'alg': 'none'})}.{enc(claims)}.sig"


@pytest.fixture
def guard(shared_upstream, shared_envoy, start_envoy):
    """The guarded Envoy. Without limit keys it is one Envoy shared by the
    module's tests (none reads the upstream or a counter, and each sends
    requests no other test sends: its own paths, bodies or API keys); with
    them, the test's own."""

    def make(limit_keys=None):
        cfg = bootstrap(plugin([policy(threshold=2, window=60, limit_keys=limit_keys)]), shared_upstream.port)
        return shared_envoy(cfg) if limit_keys is None else start_envoy(cfg)

    return make


def same(envoy, first: dict, second: dict) -> bool:
    """Send `first` then `second` on fresh connections; True if the second
    one was counted as a repeat of the first (429)."""

    def send(req: dict) -> int:
        req = dict(req)
        local = req.pop("local_address", None)
        transport = httpx.HTTPTransport(local_address=local) if local else None
        with httpx.Client(base_url=envoy.url, transport=transport) as c:
            return c.request(req.pop("method", "POST"), req.pop("url", "/v1/x"), **req).status_code

    assert send(first) == 200
    return send(second) == 429


def test_body_changes_the_fingerprint(guard):
    e = guard()
    assert not same(e, {"content": b'{"a":1}'}, {"content": b'{"a":2}'})
    assert same(e, {"content": b'{"b":1}'}, {"content": b'{"b":1}'})
    # Byte-exact: whitespace in the body matters in exact mode.
    assert not same(e, {"content": b'{"c":1}'}, {"content": b'{"c": 1}'})


def test_query_order_does_not_matter_but_values_do(guard):
    e = guard()
    assert same(e, {"url": "/v1/q?a=1&a=2&b=3"}, {"url": "/v1/q?b=3&a=2&a=1"})
    assert not same(e, {"url": "/v1/r?a=1&a=2"}, {"url": "/v1/r?a=1"})
    assert not same(e, {"url": "/v1/s?a=1"}, {"url": "/v1/s?a=2"})


def test_method_and_path_change_the_fingerprint(guard):
    e = guard()
    assert not same(e, {"method": "POST", "url": "/v1/m"}, {"method": "PUT", "url": "/v1/m"})
    assert not same(e, {"url": "/v1/p1"}, {"url": "/v1/p2"})
    assert same(e, {"method": "GET", "url": "/v1/g"}, {"method": "GET", "url": "/v1/g"})


def test_header_limit_key(guard):
    e = guard(["header:x-org-id"])
    assert not same(e, {"headers": {"x-org-id": "a"}}, {"headers": {"x-org-id": "b"}})
    assert same(e, {"headers": {"x-org-id": "c"}}, {"headers": {"x-org-id": "c"}})
    # Absent and present-but-empty are different callers.
    assert not same(e, {"url": "/v1/h"}, {"url": "/v1/h", "headers": {"x-org-id": ""}})


def test_query_limit_key(guard):
    e = guard(["query:user"])
    assert not same(e, {"url": "/v1/x?user=a"}, {"url": "/v1/x?user=b"})
    assert same(e, {"url": "/v1/y?user=a&user=b"}, {"url": "/v1/y?user=b&user=a"})


def test_jwt_limit_key(guard):
    e = guard(["jwt:sub"])
    h = lambda sub, extra=0: {"headers": {"authorization": f"Bearer {jwt({'sub': sub, 'iat': extra})}"}}  # noqa: E731
    assert not same(e, h("alice"), h("bob"))
    # Only the configured claim matters: a fresh token for the same subject
    # is the same caller.
    assert same(e, h("carol", 1), h("carol", 2))


def test_ip_limit_key(guard):
    e = guard(["ip:address"])
    assert not same(e, {"local_address": "127.0.0.1"}, {"local_address": "127.0.0.2"})
    # A new connection (new source port) from the same address is the same caller.
    assert same(e, {"local_address": "127.0.0.3"}, {"local_address": "127.0.0.3"})


def test_default_identity_is_the_api_key(guard):
    """Without limit keys, twenty users sending the same prompt never share a
    counter: the caller is a hash of their API key."""
    e = guard()
    body = b'{"model":"m","messages":[{"role":"user","content":"same prompt"}]}'
    for i in range(20):
        assert not same(
            e,
            {"content": body, "headers": {"authorization": f"Bearer sk-user-{i}"}},
            {"content": body, "headers": {"authorization": f"Bearer sk-user-{i + 100}"}},
        )
    assert same(e, {"content": body, "headers": {"x-api-key": "sk-ant-1"}}, {"content": body, "headers": {"x-api-key": "sk-ant-1"}})


def test_raw_api_key_never_appears_in_responses_or_logs(guard):
    e = guard()
    secret = "sk-live-SECRET-1234567890"
    with httpx.Client(base_url=e.url, headers={"authorization": f"Bearer {secret}"}) as c:
        c.post("/v1/x", content=b"{}")
        r = c.post("/v1/x", content=b"{}")
    assert r.status_code == 429
    assert secret not in r.text and secret not in str(r.headers)
    assert secret not in e.log()
