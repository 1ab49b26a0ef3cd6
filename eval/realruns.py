#!/usr/bin/env python3
"""Detection on real recorded agent runs (tests/realruns): every run's
requests replayed through `loopguard replay` with a configuration, at the
recorded pace and at fixed paces, and what loopguard would have done to
each run compared with its labels.

    eval/realruns.py                                   held-out split, recommended setup, every pace
    eval/realruns.py --split tune --pace 5 15          the tune split at two paces
    eval/realruns.py --config a.yaml --config b.yaml   compare configurations (one pass each pace)
    eval/realruns.py --runs-json out.json              also write every run's outcome

Each run gets its own API key (its caller), and runs are replayed one after
another with a gap longer than any window, so no two runs share a count.
A request is *touched* when loopguard would change what the client or the
model gets (warn, throttle, nudge, directive, reject); a *reject* is a
429. A successful run (resolved, ended on its own) must not be touched. A
clearly stuck run is *stopped* when one of its requests is rejected;
*within 3 calls* when the first reject is the first request that carries
the pattern (label.py) or one of the two after it, or earlier (a stuck
run stopped before its pattern is complete; how many is reported too);
"of those with 3 calls left" counts only the stuck runs that went on for
at least 3 calls from that request (a run that ended one call after its
pattern could not be stopped within 3 calls by any ladder that speaks
before it rejects). What stopping saves is
the calls left after the first reject, and their tokens (the recorded
prompt tokens where the recording has them, else the request's bytes / 4).

The numbers are what loopguard does to the recorded requests: after a
nudge or a reject the real agent would have acted differently.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "realruns"
sys.path.insert(0, str(CORPUS))

import label  # noqa: E402
from formats.common import request_messages  # noqa: E402
RECOMMENDED = ROOT / "examples" / "recommended" / "envoy.yaml"
BUDGET = ROOT / "examples" / "budget" / "envoy.yaml"
CLI = Path(os.environ.get("LOOPGUARD_CLI", ROOT / "target" / "release" / "loopguard"))
PACES = ["recorded", 2, 5, 15, 30, 60]
# Between two runs: longer than any window (86400 s is the largest).
GAP_MS = 100_000_000
TOUCHES = {"warn", "throttle", "nudge", "directive", "reject"}


def plugin_of(envoy_yaml: Path) -> dict:
    """The loopguard configuration (JSON) of an Envoy bootstrap's filter."""
    import yaml

    cfg = yaml.safe_load(Path(envoy_yaml).read_text())
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    wasm = next(f for f in hcm["http_filters"] if f["name"] == "loopguard")
    return json.loads(wasm["typed_config"]["config"]["configuration"]["value"])


