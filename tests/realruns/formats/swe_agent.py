"""SWE-agent 0.x trajectories (`.traj`): `history` is every message the
agent sent its model, system prompt first; an assistant entry is a reply
(DISCUSSION, then one fenced command). CodeR, a multi-agent fork of
SWE-agent, writes the same format, each entry naming its sub-agent
(Manager, Reproducer, Programmer, ...): each sub-agent has a conversation
of its own (its own system prompt and task), so each is kept apart and
its requests carry only its own messages.

The outcome is the SWE-bench harness's resolved list; `info.exit_status`
says how the run ended: `submitted` on its own, `exit_cost` (or
`submitted (exit_cost)`, an automatic submission) at the cost limit,
`early_exit`/`exit_format`/errors otherwise.
"""

from __future__ import annotations

from .common import Repo, json_files, run_record


def end_of(status: str) -> str:
    s = (status or "").lower()
    if s == "submitted":
        return "own"
    if "exit_cost" in s or "context" in s or "autosubmission" in s:
        return "limit"
    return "error"


def messages_of(history: list[dict]) -> tuple[list[dict], list[int], list[int]]:
    """The conversation(s) of a history: one, or (CodeR) one per sub-agent,
    each with only that agent's messages, as its requests carried them;
    their messages one conversation after another, the calls in the order
    they were made, and where each conversation starts."""
    agents: dict[str, list[tuple[int, dict]]] = {}
    for i, m in enumerate(history):
        if m.get("is_demo"):
            continue
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            continue
        agents.setdefault(m.get("agent") or "", []).append((i, {"role": role, "content": m.get("content") or ""}))
    messages: list[dict] = []
    starts: list[int] = []
    made: list[tuple[int, int]] = []  # (index in the history, index in messages)
    for thread in agents.values():
        starts.append(len(messages))
        for i, m in thread:
            if m["role"] == "assistant" and len(messages) > starts[-1]:
                made.append((i, len(messages)))
            messages.append(m)
    calls = [at for _, at in sorted(made)]
    return messages, calls, starts


def read(repo: Repo, source: str, system: str, model: str, traj_dir: str, resolved: set[str], run_prefix: str = ""):
    for path, task, d in json_files(repo, traj_dir, ".traj"):
        messages, calls, threads = messages_of(d.get("history") or [])
        status = (d.get("info") or {}).get("exit_status") or "missing"
        rec = run_record(
            source=source,
            run=f"{run_prefix}{task}",
            system=system,
            model=model,
            shape="chat-text",
            task=task,
            resolved=task in resolved,
            end=end_of(status),
            status=status,
            provenance=repo.provenance(path),
            messages=messages,
            calls=calls,
            threads=threads,
        )
        if rec:
            yield rec
