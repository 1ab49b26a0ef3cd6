"""Per-route policy in Envoy YAML, verified identity, plugins sharing a VM,
and loopguard's place before other limits: the shipped examples, run."""

import base64
import hashlib
import hmac
import json
import time

import httpx
import pytest

from harness import HOST, ROOT, ROUTER, bootstrap, buffer_filter, load_yaml, localize, loopguard_filter, plugin, policy

EXAMPLES = ROOT / "examples"


def run_example(start_envoy, upstream, name):
    return start_envoy(localize(load_yaml(EXAMPLES / name / "envoy.yaml"), {"api": upstream.port}))


def trips_at(client, method, path, limit=12, **kw) -> int | None:
    """The 1-based index of the first 429 among `limit` identical requests."""
    for i in range(1, limit + 1):
        if client.request(method, path, **kw).status_code == 429:
            return i
    return None


def test_per_route_example_selectors_metadata_and_off_switch(upstream, start_envoy):
    e = run_example(start_envoy, upstream, "per-route")
    with httpx.Client(base_url=e.url) as c:
        # 1. route name selector: policy "chat", threshold 5
        assert trips_at(c, "POST", "/v1/chat/completions", content=b"{}") == 5
        assert c.post("/v1/chat/completions", content=b"{}").json()["error"]["policy"] == "chat"
        # 2. route metadata: policy "tool-calls", threshold 3
        assert trips_at(c, "POST", "/v1/tools/run", content=b"{}") == 3
        assert c.post("/v1/tools/run", content=b"{}").json()["error"]["policy"] == "tool-calls"
        # everything else: "default", threshold 10
        assert trips_at(c, "POST", "/v1/embeddings", content=b"{}") == 10
        # 3. the filter is disabled on the health route
        assert trips_at(c, "GET", "/healthz", limit=15) is None
    before = e.counter("loopguard.requests_total")
    httpx.get(f"{e.url}/healthz")
    assert e.counter("loopguard.requests_total") == before


def test_unknown_route_policy_is_logged_once_and_passes(upstream, start_envoy):
    cfg = bootstrap(plugin([policy("known", threshold=2)], route_metadata=True), upstream.port)
    vh = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]
    vh["routes"].insert(0, {"name": "typo", "match": {"prefix": "/typo"}, "route": {"cluster": "upstream"},
                            "metadata": {"filter_metadata": {"loopguard": {"policy": "knwon"}}}})
    e = start_envoy(cfg, concurrency=1)
    with httpx.Client(base_url=e.url) as c:
        assert [c.get("/typo").status_code for _ in range(4)] == [200] * 4
        assert [c.get("/other").status_code for _ in range(2)] == [200, 429]
    assert e.log().count('route metadata names policy "knwon"') == 1


def test_batch_exemptions_example(upstream, start_envoy):
    e = run_example(start_envoy, upstream, "batch-exemptions")
    with httpx.Client(base_url=e.url) as c:
        assert trips_at(c, "POST", "/v1/batches", content=b"same", limit=6) is None
        assert trips_at(c, "POST", "/v1/chat", content=b"same", headers={"x-batch-id": "batch-2026-11-22-7f3a"}, limit=6) is None
        assert trips_at(c, "POST", "/v1/chat", content=b"same", headers={"x-api-key-id": "ci-runner"}, limit=6) is None
        assert trips_at(c, "POST", "/v1/chat", content=b"same", headers={"x-api-key-id": "prod"}) == 3
    assert e.counter("loopguard.exempted_total") == 12


