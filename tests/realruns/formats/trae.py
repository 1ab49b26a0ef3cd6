"""Trae Agent runs of ISO-Bench (performance tasks on vLLM and SGLang):
`ISO-Bench/state/runs/<bench>/trae/<model>/<time>/<item>/trajectory.json`.
`llm_interactions` logs each model call: the messages it added to the
conversation (`input_messages`: the system prompt(s) and the task first,
then the tool results of the previous reply and any message of the
harness's) and the reply (`response`: text and tool calls, the arguments
parsed). Trae's LLM clients keep the conversation and send all of it at
every call, so it is rebuilt whole, in OpenAI Chat shape: per reply one
assistant message (text and tool calls, arguments as JSON), per tool
result one tool message, its text joined from the result and the error as
the run's client joins them (the OpenAI Responses client: `result`, then
`\nError: <error>`; the Anthropic (Bedrock) and OpenAI-compatible clients:
`result\n`, then `Tool call failed with error:\n<error>`). The Claude runs
went through Bedrock in Anthropic shape; they are kept in Chat shape like
the others, both system messages included where the task had two (an
Anthropic client sends one `system`).

A reply with neither text nor tool calls never enters a client's history:
its call is a dropped reply (formats/common.py), cut before the harness's
`<system-reminder>` that follows it. When the agent called `task_done` with an empty patch, the harness
answered with a user message and no result for that call: so the
conversation has it (the provider refused most of those requests, which
ended the run). Times are when each reply was logged.

ISO-Bench scores speed-ups, not per run here: no run is resolved. `end`:
`own` when the last reply called `task_done` (or the run recorded
success), `limit` when the run used its `max_steps` (Trae's final result
says so), `error` otherwise (the provider refused a request, a reply's
arguments did not parse, ...); the status is the run's last recorded error.
Runs without a logged call (the credentials had expired) are skipped.
"""

from __future__ import annotations

import json
from datetime import datetime

from .common import Repo, run_record, tools_named

STEP_LIMIT = "Task execution exceeded maximum steps"


def result_text(r: dict, provider: str) -> str:
    result, error = r.get("result"), r.get("error")
    if provider == "openai":
        text = str(result) if result is not None else ""
        if error:
            text += f"\nError: {error}"
    else:
        text = f"{result}\n" if result else ""
        if error:
            text += f"Tool call failed with error:\n{error}"
    return text.strip()


def inputs(msgs: list[dict], provider: str) -> list[dict]:
    out = []
    for m in msgs or []:
        r = m.get("tool_result")
        if r:
            out.append({"role": "tool", "tool_call_id": r.get("call_id"), "content": result_text(r, provider)})
        else:
            out.append({"role": m["role"], "content": m.get("content")})
    return out


def reply(response: dict) -> dict | None:
    """The assistant message a response left in the history, or None."""
    calls = [
        {"id": c.get("call_id"), "type": "function", "function": {
            "name": c.get("name"),
            "arguments": json.dumps(c.get("arguments") or {}),
        }}
        for c in response.get("tool_calls") or []
    ]
    if not calls and not response.get("content"):
        return None
    out = {"role": "assistant", "content": response.get("content") or None}
    if calls:
        out["tool_calls"] = calls
    return out


def ms(ts: str) -> int:
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


def conversation(interactions: list[dict], provider: str) -> tuple[list[dict], list[int], list[int]]:
    messages, calls, times = [], [], []
    for it in interactions:
        messages += inputs(it.get("input_messages"), provider)
        calls.append(len(messages))
        times.append(ms(it["timestamp"]))
        m = reply(it.get("response") or {})
        if m:
            messages.append(m)
    return messages, calls, times


def end_of(d: dict, last_response: dict) -> str:
    called = [c.get("name") for c in last_response.get("tool_calls") or []]
    if d.get("success") or "task_done" in called:
        return "own"
    max_steps = d.get("max_steps")
    if str(d.get("final_result") or "").startswith(STEP_LIMIT) or (max_steps and len(d.get("agent_steps") or []) >= max_steps):
        return "limit"
    return "error"


def status_of(d: dict) -> str:
    """Success, else the last error the run recorded (its first line), else
    its final result."""
    if d.get("success"):
        return "success"
    error = next((s["error"] for s in reversed(d.get("agent_steps") or []) if s.get("error")), None)
    text = error or str(d.get("final_result") or "") or "no error recorded"
    return text.splitlines()[0][:200]


def model_name(model: str) -> str:
    """`us.anthropic.claude-...-v1:0` and `openai/gpt-5` as the model's own name."""
    model = model.rsplit("/", 1)[-1]
    if "anthropic." in model:
        model = model.split("anthropic.", 1)[1].split("-v1:")[0]
    return model


def read(repo: Repo, source: str, runs_dir: str):
    for path in repo.ls(runs_dir):
        parts = path[len(runs_dir) :].strip("/").split("/")
        if len(parts) != 6 or parts[1] != "trae" or parts[5] != "trajectory.json":
            continue
        bench, _, model_dir, started, item, _ = parts
        d = repo.json(path)
        interactions = d.get("llm_interactions") or []
        messages, calls, times = conversation(interactions, d.get("provider") or "")
        if not calls:
            continue
        yield run_record(
            source=source,
            run=f"{bench}/{model_dir}/{started}/{item}",
            system="Trae Agent",
            model=model_name(d.get("model") or model_dir),
            shape="chat-tools",
            task=item,
            resolved=False,
            end=end_of(d, interactions[-1].get("response") or {}),
            status=status_of(d),
            provenance=repo.provenance(path),
            messages=messages,
            calls=calls,
            times_ms=times,
            body={"tools": tools_named([t for it in interactions for t in it.get("tools_available") or []])},
        )
