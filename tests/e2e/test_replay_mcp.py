"""MCP traffic recorded in front of a real Envoy running examples/mcp/envoy.yaml
and replayed with `loopguard replay`: the verdicts agree with what Envoy did,
request by request.

Real MCP clients (the official Python SDK: one on protocol 2026-07-28,
stateless with JSON results; one on 2025-11-25, with a session and results as
event streams) call the real MCP server (mcp_apps/server.py) through the
shipped MCP example. Envoy's own tap filter (examples/tap's, matching /mcp),
placed before loopguard, writes one trace per request with the exact bytes
and time the client sent, and the response as the client got it (loopguard's
note in it, loopguard's own answers). Envoy's access log prints, per
x-request-id, the decision loopguard published (filter state).

The traces are replayed as they are, and as JSON Lines and HAR made from
them, with the example's own file as the configuration: every request gets
the decision Envoy's filter published, loopguard's own answers match (status
and x-loopguard-mcp-loop), and a note is inserted exactly where Envoy
inserted one. The loops are real (the 3rd identical call noted, the 4th
blocked, failing calls too) and the polling calls are never touched.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
from pathlib import Path


from harness import CLI, ROOT, load_yaml, localize, wait_for
from mcp_agents import run_client

EXAMPLE = ROOT / "examples" / "mcp" / "envoy.yaml"
TAP_EXAMPLE = ROOT / "examples" / "tap" / "envoy.yaml"
NOTE = "[loopguard] Note:"


def http_filters(cfg: dict) -> list:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]


def hcm(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def tap_filter(out: Path) -> dict:
    """examples/tap's filter, capturing /mcp into `out`."""
    (tap,) = [f for f in http_filters(load_yaml(TAP_EXAMPLE)) if f["name"] == "envoy.filters.http.tap"]
    tap = copy.deepcopy(tap)
    static = tap["typed_config"]["common_config"]["static_config"]
    static["match"]["http_request_headers_match"]["headers"][0]["string_match"] = {"prefix": "/mcp"}
    static["output_config"]["sinks"][0]["file_per_tap"]["path_prefix"] = str(out / "trace")
    return tap


def client(url: str, script: list, mode: str, key: str) -> list[dict]:
    """The Python SDK client in `mode` as the caller `sk-<key>`: its output
    line of each step."""
    return list(run_client(f"python-{mode}", url, script, key).values())


def search(q: str, progress: bool = False) -> dict:
    return {"call": "search", "args": {"query": q}, "progress": progress}


# 2026-07-28, stateless, JSON results: the 3rd search noted, the 4th blocked.
MODERN = [search("envoy"), search("envoy"), search("envoy"), search("envoy"), {"call": "weather", "args": {"city": "Paris"}}]
# 2025-11-25 with a session, results as event streams: polls (a result that
# moves) six times, the same search four times (a fresh progressToken each
# time), a failing call four times.
LEGACY = (
    [{"call": "poll", "args": {"job": "build-7"}}] * 6
    + [search("wasm", progress=True)] * 4
    + [{"call": "fail", "args": {"path": "/etc/shadow"}}] * 4
)


def traces(out: Path) -> list[Path]:
    """The trace files in the order their requests arrived (Envoy names
    them by a random trace id)."""
    return sorted(out.iterdir(), key=lambda f: trace_of(f)["request"]["headers_received_time"])


def trace_of(f: Path) -> dict:
    return json.loads(f.read_text())["http_buffered_trace"]


def headers(message: dict) -> dict[str, str]:
    return {h["key"].lower(): h.get("value", "") for h in message.get("headers", [])}


def body(message: dict) -> bytes:
    return base64.b64decode(message.get("body", {}).get("as_bytes", ""))


def recorded(out: Path) -> dict[str, dict]:
    """Per trace file: the request and what the client got."""
    got = {}
    for f in traces(out):
        t = trace_of(f)
        req, resp = headers(t["request"]), headers(t.get("response", {}))
        got[f.name] = {
            "request_id": req.get("x-request-id"),
            "method": req[":method"],
            "body": body(t["request"]),
            "status": int(resp.get(":status", "0")),
            "own": "x-loopguard-policy" in resp,
            "mcp_loop": resp.get("x-loopguard-mcp-loop"),
            "noted": NOTE.encode() in body(t.get("response", {})),
        }
    return got


