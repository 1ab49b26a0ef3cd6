"""Tool-call loops read from the conversation, in real Envoy with the real
SDKs: the ladder nudges (a note appended to the forwarded body), directs,
then rejects; healthy agents are never touched."""

import json
import re

import anthropic
import httpx
import openai
import pytest

from harness import ROUTER, Upstream, bootstrap, buffer_filter, loopguard_filter, plugin, warn_header_mutation

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {"type": "object", "properties": {"branch": {"type": "string"}}},
        },
    }
    for name in ["get_build_status", "list_jobs", "read_log", "rerun_job", "notify"]
]


def tool_policy(pid="agents", mode=None, **tool_loops):
    p = {"id": pid, "spec": {"selector": {"pathPrefix": "/v1"}, "tool_loops": {"enabled": True, **tool_loops}}}
    if mode:
        p["spec"]["mode"] = mode
    return p


def guard(start_envoy, upstream, *policies):
    filters = [loopguard_filter(plugin(list(policies))), buffer_filter(), warn_header_mutation(), ROUTER]
    return start_envoy(bootstrap(None, upstream.port, http_filters=filters))


def recording_client(e, sent: list, **kw) -> openai.OpenAI:
    def keep(request):
        sent.append(request.read())

    http = openai.DefaultHttpxClient(event_hooks={"request": [keep]})
    return openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-tools", http_client=http, **kw)


def test_openai_agent_is_nudged_then_directed_then_rejected(stuck, start_envoy):
    e = guard(start_envoy, stuck, tool_policy())
    sent: list[bytes] = []
    client = recording_client(e, sent)
    messages = [{"role": "user", "content": "Is the build green?"}]
    responses = []
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(10):
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, tools=TOOLS[:1])
            responses.append(raw)
            msg = raw.parse().choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "ERROR: CI API timed out"})
    # Requests 1-3 carry 0, 1, 2 calls; the 4th carries 3 identical calls
    # (nudge), the 5th 4 (directive), the 6th 5 (reject).
    assert stuck.count == 5
    got = [r["body"] for r in stuck.requests]
    assert got[:3] == sent[:3]
    for i, kind in [(3, "nudge"), (4, "directive")]:
        forwarded, original = got[i], sent[i]
        # Appended at the end of the messages array: every earlier byte is
        # unchanged, and the body is valid JSON with a right content-length.
        cut = original.rindex(b"]", 0, original.index(b'"tools"')) if b'"tools"' in original[original.index(b'"messages"'):] else original.rindex(b"]")
        assert forwarded.startswith(original[:cut])
        assert forwarded.endswith(original[cut:])
        assert int(stuck.requests[i]["headers"]["content-length"]) == len(forwarded)
        note = json.loads(forwarded)["messages"][-1]
        assert note["role"] == "system"
        if kind == "nudge":
            assert "called the tool `get_build_status` 3 times with the same arguments" in note["content"]
        else:
            assert "stop calling the tool `get_build_status`" in note["content"]
            assert '{"branch":"main"}' in note["content"]
        assert stuck.requests[i]["headers"]["x-loopguard-tool-loop"] == f"identical;tool=get_build_status;level={i - 2}"
        assert responses[i].headers["x-loopguard-tool-loop"] == f"identical;tool=get_build_status;level={i - 2}"
    assert "x-loopguard-tool-loop" not in stuck.requests[2]["headers"]
    err = caught.value
    assert err.status_code == 429
    assert err.code == "tool_loop_detected"
    assert err.body["tool"] == "get_build_status" and err.body["tier"] == "identical" and err.body["level"] == 3
    assert err.response.headers["x-loopguard-tool-loop"] == "identical;tool=get_build_status;level=3"
    assert e.counter("loopguard.tool_loop_detected_total.policy.agents.tier.identical.step.nudge") == 1
    assert e.counter("loopguard.tool_loop_detected_total.policy.agents.tier.identical.step.directive") == 1
    assert e.counter("loopguard.tool_loop_detected_total.policy.agents.tier.identical.step.reject") == 1


