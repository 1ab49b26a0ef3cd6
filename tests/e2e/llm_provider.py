"""Fake LLM providers, each a responder of the one upstream server
(harness.Upstream) on loopback.

`Provider`, for the token-usage and budget tests, speaks OpenAI Chat
Completions, the OpenAI Responses API and Anthropic Messages, plain JSON or
streamed (server-sent events, a chunk at a time with a pause, so the filter
sees them one by one), each answer with the usage a real provider reports.
`Provider.plan(*usages)` scripts the usage of the next answers, one per
request in the order they arrive, as token counts in the provider's own
vocabulary (see `Turn`); without a plan each API answers with its fixed
default usage.

`HeldStreams` holds its streams open before their usage until told to go
on (a cap crossed mid-stream); `DeltaStreams` streams the text deltas a test
sets (degenerate output); `Flaky` fails attempts as a provider in trouble
does (retries)."""

from __future__ import annotations

import gzip
import json
import threading
import time
import uuid
from dataclasses import dataclass

from harness import COMPLETION, Answer, Upstream, paced


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
        # Plain answers are gzip-compressed when the request accepts gzip
        # (as real providers do).
        self.gzip_when_asked = False
        # Seconds to wait before answering (a slow generation).
        self.delay = 0.0
        # The cost the upstream reports: OpenRouter's usage.cost (dollars) in
        # plain answers, and LiteLLM's x-litellm-response-cost header.
        self.usage_cost: float | None = None
        self.cost_header: str | None = None
        self.upstream = Upstream(self.respond, methods=("POST", "GET"))
        self.port = self.upstream.port

    def respond(self, request: dict) -> Answer:
        with self.lock:
            self.headers.append(request["headers"])
        if self.delay:
            time.sleep(self.delay)
        body = json.loads(request["body"] or b"{}")
        path = request["path"].split("?")[0]
        if body.get("stream"):
            events = self.stream(path, body)
            events = events[: len(events) - self.cut_streams]
            # A pause after each event: the filter sees them one by one.
            return Answer(200, headers={"content-type": "text/event-stream; charset=utf-8"}, chunks=paced(events, 0.01))
        answer = self.answer(path, body)
        if self.usage_cost is not None:
            answer["usage"]["cost"] = self.usage_cost
        headers = {"content-type": "application/json"}
        if self.cost_header is not None:
            headers["x-litellm-response-cost"] = self.cost_header
        payload = json.dumps(answer).encode()
        if self.gzip_when_asked and "gzip" in request["headers"].get("accept-encoding", ""):
            headers["content-encoding"] = "gzip"
            payload = gzip.compress(payload)
        return Answer(200, payload, headers)

    def stop(self) -> None:
        self.upstream.stop()

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


class HeldStreams:
    """An OpenAI-style upstream whose streams send their text, then wait
    (for `release(i)`, at most 20 s) before their last events (the usage
    and [DONE]). Plain calls answer at once. `turns` are the usages, in the
    order the requests arrive; `arrived` is released as each stream's
    headers have gone."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = list(turns)
        self.gates: list[threading.Event] = []
        self.arrived = threading.Semaphore(0)
        self.lock = threading.Lock()
        self.upstream = Upstream(self.respond, methods=("POST",))
        self.port = self.upstream.port

    def respond(self, request: dict) -> Answer:
        body = json.loads(request["body"])
        with self.lock:
            turn = self.turns.pop(0)
            gate = threading.Event()
            if body.get("stream"):
                self.gates.append(gate)
        if not body.get("stream"):
            return Answer(200, json.dumps({
                "id": "chatcmpl-held", "object": "chat.completion", "created": 1, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Four."},
                             "finish_reason": "stop"}],
                "usage": turn.chat()}), {"content-type": "application/json"})
        events = Provider.chat_events(body["model"], turn, include=True)

        def chunks():
            self.arrived.release()  # the headers have gone
            for i, ev in enumerate(events):
                if i == len(events) - 2:
                    gate.wait(20)
                yield ev

        return Answer(200, headers={"content-type": "text/event-stream; charset=utf-8"}, chunks=chunks())

    def release(self, i: int) -> None:
        self.gates[i].set()

    def stop(self) -> None:
        for g in self.gates:
            g.set()
        self.upstream.stop()


class DeltaStreams:
    """An upstream that streams `deltas` as the called API's text deltas
    (Chat Completions with usage, the Responses API, Anthropic Messages),
    a few per network write, and reports usage at the end."""

    def __init__(self) -> None:
        self.deltas: list[str] = []
        self.upstream = Upstream(self.respond, methods=("POST",))
        self.port = self.upstream.port

    def respond(self, request: dict) -> Answer:
        body = json.loads(request["body"] or b"{}")
        events = self.events(request["path"], body.get("model", "m"))
        # Three events a write, a short pause between writes (a model's pace).
        writes = ["".join(events[i:i + 3]) for i in range(0, len(events), 3)]
        return Answer(200, headers={"content-type": "text/event-stream"}, chunks=paced(writes, 0.002))

    def stop(self) -> None:
        self.upstream.stop()

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


# An Anthropic answer of a provider that recovered.
FLAKY_ANTHROPIC_MESSAGE = {
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
    """A provider in trouble (for the retry tests): it fails the first
    `failures` attempts of each request body with `status`, then answers;
    or fails every attempt when `failures` is None. With `only_first`, only
    the first body's attempts fail."""

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
            return 200, FLAKY_ANTHROPIC_MESSAGE
        # A model answers what it was asked (the newest user message).
        asked = json.loads(request["body"])["messages"][-1]["content"]
        answer = json.loads(json.dumps(COMPLETION))
        answer["choices"][0]["message"]["content"] = f"Here is what you asked for ({asked.lower().rstrip('.')}): done."
        return 200, answer
