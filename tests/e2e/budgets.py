"""Spend caps ("budgets") as the budget tests set them up and read them:
the configuration and Envoy (loopguard holding request headers, the budget
example's stats_tags), the spend and counters by budget, and when a
request's spending leaves its window (what a 429's Retry-After must say)."""

from __future__ import annotations

import copy
import math
import re
import time
import uuid

import harness as h

EXAMPLE = h.ROOT / "examples" / "budget" / "envoy.yaml"
# The example's stats_tags: budget_* series get their policy, budget and key labels.
STATS = h.load_yaml(EXAMPLE)["stats_config"]
PRICES = {
    "gpt-4o": {"input_per_million": 2.5, "output_per_million": 10},
    "claude-haiku-4-5": {"input_per_million": 1, "output_per_million": 5},
}
# A budget key's tag in the spend metric and the events.
TAG = re.compile(r"^[0-9a-f]{12}$")
# lg:<plugin name>:{b<caller>}:<budget key>, digests only.
BUDGET_KEY = re.compile(r"^lg:loopguard:\{b[0-9a-f]{16}\}:[0-9a-f]{16}$")
# Clock differences between this process and Envoy's reading of the same
# clock, on a busy machine (loopguard reads whole milliseconds).
SLACK = 0.05


def budget_config(budget: dict, *, mode: str | None = None, store: dict | None = None, policy_id: str = "agents") -> dict:
    spec: dict = {"selector": {"pathPrefix": "/v1/", "methods": ["POST"]}, "budget": budget}
    if mode is not None:
        spec["mode"] = mode
    cfg = {"max_body_bytes": 1 << 20, "hold_request_headers": True, "prices": PRICES,
           "policies": [{"id": policy_id, "spec": spec}]}
    if store is not None:
        cfg["store"] = store
    return cfg


def budget_boot(cfg: dict, upstream_port: int) -> dict:
    """loopguard holding the request headers (so the upstream request can
    carry the warning too) in front of the upstream, with the example's
    stats_tags."""
    boot = h.bootstrap(cfg, upstream_port, hold=True)
    boot["stats_config"] = copy.deepcopy(STATS)
    return boot


def budget_envoy(start_envoy, upstream_port: int, budget: dict, **kw) -> h.Envoy:
    return start_envoy(budget_boot(budget_config(budget, **kw), upstream_port))


def spend(e: h.Envoy, budget: str, policy: str = "agents") -> dict[str, int]:
    """loopguard_budget_spend_total of one budget, by key tag."""
    prefix = f"wasmcustom.loopguard.budget_spend_total.policy.{policy}.budget.{budget}.key."
    return {k[len(prefix):]: v for k, v in e.stats().items() if k.startswith(prefix)}


def downstream(e: h.Envoy) -> tuple[int, int]:
    """Requests the listener got, and those answered 4xx."""
    s = e.stats()
    return s.get("http.main.downstream_rq_total", 0), s.get("http.main.downstream_rq_4xx", 0)


def release_of(first_start: float, first_end: float, window: int) -> float | None:
    """When the spending of a request made between first_start and
    first_end (Unix time) leaves a window of `window` seconds: its slice (a
    60th of the window) ends 60 slices later. None if it may have fallen in
    either of two slices."""
    step = window / 60
    if math.floor(first_start / step) != math.floor(first_end / step):
        return None
    return (math.floor(first_start / step) + 60) * step


def check_retry(headers, release: float | None, start: float, end: float, window: int) -> int:
    """The 429's Retry-After (whole seconds, rounded up) and retry-after-ms:
    until `release` as Envoy saw it when it judged the request (between
    `start` and `end`), at most the window. The seconds."""
    retry, ms = int(headers["retry-after"]), int(headers["retry-after-ms"])
    assert retry == max(1, math.ceil(ms / 1000)), (retry, ms)
    assert 0 < ms <= window * 1000, ms
    if release is not None:
        assert (release - end - SLACK) * 1000 <= ms <= (release - start + SLACK) * 1000, (ms, release - start, release - end)
    return retry


def ask(content: str | None = None) -> list[dict]:
    """A user's question, new each time unless `content` is given."""
    return [{"role": "user", "content": content or f"Next step of task {uuid.uuid4().hex}?"}]


def timed(call):
    """call() with when it started and ended (Unix time)."""
    start = time.time()
    out = call()
    return out, start, time.time()
