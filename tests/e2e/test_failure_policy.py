"""What Envoy's failure_policy does when the loopguard VM crashes, measured
with a test build of the module (cargo feature fault-injection: a request
header makes the VM trap, and configurations can be made to fail so that
reloads fail). These measurements choose the failure policy of every
shipped configuration: FAIL_RELOAD, with a short reload backoff where the
control plane lets us set it."""

import os
import time
from pathlib import Path

import httpx
import pytest

from harness import ROOT, Upstream, bootstrap, plugin, policy

FAULT_WASM = os.environ.get(
    "LOOPGUARD_FAULT_WASM",
    str(ROOT / "target" / "fault-injection" / "wasm32-wasip1" / "release" / "loopguard.wasm"),
)


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
    # One worker: every request meets the same VM.
    return start_envoy(cfg, concurrency=1)


def post(e, body=b"loop", fault=None) -> int:
    headers = {"x-loopguard-fault": fault} if fault else {}
    return httpx.post(f"{e.url}/v1/x", content=body, headers=headers, timeout=10).status_code


def stat(e, name: str) -> int:
    return e.stats().get(name, 0)


def until_served(e, pause: float) -> tuple[list[int], float]:
    """Send requests until one is not answered 503 (at most 3 s): the codes
    seen and how long that took."""
    t0 = time.monotonic()
    codes: list[int] = []
    while time.monotonic() - t0 < 3:
        codes.append(post(e, b"y"))
        if codes[-1] != 503:
            break
        time.sleep(pause)
    return codes, time.monotonic() - t0


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
    codes, waited = until_served(e, 0.01)
    assert codes[-1] == 200, codes
    assert waited <= 1.0, waited
    assert stat(e, "wasm.loopguard.vm_reload_success") == 2


def test_fail_reload_within_the_backoff_requests_fail_closed_until_the_reload(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_RELOAD")  # Envoy's default backoff: 1 s base, jittered
    assert post(e) == 200
    time.sleep(1.6)
    assert post(e, b"x", fault="crash") == 503
    assert post(e) == 200  # reloaded at once: the last load was > 1.5 s ago
    # A second crash right after that reload: requests within the backoff get
    # 503, then the VM is reloaded again.
    assert post(e, b"x", fault="crash") == 503
    codes, waited = until_served(e, 0.05)
    assert codes[-1] == 200 and codes[0] == 503, codes
    assert 0.9 <= waited <= 2.5, waited
    assert stat(e, "wasm.loopguard.vm_reload_backoff") >= 1
    assert stat(e, "wasm.loopguard.vm_reload_success") == 2


def test_fail_reload_when_reloads_fail_every_request_fails_until_one_succeeds(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_RELOAD", backoff="0.1s")
    assert [post(e), post(e)] == [200, 200]
    time.sleep(0.3)
    assert post(e, b"x", fault="crash-then-fail-reloads=3") == 503
    codes = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        codes.append(post(e))
        if codes[-1] != 503:
            break
        time.sleep(0.05)
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
    time.sleep(1.6)
    assert post(e) == 200
    assert stat(e, "wasm.loopguard.vm_reload_success") == 0


def test_fail_closed_a_crash_fails_every_later_request(upstream, start_envoy):
    e = faulty_envoy(start_envoy, upstream, "FAIL_CLOSED")
    assert post(e) == 200
    assert post(e, b"x", fault="crash") == 503
    assert [post(e, b"new") for _ in range(3)] == [503] * 3
    time.sleep(1.6)
    assert post(e, b"new") == 503
