"""Traffic captured by Envoy's own tap filter (examples/tap) and replayed
with `loopguard replay`: the shipped capture configuration, run in a real
Envoy (its ports and output directory moved), writes one trace per /v1
request with its exact body and its time, and replay reads every trace and
judges the requests in the order they were sent."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from harness import CLI, ROOT, load_yaml, localize, wait_for

EXAMPLE = ROOT / "examples" / "tap" / "envoy.yaml"
README = ROOT / "examples" / "tap" / "README.md"

# The loopguard configuration replayed: the 3rd identical request in a
# minute is rejected.
REPLAY_CONFIG = {
    "policies": [
        {
            "id": "tap-replay",
            "spec": {
                "selector": {"pathPrefix": "/v1", "methods": ["POST"]},
                "loop_detection": {
                    "enabled": True,
                    "window_seconds": 60,
                    "threshold_identical_requests": 3,
                    "similarity": "exact",
                    "action": "reject",
                },
            },
        }
    ]
}

ASCII = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Is the build green?"}]}
NON_ASCII = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Grüße aus Zürich, 世界 🌍"}]}
# Interleaved, so that each reaches its third copy at a different step.
SEQUENCE = [ASCII, NON_ASCII, ASCII, NON_ASCII, ASCII, NON_ASCII, ASCII]


def body_of(doc: dict) -> bytes:
    """The exact bytes sent (non-ASCII text as UTF-8, not \\u escapes)."""
    return json.dumps(doc, ensure_ascii=False).encode()


def tap_filter(cfg: dict) -> dict:
    for listener in cfg["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for h in f["typed_config"].get("http_filters", []):
                    if h["name"] == "envoy.filters.http.tap":
                        return h
    raise AssertionError("no envoy.filters.http.tap filter")


def http_filters(cfg: dict) -> list:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]


def sink(cfg: dict) -> dict:
    return tap_filter(cfg)["typed_config"]["common_config"]["static_config"]["output_config"]["sinks"][0]


def test_the_example_is_what_its_readme_says():
    """The shipped capture config: the addresses, what it captures, and
    how (whole bodies as bytes, with the time), before the tests move it."""
    cfg = load_yaml(EXAMPLE)
    assert cfg["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9901}
    assert cfg["static_resources"]["listeners"][0]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 10000}
    (cluster,) = cfg["static_resources"]["clusters"]
    assert cluster["name"] == "upstream"
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 8000}
    tap = tap_filter(cfg)["typed_config"]
    assert tap["record_headers_received_time"] is True
    static = tap["common_config"]["static_config"]
    assert static["match"] == {"http_request_headers_match": {"headers": [{"name": ":path", "string_match": {"prefix": "/v1"}}]}}
    out = static["output_config"]
    assert not out.get("streaming", False)
    assert out["max_buffered_rx_bytes"] >= 1 << 20 and out["max_buffered_tx_bytes"] >= 1 << 20
    assert sink(cfg) == {"format": "JSON_BODY_AS_BYTES", "file_per_tap": {"path_prefix": "/tmp/loopguard-tap/trace"}}
    assert [f["name"] for f in http_filters(cfg)] == ["envoy.filters.http.tap", "envoy.filters.http.router"]
    text = README.read_text()
    assert "mkdir -p /tmp/loopguard-tap" in text
    assert "loopguard replay --config CONFIG /tmp/loopguard-tap/" in text


def capture_config(upstream_port: int, out: Path, patch=None) -> dict:
    """examples/tap/envoy.yaml on free ports, writing to `out`."""
    cfg = localize(load_yaml(EXAMPLE), {"upstream": upstream_port})
    assert sink(cfg)["file_per_tap"]["path_prefix"] == "/tmp/loopguard-tap/trace"
    sink(cfg)["file_per_tap"]["path_prefix"] = str(out / "trace")
    if patch:
        patch(cfg)
    return cfg


def send(e, out: Path) -> list[tuple[float, float, bytes]]:
    """SEQUENCE as POST /v1/chat/completions with a GET /healthz among
    them, through Envoy `e`; (sent, answered, body) of each POST, in Unix
    seconds. Waits until Envoy has written a trace for each."""
    sent = []
    with httpx.Client(base_url=e.url, timeout=30) as client:
        for i, doc in enumerate(SEQUENCE):
            if i == 2:
                assert client.get("/healthz").status_code == 200
            body = body_of(doc)
            start = time.time()
            r = client.post(
                "/v1/chat/completions",
                content=body,
                headers={"content-type": "application/json", "authorization": "Bearer sk-tap-test"},
            )
            sent.append((start, time.time(), body))
            assert r.status_code == 200, r.text
            # The pace: whole milliseconds apart (replay orders by millisecond).
            time.sleep(0.02)
    assert wait_for(lambda: len(trace_files(out)) >= len(SEQUENCE) and all(map(complete, trace_files(out))), timeout=10), [
        (f.name, complete(f)) for f in trace_files(out)
    ]
    e.quiet()  # every request is over: anything more (a /healthz trace) would be written by now
    return sent


def complete(f: Path) -> bool:
    """The trace file holds the response (Envoy writes a buffered trace
    at once, a streamed one segment by segment)."""
    try:
        docs = json_documents(f.read_text())
    except (OSError, ValueError):
        return False
    return any(
        "response" in d.get("http_buffered_trace", {}) or "response_body_chunk" in d.get("http_streamed_trace_segment", {})
        for d in docs
    )


def trace_files(out: Path) -> list[Path]:
    return sorted(out.iterdir())


def replay(traffic: Path, tmp_path: Path) -> tuple[dict, list[dict]]:
    config = tmp_path / "loopguard.json"
    config.write_text(json.dumps(REPLAY_CONFIG))
    verdicts = tmp_path / "verdicts.jsonl"
    r = subprocess.run(
        [CLI, "replay", "--config", str(config), "--json", "--verdicts", str(verdicts), str(traffic)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    try:
        report = json.loads(r.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"replay printed no JSON report (exit {r.returncode}):\n{r.stdout}\n{r.stderr}")
    lines = [json.loads(line) for line in verdicts.read_text().splitlines() if line.strip()]
    return report, lines


def check_verdicts(report: dict, lines: list[dict], sent: list[tuple[float, float, bytes]], names: dict[str, bytes]):
    """One verdict per request, in the order sent, at the time sent; the
    3rd and later copies of a body rejected."""
    assert report["inputs"]["read"] == len(SEQUENCE), report
    assert report["inputs"]["skipped"] == 0, report
    assert len(lines) == len(SEQUENCE), lines
    seen: dict[bytes, int] = {}
    for line, (start, end, body) in zip(lines, sent):
        assert names[Path(line["place"]).name] == body, (line, body)
        assert start - 2 <= line["at_ms"] / 1000 <= end + 2, (line, start, end)
        seen[body] = seen.get(body, 0) + 1
        if seen[body] >= 3:
            assert line["action"] == "reject", (seen[body], line)
        else:
            assert line["action"] != "reject", (seen[body], line)
    assert [line["at_ms"] for line in lines] == sorted(line["at_ms"] for line in lines)


def test_tap_traces_hold_each_v1_request_exactly_with_its_time(tmp_path, upstream, start_envoy):
    """The capture alone (no loopguard CLI): one buffered trace per /v1
    request, none for /healthz, the exact body bytes (base64), and
    headers_received_time within the time it was sent."""
    out = tmp_path / "tap"
    out.mkdir()
    e = start_envoy(capture_config(upstream.port, out))
    sent = send(e, out)
    files = trace_files(out)
    assert len(files) == len(SEQUENCE), files
    assert all(re.fullmatch(r"trace_\d+\.json", f.name) for f in files), files
    traces = []
    for f in files:
        t = json.loads(f.read_text())["http_buffered_trace"]
        headers = {h["key"]: h["value"] for h in t["request"]["headers"]}
        assert headers[":path"] == "/v1/chat/completions" and headers[":method"] == "POST"
        assert headers["authorization"] == "Bearer sk-tap-test"
        assert t["request"]["body"]["truncated"] is False
        body = base64.b64decode(t["request"]["body"]["as_bytes"])
        received = t["request"]["headers_received_time"]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", received), received
        status = {h["key"]: h["value"] for h in t["response"]["headers"]}[":status"]
        assert status == "200"
        assert json.loads(base64.b64decode(t["response"]["body"]["as_bytes"]))["usage"]["total_tokens"] == 2
        assert t["downstream_connection"]["remote_address"]["socket_address"]["address"] == "127.0.0.1"
        traces.append((received, body))
    # In time order, the traces are the requests as sent, byte for byte.
    assert [b for _, b in sorted(traces)] == [b for _, _, b in sent]
    assert body_of(NON_ASCII) in {b for _, b in traces} and not body_of(NON_ASCII).isascii()
    assert len(upstream.requests) == len(SEQUENCE) + 1  # the /healthz went through, uncaptured


def test_replay_reads_the_captured_traces_in_order(tmp_path, upstream, start_envoy):
    out = tmp_path / "tap"
    out.mkdir()
    e = start_envoy(capture_config(upstream.port, out))
    sent = send(e, out)
    names = {f.name: base64.b64decode(json.loads(f.read_text())["http_buffered_trace"]["request"]["body"]["as_bytes"]) for f in trace_files(out)}
    report, lines = replay(out, tmp_path)
    check_verdicts(report, lines, sent, names)


def readme_header_mutation() -> list[dict]:
    """The README's fallback for traces without headers_received_time."""
    for block in re.findall(r"```yaml\n(.*?)\n```", README.read_text(), re.S):
        if "envoy.filters.http.header_mutation" in block:
            return yaml.safe_load(block)
    raise AssertionError("README.md shows no header_mutation filter")


