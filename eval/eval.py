#!/usr/bin/env python3
"""Replay the labelled loop corpora through real Envoy with each shipped
detection setup and measure detection quality: the tuning corpus
(tests/corpus, the one detection was tuned on) and the held-out corpus
(tests/heldout, written apart from the detection code, never tuned on),
in separate tables.

For each setup, Envoy starts with loopguard configured as the setup says
(the one-filter setup, two workers) in front of a recording upstream, and
every scenario's requests are sent in order, as recorded. What a client or
the upstream would see is read from each response (a 429, a warn header, a
tool-loop header, a throttle delay) and from the upstream (did the request
arrive, was its body rewritten); shadow would-be actions are read from the
access log, in a second replay with the policy in shadow mode.

A loop counts as caught when it is touched at or after one turn before its
labelled turn; a touch earlier than that is a false positive. "Healthy
touched" counts scenarios (conversations) and requests of healthy traffic
with any effect.

    eval/eval.py                      both corpora, every setup, the near_similarity curve
    eval/eval.py --corpus heldout --setups recommended --per-kind 1   a quick slice

This is a measurement, not a test; tests/e2e/test_corpus.py asserts on a
small slice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import httpx  # noqa: E402

import harness as h  # noqa: E402

CORPORA = {"tuning": ROOT / "tests" / "corpus", "heldout": ROOT / "tests" / "heldout"}
WINDOW = 600


def manifest(corpus: str = "tuning") -> dict:
    return json.loads((CORPORA[corpus] / "manifest.json").read_text())


def load_scenarios(corpus: str = "tuning", per_kind: int | None = None, ids: list[str] | None = None) -> list[dict]:
    """A corpus in manifest order; `per_kind` keeps the first N of each
    (label, kind) and `ids` only those named."""
    out, seen = [], {}
    for sid in manifest(corpus)["scenarios"]:
        if ids and sid not in ids:
            continue
        sc = json.loads((CORPORA[corpus] / "scenarios" / f"{sid}.json").read_text())
        key = (sc["label"], sc["kind"])
        if per_kind is not None and seen.get(key, 0) >= per_kind:
            continue
        seen[key] = seen.get(key, 0) + 1
        out.append(sc)
    return out


# --- setups ------------------------------------------------------------------


def tool_loops(corpus: str) -> dict:
    return {"enabled": True, "exempt_tools": manifest(corpus)["exempt_tools"]}


def detection(similarity: str, threshold: int = 3, **extra) -> dict:
    return {
        "enabled": True,
        "window_seconds": WINDOW,
        "threshold_identical_requests": threshold,
        "similarity": similarity,
        **extra,
    }


def setups(corpus: str) -> dict[str, dict]:
    """Each shipped detection setup: a policy spec (selector aside)."""
    return {
        "exact": {"loop_detection": detection("exact")},
        "llm_tail": {"loop_detection": detection("llm_tail")},
        "near": {"loop_detection": detection("near")},
        "session": {"loop_detection": detection("session", threshold=20)},
        "tool_loops": {"tool_loops": tool_loops(corpus)},
        "recommended": recommended_for(corpus),
    }


def recommended() -> dict:
    """The setup the README recommends for agent traffic: the policy of the
    shipped examples/recommended/envoy.yaml, its selector aside, with the
    eval's window (no scenario's count may expire mid-replay)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "examples" / "recommended" / "envoy.yaml").read_text())
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    wasm = next(f for f in hcm["http_filters"] if f["name"] == "loopguard")
    plugin = json.loads(wasm["typed_config"]["config"]["configuration"]["value"])
    spec = dict(plugin["policies"][0]["spec"])
    spec.pop("selector", None)
    spec["loop_detection"] = {**spec["loop_detection"], "window_seconds": WINDOW}
    return spec


RECOMMENDED = recommended()


def recommended_for(corpus: str) -> dict:
    """The recommended setup as an operator of this corpus's agents would
    run it: the shipped file, with their polling tools as exempt_tools
    (each corpus names its own)."""
    spec = json.loads(json.dumps(RECOMMENDED))
    if "tool_loops" in spec:
        spec["tool_loops"]["exempt_tools"] = manifest(corpus)["exempt_tools"]
    return spec


def plugin_config(spec: dict, shadow: bool = False) -> dict:
    spec = {"selector": {"methods": ["POST"]}, **spec}
    if shadow:
        spec["mode"] = "shadow"
    return {"max_body_bytes": 4 << 20, "hold_request_headers": True, "policies": [{"id": "eval", "spec": spec}]}


# --- replay -------------------------------------------------------------------


@dataclass
class Outcome:
    """What one request met."""

    status: int
    effects: list[str]  # reject, throttle, warn, nudge, directive, tool-reject
    reached_upstream: bool
    shadow: bool = False