def test_events_are_logged_once_per_conversation_and_level(stuck, start_envoy):
    e = guard(start_envoy, stuck, tool_policy())
    messages = [{"role": "user", "content": "Is the build green?"}]
    call = {"id": "x", "type": "function", "function": {"name": "get_build_status", "arguments": "{\"branch\": \"main\"}"}}
    for i in range(5):
        messages.append({"role": "assistant", "content": None, "tool_calls": [dict(call, id=f"call_{i}")]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "timeout"})
    with httpx.Client(base_url=e.url, headers={"authorization": "Bearer sk-events"}) as c:
        codes = [c.post("/v1/chat/completions", json={"model": "m", "messages": messages}).status_code for _ in range(6)]
    assert codes == [429] * 6
    events = [json.loads(line[line.index("{"):]) for line in e.log().splitlines() if '"loop.tool.detected"' in line]
    # Who loops (a 12-hex tag) and what the conversation spent: all six
    # requests were rejected, so nothing.
    assert len(events) == 1 and re.fullmatch(r"[0-9a-f]{12}", events[0].pop("caller")), events
    assert events == [{"event": "loop.tool.detected", "tier": "identical", "tool": "get_build_status", "level": 3,
                       "step": "reject", "occurrences": 5, "policy": "agents", "mode": "enforce",
                       "spent": {"responses": 0, "input_tokens": 0, "output_tokens": 0}}]
    assert e.counter("loopguard.tool_loop_detected_total.policy.agents.tier.identical.step.reject") == 6


def test_anthropic_agent_gets_a_text_block_then_a_rate_limit_error(stuck, start_envoy):
    e = guard(start_envoy, stuck, tool_policy(ladder=["nudge", "reject"]))
    client = anthropic.Anthropic(base_url=e.url, api_key="sk-ant-tools")
    tools = [{"name": "get_build_status", "description": "CI status", "input_schema": {"type": "object"}}]
    messages = [{"role": "user", "content": "Is the build green?"}]
    with pytest.raises(anthropic.RateLimitError) as caught:
        for _ in range(10):
            r = client.messages.create(model="claude-sonnet-5-5", max_tokens=256, messages=messages, tools=tools)
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]})
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": "ERROR: CI API timed out", "is_error": True}
                for b in r.content if b.type == "tool_use"]})
    assert stuck.count == 4
    nudged = json.loads(stuck.requests[3]["body"])
    last = nudged["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
    assert "get_build_status" in last["content"][1]["text"]
    assert caught.value.body["loopguard"]["code"] == "tool_loop_detected"
    assert caught.value.body["loopguard"]["level"] == 2


def test_directive_can_disable_tools(stuck, start_envoy):
    e = guard(start_envoy, stuck, tool_policy(ladder=["directive"], directive_disables_tools=True))
    messages = [{"role": "user", "content": "status?"}]
    for i in range(3):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "get_build_status", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "timeout"})
    with httpx.Client(base_url=e.url) as c:
        r = c.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS[:1], "tool_choice": "auto"})
    assert r.status_code == 200
    forwarded = json.loads(stuck.requests[0]["body"])
    assert forwarded["tool_choice"] == "none"
    assert forwarded["messages"][-1]["role"] == "system"


def test_pattern_thrash_in_the_responses_format(stuck, start_envoy):
    e = guard(start_envoy, stuck, tool_policy(ladder=["reject"]))
    items = [{"role": "user", "content": "Find the Q3 report"}]
    # A search retried in other words (the same numbers, most words
    # shared) that keeps finding nothing.
    for i, q in enumerate(["q3", "q3 report", "report q3", "Q3 report (PDF)"]):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "search", "arguments": json.dumps({"q": q})})
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": "No results"})
    with httpx.Client(base_url=e.url) as c:
        r = c.post("/v1/responses", json={"model": "gpt-4.1", "input": items})
    assert r.status_code == 429
    err = r.json()["error"]
    assert (err["code"], err["tier"], err["tool"], err["occurrences"]) == ("tool_loop_detected", "pattern", "search", 4)
    assert e.counter("loopguard.tool_loop_detected_total.policy.agents.tier.pattern.step.reject") == 1


def test_a_healthy_agent_using_five_tools_is_never_touched(start_envoy):
    plain = Upstream()
    try:
        e = guard(start_envoy, plain, tool_policy())
        sent: list[bytes] = []
        client = recording_client(e, sent, max_retries=0)
        messages = [{"role": "user", "content": "Ship the release"}]
        for i, t in enumerate(TOOLS):
            name = t["function"]["name"]
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{\"branch\": \"main\"}"}}]})
            messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"{name} ok"})
            raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
            assert "x-loopguard-tool-loop" not in raw.headers
        assert [r["body"] for r in plain.requests] == sent
        assert not any("x-loopguard-tool-loop" in r["headers"] for r in plain.requests)
    finally:
        plain.stop()


