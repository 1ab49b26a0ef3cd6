"""What loops spend, in real Envoy with the real SDKs: tokens priced per
model (a dated model name takes its undated price; cached input at the
cached price), the loop.detected event and its signed webhook carrying the
loop's earlier spending and its caller, what rejected requests would have
spent (an estimate: the loop's newest response), and the looping caller's
own series."""

from __future__ import annotations

import hashlib
import hmac
import json
import re

import anthropic
import httpx
import openai
import pytest

import harness as h
from llm_provider import Turn
from observing import alerts_sent, events, metric, prometheus, settle, tokens
from shared_store import webdis_cluster

SECRET = "spend-webhook-secret"
PRICES = {
    "gpt-4o": {"input_per_million": 2.5, "output_per_million": 10, "cached_input_per_million": 1.25},
    "claude-haiku-4-5": {"input_per_million": 1, "output_per_million": 5, "cached_input_per_million": 0.1},
}
# The identical request: allowed twice, warned at the 3rd and 4th (the loop
# is detected at the 3rd), rejected from the 5th.
CONFIG = {
    "max_body_bytes": 1 << 20,
    "hold_request_headers": True,
    "prices": PRICES,
    "alerts": {"webhook": {"cluster": "alerts", "authority": "hooks.example.com", "path": "/loopguard",
                           "timeout_ms": 2000, "hmac_secret_env": "LOOPGUARD_WEBHOOK_SECRET"}},
    "policies": [{"id": "spend", "spec": {
        "selector": {"pathPrefix": "/v1/", "methods": ["POST"]},
        "loop_detection": {"enabled": True, "window_seconds": 60, "similarity": "llm_tail",
                           "escalation": [{"at": 3, "action": "warn"}, {"at": 5, "action": "reject"}]},
    }}],
}
TAG = re.compile(r"^[0-9a-f]{12}$")


def spend_envoy(start_envoy, provider, receiver, config=CONFIG):
    """Envoy with loopguard holding headers, the `alerts` cluster pointing at
    the receiver, the webhook secret passed into the VM, and the example's
    stats_tags (so Prometheus labels can be checked too)."""
    boot = h.bootstrap(config, provider.port, hold=True)
    boot["static_resources"]["clusters"].append(webdis_cluster(receiver.port, "alerts"))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    h.pass_env(hcm["http_filters"][0], ["LOOPGUARD_WEBHOOK_SECRET"])
    boot["stats_config"] = h.load_yaml(h.ROOT / "examples" / "observability" / "envoy.yaml")["stats_config"]
    return start_envoy(boot, env={"LOOPGUARD_WEBHOOK_SECRET": SECRET})


def one_signed_alert(e: h.Envoy, receiver) -> dict:
    assert h.wait_for(lambda: receiver.count >= 1)
    alerts_sent(e)  # every alert of the traffic so far: a second would be here
    assert receiver.count == 1
    alert = receiver.requests[0]
    expected = "sha256=" + hmac.new(SECRET.encode(), alert["body"], hashlib.sha256).hexdigest()
    assert alert["headers"]["x-loopguard-signature"] == expected
    return json.loads(alert["body"])


def usd(microusd: int) -> float:
    """As the event writes dollars: micro-dollars / 10^6."""
    return microusd / 1e6


# OpenAI counts cached tokens inside prompt_tokens. At gpt-4o's prices
# ($2.50 input, $1.25 cached input, $10 output per million):
T1 = Turn(600, 100, cached=400)   # 1000 in: 600 x 2.5 + 400 x 1.25 + 100 x 10 = 3000 µ$
T2 = Turn(1200, 150)              # 1200 in: 3000 + 1500 = 4500 µ$
T3 = Turn(300, 90, cached=1000)   # 1300 in: 750 + 1250 + 900 = 2900 µ$
T4 = Turn(1400, 80)               # 1400 in: 3500 + 800 = 4300 µ$