@dataclass
class Replayed:
    scenario: dict
    outcomes: list[Outcome] = field(default_factory=list)

    def touched(self) -> list[int]:
        """1-based turns with an effect a client or the upstream sees."""
        return [i + 1 for i, o in enumerate(self.outcomes) if o.effects]

    def shadowed(self) -> list[int]:
        return [i + 1 for i, o in enumerate(self.outcomes) if o.shadow]


def effects_of(resp: httpx.Response) -> list[str]:
    out = []
    # loopguard's own 429, not a provider's recorded one.
    if resp.status_code == 429 and "x-loopguard-policy" in resp.headers:
        body = resp.text
        out.append("tool-reject" if "tool_loop_detected" in body else "reject")
    if "x-loopguard-delay-ms" in resp.headers:
        out.append("throttle")
    if "x-loopguard-warning" in resp.headers:
        out.append("warn")
    tool = resp.headers.get("x-loopguard-tool-loop")
    if tool and resp.status_code != 429:
        out.append("tool-loop")
    return out


def access_log_filter(path: Path) -> dict:
    return {
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(path),
            "log_format": {"text_format_source": {"inline_string": "%REQ(X-EVAL-ID)% %FILTER_STATE(wasm.loopguard:PLAIN)%\n"}},
        },
    }


def replay(spec: dict, scenarios: list[dict], *, shadow: bool = False, wasm: str | None = None) -> list[Replayed]:
    """Replay `scenarios` through a fresh Envoy with `spec`."""
    if wasm:
        h.WASM = wasm
    # The provider answers each request as recorded (a corpus may record
    # 5xx and 429 answers its SDK then retried); 200 otherwise.
    recorded = {
        f"{sc['id']}/{i + 1}": req.get("response", {}).get("status", 200)
        for sc in scenarios
        for i, req in enumerate(sc["requests"])
    }

    def respond(request: dict) -> tuple[int, dict]:
        status = recorded.get(request["headers"].get("x-eval-id", ""), 200)
        if status == 200:
            return 200, h.COMPLETION
        return status, {"error": {"type": "server_error", "message": f"recorded provider answer {status}"}}

    up = h.Upstream(respond)
    config = h.bootstrap(plugin_config(spec, shadow), up.port, hold=True, buffer_limit=8 << 20)
    envoy = h.Envoy(config, concurrency=2, name="eval")
    log = envoy.dir / "access.log"
    hcm = envoy.config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["access_log"] = [access_log_filter(log)]
    envoy.start()
    results = []
    try:
        with httpx.Client(base_url=envoy.url, timeout=30) as client:
            for sc in scenarios:
                rep = Replayed(sc)
                for i, req in enumerate(sc["requests"]):
                    rid = f"{sc['id']}/{i + 1}"
                    body = json.dumps(req["body"]).encode()
                    headers = {**req["headers"], "x-eval-id": rid}
                    resp = client.request(req["method"], req["path"], content=body, headers=headers)
                    rep.outcomes.append(Outcome(resp.status_code, effects_of(resp), False))
                results.append(rep)
        arrived = {}
        with up.lock:
            for r in up.requests:
                rid = r["headers"].get("x-eval-id")
                if rid:
                    arrived[rid] = r["body"]
        # Access-log lines are flushed every 0.2 s.
        time.sleep(0.6)
        shadowed = set()
        if log.exists():
            for line in log.read_text().splitlines():
                rid, _, state = line.partition(" ")
                if '"mode":"shadow"' in state and '"action":"exempt"' not in state and '"action":"allow"' not in state:
                    shadowed.add(rid)
        for rep in results:
            sc = rep.scenario
            for i, (o, req) in enumerate(zip(rep.outcomes, sc["requests"])):
                rid = f"{sc['id']}/{i + 1}"
                o.reached_upstream = rid in arrived
                o.shadow = rid in shadowed
                if o.reached_upstream and "tool-loop" not in o.effects:
                    sent = json.loads(arrived[rid])
                    if sent != req["body"]:
                        o.effects.append("rewritten")
    finally:
        envoy.stop()
        up.stop()
    return results


# --- scoring --------------------------------------------------------------------


