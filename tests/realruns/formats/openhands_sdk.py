"""OpenHands agent-SDK runs of OpenAgentSafety (OpenHands/benchmarks pull
request 90): per task, `traj_<task>.json` is the conversation's event log,
and a line of `output*.jsonl` holds the task's instruction and the run's
metadata (model, `max_iterations`). The events: `ActionEvent`, one tool
call of a model response (the calls of one response share its
`llm_response_id`); `ObservationEvent`, a tool's result; `MessageEvent`, a
user message or a reply without tool calls.

The conversation is rebuilt as the SDK sends it, in OpenAI Chat shape: per
model response one assistant message with its text and all its tool calls,
per observation one tool message, its text rendered as the SDK renders it
for the model (SDK 1.0's renderings, truncation included). The events do
not keep the system prompt: a short one of our own wording (SYSTEM) stands
in for it. A log that does not open with the user's message gets the
instruction of output*.jsonl as the first user message.

The benchmark grades safety (did the agent do the unsafe thing), not task
completion, so no run is resolved. `end`: `own` when the agent's last
response called `finish` or answered without a tool call (the SDK ends the
run then), `limit` when it made `max_iterations` responses, `error`
otherwise (the log stops after a tool call or its result).
"""

from __future__ import annotations

import json
from datetime import datetime

from .common import Repo, run_record, tools_named

SYSTEM = "You are an AI agent that completes the user's task with the tools provided."
# The SDK's truncation of long tool outputs (characters).
BASH_LIMIT = 30000
BROWSER_LIMIT = 50000
CLIPPED = "<response clipped><NOTE>Due to the max output limit, only part of the full response has been shown to you.</NOTE>"


def clip(text: str, limit: int) -> str:
    """The head and the tail of a text past `limit`, the notice between."""
    if len(text) <= limit:
        return text
    room = limit - len(CLIPPED)
    tail = room // 2
    return text[: room - tail] + CLIPPED + text[len(text) - tail :]


def bash_text(o: dict) -> str:
    meta = o.get("metadata") or {}
    text = f"{meta.get('prefix') or ''}{o.get('output') or ''}{meta.get('suffix') or ''}"
    if meta.get("working_dir"):
        text += f"\n[Current working directory: {meta['working_dir']}]"
    if meta.get("py_interpreter_path"):
        text += f"\n[Python interpreter: {meta['py_interpreter_path']}]"
    if meta.get("exit_code", -1) != -1:
        text += f"\n[Command finished with exit code {meta['exit_code']}]"
    if o.get("error"):
        text = f"[There was an error during command execution.]\n{text}"
    return clip(text, BASH_LIMIT)


def observation_text(o: dict) -> str:
    """A tool result as the SDK shows it to the model."""
    kind = o.get("kind")
    if kind == "ExecuteBashObservation":
        return bash_text(o)
    if kind == "BrowserObservation":
        return f"Error: {o['error']}" if o.get("error") else clip(o.get("output") or "", BROWSER_LIMIT)
    if kind == "FileEditorObservation":
        return o.get("error") or o.get("output") or ""
    return o.get("content") or o.get("output") or o.get("message") or ""


def text_of(blocks) -> str:
    return "\n".join(b.get("text") or "" for b in blocks or [] if isinstance(b, dict))


def ms(ts: str) -> int:
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


def conversation(events: list[dict], instruction: str) -> tuple[list[dict], list[int], list[int], list[str]]:
    """The messages, where each call cut them, when each call was made (the
    time of the event before its reply) and the tools called."""
    messages = [{"role": "system", "content": SYSTEM}]
    if not (events and events[0].get("kind") == "MessageEvent" and events[0].get("source") == "user"):
        messages.append({"role": "user", "content": instruction})
    calls, times, names = [], [], []
    response = None
    prev_ts = None
    for e in events:
        kind = e.get("kind")
        if kind == "ActionEvent":
            tc = e.get("tool_call") or {}
            call = {"id": tc.get("id"), "type": "function",
                    "function": {"name": tc.get("name"), "arguments": tc.get("arguments")}}
            names.append(tc.get("name"))
            if messages[-1]["role"] == "assistant" and e.get("llm_response_id") == response:
                messages[-1]["tool_calls"].append(call)
            else:
                response = e.get("llm_response_id")
                calls.append(len(messages))
                times.append(ms(prev_ts or e["timestamp"]))
                messages.append({"role": "assistant", "content": text_of(e.get("thought")) or None, "tool_calls": [call]})
        elif kind == "ObservationEvent":
            messages.append({
                "role": "tool",
                "tool_call_id": e.get("tool_call_id"),
                "name": e.get("tool_name"),
                "content": observation_text(e.get("observation") or {}),
            })
        elif kind == "MessageEvent":
            m = e.get("llm_message") or {}
            if m.get("role") == "assistant":
                response = None
                calls.append(len(messages))
                times.append(ms(prev_ts or e["timestamp"]))
            messages.append({"role": m.get("role"), "content": text_of(m.get("content"))})
        prev_ts = e.get("timestamp") or prev_ts
    return messages, calls, times, names


def ending(last_reply: dict, responses: int, max_iterations: int) -> tuple[str, str]:
    """(end, status) from the agent's last response."""
    called = [c["function"]["name"] for c in last_reply.get("tool_calls") or []]
    if "finish" in called:
        return "own", "finish called"
    if not called:
        return "own", "reply without tool calls"
    if responses >= max_iterations:
        return "limit", f"max_iterations ({max_iterations}) reached"
    return "error", f"log stops after calling {called[-1]}"


def outputs(repo: Repo, run_dir: str) -> dict[str, dict]:
    """The harness's line per task, from every output*.jsonl of the run."""
    out = {}
    for path in repo.ls(run_dir):
        name = path.rsplit("/", 1)[-1]
        if name.startswith("output") and name.endswith(".jsonl"):
            for line in repo.show(path).decode().splitlines():
                if line.strip():
                    d = json.loads(line)
                    out[d["instance_id"]] = d
    return out


def read(repo: Repo, source: str, run_dir: str):
    lines = outputs(repo, run_dir)
    for path in repo.ls(run_dir):
        name = path.rsplit("/", 1)[-1]
        if not (name.startswith("traj_") and name.endswith(".json")):
            continue
        task = name[len("traj_") : -len(".json")]
        meta = lines[task]["metadata"]
        messages, calls, times, names = conversation(repo.json(path), lines[task]["instruction"])
        if not calls:
            continue
        end, status = ending(messages[calls[-1]], len(calls), meta["max_iterations"])
        yield run_record(
            source=source,
            run=task,
            system="OpenHands agent SDK",
            model=meta["llm"]["model"].rsplit("/", 1)[-1],
            shape="chat-tools",
            task=task,
            resolved=False,
            end=end,
            status=status,
            provenance=repo.provenance(path),
            messages=messages,
            calls=calls,
            times_ms=times,
            body={"tools": tools_named(names)},
        )
