"""Spend caps ("budgets", issue 29) in real Envoy with the real SDKs: dollars,
tokens and calls per caller, session or conversation over a sliding window;
the 429 in the called API's shape that the OpenAI and Anthropic SDKs raise
as RateLimitError without retrying; the warning from warn_at; a cap crossed
mid-stream; exact sums across workers; the window sliding; replicas sharing
a Redis (single node and cluster) and Redis failing; shadow mode; estimates;
and examples/budget/envoy.yaml.

Spending is read from the responses as they pass, so a cap acts on the
request after the crossing response (docs/actions.md#spend-caps-budgets).
The fake provider (llm_provider.py) reports the usage each test plans."""

from __future__ import annotations

import copy
import json
import math
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import httpx
import openai
import pytest

import harness as h
from llm_provider import Provider, Turn
from redis_cluster import RedisCluster
from shared_store import with_store_cluster
from test_observability import events
from test_redis import STORE, backend, own_backend, replicas, servers_installed, shared  # noqa: F401 (fixtures)
from test_spend import prometheus
from test_usage import settle

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


@pytest.fixture
def provider():
    p = Provider()
    yield p
    p.stop()


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


def stat(e: h.Envoy, name: str) -> int:
    """A loopguard counter by its full name (budget counters exist once first
    counted: a missing one is 0)."""
    return e.stats().get(f"wasmcustom.loopguard.{name}", 0)


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
    return [{"role": "user", "content": content or f"Next step of task {uuid.uuid4().hex}?"}]


def timed(call):
    """call() with when it started and ended (Unix time)."""
    start = time.time()
    out = call()
    return out, start, time.time()


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


# --- a cap crossed mid-stream -------------------------------------------------------