@dataclass
class Score:
    loops: int = 0
    caught: int = 0
    within_two: int = 0
    offsets: list[int] = field(default_factory=list)
    early: int = 0
    healthy: int = 0
    healthy_requests: int = 0
    healthy_touched: int = 0
    healthy_touched_requests: int = 0
    fp_requests: int = 0  # healthy touched + early touches in loops
    shadow_healthy: int = 0
    shadow_healthy_requests: int = 0
    loop_calls_after: int = 0
    loop_requests_after: int = 0

    def add(self, rep: Replayed) -> None:
        sc = rep.scenario
        touched = rep.touched()
        if sc["label"] == "loop":
            self.loops += 1
            label = sc["loop_turn"]
            early = [t for t in touched if t < label - 1]
            on_time = [t for t in touched if t >= label - 1]
            self.fp_requests += len(early)
            if early:
                self.early += 1
            if on_time:
                self.caught += 1
                self.offsets.append(on_time[0] - label)
                if on_time[0] <= label + 2:
                    self.within_two += 1
            after = rep.outcomes[label - 1 :]
            self.loop_requests_after += len(after)
            self.loop_calls_after += sum(o.reached_upstream for o in after)
        else:
            self.healthy += 1
            self.healthy_requests += len(rep.outcomes)
            self.healthy_touched += bool(touched)
            self.healthy_touched_requests += len(touched)
            self.fp_requests += len(touched)

    def add_shadow(self, rep: Replayed) -> None:
        if rep.scenario["label"] == "healthy":
            shadowed = rep.shadowed()
            self.shadow_healthy += bool(shadowed)
            self.shadow_healthy_requests += len(shadowed)


def score(replayed: list[Replayed], shadow: list[Replayed] | None = None) -> Score:
    s = Score()
    for rep in replayed:
        s.add(rep)
    for rep in shadow or []:
        s.add_shadow(rep)
    return s


def pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else "-"


def median(xs: list[int]) -> str:
    return f"{statistics.median(xs):+g}" if xs else "-"