def test_shadow_mode_reports_tool_loops_without_acting(stuck, start_envoy):
    e = guard(start_envoy, stuck, tool_policy(mode="shadow", ladder=["reject"]))
    messages = [{"role": "user", "content": "status?"}]
    for i in range(3):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "get_build_status", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "timeout"})
    body = json.dumps({"model": "m", "messages": messages}).encode()
    with httpx.Client(base_url=e.url) as c:
        r = c.post("/v1/chat/completions", content=body)
    assert r.status_code == 200
    assert not any(k.startswith("x-loopguard") for k in r.headers)
    assert stuck.requests[0]["body"] == body
    log = e.log()
    assert 'shadow: would_reject tool loop policy="agents" tier=identical tool=get_build_status level=1' in log
    assert '"mode":"shadow"' in log


def swe_agent_chat(commands: list[tuple[str, str]]) -> dict:
    """A SWE-agent-style conversation: each reply a DISCUSSION and one fenced
    command, each command's output the next user message."""
    messages = [{"role": "system", "content": "You are an autonomous programmer. Answer with a DISCUSSION and one command."},
                {"role": "user", "content": "ISSUE: the username validator accepts a trailing newline."}]
    for i, (command, output) in enumerate(commands):
        messages.append({"role": "assistant",
                         "content": f"DISCUSSION\nStep {i}: let me try this.\n\n```\n{command}\n```"})
        messages.append({"role": "user", "content": f"{output}\n(Open file: n/a)\n(Current directory: /repo)\nbash-$"})
    return {"model": "gpt-4-0125-preview", "messages": messages}


def test_actions_written_in_text_are_judged_as_tool_calls(stuck, start_envoy):
    """An agent that writes its command in the reply (SWE-agent's fenced
    block) and gets its output as a user message: the same command with
    the same output 3 times is identical thrash on the command; commands
    that differ (a directory walk) are not, however alike the narration."""
    e = guard(start_envoy, stuck, tool_policy(ladder=["nudge", "directive", "reject"]))
    failing = "Traceback (most recent call last):\n  File \"repro.py\", line 3\nAssertionError: username with newline accepted"
    looping = swe_agent_chat([("python repro.py", failing)] * 3)
    walking = swe_agent_chat([(f"cd /repo/{d} && ls", f"{d}/__init__.py {d}/validators.py") for d in ("auth", "forms", "core")])
    with httpx.Client(base_url=e.url) as c:
        r = c.post("/v1/chat/completions", json=looping)
        assert r.status_code == 200
        assert r.headers.get("x-loopguard-tool-loop") == "identical;tool=python;level=1"
        # The nudge reached the model, as a system message at the end.
        sent = json.loads(stuck.requests[-1]["body"])
        assert sent["messages"][-1]["role"] == "system"
        assert "`python`" in sent["messages"][-1]["content"]
        r = c.post("/v1/chat/completions", json=walking)
        assert r.status_code == 200
        assert "x-loopguard-tool-loop" not in r.headers
        assert json.loads(stuck.requests[-1]["body"]) == walking


def near_agents_policy() -> dict:
    """The recommended setup's policy: near-duplicate conversations and tool loops."""
    return {"id": "agents", "spec": {
        "selector": {"pathPrefix": "/v1", "methods": ["POST"]},
        "loop_detection": {"enabled": True, "window_seconds": 60, "threshold_identical_requests": 3,
                           "similarity": "near", "near_similarity": 0.35, "near_history": 64},
        "tool_loops": {"enabled": True, "ladder": ["nudge", "directive", "reject"], "directive_disables_tools": True}}}


def test_an_edit_that_only_grows_the_file_is_stopped(stuck, start_envoy):
    """SWE-agent re-sending the same edit: the file view differs each time
    only by what the edit adds (its block once more, a longer file, shifted
    line numbers), so it is the same edit again: nudged, directed, 429."""
    e = guard(start_envoy, stuck, near_agents_policy())
    block = ["    def total(self):", "        return round(sum(self.items), 2)"]

    def view(times: int) -> str:
        body = [f"    x{i} = {i}" for i in range(1, 9)] + block * times + ["class Item:"]
        shown = "\n".join(f"{n}:{line}" for n, line in enumerate(body, 1))
        return f"[File: /repo/cart.py ({40 + 2 * times} lines total)]\n{shown}\n({40 + 2 * times - len(body)} more lines below)"

    edit = "edit 9:9\n" + "\n".join(block) + "\nend_of_edit"
    seen = []
    with httpx.Client(base_url=e.url) as c:
        for k in range(1, 6):
            r = c.post("/v1/chat/completions", json=swe_agent_chat([(edit, view(j)) for j in range(1, k + 1)]))
            seen.append((r.status_code, r.headers.get("x-loopguard-tool-loop")))
    assert seen == [
        (200, None),
        (200, None),
        (200, "identical;tool=edit;level=1"),
        (200, "identical;tool=edit;level=2"),
        (429, "identical;tool=edit;level=3"),
    ], seen


