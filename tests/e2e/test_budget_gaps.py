"""Spend caps nobody slips past (issue 37), in real Envoy with the real
SDKs, on both hosts: models no configuration prices (the built-in table,
`budget.unpriced`), bodies too large to read, all 8 caps of a key, a key at
its cap kept through a flood of sessions, compressed answers, streams that
did not ask for their usage, answers that never came, costs the upstream
reports, tunnels, monthly and per-user caps across replicas, and values
that would round to nothing.

Each test would pass a request (or spend nothing) on the code before it:
the docstrings say how."""

from __future__ import annotations

import base64
import socket

import anthropic
import httpx
import openai
import pytest

import harness as h
from budgets import ask, budget_boot, budget_config, budget_envoy, spend
from llm_provider import Turn
from observing import events, stat
from shared_store import STORE, replicas

def envoy_without_prices(start_envoy, port: int, budget: dict, **kw) -> h.Envoy:
    """No `prices`: the built-in table prices the models."""
    cfg = budget_config(budget, **kw)
    del cfg["prices"]
    return start_envoy(budget_boot(cfg, port))


def total_spend(e: h.Envoy, budget: str) -> int:
    return sum(spend(e, budget).values())


# --- 1. models the configuration does not price --------------------------------------

# The trial: $5 per session per hour, an agent on gpt-4o, answers
# of 500k tokens. gpt-4o at the table's $2.50 / $10 per million: 400k in +
# 20k out = $1.20 a call, so the 5th call crosses $5 and the 6th is refused
# (before: every call passed, gpt-4o was not in the example's prices).
SESSION_USD = {"name": "session-hour", "per": "session", "window_seconds": 3600, "usd": 5}
BIG = Turn(400_000, 20_000)


@pytest.mark.parametrize("model", ["gpt-4o", "openai/gpt-4o-2024-08-06"])
def test_a_model_the_configuration_does_not_price_is_priced_by_the_table(provider, start_envoy, model):
    e = envoy_without_prices(start_envoy, provider.port, {"limits": [SESSION_USD]})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-table", max_retries=2,
                           default_headers={"x-session-id": "s-1"})
    provider.plan(*[BIG] * 6)
    for _ in range(5):
        client.chat.completions.create(model=model, messages=ask())
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=model, messages=ask())
    assert caught.value.code == "budget_exceeded" and caught.value.body["spent"] == "6.00"
    assert provider.count == 5
    assert total_spend(e, "session-hour") == 5 * 1_200_000
    assert stat(e, "budget_unpriced_total.policy.agents") == 0


def test_an_unpriced_model_is_charged_its_providers_highest_price(provider, start_envoy):
    """A model no list names (a new release) is never free: charged at the
    highest price the table knows for OpenAI, counted, named in the header
    and an event. Before, it spent $0 and was never stopped."""
    e = envoy_without_prices(start_envoy, provider.port, {"limits": [SESSION_USD]})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-unpriced", max_retries=0,
                           default_headers={"x-session-id": "s-1"})
    provider.plan(*[BIG] * 40)
    calls = 0
    with pytest.raises(openai.RateLimitError):
        for calls in range(1, 41):
            raw = client.chat.completions.with_raw_response.create(model="gpt-7-preview", messages=ask())
            assert raw.headers["x-loopguard-budget"].startswith(
                "unpriced; model=gpt-7-preview; charged_as=openai (provider_max)"), raw.headers
    # At OpenAI's highest prices, $5 goes in a call or two.
    assert calls <= 3, calls
    assert stat(e, "budget_unpriced_total.policy.agents") == provider.count
    [event] = events(e, "budget.unpriced")
    assert (event["model"], event["unpriced"], event["charged_as"]) == (
        "gpt-7-preview", "max", "openai (provider_max)")


def test_unpriced_reject_refuses_the_call_in_the_sdks_shape(provider, start_envoy):
    e = envoy_without_prices(start_envoy, provider.port, {"limits": [SESSION_USD], "unpriced": "reject"})
    client = anthropic.Anthropic(base_url=e.url, api_key="sk-ant-reject", max_retries=2,
                                 default_headers={"x-session-id": "s-1"})
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        client.messages.create(model="claude-9-opus", max_tokens=100, messages=ask())
    err = caught.value
    assert err.status_code == 403 and err.response.headers["x-should-retry"] == "false"
    assert err.body["error"]["type"] == "permission_error"
    assert err.body["loopguard"]["code"] == "model_unpriced"
    assert provider.count == 0
    # A priced model passes.
    client.messages.create(model="claude-sonnet-4-6", max_tokens=100, messages=ask())
    assert provider.count == 1
    assert stat(e, "budget_unpriced_total.policy.agents") == 1


# --- 2. bodies too large or unreadable --------------------------------------------------

CALLER_CALLS = {"name": "caller-calls", "per": "caller", "window_seconds": 600, "calls": 2}


