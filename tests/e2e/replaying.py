"""`loopguard replay` against real Envoy: send steps (requests with ids)
through an Envoy and record them as replay's JSON Lines with what Envoy
did to each; replay that traffic with the CLI; and check that the two agree
request by request (decision, loopguard's 429, delay, tool-loop header).
The traffic plans (a windows mix, spend caps, a slice of the real runs),
the upstream's answers by step id and the decision log serve
test_hosts_agree too, which compares the two hosts on the same traffic."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

import harness as h
from harness import CLI, ROOT

sys.path.insert(0, str(ROOT / "eval"))
import realruns  # noqa: E402


def decision_log(envoy: h.Envoy, id_header: str) -> Path:
    """Have an unstarted Envoy log, per request, the step id it carries in
    `id_header` and the decision loopguard published (filter state, the
    same key on either host); the log's path."""
    log = envoy.dir / "access.log"
    hcm = envoy.config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["access_log"] = [{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(log),
            "log_format": {"text_format_source": {
                "inline_string": f"%REQ({id_header.upper()})% %FILTER_STATE(wasm.loopguard:PLAIN)%\n"}},
        },
    }]
    return log


class Answers:
    """The upstream's answer to each step, by the step id the request
    carries in `id_header`: its `upstream_status`, its `answer` (JSON, or
    an event stream with `stream`), or a completion with its `usage` (a
    spend cap reads it); a failed status gets an error body."""

    def __init__(self, steps: list[dict], id_header: str) -> None:
        self.by_id = {s["id"]: s for s in steps}
        self.id_header = id_header

    def __call__(self, request: dict):
        return self.of(request["headers"].get(self.id_header, ""))

    def of(self, sid: str):
        s = self.by_id.get(sid, {})
        status = s.get("upstream_status", 200)
        if "answer" in s and s.get("stream"):
            # An event stream, as an MCP server on streamable HTTP answers
            # (a new Answer each time: its chunks are read once).
            event = f"event: message\ndata: {json.dumps(s['answer'])}\n\n"
            return h.Answer(status=status, headers={"content-type": "text/event-stream"}, chunks=[event])
        if "answer" in s:
            return status, s["answer"]
        if status != 200:
            return status, {"error": {"type": "server_error", "message": f"answer {status}"}}
        return 200, {**h.COMPLETION, "usage": s["usage"]} if "usage" in s else h.COMPLETION


def decisions(log: Path, ids: set[str], timeout: float) -> dict[str, object]:
    """The decision loopguard published for each request of `decision_log`,
    by step id, once every one of `ids` is logged (Envoy writes a request's
    line once its response is sent, and flushes the log every 0.2 s)."""
    def logged() -> dict[str, object]:
        out: dict[str, object] = {}
        for line in log.read_text().splitlines() if log.exists() else []:
            rid, _, state = line.partition(" ")
            out[rid] = None if state in ("-", "") else json.loads(state)
        return out

    assert h.wait_for(lambda: ids <= set(logged()), timeout=timeout), sorted(ids - set(logged()))[:5]
    return logged()


def windows_mix() -> tuple[dict, list[dict]]:
    """A generated mix and its plugin: windows that expire (2 s), a cooldown
    that outlasts the window, a throttle's escalating delay, warnings, a
    path no policy covers, and a provider's 503s with the SDK's retries,
    over several callers. Steps 0-5 reject and cool down, 6-10 repeat 1.2 s
    apart then fast, 11-16 throttle, 17-20 warn, 21-22 pass, 23-26 retry."""
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
    return plugin, steps


