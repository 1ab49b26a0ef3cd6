"""mini-swe-agent 2.x trajectories (`.traj.json`) in tool-calling mode:
`messages` is the OpenAI Chat conversation (a `bash` tool called through
`tool_calls`, answered by `tool` messages), each model reply carrying the
provider's raw response (`extra.response`, with its `created` time) and
each observation its time (`extra.timestamp`). The run ends with an
`exit` message. A reply without tool calls, or whose calls do not parse,
raises a FormatError: the reply is left out of `messages` and a user
message with the error (`extra.interrupt_type` "FormatError") is appended
instead, so its call is a dropped reply (formats/common.py), cut before
that message; its time is not recorded. The outcome is the SWE-bench
harness's report (`resolved_ids`); `info.exit_status` says how it ended
(`Submitted` on its own, `LimitsExceeded` at the step or cost limit, an
exception otherwise).
"""

from __future__ import annotations

from .common import Repo, run_record, tools_named


def end_of(status: str) -> str:
    if status == "Submitted":
        return "own"
    if status in ("LimitsExceeded", "ContextWindowExceeded", "CostLimitExceeded", "StepLimitExceeded"):
        return "limit"
    return "error"


def clean(m: dict) -> dict | None:
    """A message as the agent sends it back to the model: the provider's
    and the harness's bookkeeping dropped."""
    role = m.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        return None
    out = {"role": role, "content": m.get("content")}
    if role == "assistant" and m.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": {
                "name": (c.get("function") or {}).get("name"),
                "arguments": (c.get("function") or {}).get("arguments"),
            }}
            for c in m["tool_calls"]
        ]
    if role == "tool":
        out["tool_call_id"] = m.get("tool_call_id")
    return out


def replaces_reply(m: dict, before: list[dict]) -> bool:
    """Whether `m` is a FormatError's correction standing in for the reply
    the harness dropped (after a kept reply it would be an observation)."""
    return (
        (m.get("extra") or {}).get("interrupt_type") == "FormatError"
        and bool(before)
        and before[-1]["role"] != "assistant"
    )


def call_time(m: dict) -> float | None:
    extra = m.get("extra") or {}
    created = (extra.get("response") or {}).get("created")
    return float(created) if created else extra.get("timestamp")


def read(repo: Repo, source: str, model: str, out_dir: str, report_path: str, run_prefix: str):
    report = repo.json(report_path)
    resolved = set(report.get("resolved_ids") or [])
    submitted = set(report.get("submitted_ids") or []) | set(report.get("completed_ids") or [])
    for path in repo.ls(out_dir):
        if not path.endswith(".traj.json"):
            continue
        try:
            d = repo.json(path)
        except Exception:  # noqa: BLE001 (a file the snapshot lacks: over its size limit)
            continue
        task = d.get("instance_id") or path.rsplit("/", 2)[-2]
        info = d.get("info") or {}
        status = info.get("exit_status") or "missing"
        messages, calls, times, names = [], [], [], []
        for m in d.get("messages") or []:
            c = clean(m)
            if c is None:
                continue
            if c["role"] == "assistant" and messages:
                calls.append(len(messages))
                t = call_time(m)
                times.append(int(t * 1000) if t else None)
                names += [tc["function"]["name"] for tc in c.get("tool_calls") or []]
            elif replaces_reply(m, messages):
                calls.append(len(messages))
                times.append(None)
            messages.append(c)
        if any(t is None for t in times):
            times = None
        rec = run_record(
            source=source,
            run=f"{run_prefix}{task}",
            system=f"mini-swe-agent {info.get('mini_version', '2')}",
            model=model,
            shape="chat-tools",
            task=task,
            resolved=task in resolved,
            end=end_of(status) if task in submitted or status != "Submitted" else "error",
            status=status,
            provenance=repo.provenance(path),
            messages=messages,
            calls=calls,
            times_ms=times,
            body={"tools": tools_named(names)},
        )
        if rec:
            yield rec
