"""A scripted model server for driving real agent frameworks on loopback.

It speaks OpenAI Chat Completions (`/v1/chat/completions`), the OpenAI
Responses API (`/v1/responses`) and Anthropic Messages (`/v1/messages`,
with the message threads the Anthropic SDK's tool runner uses by default:
`thread: {"type": "create"}`, then `{"type": "continue", ...}` with only
the new messages), non-streaming. Every request is read into one
`Conversation` whatever its format, and a script, a plain function of that
conversation, says what the "model" answers: `Say(text)` or a list of
`Call(name, args)` (parallel calls when there are several). Tool-call ids
are fresh every turn, as models make them; the tools themselves are real
Python functions the framework runs.

The server records each request (through `harness.Upstream`: method, path,
headers, raw body) and the conversation the script saw, so a test can
assert what reached the model and whether loopguard's note was read.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Union

from harness import Upstream

# Both of loopguard's notes say where they come from: the nudge starts
# "Note from the API gateway", the directive "Instruction from the API
# gateway".
LOOPGUARD_NOTE = "from the API gateway"


@dataclass
class Call:
    name: str
    args: dict = field(default_factory=dict)


@dataclass
class Say:
    text: str


Reply = Union[Say, list]  # Say, or a list of Call


@dataclass
class Item:
    """One entry of a conversation: `system`, `user` (also developer and
    Anthropic text blocks), `assistant` (the model's text), `call` (a tool
    call: name, args, call_id) or `result` (a tool's output for call_id)."""

    kind: str
    text: str = ""
    name: str = ""
    args: dict | None = None
    call_id: str = ""


@dataclass
class Conversation:
    fmt: str  # "chat", "responses" or "messages"
    items: list[Item]
    tools: list[str]
    tool_choice_none: bool
    api_key: str
    body: dict

    @property
    def calls(self) -> list[Item]:
        return [i for i in self.items if i.kind == "call"]

    def calls_of(self, name: str) -> list[Item]:
        return [i for i in self.calls if i.name == name]

    def result_of(self, call: Item) -> str | None:
        return next((i.text for i in self.items if i.kind == "result" and i.call_id == call.call_id), None)

    @property
    def answers(self) -> list[str]:
        return [i.text for i in self.items if i.kind == "assistant" and i.text]

    @property
    def turn(self) -> int:
        """1 + the model turns already in the conversation (a turn is its
        text, or a batch of calls, up to the next input)."""
        turns, in_turn = 0, False
        for i in self.items:
            if i.kind in ("assistant", "call"):
                turns += not in_turn
                in_turn = True
            elif i.kind in ("user", "result", "system"):
                in_turn = False
        return turns + 1

    def since_model(self) -> list[Item]:
        """What came after the model's last turn: tool results, user text,
        and anything appended to the conversation (loopguard's notes)."""
        for n in range(len(self.items) - 1, -1, -1):
            if self.items[n].kind in ("assistant", "call"):
                return self.items[n + 1:]
        return self.items

    @property
    def loopguard_note(self) -> str | None:
        """loopguard's nudge or directive, when the newest input carries one."""
        return next((i.text for i in self.since_model() if i.kind in ("system", "user") and LOOPGUARD_NOTE in i.text), None)

    @property
    def last_user(self) -> str:
        return next((i.text for i in reversed(self.items) if i.kind == "user"), "")


Script = Callable[[Conversation], Reply]


def obeys_loopguard(script: Script, stop: str = "I keep repeating myself, so I will stop here and ask you how to proceed.") -> Script:
    """A model that reads loopguard's note and obeys it: it answers in text
    and stops calling tools."""

    def model(conv: Conversation) -> Reply:
        if conv.loopguard_note:
            return Say(stop)
        return script(conv)

    return model


# --- reading the three formats ----------------------------------------------------


def _text(content) -> str:
    """The text of a content value: a string, or the text parts of blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") in ("text", "input_text", "output_text"):
            parts.append(block.get("text", ""))
        elif isinstance(block, dict) and block.get("type") == "tool_result":
            parts.append(_text(block.get("content")))
    return "\n".join(parts)


def _args(raw) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_value": value}


def read_chat(body: dict) -> list[Item]:
    items = []
    for m in body.get("messages", []):
        role = m.get("role")
        if role == "tool":
            items.append(Item("result", _text(m.get("content")), call_id=m.get("tool_call_id", "")))
        elif role == "assistant":
            if _text(m.get("content")):
                items.append(Item("assistant", _text(m.get("content"))))
            for c in m.get("tool_calls") or []:
                f = c.get("function", {})
                items.append(Item("call", name=f.get("name", ""), args=_args(f.get("arguments")), call_id=c.get("id", "")))
        else:
            items.append(Item("system" if role in ("system", "developer") else "user", _text(m.get("content"))))
    return items


def read_responses(body: dict) -> list[Item]:
    items = []
    if body.get("instructions"):
        items.append(Item("system", body["instructions"]))
    inp = body.get("input", [])
    if isinstance(inp, str):
        return items + [Item("user", inp)]
    for it in inp:
        kind = it.get("type", "message")
        if kind == "function_call":
            items.append(Item("call", name=it.get("name", ""), args=_args(it.get("arguments")), call_id=it.get("call_id", "")))
        elif kind == "function_call_output":
            out = it.get("output")
            items.append(Item("result", out if isinstance(out, str) else _text(out), call_id=it.get("call_id", "")))
        elif kind == "message":
            role = it.get("role")
            if role == "assistant":
                items.append(Item("assistant", _text(it.get("content"))))
            else:
                items.append(Item("system" if role in ("system", "developer") else "user", _text(it.get("content"))))
    return items


def read_messages(system, messages: list) -> list[Item]:
    items = []
    if system:
        items.append(Item("system", _text(system)))
    for m in messages:
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
        for b in blocks:
            t = b.get("type")
            if t == "tool_use":
                items.append(Item("call", name=b.get("name", ""), args=b.get("input") or {}, call_id=b.get("id", "")))
            elif t == "tool_result":
                items.append(Item("result", _text(b.get("content")), call_id=b.get("tool_use_id", "")))
            elif t == "text":
                items.append(Item("assistant" if m.get("role") == "assistant" else "user", b.get("text", "")))
    return items


def _tool_names(body: dict) -> list[str]:
    names = []
    for t in body.get("tools") or []:
        names.append(t.get("name") or t.get("function", {}).get("name", ""))
    return names


def _tool_choice_none(choice) -> bool:
    return choice == "none" or (isinstance(choice, dict) and choice.get("type") == "none")


# --- writing the three formats -----------------------------------------------------


def _id(n: int = 24) -> str:
    return secrets.token_hex(n)[:n]


def chat_completion(body: dict, reply: Reply) -> dict:
    message: dict = {"role": "assistant", "content": None}
    if isinstance(reply, Say):
        message["content"] = reply.text
    else:
        message["tool_calls"] = [
            {"id": f"call_{_id()}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.args)}}
            for c in reply
        ]
    return {
        "id": f"chatcmpl-{_id()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "stop" if isinstance(reply, Say) else "tool_calls"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
    }


def response(body: dict, reply: Reply) -> dict:
    if isinstance(reply, Say):
        output = [{"type": "message", "id": f"msg_{_id()}", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}]
    else:
        output = [{"type": "function_call", "id": f"fc_{_id()}", "call_id": f"call_{_id()}", "name": c.name,
                   "arguments": json.dumps(c.args), "status": "completed"} for c in reply]
    return {
        "id": f"resp_{_id()}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": {},
        "model": body.get("model", "scripted"),
        "output": output,
        "parallel_tool_calls": True,
        "temperature": 1.0,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 60},
    }


def message(body: dict, reply: Reply) -> dict:
    if isinstance(reply, Say):
        content = [{"type": "text", "text": reply.text}]
    else:
        content = [{"type": "tool_use", "id": f"toolu_01{_id(22)}", "name": c.name, "input": c.args} for c in reply]
    return {
        "id": f"msg_01{_id(22)}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "scripted"),
        "content": content,
        "stop_reason": "end_turn" if isinstance(reply, Say) else "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 50, "output_tokens": 10},
    }


# --- the server ----------------------------------------------------------------


class ScriptedModel:
    """The scripted model behind a recording `harness.Upstream`: `script`
    answers every request, except the requests numbered in `fail`
    (1-based, in arrival order), which get a provider's 500."""

    def __init__(self, script: Script, fail: set[int] = frozenset()) -> None:
        self.script = script
        self.fail = set(fail)
        self.conversations: list[Conversation] = []
        self.replies: list[Reply] = []
        # Anthropic message threads: reply id -> (system, tools, messages).
        self.threads: dict[str, tuple] = {}
        self.lock = threading.Lock()
        self.upstream = Upstream(responder=self.answer)
        self.port = self.upstream.port

    @property
    def requests(self) -> list[dict]:
        return self.upstream.requests

    @property
    def count(self) -> int:
        return self.upstream.count

    def stop(self) -> None:
        self.upstream.stop()

    def answer(self, request: dict) -> tuple[int, dict]:
        body = json.loads(request["body"] or b"{}")
        headers = request["headers"]
        key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        path = request["path"].split("?")[0]
        if self.count in self.fail:
            if path.endswith("/messages"):
                return 500, {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}
            return 500, {"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}
        if path.endswith("/messages"):
            return self._messages(body, key)
        if path.endswith("/responses"):
            items, fmt, write = read_responses(body), "responses", response
        elif path.endswith("/chat/completions"):
            items, fmt, write = read_chat(body), "chat", chat_completion
        else:
            return 404, {"error": {"message": f"no such endpoint {path}", "type": "invalid_request_error"}}
        conv = Conversation(fmt, items, _tool_names(body), _tool_choice_none(body.get("tool_choice")), key, body)
        return 200, write(body, self._reply(conv))

    def _messages(self, body: dict, key: str) -> tuple[int, dict]:
        thread = body.get("thread") or {}
        system, tools, history = body.get("system"), body.get("tools"), []
        if thread.get("type") == "continue":
            with self.lock:
                stored = self.threads.get(thread.get("previous_message_id"))
            if stored is None:
                err = {"type": "not_found_error", "message": "thread not found", "details": {"error_code": "thread_not_found"}}
                return 404, {"type": "error", "error": err}
            system, tools, history = stored
        messages = history + list(body.get("messages", []))
        full = {**body, "system": system, "tools": tools}
        conv = Conversation("messages", read_messages(system, messages), _tool_names(full),
                            _tool_choice_none(body.get("tool_choice")), key, body)
        answer = message(body, self._reply(conv))
        if thread.get("type") in ("create", "continue"):
            with self.lock:
                self.threads[answer["id"]] = (system, tools, messages + [{"role": "assistant", "content": answer["content"]}])
        return 200, answer

    def _reply(self, conv: Conversation) -> Reply:
        reply = self.script(conv)
        if not isinstance(reply, Say) and (conv.tool_choice_none or not reply):
            # With tool_choice none a model can only answer in text.
            reply = Say("I can't use tools for this turn, so here is what I have so far.")
        with self.lock:
            self.conversations.append(conv)
            self.replies.append(reply)
        return reply
