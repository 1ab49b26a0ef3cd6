"""`loopguard replay` gives exactly the filter's verdicts.

The same requests go through a real Envoy (two workers, the recommended
setup or a mix of policies) and, recorded as JSON Lines with the times they
were sent, through `loopguard replay` with the same configuration. For every
request the decision the filter published (Envoy's access log prints it from
filter state) must equal the one replay computed, and so must what the
client saw: loopguard's 429, a throttle's delay, the tool-loop header.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import harness as h
from harness import ROOT

sys.path.insert(0, str(ROOT / "eval"))
import eval as corpus  # noqa: E402

CLI = os.environ.get("LOOPGUARD_CLI", str(ROOT / "target" / "release" / "loopguard"))


def through_envoy(plugin: dict, steps: list[dict], tmp: Path) -> tuple[Path, dict]:
    """Send `steps` through Envoy with `plugin`; write them as replay's JSON
    Lines (with the time each was sent and the upstream's answer) and return
    the file with what Envoy did to each, by step id."""
    statuses = {s["id"]: s.get("upstream_status", 200) for s in steps}

    def respond(request: dict) -> tuple[int, dict]:
        status = statuses.get(request["headers"].get("x-replay-id", ""), 200)
        if status == 200:
            return 200, h.COMPLETION
        return status, {"error": {"type": "server_error", "message": f"answer {status}"}}

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
                    time.sleep(s["wait"])
                headers = {**s["headers"], "x-replay-id": s["id"]}
                sent_ms = int(time.time() * 1000)
                resp = client.request(s["method"], s["path"], content=s["body"], headers=headers)
                own_429 = resp.status_code == 429 and "x-loopguard-policy" in resp.headers
                seen[s["id"]] = {
                    "status": resp.status_code if own_429 else None,
                    "delay_ms": int(resp.headers["x-loopguard-delay-ms"]) if "x-loopguard-delay-ms" in resp.headers else None,
                    "tool_loop": resp.headers.get("x-loopguard-tool-loop"),
                }
                line = {"timestamp": sent_ms, "method": s["method"], "path": s["path"], "headers": headers,
                        "body": s["body"].decode()}
                if not own_429:
                    line["response"] = {"status": statuses[s["id"]]}
                lines.append(json.dumps(line))
        time.sleep(0.6)  # access-log lines are flushed every 0.2 s
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


def replayed(plugin: dict, traffic: Path, tmp: Path) -> list[dict]:
    cfg = tmp / "config.json"
    cfg.write_text(json.dumps(plugin))
    verdicts = tmp / "verdicts.jsonl"
    run = subprocess.run([CLI, "replay", "--config", str(cfg), "--json", "--verdicts", str(verdicts), str(traffic)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["inputs"]["skipped"] == 0, report["inputs"]
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
    steps = []
    for sc in scenarios:
        for i, req in enumerate(sc["requests"]):
            steps.append({
                "id": f"{sc['id']}/{i + 1}", "method": req["method"], "path": req["path"],
                "headers": req["headers"], "body": json.dumps(req["body"]).encode(),
                "upstream_status": req.get("response", {}).get("status", 200),
            })
    return steps


@pytest.mark.parametrize("name", ["tuning", "heldout"])
def test_replay_agrees_with_envoy_on_the_labelled_corpus(name, tmp_path):
    """The first scenario of every kind, recommended setup (near mode, tool
    loops with their ladder, retries after recorded provider errors)."""
    plugin = {**corpus.plugin_config(corpus.recommended_for(name)), "access_log": "all"}
    steps = corpus_steps(corpus.load_scenarios(name, per_kind=1))
    traffic, seen = through_envoy(plugin, steps, tmp_path)
    acted = assert_agree(steps, seen, replayed(plugin, traffic, tmp_path))
    # Not a vacuous agreement: loops were caught along the way.
    assert acted >= 6, acted


def test_replay_agrees_with_envoy_on_windows_cooldowns_and_actions(tmp_path):
    """A generated mix: windows that expire (2 s), a cooldown that outlasts
    the window, a throttle's escalating delay, warnings, an exempt path and
    a retry after a 503, over several callers."""
    def spec(prefix: str, **detection) -> dict:
        return {"selector": {"pathPrefix": prefix, "methods": ["POST"]}, "limit_keys": ["header:x-user"],
                "loop_detection": {"enabled": True, "window_seconds": 2, "similarity": "exact", **detection}}
    plugin = {
        "max_body_bytes": 1 << 20, "hold_request_headers": True, "access_log": "all",
        "policies": [
            {"id": "reject", "spec": spec("/v1/reject", threshold_identical_requests=3, action="reject", cooldown_seconds=3)},
            {"id": "throttle", "spec": spec("/v1/throttle", threshold_identical_requests=2, action="throttle",
                                            throttle_step_ms=50, throttle_max_delay_ms=200)},
            {"id": "warn", "spec": spec("/v1/warn", threshold_identical_requests=2, action="warn")},
        ],
    }

    def step(i: int, path: str, user: str, body: str, wait: float = 0.0, upstream: int = 200) -> dict:
        return {"id": f"mix/{i}", "method": "POST", "path": path, "headers": {"x-user": user, "content-type": "application/json"},
                "body": body.encode(), "wait": wait, "upstream_status": upstream}

    plan = [
        # Three in a row: the third is rejected; the cooldown holds after
        # the window has gone (2.5 s later), and ends (3.5 s after that).
        ("/v1/reject", "a", "{}", 0), ("/v1/reject", "a", "{}", 0), ("/v1/reject", "a", "{}", 0),
        ("/v1/reject", "b", "{}", 0), ("/v1/reject", "a", "{}", 2.5), ("/v1/reject", "a", "{}", 3.5),
        # Repeats 1.2 s apart: never three in a 2 s window... then fast.
        ("/v1/reject", "c", "{\"x\":1}", 0), ("/v1/reject", "c", "{\"x\":1}", 1.2), ("/v1/reject", "c", "{\"x\":1}", 1.2),
        ("/v1/reject", "c", "{\"x\":1}", 0), ("/v1/reject", "c", "{\"x\":1}", 0),
        # Throttle: delays step up and cap.
        ("/v1/throttle", "a", "{}", 0), ("/v1/throttle", "a", "{}", 0), ("/v1/throttle", "a", "{}", 0),
        ("/v1/throttle", "a", "{}", 0), ("/v1/throttle", "a", "{}", 0), ("/v1/throttle", "a", "{}", 0),
        # Warn, then the window expires and counting starts again.
        ("/v1/warn", "a", "{}", 0), ("/v1/warn", "a", "{}", 0), ("/v1/warn", "a", "{}", 2.5), ("/v1/warn", "a", "{}", 0),
        # No policy for this path.
        ("/v1/other", "a", "{}", 0), ("/v1/other", "a", "{}", 0),
    ]
    steps = [step(i, *p) for i, p in enumerate(plan)]
    # A provider error, then the SDK's retry of the same body: forgiven.
    steps += [step(100, "/v1/reject", "d", "{\"r\":1}", 0, 503), step(101, "/v1/reject", "d", "{\"r\":1}", 0, 503),
              step(102, "/v1/reject", "d", "{\"r\":1}", 0), step(103, "/v1/reject", "d", "{\"r\":1}", 0)]
    traffic, seen = through_envoy(plugin, steps, tmp_path)
    verdicts = replayed(plugin, traffic, tmp_path)
    assert_agree(steps, seen, verdicts)
    actions = [v["action"] for v in verdicts]
    # The plan did what it says (so the agreement is about something).
    assert actions[:6] == ["allow", "allow", "reject", "allow", "reject", "allow"], actions[:6]
    assert actions[6:11] == ["allow", "allow", "allow", "reject", "reject"], actions[6:11]
    assert [v["delay_ms"] for v in verdicts[11:17]] == [None, 100, 150, 200, 200, 200]
    assert actions[17:21] == ["allow", "warn", "allow", "warn"]
    assert actions[21:23] == ["pass", "pass"]
    assert actions[23:] == ["allow", "allow", "allow", "allow"], actions[23:]
