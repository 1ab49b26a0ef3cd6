"""MINT (`data/outputs/<model>/F=None/max5_p2+tool+cd/code_generation/
<dataset>/results.jsonl`): a model solving a coding problem in at most 5
turns, writing its actions in the reply (`<execute>` Python, or a
`<solution>`), each observation coming back as a user message. `state`
records `success` and `terminate_reason`: `task_success` ends on its own,
`max_steps` and `max_propose_steps` at the harness's limits.
"""

from __future__ import annotations

import json

from .common import Repo, calls_before_replies, run_record


def end_of(reason: str) -> str:
    if reason == "task_success":
        return "own"
    if reason in ("max_steps", "max_propose_steps"):
        return "limit"
    return "error"


def read(repo: Repo, source: str, model: str, path: str, dataset: str):
    for line in repo.show(path).decode().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        s = d["state"]
        task = f"{dataset}/{d['task']['task_id']}"
        messages = [{"role": m["role"], "content": m["content"]} for m in s["history"] if m["role"] in ("system", "user", "assistant")]
        rec = run_record(
            source=source,
            run=f"{model}/{task}",
            system="MINT (CodeAct-style text actions)",
            model=model,
            shape="chat-text",
            task=task,
            resolved=bool(s.get("success")),
            end=end_of(s.get("terminate_reason")),
            status=str(s.get("terminate_reason")),
            provenance=repo.provenance(path),
            messages=messages,
            calls=calls_before_replies(messages),
        )
        if rec:
            yield rec