def json_documents(text: str) -> list[dict]:
    """The JSON documents of a streamed trace, one after another."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        doc, end = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        docs.append(doc)
        at = end
    return docs


def test_streamed_traces_timed_by_the_readmes_header(tmp_path, upstream, start_envoy):
    """The README's fallback: streamed traces (which record no time) with
    the arrival time stamped by header_mutation before the tap."""

    def streamed(cfg: dict) -> None:
        tap = tap_filter(cfg)["typed_config"]
        del tap["record_headers_received_time"]
        tap["common_config"]["static_config"]["output_config"]["streaming"] = True
        filters = http_filters(cfg)
        filters[0:0] = readme_header_mutation()

    out = tmp_path / "tap"
    out.mkdir()
    e = start_envoy(capture_config(upstream.port, out, streamed))
    sent = send(e, out)
    names = {}
    for f in trace_files(out):
        docs = json_documents(f.read_text())
        segments = [d["http_streamed_trace_segment"] for d in docs]
        headers = {h["key"]: h["value"] for h in segments[0]["request_headers"]["headers"]}
        assert re.fullmatch(r"\d{13}", headers["x-loopguard-received-at"]), headers
        assert "headers_received_time" not in f.read_text()
        names[f.name] = b"".join(base64.b64decode(s["request_body_chunk"]["as_bytes"]) for s in segments if "request_body_chunk" in s)
    report, lines = replay(out, tmp_path)
    check_verdicts(report, lines, sent, names)
