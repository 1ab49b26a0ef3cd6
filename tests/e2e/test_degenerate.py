"""Degenerate output, in real Envoy with the real SDKs: a model stuck
repeating the same sentence or block in its own streamed output is reported
(one `output.degenerate` event with the policy, caller and model, and
`loopguard_degenerate_output_total`) while the stream reaches the SDK
unchanged and its usage is still counted; healthy streams that repeat
shapes (a table, code, a refrain) are not reported."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

import anthropic
import openai
import pytest

import harness as h
from test_observability import events
from test_usage import settle

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


class Streams:
    """An upstream that streams `deltas` as the called API's text deltas
    (Chat Completions with usage, the Responses API, Anthropic Messages),
    a few per network write, and reports usage at the end."""

    def __init__(self) -> None:
        self.deltas: list[str] = []
        streams = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                events = streams.events(self.path, body.get("model", "m"))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for i in range(0, len(events), 3):
                    data = "".join(events[i:i + 3]).encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                    time.sleep(0.002)
                self.wfile.write(b"0\r\n\r\n")

        self.server = h.LocalServer(Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def events(self, path: str, model: str) -> list[str]:
        def sse(name: str | None, data) -> str:
            return (f"event: {name}\n" if name else "") + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
        if path.endswith("/messages"):
            msg = {"id": "msg_d", "type": "message", "role": "assistant", "model": model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 40, "output_tokens": 1}}
            return ([sse("message_start", {"type": "message_start", "message": msg}),
                     sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})]
                    + [sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}})
                       for d in self.deltas]
                    + [sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
                       sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                                             "usage": {"output_tokens": 500}}),
                       sse("message_stop", {"type": "message_stop"})])
        if path.endswith("/responses"):
            text = "".join(self.deltas)
            item = {"id": "msg_r", "type": "message", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}
            def response(status: str, output: list, usage) -> dict:
                return {"id": "resp_d", "object": "response", "created_at": 1, "status": status, "model": model,
                        "output": output, "usage": usage, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
            usage = {"input_tokens": 40, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 500,
                     "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 540}
            return ([sse("response.created", {"type": "response.created", "sequence_number": 0, "response": response("in_progress", [], None)})]
                    + [sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": i + 1, "item_id": "msg_r",
                                                          "output_index": 0, "content_index": 0, "delta": d, "logprobs": []})
                       for i, d in enumerate(self.deltas)]
                    + [sse("response.completed", {"type": "response.completed", "sequence_number": len(self.deltas) + 1,
                                                  "response": response("completed", [item], usage)})])
        base = {"id": "chatcmpl-d", "object": "chat.completion.chunk", "created": 1, "model": model}
        return ([sse(None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "usage": None})]
                + [sse(None, {**base, "choices": [{"index": 0, "delta": {"content": d}}], "usage": None}) for d in self.deltas]
                + [sse(None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": None}),
                   sse(None, {**base, "choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 500, "total_tokens": 540}}),
                   sse(None, "[DONE]")])


def split(text: str, size: int = 7) -> list[str]:
    """Deltas of a few characters, cut anywhere (as models stream)."""
    return [text[i:i + size] for i in range(0, len(text), size)]


@pytest.fixture
def streams():
    s = Streams()
    yield s
    s.stop()


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
    time.sleep(0.2)
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
    time.sleep(0.2)
    assert degenerate(e) == []
    streams.deltas = split(SENTENCE * 8, 3)
    deltas = [ev.delta for ev in client.responses.create(model="gpt-4.1", input="report again", stream=True)
              if ev.type == "response.output_text.delta"]
    assert "".join(deltas) == SENTENCE * 8
    settle(e, "loopguard.tokens_total", 2 * 540)
    (event,) = degenerate(e)
    assert event["model"] == "gpt-4.1"
    assert e.counter("loopguard.degenerate_output_total") == 1
