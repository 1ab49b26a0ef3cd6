"""Token usage read from responses as they pass, with the real OpenAI and
Anthropic SDKs: plain JSON and streamed, added to the policy by token type
and by whether the request was part of a detected loop. Streams reach the
SDK unchanged."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
import pytest

import harness as h

CONFIG = {
    "max_body_bytes": 1 << 20,
    "hold_request_headers": True,
    "policies": [{"id": "agents", "spec": {
        "selector": {"pathPrefix": "/v1/", "methods": ["POST"]},
        "loop_detection": {"enabled": True, "window_seconds": 60, "similarity": "llm_tail",
                           "escalation": [{"at": 2, "action": "warn"}, {"at": 4, "action": "reject"}]},
    }}],
}


def tokens(e: h.Envoy, kind: str, in_loop: bool) -> int:
    return e.stats().get(f"wasmcustom.loopguard.tokens_total.policy.agents.token_type.{kind}.loop.{str(in_loop).lower()}", 0)


class Provider:
    """An upstream speaking Chat Completions and Anthropic Messages, plain
    or streamed (server-sent events, a chunk at a time with a pause, so the
    filter sees them one by one)."""

    def __init__(self) -> None:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                anthropic_api = self.path.endswith("/messages")
                if body.get("stream"):
                    events = provider.anthropic_events() if anthropic_api else provider.chat_events(body)
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for ev in events:
                        data = ev.encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                        time.sleep(0.01)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                answer = provider.anthropic_message() if anthropic_api else provider.chat_completion()
                payload = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def chat_completion() -> dict:
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Four."}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127}}

    @staticmethod
    def chat_events(body: dict) -> list[str]:
        base = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini"}
        include = (body.get("stream_options") or {}).get("include_usage")
        events = [f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {'content': w}}], **({'usage': None} if include else {})})}\n\n"
                  for w in ["Four", " is", " the", " answer."]]
        events.append(f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}]})}\n\n")
        if include:
            events.append(f"data: {json.dumps({**base, 'choices': [], 'usage': {'prompt_tokens': 300, 'completion_tokens': 9, 'total_tokens': 309}})}\n\n")
        events.append("data: [DONE]\n\n")
        return events

    @staticmethod
    def anthropic_message() -> dict:
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4",
                "content": [{"type": "text", "text": "Four."}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 50, "cache_read_input_tokens": 200, "output_tokens": 5}}

    @staticmethod
    def anthropic_events() -> list[str]:
        def ev(name: str, data: dict) -> str:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n"
        msg = {"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-sonnet-4", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 80, "output_tokens": 1}}
        return [
            ev("message_start", {"type": "message_start", "message": msg}),
            ev("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ev("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Four."}}),
            ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                 "usage": {"output_tokens": 12}}),
            ev("message_stop", {"type": "message_stop"}),
        ]


@pytest.fixture
def provider():
    p = Provider()
    yield p
    p.stop()


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
    time.sleep(0.3)
    assert (tokens(e, "input", False), tokens(e, "output", False)) == (120 + 300, 7 + 9)
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
    time.sleep(0.3)
    assert (tokens(e, "input", False), tokens(e, "output", False)) == (250, 5)
    assert (tokens(e, "input", True), tokens(e, "output", True)) == (80, 12)
    assert e.counter("loopguard.warned_total") == 1
