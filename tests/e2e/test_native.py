"""What only the native host has: Envoy loading the dynamic module (its ABI
version), a panic inside it failing one request and never the process, the
two hosts agreeing metric for metric on the same traffic, and make
run-native's example. The rest of
the behaviour is the shared suite run with LOOPGUARD_HOST=native (make
e2e-native)."""

from __future__ import annotations

import os
import re

import httpx
import pytest

from harness import (
    FAULT_NATIVE,
    NATIVE,
    ROOT,
    ROUTER,
    bootstrap,
    buffer_filter,
    envoy_abi,
    load_yaml,
    localize,
    native_filter,
    native_stats_config,
    plugin,
    policy,
    wasm_filter,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "Is the build green?"}]}


def native_only(cfg: dict, port: int, module: str | None = None) -> dict:
    return bootstrap(None, port, http_filters=[native_filter(cfg, module=module), buffer_filter(), ROUTER])


def test_envoy_loads_the_module_and_its_abi_version_matches(upstream, start_envoy):
    e = start_envoy(native_only(plugin([policy(threshold=3)]), upstream.port))
    log = e.log()
    assert f"Dynamic module ABI version {envoy_abi()} matched" in log
    assert "deprecated" not in log
    assert "loopguard: configured 1 policy (p)" in log
    with httpx.Client(base_url=e.url) as c:
        codes = [c.get("/v1/x").status_code for _ in range(4)]
    assert codes == [200, 200, 429, 429]


def test_a_panic_fails_only_its_request(upstream, start_envoy):
    if not os.path.exists(FAULT_NATIVE):
        pytest.fail(f"the fault-injection module is missing: {FAULT_NATIVE} (make fault-build)")
    e = start_envoy(native_only(plugin([policy(threshold=3)]), upstream.port, module=FAULT_NATIVE), concurrency=1)
    with httpx.Client(base_url=e.url, timeout=10) as c:
        assert c.get("/v1/a").status_code == 200
        crashed = c.get("/v1/a", headers={"x-loopguard-fault": "crash"})
        assert crashed.status_code == 500
        assert crashed.text == "loopguard: internal error\n"
        # The same worker goes on: the crashed request was never counted,
        # the loop is still caught on its third request.
        codes = [c.get("/v1/a").status_code for _ in range(3)]
    assert codes == [200, 429, 429]
    assert e.proc.poll() is None
    assert "loopguard panicked: " in e.log() and "injected crash" in e.log()
    assert upstream.count == 2


def stats_after(start_envoy, upstream, loopguard: dict) -> tuple[dict, dict]:
    """loopguard's stats and Prometheus series after a fixed mix of traffic:
    a loop that is rejected, a warned loop, distinct requests, an LLM call
    with usage."""
    config = bootstrap(None, upstream.port, http_filters=[loopguard, buffer_filter(), ROUTER])
    # Both with the stats tags every example ships.
    config["stats_config"] = native_stats_config()
    e = start_envoy(config, concurrency=1)
    with httpx.Client(base_url=e.url, timeout=10) as c:
        for _ in range(4):
            c.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer sk-one"})
        for i in range(3):
            c.post("/v1/chat/completions", json={**CHAT, "n": i}, headers={"authorization": "Bearer sk-two"})
        for _ in range(3):
            c.get("/warned/x", headers={"authorization": "Bearer sk-three"})
    stats = {k: v for k, v in e.stats().items() if k.startswith("wasmcustom.loopguard.")}
    prom = {k: v for k, v in e.prometheus().items() if k.startswith("loopguard_")}
    e.stop()
    return stats, prom


def test_both_hosts_count_the_same_traffic_under_the_same_names(upstream, start_envoy):
    cfg = plugin(
        [
            policy("llm", threshold=3, selector={"pathPrefix": "/v1/"}, similarity="llm_tail"),
            policy("warned", threshold=2, selector={"pathPrefix": "/warned/"}, action="warn"),
        ]
    )
    wasm_stats, wasm_prom = stats_after(start_envoy, upstream, wasm_filter(cfg))
    native_stats, native_prom = stats_after(start_envoy, upstream, native_filter(cfg))
    assert wasm_stats["wasmcustom.loopguard.rejected_total.policy.llm"] == 3
    assert native_stats == wasm_stats
    assert native_prom == wasm_prom, sorted(set(native_prom.items()) ^ set(wasm_prom.items()))
    assert any(re.match(r'loopguard_caller_loop_requests_total\{policy="llm",caller="\w+"\}', k) for k in native_prom)


def test_make_run_native_answers_the_readme_curl_loop(start_envoy):
    """examples/native/envoy.yaml (make run-native), its module path made
    absolute: the README's loop of six identical calls."""
    cfg = localize(load_yaml(ROOT / "examples" / "native" / "envoy.yaml"))
    text = repr(cfg)
    assert "libloopguard_native.so" in text and NATIVE in text, "localize() points the example at the built module"
    e = start_envoy(cfg)
    body = {"model": "demo-model", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=e.url, timeout=10) as c:
        codes = [c.post("/v1/chat/completions", json=body).status_code for _ in range(6)]
    assert codes == [200, 200, 200, 200, 429, 429]