def test_openai_loop_spending_cost_event_webhook_avoided_and_caller(provider, receiver, start_envoy):
    """Six identical Chat Completions calls with a dated gpt-4o model: the
    1st and 2nd cost 3000 + 4500 µ$ outside a loop; the 3rd is the
    detection, whose event (and alert) reports the 2 earlier responses
    (2200 input, 250 output tokens, $0.0075); the 3rd and 4th cost
    2900 + 4300 µ$ inside the loop; the 5th and 6th are rejected (429, the
    SDK's RateLimitError) and each counts the 4th's 1400 + 80 tokens and
    4300 µ$ as avoided. The caller's series counts the 4 requests inside
    the loop under the event's caller tag."""
    e = spend_envoy(start_envoy, provider, receiver)
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-spender", max_retries=0)
    call = {"model": "gpt-4o-2024-08-06",
            "messages": [{"role": "system", "content": "You are the build bot."},
                         {"role": "user", "content": "Is the build on main green?"}]}
    provider.plan(T1, T2, T3, T4)
    warnings = []
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(**call)
        assert raw.parse().choices[0].message.content == "Four."
        warnings.append(raw.headers.get("x-loopguard-warning"))
    assert warnings == [None, None, "loop_warn", "loop_warn"]
    for _ in range(2):
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(**call)
        assert caught.value.status_code == 429
    assert provider.count == 4
    settle(e, "loopguard.tokens_total", 2200 + 250 + 2700 + 170)
    e.quiet()  # the responses are over: nothing more is counted of them

    # Tokens and dollars, by loop.
    assert (tokens(e, "input", False, "gpt-4o", "spend"), tokens(e, "output", False, "gpt-4o", "spend")) == (2200, 250)
    assert (tokens(e, "input", True, "gpt-4o", "spend"), tokens(e, "output", True, "gpt-4o", "spend")) == (2700, 170)
    assert e.counter("loopguard.tokens_total") == 2200 + 250 + 2700 + 170  # nothing under other
    assert metric(e, "cost_microusd_total.policy.spend.loop.false.model.gpt-4o") == 3000 + 4500
    assert metric(e, "cost_microusd_total.policy.spend.loop.true.model.gpt-4o") == 2900 + 4300
    # What the two rejections would have spent: the 4th response, twice.
    assert metric(e, "tokens_avoided_total.policy.spend.token_type.input.model.gpt-4o") == 2 * 1400
    assert metric(e, "tokens_avoided_total.policy.spend.token_type.output.model.gpt-4o") == 2 * 80
    assert metric(e, "cost_avoided_microusd_total.policy.spend.model.gpt-4o") == 2 * 4300
    assert e.counter("loopguard.tokens_avoided_total") == 2 * (1400 + 80)
    assert e.counter("loopguard.responses_without_usage_total") == 0

    # One event, carrying the caller and what the loop spent before it.
    [event] = events(e)
    assert {k: event[k] for k in ("policy", "hit_count", "action", "model")} == {
        "policy": "spend", "hit_count": 3, "action": "warn", "model": "gpt-4o-2024-08-06"}
    assert TAG.match(event["caller"]), event
    assert event["spent"] == {"responses": 2, "input_tokens": 2200, "output_tokens": 250, "usd": usd(3000 + 4500)}
    assert event["spent"]["usd"] == 0.0075
    assert "sk-spender" not in e.log()

    # The caller's series: the 3rd to 6th requests, under the event's tag.
    callers = {k: v for k, v in e.stats().items() if k.startswith("wasmcustom.loopguard.caller_loop_requests_total.")}
    assert callers == {f"wasmcustom.loopguard.caller_loop_requests_total.policy.spend.caller.{event['caller']}": 4}

    # The signed alert carries the same.
    payload = one_signed_alert(e, receiver)
    assert payload["event"] == "loop.detected" and payload["fingerprint"] == event["fingerprint"]
    assert payload["caller"] == event["caller"]
    assert payload["spent"] == event["spent"]

    # The labels as Prometheus shows them with the documented stats_tags.
    assert prometheus(e, "loopguard_cost_microusd_total") == {
        frozenset({("policy", "spend"), ("loop", "false"), ("model", "gpt-4o")}): 7500,
        frozenset({("policy", "spend"), ("loop", "true"), ("model", "gpt-4o")}): 7200,
        frozenset({("policy", "spend"), ("loop", "false"), ("model", "claude-haiku-4-5")}): 0,
        frozenset({("policy", "spend"), ("loop", "true"), ("model", "claude-haiku-4-5")}): 0,
    }
    assert prometheus(e, "loopguard_caller_loop_requests_total") == {
        frozenset({("policy", "spend"), ("caller", event["caller"])}): 4}


# Anthropic counts cache reads apart from input_tokens. At claude-haiku-4-5's
# prices ($1 input, $0.10 cached input, $5 output per million):
A1 = Turn(500, 120, cached=2000)  # 2500 in: 500 + 200 + 600 = 1300 µ$
A2 = Turn(600, 110, cached=2000)  # 2600 in: 600 + 200 + 550 = 1350 µ$
A3 = Turn(700, 100, cached=2000)  # 2700 in: 700 + 200 + 500 = 1400 µ$
A4 = Turn(800, 90, cached=2000)   # 2800 in: 800 + 200 + 450 = 1450 µ$