class HeldStreams:
    """An OpenAI-style upstream whose streams send their text, then wait
    (for `release(i)`, at most 20 s) before their last events (the usage
    and [DONE]). Plain calls answer at once. `turns` are the usages, in the
    order the requests arrive."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.gates: list[threading.Event] = []
        self.arrived = threading.Semaphore(0)
        self.lock = threading.Lock()
        held = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                with held.lock:
                    turn = held.turns.pop(0)
                    gate = threading.Event()
                    if body.get("stream"):
                        held.gates.append(gate)
                if not body.get("stream"):
                    payload = json.dumps({
                        "id": "chatcmpl-held", "object": "chat.completion", "created": 1, "model": body["model"],
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Four."},
                                     "finish_reason": "stop"}],
                        "usage": turn.chat()}).encode()
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                events_ = Provider.chat_events(body["model"], turn, include=True)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                held.arrived.release()
                for i, ev in enumerate(events_):
                    if i == len(events_) - 2:
                        gate.wait(20)
                    data = ev.encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self, i: int) -> None:
        self.gates[i].set()

    def stop(self) -> None:
        for g in self.gates:
            g.set()
        self.server.shutdown()
        self.server.server_close()


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
    time.sleep(int(headers["retry-after-ms"]) / 1000 + 0.3)
    assert call().parse().choices[0].message.content == "Four."
    assert provider.count == 4
    assert stat(e, "budget_rejected_total.policy.agents.budget.minute") == 3
    assert list(spend(e, "minute").values()) == [4]


# --- replicas sharing a Redis -------------------------------------------------------

REPLICA_BUDGET = {"limits": [
    {"name": "calls", "per": "caller", "window_seconds": 600, "calls": 3},
    {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 1_000_000},
]}


def store_ok(e: h.Envoy) -> int:
    return e.counter("loopguard.store_calls_total.result.ok")


def no_store_failure(envoys) -> None:
    for e in envoys:
        assert e.counter("loopguard.store_fallback_total") == 0, e.name
        for result in ("unavailable", "status", "reply"):
            assert e.counter(f"loopguard.store_calls_total.result.{result}") == 0, (e.name, result)
        assert e.counter("loopguard.budget_unrecorded_total") == 0, e.name


def test_two_replicas_share_a_budget_through_redis(shared, provider, start_envoy):
    """3 calls per caller, the caller's calls alternating A, B, A: B alone
    served one, yet once A's spending is in Redis the 4th call, on B, is
    refused (and so is the 5th, on A). Spending is added in Redis from the
    plugin's tick after the response (docs/redis.md), so each call waits
    for the store to have answered its add before the next is sent (the
    request sent at once is test_the_request_right_after_...). Redis holds
    the key's exact sums under the caller's hash tag, with an expiry within
    the window."""
    redis, webdis = shared
    a, b = replicas(start_envoy, provider, webdis.port, budget_config(REPLICA_BUDGET, store=STORE), hold=True)
    clients = [openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-fleet-budget", max_retries=2) for e in (a, b)]
    first = None
    for i in range(3):
        _, start, end = timed(lambda: clients[i % 2].chat.completions.create(model="gpt-4o", messages=ask()))
        first = first or (start, end)
        # Each served call: a check, then its spending added from the tick.
        assert h.wait_for(lambda: store_ok(a) + store_ok(b) == 2 * (i + 1), 5), (store_ok(a), store_ok(b))
    for i, e in ((3, b), (4, a)):
        start = time.time()
        with pytest.raises(openai.RateLimitError) as caught:
            clients[i % 2].chat.completions.create(model="gpt-4o", messages=ask())
        err = caught.value
        assert err.code == "budget_exceeded" and err.body["budget"] == "calls" and err.body["spent"] == "3"
        check_retry(err.response.headers, release_of(*first, 600), start, time.time(), 600)
        assert stat(e, "budget_rejected_total.policy.agents.budget.calls") == 1, e.name
    assert provider.count == 3
    no_store_failure([a, b])
    # Each replica counts what it served.
    assert [sum(spend(e, "calls").values()) for e in (a, b)] == [2, 1]
    assert sum(sum(spend(e, "tokens").values()) for e in (a, b)) == 3 * 127
    keys = redis.keys("lg:*")
    assert len(keys) == 2 and all(BUDGET_KEY.match(k) for k in keys), keys
    assert len({k.split(":")[2] for k in keys}) == 1  # one hash tag: the caller
    sums = sorted(sum(int(v) for v in redis.admin("HGETALL", k).split()[1::2]) for k in keys)
    assert sums == [3, 3 * 127]
    for k in keys:
        assert redis.admin("TYPE", k).strip() == "hash"
        assert 0 < int(redis.admin("PTTL", k)) <= 61 * 10_000


def test_the_request_right_after_the_crossing_is_refused_on_another_replica(shared, provider, start_envoy):
    """The issue's target: "No request over a cap gets through once the
    crossing response has been seen. The next request is rejected, on any
    worker and any replica sharing a store." One call per caller: the
    caller's call through A, then at once (as an agent loop does) its next
    call through B, for 5 callers: each 2nd call is refused. (The design
    adds A's spending in Redis from the plugin's 5 ms tick after the
    response; a call B checks before that add has landed passes.)"""
    _, webdis = shared
    budget = {"limits": [{"name": "calls", "per": "caller", "window_seconds": 600, "calls": 1}]}
    a, b = replicas(start_envoy, provider, webdis.port, budget_config(budget, store=STORE), hold=True)
    outcomes = []
    for n in range(5):
        ca, cb = (openai.OpenAI(base_url=f"{e.url}/v1", api_key=f"sk-next-{n}", max_retries=0) for e in (a, b))
        ca.chat.completions.create(model="gpt-4o", messages=ask())
        try:
            cb.chat.completions.create(model="gpt-4o", messages=ask())
            outcomes.append(200)
        except openai.RateLimitError:
            outcomes.append(429)
    no_store_failure([a, b])
    assert outcomes == [429] * 5, f"{outcomes.count(200)} of 5 next calls through B passed the cap"


@pytest.fixture
def redis_cluster():
    c = RedisCluster().start()
    yield c
    c.cleanup()


def test_two_replicas_share_budgets_on_a_redis_cluster(redis_cluster, provider, start_envoy):
    """The same on a 3-master Redis Cluster (EVALSHA through redis_proxy, the
    script sent once more where a node answers NOSCRIPT): a caller's keys
    (its own, and those of its sessions) share its hash tag, so one call
    checks them all on one master. 2 calls per session and 3 per caller,
    alternating A and B."""
    store = {"type": "redis_webdis", "topology": "cluster", "cluster": "loopguard_redis", "timeout_ms": 1000}
    budget = {"limits": [{"name": "session-calls", "per": "session", "window_seconds": 600, "calls": 2},
                         {"name": "caller-calls", "per": "caller", "window_seconds": 600, "calls": 3}]}
    a, b = replicas(start_envoy, provider, redis_cluster.webdis_port, budget_config(budget, store=store), hold=True)
    clients = [openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-cluster-budget", max_retries=0) for e in (a, b)]

    def call(replica: int, session: str):
        return clients[replica].chat.completions.create(model="gpt-4o", messages=ask(),
                                                        extra_headers={"x-session-id": session})

    def settled(n: int) -> None:
        assert h.wait_for(lambda: store_ok(a) + store_ok(b) >= n, 5), (store_ok(a), store_ok(b), n)

    call(0, "s-1")
    settled(2)
    call(1, "s-1")
    settled(4)
    with pytest.raises(openai.RateLimitError) as caught:
        call(0, "s-1")
    assert (caught.value.body["budget"], caught.value.body["spent"]) == ("session-calls", "2")
    call(1, "s-2")
    settled(7)
    with pytest.raises(openai.RateLimitError) as caught:
        call(0, "s-3")
    assert (caught.value.body["budget"], caught.value.body["per"], caught.value.body["spent"]) == (
        "caller-calls", "caller", "3")
    assert provider.count == 3
    no_store_failure([a, b])
    per_master = {m: ks for m, ks in redis_cluster.keys_per_master("lg:*").items() if ks}
    assert len(per_master) == 1, per_master
    [keys] = per_master.values()
    # The caller's key and its sessions s-1 and s-2 (a refused request adds nothing).
    assert len(keys) == 3 and all(BUDGET_KEY.match(k) for k in keys), keys
    assert len({k.split(":")[2] for k in keys}) == 1


# --- Redis failing ------------------------------------------------------------------


def test_redis_down_never_fails_a_request(own_backend, provider, start_envoy):
    """Redis stops mid-run. With on_error: local, a caller already at its
    cap on this Envoy is still refused (from this Envoy's own sums), and a
    caller under it passes; with on_error: allow, a caller at its cap
    passes unchecked. No request fails; the store calls, the fallbacks and
    the spending Redis did not get are counted. Once Redis is back, checks
    go to Redis again."""
    redis, webdis = own_backend
    budget = {"limits": [{"name": "calls", "per": "caller", "window_seconds": 600, "calls": 2}]}
    local = start_envoy(with_store_cluster(budget_boot(budget_config(budget, store=STORE), provider.port), webdis.port),
                        name="on-error-local")
    allow = start_envoy(with_store_cluster(
        budget_boot(budget_config(budget, store={**STORE, "on_error": "allow"}), provider.port), webdis.port),
        name="on-error-allow")
    codes = []

    def post(e: h.Envoy, key: str) -> httpx.Response:
        r = httpx.post(f"{e.url}/v1/chat/completions", json={"model": "gpt-4o", "messages": ask()},
                       headers={"authorization": f"Bearer {key}"}, timeout=10)
        codes.append(r.status_code)
        return r

    assert [post(local, "sk-x").status_code for _ in range(2)] == [200, 200]
    assert [post(allow, "sk-z").status_code for _ in range(2)] == [200, 200]
    assert h.wait_for(lambda: store_ok(local) == 4 and store_ok(allow) == 4, 5)
    no_store_failure([local, allow])

    redis.stop()
    refused = post(local, "sk-x")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert refused.json()["error"]["spent"] == "2"
    assert post(local, "sk-y").status_code == 200
    assert post(allow, "sk-z").status_code == 200
    assert post(allow, "sk-z").status_code == 200
    assert all(c in (200, 429) for c in codes), codes
    assert provider.count == 2 + 2 + 1 + 2

    def failed(e: h.Envoy) -> int:
        return sum(e.counter(f"loopguard.store_calls_total.result.{r}") for r in ("unavailable", "status", "reply"))

    # Each check failed and fell back; each served call's spending could
    # not be added in Redis (counted once its add has failed).
    assert local.counter("loopguard.store_fallback_total.action.local") == 2
    assert allow.counter("loopguard.store_fallback_total.action.allow") == 2
    assert h.wait_for(lambda: local.counter("loopguard.budget_unrecorded_total") == 1
                      and allow.counter("loopguard.budget_unrecorded_total") == 2, 5), (
        local.counter("loopguard.budget_unrecorded_total"), allow.counter("loopguard.budget_unrecorded_total"))
    assert failed(local) == 2 + 1 and failed(allow) == 2 + 2
    assert stat(local, "budget_rejected_total.policy.agents.budget.calls") == 1
    assert stat(allow, "budget_rejected_total.policy.agents.budget.calls") == 0
    assert "budgets are checked against this Envoy's own spending" in local.log()
    assert "budgets are passed unchecked" in allow.log()

    # Redis is back (same port, the function loaded again): checks go to
    # Redis again. It kept nothing (the shipped redis.conf persists
    # nothing), so the first check answered by Redis lets sk-x through
    # although this Envoy's own sums hold its 2 calls: Redis decides again.
    redis.start()
    deadline = time.monotonic() + 20
    while True:
        before, fallbacks = store_ok(local), local.counter("loopguard.store_fallback_total")
        r = post(local, "sk-x")
        if store_ok(local) > before:
            break
        assert r.status_code == 429  # still from the local sums
        assert time.monotonic() < deadline, "checks did not go to Redis again"
        time.sleep(0.5)
    assert r.status_code == 200
    assert local.counter("loopguard.store_fallback_total") == fallbacks
    assert all(c in (200, 429) for c in codes), codes


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
    request body's bytes / 4, output = one token per data event (5).
    loopguard_budget_estimated_total counts it (the label an estimate
    carries: docs/observability.md); a reported response is not counted."""
    e = budget_envoy(start_envoy, provider.port, {"limits": [
        {"name": "tokens", "per": "caller", "window_seconds": 600, "tokens": 100_000}], "warn_at": 0.001})
    body = json.dumps({"model": "gpt-4o", "messages": ask("x" * 800), "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    estimate = len(body) // 4 + 5
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
    time.sleep(0.3)
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
