"""Nebius's SWE-agent runs (the `nebius/SWE-agent-trajectories` dataset,
CC-BY-4.0), as a public repository keeps a copy of them: one JSON file per
task, `swe_trajectories/trajectories/<instance_id>.json`, holding the last
run of that task in the dataset's order.

A file has `trajectory` (the agent's history as a Python literal: a list of
`{role, system_prompt | text, ...}`, roles `system`, `user` and `ai`),
`model_name` (Nebius's fine-tuned Llama checkpoints), `target` (whether
Nebius's test evaluation passed) and `exit_status` (SWE-agent 0.x's: read as
in formats/swe_agent.py). The agent is SWE-agent 0.x with its classic
commands (`open`, `scroll_down`, `edit N:M ... end_of_edit`, ...): a reply is
a DISCUSSION then one fenced command, and each reply answered a call that
sent everything before it. The history holds no demonstrations.
"""

from __future__ import annotations

import ast
import json

from .common import Repo, calls_before_replies, run_record
from .swe_agent import end_of

ROLES = {"system": "system", "user": "user", "ai": "assistant"}


def messages_of(trajectory) -> list[dict]:
    if isinstance(trajectory, str):
        trajectory = ast.literal_eval(trajectory)
    out = []
    for m in trajectory:
        role = ROLES.get(m.get("role"))
        if role:
            out.append({"role": role, "content": m.get("system_prompt") or m.get("text") or ""})
    return out


def read(repo: Repo, source: str, system: str, traj_dir: str):
    for path in repo.ls(traj_dir):
        if not path.endswith(".json"):
            continue
        d = json.loads(repo.show(path))
        messages = messages_of(d.get("trajectory") or [])
        status = d.get("exit_status") or "missing"
        rec = run_record(
            source=source,
            run=d["instance_id"],
            system=system,
            model=d.get("model_name") or "unknown",
            shape="chat-text",
            task=d["instance_id"],
            resolved=bool(d.get("target")),
            end=end_of(status),
            status=status,
            provenance=repo.provenance(path),
            messages=messages,
            calls=calls_before_replies(messages),
        )
        if rec:
            yield rec
