"""A retry is not a loop: the real OpenAI and Anthropic SDKs retrying after
provider errors (500, 529), in front of the recommended setup, locally and
with the Redis store (one node, and a Redis Cluster). An attempt the provider failed is taken back (up to
forgive_failed_attempts per fingerprint and window), so the SDK's retries
get through and the conversation goes on untouched; a provider that keeps
failing makes the SDK give up with the provider's error, not loopguard's;
a client resending after successes is still a loop."""

from __future__ import annotations

import anthropic
import openai
import pytest

from harness import bootstrap, wait_for
from llm_provider import Flaky
from recommended import recommended_config
from shared_store import STORE, with_store_cluster

# The SDKs warn about the model names the tests use.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def start(start_envoy, request, store: str, flaky: Flaky):
    if store == "cluster":
        cluster = request.getfixturevalue("fresh_cluster")
        cfg = with_store_cluster(
            bootstrap(recommended_config({**STORE, "topology": "cluster"}), flaky.upstream.port, hold=True),
            cluster.webdis_port,
        )
    elif store == "redis":
        redis, webdis = request.getfixturevalue("shared")
        cfg = with_store_cluster(bootstrap(recommended_config(STORE), flaky.upstream.port, hold=True), webdis.port)
    else:
        cfg = bootstrap(recommended_config(None), flaky.upstream.port, hold=True)
    return start_envoy(cfg)


def failed_attempts(e, result: str, want: int | None = None) -> int:
    """The counter; with `want`, waited for (a shared store's answer to a
    take-back is counted when it arrives, a few ms after the response)."""
    name = f"loopguard.failed_attempts_total.policy.agents.result.{result}"
    if want is not None:
        wait_for(lambda: e.counter(name) == want, timeout=2, interval=0.02)
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
