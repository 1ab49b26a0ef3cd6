"""`loopguard replay` against real Envoy: send steps (requests with ids)
through an Envoy and record them as replay's JSON Lines with what Envoy
did to each; replay that traffic with the CLI; and check that the two agree
request by request (decision, loopguard's 429, delay, tool-loop header)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx

import harness as h
from harness import CLI


def through_envoy(plugin: dict, steps: list[dict], tmp: Path) -> tuple[Path, dict]:
    """Send `steps` through Envoy with `plugin`; write them as replay's JSON
    Lines (with the time each was sent and the upstream's answer) and return
    the file with what Envoy did to each, by step id. A step with `usage`
    is answered with that usage, which its line records (`response.usage`);
    a failed answer to such a step is recorded with its body."""
    statuses = {s["id"]: s.get("upstream_status", 200) for s in steps}
    usages = {s["id"]: s["usage"] for s in steps if "usage" in s}

    def answer(sid: str) -> tuple[int, dict]:
        status = statuses.get(sid, 200)
        if status == 200:
            return 200, {**h.COMPLETION, "usage": usages[sid]} if sid in usages else h.COMPLETION
        return status, {"error": {"type": "server_error", "message": f"answer {status}"}}

    def respond(request: dict) -> tuple[int, dict]:
        return answer(request["headers"].get("x-replay-id", ""))

    up = h.Upstream(respond)
    config = h.bootstrap(plugin, up.port, hold=True, buffer_limit=8 << 20)
    envoy = h.Envoy(config, concurrency=2, name="replay")
    log = envoy.dir / "access.log"
    hcm = envoy.config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["access_log"] = [{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(log),
            "log_format": {"text_format_source": {"inline_string": "%REQ(X-REPLAY-ID)% %FILTER_STATE(wasm.loopguard:PLAIN)%\n"}},
        },
    }]
    envoy.start()
    seen: dict[str, dict] = {}
    lines = []
    try:
        with httpx.Client(base_url=envoy.url, timeout=30) as client:
            for s in steps:
                if s.get("wait"):
                    time.sleep(s["wait"])  # the plan's pace: a window or cooldown passing
                headers = {**s["headers"], "x-replay-id": s["id"]}
                sent_ms = int(time.time() * 1000)
                resp = client.request(s["method"], s["path"], content=s["body"], headers=headers)
                own_429 = resp.status_code == 429 and "x-loopguard-policy" in resp.headers
                seen[s["id"]] = {
                    "status": resp.status_code if own_429 else None,
                    "delay_ms": int(resp.headers["x-loopguard-delay-ms"]) if "x-loopguard-delay-ms" in resp.headers else None,
                    "tool_loop": resp.headers.get("x-loopguard-tool-loop"),
                    "budget": resp.headers.get("x-loopguard-budget"),
                }
                line = {"timestamp": sent_ms, "method": s["method"], "path": s["path"], "headers": headers,
                        "body": s["body"].decode()}
                if not own_429:
                    line["response"] = {"status": statuses[s["id"]]}
                    if s["id"] in usages:
                        status, body = answer(s["id"])
                        line["response"].update({"usage": usages[s["id"]]} if status == 200 else {"body": body})
                lines.append(json.dumps(line))
        # Envoy writes a request's line once its response is sent, and
        # flushes the log every 0.2 s: wait for every request's line.
        logged = lambda: {e.partition(" ")[0] for e in log.read_text().splitlines()} if log.exists() else set()  # noqa: E731
        assert h.wait_for(lambda: set(seen) <= logged(), timeout=10), sorted(set(seen) - logged())[:5]
        for entry in log.read_text().splitlines():
            rid, _, state = entry.partition(" ")
            if rid in seen:
                seen[rid]["decision"] = None if state in ("-", "") else json.loads(state)
    finally:
        envoy.stop()
        up.stop()
    traffic = tmp / "traffic.jsonl"
    traffic.write_text("\n".join(lines) + "\n")
    return traffic, seen


def replayed(plugin: dict, traffic: Path, tmp: Path, report_out: dict | None = None) -> list[dict]:
    """`loopguard replay` of `traffic` with `plugin`: its verdict of each
    request, in order (and its report into `report_out`)."""
    cfg = tmp / "config.json"
    cfg.write_text(json.dumps(plugin))
    verdicts = tmp / "verdicts.jsonl"
    run = subprocess.run([CLI, "replay", "--config", str(cfg), "--json", "--verdicts", str(verdicts), str(traffic)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["inputs"]["skipped"] == 0, report["inputs"]
    if report_out is not None:
        report_out.update(report)
    return [json.loads(line) for line in verdicts.read_text().splitlines()]


def assert_agree(steps: list[dict], seen: dict, verdicts: list[dict]) -> int:
    """Every request: the same decision record, the same 429, delay and
    tool-loop header. Returns how many requests loopguard acted on."""
    assert len(verdicts) == len(steps)
    acted = 0
    for s, v in zip(steps, verdicts):
        e = seen[s["id"]]
        what = f"{s['id']}: envoy {e} / replay {v}"
        assert v["decision"] == e.get("decision"), what
        assert v["status"] == e["status"], what
        assert v["delay_ms"] == e["delay_ms"], what
        assert v["tool_loop"] == e["tool_loop"], what
        acted += v["action"] in ("warn", "throttle", "nudge", "directive", "reject")
    return acted


def corpus_steps(scenarios: list[dict]) -> list[dict]:
    """Labelled scenarios' requests as steps, each answered with the status
    its recording says."""
    steps = []
    for sc in scenarios:
        for i, req in enumerate(sc["requests"]):
            steps.append({
                "id": f"{sc['id']}/{i + 1}", "method": req["method"], "path": req["path"],
                "headers": req["headers"], "body": json.dumps(req["body"]).encode(),
                "upstream_status": req.get("response", {}).get("status", 200),
            })
    return steps
