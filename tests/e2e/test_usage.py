"""Token usage read from responses as they pass, with the real OpenAI and
Anthropic SDKs: Chat Completions, the Responses API and Anthropic Messages,
plain JSON and streamed, added to the policy by token type, model and
whether the request was part of a detected loop. Streams reach the SDK
unchanged. Only LLM calls are read. (Prices, a loop's spending and what a
rejection saved: test_spend.py.)"""

from __future__ import annotations

import anthropic
import httpx
import openai

import harness as h
import llm_provider as lp
from observing import metric, settle, tokens

CONFIG = {
    "max_body_bytes": 1 << 20,
    "hold_request_headers": True,
    "policies": [{"id": "agents", "spec": {
        "selector": {"pathPrefix": "/v1/", "methods": ["POST"]},
        "loop_detection": {"enabled": True, "window_seconds": 60, "similarity": "llm_tail",
                           "escalation": [{"at": 2, "action": "warn"}, {"at": 4, "action": "reject"}]},
    }}],
}


def test_openai_plain_and_streamed_usage_is_counted_and_streams_arrive_whole(provider, start_envoy):
    e = start_envoy(h.bootstrap(CONFIG, provider.port, hold=True))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-usage", max_retries=0)
    r = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "2+2?"}])
    assert r.choices[0].message.content == "Four."
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "2+2, slowly?"}],
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Four is the answer."
    assert chunks[-1].usage.prompt_tokens == 300
    # A stream without usage (the default) is counted as such.
    list(client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "and 3+3?"}], stream=True))
    settle(e, "loopguard.responses_without_usage_total", 1)
    e.quiet()  # the responses are over: nothing more is counted of them
    assert (tokens(e, "input", False), tokens(e, "output", False)) == (120 + 300, 7 + 9)
    assert (tokens(e, "input", True), tokens(e, "output", True)) == (0, 0)
    assert e.counter("loopguard.responses_without_usage_total") == 1


def test_anthropic_usage_with_cache_reads_and_a_loop_s_tokens(provider, start_envoy):
    e = start_envoy(h.bootstrap(CONFIG, provider.port, hold=True))
    client = anthropic.Anthropic(base_url=e.url, api_key="sk-ant-usage", max_retries=0)
    ask = [{"role": "user", "content": "2+2?"}]
    first = client.messages.create(model="claude-sonnet-4", max_tokens=64, messages=ask)
    assert first.content[0].text == "Four."
    # The same question again: the second is a detected loop (warned).
    with client.messages.stream(model="claude-sonnet-4", max_tokens=64, messages=ask) as s:
        assert s.get_final_text() == "Four."
        assert s.get_final_message().usage.output_tokens == 12
    settle(e, "loopguard.tokens_total", 250 + 5 + 80 + 12)
    e.quiet()  # the responses are over: nothing more is counted of them
    assert (tokens(e, "input", False), tokens(e, "output", False)) == (250, 5)
    assert (tokens(e, "input", True), tokens(e, "output", True)) == (80, 12)
    assert e.counter("loopguard.warned_total") == 1
    assert e.counter("loopguard.responses_without_usage_total") == 0


# gpt-4.1 at $2 / $8 per million, cached input at $0.50.
RESPONSES_PRICES = {"gpt-4.1": {"input_per_million": 2, "output_per_million": 8, "cached_input_per_million": 0.5}}


