"""A fake LLM provider for the token-usage tests: a real HTTP server on
loopback speaking OpenAI Chat Completions, the OpenAI Responses API and
Anthropic Messages, plain JSON or streamed (server-sent events, a chunk at a
time with a pause, so the filter sees them one by one), each answer with the
usage a real provider reports.

`Provider.plan(*usages)` scripts the usage of the next answers, one per
request in the order they arrive, as token counts in the provider's own
vocabulary (see `Turn`); without a plan each API answers with its fixed
default usage."""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from harness import LocalServer


@dataclass(frozen=True)
class Turn:
    """The usage of one answer. `input` is the uncached input (Anthropic's
    `input_tokens`); `cached` the tokens read from the prompt cache (OpenAI
    counts them inside its input too, as `cached_tokens`; Anthropic apart,
    as `cache_read_input_tokens`); `reasoning` is part of `output`."""

    input: int
    output: int
    cached: int = 0
    reasoning: int = 0

    @property
    def openai_input(self) -> int:
        """OpenAI's input count: cached tokens included."""
        return self.input + self.cached

    def chat(self) -> dict:
        return {"prompt_tokens": self.openai_input, "completion_tokens": self.output,
                "total_tokens": self.openai_input + self.output,
                "prompt_tokens_details": {"cached_tokens": self.cached, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}

    def responses(self) -> dict:
        return {"input_tokens": self.openai_input, "input_tokens_details": {"cached_tokens": self.cached},
                "output_tokens": self.output, "output_tokens_details": {"reasoning_tokens": self.reasoning},
                "total_tokens": self.openai_input + self.output}

    def anthropic(self) -> dict:
        return {"input_tokens": self.input, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cached, "output_tokens": self.output}


# The usage each API reports when no plan says otherwise.
CHAT_PLAIN = Turn(120, 7)
CHAT_STREAM = Turn(300, 9)
ANTHROPIC_PLAIN = Turn(50, 5, cached=200)
ANTHROPIC_STREAM = Turn(80, 12)
RESPONSES_PLAIN = Turn(300, 70, cached=600, reasoning=64)
RESPONSES_STREAM = Turn(476, 300, cached=1024, reasoning=256)

TEXT = "Four."
STREAMED = ["Four", " is", " the", " answer."]
# A Responses stream whose text mentions "usage" with numbers: only the
# response.completed event's usage may be counted.
RESPONSES_STREAMED = ["The", " usage", " was", ' {"input_tokens": 999}', " and", " 2+2", " is", " four."]


def _sse(name: str | None, data: dict | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"


class Provider:
    """The upstream. `served` lists (path, usage reported or None) per
    answer, in order; `headers` the request headers (lower-case names) of
    every request it received, in order."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.planned: list[Turn] = []
        self.served: list[tuple[str, Turn | None]] = []
        self.headers: list[dict[str, str]] = []
        # Streams end this many events early (a connection cut mid-stream).
        self.cut_streams = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                with provider.lock:
                    provider.headers.append({k.lower(): v for k, v in self.headers.items()})
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                path = self.path.split("?")[0]
                if body.get("stream"):
                    events = provider.stream(path, body)
                    events = events[: len(events) - provider.cut_streams]
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream; charset=utf-8")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for ev in events:
                        data = ev.encode()
                        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                        self.wfile.flush()
                        time.sleep(0.01)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                payload = json.dumps(provider.answer(path, body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = LocalServer(Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def plan(self, *turns: Turn) -> None:
        """The usage of the next answers, in order."""
        with self.lock:
            self.planned.extend(turns)

    def _turn(self, path: str, default: Turn, reported: bool = True) -> Turn:
        with self.lock:
            turn = self.planned.pop(0) if self.planned else default
            self.served.append((path, turn if reported else None))
            return turn

    @property
    def count(self) -> int:
        with self.lock:
            return len(self.served)

    # --- plain JSON --------------------------------------------------------

    def answer(self, path: str, body: dict) -> dict:
        model = body.get("model", "gpt-4o-mini")
        if path.endswith("/messages"):
            return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "model": model,
                    "content": [{"type": "text", "text": TEXT}], "stop_reason": "end_turn", "stop_sequence": None,
                    "usage": self._turn(path, ANTHROPIC_PLAIN).anthropic()}
        if path.endswith("/responses"):
            return self.response_object(model, TEXT, self._turn(path, RESPONSES_PLAIN).responses())
        # Chat Completions, and anything else (a non-LLM path gets the same
        # body: usage it must not read).
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": 1767225600,
                "model": model, "system_fingerprint": "fp_e2e",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": TEXT, "refusal": None},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": self._turn(path, CHAT_PLAIN).chat(), "service_tier": "default"}

    @staticmethod
    def response_object(model: str, text: str | None, usage: dict | None, status: str = "completed") -> dict:
        """A Responses API `response` object, fields in the API's order."""
        output = [] if text is None else [{
            "id": "msg_e2e", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]}]
        return {"id": "resp_e2e", "object": "response", "created_at": 1767225600, "status": status,
                "background": False, "error": None, "incomplete_details": None, "instructions": None,
                "max_output_tokens": None, "max_tool_calls": None, "model": model, "output": output,
                "parallel_tool_calls": True, "previous_response_id": None, "prompt_cache_key": None,
                "reasoning": {"effort": None, "summary": None}, "safety_identifier": None,
                "service_tier": "default", "store": True, "temperature": 1.0,
                "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto", "tools": [],
                "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "usage": usage, "user": None,
                "metadata": {}}

    # --- streams -----------------------------------------------------------

    def stream(self, path: str, body: dict) -> list[str]:
        model = body.get("model", "gpt-4o-mini")
        if path.endswith("/messages"):
            return self.anthropic_events(model, self._turn(path, ANTHROPIC_STREAM))
        if path.endswith("/responses"):
            return self.responses_events(model, self._turn(path, RESPONSES_STREAM))
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return self.chat_events(model, self._turn(path, CHAT_STREAM, reported=include), include)

    @staticmethod
    def chat_events(model: str, turn: Turn, include: bool) -> list[str]:
        base = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": model}
        extra = {"usage": None} if include else {}
        events = [_sse(None, {**base, "choices": [{"index": 0, "delta": {"content": w}}], **extra}) for w in STREAMED]
        events.append(_sse(None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], **extra}))
        if include:
            events.append(_sse(None, {**base, "choices": [], "usage": turn.chat()}))
        events.append(_sse(None, "[DONE]"))
        return events

    @staticmethod
    def anthropic_events(model: str, turn: Turn) -> list[str]:
        start_usage = {**turn.anthropic(), "output_tokens": 1}
        msg = {"id": "msg_2", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": start_usage}
        return [
            _sse("message_start", {"type": "message_start", "message": msg}),
            _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            _sse("ping", {"type": "ping"}),
            _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TEXT}}),
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                   "usage": {"output_tokens": turn.output}}),
            _sse("message_stop", {"type": "message_stop"}),
        ]

    @classmethod
    def responses_events(cls, model: str, turn: Turn) -> list[str]:
        """A Responses API stream as the API sends it: created, in_progress,
        the message item and its text part, the text deltas, their done
        events, and response.completed with the usage."""
        text = "".join(RESPONSES_STREAMED)
        item = {"id": "msg_e2e", "type": "message", "status": "in_progress", "content": [], "role": "assistant"}
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        where = {"item_id": "msg_e2e", "output_index": 0, "content_index": 0}
        seq = iter(range(1000))

        def ev(name: str, **fields) -> str:
            return _sse(name, {"type": name, "sequence_number": next(seq), **fields})

        events = [
            ev("response.created", response=cls.response_object(model, None, None, status="in_progress")),
            ev("response.in_progress", response=cls.response_object(model, None, None, status="in_progress")),
            ev("response.output_item.added", output_index=0, item=item),
            ev("response.content_part.added", **where, part=part),
        ]
        events += [ev("response.output_text.delta", **where, delta=d, logprobs=[]) for d in RESPONSES_STREAMED]
        events += [
            ev("response.output_text.done", **where, text=text, logprobs=[]),
            ev("response.content_part.done", **where, part={**part, "text": text}),
            ev("response.output_item.done", output_index=0,
               item={**item, "status": "completed", "content": [{**part, "text": text}]}),
            ev("response.completed", response=cls.response_object(model, text, turn.responses())),
        ]
        return events