def test_a_body_past_max_body_bytes_is_checked_and_counted(provider, start_envoy):
    """A request padded past max_body_bytes with a base64 image: its caller
    key needs no body, so it is checked and counted; the 3rd is refused.
    Before, such requests were never checked nor counted."""
    cfg = budget_config({"limits": [CALLER_CALLS]})
    cfg["max_body_bytes"] = 64 * 1024
    e = start_envoy(budget_boot(cfg, provider.port))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-big-bodies", max_retries=0)
    image = base64.b64encode(b"\x89PNG" + bytes(200 * 1024)).decode()
    message = [{"role": "user", "content": [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]}]
    for _ in range(2):
        client.chat.completions.create(model="gpt-4o", messages=message)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="gpt-4o", messages=message)
    assert provider.count == 2
    assert stat(e, "bodies_skipped_total.reason.too_large") == 3
    assert total_spend(e, "caller-calls") == 2


# --- 3. all eight caps ----------------------------------------------------------------


def test_every_one_of_eight_caps_is_enforced(provider, start_envoy):
    """Eight caps per caller, the eighth the tightest (2 calls): the 3rd call
    is refused by it. Before, the fifth to eighth caps were never stored."""
    limits = [{"name": f"c{i}", "per": "caller", "window_seconds": 600, "calls": 100 + i} for i in range(7)]
    limits.append({"name": "eighth", "per": "caller", "window_seconds": 600, "calls": 2})
    e = budget_envoy(start_envoy, provider.port, {"limits": limits})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-eight", max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model="gpt-4o", messages=ask())
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=ask())
    assert caught.value.body["budget"] == "eighth"
    for name in [f"c{i}" for i in range(7)] + ["eighth"]:
        assert total_spend(e, name) == 2, name
    assert stat(e, "budget_evicted_total.policy.agents") == 0


# --- 4. a key at its cap is not evicted --------------------------------------------


def test_a_session_at_its_cap_survives_a_flood_of_new_sessions(provider, start_envoy):
    """The smallest table (64 keys); a session spends its 3 calls, then 400
    new sessions of the same client make a call each: the capped session is
    still refused, the flood's keys gave way to each other. Before, the
    capped key went idle and was evicted first, and the session spent a
    whole cap again."""
    budget = {"limits": [{"name": "s", "per": "session", "window_seconds": 600, "calls": 3}],
              "max_tracked_keys": 64}
    e = budget_envoy(start_envoy, provider.port, budget)
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-rotating"}) as c:
        def call(session: str) -> int:
            return c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask()},
                          headers={"x-session-id": session}).status_code

        assert [call("capped") for _ in range(3)] == [200] * 3
        assert call("capped") == 429
        assert [call(f"flood-{i}") for i in range(400)].count(200) == 400
        assert call("capped") == 429
    assert stat(e, "budget_evicted_total.policy.agents") > 0


# --- 5. answers read as what they say ---------------------------------------------


def test_a_gzip_answer_is_read_not_guessed(provider, start_envoy):
    """The OpenAI SDK accepts gzip; a provider compresses. loopguard asks
    upstream for identity encoding under a budget, so the usage is read.
    Before, output was estimated from compressed bytes."""
    provider.gzip_when_asked = True
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 1_000_000}]})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-gzip", max_retries=0)
    provider.plan(Turn(5000, 700))
    assert client.chat.completions.create(model="gpt-4o", messages=ask()).usage.completion_tokens == 700
    assert "accept-encoding" not in provider.headers[-1]
    assert h.wait_for(lambda: total_spend(e, "tokens") == 5700, 5), spend(e, "tokens")
    assert stat(e, "budget_estimated_total.policy.agents") == 0


