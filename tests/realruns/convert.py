#!/usr/bin/env python3
"""Build the real-run corpus from public recordings of agent runs.

    tests/realruns/convert.py --mirror DIR            convert every source
    tests/realruns/convert.py --mirror DIR --only tau-bench
    tests/realruns/convert.py --stats                 summarise what is committed

`--mirror` is a folder holding each source repository as a bare git
directory at `<owner>+<name>/repo` (a `git clone --bare` of it will do);
the commits pinned in sources.py must be in it. The converted runs are
written to runs/<source>.jsonl.gz and their labels, split and provenance to
manifest.jsonl; the recordings themselves are not kept.

Selection (decided before loopguard saw any run): per source, every
clearly stuck run, then every successful run (label.py), then the runs in
which a harness asked the model again (a dropped reply), then the other
runs, each group in the order of their ids' SHA-256, up to the source's
cap. The split is
fixed by the id alone: `heldout` when the first byte of SHA-256(id) is 128
or more, `tune` otherwise.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import label  # noqa: E402
from formats.common import Repo  # noqa: E402
from sources import SOURCES  # noqa: E402

RUNS = HERE / "runs"
MANIFEST = HERE / "manifest.jsonl"
# Message texts at least this long that recur in a source's runs (system
# prompts, instructions, policies) are stored once per file.
SHARED_MIN = 1000
# The committed corpus's budget (runs/ in all).
BUDGET_BYTES = 24 << 20


def digest(run_id: str) -> bytes:
    return hashlib.sha256(run_id.encode()).digest()


def split_of(run_id: str) -> str:
    return "heldout" if digest(run_id)[0] >= 128 else "tune"


def reasked(run: dict) -> bool:
    """Whether a harness asked the model again in the run (a reply it
    dropped from the history, formats/common.py)."""
    return any(label.steps(run)[k][0] == "dropped" for k in range(len(run["calls"])))


def select(runs: list[dict], cap: int) -> list[dict]:
    runs = sorted(runs, key=lambda r: digest("select:" + r["id"]))
    stuck = [r for r in runs if r["_labels"]["stuck"]]
    successful = [r for r in runs if r["_labels"]["successful"] and not r["_labels"]["stuck"]]
    other = [r for r in runs if not (r["_labels"]["successful"] or r["_labels"]["stuck"])]
    again = [r for r in other if reasked(r)]
    rest = [r for r in other if not reasked(r)]
    return (stuck + successful + again + rest)[:cap]


def share(runs: list[dict]) -> tuple[dict, list[dict]]:
    """Long message texts that recur, replaced by {"$shared": key}."""
    counts = Counter()
    for r in runs:
        for m in r["messages"]:
            c = m.get("content")
            if isinstance(c, str) and len(c) >= SHARED_MIN:
                counts[c] += 1
    table = {}
    for text, n in counts.items():
        if n >= 2:
            table[hashlib.sha1(text.encode()).hexdigest()[:16]] = text
    by_text = {t: k for k, t in table.items()}
    for r in runs:
        for m in r["messages"]:
            c = m.get("content")
            if isinstance(c, str) and c in by_text:
                m["content"] = {"$shared": by_text[c]}
    return table, runs


def write_source(name: str, runs: list[dict]) -> None:
    table, runs = share(runs)
    RUNS.mkdir(exist_ok=True)
    path = RUNS / f"{name}.jsonl.gz"
    # mtime 0: the same runs give the same bytes.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write((json.dumps({"shared": table}, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
        for r in runs:
            r = {k: v for k, v in r.items() if not k.startswith("_")}
            f.write((json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n").encode())


def manifest_row(r: dict) -> dict:
    lab = r["_labels"]
    return {
        "id": r["id"],
        "source": r["source"],
        "system": r["system"],
        "model": r["model"],
        "shape": r["shape"],
        "task": r["task"],
        "split": split_of(r["id"]),
        "calls": len(r["calls"]),
        "timed": r["times_ms"] is not None,
        "outcome": r["outcome"],
        "successful": lab["successful"],
        "stuck": lab["stuck"],
        "provenance": r["provenance"],
    }


def convert(mirror: Path, only: list[str] | None) -> None:
    rows = {}
    if MANIFEST.exists():
        for line in MANIFEST.read_text().splitlines():
            row = json.loads(line)
            rows[row["id"]] = row
    for src in SOURCES:
        if only and src.name not in only:
            continue
        git_dir = mirror / src.repo.replace("/", "+") / "repo"
        repo = Repo(src.repo, str(git_dir), src.commit, src.licence)
        runs = []
        for r in src.read(repo, src.name):
            r["_labels"] = label.labels(r)
            runs.append(r)
        kept = select(runs, src.cap)
        rows = {k: v for k, v in rows.items() if v["source"] != src.name}
        for r in kept:
            rows[r["id"]] = manifest_row(r)
        write_source(src.name, kept)
        size = (RUNS / f"{src.name}.jsonl.gz").stat().st_size
        print(f"{src.name}: {len(runs)} runs read, {len(kept)} kept, {size / 1e6:.1f} MB", file=sys.stderr)
    with open(MANIFEST, "w") as f:
        for row in sorted(rows.values(), key=lambda r: r["id"]):
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in RUNS.glob("*.jsonl.gz"))
    print(f"runs/: {total / 1e6:.1f} MB of {BUDGET_BYTES / 1e6:.1f} MB", file=sys.stderr)
    if total > BUDGET_BYTES:
        sys.exit("the corpus is over its size budget: lower a source's cap")


def stats() -> None:
    rows = [json.loads(line) for line in MANIFEST.read_text().splitlines()]
    by = Counter()
    for r in rows:
        key = (r["source"], r["model"])
        by[key + ("runs",)] += 1
        by[key + ("successful",)] += r["successful"]
        by[key + ("stuck",)] += bool(r["stuck"])
        by[key + ("heldout",)] += r["split"] == "heldout"
    keys = sorted({k[:2] for k in by})
    print(f"{'source':16} {'model':32} runs successful stuck heldout")
    for k in keys:
        print(f"{k[0]:16} {k[1]:32} {by[k + ('runs',)]:4} {by[k + ('successful',)]:10} {by[k + ('stuck',)]:5} {by[k + ('heldout',)]:7}")
    print(f"total {len(rows)} runs, {len({r['system'] for r in rows})} systems, {len({r['model'] for r in rows})} models")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirror", type=Path, default=Path(os.environ.get("LOOPGUARD_TRAJ_MIRROR", "")) or None)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--stats", action="store_true")
    a = ap.parse_args()
    if a.stats:
        stats()
        return
    if not a.mirror:
        ap.error("--mirror DIR (or LOOPGUARD_TRAJ_MIRROR) is required to convert")
    convert(a.mirror, a.only)


if __name__ == "__main__":
    main()
