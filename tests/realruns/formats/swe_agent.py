"""SWE-agent 0.x trajectories (`.traj`): `history` is every message the
agent sent its model, system prompt first; an assistant entry is a reply
(DISCUSSION, then one fenced command). CodeR, a multi-agent fork of
SWE-agent, writes the same format (each entry names its sub-agent).

The outcome is the SWE-bench harness's resolved list; `info.exit_status`
says how the run ended: `submitted` on its own, `exit_cost` (or
`submitted (exit_cost)`, an automatic submission) at the cost limit,
`early_exit`/`exit_format`/errors otherwise.
"""

from __future__ import annotations

from .common import Repo, calls_before_replies, run_record


def end_of(status: str) -> str:
    s = (status or "").lower()
    if s == "submitted":
        return "own"
    if "exit_cost" in s or "context" in s or "autosubmission" in s:
        return "limit"
    return "error"


def messages_of(history: list[dict]) -> list[dict]:
    out = []
    for m in history:
        if m.get("is_demo"):
            continue
        role = m.get("role")
        if role not in ("system", "user", "assistant"):
            continue
        out.append({"role": role, "content": m.get("content") or ""})
    return out


def read(repo: Repo, source: str, system: str, model: str, traj_dir: str, resolved: set[str], run_prefix: str = ""):
    for path in repo.ls(traj_dir):
        if not path.endswith(".traj"):
            continue
        task = path.rsplit("/", 1)[-1][: -len(".traj")]
        try:
            d = repo.json(path)
        except Exception:  # noqa: BLE001 (a file the snapshot lacks)
            continue
        messages = messages_of(d.get("history") or [])
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
            calls=calls_before_replies(messages),
        )
        if rec:
            yield rec
