"""Spend caps ("budgets", issue 29) in real Envoy with the real SDKs: dollars,
tokens and calls per caller, session or conversation over a sliding window;
the 429 in the called API's shape that the OpenAI and Anthropic SDKs raise
as RateLimitError without retrying; the warning from warn_at; shadow mode;
estimates; and examples/budget/envoy.yaml. A cap crossed mid-stream, exact
sums across workers and the window sliding are in test_budget_streams.py;
replicas sharing a Redis (single node and cluster) and Redis failing in
test_budget_redis.py.

Spending is read from the responses as they pass, so a cap acts on the
request after the crossing response (docs/actions.md#spend-caps-budgets).
The fake provider (llm_provider.py) reports the usage each test plans."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

import harness as h
from budgets import EXAMPLE, TAG, ask, budget_envoy, check_retry, downstream, release_of, spend, timed
from llm_provider import Turn
from observing import events, prometheus, settle, stat


# --- the SDKs -------------------------------------------------------------------

# $0.05 per caller per hour; a response of Turn(10000, 1000) at gpt-4o's
# prices costs 10000 x $2.50 + 1000 x $10 per million = 35000 µ$: the 2nd
# call still passes (at 70% of the cap, under warn_at), the 3rd is refused.
USD_CAP = {"name": "caller-usd", "per": "caller", "window_seconds": 3600, "usd": 0.05}
T_USD = Turn(10000, 1000)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_openai_sdk_raises_budget_exceeded_without_retrying(provider, start_envoy, stream):
    """Two calls spend $0.07 of the caller's $0.05 (the 2nd crosses it);
    the 3rd and 4th raise openai.RateLimitError with code budget_exceeded,
    each one 429 the SDK does not retry (x-should-retry: false, although
    its default 2 retries are on), and never reach the provider."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [USD_CAP]})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-openai-budget", max_retries=2)
    provider.plan(T_USD, T_USD)

    def call():
        if stream:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=ask(), stream=True, stream_options={"include_usage": True})
            chunks = list(raw.parse())
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Four is the answer."
            assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (10000, 1000)
        else:
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=ask())
            assert raw.parse().choices[0].message.content == "Four."
        return raw.headers

    headers, first_start, first_end = timed(call)
    assert "x-loopguard-budget" not in headers
    headers = call()
    assert "x-loopguard-budget" not in headers  # 35000 of 50000 µ$: under warn_at (80%)
    assert provider.count == 2

    release = release_of(first_start, first_end, 3600)
    for n in (1, 2):
        before = downstream(e)
        start = time.time()
        with pytest.raises(openai.RateLimitError) as caught:
            if stream:
                list(client.chat.completions.create(model="gpt-4o", messages=ask(), stream=True,
                                                    stream_options={"include_usage": True}))
            else:
                client.chat.completions.create(model="gpt-4o", messages=ask())
        end = time.time()
        err = caught.value
        # One 429, not retried.
        after = downstream(e)
        assert (after[0] - before[0], after[1] - before[1]) == (1, 1), (before, after)
        assert err.status_code == 429
        assert err.response.headers["x-should-retry"] == "false"
        assert err.response.headers["x-loopguard-policy"] == "agents"
        assert err.response.headers["x-loopguard-budget"] == "caller-usd; spent=0.07; cap=0.05; unit=usd; window=3600"
        assert err.response.headers["content-type"] == "application/json"
        # The first call's spending leaves the hour with its minute's slice.
        retry = check_retry(err.response.headers, release, start, end, 3600)
        assert 3480 <= retry <= 3600, retry
        message = (f'Budget "caller-usd" exceeded: spent $0.07 of $0.05 per caller in the last 3600 seconds. '
                   f"Retry after {retry} seconds.")
        assert (err.code, err.type, err.body["message"]) == ("budget_exceeded", "budget_exceeded", message)
        assert message in str(err)
        assert err.response.json() == {"error": {
            "message": message, "type": "budget_exceeded", "code": "budget_exceeded", "param": None,
            "policy": "agents", "budget": "caller-usd", "per": "caller", "spent": "0.07", "cap": "0.05",
            "unit": "usd", "window_seconds": 3600, "retry_after_seconds": retry}}
        assert stat(e, "budget_rejected_total.policy.agents.budget.caller-usd") == n
    assert provider.count == 2

    # Spend in micro-dollars under the caller's tag; nothing warned; both
    # refused requests were at or over 80% of the cap.
    [(key, spent)] = spend(e, "caller-usd").items()
    assert TAG.match(key) and spent == 2 * 35000
    assert prometheus(e, "loopguard_budget_spend_total") == {
        frozenset({("policy", "agents"), ("budget", "caller-usd"), ("key", key)}): 70000}
    assert prometheus(e, "loopguard_budget_rejected_total") == {frozenset({("policy", "agents"), ("budget", "caller-usd")}): 2}
    assert stat(e, "budget_near_cap_total.policy.agents.budget.caller-usd") == 2
    assert stat(e, "budget_warned_total.policy.agents.budget.caller-usd") == 0
    # One event (once per key and budget per minute per worker: the SDK's
    # one connection is on one worker), naming the key of the metric.
    [event] = events(e, "budget.exceeded")
    assert event == {
        "event": "budget.exceeded", "policy": "agents", "mode": "enforce", "budget": "caller-usd", "per": "caller",
        "key": key, "spent": "0.07", "cap": "0.05", "unit": "usd", "window_seconds": 3600, "action": "reject"}
    assert "sk-openai-budget" not in e.log()


