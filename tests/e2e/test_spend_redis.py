"""Counts are shared, tokens and spending stay per replica: two real Envoys
counting one loop in one real Redis (through webdis), each reading the token
usage of the responses it served into its own metrics and its own ledger.

Docs: docs/observability.md (Tokens and dollars, "With the Redis store")
and docs/redis.md."""

from __future__ import annotations

import openai
import pytest

from llm_provider import Turn
from observing import events, metric, settle, tokens
from shared_store import STORE, no_fallback, replicas

# Redis, redis-cli and webdis must be installed: a failure, never a skip.
pytestmark = pytest.mark.usefixtures("servers_installed")

PRICES = {"gpt-4o": {"input_per_million": 2.5, "output_per_million": 10, "cached_input_per_million": 1.25}}
CONFIG = {
    "max_body_bytes": 1 << 20,
    "prices": PRICES,
    "store": STORE,
    "policies": [{"id": "fleet", "spec": {
        "selector": {"pathPrefix": "/v1/", "methods": ["POST"]},
        "loop_detection": {"enabled": True, "window_seconds": 60, "similarity": "llm_tail",
                           "escalation": [{"at": 3, "action": "warn"}, {"at": 5, "action": "reject"}]},
    }}],
}
# One turn per served response, in order; at gpt-4o's prices ($2.50 input,
# $10 output per million):
U1 = Turn(1000, 100)  # served by A: 2500 + 1000 = 3500 µ$
U2 = Turn(2000, 200)  # served by B: 5000 + 2000 = 7000 µ$
U3 = Turn(3000, 300)  # served by A: 7500 + 3000 = 10500 µ$
U4 = Turn(4000, 400)  # served by B: 10000 + 4000 = 14000 µ$


def test_counts_are_shared_tokens_and_spending_stay_per_replica(shared, provider, start_envoy):
    """Six identical Chat Completions calls (the openai SDK, one API key)
    alternating A, B, A, B, A, B:

    - the count is shared: the 3rd call (on A) is the loop's 3rd hit and
      detected there (A alone has seen 2), the 4th (on B) is warned at the
      shared count 4 (B alone has seen 2), the 5th and 6th are rejected;
    - tokens stay per replica: A counts only U1 (outside the loop) and U3
      (inside), B only U2 and U4; together they are the 10000 input and
      1000 output tokens the provider reported;
    - spending stays per replica: A's loop.detected event reports A's one
      earlier response (1000 input, 100 output tokens, $0.0035), not the
      loop's two (3000, 300, $0.0105); the rejection on A counts A's newest
      response (U3: 3000 + 300 tokens, 10500 µ$) as avoided, the one on B
      B's newest (U4: 4000 + 400, 14000 µ$);
    - the caller's tag is the same on both replicas (a hash of the API
      key), each counting its own 2 requests inside the loop."""
    _, webdis = shared
    a, b = replicas(start_envoy, provider, webdis.port, CONFIG, hold=True)
    clients = [openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-fleet", max_retries=0) for e in (a, b)]
    call = {"model": "gpt-4o-2024-08-06", "messages": [{"role": "user", "content": "Is the build on main green?"}]}
    provider.plan(U1, U2, U3, U4)
    warned = []
    for i in range(4):
        raw = clients[i % 2].chat.completions.with_raw_response.create(**call)
        assert raw.parse().choices[0].message.content == "Four."
        warned.append(raw.headers.get("x-loopguard-warning"))
    assert warned == [None, None, "loop_warn", "loop_warn"]
    for i in range(4, 6):
        with pytest.raises(openai.RateLimitError):
            clients[i % 2].chat.completions.create(**call)
    assert provider.count == 4
    settle(a, "loopguard.tokens_total", 1100 + 3300)
    settle(b, "loopguard.tokens_total", 2200 + 4400)
    for e in (a, b):
        e.quiet()  # the responses are over: nothing more is counted of them
    no_fallback([a, b])
    assert [e.counter("loopguard.store_calls_total.result.ok") for e in (a, b)] == [3, 3]

    # Counts shared: one detection, on A at the 3rd hit.
    assert [e.counter("loopguard.detected_total") for e in (a, b)] == [1, 0]
    assert events(b) == []
    [event] = events(a)
    assert (event["hit_count"], event["action"]) == (3, "warn")
    assert [e.counter("loopguard.warned_total") for e in (a, b)] == [1, 1]
    assert [e.counter("loopguard.rejected_total") for e in (a, b)] == [1, 1]

    # Tokens per replica: each counts the responses it served.
    def tok(e, kind, in_loop):
        return tokens(e, kind, in_loop, "gpt-4o", "fleet")

    assert [(tok(a, "input", False), tok(a, "output", False)), (tok(a, "input", True), tok(a, "output", True))] == [
        (1000, 100), (3000, 300)]
    assert [(tok(b, "input", False), tok(b, "output", False)), (tok(b, "input", True), tok(b, "output", True))] == [
        (2000, 200), (4000, 400)]
    assert sum(e.counter("loopguard.tokens_total") for e in (a, b)) == 10000 + 1000
    assert [metric(a, f"cost_microusd_total.policy.fleet.loop.{l}.model.gpt-4o") for l in ("false", "true")] == [3500, 10500]
    assert [metric(b, f"cost_microusd_total.policy.fleet.loop.{l}.model.gpt-4o") for l in ("false", "true")] == [7000, 14000]

    # Spending per replica: A's event saw only A's earlier response.
    assert event["spent"] == {"responses": 1, "input_tokens": 1000, "output_tokens": 100, "usd": 3500 / 1e6}
    # Each rejection estimates from its own replica's newest response.
    for e, (i, o, usd) in ((a, (3000, 300, 10500)), (b, (4000, 400, 14000))):
        assert metric(e, "tokens_avoided_total.policy.fleet.token_type.input.model.gpt-4o") == i, e.name
        assert metric(e, "tokens_avoided_total.policy.fleet.token_type.output.model.gpt-4o") == o, e.name
        assert metric(e, "cost_avoided_microusd_total.policy.fleet.model.gpt-4o") == usd, e.name

    # The same caller tag on both replicas, each counting its own.
    series = f"wasmcustom.loopguard.caller_loop_requests_total.policy.fleet.caller.{event['caller']}"
    for e in (a, b):
        callers = {k: v for k, v in e.stats().items() if k.startswith("wasmcustom.loopguard.caller_loop_requests_total.")}
        assert callers == {series: 2}, e.name
