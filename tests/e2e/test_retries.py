"""A retry is not a loop: the real OpenAI and Anthropic SDKs retrying after
provider errors (500, 529), in front of the recommended setup, locally and
with the Redis store (one node, and a Redis Cluster). An attempt the provider failed is taken back (up to
forgive_failed_attempts per fingerprint and window), so the SDK's retries
get through and the conversation goes on untouched; a provider that keeps
failing makes the SDK give up with the provider's error, not loopguard's;
a client resending after successes is still a loop."""

from __future__ import annotations

import json
import threading

import anthropic
import openai
import pytest

from harness import COMPLETION, Upstream, bootstrap

# The SDKs warn about the model names the tests use.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
from redis_cluster import RedisCluster
from test_drift import STORE, recommended_config, redis_backend  # noqa: F401
from test_redis import with_store_cluster


@pytest.fixture(scope="module")
def redis_cluster_backend():
    c = RedisCluster().start()
    yield c
    c.cleanup()

ANTHROPIC_MESSAGE = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "The incident was a connection-pool limit on the ledger database."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 14},
}


class Flaky:
    """A provider that fails the first `failures` attempts of each request
    body with `status`, then answers; or fails every attempt when
    `failures` is None. With `only_first`, only the first body's attempts
    fail."""

    def __init__(self, status: int, failures: int | None, only_first: bool = False) -> None:
        self.status, self.failures, self.only_first = status, failures, only_first
        self.attempts: dict[bytes, int] = {}
        self.retry_counts: list[str | None] = []
        self.lock = threading.Lock()
        self.upstream = Upstream(self.respond)

    def respond(self, request: dict) -> tuple[int, dict]:
        with self.lock:
            n = self.attempts.get(request["body"], 0)
            self.attempts[request["body"]] = n + 1
            self.retry_counts.append(request["headers"].get("x-stainless-retry-count"))
        first = len(self.attempts) == 1
        if (self.failures is None or n < self.failures) and (first or not self.only_first):
            return self.status, {"type": "error", "error": {"type": "overloaded_error" if self.status == 529 else "api_error", "message": "try again"}}
        if request["path"].endswith("/messages"):
            return 200, ANTHROPIC_MESSAGE
        # A model answers what it was asked (the newest user message).
        asked = json.loads(request["body"])["messages"][-1]["content"]
        answer = json.loads(json.dumps(COMPLETION))
        answer["choices"][0]["message"]["content"] = f"Here is what you asked for ({asked.lower().rstrip('.')}): done."
        return 200, answer


def start(start_envoy, request, store: str, flaky: Flaky):
    if store == "cluster":
        cluster = request.getfixturevalue("redis_cluster_backend")
        cluster.flush()
        cfg = with_store_cluster(
            bootstrap(recommended_config({**STORE, "topology": "cluster"}), flaky.upstream.port, hold=True),
            cluster.webdis_port,
        )
    elif store == "redis":
        redis, webdis = request.getfixturevalue("redis_backend")
        redis.flush()
        cfg = with_store_cluster(bootstrap(recommended_config(STORE), flaky.upstream.port, hold=True), webdis.port)
    else:
        cfg = bootstrap(recommended_config(None), flaky.upstream.port, hold=True)
    return start_envoy(cfg)


def failed_attempts(e, result: str, want: int | None = None) -> int:
    """The counter; with `want`, waited for (a shared store's answer to a
    take-back is counted when it arrives, a few ms after the response)."""
    import time

    name = f"loopguard.failed_attempts_total.policy.agents.result.{result}"
    deadline = time.monotonic() + 2
    while want is not None and e.counter(name) != want and time.monotonic() < deadline:
        time.sleep(0.02)
    return e.counter(name)