SESSION_CALLS = {"name": "session-calls", "per": "session", "window_seconds": 600, "calls": 2}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_anthropic_sdk_raises_budget_exceeded_per_session(provider, start_envoy, stream):
    """Two calls per session (x-session-id) in 10 minutes: the session's
    3rd call raises anthropic.RateLimitError (not retried) with Anthropic's
    error shape and loopguard's fields under `loopguard`. Another session of
    the caller, a request without a session, and the same session id from
    another API key are not under that session's cap."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [SESSION_CALLS]})

    def client(key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=e.url, api_key=key, max_retries=2)

    def call(c: anthropic.Anthropic, session: str | None):
        extra = {"x-session-id": session} if session else {}
        if stream:
            with c.messages.stream(model="claude-haiku-4-5", max_tokens=64, messages=ask(), extra_headers=extra) as s:
                assert s.get_final_text() == "Four."
                return s.response.headers
        raw = c.messages.with_raw_response.create(model="claude-haiku-4-5", max_tokens=64, messages=ask(),
                                                  extra_headers=extra)
        assert raw.parse().content[0].text == "Four."
        return raw.headers

    agent = client("sk-ant-budget")
    headers, first_start, first_end = timed(lambda: call(agent, "s-1"))
    assert "x-loopguard-budget" not in headers
    assert "x-loopguard-budget" not in call(agent, "s-1")  # 1 of 2 calls: under warn_at
    before = downstream(e)
    start = time.time()
    with pytest.raises(anthropic.RateLimitError) as caught:
        call(agent, "s-1")
    end = time.time()
    after = downstream(e)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1), (before, after)
    err = caught.value
    assert err.status_code == 429
    assert err.response.headers["x-should-retry"] == "false"
    assert err.response.headers["x-loopguard-budget"] == "session-calls; spent=2; cap=2; unit=calls; window=600"
    retry = check_retry(err.response.headers, release_of(first_start, first_end, 600), start, end, 600)
    assert 580 <= retry <= 600, retry
    message = (f'Budget "session-calls" exceeded: spent 2 calls of 2 calls per session in the last 600 seconds. '
               f"Retry after {retry} seconds.")
    assert err.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": message},
        "loopguard": {"code": "budget_exceeded", "policy": "agents", "budget": "session-calls", "per": "session",
                      "spent": "2", "cap": "2", "unit": "calls", "window_seconds": 600, "retry_after_seconds": retry},
    }
    assert provider.count == 2

    # Not under session s-1's cap: another session, no session, another caller.
    call(agent, "s-2")
    call(agent, None)
    call(client("sk-ant-other"), "s-1")
    assert provider.count == 5
    # The session-less request counts under no session; each session its calls.
    assert sorted(spend(e, "session-calls").values()) == [1, 1, 2]
    assert stat(e, "budget_rejected_total.policy.agents.budget.session-calls") == 1
    [event] = events(e, "budget.exceeded")
    assert (event["budget"], event["per"], event["spent"], event["cap"], event["unit"]) == (
        "session-calls", "session", "2", "2", "calls")
    assert spend(e, "session-calls")[event["key"]] == 2


def test_a_conversation_cap_counts_each_task_apart(provider, start_envoy):
    """1000 tokens per conversation (the caller and the conversation's
    first message): task A's turns add up (700 each) and its 3rd turn is
    refused; task B of the same caller, and task A's first message from
    another API key, are other conversations."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "task", "per": "conversation", "window_seconds": 600, "tokens": 1000}]})
    provider.plan(*[Turn(600, 100)] * 4)
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-tasks", max_retries=0)
    task_a = [{"role": "user", "content": "Task A: migrate the billing tables."}]

    def turn(messages, c=client):
        return c.chat.completions.create(model="gpt-4o", messages=messages).choices[0].message.content

    assert turn(task_a) == "Four."
    task_a += [{"role": "assistant", "content": "Four."}, {"role": "user", "content": "Go on."}]
    assert turn(task_a) == "Four."
    task_a += [{"role": "assistant", "content": "Four."}, {"role": "user", "content": "And now?"}]
    with pytest.raises(openai.RateLimitError) as caught:
        turn(task_a)
    assert (caught.value.body["budget"], caught.value.body["per"], caught.value.body["spent"]) == (
        "task", "conversation", "1400")
    assert turn([{"role": "user", "content": "Task B: rotate the API keys."}]) == "Four."
    other = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-tasks-other", max_retries=0)
    assert turn(task_a[:1], other) == "Four."
    assert provider.count == 4
    assert sorted(spend(e, "task").values()) == [700, 700, 1400]


