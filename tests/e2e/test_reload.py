"""Configuration reloads (LDS): the same table layout keeps its counts, a new
table size starts clean."""

import json
import os

import httpx

from harness import bootstrap, free_port, plugin, policy, set_plugin_config, wait_for


def lds_reload_envoy(start_envoy, upstream, tmp_path, first_cfg):
    base = bootstrap(first_cfg, upstream.port)
    listener = base["static_resources"].pop("listeners")[0]
    port = free_port()
    listener["address"]["socket_address"]["port_value"] = port
    lds = tmp_path / "lds.json"

    def publish(cfg):
        hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
        set_plugin_config(hcm["http_filters"][0], cfg)
        doc = {"resources": [{"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", **listener}]}
        tmp = tmp_path / "lds.tmp"
        tmp.write_text(json.dumps(doc))
        os.rename(tmp, lds)  # Envoy watches for the move

    publish(first_cfg)
    base["node"] = {"id": "loopguard-e2e", "cluster": "loopguard-e2e"}
    base["dynamic_resources"] = {"lds_config": {"path_config_source": {"path": str(lds)}, "resource_api_version": "V3"}}
    e = start_envoy.make(base)
    e.port = port
    e.listener_ports = [port]
    e.start()
    return e, publish


def wait_for_update(e, n):
    """Wait until the n-th listener is applied and every worker has taken
    it over from the one before (listener_create_success counts a listener
    added to a worker), so that a new connection reaches it."""

    def applied() -> bool:
        s = e.stats()
        return (
            s.get("listener_manager.lds.update_success", 0) >= n
            and s.get("listener_manager.total_listeners_warming", 0) == 0
            and s.get("listener_manager.listener_create_success", 0) >= n * e.concurrency
        )

    if not wait_for(applied, timeout=15, interval=0.1):
        raise AssertionError(f"LDS update {n} not applied:\n{e.log()[-3000:]}")


def hit(e) -> int:
    with httpx.Client(base_url=e.url) as c:  # a new connection reaches the newest listener
        return c.post("/v1/reload", content=b"same").status_code


def test_reload_with_same_layout_keeps_counts_and_new_layout_starts_clean(upstream, start_envoy, tmp_path):
    first = plugin([policy("p", threshold=3, window=60)], max_tracked_fingerprints=1024)
    e, publish = lds_reload_envoy(start_envoy, upstream, tmp_path, first)
    wait_for_update(e, 1)
    assert [hit(e), hit(e)] == [200, 200]

    # Same table size, another window: the two hits are still there.
    publish(plugin([policy("p", threshold=3, window=120)], max_tracked_fingerprints=1024))
    wait_for_update(e, 2)
    assert hit(e) == 429

    # Another table size: a fresh table, the loop's history is gone.
    publish(plugin([policy("p", threshold=3, window=120)], max_tracked_fingerprints=2048))
    wait_for_update(e, 3)
    assert [hit(e), hit(e), hit(e)] == [200, 200, 429]


def test_switching_from_shadow_to_enforce_does_not_inherit_shadow_counts(upstream, start_envoy, tmp_path):
    shadow = plugin([policy("p", threshold=2, window=60, mode="shadow")])
    e, publish = lds_reload_envoy(start_envoy, upstream, tmp_path, shadow)
    wait_for_update(e, 1)
    assert [hit(e), hit(e), hit(e)] == [200, 200, 200]
    assert e.counter("loopguard.shadow_total") == 2
    publish(plugin([policy("p", threshold=2, window=60)]))
    wait_for_update(e, 2)
    # Enforce starts from zero: the shadow hits live in their own key space.
    assert [hit(e), hit(e)] == [200, 429]