def test_a_stream_that_did_not_ask_for_usage_is_counted_and_looks_as_asked(provider, start_envoy):
    """The SDK streams without stream_options: loopguard asks the provider
    for the usage and takes out what that adds (the usage-only chunk, the
    usage:null members), so the client's chunks are as it asked. Before,
    one token per event was counted."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 1_000_000}]})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-no-usage", max_retries=0)
    provider.plan(Turn(3000, 900))
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=ask(), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Four is the answer."
    assert all(c.choices and c.usage is None for c in chunks)
    assert h.wait_for(lambda: total_spend(e, "tokens") == 3900, 5), spend(e, "tokens")
    assert stat(e, "budget_estimated_total.policy.agents") == 0
    # The raw stream has no trace of the option.
    provider.plan(Turn(10, 1))
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-no-usage"}) as c:
        raw = c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask(), "stream": True}).text
    assert "usage" not in raw and raw.endswith("data: [DONE]\n\n"), raw


def with_route_timeout(boot: dict, seconds: float) -> dict:
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["timeout"] = f"{seconds}s"
    return boot


def test_a_timed_out_answer_and_a_client_that_left_are_charged_an_estimate(provider, start_envoy):
    """The provider bills a generation Envoy gave up on (504) and one whose
    client left: each is charged its max_tokens. Before, both spent
    nothing."""
    provider.delay = 1.5
    cfg = budget_config({"limits": [
        {"name": "out", "per": "caller", "window_seconds": 600, "tokens": 1_000_000, "tokens_of": "output"}]})
    e = start_envoy(with_route_timeout(budget_boot(cfg, provider.port), 0.5))
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-slow"}) as c:
        r = c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask(), "max_tokens": 3000})
        assert r.status_code == 504
    assert h.wait_for(lambda: total_spend(e, "out") == 3000, 5), spend(e, "out")
    e2 = start_envoy(budget_boot(cfg, provider.port))
    with httpx.Client(base_url=e2.url, headers={"authorization": "Bearer sk-gone"}, timeout=0.3) as c:
        with pytest.raises(httpx.TimeoutException):
            c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask(), "max_tokens": 2500})
    assert h.wait_for(lambda: total_spend(e2, "out") == 2500, 5), spend(e2, "out")
    assert stat(e2, "budget_estimated_total.policy.agents") == 1


# --- 6. edges -------------------------------------------------------------------------


@pytest.mark.parametrize("budget, message", [
    ({"limits": [{"name": "n", "per": "caller", "window_seconds": 60, "usd": 1e-7}]},
     'policy "agents": budget.limits[0].usd 1e-7 rounds to $0'),
    ({"limits": [{"name": "n", "per": "caller", "window_seconds": 60, "calls": 1}], "warn_at": 0.9995},
     'policy "agents": budget.warn_at 0.9995 rounds to 1'),
])
def test_a_value_that_rounds_to_nothing_stops_the_filter(provider, start_envoy, budget, message):
    log = start_envoy.make(budget_boot(budget_config(budget), provider.port)).expect_startup_failure()
    lines = [line for line in log.splitlines() if "invalid configuration: " in line]
    assert lines and message in lines[0], log[-3000:]


def test_a_websocket_under_a_budget_is_checked_and_counted_as_it_opens(provider, start_envoy):
    """An upgrade passes nothing loopguard could read: it is checked and
    charged as one call when it opens, and counted apart."""
    cfg = budget_config({"limits": [{"name": "calls", "per": "caller", "window_seconds": 600, "calls": 1}]})
    cfg["policies"][0]["spec"]["selector"]["methods"] = ["GET", "POST"]
    boot = budget_boot(cfg, provider.port)
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["upgrade_configs"] = [{"upgrade_type": "websocket"}]
    e = start_envoy(boot)

    def handshake() -> str:
        with socket.create_connection(("127.0.0.1", e.port), timeout=5) as s:
            s.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-ws\r\n"
                      b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                      b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
            return s.recv(4096).split(b"\r\n", 1)[0].decode()

    first = handshake()
    assert " 429 " not in first, first
    assert h.wait_for(lambda: stat(e, "budget_tunnels_total.policy.agents") == 1, 5)
    assert h.wait_for(lambda: total_spend(e, "calls") == 1, 5)
    assert " 429 " in handshake()


# --- reported cost, monthly and per-user caps ---------------------------------------


def test_a_cost_the_upstream_reports_wins_over_the_table(provider, start_envoy):
    e = envoy_without_prices(start_envoy, provider.port, {"limits": [
        {"name": "usd", "per": "caller", "window_seconds": 3600, "usd": 1}]})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-router", max_retries=0)
    provider.usage_cost = 0.4  # OpenRouter's usage.cost
    client.chat.completions.create(model="openai/gpt-4o", messages=ask())
    provider.usage_cost = None
    provider.cost_header = "0.35"  # LiteLLM's header
    client.chat.completions.create(model="openai/gpt-4o", messages=ask())
    assert h.wait_for(lambda: total_spend(e, "usd") == 750_000, 5), spend(e, "usd")
    assert stat(e, "budget_reported_cost_total.policy.agents") == 2
    provider.cost_header = "0.30"
    client.chat.completions.create(model="openai/gpt-4o", messages=ask())
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="openai/gpt-4o", messages=ask())


@pytest.mark.usefixtures("servers_installed")
def test_a_monthly_cap_per_end_user_acts_on_the_next_request_on_any_replica(shared, provider, start_envoy):
    """Two replicas sharing Redis, one API key shared by an app's users, a
    30-day cap of 2 calls per end user (OpenAI's `user` field): each user's
    3rd call is refused on the other replica, right after the crossing
    response; another user of the same key is not."""
    _, webdis = shared
    budget = {"limits": [{"name": "user-month", "per": "user", "window_seconds": 30 * 86400, "calls": 2}]}
    a, b = replicas(start_envoy, provider, webdis.port, budget_config(budget, store=STORE), hold=True)
    ca, cb = (openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-shared-app", max_retries=0) for e in (a, b))
    for user in ("alice", "bob"):
        ca.chat.completions.create(model="gpt-4o", messages=ask(), user=user)
        cb.chat.completions.create(model="gpt-4o", messages=ask(), user=user)
        with pytest.raises(openai.RateLimitError) as caught:
            ca.chat.completions.create(model="gpt-4o", messages=ask(), user=user)
        assert caught.value.body["per"] == "user" and caught.value.body["window_seconds"] == 30 * 86400
    # safety_identifier names a user too; a new one has a cap of its own.
    cb.chat.completions.create(model="gpt-4o", messages=ask(), extra_body={"safety_identifier": "carol"})
    assert provider.count == 5