def replay(traffic: Path, tmp: Path, name: str) -> tuple[dict, list[dict]]:
    verdicts = tmp / f"{name}.verdicts.jsonl"
    run = subprocess.run(
        [CLI, "replay", "--config", str(EXAMPLE), "--json", "--verdicts", str(verdicts), str(traffic)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    return report, [json.loads(line) for line in verdicts.read_text().splitlines()]


def as_jsonl(out: Path) -> str:
    """The traces as replay's JSON Lines (the response's content type and
    body kept as text)."""
    lines = []
    for f in traces(out):
        t = trace_of(f)
        req, resp = headers(t["request"]), headers(t.get("response", {}))
        line = {
            "timestamp": t["request"]["headers_received_time"],
            "method": req[":method"],
            "path": req[":path"],
            "headers": {k: v for k, v in req.items() if not k.startswith(":")},
            "body": body(t["request"]).decode(),
        }
        if resp:
            line["response"] = {"status": int(resp[":status"]), "body": body(t["response"]).decode()}
            if "content-type" in resp:
                line["response"]["content_type"] = resp["content-type"]
        lines.append(json.dumps(line))
    return "\n".join(lines) + "\n"


def as_har(out: Path) -> str:
    entries = []
    for f in traces(out):
        t = trace_of(f)
        req, resp = headers(t["request"]), headers(t.get("response", {}))
        text = body(t.get("response", {})).decode()
        entries.append({
            "startedDateTime": t["request"]["headers_received_time"],
            "request": {
                "method": req[":method"],
                "url": f"http://{req[':authority']}{req[':path']}",
                "headers": [{"name": k, "value": v} for k, v in req.items() if not k.startswith(":")],
                "postData": {"mimeType": req.get("content-type", ""), "text": body(t["request"]).decode()},
            },
            "response": {
                "status": int(resp.get(":status", "0")),
                "headers": [{"name": k, "value": v} for k, v in resp.items() if not k.startswith(":")],
                "content": {"mimeType": resp.get("content-type", ""), "size": len(text.encode()), "text": text},
            },
        })
    return json.dumps({"log": {"version": "1.2", "creator": {"name": "test", "version": "1"}, "entries": entries}})


def test_replay_of_recorded_mcp_traffic_agrees_with_envoy(tmp_path, mcp_server, start_envoy):
    out = tmp_path / "tap"
    out.mkdir()
    log = tmp_path / "access.log"
    cfg = localize(load_yaml(EXAMPLE), {"mcp_server": mcp_server.port})
    http_filters(cfg).insert(0, tap_filter(out))
    hcm(cfg)["access_log"] = [{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(log),
            "log_format": {"text_format_source": {"inline_string": "%REQ(X-REQUEST-ID)% %FILTER_STATE(wasm.loopguard:PLAIN)%\n"}},
        },
    }]
    envoy = start_envoy(cfg)
    url = f"{envoy.url}/mcp"

    modern = client(url, MODERN, "auto", "modern")
    legacy = client(url, LEGACY, "legacy", "legacy")

    # What the clients got: the real result with a note on the 3rd
    # identical call, loopguard's blocked result on the 4th; polls as the
    # server answered them.
    texts = [s["texts"] for s in modern]
    assert [len(t) for t in texts[:3]] == [1, 1, 2], texts
    assert texts[2][1].startswith(NOTE) and texts[2][0] == texts[0][0], texts
    assert modern[3]["is_error"] and "This call was not run" in modern[3]["text"], modern[3]
    assert modern[4]["exception"] is None and not modern[4]["is_error"], modern[4]
    polls, searches, fails = legacy[:6], legacy[6:10], legacy[10:]
    assert [p["text"] for p in polls] == [f"job build-7: {(i + 1) * 10}% done (poll #{i + 1})" for i in range(6)], polls
    assert all(len(p["texts"]) == 1 for p in polls), polls
    assert [len(s["texts"]) for s in searches[:3]] == [1, 1, 2] and searches[3]["is_error"], searches
    assert [len(s["texts"]) for s in fails[:3]] == [1, 1, 2] and "failed the same way" in fails[3]["text"], fails

    # Every request's trace is written when its stream ends (the legacy
    # client's DELETE is the last).
    # The tap sees every request: once Envoy has none in flight, there is
    # a trace of each request it received.
    count = lambda: len(traces(out))  # noqa: E731
    assert wait_for(lambda: count() >= len(MODERN) + len(LEGACY) and log.exists(), timeout=10)
    assert wait_for(lambda: envoy.in_flight() == 0 and count() == envoy.received(), timeout=10), (count(), envoy.received())
    # Envoy writes a request's access-log line once its response is sent,
    # and flushes the log every 0.2 s: wait for every traced request's line.
    ids = {r["request_id"] for r in recorded(out).values()}
    logged = lambda: {e.partition(" ")[0] for e in log.read_text().splitlines()}  # noqa: E731
    assert wait_for(lambda: ids <= logged(), timeout=10), sorted(ids - logged())[:5]
    envoy_decisions = {}
    for entry in log.read_text().splitlines():
        rid, _, state = entry.partition(" ")
        envoy_decisions[rid] = None if state in ("-", "") else json.loads(state)
    seen = recorded(out)
    assert all(r["request_id"] in envoy_decisions for r in seen.values()), (seen, envoy_decisions)
    calls = [r for r in seen.values() if b'"tools/call"' in r["body"]]
    assert len(calls) == len(MODERN) + len(LEGACY), calls
    assert sum(r["noted"] for r in calls) == 3 and sum(r["own"] for r in calls) == 3, calls

    for name, traffic in [("tap", out),
                          ("jsonl", tmp_path / "t.jsonl"),
                          ("har", tmp_path / "t.har")]:
        if name == "jsonl":
            traffic.write_text(as_jsonl(out))
        elif name == "har":
            traffic.write_text(as_har(out))
        report, verdicts = replay(traffic, tmp_path, name)
        assert report["inputs"]["read"] == len(seen) and report["inputs"]["skipped"] == 0, (name, report["inputs"])
        assert len(verdicts) == len(seen), name
        if name == "tap":
            # Each verdict names its trace (requests in the same
            # millisecond may be merged in either order).
            pairs = [(Path(v["place"]).name, v) for v in verdicts]
            assert sorted(f for f, _ in pairs) == sorted(seen), pairs
        else:
            # A line or entry per trace, in the order the requests arrived.
            pairs = list(zip(seen, verdicts))
        for f, v in pairs:
            r = seen[f]
            what = f"{name} {f}: recorded {r} / replay {v}"
            assert v["decision"] == envoy_decisions[r["request_id"]], what
            assert v["status"] == (r["status"] if r["own"] else None), what
            if r["own"]:
                assert v["mcp_loop"] == r["mcp_loop"], what
            noted = bool(v["mcp"]) and v["mcp"]["note_added"]
            assert noted == r["noted"], what
            if v["mcp"]:
                assert v["mcp"]["result_missing"] is None, what
        actions = [v["action"] for v in verdicts if v["mcp"] and v["mcp"]["judged"]]
        assert actions == ["allow", "allow", "note", "block", "allow"] + ["allow"] * 6 + ["allow", "allow", "note", "block"] * 2, (name, actions)
        p = report["runs"][0]["policies"][0]
        assert p["mcp"]["calls_judged"] == len(MODERN) + len(LEGACY), p["mcp"]
        assert p["mcp"]["loops_by_tool"] == {"search": {"note": 2, "block": 2}, "fail": {"note": 1, "block": 1}}, p["mcp"]
        # Recorded in front of loopguard: its notes were taken out before
        # the results were read (and said so).
        assert p["mcp"]["own_notes_removed"] == 3, p["mcp"]
        assert p["loops_found"] == 2, p["loops"]