# --- warning ----------------------------------------------------------------------

def test_warning_header_event_and_counters_from_warn_at(provider, start_envoy):
    """Two caps, warn_at 0.5: 1000 tokens and 5 calls per caller a minute;
    each response reports 300 tokens. The 3rd request (600 tokens spent)
    carries the tokens cap's warning, to the client and (headers held) to
    the upstream; the 4th both caps' (900 tokens, 3 calls), joined with ", ";
    the 5th (1200 tokens) is refused by the tokens cap. One budget.warning
    event per cap (once per key and budget per minute per worker)."""
    budget = {"limits": [{"name": "tok", "per": "caller", "window_seconds": 60, "tokens": 1000},
                         {"name": "calls", "per": "caller", "window_seconds": 60, "calls": 5}],
              "warn_at": 0.5}
    e = budget_envoy(start_envoy, provider.port, budget)
    provider.plan(*[Turn(200, 100)] * 4)
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-warned", max_retries=0)
    warnings = []
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=ask())
        assert raw.parse().choices[0].message.content == "Four."
        warnings.append(raw.headers.get("x-loopguard-budget"))
    third = "tok; spent=600; cap=1000; unit=tokens; window=60"
    fourth = "tok; spent=900; cap=1000; unit=tokens; window=60, calls; spent=3; cap=5; unit=calls; window=60"
    assert warnings == [None, None, third, fourth]
    # The upstream request carried the same header.
    assert [hd.get("x-loopguard-budget") for hd in provider.headers] == [None, None, third, fourth]
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=ask())
    err = caught.value
    assert err.code == "budget_exceeded"
    assert err.body["budget"] == "tok" and err.body["spent"] == "1200"
    # The 429 names the cap that refused it.
    assert err.response.headers["x-loopguard-budget"] == "tok; spent=1200; cap=1000; unit=tokens; window=60"
    assert provider.count == 4

    assert stat(e, "budget_warned_total.policy.agents.budget.tok") == 2
    assert stat(e, "budget_warned_total.policy.agents.budget.calls") == 1
    # 80% of a cap, whatever warn_at says: tok at 900 and 1200, calls at 4.
    assert stat(e, "budget_near_cap_total.policy.agents.budget.tok") == 2
    assert stat(e, "budget_near_cap_total.policy.agents.budget.calls") == 1
    assert stat(e, "budget_rejected_total.policy.agents.budget.tok") == 1
    assert stat(e, "budget_rejected_total.policy.agents.budget.calls") == 0
    [key] = spend(e, "tok")
    assert spend(e, "tok") == {key: 1200} and spend(e, "calls") == {key: 4}
    assert h.wait_for(lambda: len(events(e, "budget.warning")) >= 2, 5)
    warned = sorted(events(e, "budget.warning"), key=lambda ev: ev["budget"])
    assert warned == [
        {"event": "budget.warning", "policy": "agents", "mode": "enforce", "budget": "calls", "per": "caller",
         "key": key, "spent": "3", "cap": "5", "unit": "calls", "window_seconds": 60, "action": "warn"},
        {"event": "budget.warning", "policy": "agents", "mode": "enforce", "budget": "tok", "per": "caller",
         "key": key, "spent": "600", "cap": "1000", "unit": "tokens", "window_seconds": 60, "action": "warn"},
    ]
    [exceeded] = events(e, "budget.exceeded")
    assert (exceeded["budget"], exceeded["spent"], exceeded["action"]) == ("tok", "1200", "reject")