def test_anthropic_streamed_loop_spending_event_webhook_avoided_and_caller(provider, receiver, start_envoy):
    """The same with the anthropic SDK, every call streamed (input in
    message_start with cache reads, output in message_delta) and a model
    with a YYYYMMDD suffix: the event reports 2 responses, 5100 input and
    230 output tokens, $0.00265; the rejections count the 4th's 2800 + 90
    tokens each."""
    e = spend_envoy(start_envoy, provider, receiver)
    client = anthropic.Anthropic(base_url=e.url, api_key="sk-ant-spender", max_retries=0)
    call = {"model": "claude-haiku-4-5-20251001", "max_tokens": 256, "system": "You are the build bot.",
            "messages": [{"role": "user", "content": "Is the build on main green?"}]}
    provider.plan(A1, A2, A3, A4)
    for turn in (A1, A2, A3, A4):
        with client.messages.stream(**call) as s:
            assert s.get_final_text() == "Four."
            final = s.get_final_message().usage
            assert (final.input_tokens, final.cache_read_input_tokens, final.output_tokens) == (turn.input, 2000, turn.output)
    for _ in range(2):
        with pytest.raises(anthropic.RateLimitError) as caught:
            with client.messages.stream(**call) as s:
                s.get_final_text()
        assert caught.value.status_code == 429
    assert provider.count == 4
    settle(e, "loopguard.tokens_total", 5100 + 230 + 5500 + 190)
    e.quiet()  # the responses are over: nothing more is counted of them

    m = "claude-haiku-4-5"
    assert (tokens(e, "input", False, m, "spend"), tokens(e, "output", False, m, "spend")) == (5100, 230)
    assert (tokens(e, "input", True, m, "spend"), tokens(e, "output", True, m, "spend")) == (5500, 190)
    assert metric(e, f"cost_microusd_total.policy.spend.loop.false.model.{m}") == 1300 + 1350
    assert metric(e, f"cost_microusd_total.policy.spend.loop.true.model.{m}") == 1400 + 1450
    assert metric(e, f"tokens_avoided_total.policy.spend.token_type.input.model.{m}") == 2 * 2800
    assert metric(e, f"tokens_avoided_total.policy.spend.token_type.output.model.{m}") == 2 * 90
    assert e.counter("loopguard.responses_without_usage_total") == 0

    [event] = events(e)
    assert (event["policy"], event["hit_count"], event["model"]) == ("spend", 3, "claude-haiku-4-5-20251001")
    assert TAG.match(event["caller"]), event
    assert event["spent"] == {"responses": 2, "input_tokens": 5100, "output_tokens": 230, "usd": usd(1300 + 1350)}
    callers = {k: v for k, v in e.stats().items() if k.startswith("wasmcustom.loopguard.caller_loop_requests_total.")}
    assert callers == {f"wasmcustom.loopguard.caller_loop_requests_total.policy.spend.caller.{event['caller']}": 4}
    payload = one_signed_alert(e, receiver)
    assert (payload["caller"], payload["spent"]) == (event["caller"], event["spent"])


def test_avoided_cost_prices_the_newest_response_as_it_was_priced(provider, receiver, start_envoy):
    """A rejection's avoided dollars are the newest response's price
    (docs/observability.md: "the loop's newest observed usage ... and its
    price"): for an agent whose input is mostly cached, that is the cached
    price. The 4th response cost 1450 µ$ (2000 of its 2800 input tokens
    cached); the rejection counts 1450, not 3250 (all 2800 at the uncached
    price)."""
    e = spend_envoy(start_envoy, provider, receiver)
    client = anthropic.Anthropic(base_url=e.url, api_key="sk-ant-cached", max_retries=0)
    call = {"model": "claude-haiku-4-5", "max_tokens": 256, "messages": [{"role": "user", "content": "Green yet?"}]}
    provider.plan(A1, A2, A3, A4)
    for _ in range(4):
        assert client.messages.create(**call).content[0].text == "Four."
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(**call)
    e.quiet()  # the responses are over: nothing more is counted of them
    assert metric(e, "cost_microusd_total.policy.spend.loop.true.model.claude-haiku-4-5") == 1400 + 1450
    assert metric(e, "tokens_avoided_total.policy.spend.token_type.input.model.claude-haiku-4-5") == 2800
    assert metric(e, "cost_avoided_microusd_total.policy.spend.model.claude-haiku-4-5") == 1450


def test_an_exact_mode_policy_prices_the_request_s_model(provider, start_envoy):
    """The default detection mode (exact) reads usage on an LLM API path;
    docs/observability.md: tokens carry `model`, "a model named in prices
    (the request's model)". A gpt-4o call under an exact-mode policy counts
    under model gpt-4o and in dollars (the model is found in the body
    without parsing it)."""
    cfg = h.plugin([h.policy("exact", threshold=5)], prices=PRICES)
    e = start_envoy(h.bootstrap(cfg, provider.port))
    provider.plan(T2)
    r = httpx.post(f"{e.url}/v1/chat/completions",
                   json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    settle(e, "loopguard.tokens_total", 1350)
    e.quiet()  # the responses are over: nothing more is counted of them
    assert e.counter("loopguard.tokens_total") == 1200 + 150
    assert (tokens(e, "input", False, "gpt-4o", "exact"), tokens(e, "output", False, "gpt-4o", "exact")) == (1200, 150)
    assert metric(e, "cost_microusd_total.policy.exact.loop.false.model.gpt-4o") == 4500
