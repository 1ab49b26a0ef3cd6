"""LLM-aware detection with real clients: the openai and anthropic SDKs and a
LangGraph ReAct agent loop against a model stuck on the same tool call, in
front of real Envoy; and the traffic that must never be flagged."""

import json
import warnings

import anthropic
import httpx
import openai
import pytest

from harness import Upstream, bootstrap, plugin, policy, stuck_model

THRESHOLD = 3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_build_status",
            "description": "CI status of a branch",
            "parameters": {"type": "object", "properties": {"branch": {"type": "string"}}, "required": ["branch"]},
        },
    }
]


def llm_guard(start_envoy, upstream, **detection):
    cfg = plugin([policy("agents", threshold=THRESHOLD, window=60, similarity="llm_tail", **detection)])
    return start_envoy(bootstrap(cfg, upstream.port))


@pytest.fixture(scope="module")
def stuck_upstream():
    """The model stuck on the same tool call (like the `stuck` fixture),
    shared by the agent tests below and their one Envoy: each agent has an
    API key of its own, and a test reads only its own calls (calls())."""
    u = Upstream(responder=stuck_model)
    yield u
    u.stop()


@pytest.fixture
def stuck_guard(stuck_upstream, shared_envoy):
    return llm_guard(shared_envoy, stuck_upstream)


def calls(upstream, api_key: str) -> list[dict]:
    """The requests of the caller with this API key that reached the upstream."""
    return [
        r for r in upstream.requests
        if api_key in (r["headers"].get("authorization", "").removeprefix("Bearer "), r["headers"].get("x-api-key"))
    ]


def test_openai_sdk_agent_loop_is_stopped_once_the_tail_repeats(stuck_upstream, stuck_guard):
    """Every request body differs (the conversation grows, call ids are new),
    yet from the third call on the last three messages repeat: [tool result,
    tool call, tool result]. The THRESHOLD-th repetition is rejected, so the
    upstream sees the two first calls plus THRESHOLD - 1 repetitions."""
    e = stuck_guard
    requests, rejected = e.counter("loopguard.requests_total"), e.counter("loopguard.rejected_total")
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-agent-1")  # default retries on
    messages = [
        {"role": "system", "content": "You are a release assistant."},
        {"role": "user", "content": "Is the build green?"},
    ]
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(20):
            r = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
            msg = r.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ERROR: CI API timed out"})
    assert len(calls(stuck_upstream, "sk-agent-1")) == THRESHOLD + 1
    bodies = [req["body"] for req in calls(stuck_upstream, "sk-agent-1")]
    assert len(set(bodies)) == len(bodies), "every body differed"
    err = caught.value
    assert err.status_code == 429
    assert err.code == "recursive_loop_detected"
    assert err.response.headers["x-should-retry"] == "false"
    assert int(err.response.headers["retry-after-ms"]) > 0
    # The SDK did not retry the 429 on its own: one more request reached
    # loopguard, none reached the upstream.
    assert e.counter("loopguard.requests_total") - requests == THRESHOLD + 2
    assert e.counter("loopguard.rejected_total") - rejected == 1


def test_anthropic_sdk_agent_loop_is_stopped(stuck_upstream, stuck_guard):
    e = stuck_guard
    requests = e.counter("loopguard.requests_total")
    client = anthropic.Anthropic(base_url=e.url, api_key="sk-ant-agent")
    tools = [{"name": "get_build_status", "description": "CI status", "input_schema": {"type": "object", "properties": {"branch": {"type": "string"}}}}]
    messages = [{"role": "user", "content": "Is the build green?"}]
    with pytest.raises(anthropic.RateLimitError) as caught:
        for _ in range(20):
            r = client.messages.create(model="claude-sonnet-5-5", max_tokens=256, system="You manage releases.", messages=messages, tools=tools)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": b.id, "content": "ERROR: CI API timed out", "is_error": True}
                        for b in r.content
                        if b.type == "tool_use"
                    ],
                }
            )
    assert len(calls(stuck_upstream, "sk-ant-agent")) == THRESHOLD + 1
    err = caught.value
    assert err.status_code == 429
    assert err.body["type"] == "error"
    assert err.body["error"]["type"] == "rate_limit_error"
    assert err.body["error"]["message"].startswith("Blocked: identical request sent 3 times in 60 seconds")
    assert err.body["loopguard"]["code"] == "recursive_loop_detected"
    assert err.body["loopguard"]["policy"] == "agents"
    assert err.response.headers["retry-after"] == "60"
    assert e.counter("loopguard.requests_total") - requests == THRESHOLD + 2


def test_langgraph_react_agent_ends_with_the_loop_error_not_the_recursion_limit(stuck_upstream, stuck_guard):
    from langchain_core.tools import ToolException, tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    @tool
    def get_build_status(branch: str) -> str:
        """The CI status of a branch."""
        raise ToolException("CI API timed out")

    get_build_status.handle_tool_error = True  # the error goes back to the model, as in real agents
    e = stuck_guard
    llm = ChatOpenAI(model="gpt-4o-mini", base_url=f"{e.url}/v1", api_key="sk-langgraph")
    with warnings.catch_warnings():
        # The prebuilt ReAct agent is deprecated in favour of langchain's
        # create_agent, but it is what most LangGraph agents still run.
        warnings.simplefilter("ignore")
        agent = create_react_agent(llm, [get_build_status])
    try:
        agent.invoke({"messages": [("user", "Is the build green?")]}, {"recursion_limit": 40})
        raise AssertionError("the agent finished although its model is stuck")
    except GraphRecursionError as ex:  # what happens without loopguard
        raise AssertionError("ran into the recursion limit instead of the loop error") from ex
    except openai.RateLimitError as ex:
        assert ex.code == "recursive_loop_detected"
    assert len(calls(stuck_upstream, "sk-langgraph")) == THRESHOLD + 1


