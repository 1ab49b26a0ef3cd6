"""τ-bench and τ²-bench: a customer-service agent with native tool calls
talking to a simulated user (another model), in OpenAI Chat shape.

τ-bench (`historical_trajectories/*.json`): a list of runs, each with its
`reward` (1.0: the task's database state and outputs are right) and `traj`,
the conversation as sent, system prompt first. A conversation ends on its
own when the simulated user says `###STOP###` or the agent transfers
the user to a human; otherwise it ran into the step limit (30).

τ²-bench (`data/simulations/*.json`, results files): `simulations`, each
with `reward_info.reward`, a `termination_reason` (`user_stop`,
`agent_stop`: on its own; `max_steps`: the limit; `too_many_errors`) and
`messages` with a timestamp each (the simulated user's own tool calls and
their results, in the telecom domain, are left out: the agent never sees
them). The system prompt is not recorded: it is
rebuilt from the domain policy the file records, with an instruction of our
own wording (the same for every run).
"""

from __future__ import annotations

import json
from datetime import datetime

from .common import Repo, calls_before_replies, run_record, tools_named

TAU2_INSTRUCTION = (
    "You are a customer service agent. Help the user as the policy below says. "
    "In each turn either send a message to the user or make a tool call, not both."
)


def tau1_end(traj: list[dict]) -> str:
    # A transfer to a human agent ends the conversation too.
    calls = [c for m in traj for c in m.get("tool_calls") or []]
    if calls and (calls[-1].get("function") or {}).get("name") == "transfer_to_human_agents" and traj[-1].get("role") == "tool":
        return "own"
    for m in reversed(traj):
        if m.get("role") == "user":
            return "own" if "###STOP###" in (m.get("content") or "") else "limit"
    return "limit"


def tau1_clean(m: dict) -> dict:
    out = {"role": m["role"], "content": m.get("content")}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": dict(c["function"])} for c in m["tool_calls"]
        ]
    if m["role"] == "tool":
        out["tool_call_id"] = m.get("tool_call_id")
        out["name"] = m.get("name")
    return out


def read_tau1(repo: Repo, source: str, model: str, path: str):
    runs = repo.json(path)
    for r in runs:
        traj = [tau1_clean(m) for m in r["traj"]]
        names = [c["function"]["name"] for m in traj for c in m.get("tool_calls") or []]
        run = f"task{r['task_id']}-trial{r.get('trial', 0)}"
        rec = run_record(
            source=source,
            run=run,
            system="tau-bench tool-calling agent",
            model=model,
            shape="chat-tools",
            task=f"airline/{r['task_id']}",
            resolved=float(r.get("reward") or 0) >= 1.0,
            end=tau1_end(r["traj"]),
            status=f"reward {r.get('reward')}",
            provenance=repo.provenance(path),
            messages=traj,
            calls=calls_before_replies(traj),
            body={"tools": tools_named(names)},
        )
        if rec:
            yield rec


def tau2_end(reason: str) -> str:
    reason = (reason or "").lower().split(".")[-1]
    if reason in ("user_stop", "agent_stop"):
        return "own"
    if reason == "max_steps":
        return "limit"
    return "error"


def ms(ts: str | None) -> int | None:
    if not ts:
        return None
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


def tau2_messages(policy: str, msgs: list[dict]) -> tuple[list[dict], list[int], list[int] | None, list[str]]:
    system = {"role": "system", "content": f"<instructions>\n{TAU2_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"}
    out, calls, times, names = [system], [], [], []
    prev_ts = None
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "assistant":
            # The opening greeting is the orchestrator's, not a model call.
            if i > 0:
                calls.append(len(out))
                times.append(ms(prev_ts) if prev_ts else ms(m.get("timestamp")))
            c = {"role": "assistant", "content": m.get("content")}
            if m.get("tool_calls"):
                c["tool_calls"] = [
                    {"id": t.get("id"), "type": "function", "function": {
                        "name": t.get("name"),
                        "arguments": json.dumps(t.get("arguments"), separators=(",", ":"))
                        if not isinstance(t.get("arguments"), str) else t.get("arguments"),
                    }}
                    for t in m["tool_calls"]
                ]
                names += [t.get("name") for t in m["tool_calls"]]
            out.append(c)
        elif role == "user":
            # The simulated user's own tool calls (telecom: the user acts on
            # their phone) are not the agent's to see: only what they say.
            if m.get("content") is not None or not m.get("tool_calls"):
                out.append({"role": "user", "content": m.get("content")})
        elif role == "tool" and m.get("requestor", "assistant") == "assistant":
            out.append({"role": "tool", "tool_call_id": m.get("id"), "content": m.get("content")})
        prev_ts = m.get("timestamp") or prev_ts
    if any(t is None for t in times):
        times = None
    return out, calls, times, names


def read_tau2(repo: Repo, source: str, path: str, rev: str | None = None, seen: set | None = None):
    d = repo.json(path, rev)
    info = d.get("info") or {}
    llm = ((info.get("agent_info") or {}).get("llm") or "unknown").split("/")[-1]
    env = info.get("environment_info") or {}
    policy = env.get("policy") or ""
    domain = env.get("domain_name") or "?"
    for s in d.get("simulations") or []:
        sid = s.get("id")
        if seen is not None:
            if sid in seen:
                continue
            seen.add(sid)
        messages, calls, times, names = tau2_messages(policy, s.get("messages") or [])
        reward = (s.get("reward_info") or {}).get("reward") or 0
        rec = run_record(
            source=source,
            run=f"{domain}/{s.get('task_id')}/{sid}",
            system="tau2-bench LLM agent",
            model=llm,
            shape="chat-tools",
            task=f"{domain}/{s.get('task_id')}",
            resolved=float(reward) >= 1.0,
            end=tau2_end(s.get("termination_reason")),
            status=str(s.get("termination_reason")),
            provenance=repo.provenance(path, rev),
            messages=messages,
            calls=calls,
            times_ms=times,
            body={"tools": tools_named(names)},
        )
        if rec:
            yield rec
