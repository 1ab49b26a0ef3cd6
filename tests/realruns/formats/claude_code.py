"""Claude Code runs (SkillsBench, through the Harbor harness): each run's
`agent/claude-code.txt` is Claude Code's stream-json output, one JSON
object a line: `system`/`init` (model, tools), `assistant` lines (one per
content block, several sharing the message id of one model reply), `user`
lines (tool results, a skill's text), and the final `result`. The run's
`result.json` holds the verifier's reward, any exception (a timeout) and
the agent's start and end times.

The main conversation is rebuilt in Anthropic Messages shape: a reply's
blocks joined into one assistant message, the tool results after it into
one user message (roles alternate). Sub-agent traffic (lines with a
`parent_tool_use_id`) is another conversation and is left out. The stream
does not echo the task prompt or Claude Code's system prompt: the first
user message names the task instead (`Solve the SkillsBench task <name>.`)
and no system prompt is sent. It has no per-line times either: the calls
are spread evenly over the agent's recorded execution time, so the
"recorded" pace of these runs is each run's average pace.

These files cannot be fetched as a repository here; they were read file by
file from the public repository and kept verbatim, with their paths and
commit, in a folder per run (`claude-code.txt`, `result.json`,
`provenance.json`).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from .common import run_record

REPO = "benchflow-ai/skillsbench-trajectories"


def conversation(lines: list[dict], task: str) -> tuple[list[dict], list[int], list[str]]:
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": f"Solve the SkillsBench task {task}."}]}]
    calls: list[int] = []
    tools: list[str] = []
    reply_id = None
    for d in lines:
        if d.get("type") == "system" and d.get("subtype") == "init":
            tools = list(d.get("tools") or [])
        if d.get("type") not in ("assistant", "user") or d.get("parent_tool_use_id"):
            continue
        m = d.get("message") or {}
        blocks = m.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        blocks = [b for b in blocks or [] if isinstance(b, dict) and b.get("type") != "thinking"]
        if d["type"] == "assistant":
            if messages[-1]["role"] == "assistant" and m.get("id") == reply_id:
                messages[-1]["content"].extend(blocks)
                continue
            if messages[-1]["role"] == "assistant":
                # Two replies in a row: an empty user turn keeps roles
                # alternating, as the client's own history does.
                messages.append({"role": "user", "content": [{"type": "text", "text": "Continue."}]})
            reply_id = m.get("id")
            calls.append(len(messages))
            messages.append({"role": "assistant", "content": list(blocks)})
        else:
            if messages[-1]["role"] == "user":
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": "user", "content": list(blocks)})
    return messages, calls, tools


def ts(s: str | None) -> int | None:
    return int(datetime.fromisoformat(s).timestamp() * 1000) if s else None


def read(folder: Path, source: str):
    for run_dir in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("_")):
        txt, res, prov = run_dir / "claude-code.txt", run_dir / "result.json", run_dir / "provenance.json"
        if not (txt.exists() and res.exists() and prov.exists()):
            continue
        lines = []
        for raw in txt.read_text().splitlines():
            raw = raw.strip()
            if raw.startswith("{"):
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    continue
        result = json.loads(res.read_text())
        provenance = json.loads(prov.read_text())
        task = result.get("task_name") or run_dir.name
        messages, calls, tools = conversation(lines, task)
        model = ((result.get("agent_info") or {}).get("model_info") or {}).get("name") or "?"
        model = model.split(".")[-1].split("-v1")[0] if "anthropic." in model else model
        exc = result.get("exception_info")
        exc_type = (exc or {}).get("exception_type") if isinstance(exc, dict) else (str(exc) if exc else None)
        end = "own"
        if exc_type:
            end = "limit" if "Timeout" in exc_type else "error"
        final = next((d for d in reversed(lines) if d.get("type") == "result"), None)
        if final is None and end == "own":
            end = "error"
        reward = ((result.get("verifier_result") or {}).get("rewards") or {}).get("reward") or 0
        ex = result.get("agent_execution") or {}
        t0, t1 = ts(ex.get("started_at")), ts(ex.get("finished_at"))
        times = None
        if t0 is not None and t1 is not None and calls:
            step = (t1 - t0) / len(calls)
            times = [int(t0 + i * step) for i in range(len(calls))]
        files = provenance.get("files") or {}
        stream = files.get("agent/claude-code.txt") or {}
        rec = run_record(
            source=source,
            run=run_dir.name,
            system="Claude Code",
            model=model,
            shape="anthropic",
            task=task,
            resolved=float(reward) >= 1.0,
            end=end,
            status=exc_type or (final or {}).get("subtype") or "no result line",
            provenance={
                "repo": REPO,
                "commit": stream.get("commit"),
                "path": stream.get("path"),
                "licence": provenance.get("licence") or "none stated (no licence file in the repository)",
            },
            messages=messages,
            calls=calls,
            times_ms=times,
            body={
                "max_tokens": 32000,
                "tools": [{"name": t, "input_schema": {"type": "object"}} for t in tools],
            },
        )
        if rec:
            yield rec
