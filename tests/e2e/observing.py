"""What a test reads of what Envoy did: loopguard's structured events in
Envoy's log, its stats by name (counters, token series), Prometheus series
by their labels, and waits for counts and alerts to arrive."""

from __future__ import annotations

import json
import re

import harness as h


def events(envoy: h.Envoy, name: str = "loop.detected") -> list[dict]:
    """loopguard's events of one kind in Envoy's log, oldest first."""
    out = []
    for line in envoy.log().splitlines():
        if f'"event":"{name}"' in line:
            out.append(json.loads(line[line.index("{"):]))
    return out


def metric(e: h.Envoy, name: str) -> int:
    """One loopguard stat by its full name (labels included). Every token
    series is defined when the plugin starts: a missing one is a renamed
    metric, not a zero."""
    stats = e.stats()
    full = f"wasmcustom.loopguard.{name}"
    assert full in stats, (full, sorted(k for k in stats if "loopguard.tokens" in k or "loopguard.cost" in k))
    return stats[full]


def tokens(e: h.Envoy, kind: str, in_loop: bool, model: str = "other", policy: str = "agents") -> int:
    """loopguard_tokens_total of one token type, loop label, model and policy."""
    return metric(e, f"tokens_total.policy.{policy}.token_type.{kind}.loop.{str(in_loop).lower()}.model.{model}")


def stat(e: h.Envoy, name: str) -> int:
    """A loopguard counter by its full name (budget counters exist once first
    counted: a missing one is 0)."""
    return e.stats().get(f"wasmcustom.loopguard.{name}", 0)


def settle(e: h.Envoy, name: str, value: int, timeout: float = 5.0) -> None:
    """Wait until the counter `name` (summed over labels) reaches `value`:
    a response is counted when its last byte has passed Envoy, which may be
    just after the client has read it."""
    h.wait_for(lambda: e.counter(name) >= value, timeout)


def prometheus(e: h.Envoy, name: str) -> dict[frozenset, float]:
    """The series of one Prometheus metric, keyed by their label sets."""
    out = {}
    for key, value in e.prometheus().items():
        metric_name, _, labels = key.partition("{")
        if metric_name == name:
            out[frozenset(re.findall(r'(\w+)="([^"]*)"', labels))] = value
    return out


# The events that queue a webhook alert.
ALERTING = ("loop.detected", "loop.tool.detected", "loop.mcp.detected", "budget.exceeded")


def alerts_sent(e: h.Envoy, timeout: float = 10.0) -> None:
    """Wait until every alert the traffic so far queued has been sent and
    answered. The filter queues one per alerting event it logs (ALERTING)
    and sends them from its tick: once the requests are over (Envoy quiet),
    there are as many webhook results (sent, failed or dropped) as such
    events, and no call is in flight, no later alert can come of that
    traffic."""
    e.quiet(timeout)
    queued = lambda: sum(len(events(e, n)) for n in ALERTING)  # noqa: E731
    if not h.wait_for(lambda: e.counter("loopguard.webhook_total") >= queued() and e.in_flight() == 0, timeout):
        raise AssertionError(f"{e.counter('loopguard.webhook_total')} webhook results for {queued()} events after {timeout} s")