def sign(claims: dict, key: bytes = b"loopguard-example-signing-key-do-not-use") -> str:
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    head = b64(json.dumps({"alg": "HS256", "kid": "example", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = b64(hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


@pytest.mark.skipif(HOST == "native", reason="jwt_verified: keys read jwt_authn's nested payload metadata, which the dynamic-module ABI cannot read (crates/native/src/facts.rs verified_claim)")
def test_verified_identity_example(upstream, start_envoy):
    e = run_example(start_envoy, upstream, "verified-identity")
    exp = int(time.time()) + 3600
    tok = lambda sub, **extra: {"authorization": "Bearer " + sign({"iss": "https://issuer.example.com", "sub": sub, "exp": exp, **extra})}  # noqa: E731
    with httpx.Client(base_url=e.url) as c:
        assert trips_at(c, "POST", "/v1/chat", content=b"same", headers=tok("alice")) == 3
        # Another verified tenant has a count of its own.
        assert trips_at(c, "POST", "/v1/chat", content=b"same", headers=tok("bob", nonce=1)) == 3
        # A forged token (signed with another key) claiming to be carol
        # never reaches loopguard.
        forged = {"authorization": "Bearer " + sign({"iss": "https://issuer.example.com", "sub": "carol", "exp": exp}, key=b"x" * 40)}
        assert c.post("/v1/chat", content=b"same", headers=forged).status_code == 401


def test_escalation_example_runs_before_the_rate_limit(upstream, start_envoy):
    """The ladder in front of a 20-token local rate limit: warned and
    throttled requests pass through the rate limiter (and spend tokens);
    rejected loop requests never reach it."""
    e = run_example(start_envoy, upstream, "escalation")
    with httpx.Client(base_url=e.url, timeout=10) as c:
        loop = [c.post("/v1/chat/completions", content=b'{"same": true}') for _ in range(10)]
        assert [r.status_code for r in loop] == [200] * 7 + [429] * 3
        assert loop[2].headers["x-loopguard-warning"] == "loop_warn"
        assert loop[4].headers["x-loopguard-delay-ms"] == "1000"
        assert loop[7].json()["error"]["cooldown_seconds"] == 120
        # The upstream saw the warning on the body-carrying requests.
        assert [r["headers"].get("x-loopguard-warning") for r in upstream.requests[:5]] == [None, None, "loop_warn", "loop_warn", None]
        # The buffer filter holds each request until loopguard has judged its
        # body: not even the headers of a rejected request went upstream.
        assert upstream.count == upstream.arrived == 7
        # 7 tokens spent by the loop; 13 distinct requests still fit, the 14th does not.
        distinct = [c.post("/v1/chat/completions", content=json.dumps({"n": i}).encode()) for i in range(14)]
    assert [r.status_code for r in distinct] == [200] * 13 + [429]
    assert "x-loopguard-policy" not in distinct[13].headers  # Envoy's rate limit, not loopguard
    stats = e.stats()
    assert stats["gateway_rate_limit.http_local_rate_limit.ok"] == 20
    assert stats["gateway_rate_limit.http_local_rate_limit.rate_limited"] == 1


def test_two_plugin_instances_share_a_vm_but_not_state(upstream, start_envoy):
    """Two loopguard filters in one chain keep their own counts. In Wasm they
    share one VM (one vm_id); natively they are two configurations of the
    one loaded module."""
    a = loopguard_filter(plugin([policy("a-policy", threshold=2, selector={"pathPrefix": "/a"})]), name="loopguard-a", vm_id="shared")
    b = loopguard_filter(plugin([policy("b-policy", threshold=3)]), name="loopguard-b", vm_id="shared")
    e = start_envoy(bootstrap(None, upstream.port, http_filters=[a, b, buffer_filter(), ROUTER]))
    with httpx.Client(base_url=e.url) as c:
        # /a/x: instance a trips at 2 (b counts it too, at 1 so far).
        assert [c.get("/a/x").status_code for _ in range(2)] == [200, 429]
        assert c.get("/a/x").json()["error"]["policy"] == "a-policy"
        # /b/x: only instance b has a policy for it.
        assert [c.get("/b/x").status_code for _ in range(3)] == [200, 200, 429]
        assert c.get("/b/x").json()["error"]["policy"] == "b-policy"
    log = e.log()
    assert "configured 1 policy (a-policy)" in log and "configured 1 policy (b-policy)" in log
