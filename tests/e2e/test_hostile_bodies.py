"""One crafted request never takes detection down: after each hostile body
at 1 MB and at 16 MB (max_body_bytes and the buffer filter raised), Envoy is
alive, the request passed, what the scanner refused is counted in
loopguard_bodies_skipped_total{reason}, and a plain loop on the next
requests is still caught. (Memory per request is measured natively:
crates/core/tests/hostile_bodies.rs.)"""

import json

import httpx
import pytest

from harness import bootstrap, plugin

MB = 1 << 20


def fill(prefix: str, unit: str, suffix: str, size: int) -> bytes:
    parts, n, i = [prefix], len(prefix) + len(suffix), 0
    while True:
        u = unit.replace("{i}", str(i))
        if n + len(u) + 1 > size:
            break
        parts.append(("," if i else "") + u)
        n += len(u) + 1
        i += 1
    parts.append(suffix)
    return "".join(parts).encode()


def hostile(kind: str, size: int) -> bytes:
    if kind == "empty objects":
        return fill('{"model":"m","messages":[', "{}", "]}", size)
    if kind == "deep nesting":
        depth = (size - 80) // 2
        return ('{"model":"m","messages":[{"role":"user","content":' + "[" * depth + "]" * depth + "}]}").encode()
    if kind == "tool calls":
        call = '{"id":"c{i}","type":"function","function":{"name":"read_file_{i}","arguments":"{\\"path\\":\\"/etc/{i}\\"}"}}'
        return fill('{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":[', call, "]}]}", size)
    if kind == "many keys":
        return fill('{"model":"m","messages":[{"role":"user","content":"hi"}],', '"k{i}":0', "}", size)
    if kind == "one long string":
        return json.dumps({"model": "m", "messages": [{"role": "user", "content": "a" * (size - 80)}]}).encode()
    raise ValueError(kind)


KINDS = {
    "empty objects": "too_many",
    "deep nesting": "too_deep",
    "tool calls": "too_many",
    "many keys": "too_many",
    "one long string": None,
}

POLICY = {"id": "agents", "spec": {"selector": {"pathPrefix": "/v1/"},
          "loop_detection": {"enabled": True, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "llm_tail"},
          "tool_loops": {"enabled": True}}}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """One Envoy for every hostile body (they must not harm it)."""
    from harness import Envoy, Upstream

    up = Upstream()
    cfg = bootstrap(plugin([POLICY], max_body_bytes=17 * MB), up.port, buffer_bytes=17 * MB)
    e = Envoy(cfg, concurrency=2).start()
    yield e, up
    e.stop()
    up.stop()


@pytest.mark.parametrize("size", [MB, 16 * MB], ids=["1MB", "16MB"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_hostile_body_passes_and_detection_keeps_working(guarded, kind, size):
    e, up = guarded
    reason = KINDS[kind]
    counter = f"loopguard.bodies_skipped_total.reason.{reason}" if reason else None
    before = e.counter(counter) if counter else 0
    body = hostile(kind, size)
    arrived = up.arrived
    with httpx.Client(base_url=e.url, timeout=60, headers={"authorization": f"Bearer sk-{kind}-{size}"}) as c:
        r = c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text[:200]
        assert up.arrived == arrived + 1, "the hostile request passed"
        assert up.requests[-1]["body"] == body
        if counter:
            assert e.counter(counter) == before + 1
        # Envoy is alive and a plain loop is still caught.
        assert httpx.get(f"{e.admin}/ready", timeout=5).status_code == 200
        plain = {"model": "m", "messages": [{"role": "user", "content": f"same question {kind} {size}"}]}
        codes = [c.post("/v1/chat/completions", json=plain).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert e.proc.poll() is None


def test_memory_stays_bounded_after_every_hostile_body(guarded):
    """Runs after the bodies above: Envoy's resident memory holds the buffers
    of one 16 MB request (Envoy's and the VM's copies), not a multiple of
    everything it saw."""
    e, _ = guarded
    rss = e.rss_bytes()
    print(f"Envoy RSS after every hostile body: {rss / MB:.0f} MB")
    assert rss < 600 * MB, f"Envoy RSS {rss / MB:.0f} MB"