# Retries back off 0.5 s, then 1 s, with jitter: fast enough for a test.
@pytest.mark.parametrize("store", ["local", "redis", "cluster"])
def test_the_openai_sdk_retrying_after_500s_gets_through(store, start_envoy, request):
    flaky = Flaky(500, failures=2, only_first=True)
    try:
        e = start(start_envoy, request, store, flaky)
        client = openai.OpenAI(base_url=f"{e.url}/v1", api_key=f"sk-retry-{store}")  # max_retries=2, the default
        messages = [{"role": "user", "content": "Summarise the incident report in three bullet points."}]
        r = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        # The same body three times: failed, failed, answered.
        assert flaky.retry_counts == ["0", "1", "2"]
        assert list(flaky.attempts.values()) == [3]
        assert r.choices[0].message.content
        # The conversation goes on, untouched.
        answer = r.choices[0].message.content
        for follow_up in ["Shorter, please.", "Now as one sentence."]:
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow_up}]
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages)
            assert not any(k.startswith("x-loopguard") for k in raw.headers)
            answer = raw.parse().choices[0].message.content
        assert failed_attempts(e, "forgiven", want=2) == 2
        assert e.counter("loopguard.rejected_total") == 0
    finally:
        flaky.upstream.stop()


@pytest.mark.parametrize("store", ["local", "redis"])
def test_the_anthropic_sdk_retrying_after_529_overloaded_gets_through(store, start_envoy, request):
    flaky = Flaky(529, failures=2)
    try:
        e = start(start_envoy, request, store, flaky)
        client = anthropic.Anthropic(base_url=e.url, api_key=f"sk-ant-retry-{store}")
        r = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=256, messages=[{"role": "user", "content": "Summarise the incident."}]
        )
        assert r.content[0].text.startswith("The incident")
        assert flaky.retry_counts == ["0", "1", "2"]
        assert failed_attempts(e, "forgiven", want=2) == 2
        assert e.counter("loopguard.rejected_total") == 0
    finally:
        flaky.upstream.stop()


@pytest.mark.parametrize("store", ["local", "redis"])
def test_a_flapping_provider_failing_every_request_twice_touches_no_conversation(store, start_envoy, request):
    """Each request fails twice before it is answered: the caller's
    forgiveness is per request (per signature), so a long conversation
    goes through, however many of its attempts failed."""
    flaky = Flaky(503, failures=2)
    try:
        e = start(start_envoy, request, store, flaky)
        client = openai.OpenAI(base_url=f"{e.url}/v1", api_key=f"sk-flap-{store}")
        messages = [{"role": "user", "content": "Draft the release notes for version 4.2."}]
        for follow_up in ["Add the database migration.", "Mention the new CLI flag.", "Shorter, please.", "Sign it from the platform team."]:
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages)
            assert not any(k.startswith("x-loopguard") for k in raw.headers)
            messages += [{"role": "assistant", "content": raw.parse().choices[0].message.content}, {"role": "user", "content": follow_up}]
        assert all(n == 3 for n in flaky.attempts.values()), flaky.attempts
        # Every failed attempt that was counted was taken back (a turn whose
        # newest answer made progress is not counted by near mode at all).
        assert failed_attempts(e, "forgiven", want=4) >= 4
        assert failed_attempts(e, "counted") == 0
        assert e.counter("loopguard.rejected_total") == 0
    finally:
        flaky.upstream.stop()


def test_a_provider_that_keeps_failing_is_left_to_the_sdk_and_then_bounded(start_envoy, request):
    flaky = Flaky(503, failures=None)
    try:
        e = start(start_envoy, request, "local", flaky)
        client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-down")
        messages = [{"role": "user", "content": "Summarise the incident report."}]
        # The SDK tries three times and gives up with the provider's error.
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert caught.value.status_code == 503
        assert flaky.retry_counts == ["0", "1", "2"]
        assert e.counter("loopguard.rejected_total") == 0
        assert failed_attempts(e, "forgiven") == 3
        # An application that keeps hammering after the SDK gave up: the
        # window's forgiveness (3) is spent, so its attempts count, and the
        # third counted one is a loop.
        client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-down", max_retries=0)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):
                client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert caught.value.code == "recursive_loop_detected"
        assert failed_attempts(e, "counted") == 2
    finally:
        flaky.upstream.stop()


def test_a_client_resending_after_successes_is_still_a_loop(start_envoy, request):
    flaky = Flaky(500, failures=0)
    try:
        e = start(start_envoy, request, "local", flaky)
        client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-hammer")
        messages = [{"role": "user", "content": "Summarise the incident report."}]
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        # A forged retry-count header changes nothing: only a failure the
        # provider answered is taken back.
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, extra_headers={"x-stainless-retry-count": "1"}
            )
        assert failed_attempts(e, "forgiven") == 0
    finally:
        flaky.upstream.stop()