def load_runs(split: str | None = None, sources: list[str] | None = None, ids: set[str] | None = None) -> list[dict]:
    """The corpus's runs (shared texts put back), in manifest order."""
    manifest = {}
    for line in (CORPUS / "manifest.jsonl").read_text().splitlines():
        row = json.loads(line)
        manifest[row["id"]] = row
    out = []
    for path in sorted((CORPUS / "runs").glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            shared = json.loads(f.readline())["shared"]
            for line in f:
                r = json.loads(line)
                row = manifest.get(r["id"])
                if row is None:
                    continue
                if split and row["split"] != split:
                    continue
                if sources and r["source"] not in sources:
                    continue
                if ids is not None and r["id"] not in ids:
                    continue
                for m in r["messages"]:
                    c = m.get("content")
                    if isinstance(c, dict) and "$shared" in c:
                        m["content"] = shared[c["$shared"]]
                r["labels"] = row
                out.append(r)
    out.sort(key=lambda r: r["id"])
    return out


def api_key(run_id: str) -> str:
    return "sk-run-" + hashlib.sha256(run_id.encode()).hexdigest()[:24]


def requests_of(run: dict) -> list[tuple[str, dict, str]]:
    """(path, headers, body) of each call: the conversation as the call sent
    it (formats/common.py's request_messages), with the fields every
    request of the run carries."""
    extra = {k: v for k, v in run["body"].items() if k not in ("model", "messages")}
    tail = "".join(
        "," + json.dumps(k) + ":" + json.dumps(v, ensure_ascii=False, separators=(",", ":")) for k, v in extra.items()
    )
    key = api_key(run["id"])
    if run["shape"] == "anthropic":
        path, headers = "/v1/messages", {"content-type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
    else:
        path, headers = "/v1/chat/completions", {"content-type": "application/json", "authorization": f"Bearer {key}"}
    head = '{"model":' + json.dumps(run["model"]) + ',"messages":['
    dumped: dict[int, str] = {}

    def dump(i: int, m: dict) -> str:
        # A message as sent is the same bytes in every request (elided
        # ones aside), dumped once.
        if m is not run["messages"][i]:
            return json.dumps(m, ensure_ascii=False, separators=(",", ":"))
        if i not in dumped:
            dumped[i] = json.dumps(m, ensure_ascii=False, separators=(",", ":"))
        return dumped[i]

    out = []
    for k, c in enumerate(run["calls"]):
        sent = request_messages(run, k)
        first = c - len(sent)
        body = ",".join(dump(first + i, m) for i, m in enumerate(sent))
        out.append((path, headers, head + body + "]" + tail + "}"))
    return out


def call_times(run: dict, pace) -> list[int] | None:
    n = len(run["calls"])
    if pace == "recorded":
        return run["times_ms"]
    return [int(i * pace * 1000) for i in range(n)]


@dataclass
class RunResult:
    run: dict
    actions: list[str] = field(default_factory=list)
    statuses: list[int | None] = field(default_factory=list)
    tool_loops: list[str | None] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    decisions: list[dict | None] = field(default_factory=list)

    def first(self, pred) -> int | None:
        return next((i for i, a in enumerate(self.actions) if pred(i, a)), None)

    def first_touch(self) -> int | None:
        return self.first(lambda i, a: a in TOUCHES)

    def first_reject(self) -> int | None:
        return self.first(lambda i, a: a == "reject" or self.statuses[i] == 429)


def write_traffic(runs: list[dict], pace, out) -> list[tuple[int, int, int]]:
    """The JSON Lines traffic of `runs` at `pace`; the (run, call, size) of
    each line, in order. Runs without recorded times are left out of the
    recorded pace."""
    lines = []
    t0 = 1_700_000_000_000
    for ri, run in enumerate(runs):
        times = call_times(run, pace)
        if times is None:
            continue
        for k, (path, headers, body) in enumerate(requests_of(run)):
            at = t0 + times[k]
            out.write(
                '{"timestamp":%d,"method":"POST","path":%s,"headers":%s,"body":%s,"response":{"status":200}}\n'
                % (at, json.dumps(path), json.dumps(headers), json.dumps(body, ensure_ascii=False))
            )
            lines.append((ri, k, len(body)))
        t0 += times[-1] + GAP_MS
    return lines


def replay(configs: list[str], runs: list[dict], pace, sets: list[str] | None = None) -> list[list[RunResult]]:
    """One `loopguard replay` pass over the runs at `pace`: per config, a
    RunResult per run (runs left out of the pace have no actions)."""
    with tempfile.TemporaryDirectory(prefix="lg-realruns-") as tmp:
        traffic = Path(tmp) / "traffic.jsonl"
        verdicts = Path(tmp) / "verdicts.jsonl"
        with open(traffic, "w") as f:
            lines = write_traffic(runs, pace, f)
        cmd = [str(CLI), "replay", "--quiet", "--json", "--verdicts", str(verdicts)]
        for c in configs:
            cmd += ["--config", c]
        for s in sets or []:
            cmd += ["--set", s]
        cmd.append(str(traffic))
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"loopguard replay failed ({p.returncode}):\n{p.stderr}")
        n_runs = max(len(configs), 1) * (len(sets[0].split("=", 1)[1].split(",")) if sets else 1)
        results = [[RunResult(r) for r in runs] for _ in range(n_runs)]
        # Lines are numbered from 1 in the order written.
        with open(verdicts) as f:
            for raw in f:
                v = json.loads(raw)
                line_no = int(v["place"].rsplit(":", 1)[1])
                ri, k, size = lines[line_no - 1]
                rr = results[v["run"]][ri]
                while len(rr.actions) <= k:
                    rr.actions.append("pass")
                    rr.statuses.append(None)
                    rr.tool_loops.append(None)
                    rr.sizes.append(0)
                    rr.decisions.append(None)
                rr.actions[k] = v["action"]
                rr.statuses[k] = v.get("status")
                rr.tool_loops[k] = v.get("tool_loop")
                rr.sizes[k] = size
                rr.decisions[k] = v.get("decision")
        return results


def prompt_tokens(run: dict, k: int, size: int) -> int:
    return max(1, size // 4)


@dataclass
class Row:
    successful: int = 0
    touched: int = 0
    rejected: int = 0
    stuck: int = 0
    stopped: int = 0
    within3: int = 0
    early: int = 0
    room: int = 0
    room_within3: int = 0
    untouched: int = 0
    # Stuck on a harness's retries (label.py's action "dropped"): counted
    # apart, left to a budget's caps.
    harness: int = 0
    harness_touched: int = 0
    deltas: list[int] = field(default_factory=list)
    burned: int = 0
    burned_stopped: int = 0
    calls_saved: int = 0
    tokens_saved: int = 0
    calls_total: int = 0
    touched_ids: list[str] = field(default_factory=list)
    rejected_ids: list[str] = field(default_factory=list)
    missed_ids: list[str] = field(default_factory=list)
    harness_ids: list[str] = field(default_factory=list)


def harness_streak(run: dict) -> bool:
    """Whether a stuck run's pattern is a harness asking again (the
    repeated action is a reply the harness dropped, label.py)."""
    stuck = run["labels"]["stuck"]
    return bool(stuck) and label.steps(run)[stuck["step"]][0] == "dropped"


def tally(results: list[RunResult]) -> dict[tuple, Row]:
    rows: dict[tuple, Row] = defaultdict(Row)
    for rr in results:
        if not rr.actions:
            continue
        lab = rr.run["labels"]
        keys = [("all",), ("system", rr.run["system"]), ("model", rr.run["system"], rr.run["model"])]
        touch, rej = rr.first_touch(), rr.first_reject()
        saved_calls = len(rr.actions) - rej - 1 if rej is not None else 0
        saved_tokens = sum(prompt_tokens(rr.run, k, rr.sizes[k]) for k in range(rej + 1, len(rr.actions))) if rej is not None else 0
        for key in keys:
            row = rows[key]
            row.calls_total += len(rr.actions)
            row.calls_saved += saved_calls
            row.tokens_saved += saved_tokens
            if lab["successful"]:
                row.successful += 1
                if touch is not None:
                    row.touched += 1
                    row.touched_ids.append(rr.run["id"])
                if rej is not None:
                    row.rejected += 1
                    row.rejected_ids.append(rr.run["id"])
            if lab["stuck"] and harness_streak(rr.run):
                row.harness += 1
                row.harness_touched += touch is not None
                row.harness_ids.append(rr.run["id"])
            elif lab["stuck"]:
                row.stuck += 1
                row.untouched += touch is None
                first = lab["stuck"]["first_call"]
                # Room to stop it within 3 calls: the run went on for 3
                # calls from the first that carries the pattern.
                room = len(rr.actions) - first >= 3
                row.room += room
                within = rej is not None and rej <= first + 2
                if rej is not None:
                    row.stopped += 1
                    row.deltas.append(rej - first)
                    row.early += rej < first
                row.within3 += within
                row.room_within3 += within and room
                if not within:
                    row.missed_ids.append(rr.run["id"])
            if not lab["stuck"] and not lab["outcome"]["resolved"] and lab["outcome"]["end"] == "limit":
                row.burned += 1
                row.burned_stopped += rej is not None
    return rows


def pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else "-"


def median(xs: list[int]) -> str:
    return f"{statistics.median(xs):+g}" if xs else "-"


HEADER = (
    "| pace | successful runs | touched | rejected | clearly stuck | stopped | within 3 calls | "
    "within 3 calls, of those with 3 calls left | never touched | first reject vs label (median) | "
    "budget-burning stopped | calls saved | tokens saved (est.) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def pace_name(p) -> str:
    return "recorded" if p == "recorded" else f"{p} s"


def line(label: str, row: Row) -> str:
    return (
        f"| {label} | {row.successful} | {pct(row.touched, row.successful)} | {pct(row.rejected, row.successful)} | "
        f"{row.stuck} | {pct(row.stopped, row.stuck)} | {pct(row.within3, row.stuck)} | "
        f"{pct(row.room_within3, row.room)} | {pct(row.untouched, row.stuck)} | {median(row.deltas)} | "
        f"{pct(row.burned_stopped, row.burned)} | {pct(row.calls_saved, row.calls_total)} | {row.tokens_saved / 1e6:.1f}M |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", help="configuration (default: examples/recommended/envoy.yaml)")
    ap.add_argument("--split", choices=["tune", "heldout", "all"], default="heldout")
    ap.add_argument("--pace", nargs="*", default=None, help="recorded and/or seconds between calls (default: all)")
    ap.add_argument("--source", nargs="*", help="only these sources")
    ap.add_argument("--set", action="append", help="PATH=V1,V2: a sweep (passed to loopguard replay)")
    ap.add_argument("--per-model", action="store_true", help="a table per agent system and model at each pace")
    ap.add_argument("--list", action="store_true", help="list the successful runs touched and the stuck runs missed")
    ap.add_argument("--show", nargs="*", help="for these run ids: every touched request, its verdict and the messages before it")
    ap.add_argument("--runs-json", type=Path, help="write every run's outcome per pace and configuration")
    a = ap.parse_args()
    configs = a.config or [str(RECOMMENDED)]
    paces = [p if p == "recorded" else float(p) for p in (a.pace or PACES)]
    paces = [int(p) if isinstance(p, float) and p.is_integer() else p for p in paces]
    runs = load_runs(None if a.split == "all" else a.split, a.source, set(a.show) if a.show else None)
    systems = sorted({r["system"] for r in runs})
    models = sorted({(r["system"], r["model"]) for r in runs})
    print(f"# Real recorded runs: {len(runs)} runs ({a.split}), {len(systems)} agent systems, {len({m for _, m in models})} models\n")
    dump = []
    per_config: dict[int, list[tuple]] = defaultdict(list)
    for pace in paces:
        results = replay(configs, runs, pace, a.set)
        for ci, res in enumerate(results):
            rows = tally(res)
            per_config[ci].append((pace, rows))
            if a.runs_json:
                for rr in res:
                    if rr.actions:
                        dump.append({"config": ci, "pace": pace, "id": rr.run["id"], "first_touch": rr.first_touch(),
                                     "first_reject": rr.first_reject(), "calls": len(rr.actions),
                                     "tool_loops": [t for t in rr.tool_loops if t]})
    if a.show:
        for pace in paces:
            for ci, res in enumerate(replay(configs, runs, pace, a.set)):
                for rr in res:
                    show(rr, pace, ci)
        return
    for ci, label in enumerate(config_labels(configs, a.set)):
        print(f"## {label}\n\n{HEADER}")
        for pace, rows in per_config[ci]:
            print(line(pace_name(pace), rows[("all",)]))
        print()
        if a.per_model:
            for pace, rows in per_config[ci]:
                print(f"### {label}, {pace_name(pace)} between calls\n")
                print(HEADER.replace("| pace |", "| agent system / model |", 1))
                for key in sorted(k for k in rows if k[0] == "model"):
                    print(line(f"{key[1]} / {key[2]}", rows[key]))
                print()
        if a.list:
            for pace, rows in per_config[ci]:
                row = rows[("all",)]
                print(f"{pace_name(pace)}: successful touched: {' '.join(row.touched_ids) or '-'}")
                print(f"{pace_name(pace)}: successful rejected: {' '.join(row.rejected_ids) or '-'}")
                print(f"{pace_name(pace)}: stuck not stopped within 3 calls: {' '.join(row.missed_ids) or '-'}")
            print()
        harness_report(runs, per_config[ci])
    if a.runs_json:
        a.runs_json.write_text(json.dumps(dump))


def harness_report(runs: list[dict], per_pace: list[tuple]) -> None:
    """The stuck runs whose pattern is a harness asking again, counted apart
    from the clearly stuck: what loopguard did to them at each pace, and
    what the spend caps of examples/budget/ would have saved them (their
    calls replayed through it, 15 s apart)."""
    ids = set()
    for _, rows in per_pace:
        ids.update(rows[("all",)].harness_ids)
    if not ids:
        return
    print("Stuck on a harness's retries (counted apart; a budget's caps, not a 429, are for them):\n")
    for pace, rows in per_pace:
        row = rows[("all",)]
        print(f"- {pace_name(pace)}: {row.harness} runs, {row.harness_touched} touched by the recommended setup")
    chosen = [r for r in runs if r["id"] in ids]
    for rr in replay([str(BUDGET)], chosen, 15)[0]:
        rej = rr.first_reject()
        saved = len(rr.actions) - rej - 1 if rej is not None else 0
        where = f"capped at call {rej} of {len(rr.actions)}, {saved} calls saved" if rej is not None else f"never capped ({len(rr.actions)} calls)"
        print(f"- {rr.run['id']} ({rr.run['model']}) through {BUDGET.relative_to(ROOT)}: {where}")
    print()


def show(rr: RunResult, pace, ci: int) -> None:
    """Every touched request of a run: its verdict and the messages since
    the reply before it."""
    run = rr.run
    print(f"== {run['id']} (config {ci}, {pace_name(pace)}): {len(rr.actions)} calls, labels {json.dumps({k: run['labels'][k] for k in ('successful', 'stuck')})}")
    for k, a in enumerate(rr.actions):
        if a not in TOUCHES:
            continue
        c = run["calls"][k]
        prev = max((x for x in run["calls"] if x < c), default=max(0, c - 3))
        print(f"-- call {k}: {a} {rr.tool_loops[k] or ''} {json.dumps(rr.decisions[k])[:400]}")
        for m in run["messages"][max(prev - 1, 0):c]:
            text = m.get("content")
            if not isinstance(text, str):
                text = json.dumps(text, ensure_ascii=False)
            calls = m.get("tool_calls")
            extra = " " + json.dumps([(t["function"]["name"], t["function"]["arguments"][:150]) for t in calls]) if calls else ""
            print(f"   [{m['role']}] {(text or '')[:500]!r}{extra}")


def config_labels(configs: list[str], sets: list[str] | None) -> list[str]:
    labels = []
    for c in configs:
        name = os.path.relpath(c, ROOT)
        if sets:
            path, values = sets[0].split("=", 1)
            labels += [f"{name} with {path}={v}" for v in values.split(",")]
        else:
            labels.append(name)
    return labels


if __name__ == "__main__":
    main()
