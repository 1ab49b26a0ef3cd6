"""SWE-agent 1.x trajectories (`.traj`, as SWE-bench Verified submissions
publish them: `trajs/<id>/<id>.traj`, with `results/results.json`).
`history` is the conversation the agent kept, system prompt first, each
entry carrying the agent's bookkeeping beside the message (`agent`,
`message_type`, `thought`, `action`, Anthropic `cache_control` marks),
which is dropped, as are demonstrations (`is_demo`). With function calling
a reply carries OpenAI `tool_calls`, answered by `tool` messages
(`tool_call_ids`): shape chat-tools. Without (SWE-agent-LM-32B) the reply
writes its call as text, `<function=bash><parameter=command>...`: shape
chat-text. Each reply answered a call that sent everything before it.

History processors change what is sent: `last_n_observations` (the
LM-32B runs, n 5) sends every observation (a user message) but the first
(the task) and the last n as `Old environment output: (N lines
omitted)`, N its number of lines: the record's `elide`; `cache_control`
(the Claude runs) only marks the last messages. What the record cannot
show: a reply that could not be parsed was asked again with the failed
reply and the error appended, both left out of the history, so the reply
kept answers the first request and the re-ask is missing. `trajectory[k]`
records each request (`query`, or `messages`: the history as the next
request sends it).

The outcome is the SWE-bench harness's resolved list; `info.exit_status`
says how the run ended, read as in formats/swe_agent.py. Files the snapshot
lacks (4 MiB and more: the long runs) are skipped.
"""

from __future__ import annotations

import json

from .common import Repo, calls_before_replies, json_files, run_record, tools_named
from .swe_agent import end_of

STAND_IN = "Old environment output: ({lines} lines omitted)"


def without_cache_marks(content):
    if isinstance(content, list):
        return [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b for b in content]
    return content


def clean(m: dict) -> dict:
    """A history entry as the message the agent sends."""
    out = {"role": m["role"], "content": without_cache_marks(m.get("content"))}
    if m["role"] == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": {
                "name": (c.get("function") or {}).get("name"),
                "arguments": (c.get("function") or {}).get("arguments"),
            }}
            for c in m["tool_calls"]
        ]
    if m["role"] == "tool":
        out["tool_call_id"] = (m.get("tool_call_ids") or [None])[0]
    return out


def elide_of(d: dict, history: list[dict]) -> dict | None:
    """The record's `elide` for a run's `last_n_observations` processor."""
    config = d.get("replay_config") or {}
    if isinstance(config, str):
        config = json.loads(config)
    for p in (config.get("agent") or {}).get("history_processors") or []:
        if p.get("type") == "last_n_observations":
            # As `elide` can say it: the observations are the user messages, none tagged.
            assert p.get("polling", 1) == 1, p
            assert all((m["role"] == "user") == (m.get("message_type") == "observation") and not m.get("tags") for m in history)
            return {"role": "user", "first": 1, "last": p["n"], "text": STAND_IN}
    return None


def read(repo: Repo, source: str, run_dir: str, model: str):
    resolved = set(repo.json(f"{run_dir}/results/results.json").get("resolved") or [])
    for path, task, d in json_files(repo, f"{run_dir}/trajs", ".traj"):
        history = [m for m in d.get("history") or [] if not m.get("is_demo")]
        messages = [clean(m) for m in history]
        names = [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]
        status = (d.get("info") or {}).get("exit_status") or "missing"
        rec = run_record(
            source=source,
            run=f"{model}/{task}",
            system="SWE-agent 1.x",
            model=model,
            shape="chat-tools" if names else "chat-text",
            task=task,
            resolved=task in resolved,
            end=end_of(status),
            status=status,
            provenance=repo.provenance(path),
            messages=messages,
            calls=calls_before_replies(messages),
            body={"tools": tools_named(names)} if names else None,
            elide=elide_of(d, history),
        )
        if rec:
            yield rec