def summary_table(scores: dict[str, Score]) -> str:
    head = (
        "| setup | loops caught | within 2 turns | turn vs label (median) | loops touched early | "
        "healthy conversations touched | healthy requests touched | shadow: healthy would-be (conv / req) | "
        "loop upstream calls from the label on |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for name, s in scores.items():
        rows.append(
            f"| {name} | {pct(s.caught, s.loops)} | {pct(s.within_two, s.loops)} | {median(s.offsets)} | "
            f"{s.early} | {pct(s.healthy_touched, s.healthy)} | {pct(s.healthy_touched_requests, s.healthy_requests)} | "
            f"{s.shadow_healthy} / {s.shadow_healthy_requests} | {s.loop_calls_after}/{s.loop_requests_after} |"
        )
    return head + "\n".join(rows)


def per_kind_table(per_setup: dict[str, list[Replayed]]) -> str:
    kinds: dict[tuple[str, str], list[str]] = {}
    for reps in per_setup.values():
        for rep in reps:
            sc = rep.scenario
            kinds.setdefault((sc["label"], sc["kind"]), [])
    names = list(per_setup)
    head = "| kind | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    rows = []
    for label, kind in sorted(kinds, key=lambda k: (k[0] != "loop", k[1])):
        cells = []
        for name in names:
            reps = [r for r in per_setup[name] if (r.scenario["label"], r.scenario["kind"]) == (label, kind)]
            s = score(reps)
            if label == "loop":
                cells.append(f"{s.within_two}/{s.loops}" + (f", {s.early} early" if s.early else ""))
            else:
                cells.append(f"{s.healthy_touched}/{s.healthy} touched")
        what = "caught within 2 turns" if label == "loop" else "healthy"
        rows.append(f"| {label}: {kind} ({what}) | " + " | ".join(cells) + " |")
    return head + "\n".join(rows)


def evaluate(corpus: str, args, chosen: list[str], curve: list[float]) -> dict:
    """Every chosen setup (and the near_similarity curve) on one corpus:
    prints its tables, returns every outcome."""
    scenarios = load_scenarios(corpus, args.per_kind, args.ids.split(",") if args.ids else None)
    if not scenarios:
        return {}
    all_setups = setups(corpus)
    loops = sum(sc["label"] == "loop" for sc in scenarios)
    title = {"tuning": "tuning corpus (tests/corpus: detection was tuned on it)",
             "heldout": "held-out corpus (tests/heldout: never tuned on)"}[corpus]
    print(f"## {title}: {len(scenarios)} scenarios ({loops} loops, {len(scenarios) - loops} healthy), "
          f"{sum(len(sc['requests']) for sc in scenarios)} requests; window {WINDOW} s, threshold 3 unless noted",
          flush=True)
    per_setup: dict[str, list[Replayed]] = {}
    scores: dict[str, Score] = {}
    for name in chosen:
        t0 = time.monotonic()
        reps = replay(all_setups[name], scenarios, wasm=args.wasm)
        shadow = None if args.no_shadow else replay(all_setups[name], scenarios, shadow=True, wasm=args.wasm)
        per_setup[name] = reps
        scores[name] = score(reps, shadow)
        print(f"  {name}: {time.monotonic() - t0:.0f} s", flush=True)

    print()
    print(summary_table(scores))
    print()
    print(per_kind_table(per_setup))

    if curve:
        rec_base = recommended_for(corpus)
        print()
        print(f"near_similarity curve ({corpus}): near alone (threshold 3), and the recommended setup with that near_similarity:")
        print("| near_similarity | near: loops caught within 2 turns | near: early | near: healthy conversations touched | "
              "recommended: loops caught within 2 turns | recommended: early | recommended: healthy conversations touched |")
        print("|---|---|---|---|---|---|---|")
        for x in curve:
            alone = score(replay({"loop_detection": detection("near", near_similarity=x)}, scenarios, wasm=args.wasm))
            spec = {**rec_base, "loop_detection": {**rec_base["loop_detection"], "near_similarity": x}}
            rec = score(replay(spec, scenarios, wasm=args.wasm))
            print(f"| {x:g} | {pct(alone.within_two, alone.loops)} | {alone.early} | {pct(alone.healthy_touched, alone.healthy)} | "
                  f"{pct(rec.within_two, rec.loops)} | {rec.early} | {pct(rec.healthy_touched, rec.healthy)} |", flush=True)
    print()
    return {
        name: [
            {"id": r.scenario["id"], "label": r.scenario["label"], "kind": r.scenario["kind"],
             "loop_turn": r.scenario["loop_turn"], "touched": r.touched(),
             "outcomes": [{"status": o.status, "effects": o.effects, "upstream": o.reached_upstream} for o in r.outcomes]}
            for r in reps
        ]
        for name, reps in per_setup.items()
    }


def for_replay(corpus: str, out: Path, chosen: list[str], per_kind: int | None) -> None:
    """The corpus as `loopguard replay` reads it: scenarios one after
    another, a second between turns (nothing expires in the 600 s window,
    as in the Envoy replay), each request with the provider's recorded
    answer; and each setup's configuration."""
    out.mkdir(parents=True, exist_ok=True)
    start = 1_795_000_000_000
    lines = []
    for sc in load_scenarios(corpus, per_kind=per_kind):
        for i, req in enumerate(sc["requests"]):
            lines.append(json.dumps({
                "timestamp": start, "method": req["method"], "path": req["path"],
                "headers": {**req["headers"], "x-eval-id": f"{sc['id']}/{i + 1}"},
                "body": json.dumps(req["body"]), "response": {"status": req.get("response", {}).get("status", 200)},
            }))
            start += 1000
        # Scenarios never share counts (their own API keys); a gap anyway.
        start += 10_000
    (out / f"{corpus}.jsonl").write_text("\n".join(lines) + "\n")
    for name in chosen:
        (out / f"{corpus}-{name}.json").write_text(json.dumps(plugin_config(setups(corpus)[name]), indent=1))
    print(f"{out / (corpus + '.jsonl')}: {len(lines)} requests; configurations: "
          + ", ".join(f"{corpus}-{n}.json" for n in chosen))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="tuning,heldout", help="tuning, heldout or both (comma-separated)")
    ap.add_argument("--setups", default="exact,llm_tail,near,tool_loops,session,recommended")
    ap.add_argument("--per-kind", type=int, default=None, help="replay only the first N scenarios of each kind")
    ap.add_argument("--ids", default=None, help="comma-separated scenario ids")
    ap.add_argument("--similarities", default="0.3,0.35,0.4,0.5,0.6,0.7,0.8,0.9,1",
                    help="near_similarity curve ('' to skip)")
    ap.add_argument("--no-shadow", action="store_true", help="skip the shadow replays")
    ap.add_argument("--wasm", default=None, help="the loopguard module (default: the built one)")
    ap.add_argument("--json", default=None, help="write every outcome here")
    ap.add_argument("--for-replay", default=None, metavar="DIR",
                    help="write each corpus as replay traffic (CORPUS.jsonl) with each setup's configuration "
                         "(CORPUS-SETUP.json) into DIR, for `loopguard replay`, and stop")
    args = ap.parse_args()

    corpora = [c for c in args.corpus.split(",") if c]
    bad = [c for c in corpora if c not in CORPORA]
    if bad:
        ap.error(f"unknown corpora {bad}; known: {list(CORPORA)}")
    chosen = [s for s in args.setups.split(",") if s]
    unknown = [s for s in chosen if s not in setups("tuning")]
    if unknown:
        ap.error(f"unknown setups {unknown}; known: {list(setups('tuning'))}")
    if args.for_replay:
        for corpus in corpora:
            for_replay(corpus, Path(args.for_replay), chosen, args.per_kind)
        return 0
    curve = [float(x) for x in args.similarities.split(",") if x.strip()]
    out = {corpus: evaluate(corpus, args, chosen, curve) for corpus in corpora}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