def test_responses_api_loop_is_stopped(stuck_guard):
    e = stuck_guard
    items = [{"role": "user", "content": "Find the Q3 report"}]
    codes = []
    with httpx.Client(base_url=e.url) as c:
        for i in range(8):
            r = c.post("/v1/responses", json={"model": "gpt-4.1", "instructions": "Be brief.", "input": items, "tools": [{"type": "function", "name": "search"}]},
                       headers={"authorization": "Bearer sk-resp"})
            codes.append(r.status_code)
            if r.status_code != 200:
                break
            items = items + [
                {"type": "function_call", "call_id": f"call_{i}", "id": f"fc_{i}", "name": "search", "arguments": '{"q": "q3 report"}'},
                {"type": "function_call_output", "call_id": f"call_{i}", "output": "No results"},
            ]
    # tail 3 repeats from the 3rd request: [output, call, output].
    assert codes == [200] * (THRESHOLD + 1) + [429]


def test_normal_traffic_is_never_flagged(start_envoy):
    """A 50-turn conversation and twenty users sending the same prompt."""
    plain = Upstream()
    try:
        e = llm_guard(start_envoy, plain)
        client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-chatty", max_retries=0)
        messages = [{"role": "system", "content": "You are helpful."}]
        for turn in range(50):
            messages.append({"role": "user", "content": f"Question {turn}: what is {turn} squared?"})
            r = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
            messages.append({"role": "assistant", "content": r.choices[0].message.content})
        same = [{"role": "user", "content": "Write a haiku about Envoy."}]
        for user in range(20):
            c = openai.OpenAI(base_url=f"{e.url}/v1", api_key=f"sk-user-{user}", max_retries=0)
            c.chat.completions.create(model="gpt-4o-mini", messages=same)
        assert plain.count == 70
        assert e.counter("loopguard.rejected_total") == 0
        assert e.counter("loopguard.bodies_skipped_total.reason.unparsed") == 0
    finally:
        plain.stop()


def test_bodies_that_are_not_llm_requests_fall_back_to_exact_and_are_counted(upstream, start_envoy):
    e = llm_guard(start_envoy, upstream)
    with httpx.Client(base_url=e.url) as c:
        codes = [c.post("/v1/upload", content=b"\x00binary\xff").status_code for _ in range(3)]
        other = c.post("/v1/upload", content=b"\x00other\xff").status_code
    assert codes == [200, 200, 429]
    assert other == 200
    assert e.counter("loopguard.bodies_skipped_total.reason.unparsed") == 4


def session_guard(start_envoy, upstream, **detection):
    cfg = plugin([policy("sessions", threshold=THRESHOLD, window=60, similarity="session", **detection)])
    return start_envoy(bootstrap(cfg, upstream.port))


def chat_body(text: str, tools: bool = False) -> bytes:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]}
    if tools:
        body["tools"] = TOOLS
    return json.dumps(body).encode()


def test_session_mode_counts_calls_per_session(shared_upstream, shared_envoy):
    # One Envoy shared with the next test: their callers (tenant-1, tenant-2;
    # tenant-3) differ.
    e = session_guard(shared_envoy, shared_upstream)
    with httpx.Client(base_url=e.url) as c:
        h = lambda key, sid: {"authorization": f"Bearer {key}", "x-session-id": sid}  # noqa: E731
        # Every call of one session counts, whatever it says.
        s1 = [c.post("/v1/chat/completions", content=chat_body(f"turn {i}"), headers=h("tenant-1", "session-1")).status_code for i in range(4)]
        # Another tenant's "session-1" is another session.
        t2 = c.post("/v1/chat/completions", content=chat_body("turn 0"), headers=h("tenant-2", "session-1")).status_code
        # So is the same session with tools offered, or another model.
        tools = c.post("/v1/chat/completions", content=chat_body("x", tools=True), headers=h("tenant-1", "session-1")).status_code
    assert s1 == [200, 200, 429, 429]
    assert (t2, tools) == (200, 200)


def test_session_mode_falls_back_to_one_count_per_caller(shared_upstream, shared_envoy):
    e = session_guard(shared_envoy, shared_upstream)
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer tenant-3"}) as c:
        codes = [c.post("/v1/chat/completions", content=chat_body(f"call {i}")).status_code for i in range(16)]
    # Without a session id: judged against 5 x the threshold.
    assert codes == [200] * 14 + [429, 429]


def test_session_header_is_configurable(upstream, start_envoy):
    e = session_guard(start_envoy, upstream, session_header="x-agent-session")
    with httpx.Client(base_url=e.url, headers={"x-agent-session": "run-42"}) as c:
        assert [c.post("/v1/chat/completions", content=chat_body(f"{i}")).status_code for i in range(3)] == [200, 200, 429]