def spend_caps_mix() -> tuple[dict, list[dict]]:
    """Spend caps and their plugin: dollars per session (from a header or
    the body), tokens per caller, calls per conversation, a cap in shadow
    mode, and a cap beside loop detection; each step carries the usage its
    answer reports."""
    def capped(**budget) -> dict:
        return {"limit_keys": ["header:x-user"], "budget": budget}
    plugin = {
        "max_body_bytes": 1 << 20, "hold_request_headers": True, "access_log": "all",
        # $1000 / $2000 per million tokens: 200 + 100 tokens cost $0.40.
        "prices": {"e2e-model": {"input_per_million": 1000, "output_per_million": 2000}},
        "policies": [
            {"id": "capped", "spec": {"selector": {"pathPrefix": "/v1/capped", "methods": ["POST"]}, **capped(
                limits=[{"name": "session-usd", "per": "session", "window_seconds": 600, "usd": 1},
                        {"name": "caller-tokens", "per": "caller", "window_seconds": 600, "tokens": 5000},
                        {"name": "turns", "per": "conversation", "window_seconds": 600, "calls": 4}],
                warn_at=0.5, session=["header:x-session-id", "body:metadata.session_id"])}},
            {"id": "shadowed", "spec": {"selector": {"pathPrefix": "/v1/shadowed", "methods": ["POST"]}, "mode": "shadow",
                                        **capped(limits=[{"name": "calls", "per": "caller", "window_seconds": 600, "calls": 2}])}},
            {"id": "both", "spec": {"selector": {"pathPrefix": "/v1/both", "methods": ["POST"]},
                                    "loop_detection": {"enabled": True, "window_seconds": 60, "similarity": "exact",
                                                       "threshold_identical_requests": 3},
                                    **capped(limits=[{"name": "calls", "per": "caller", "window_seconds": 600, "calls": 3}])}},
        ],
    }
    steps: list[dict] = []

    def step(path: str, user: str, messages: list[str], usage: tuple[int, int], *, session: str | None = None,
             body_session: str | None = None, upstream: int = 200) -> None:
        body: dict = {"model": "e2e-model", "messages": [{"role": "user", "content": m} for m in messages]}
        if body_session:
            body["metadata"] = {"session_id": body_session}
        headers = {"x-user": user, "content-type": "application/json"}
        if session:
            headers["x-session-id"] = session
        steps.append({"id": f"cap/{len(steps)}", "method": "POST", "path": path, "headers": headers,
                      "body": json.dumps(body).encode(), "upstream_status": upstream,
                      "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}})

    # $0.40 a call in session s1: the 3rd is warned ($0.80 of $1), the 4th
    # refused; session s2 (named in the body) has its own sum.
    for i in range(4):
        step("/v1/capped/chat", "u1", [f"task {i}"], (200, 100), session="s1")
    step("/v1/capped/chat", "u1", ["task 9"], (200, 100), body_session="s2")
    # No session: 2500 tokens a call against 5000 per caller.
    for i in range(3):
        step("/v1/capped/chat", "u2", [f"question {i}"], (2000, 500))
    # One conversation, 4 calls (warned from 2), the 5th refused; a 503
    # on the way is no call.
    step("/v1/capped/chat", "u3", ["plan the trip"], (10, 5), upstream=503)
    for i in range(5):
        step("/v1/capped/chat", "u3", ["plan the trip"] + [f"leg {j}" for j in range(i + 1)], (10, 5))
    # Shadow mode: the 3rd and 4th would be refused; all are forwarded.
    for i in range(4):
        step("/v1/shadowed/chat", "s", [f"job {i}"], (10, 5))
    # A loop and a cap in one policy: the loop's 3rd repeat is refused by
    # loop detection; the other caller's 4th call by its cap.
    for i in range(4):
        step("/v1/both/chat", "loop", ["same again"], (10, 5))
        step("/v1/both/chat", "busy", [f"new {i}"], (10, 5))
    return plugin, steps


def real_runs_slice() -> tuple[dict, list[dict]]:
    """A few recorded real runs of every request shape (text actions,
    OpenAI tool calls, Anthropic tool use), a stuck one (so loopguard acts)
    and a successful one of each, as steps, with the recommended setup."""
    runs = realruns.load_runs(None)
    chosen = []
    for shape in ("chat-text", "chat-tools", "anthropic"):
        of_shape = [r for r in runs if r["shape"] == shape and len(r["calls"]) <= 40]
        stuck = [r for r in of_shape if r["labels"]["stuck"]][:1]
        ok = [r for r in of_shape if r["labels"]["successful"]][:1]
        chosen += stuck + ok
    assert len(chosen) >= 4, [r["id"] for r in chosen]
    plugin = {**realruns.plugin_of(realruns.RECOMMENDED), "access_log": "all"}
    steps = [{"id": f"{r['id']}#{k}", "method": "POST", "path": path, "headers": headers, "body": body.encode()}
             for r in chosen for k, (path, headers, body) in enumerate(realruns.requests_of(r))]
    return plugin, steps


def through_envoy(plugin: dict, steps: list[dict], tmp: Path) -> tuple[Path, dict]:
    """Send `steps` through Envoy with `plugin`; write them as replay's JSON
    Lines (with the time each was sent and the upstream's answer) and return
    the file with what Envoy did to each, by step id. A step with `usage`
    is answered with that usage, which its line records (`response.usage`);
    a failed answer to such a step is recorded with its body."""
    answers = Answers(steps, "x-replay-id")
    up = h.Upstream(answers)
    config = h.bootstrap(plugin, up.port, hold=True, buffer_limit=8 << 20)
    envoy = h.Envoy(config, concurrency=2, name="replay")
    log = decision_log(envoy, "x-replay-id")
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
                    status, body = answers.of(s["id"])
                    line["response"] = {"status": status}
                    if "usage" in s:
                        line["response"].update({"usage": s["usage"]} if status == 200 else {"body": body})
                lines.append(json.dumps(line))
        for rid, decision in decisions(log, set(seen), timeout=10).items():
            if rid in seen:
                seen[rid]["decision"] = decision
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
