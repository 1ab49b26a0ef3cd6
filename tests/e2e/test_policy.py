"""Policy selection in real Envoy: selectors, first match, off switches."""

import httpx

from harness import bootstrap, plugin, policy


def trips(envoy, method="POST", path="/v1/x", host=None) -> bool:
    """Two identical requests; True if the second was rejected (thresholds
    here are 2)."""
    headers = {"host": host} if host else {}
    with httpx.Client(base_url=envoy.url, headers=headers) as c:
        first = c.request(method, path, content=b"{}" if method != "GET" else None)
        assert first.status_code == 200
        return c.request(method, path, content=b"{}" if method != "GET" else None).status_code == 429


def test_path_selectors_are_segment_aware(upstream, start_envoy):
    cfg = plugin([
        policy("exact", threshold=2, selector={"pathExact": "/v1/chat/completions"}),
        policy("prefix", threshold=2, selector={"pathPrefix": "/v2"}),
    ])
    e = start_envoy(bootstrap(cfg, upstream.port))
    assert trips(e, path="/v1/chat/completions?stream=true")
    assert not trips(e, path="/v1/chat/completions/extra")
    assert trips(e, path="/v2")
    assert trips(e, path="/v2/anything")
    assert not trips(e, path="/v20/anything")


def test_methods_and_hosts(upstream, start_envoy):
    cfg = plugin([policy("h", threshold=2, selector={"methods": ["POST"], "hosts": ["api.example.com", "*.corp.example"]})])
    e = start_envoy(bootstrap(cfg, upstream.port))
    assert trips(e, host="API.Example.com:8443")
    assert trips(e, path="/v1/y", host="llm.corp.example")
    assert not trips(e, host="other.example.com")
    assert not trips(e, host="corp.example")
    assert not trips(e, method="GET", host="api.example.com")


def test_first_matching_policy_applies(upstream, start_envoy):
    cfg = plugin([
        policy("strict", threshold=2, selector={"pathPrefix": "/v1/tools"}),
        policy("loose", threshold=4, selector={"pathPrefix": "/v1"}),
    ])
    e = start_envoy(bootstrap(cfg, upstream.port))
    with httpx.Client(base_url=e.url) as c:
        assert [c.post("/v1/tools/run", content=b"a").status_code for _ in range(2)] == [200, 429]
        assert c.post("/v1/tools/run", content=b"a").json()["error"]["policy"] == "strict"
        assert [c.post("/v1/chat", content=b"a").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_switched_off_policies_claim_their_requests_and_let_them_pass(upstream, start_envoy):
    """enabled: false and a threshold of 0 turn a policy off (batch jobs,
    test suites); placed first, they exempt their routes from a later
    catch-all policy."""
    off = policy("batch", selector={"pathPrefix": "/v1/batch"})
    off["spec"]["loop_detection"] = {"enabled": False}
    zero = policy("evals", threshold=0, selector={"pathPrefix": "/v1/evals"})
    cfg = plugin([off, zero, policy("all", threshold=2)])
    e = start_envoy(bootstrap(cfg, upstream.port))
    with httpx.Client(base_url=e.url) as c:
        assert [c.post("/v1/batch/job", content=b"same").status_code for _ in range(5)] == [200] * 5
        assert [c.post("/v1/evals/run", content=b"same").status_code for _ in range(5)] == [200] * 5
        assert [c.post("/v1/chat", content=b"same").status_code for _ in range(2)] == [200, 429]
