"""What Envoy's failure_policy does when the loopguard VM crashes, measured
with a test build of the module (cargo feature fault-injection: a request
header makes the VM trap, and configurations can be made to fail so that
reloads fail). These measurements choose the failure policy of every
shipped configuration: FAIL_RELOAD, with a short reload backoff where the
control plane lets us set it."""

import time
from pathlib import Path

import httpx
import pytest

from harness import CLOCK_SLACK, FAULT_WASM, HOST, bootstrap, plugin, policy, wait_for

# Envoy's Wasm failure_policy and VM reload: nothing of the dynamic module
# (whose panics test_native.py covers).
pytestmark = pytest.mark.skipif(HOST == "native", reason="Envoy's Wasm VM failure policy and reload: Wasm host only")


@pytest.fixture(scope="module", autouse=True)
def fault_build():
    if not Path(FAULT_WASM).exists():
        pytest.fail(f"{FAULT_WASM} is missing: run the tests through `make test`, which builds it")


def faulty_envoy(start_envoy, upstream, failure_policy: str, backoff: str | None = None):
    cfg = bootstrap(plugin([policy(threshold=3)]), upstream.port)
    wasm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]
    wasm["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = FAULT_WASM
    wasm["typed_config"]["config"]["failure_policy"] = failure_policy
    if backoff:
        wasm["typed_config"]["config"]["reload_config"] = {"backoff": {"base_interval": backoff}}
    # One worker: every request meets the same VM. Envoy times every request
    # (timing=True): the reload backoff is judged by Envoy's clock.
    return start_envoy(cfg, concurrency=1, timing=True)


def post(e, body=b"loop", fault=None) -> int:
    headers = {"x-loopguard-fault": fault} if fault else {}
    return httpx.post(f"{e.url}/v1/x", content=body, headers=headers, timeout=10).status_code


def stat(e, name: str) -> int:
    return e.stats().get(name, 0)


def until_served(e, pause: float) -> list[int]:
    """Send requests to /v1/y, one every `pause` s (the probes' pace), until
    one is not answered 503 (for at most 3 s): the codes seen."""
    codes: list[int] = []

    def served() -> bool:
        codes.append(httpx.post(f"{e.url}/v1/y", content=b"y", timeout=10).status_code)
        return codes[-1] != 503

    wait_for(served, timeout=3, interval=pause)
    return codes


def backoff_seen(e, codes: list[int]) -> tuple[float, float | None]:
    """The 503 window of until_served (which saw `codes`), by Envoy's clock,
    from the last reload before it: Envoy's backoff counts from the last
    load, which happened while Envoy handled the last request to /v1/x that
    followed a crash's 503 and was not a 503 itself. How long after that
    request began the request served at last ended (at least the backoff),
    and how long after that request ended the last 503 began (less than
    the backoff; None if there was none). Envoy draws the backoff from
    [base, 1.5 x base) for each request."""
    e.timings(len(codes), path="/v1/y")  # all of them are in the log
    timed = e.timings(0)
    x = [t for t in timed if t.path == "/v1/x"]
    reload = [t for prev, t in zip(x, x[1:]) if prev.status == 503 and t.status != 503][-1]
    y = [t for t in timed if t.path == "/v1/y"]
    served = next(t for t in y if t.status != 503)
    failed = [t for t in y if t.status == 503]
    return served.end - reload.start, (failed[-1].start - reload.end if failed else None)


def test_fail_reload_a_crash_costs_the_crashing_request_and_detection_comes_back_with_its_counts(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_RELOAD", backoff="0.1s")
    assert [post(e), post(e)] == [200, 200]
    time.sleep(0.3)  # the backoff counts from the VM's last load
    assert post(e, b"other", fault="crash") == 503
    # The next request reloads the VM; the loop's two hits live in shared
    # data, which outlives the crashed VM: its third hit is rejected.
    assert post(e) == 429
    assert [post(e, b"fresh") for _ in range(3)] == [200, 200, 429]
    assert stat(e, "wasm.loopguard.vm_reload_success") == 1
    assert "injected crash" in e.log()
    # A second crash right after that reload: with a 0.1 s backoff, requests
    # fail for about 0.1-0.15 s, then the VM is reloaded again.
    assert post(e, b"x", fault="crash") == 503
    codes = until_served(e, 0.01)
    assert codes[-1] == 200, codes
    # By Envoy's clock, no request failed later than the configured backoff
    # (0.1 s, at most 0.15 s with its jitter) after that reload; Envoy's
    # default (1 s) would have answered 503 for a second.
    _, last_503 = backoff_seen(e, codes)
    assert last_503 is None or last_503 < 0.15 + CLOCK_SLACK, last_503
    assert stat(e, "wasm.loopguard.vm_reload_success") == 2


def test_fail_reload_within_the_backoff_requests_fail_closed_until_the_reload(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_RELOAD")  # Envoy's default backoff: 1 s base, jittered
    assert post(e) == 200
    time.sleep(1.6)  # past the backoff (at most 1.5 s) from the VM's first load
    assert post(e, b"x", fault="crash") == 503
    assert post(e) == 200  # reloaded at once: the last load was > 1.5 s ago
    # A second crash right after that reload: requests within the backoff get
    # 503, then the VM is reloaded again.
    assert post(e, b"x", fault="crash") == 503
    codes = until_served(e, 0.05)
    assert codes[-1] == 200 and codes[0] == 503, codes
    # By Envoy's clock, from that reload: served no sooner than the 1 s
    # backoff, and no 503 began after 1.5 s (its jitter).
    served, last_503 = backoff_seen(e, codes)
    assert served >= 1.0 - CLOCK_SLACK, served
    assert last_503 < 1.5 + CLOCK_SLACK, last_503
    assert stat(e, "wasm.loopguard.vm_reload_backoff") >= 1
    assert stat(e, "wasm.loopguard.vm_reload_success") == 2


def test_fail_reload_when_reloads_fail_every_request_fails_until_one_succeeds(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_RELOAD", backoff="0.1s")
    assert [post(e), post(e)] == [200, 200]
    time.sleep(0.3)  # the backoff counts from the VM's last load
    assert post(e, b"x", fault="crash-then-fail-reloads=3") == 503
    codes = []

    def served() -> bool:
        codes.append(post(e))
        return codes[-1] != 503

    wait_for(served, timeout=5, interval=0.05)  # a request every 50 ms until one is served
    assert codes[-1] == 429, codes  # detection back, counts kept
    assert codes.count(503) >= 3
    assert stat(e, "wasm.loopguard.vm_reload_failure") == 3
    assert stat(e, "wasm.loopguard.vm_reload_success") == 1


def test_fail_open_a_crash_turns_detection_off_for_good(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_OPEN")
    assert [post(e), post(e)] == [200, 200]
    assert post(e, b"x", fault="crash") == 503
    # Traffic flows, unchecked: the loop is never caught again.
    assert [post(e) for _ in range(5)] == [200] * 5
    time.sleep(1.6)  # past any reload's backoff: still no reload
    assert post(e) == 200
    assert stat(e, "wasm.loopguard.vm_reload_success") == 0


def test_fail_closed_a_crash_fails_every_later_request(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_CLOSED")
    assert post(e) == 200
    assert post(e, b"x", fault="crash") == 503
    assert [post(e, b"new") for _ in range(3)] == [503] * 3
    time.sleep(1.6)  # past any reload's backoff: still failing
    assert post(e, b"new") == 503