def test_scrolling_to_new_text_is_never_touched(start_envoy):
    """A browsing agent scrolling down a page: the same call every turn, each
    result new text under the same page chrome. Reading on is progress, for
    near-duplicate detection as for tool loops."""
    plain = Upstream()
    try:
        e = guard(start_envoy, plain, near_agents_policy())
        chrome = "Reader view | The Long Walk | Home Library Settings Help | Font size Theme Bookmarks Share Print | " \
                 "Chapter list Previous chapter Next chapter Table of contents About the author Reviews Related books"
        words = [f"{a}{b}{c}" for a in ("ka", "lo", "mi", "ren", "tal") for b in ("vor", "sun", "dre", "pel", "ith")
                 for c in ("oma", "bru", "cen", "dal", "fin", "gor")]
        messages = [{"role": "user", "content": "Read the story in the open tab and tell me how it ends."}]
        with httpx.Client(base_url=e.url) as c:
            for k in range(8):
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": f"c{k}", "type": "function", "function": {"name": "scroll_down", "arguments": "{}"}}]})
                page = " ".join(words[18 * k:18 * k + 18])
                messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"{chrome}\n{page}\n[more below]"})
                body = json.dumps({"model": "gpt-4o", "messages": messages}).encode()
                r = c.post("/v1/chat/completions", content=body)
                assert r.status_code == 200, k
                assert not any(h.startswith("x-loopguard") for h in r.headers), (k, dict(r.headers))
                assert plain.requests[-1]["body"] == body
    finally:
        plain.stop()


def test_a_harness_asking_again_passes_and_is_counted(start_envoy):
    """mini-swe-agent 2.x re-asking a model that answered without a tool
    call: the same correction appended again and again, the failed answers
    left out. The harness's retries, not the agent's loop: every request
    passes untouched, each re-ask counted."""
    plain = Upstream()
    try:
        e = guard(start_envoy, plain, near_agents_policy())
        correction = ("Tool call error:\n\n<error>\nNo tool calls found in the response. Every response MUST include "
                      "at least one tool call.\n</error>\n\nEvery response needs to use the 'bash' tool at least once.")
        messages = [
            {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
            {"role": "user", "content": "Fix the rounding of the cart total."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"grep -n total cart.py\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "<returncode>0</returncode>\n<output>\n3: def total(self):\n</output>"},
        ]
        with httpx.Client(base_url=e.url) as c:
            for k in range(10):
                messages.append({"role": "user", "content": correction})
                body = json.dumps({"model": "gpt-5-mini", "messages": messages}).encode()
                r = c.post("/v1/chat/completions", content=body)
                assert r.status_code == 200, k
                assert not any(h.startswith("x-loopguard") for h in r.headers), (k, dict(r.headers))
                assert plain.requests[-1]["body"] == body
        assert e.counter("loopguard.harness_retries_total.policy.agents") == 9
    finally:
        plain.stop()


def test_the_same_turn_eight_times_is_stopped_whatever_it_returned(stuck, start_envoy):
    """A model scrolling a long file, writing the same reply word for word
    every turn while every page is new: from the eighth such turn it is
    nudged, then directed, then refused (tier `turn`)."""
    e = guard(start_envoy, stuck, near_agents_policy())
    narration = "We still have not found where the total is rounded; let us scroll down further to find it."
    seen = []
    with httpx.Client(base_url=e.url) as c:
        for n in range(7, 11):
            messages = [{"role": "system", "content": "You are an autonomous programmer."},
                        {"role": "user", "content": "Find where the cart total is rounded."}]
            for k in range(n):
                messages.append({"role": "assistant", "content": f"{narration}\n\n```\nscroll_down\n```"})
                page = "\n".join(f"{100 * k + i + 1}:    step_{k}_{i} = handler_{k}(record_{i})" for i in range(60))
                messages.append({"role": "user", "content": page})
            r = c.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": messages})
            seen.append((r.status_code, r.headers.get("x-loopguard-tool-loop")))
    assert seen == [
        (200, None),
        (200, "turn;tool=scroll_down;level=1"),
        (200, "turn;tool=scroll_down;level=2"),
        (429, "turn;tool=scroll_down;level=3"),
    ], seen
    assert e.counter("loopguard.tool_loop_detected_total.policy.agents.tier.turn.step.reject") == 1
