"""Degenerate output, in real Envoy with the real SDKs: a model stuck
repeating the same sentence or block in its own streamed output is reported
(one `output.degenerate` event with the policy, caller and model, and
`loopguard_degenerate_output_total`) while the stream reaches the SDK
unchanged and its usage is still counted; healthy streams that repeat
shapes (a table, code, a refrain) are not reported."""

from __future__ import annotations

import anthropic
import openai

import harness as h
from observing import events, settle

CONFIG = {
    "max_body_bytes": 1 << 20,
    "hold_request_headers": True,
    "policies": [{"id": "agents", "spec": {
        "selector": {"pathPrefix": "/v1/", "methods": ["POST"]},
        "loop_detection": {"enabled": True, "window_seconds": 60, "similarity": "llm_tail",
                           "escalation": [{"at": 20, "action": "warn"}]},
    }}],
}

SENTENCE = "I will check the deployment status of the payments service again. "
BLOCK = ["Let me look at the logs. ", "The error is still there. ", "I should restart the worker.\n"]
HEALTHY = (
    ["| service | pods | status |\n", "|---|---|---|\n"]
    + [f"| svc-{i} | {i % 5 + 1} | {'ok' if i % 3 else 'degraded'} |\n" for i in range(30)]
    + ["```rust\n"] + [f"fn step_{i}() {{\n    run({i});\n}}\n" for i in range(12)] + ["```\n"]
    + ["The chorus goes: we ride at dawn, we ride at dawn.\n"] * 2
    + [f"Point {i}: the {w} queue drained in {i * 7 + 3} seconds. " for i, w in enumerate(["east", "west", "north", "south"] * 5)]
)


def split(text: str, size: int = 7) -> list[str]:
    """Deltas of a few characters, cut anywhere (as models stream)."""
    return [text[i:i + size] for i in range(0, len(text), size)]


def degenerate(e: h.Envoy) -> list[dict]:
    return events(e, "output.degenerate")


def test_openai_chat_stream_repeating_a_sentence_is_reported_and_arrives_whole(streams, start_envoy):
    e = start_envoy(h.bootstrap(CONFIG, streams.port, hold=True))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-degenerate", max_retries=0)
    streams.deltas = split("Here is the plan. " + SENTENCE * 12)
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "status?"}],
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Here is the plan. " + SENTENCE * 12
    assert chunks[-1].usage.completion_tokens == 500
    settle(e, "loopguard.tokens_total", 540)
    (event,) = degenerate(e)
    assert (event["policy"], event["model"], event["mode"]) == ("agents", "gpt-4o", "enforce")
    assert len(event["caller"]) == 12 and int(event["caller"], 16) >= 0
    assert event["unit_chars"] == len(SENTENCE.strip()) + 1
    assert event["repeats"] >= 4 and event["covered_chars"] >= 200
    assert e.counter("loopguard.degenerate_output_total") == 1
    # The same caller's next, healthy answer is not reported.
    streams.deltas = split("".join(HEALTHY))
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "and now?"}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(HEALTHY)
    settle(e, "loopguard.tokens_total", 2 * 540)
    e.quiet()  # both streams are over: any event of theirs is logged
    assert len(degenerate(e)) == 1
    assert e.counter("loopguard.degenerate_output_total") == 1


def test_anthropic_stream_repeating_a_block_is_reported(streams, start_envoy):
    e = start_envoy(h.bootstrap(CONFIG, streams.port, hold=True))
    client = anthropic.Anthropic(base_url=e.url, api_key="sk-ant-degenerate", max_retries=0)
    block = "".join(BLOCK)
    # Past the first 8 KB of events (where the watch starts), the block
    # still repeats more than 4 times.
    streams.deltas = split(block * 12, 5)
    with client.messages.stream(model="claude-sonnet-4", max_tokens=500,
                                messages=[{"role": "user", "content": "fix it"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == block * 12
    assert final.usage.output_tokens == 500
    settle(e, "loopguard.tokens_total", 540)
    (event,) = degenerate(e)
    assert event["model"] == "claude-sonnet-4"
    assert event["unit_chars"] == sum(len(b.strip()) + 1 for b in BLOCK)
    assert e.counter("loopguard.degenerate_output_total") == 1


def test_responses_stream_repeating_is_reported_and_healthy_shapes_are_not(streams, start_envoy):
    e = start_envoy(h.bootstrap(CONFIG, streams.port, hold=True))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-responses-degenerate", max_retries=0)
    streams.deltas = split("".join(HEALTHY), 11)
    done = [ev for ev in client.responses.create(model="gpt-4.1", input="report", stream=True)
            if ev.type == "response.completed"]
    assert done[0].response.output_text == "".join(HEALTHY)
    settle(e, "loopguard.tokens_total", 540)
    e.quiet()  # the stream is over: an event of it would be logged
    assert degenerate(e) == []
    streams.deltas = split(SENTENCE * 8, 3)
    deltas = [ev.delta for ev in client.responses.create(model="gpt-4.1", input="report again", stream=True)
              if ev.type == "response.output_text.delta"]
    assert "".join(deltas) == SENTENCE * 8
    settle(e, "loopguard.tokens_total", 2 * 540)
    (event,) = degenerate(e)
    assert event["model"] == "gpt-4.1"
    assert e.counter("loopguard.degenerate_output_total") == 1