def test_responses_api_plain_and_streamed_with_cached_and_reasoning_tokens(provider, start_envoy):
    """client.responses.create, plain and stream=True, answered as the
    Responses API answers (a response object; a stream of response.created
    ... response.output_text.delta ... response.completed, whose text
    mentions "usage" with a number). The input counts the cached tokens
    (input_tokens_details.cached_tokens, inside input_tokens), the output
    the reasoning ones; a dated model takes its undated price, cached
    tokens at the cached price."""
    e = start_envoy(h.bootstrap({**CONFIG, "prices": RESPONSES_PRICES}, provider.port, hold=True))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-responses", max_retries=0)
    model = "gpt-4.1-2025-04-14"

    r = client.responses.create(model=model, input="What is 2+2?")
    assert r.output_text == "Four."
    assert (r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens) == (900, 600)
    assert (r.usage.output_tokens, r.usage.output_tokens_details.reasoning_tokens) == (70, 64)

    stream = client.responses.create(model=model, input="What is 2+2? Think it through.", stream=True)
    got = list(stream)
    # Every event arrived, in order, as sent.
    assert [ev.type for ev in got] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * len(lp.RESPONSES_STREAMED),
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [ev.sequence_number for ev in got] == list(range(len(got)))
    assert [ev.delta for ev in got if ev.type == "response.output_text.delta"] == lp.RESPONSES_STREAMED
    done = got[-1].response
    assert done.output_text == "".join(lp.RESPONSES_STREAMED) == 'The usage was {"input_tokens": 999} and 2+2 is four.'
    assert (done.usage.input_tokens, done.usage.input_tokens_details.cached_tokens) == (1500, 1024)
    assert (done.usage.output_tokens, done.usage.output_tokens_details.reasoning_tokens) == (300, 256)

    settle(e, "loopguard.tokens_total", 900 + 70 + 1500 + 300)
    e.quiet()  # the responses are over: nothing more is counted of them
    assert [p for p, _ in provider.served] == ["/v1/responses", "/v1/responses"]
    assert (tokens(e, "input", False, "gpt-4.1"), tokens(e, "output", False, "gpt-4.1")) == (900 + 1500, 70 + 300)
    assert e.counter("loopguard.tokens_total") == 900 + 1500 + 70 + 300  # nothing under other or loop=true
    # Plain: 300 uncached x $2 + 600 cached x $0.50 + 70 x $8 = 1460 µ$;
    # streamed: 476 x $2 + 1024 x $0.50 + 300 x $8 = 3864 µ$.
    assert metric(e, "cost_microusd_total.policy.agents.loop.false.model.gpt-4.1") == 1460 + 3864
    assert metric(e, "cost_microusd_total.policy.agents.loop.true.model.gpt-4.1") == 0
    assert e.counter("loopguard.responses_without_usage_total") == 0


def test_responses_stream_cut_before_response_completed_reports_no_usage(provider, start_envoy):
    """A Responses stream that ends without response.completed (its usage
    never came) is a response without usage, not a zero."""
    e = start_envoy(h.bootstrap(CONFIG, provider.port, hold=True))
    provider.cut_streams = 1
    with httpx.Client(base_url=e.url) as c:
        r = c.post("/v1/responses", json={"model": "gpt-4.1", "input": "hi", "stream": True})
    assert r.status_code == 200 and "response.output_text.done" in r.text and "response.completed" not in r.text
    settle(e, "loopguard.responses_without_usage_total", 1)
    e.quiet()  # the responses are over: nothing more is counted of them
    assert e.counter("loopguard.responses_without_usage_total") == 1
    assert e.counter("loopguard.tokens_total") == 0


def test_a_non_llm_path_reads_no_usage(provider, start_envoy):
    """An exact-mode policy over every path: POST /api/orders (whose answer
    carries a "usage" object all the same) is no LLM call, so its answers
    are not read: neither tokens nor responses without usage, even inside
    a detected loop. The same policy's POST to /v1/chat/completions is
    read (the control)."""
    cfg = h.plugin([h.policy("orders", threshold=3, selector={"pathPrefix": "/"})], hold_request_headers=True)
    e = start_envoy(h.bootstrap(cfg, provider.port, hold=True))
    order = {"model": "gpt-4o", "messages": [{"role": "user", "content": "2+2?"}], "sku": "A-1"}
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/api/orders", json=order).status_code for _ in range(4)]
        assert codes == [200, 200, 429, 429]
        assert c.post("/api/orders", json={"sku": "B-2"}).json()["usage"]["prompt_tokens"] == 120
        e.quiet()  # the answers are over: nothing of them is counted
        assert provider.count == 3
        assert e.counter("loopguard.detected_total") == 1
        assert e.counter("loopguard.tokens_total") == 0
        assert e.counter("loopguard.responses_without_usage_total") == 0
        assert e.counter("loopguard.tokens_avoided_total") == 0
        # The control: the same policy, the same answer, an LLM API path.
        assert c.post("/v1/chat/completions", json=order).status_code == 200
    settle(e, "loopguard.tokens_total", 127)
    e.quiet()  # the responses are over: nothing more is counted of them
    assert (tokens(e, "input", False, policy="orders"), tokens(e, "output", False, policy="orders")) == (120, 7)
    assert e.counter("loopguard.responses_without_usage_total") == 0
