"""Spend caps (see test_budget.py) where streams and time matter: a cap
crossed mid-stream, exact sums from concurrent streams on two workers, and
the window sliding call by call."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from budgets import ask, budget_envoy, check_retry, release_of, spend, timed
from llm_provider import HeldStreams, Turn
from observing import prometheus, settle, stat


# --- a cap crossed mid-stream -------------------------------------------------------


def test_a_stream_crossing_the_cap_completes_and_the_next_request_is_refused(start_envoy):
    """1000 tokens per caller. A plain call spends 600. Stream A starts and
    stays open (its usage not yet sent); stream B starts (600 spent: it
    passes), and its usage (800) crosses the cap mid-stream: B is delivered
    whole. The next request is refused (1400 spent) while A is still in
    flight; A, in flight when the cap was crossed, is not cut either and
    completes with its usage. The request after it is refused at 2200."""
    held = HeldStreams([Turn(400, 200), Turn(500, 300), Turn(500, 300)])
    try:
        e = budget_envoy(start_envoy, held.port, {"limits": [
            {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 1000}]})
        client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-midstream", max_retries=0, timeout=30)
        assert client.chat.completions.create(model="gpt-4o", messages=ask()).choices[0].message.content == "Four."

        def open_stream():
            s = client.chat.completions.create(model="gpt-4o", messages=ask(), stream=True,
                                               stream_options={"include_usage": True})
            it = iter(s)
            first = next(it)
            assert first.choices[0].delta.content == "Four"
            return it

        a = open_stream()
        assert held.arrived.acquire(timeout=10)
        b = open_stream()
        assert held.arrived.acquire(timeout=10)
        held.release(1)
        rest = list(b)
        assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == " is the answer."
        assert rest[-1].usage.total_tokens == 800
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="gpt-4o", messages=ask())
        assert caught.value.code == "budget_exceeded"
        assert caught.value.body["spent"] == "1400"
        # A was in flight all along: released now, it arrives whole.
        held.release(0)
        rest = list(a)
        assert "".join(c.choices[0].delta.content or "" for c in rest if c.choices) == " is the answer."
        assert rest[-1].usage.total_tokens == 800
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="gpt-4o", messages=ask())
        assert caught.value.body["spent"] == "2200"
        assert "spent 2200 tokens of 1000 tokens per caller" in caught.value.message
        assert list(spend(e, "tokens").values()) == [2200]
        assert stat(e, "budget_rejected_total.policy.agents.budget.tokens") == 2
    finally:
        held.stop()


# --- exact across workers -----------------------------------------------------------

N_STREAMS = 16
# Each stream's usage, in the order the provider answers: all different.
CONCURRENT = [Turn(100 + 7 * i, 10 + i) for i in range(N_STREAMS)]
TOTAL = sum(t.input + t.output for t in CONCURRENT)  # 2720
# Just above the total minus the smallest response: any 15 of the 16 stay
# under it, all 16 reach it. So all 16 pass whenever each is checked, and
# the 17th is refused only if no response was lost between the workers.
CAP = TOTAL - min(t.input + t.output for t in CONCURRENT) + 1


def test_concurrent_streams_on_two_workers_add_up_exactly(provider, start_envoy):
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": CAP}], "warn_at": 0})
    assert e.concurrency == 2
    provider.plan(*CONCURRENT)
    go = threading.Barrier(N_STREAMS)

    def one(i: int) -> int:
        # A client (and so a connection) of its own: spread over the workers.
        c = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-concurrent", max_retries=0, timeout=30)
        go.wait(10)
        chunks = list(c.chat.completions.create(model="gpt-4o", messages=ask(), stream=True,
                                                stream_options={"include_usage": True}))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Four is the answer."
        c.close()
        return chunks[-1].usage.total_tokens

    with ThreadPoolExecutor(N_STREAMS) as pool:
        reported = list(pool.map(one, range(N_STREAMS)))
    assert sum(reported) == TOTAL and provider.count == N_STREAMS
    # Both workers served some of them.
    stats = e.stats()
    per_worker = [stats.get(f"listener.127.0.0.1_{e.port}.worker_{w}.downstream_cx_total", 0) for w in (0, 1)]
    assert all(n > 0 for n in per_worker), per_worker

    with pytest.raises(openai.RateLimitError) as caught:
        openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-concurrent", max_retries=0).chat.completions.create(
            model="gpt-4o", messages=ask())
    assert caught.value.body["spent"] == str(TOTAL), (caught.value.body, TOTAL, CAP)
    assert f"spent {TOTAL} tokens of {CAP} tokens per caller" in caught.value.message
    settle(e, "loopguard.budget_spend_total", TOTAL)
    [(labels, value)] = prometheus(e, "loopguard_budget_spend_total").items()
    assert value == TOTAL and ("budget", "tokens") in labels
    assert e.counter("loopguard.budget_spend_total") == TOTAL
    assert e.counter("loopguard.tokens_total") == TOTAL
    assert e.counter("loopguard.budget_unrecorded_total") == 0
    assert stat(e, "budget_rejected_total.policy.agents.budget.tokens") == 1


# --- the window slides --------------------------------------------------------------


def test_the_window_slides_call_by_call(provider, start_envoy):
    """2 calls a minute (the shortest window: 1 s slices). Calls at 0 s and
    3 s; the 3rd is refused until the first leaves (60 s after it, to its
    second), not until a fixed window resets: 2 s before that it is still
    refused; just after, one call passes, and the next is refused until the
    3 s call leaves in its turn (a Retry-After of about 3 s)."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "minute", "per": "caller", "window_seconds": 60, "calls": 2}]})
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-sliding", max_retries=0)

    def call():
        return client.chat.completions.with_raw_response.create(model="gpt-4o", messages=ask())

    def refused():
        with pytest.raises(openai.RateLimitError) as caught:
            call()
        return caught.value.response.headers

    # The calls' pace is the point: 3 s apart, then each just before or
    # just after a call leaves the window.
    _, a_start, a_end = timed(call)
    time.sleep(3)
    _, b_start, b_end = timed(call)
    headers, start, end = timed(refused)
    retry = check_retry(headers, release_of(a_start, a_end, 60), start, end, 60)
    assert 55 <= retry <= 60, retry
    # Envoy judged the request between start and end: the first call
    # leaves the window retry-after-ms after that.
    ms = int(headers["retry-after-ms"]) / 1000
    earliest, latest = start + ms, end + ms
    # 2 s before the first call leaves: still refused.
    time.sleep(max(0.0, earliest - 2 - time.time()))
    headers, start, end = timed(refused)
    assert end < earliest - 0.5, "the check 2 s before the release ran late"
    assert int(headers["retry-after"]) in (2, 3), headers["retry-after"]
    # Just after: one call passes (the first left), the next is refused
    # until the 3 s call leaves.
    time.sleep(max(0.0, latest + 0.3 - time.time()))
    assert call().parse().choices[0].message.content == "Four."
    headers, start, end = timed(refused)
    retry = check_retry(headers, release_of(b_start, b_end, 60), start, end, 60)
    assert 1 <= retry <= 4, retry
    time.sleep(int(headers["retry-after-ms"]) / 1000 + 0.3)  # a client keeping to the Retry-After
    assert call().parse().choices[0].message.content == "Four."
    assert provider.count == 4
    assert stat(e, "budget_rejected_total.policy.agents.budget.minute") == 3
    assert list(spend(e, "minute").values()) == [4]