# --- shadow mode --------------------------------------------------------------------


def test_shadow_mode_counts_and_logs_but_never_refuses(provider, start_envoy):
    """One call a minute in shadow mode: every call passes, without the
    header; each would-be rejection is counted, logged with one line and a
    budget.exceeded event in shadow mode."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "calls", "per": "caller", "window_seconds": 60, "calls": 1}]}, mode="shadow")
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-shadow"}) as c:
        rs = [c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask()}) for _ in range(3)]
    assert [r.status_code for r in rs] == [200] * 3
    assert all("x-loopguard-budget" not in r.headers for r in rs)
    assert all("x-loopguard-budget" not in hd for hd in provider.headers)
    assert provider.count == 3
    assert stat(e, "budget_shadow_total.policy.agents.budget.calls") == 2
    assert prometheus(e, "loopguard_budget_shadow_total") == {frozenset({("policy", "agents"), ("budget", "calls")}): 2}
    assert stat(e, "budget_rejected_total.policy.agents.budget.calls") == 0
    assert stat(e, "budget_warned_total.policy.agents.budget.calls") == 0
    assert list(spend(e, "calls").values()) == [3]
    log = e.log()
    for spent in (1, 2):
        assert (f'shadow: would_reject budget policy="agents" budget=calls per=caller spent={spent} cap=1 unit=calls'
                in log), log[-3000:]
    [event] = events(e, "budget.exceeded")  # once per key and budget per minute per worker
    assert (event["mode"], event["action"], event["spent"]) == ("shadow", "shadow", "1")


# --- estimates and failures ---------------------------------------------------------


def test_estimated_spending_is_counted_and_labelled(provider, start_envoy):
    """A stream cut off before its usage (the provider stops after the
    finish chunk, before the usage and [DONE]) is estimated: input = the
    request body's bytes / 4, output = what the call may have generated, its
    max_completion_tokens (300; more than the 5 data events seen).
    loopguard_budget_estimated_total counts it (the label an estimate
    carries: docs/observability.md); a reported response is not counted."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 100_000}], "warn_at": 0.001})
    body = json.dumps({"model": "gpt-4o", "messages": ask("x" * 800), "stream": True,
                       "max_completion_tokens": 300,
                       "stream_options": {"include_usage": True}}).encode()
    estimate = len(body) // 4 + 300
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-estimated",
                                               "content-type": "application/json"}) as c:
        provider.cut_streams = 2
        r = c.post("/v1/chat/completions", content=body)
        assert r.status_code == 200 and '"finish_reason": "stop"' in r.text and "usage\": {" not in r.text
        provider.cut_streams = 0
        assert h.wait_for(lambda: e.counter("loopguard.budget_estimated_total") == 1, 5)
        assert list(spend(e, "tokens").values()) == [estimate]
        warned = c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask()})
        assert warned.headers["x-loopguard-budget"] == f"tokens; spent={estimate}; cap=100000; unit=tokens; window=600"
    assert e.counter("loopguard.budget_estimated_total") == 1
    [event] = events(e, "budget.warning")
    assert event["spent"] == str(estimate)

    # Reported usage only: nothing more is counted as estimated.
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-reported"}) as c:
        for _ in range(2):
            assert c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask()}).status_code == 200
    assert e.counter("loopguard.budget_estimated_total") == 1


