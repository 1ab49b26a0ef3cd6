"""The shipped configurations work as their comments and the README say."""

import json
import re

import httpx
import openai
import pytest

from harness import ROOT, load_yaml, localize, wait_for

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Is the build green?"}]}


@pytest.mark.parametrize("config", ["envoy/envoy.yaml", "examples/native/envoy.yaml"], ids=["make-run", "make-run-native"])
def test_make_run_config_answers_and_trips_at_the_fifth_identical_request(start_envoy, config):
    """envoy/envoy.yaml, the `make run` config, and examples/native/envoy.yaml,
    the `make run-native` one (the dynamic module, under either host), each
    with its built-in demo upstream; this is the README's curl loop."""
    e = start_envoy(localize(load_yaml(ROOT / config)))
    results = []
    for _ in range(6):
        r = httpx.post(f"{e.url}/v1/chat/completions", content=json.dumps(CHAT), headers={"content-type": "application/json"})
        results.append(r)
    assert [r.status_code for r in results] == [200, 200, 200, 200, 429, 429]
    assert results[0].json()["choices"][0]["message"]["content"] == "Hello from the loopguard demo upstream."
    assert results[0].json()["object"] == "chat.completion"
    err = results[4].json()["error"]
    assert err["code"] == "recursive_loop_detected"
    assert err["policy"] == "llm-policy"
    assert results[4].headers["retry-after"] in ("59", "60")
    # The demo upstream answers only POST /v1/chat/completions.
    assert httpx.get(f"{e.url}/v1/models").status_code == 404
    # Labelled metrics and the decision in the access log.
    prom = e.prometheus()
    assert prom['loopguard_rejected_total{policy="llm-policy"}'] == 2
    assert prom['loopguard_detected_total{policy="llm-policy",mode="enforce"}'] == 1
    wait_for(lambda: '" 429 loopguard={"action":"reject"' in e.log(), timeout=5, interval=0.1)
    assert '" 429 loopguard={"action":"reject","count":5,' in e.log()


def test_minimal_reject_example_in_front_of_an_openai_style_upstream(upstream, start_envoy):
    cfg = localize(load_yaml(ROOT / "examples" / "minimal-reject" / "envoy.yaml"), {"openai": upstream.port})
    e = start_envoy(cfg)
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-test-example", max_retries=0)
    for _ in range(4):
        assert client.chat.completions.create(**CHAT).choices[0].message.content == "ok"
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(**CHAT)
    err = caught.value
    assert err.status_code == 429
    assert err.code == "recursive_loop_detected"
    assert "identical request sent 5 times in 60 seconds" in str(err)
    assert upstream.count == 4
    # Another API key is another caller with its own count.
    other = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-test-other", max_retries=0)
    assert other.chat.completions.create(**CHAT).choices[0].message.content == "ok"


def test_openai_sdk_does_not_retry_the_429_on_its_own(upstream, start_envoy):
    """x-should-retry: false: even with its default retries on, the SDK
    raises at once instead of hammering the gateway."""
    cfg = localize(load_yaml(ROOT / "examples" / "minimal-reject" / "envoy.yaml"), {"openai": upstream.port})
    e = start_envoy(cfg)
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-test-retries", max_retries=2)
    for _ in range(4):
        client.chat.completions.create(**CHAT)
    before = e.counter("loopguard.requests_total")
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(**CHAT)
    assert e.counter("loopguard.requests_total") == before + 1


def test_llm_agents_example_and_its_python_agent(start_envoy):
    """examples/llm-agents: the agent meets a model stuck on one tool call,
    is told it loops, recovers once by changing the conversation, and gives
    up cleanly when the loop comes back."""
    import os
    import subprocess
    import sys

    from harness import Upstream, stuck_model

    stuck = Upstream(responder=stuck_model)
    try:
        cfg = localize(load_yaml(ROOT / "examples" / "llm-agents" / "envoy.yaml"), {"openai": stuck.port, "anthropic": stuck.port})
        e = start_envoy(cfg)
        env = {**os.environ, "OPENAI_BASE_URL": f"{e.url}/v1", "OPENAI_API_KEY": "sk-example-agent", "BACKOFF_CAP_SECONDS": "0.1"}
        run = subprocess.run([sys.executable, str(ROOT / "examples" / "llm-agents" / "agent.py")], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        detected = [line for line in lines if line.startswith("loop detected by the gateway")]
        assert len(detected) == 2
        for line in detected:
            assert re.fullmatch(r"loop detected by the gateway: policy agents, 3 identical requests; retry after (59\.\d|60\.0)s", line), line
        assert lines[-2:] == ["giving up: the agent is stuck in a loop", "no answer"]
        # 2 + (3 - 1) calls before the first 429. The recovery message makes
        # two new tails ([tool, assistant, user] and [user, assistant, tool]);
        # the third call after it ends in the old [tool, call, tool] tail again,
        # whose count is still in the window: rejected at once.
        assert stuck.count == 4 + 2
        # The Anthropic route answers in Anthropic's shape.
        with httpx.Client(base_url=e.url, headers={"x-api-key": "sk-ant"}) as c:
            body = {"model": "claude-sonnet-5-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
            codes = [c.post("/v1/messages", json=body) for _ in range(3)]
        assert [r.status_code for r in codes] == [200, 200, 429]
        assert codes[2].json()["error"]["type"] == "rate_limit_error"
    finally:
        stuck.stop()


def test_tool_loops_example(start_envoy):
    """examples/tool-loops: nudge, directive without tools, reject; polling
    the exempt tool is never a loop."""
    from harness import Upstream, stuck_model

    stuck = Upstream(responder=stuck_model)
    try:
        e = start_envoy(localize(load_yaml(ROOT / "examples" / "tool-loops" / "envoy.yaml"), {"api": stuck.port}))

        def conversation(tool: str, n: int, args: str = '{"path": "/etc/app.conf"}') -> dict:
            msgs = [{"role": "user", "content": f"work with {tool}"}]
            for i in range(n):
                msgs.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"c{i}", "type": "function", "function": {"name": tool, "arguments": args}}]})
                msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "no change"})
            return {"model": "gpt-4o-mini", "messages": msgs, "tools": [{"type": "function", "function": {"name": tool}}]}

        with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-example"}) as c:
            steps = [c.post("/v1/chat/completions", json=conversation("read_file", n)) for n in (3, 4, 5)]
            polls = [c.post("/v1/chat/completions", json=conversation("poll_job_status", n, '{"job": 7}')) for n in (6, 7)]
        assert [r.status_code for r in steps] == [200, 200, 429]
        assert steps[2].json()["error"]["code"] == "tool_loop_detected"
        nudge, directive = (json.loads(r["body"]) for r in stuck.requests[:2])
        assert "called the tool `read_file` 3 times" in nudge["messages"][-1]["content"]
        assert "stop calling the tool `read_file`" in directive["messages"][-1]["content"]
        assert directive["tool_choice"] == "none"
        assert stuck.requests[0]["headers"]["x-loopguard-tool-loop"] == "identical;tool=read_file;level=1"
        assert [r.status_code for r in polls] == [200, 200]
        assert "x-loopguard-tool-loop" not in stuck.requests[2]["headers"]
    finally:
        stuck.stop()
