"""What every format reader builds: a run, the requests its agent sent its
model, kept as one conversation and the places where each call cut it.

A run record (one JSON line in runs/<source>.jsonl.gz):

    id          "<source>/<run>", unique; its SHA-256 picks the split
    source      which collection it came from (sources.py)
    system      the agent system ("SWE-agent 0.x", "Claude Code", ...)
    model       the model the agent called
    shape       "chat-text"   OpenAI Chat, actions written in the reply text
                "chat-tools"  OpenAI Chat with native tool_calls
                "anthropic"   Anthropic Messages with tool_use blocks
    task        the benchmark task
    outcome     {"resolved": bool, "end": "own" | "limit" | "error",
                 "status": what the harness recorded}
    provenance  {"repo", "commit", "path", "licence"}
    body        the fields every request carries besides the conversation
                (Anthropic: system, tools; OpenAI: tools)
    messages    the whole conversation as the last call sent it (plus the
                last reply)
    calls       request k sends messages[:calls[k]] (see threads and elide;
                request_messages() gives what it sent), in the order they
                were made; messages[calls[k]] is its reply. A reply the
                harness dropped from the history (unusable: it asked again)
                is not in messages: messages[calls[k]] is then what the
                harness appended next (its correction, a user message), or
                calls[k] is the thread's end when nothing followed. So a
                reply was dropped iff messages[calls[k]] is no assistant
                message or lies past the thread
    threads     (multi-agent runs) where each sub-agent's conversation
                starts in messages: request k then sends
                messages[s:calls[k]], s the last start before calls[k]
    elide       (absent when the harness elided nothing) how each request
                shortened old observations: {"role": R, "first": F,
                "last": L, "text": T}: of the messages of role R a request
                sends, all but the first F and the last L carry T instead
                of their (string) content, "{lines}" in T the number of
                lines replaced (str.splitlines())
    times_ms    when each call was made, ms from the run's first call, or
                null when the recording has no times
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass


@dataclass
class Repo:
    """A fetched repository (a bare git directory) at a pinned commit."""

    name: str  # owner/name
    git_dir: str
    commit: str
    licence: str

    def show(self, path: str, rev: str | None = None) -> bytes:
        return subprocess.run(
            ["git", "-C", self.git_dir, "show", f"{rev or self.commit}:{path}"],
            check=True,
            capture_output=True,
        ).stdout

    def json(self, path: str, rev: str | None = None):
        return json.loads(self.show(path, rev))

    def ls(self, under: str, rev: str | None = None) -> list[str]:
        out = subprocess.run(
            ["git", "-C", self.git_dir, "ls-tree", "-r", "--name-only", rev or self.commit, under],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return [p for p in out.splitlines() if p]

    def provenance(self, path: str, rev: str | None = None) -> dict:
        return {"repo": self.name, "commit": rev or self.commit, "path": path, "licence": self.licence}


def json_files(repo: Repo, under: str, suffix: str):
    """(path, name without the suffix, parsed JSON) of each file under
    `under` ending in `suffix`; a file the snapshot lacks (over its size
    limit) is passed over."""
    for path in repo.ls(under):
        if not path.endswith(suffix):
            continue
        try:
            d = repo.json(path)
        except Exception:  # noqa: BLE001 (a file the snapshot lacks)
            continue
        yield path, path.rsplit("/", 1)[-1][: -len(suffix)], d


def calls_before_replies(messages: list[dict], reply_role: str = "assistant") -> list[int]:
    """Each model reply in `messages` was the answer to a call that sent
    everything before it."""
    return [i for i, m in enumerate(messages) if m.get("role") == reply_role and i > 0]


def run_record(
    *,
    source: str,
    run: str,
    system: str,
    model: str,
    shape: str,
    task: str,
    resolved: bool,
    end: str,
    status: str,
    provenance: dict,
    messages: list[dict],
    calls: list[int],
    times_ms: list[int] | None = None,
    body: dict | None = None,
    threads: list[int] | None = None,
    elide: dict | None = None,
) -> dict | None:
    """A run record, or None when the recording holds no model call."""
    if not calls:
        return None
    assert end in ("own", "limit", "error"), end
    assert shape in ("chat-text", "chat-tools", "anthropic"), shape
    if times_ms is not None:
        assert len(times_ms) == len(calls), (run, len(times_ms), len(calls))
        t0 = times_ms[0]
        times_ms = [max(0, t - t0) for t in times_ms]
        # A recording's clock never runs backwards between calls.
        for i in range(1, len(times_ms)):
            times_ms[i] = max(times_ms[i], times_ms[i - 1])
    rec = {
        "id": f"{source}/{run}",
        "source": source,
        "system": system,
        "model": model,
        "shape": shape,
        "task": task,
        "outcome": {"resolved": bool(resolved), "end": end, "status": status},
        "provenance": provenance,
        "body": body or {},
        "messages": messages,
        "calls": calls,
        "times_ms": times_ms,
    }
    if threads and threads != [0]:
        rec["threads"] = threads
    if elide:
        rec["elide"] = elide
    return rec


def thread_start(run: dict, at: int) -> int:
    """Where the conversation holding message `at` starts."""
    return max((s for s in run.get("threads") or [0] if s <= at), default=0)


def request_messages(run: dict, k: int) -> list[dict]:
    """The messages request k sent: its thread's messages before calls[k],
    old observations elided as the run's `elide` says (a run as
    eval/realruns.py loads it, its shared texts put back)."""
    end = run["calls"][k]
    sent = run["messages"][thread_start(run, end - 1) : end]
    e = run.get("elide")
    if not e:
        return sent
    at = [i for i, m in enumerate(sent) if m["role"] == e["role"]]
    for i in at[e["first"] : max(0, len(at) - e["last"])]:
        sent[i] = {**sent[i], "content": e["text"].replace("{lines}", str(len(sent[i]["content"].splitlines())))}
    return sent


def thread_end(run: dict, at: int) -> int:
    """Where the conversation holding message `at` ends (exclusive)."""
    return min((s for s in run.get("threads") or [] if s > at), default=len(run["messages"]))


def tools_named(names: list[str]) -> list[dict]:
    """An OpenAI `tools` array naming the tools a run called. The
    recordings do not keep the schemas the agent sent; a request without
    its tools would not be the request an agent sends, so each is declared
    with an open parameter schema."""
    return [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in sorted(set(names))
    ]