def test_a_stream_read_to_its_usage_is_counted_as_reported(provider, start_envoy):
    """The openai SDK stops reading a stream at `data: [DONE]` and closes
    it, before the provider's end of stream (here 10 ms later): Envoy sees
    the client leave after the usage event has passed. That stream was not
    "cut off before its usage" (the spec's estimate): it spends what it
    reported, 100 + 2 tokens, as the token metrics count it, not an
    estimate (one token per event: 7 events seen)."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 100_000}]})
    provider.plan(Turn(100, 2))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-read-to-usage", max_retries=0)
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=ask(), stream=True,
                                                 stream_options={"include_usage": True}))
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (100, 2)
    settle(e, "loopguard.tokens_total", 102)
    settle(e, "loopguard.budget_spend_total", 102)
    e.quiet()  # the stream is over: nothing more is counted of it
    assert e.counter("loopguard.tokens_total") == 102
    assert list(spend(e, "tokens").values()) == [102]
    assert e.counter("loopguard.budget_estimated_total") == 0


def test_a_provider_failure_is_no_call_and_spends_nothing(start_envoy):
    """The spec: "a provider failure, 5xx or 429, is not a call and spends
    nothing". The provider answers 503, then 429 (JSON error bodies without
    usage): neither counts as a call nor spends tokens or dollars; the
    next call answered 200 does."""
    answers = [(503, {"error": {"message": "overloaded", "type": "server_error"}}),
               (429, {"error": {"message": "slow down", "type": "rate_limit_error"}}),
               (200, {**h.COMPLETION, "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})]
    up = h.Upstream(responder=lambda req: answers.pop(0))
    try:
        e = budget_envoy(start_envoy, up.port, {"limits": [
            {"name": "calls", "per": "caller", "window_seconds": 600, "calls": 1},
            {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 100_000},
            {"name": "usd", "per": "caller", "window_seconds": 600, "usd": 100}]})
        with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-failing"}) as c:
            codes = [c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": ask()}).status_code
                     for _ in range(4)]
        assert codes == [503, 429, 200, 429], codes
        assert up.count == 3
        key = next(iter(spend(e, "calls")))
        assert spend(e, "calls") == {key: 1}
        assert spend(e, "tokens") == {key: 110}
        assert spend(e, "usd") == {key: 100 * 2.5 + 10 * 10}
        assert e.counter("loopguard.budget_estimated_total") == 0
    finally:
        up.stop()


# --- examples/budget/envoy.yaml -----------------------------------------------------

# At the example's gpt-4o-mini prices ($0.15 input, $0.60 output per
# million): 20M input + 2M output tokens = $3.00 + $1.20 = $4.20.
BIG = Turn(20_000_000, 2_000_000)
SMALL = Turn(1000, 100)


def test_budget_example_caps_a_session_not_the_next(provider, start_envoy):
    """examples/budget/envoy.yaml as shipped (upstreams and ports moved):
    session s-1 spends $4.20, its 2nd call is warned ($4.20 of $5.00) and
    spends $4.20 more; its 3rd is refused. Session s-2 of the same caller,
    over the OpenAI and the Anthropic route, and s-1 of another API key are
    unaffected; the caller's day ($8.40+ of $50) is under its warning.
    Last, a call naming session s-1 in the body's metadata.session_id (the
    example's second source) instead of the header is refused as s-1."""
    e = start_envoy(h.localize(h.load_yaml(EXAMPLE), {"openai": provider.port, "anthropic": provider.port}))
    oa = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-example-budget", max_retries=2)

    def chat(session: str | None = None, client: openai.OpenAI = oa, **kw):
        extra = {"x-session-id": session} if session else {}
        return client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=ask(),
                                                                extra_headers=extra, **kw)

    provider.plan(BIG, BIG, SMALL, SMALL, SMALL)
    assert "x-loopguard-budget" not in chat("s-1").headers
    assert chat("s-1").headers["x-loopguard-budget"] == "session-hour; spent=4.20; cap=5.00; unit=usd; window=3600"
    with pytest.raises(openai.RateLimitError) as caught:
        chat("s-1")
    err = caught.value
    assert err.code == "budget_exceeded"
    assert err.body["budget"] == "session-hour" and err.body["per"] == "session"
    assert err.body["message"].startswith(
        'Budget "session-hour" exceeded: spent $8.40 of $5.00 per session in the last 3600 seconds.')
    assert 3480 <= int(err.response.headers["retry-after"]) <= 3600
    assert provider.count == 2

    # Another session of the caller: neither cap near (caller-day $8.40 of $50).
    assert "x-loopguard-budget" not in chat("s-2").headers
    ant = anthropic.Anthropic(base_url=e.url, api_key="sk-example-budget", max_retries=0)
    raw = ant.messages.with_raw_response.create(model="claude-sonnet-4", max_tokens=64, messages=ask(),
                                                extra_headers={"x-session-id": "s-2"})
    assert raw.parse().content[0].text == "Four." and "x-loopguard-budget" not in raw.headers
    # The same session id from another API key is another session.
    other = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-example-other", max_retries=0)
    assert "x-loopguard-budget" not in chat("s-1", client=other).headers
    assert provider.count == 5

    prom = e.prometheus()
    assert prom['loopguard_budget_rejected_total{policy="agents",budget="session-hour"}'] == 1
    assert prom.get('loopguard_budget_rejected_total{policy="agents",budget="caller-day"}', 0) == 0
    # gpt-4o-mini SMALL: 1000 x 0.15 + 100 x 0.6 = 210 µ$; claude-sonnet-4
    # SMALL (Anthropic's input is uncached): 1000 x 3 + 100 x 15 = 4500 µ$.
    sessions = sorted(v for k, v in prometheus(e, "loopguard_budget_spend_total").items() if ("budget", "session-hour") in k)
    assert sessions == [210, 210 + 4500, 2 * 4_200_000]
    callers = sorted(v for k, v in prometheus(e, "loopguard_budget_spend_total").items() if ("budget", "caller-day") in k)
    assert callers == [210, 2 * 4_200_000 + 210 + 4500]
    [warning] = events(e, "budget.warning")
    assert (warning["budget"], warning["spent"], warning["cap"]) == ("session-hour", "4.20", "5.00")
    assert len(events(e, "loop.detected")) == 0

    # The session id in the body (the example's second source) is the same
    # session s-1 as in the header: refused too.
    with pytest.raises(openai.RateLimitError) as caught:
        chat(None, metadata={"session_id": "s-1"}, store=False)
    assert caught.value.body["budget"] == "session-hour"
    assert caught.value.body["spent"] == "8.40"
