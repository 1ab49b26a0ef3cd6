"""AutoCodeRover (v0, `results/acr-*/<category>/<task>_<time>/`): the
context-retrieval conversation, `conversation_round_<N>.json` at its
highest N, in which the model writes its search-API calls in its reply
(`search_method("x")`) and the harness answers them in user messages,
round after round, between fixed prompts of its own. That conversation is
the run here (the patch-writing and proxy conversations that follow are
left out). The outcome is the harness's `new_eval_results/report.json`;
`info.log` says "Too many rounds" when the run reached its round limit.
"""

from __future__ import annotations

import re

from .common import Repo, calls_before_replies, run_record


def read(repo: Repo, source: str, model: str, run_dir: str, run_prefix: str):
    report = repo.json(f"{run_dir}/new_eval_results/report.json")
    resolved = set(report.get("resolved") or [])
    tasks: dict[str, dict[str, str]] = {}
    for path in repo.ls(run_dir):
        parts = path.split("/")
        if len(parts) < 5:
            continue
        task_dir = "/".join(parts[:-1])
        tasks.setdefault(task_dir, {})[parts[-1]] = path
    for task_dir, files in sorted(tasks.items()):
        rounds = [(int(m.group(1)), p) for f, p in files.items() if (m := re.fullmatch(r"conversation_round_(\d+)\.json", f))]
        if not rounds:
            continue
        _, last = max(rounds)
        task = re.sub(r"_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d$", "", task_dir.rsplit("/", 1)[-1])
        messages = [{"role": m["role"], "content": m["content"]} for m in repo.json(last)]
        log = repo.show(files["info.log"]).decode(errors="replace") if "info.log" in files else ""
        limit = "Too many rounds" in log
        rec = run_record(
            source=source,
            run=f"{run_prefix}{task}",
            system="AutoCodeRover (v0)",
            model=model,
            shape="chat-text",
            task=task,
            resolved=task in resolved,
            end="limit" if limit else "own",
            status="too many rounds" if limit else task_dir.split("/")[-2],
            provenance=repo.provenance(last),
            messages=messages,
            calls=calls_before_replies(messages),
        )
        if rec:
            yield rec
