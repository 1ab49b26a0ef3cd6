"""The reject action: the Nth identical request gets a 429 the SDKs understand,
and the upstream never sees it."""

import json
import math

import httpx

from harness import bootstrap, plugin, policy

BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Summarise the report"}]}


def post(client, body=BODY, **kw):
    return client.post("/v1/chat/completions", content=json.dumps(body), headers={"content-type": "application/json"}, **kw)


def test_threshold_is_reached_exactly_at_n(upstream, start_envoy):
    envoy = start_envoy(bootstrap(plugin([policy(threshold=5, window=60)]), upstream.port))
    with httpx.Client(base_url=envoy.url) as c:
        codes = [post(c).status_code for _ in range(7)]
    assert codes == [200, 200, 200, 200, 429, 429, 429]
    # Requests 1..N-1 reached the upstream; the rejected ones did not.
    assert upstream.count == 4
    assert envoy.counter("loopguard.rejected_total") == 3
    assert envoy.counter("loopguard.requests_total") == 7


def test_rejection_headers_and_openai_error_body(upstream, start_envoy):
    envoy = start_envoy(bootstrap(plugin([policy("llm-policy", threshold=3, window=60)]), upstream.port))
    with httpx.Client(base_url=envoy.url) as c:
        for _ in range(2):
            assert post(c).status_code == 200
        r = post(c)
    assert r.status_code == 429
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-should-retry"] == "false"
    retry_after = int(r.headers["retry-after"])
    # The 2nd newest hit leaves the 60 s window about 60 s from now.
    assert 59 <= retry_after <= 60
    err = r.json()["error"]
    assert err["type"] == "loop_detected"
    assert err["code"] == "recursive_loop_detected"
    assert err["param"] is None
    assert err["policy"] == "llm-policy"
    assert err["hit_count"] == 3
    assert err["window_seconds"] == 60
    assert err["retry_after_seconds"] == retry_after
    assert len(err["fingerprint"]) == 32 and int(err["fingerprint"], 16) >= 0
    assert err["message"] == (
        "Blocked: identical request sent 3 times in 60 seconds. This usually indicates an agent retry loop."
    )
    assert upstream.count == 2


def test_rejected_requests_keep_counting(upstream, start_envoy):
    """A rejected request is one more hit: the loop is still running."""
    envoy = start_envoy(bootstrap(plugin([policy(threshold=2, window=60)]), upstream.port))
    with httpx.Client(base_url=envoy.url) as c:
        assert post(c).status_code == 200
        counts = [post(c).json()["error"]["hit_count"] for _ in range(3)]
    # Counted, hence still rejected; the reported count is capped at the
    # threshold (the record keeps the hits the decision needs).
    assert counts == [2, 2, 2]
    assert envoy.counter("loopguard.rejected_total") == 3
    # One event for the loop, not one per rejected retry.
    assert envoy.log().count('"event":"loop.detected"') == 1


def test_fingerprint_is_stable_across_rejections(upstream, start_envoy):
    envoy = start_envoy(bootstrap(plugin([policy(threshold=2)]), upstream.port))
    with httpx.Client(base_url=envoy.url) as c:
        post(c)
        a = post(c).json()["error"]["fingerprint"]
        b = post(c).json()["error"]["fingerprint"]
        post(c, {"other": 1})
        d = post(c, {"other": 1}).json()["error"]["fingerprint"]
    assert a == b
    assert d != a


def test_unmatched_requests_pass_untouched(upstream, start_envoy):
    cfg = plugin([policy(threshold=2, selector={"pathPrefix": "/v1", "methods": ["POST"]})])
    envoy = start_envoy(bootstrap(cfg, upstream.port))
    with httpx.Client(base_url=envoy.url) as c:
        assert [c.get("/v1/models").status_code for _ in range(4)] == [200] * 4
        assert [c.post("/v10/x", content=b"{}").status_code for _ in range(4)] == [200] * 4
        assert [c.post("/v1/x", content=b"{}").status_code for _ in range(2)] == [200, 429]
    assert envoy.counter("loopguard.matched_total") == 2


def test_retry_after_rounds_up_whole_seconds(upstream, start_envoy):
    envoy = start_envoy(bootstrap(plugin([policy(threshold=2, window=3)]), upstream.port))
    with httpx.Client(base_url=envoy.url) as c:
        post(c)
        r = post(c)
    assert r.status_code == 429
    # 3 s minus a few ms, rounded up.
    assert r.headers["retry-after"] == "3"
    assert r.json()["error"]["retry_after_seconds"] == math.ceil(3)
