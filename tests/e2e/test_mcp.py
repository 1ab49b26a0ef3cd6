"""MCP tool-call loops in real Envoy, with the official MCP SDKs.

A scripted agent (tests/e2e/mcp_apps/client.py: the Python SDK in its
stateless 2026-07-28 mode and in its 2025-11-25 session mode; client.mjs: the
TypeScript SDK) calls a real MCP server (mcp_apps/server.py, JSON and SSE
answers) through the shipped examples/mcp/envoy.yaml, alone and behind Envoy's
own MCP filter: the 3rd identical call's real result carries a note, the 4th is
a blocked tool result that never reaches the server, and the session goes on.
The other steps of the ladder (a JSON-RPC error, a 429), failing calls, cycles,
exempt tools and shadow mode, then the metrics and events. Last, odd and
hostile traffic sent raw to a recording upstream: it all passes untouched and
is counted.

Each test is a caller of its own (an API key of its own, fresh tool
arguments), so one Envoy and one server serve a whole module.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import uuid

import httpx
import pytest

from harness import ROOT, Envoy, bootstrap, load_yaml, localize, plugin_config_of, wait_for
from harness import set_plugin_config as set_filter_config
from mcp_agents import TOOLS, RawUpstream, ran, run_client

EXAMPLE = ROOT / "examples" / "mcp" / "envoy.yaml"
CLIENTS = ["python-auto", "python-legacy", "ts"]
POLICY = "mcp-tools"  # the example's policy id

NOTE = "[loopguard] Note: "
BLOCKED = "[loopguard] This call was not run: "


def token() -> str:
    return uuid.uuid4().hex[:10]


def search(query: str) -> dict:
    return {"call": "search", "args": {"query": query}}


def read(path: str) -> dict:
    return {"call": "read", "args": {"path": path}}


def real(step: dict, text: str | None = None) -> str:
    """A real result, untouched: one text block and no error; its text."""
    assert step["exception"] is None and step["is_error"] is False, step
    assert len(step["texts"]) == 1, step
    if text is not None:
        assert step["text"] == text, step
    return step["text"]


def noted(step: dict, real_text: str, note_starts: str, note_ends: str) -> None:
    """The real result with loopguard's note as one more text block."""
    assert step["exception"] is None, step
    assert len(step["texts"]) == 2, step
    assert step["texts"][0] == real_text, step
    note = step["texts"][1]
    assert note.startswith(NOTE + note_starts), note
    assert note.endswith(note_ends), note


def blocked(step: dict, says: str) -> None:
    """A tool result loopguard answered: isError, one text that says why."""
    assert step["exception"] is None, step
    assert step["is_error"] is True, step
    assert len(step["texts"]) == 1, step
    assert step["text"].startswith(BLOCKED + says), step


# --- Envoy ---------------------------------------------------------------------


def connection_manager(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def loopguard_of(cfg: dict) -> dict:
    [f] = [f for f in connection_manager(cfg)["http_filters"] if f["name"] == "loopguard"]
    return f


def plugin_config(cfg: dict) -> dict:
    return plugin_config_of(loopguard_of(cfg))


def set_plugin_config(cfg: dict, plugin: dict) -> None:
    set_filter_config(loopguard_of(cfg), plugin)


NATIVE_MCP_FILTER = {
    "name": "envoy.filters.http.mcp",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.mcp.v3.Mcp",
        "traffic_mode": "PASS_THROUGH",
        "request_storage_mode": "DYNAMIC_METADATA",
    },
}

# Policies next to the example's, each on a path of its own that the route
# rewrites to the server's /mcp.
VARIANTS = {
    "error": {"mcp": {"ladder": ["block", "error"], "error_code": -31042}},
    "reject": {"mcp": {"ladder": ["reject"]}},
    "exempt": {"mcp": {"exempt_tools": ["search"]}},
    "shadow": {"mode": "shadow", "mcp": {"ladder": ["note", "block"]}},
}


def gateway_config(kind: str, server_port: int) -> dict:
    """The shipped example pointed at `server_port`. native: Envoy's own MCP
    filter before loopguard. variants: the VARIANTS policies added."""
    cfg = localize(load_yaml(EXAMPLE), {"mcp_server": server_port})
    hcm = connection_manager(cfg)
    if kind == "native":
        hcm["http_filters"].insert(0, NATIVE_MCP_FILTER)
    elif kind == "variants":
        plugin = plugin_config(cfg)
        [example] = plugin["policies"]
        routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
        for name, variant in VARIANTS.items():
            spec = {"selector": {"pathPrefix": f"/{name}/"}, "mcp": {**example["spec"]["mcp"], **variant["mcp"]}}
            if "mode" in variant:
                spec["mode"] = variant["mode"]
            plugin["policies"].append({"id": f"mcp-{name}", "spec": spec})
            routes.insert(0, {"match": {"prefix": f"/{name}/"},
                              "route": {"cluster": "mcp_server", "timeout": "0s", "prefix_rewrite": "/"}})
        set_plugin_config(cfg, plugin)
    return cfg


def start_gateway(kind: str, server_port: int) -> Envoy:
    e = Envoy(gateway_config(kind, server_port), name=f"{kind} gateway")
    if kind == "native":
        # What Envoy's MCP filter made of each request, next to its answer.
        e.mcp_log = e.dir / "mcp-access.log"
        connection_manager(e.config).setdefault("access_log", []).append({
            "name": "envoy.access_loggers.file",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                "path": str(e.mcp_log),
                "log_format": {"json_format": {"method": "%REQ(:METHOD)%", "path": "%REQ(:PATH)%",
                                               "status": "%RESPONSE_CODE%",
                                               "mcp": "%DYNAMIC_METADATA(envoy.filters.http.mcp)%"}},
            },
        })
    return e.start()


_started: list[Envoy] = []


@pytest.fixture(scope="module")
def gateways(mcp_servers):
    """gateways(kind, mode): the Envoy of that kind in front of the server
    answering in that mode, started once for the module."""
    cache: dict[tuple[str, str], Envoy] = {}

    def get(kind: str, mode: str) -> Envoy:
        if (kind, mode) not in cache:
            e = start_gateway(kind, mcp_servers[mode].port)
            cache[(kind, mode)] = e
            _started.append(e)
        return cache[(kind, mode)]

    yield get
    for e in cache.values():
        e.stop()
        _started.remove(e)
        shutil.rmtree(e.dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def envoy_logs_on_failure(request):
    at = {id(e): len(e.log()) for e in _started}
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for e in list(_started):
            print(f"\n--- log of {e.name} during the test ---\n{e.log()[at.get(id(e), 0):][-15000:]}", file=sys.stderr)


def counters(e: Envoy, policy: str = POLICY) -> dict[str, int]:
    """loopguard's MCP counters of one policy, by their name after the policy."""
    out = {}
    for name, value in e.stats().items():
        for metric in ("mcp_calls_total", "mcp_exempt_total", "mcp_loops_total", "mcp_shadow_total", "mcp_unjudged_total"):
            prefix = f"wasmcustom.loopguard.{metric}.policy.{policy}"
            if name == prefix or name.startswith(prefix + "."):
                out[metric + name[len(prefix):]] = value
    return out


def grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def mcp_events(e: Envoy, since: int) -> list[dict]:
    return [json.loads(line[line.index("{"):]) for line in e.log()[since:].splitlines()
            if '"event":"loop.mcp.detected"' in line]


def wait_events(e: Envoy, since: int, count: int) -> list[dict]:
    wait_for(lambda: len(mcp_events(e, since)) >= count, timeout=5)
    return mcp_events(e, since)


# --- 1, 2: a looping agent through the example, alone and behind Envoy's MCP filter


@pytest.mark.parametrize("mode", ["json", "sse"])
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("chain", ["example", "native"])
def test_a_looping_agent_is_noted_then_blocked_and_goes_on(chain, client, mode, gateways, mcp_servers):
    """The same search four times (a tools/list between each): the 3rd
    result is the real one plus a note, the 4th a blocked result that never
    reached the server; then another call, a poll whose result changes 8
    times and a tools/list are all real. (The Python client in its default
    2026-07-28 mode gets JSON even from the SSE server.)"""
    e = gateways(chain, mode)
    server = mcp_servers[mode]
    t = token()
    query, path, job = f"loop {t}", f"/src/{t}.py", f"job-{t}"
    script = []
    for _ in range(4):
        script += [search(query), {"list_tools": True}]
    script += [read(path)] + [{"call": "poll", "args": {"job": job}}] * 8 + [{"list_tools": True}]
    calls, stats, log_at = server.calls(), counters(e), len(e.log())
    mcp_log_at = len(native_log(e)) if chain == "native" else 0
    steps = run_client(client, f"{e.url}/mcp", script, t)

    result = real(steps[0])
    assert result.startswith(f"3 results for '{query}': doc-")
    real(steps[2], result)
    noted(steps[4], result, "this is the 3rd call in a row of the tool `search` with these exact arguments, "
          "and the previous 2 all returned the same result.", "Further identical calls will be blocked.")
    blocked(steps[6], "this is the 4th call in a row of the tool `search` with these exact arguments, "
            "and the previous 3 all returned the same result.")
    # The session goes on: another call is run and answered.
    assert real(steps[8]).startswith(f"# {path}\nline 1 of {path} (")
    # A result that changes is progress: never touched.
    for i in range(8):
        real(steps[9 + i], f"job {job}: {(i + 1) * 10}% done (poll #{i + 1})")
    for i in (1, 3, 5, 7, 17):
        assert set(steps[i]["tools"]) == TOOLS, steps[i]
    # The 4th search never reached the server.
    assert ran(calls, server.calls()) == {"search": 3, "read": 1, "poll": 8}
    assert grew(stats, counters(e)) == {
        "mcp_calls_total": 13,
        "mcp_loops_total.tier.identical.step.note": 1,
        "mcp_loops_total.tier.identical.step.block": 1,
    }
    events = wait_events(e, log_at, 2)
    assert [(ev["tier"], ev["level"], ev["step"], ev["occurrences"], ev["tool"], ev["mode"]) for ev in events] == [
        ("identical", 1, "note", 3, "search", "enforce"), ("identical", 2, "block", 4, "search", "enforce")]
    if chain == "native":
        # Envoy's MCP filter parsed every call loopguard judged (the blocked
        # one included): both filters ran on them.
        def parsed():
            return [ln["mcp"]["params"]["name"] for ln in native_log(e)[mcp_log_at:]
                    if isinstance(ln["mcp"], dict) and ln["mcp"].get("method") == "tools/call"]
        wait_for(lambda: len(parsed()) >= 13, timeout=5)
        assert sorted(parsed()) == ["poll"] * 8 + ["read"] + ["search"] * 4, native_log(e)[mcp_log_at:]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_healthy_session_of_120_calls_is_never_touched(client, gateways, mcp_servers):
    """One session of 120 calls, as a working agent makes them: many
    searches, reading many files, the weather of many cities, a job polled
    until its result stops moving, paging through results: no note, no
    block, every call reaches the server."""
    e = gateways("example", "sse")
    server = mcp_servers["sse"]
    t = token()
    script = []
    for i in range(38):
        script += [search(f"{t} topic {i}"), read(f"/src/{t}/m{i}.py")]
    script += [{"call": "poll", "args": {"job": f"job-{t}"}}] * 10
    script += [{"call": "weather", "args": {"city": f"city-{t}-{i}"}} for i in range(20)]
    for page in range(15):
        script += [search(f"{t} page {page}"), {"list_tools": True}]
    assert sum("call" in s for s in script) >= 120
    calls, stats = server.calls(), counters(e)
    steps = run_client(client, f"{e.url}/mcp", script, t)
    for i, s in enumerate(script):
        if "call" in s:
            assert steps[i]["exception"] is None and len(steps[i]["texts"]) == 1, steps[i]
            assert not steps[i]["text"].startswith("[loopguard]"), steps[i]
    n = sum("call" in s for s in script)
    assert sum(ran(calls, server.calls()).values()) == n
    grown = grew(stats, counters(e))
    assert grown.get("mcp_calls_total") == n
    assert not any(k.startswith("mcp_loops_total") for k in grown), grown


def native_log(e: Envoy) -> list[dict]:
    """The native gateway's access log: each request with what Envoy's MCP
    filter made of it."""
    if not e.mcp_log.exists():
        return []
    return [json.loads(line) for line in e.mcp_log.read_text().splitlines() if line.strip()]


# --- 3: the other steps of the ladder ------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_failing_and_cycling_calls_climb_the_ladder(client, gateways, mcp_servers):
    """A call failing the same way (tool `fail`) and a search/read cycle:
    noted, then blocked; the session goes on after each."""
    e = gateways("example", "sse")
    server = mcp_servers["sse"]
    t = token()
    bad, query, path, city = f"/etc/{t}", f"cycle {t}", f"/src/{t}.md", f"city-{t}"
    script = [{"call": "fail", "args": {"path": bad}}] * 4 + [read(f"/other/{t}")]
    script += [search(query), read(path)] * 3 + [search(query)]
    script += [{"call": "weather", "args": {"city": city}}]
    calls, stats = server.calls(), counters(e)
    steps = run_client(client, f"{e.url}/mcp", script, t)

    error = f"Error executing tool fail: permission denied: {bad}"
    for i in (0, 1):
        assert steps[i]["is_error"] is True and steps[i]["texts"] == [error], steps[i]
    noted(steps[2], error, "this is the 3rd call in a row of the tool `fail` with these exact arguments, "
          "and the previous 2 all failed the same way.", "Further identical calls will be blocked.")
    assert steps[2]["is_error"] is True
    blocked(steps[3], "this is the 4th call in a row of the tool `fail` with these exact arguments, "
            "and the previous 3 all failed the same way. Retrying will not fix it")
    real(steps[4])
    found, content = real(steps[5]), real(steps[6])
    real(steps[7], found)
    real(steps[8], content)
    # Round 3: each call's result gets a note.
    noted(steps[9], found, "the same 2 calls (`search` and 1 other) have been repeated in turn, 3 rounds now",
          "Further identical calls will be blocked.")
    noted(steps[10], content, "the same 2 calls (`read` and 1 other) have been repeated in turn, 3 rounds now",
          "Further identical calls will be blocked.")
    blocked(steps[11], "the same 2 calls (`search` and 1 other) have been repeated in turn, 4 rounds now")
    assert steps[12]["exception"] is None and steps[12]["structured"]["city"] == city
    assert ran(calls, server.calls()) == {"fail": 3, "read": 4, "search": 3, "weather": 1}
    assert grew(stats, counters(e)) == {
        "mcp_calls_total": 13,
        "mcp_loops_total.tier.failing.step.note": 1,
        "mcp_loops_total.tier.failing.step.block": 1,
        "mcp_loops_total.tier.cycle.step.note": 2,
        "mcp_loops_total.tier.cycle.step.block": 1,
    }


def exception_type(step: dict) -> str:
    """The class of the exception a client step raised."""
    return step["exception"].split(":", 1)[0]


@pytest.mark.parametrize("client", CLIENTS)
def test_the_error_step_is_a_json_rpc_error_the_client_raises(client, gateways, mcp_servers):
    """ladder [block, error] with error_code -31042: the 3rd identical call
    is blocked, the 4th and 5th raise the SDK's MCP error with that code;
    the next call works."""
    e = gateways("variants", "sse")
    server = mcp_servers["sse"]
    t = token()
    script = [search(f"err {t}")] * 5 + [read(f"/after/{t}")]
    calls, stats = server.calls(), counters(e, "mcp-error")
    steps = run_client(client, f"{e.url}/error/mcp", script, t)

    result = real(steps[0])
    real(steps[1], result)
    blocked(steps[2], "this is the 3rd call in a row of the tool `search`")
    for i, n in ((3, "4th"), (4, "5th")):
        s = steps[i]
        assert exception_type(s) == ("McpError" if client == "ts" else "MCPError"), s
        assert s["code"] == -31042, s
        assert f"[loopguard] This call was not run: this is the {n} call in a row of the tool `search`" in s["exception"], s
    real(steps[5])
    assert ran(calls, server.calls()) == {"search": 2, "read": 1}
    assert grew(stats, counters(e, "mcp-error")) == {
        "mcp_calls_total": 6,
        "mcp_loops_total.tier.identical.step.block": 1,
        "mcp_loops_total.tier.identical.step.error": 2,
    }


@pytest.mark.parametrize("client", CLIENTS)
def test_the_reject_step_is_a_429_the_client_raises(client, gateways, mcp_servers):
    """ladder [reject]: the 3rd and 4th identical calls get a 429 with a
    JSON-RPC error (the Python SDK parses it: code -31000; the TypeScript
    SDK raises the HTTP status); the next call works."""
    e = gateways("variants", "sse")
    server = mcp_servers["sse"]
    t = token()
    script = [search(f"rej {t}")] * 4 + [read(f"/after/{t}")]
    calls, stats = server.calls(), counters(e, "mcp-reject")
    steps = run_client(client, f"{e.url}/reject/mcp", script, t)

    result = real(steps[0])
    real(steps[1], result)
    for i, n in ((2, "3rd"), (3, "4th")):
        s = steps[i]
        if client == "ts":
            assert exception_type(s) == "StreamableHTTPError" and s["code"] == 429, s
        else:
            assert exception_type(s) == "MCPError" and s["code"] == -31000, s
        assert f"[loopguard] This call was not run: this is the {n} call in a row of the tool `search`" in s["exception"], s
    real(steps[4])
    assert ran(calls, server.calls()) == {"search": 2, "read": 1}
    assert grew(stats, counters(e, "mcp-reject")) == {
        "mcp_calls_total": 5,
        "mcp_loops_total.tier.identical.step.reject": 2,
    }


@pytest.mark.parametrize("client", CLIENTS)
def test_exempt_tools_are_never_counted(client, gateways, mcp_servers):
    """exempt_tools [search]: six identical searches all run; an exempt call
    between three identical reads neither counts nor breaks their run."""
    e = gateways("variants", "sse")
    server = mcp_servers["sse"]
    t = token()
    query, path = f"exempt {t}", f"/src/{t}.rs"
    script = [search(query)] * 6 + [read(path), read(path), search(query), read(path)]
    calls, stats = server.calls(), counters(e, "mcp-exempt")
    steps = run_client(client, f"{e.url}/exempt/mcp", script, t)

    result = real(steps[0])
    for i in (1, 2, 3, 4, 5, 8):
        real(steps[i], result)
    content = real(steps[6])
    real(steps[7], content)
    noted(steps[9], content, "this is the 3rd call in a row of the tool `read`", "Further identical calls will be blocked.")
    assert ran(calls, server.calls()) == {"search": 7, "read": 3}
    assert grew(stats, counters(e, "mcp-exempt")) == {
        "mcp_exempt_total": 7,
        "mcp_calls_total": 3,
        "mcp_loops_total.tier.identical.step.note": 1,
    }


# --- 4: shadow mode ------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_shadow_mode_changes_nothing_and_counts_what_it_would_do(client, gateways, mcp_servers):
    e = gateways("variants", "sse")
    server = mcp_servers["sse"]
    t = token()
    script = [search(f"shadow {t}")] * 6
    calls, stats, log_at = server.calls(), counters(e, "mcp-shadow"), len(e.log())
    prom = e.prometheus()
    steps = run_client(client, f"{e.url}/shadow/mcp", script, t)

    result = real(steps[0])
    for i in range(1, 6):
        real(steps[i], result)
    assert ran(calls, server.calls()) == {"search": 6}
    assert grew(stats, counters(e, "mcp-shadow")) == {
        "mcp_calls_total": 6,
        "mcp_shadow_total.tier.identical.step.note": 1,
        "mcp_shadow_total.tier.identical.step.block": 3,
    }
    after = e.prometheus()
    for step, n in (("note", 1), ("block", 3)):
        key = f'loopguard_mcp_shadow_total{{policy="mcp-shadow",tier="identical",step="{step}"}}'
        assert after.get(key, 0) - prom.get(key, 0) == n, sorted(k for k in after if "mcp" in k)
    events = wait_events(e, log_at, 2)
    assert [(ev["level"], ev["step"], ev["mode"], ev["policy"]) for ev in events] == [
        (1, "note", "shadow", "mcp-shadow"), (2, "block", "shadow", "mcp-shadow")]


# --- 5: metrics and events -----------------------------------------------------


def test_metrics_and_events_of_a_loop(gateways, mcp_servers):
    """Six identical calls: 6 judged calls, one note and three blocks, in
    /stats and as labelled Prometheus metrics (the example's stats_tags);
    one event line per level of the ladder, not per blocked call."""
    e = gateways("example", "sse")
    t = token()
    prom, log_at = e.prometheus(), len(e.log())
    steps = run_client("python-legacy", f"{e.url}/mcp", [search(f"metrics {t}")] * 6, t)
    assert [s["is_error"] for s in steps.values()] == [False, False, False, True, True, True]
    assert len(steps[2]["texts"]) == 2
    after = e.prometheus()

    def delta(key):
        return after.get(key, 0) - prom.get(key, 0)

    assert delta(f'loopguard_mcp_calls_total{{policy="{POLICY}"}}') == 6
    assert delta(f'loopguard_mcp_loops_total{{policy="{POLICY}",tier="identical",step="note"}}') == 1
    assert delta(f'loopguard_mcp_loops_total{{policy="{POLICY}",tier="identical",step="block"}}') == 3
    assert delta(f'loopguard_mcp_loops_total{{policy="{POLICY}",tier="failing",step="block"}}') == 0
    wait_events(e, log_at, 2)
    e.quiet()  # the calls are over: a third line would be logged by now
    events = mcp_events(e, log_at)
    assert len(events) == 2, events
    for ev in events:
        assert re.fullmatch(r"[0-9a-f]{12}", ev.pop("caller")), ev
    assert events == [
        {"event": "loop.mcp.detected", "tier": "identical", "tool": "search", "level": 1, "step": "note",
         "occurrences": 3, "policy": POLICY, "mode": "enforce"},
        {"event": "loop.mcp.detected", "tier": "identical", "tool": "search", "level": 2, "step": "block",
         "occurrences": 4, "policy": POLICY, "mode": "enforce"},
    ]
    # Nothing of the caller's key or the call's arguments in the log.
    assert f"sk-{t}" not in e.log() and f"metrics {t}" not in e.log()


# --- 6, 7: odd and hostile traffic, sent raw -----------------------------------


RAW_POLICY = "raw"


@pytest.fixture(scope="module")
def raw():
    """One Envoy (loopguard holding request headers, as the example does)
    with a strict policy, the same result twice is blocked, in front of a
    RawUpstream; bodies above 64 KiB are not read."""
    up = RawUpstream()
    plugin = {"max_body_bytes": 65536, "policies": [{"id": RAW_POLICY, "spec": {
        "selector": {"pathPrefix": "/mcp"},
        "mcp": {"enabled": True, "same_result_min": 2, "ladder": ["block"]}}}]}
    e = Envoy(bootstrap(plugin, up.port, hold=True), name="raw gateway")
    _started.append(e)
    try:
        e.start()
        yield e, up
    finally:
        e.stop()
        _started.remove(e)
        shutil.rmtree(e.dir, ignore_errors=True)
        up.stop()


def call_body(rid, tool: str, args: dict) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                       "params": {"name": tool, "arguments": args}}).encode()


def post(e: Envoy, body, key: str, **headers) -> httpx.Response:
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
         "authorization": f"Bearer sk-{key}", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.post(f"{e.url}/mcp", content=body, headers=h, timeout=15)


def passed_untouched(up: RawUpstream, at: int, sent: list[bytes], answers: list[httpx.Response], status: int = 200) -> None:
    """Each request reached the upstream byte for byte, and its client got
    the upstream's answer byte for byte."""
    assert up.count == at + len(sent), f"{up.count - at} of {len(sent)} requests reached the upstream"
    for i, (body, r) in enumerate(zip(sent, answers)):
        assert up.requests[at + i]["body"] == body, f"request {i} changed on its way"
        assert r.status_code == status, (i, r.status_code, r.text[:300])
        assert r.content == bytes(up.sent[at + i]), f"answer {i} changed on its way: {r.content[:300]!r}"
        assert "x-loopguard-mcp-loop" not in r.headers


def assert_blocks_when_judged(e: Envoy, up: RawUpstream, key: str, **headers) -> None:
    """The control: the same call, well formed, with the same answer twice
    is blocked at the 2nd (so the traffic above would have been, had it
    been judged)."""
    args = {"control": key}
    at = up.count
    first = post(e, call_body(1, "search", args), key, **headers)
    second = post(e, call_body(2, "search", args), key, **headers)
    assert first.json()["result"]["content"] == [{"type": "text", "text": "same"}]
    assert second.status_code == 200 and second.json()["result"]["isError"] is True, second.text
    assert second.json()["id"] == 2
    assert second.json()["result"]["content"][0]["text"].startswith(BLOCKED + "this is the 2nd call in a row")
    assert up.count == at + 1


def test_results_come_back_readable_from_a_compressing_server(raw):
    """The client asks for compressed answers (as both SDK clients do); the
    server would gzip its results, which could not be read: loopguard
    removes accept-encoding from the calls it judges, so the server answers
    plainly and the repeat is seen (blocked at the 2nd call here)."""
    e, up = raw
    t = token()
    at = up.count
    first = post(e, call_body(1, "search", {"q": t}), t, accept_encoding="gzip, deflate")
    assert first.json()["result"]["content"] == [{"type": "text", "text": "same"}]
    assert "accept-encoding" not in up.requests[at]["headers"]
    second = post(e, call_body(2, "search", {"q": t}), t, accept_encoding="gzip, deflate")
    assert second.json()["result"]["isError"] is True, second.text
    assert up.count == at + 1
    # Anything else keeps the header (a GET opens the server's stream).
    with httpx.stream("GET", f"{e.url}/mcp", headers={"accept": "text/event-stream", "accept-encoding": "gzip"}, timeout=15) as r:
        assert r.status_code == 200
    assert up.requests[at + 1]["method"] == "GET"
    assert "gzip" in up.requests[at + 1]["headers"].get("accept-encoding", "")


def test_malformed_json_rpc_passes_untouched(raw):
    e, up = raw
    t = token()
    bodies = [
        b"{not json",
        json.dumps({"jsonrpc": "1.0", "id": 1, "method": "tools/call", "params": {"name": "search", "arguments": {"q": t}}}).encode(),
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {"q": t}}}).encode(),
    ]
    sent = [b for b in bodies for _ in range(3)]
    at, stats = up.count, counters(e, RAW_POLICY)
    answers = [post(e, b, t) for b in sent]
    passed_untouched(up, at, sent, answers)
    assert grew(stats, counters(e, RAW_POLICY)) == {"mcp_unjudged_total.reason.malformed": 9}
    assert_blocks_when_judged(e, up, t)


def test_a_repeated_batch_passes_untouched_and_is_never_blocked(raw):
    e, up = raw
    t = token()
    batch = json.dumps([json.loads(call_body(1, "search", {"q": t})), json.loads(call_body(2, "read", {"p": t}))]).encode()
    at, stats = up.count, counters(e, RAW_POLICY)
    answers = [post(e, batch, t) for _ in range(6)]
    passed_untouched(up, at, [batch] * 6, answers)
    assert grew(stats, counters(e, RAW_POLICY)) == {"mcp_unjudged_total.reason.batch": 6}


def test_headers_that_disagree_with_the_body_pass_untouched_and_are_never_blocked(raw):
    e, up = raw
    t = token()
    body = call_body(7, "search", {"q": t})
    at, stats = up.count, counters(e, RAW_POLICY)
    answers = [post(e, body, t, mcp_method="tools/list", mcp_name="search", mcp_protocol_version="2026-07-28")
               for _ in range(6)]
    answers += [post(e, body, t, mcp_method="tools/call", mcp_name="other", mcp_protocol_version="2026-07-28")
                for _ in range(6)]
    passed_untouched(up, at, [body] * 12, answers)
    assert grew(stats, counters(e, RAW_POLICY)) == {"mcp_unjudged_total.reason.headers_disagree": 12}
    # Headers that agree: judged.
    assert_blocks_when_judged(e, up, t, mcp_method="tools/call", mcp_name="search", mcp_protocol_version="2026-07-28")


def test_arguments_larger_than_max_body_bytes_pass_and_are_never_blocked(raw):
    """200 KB of arguments (max_body_bytes is 64 KiB), five times the same
    call with the same result, with a content-length and chunked: not read,
    counted as skipped bodies and as MCP calls passed unjudged (too_large),
    never blocked."""
    e, up = raw
    t = token()
    body = call_body(3, "search", {"q": t, "blob": "x" * 200_000})
    skipped = e.counter("loopguard.bodies_skipped_total.reason.too_large")
    at, stats = up.count, counters(e, RAW_POLICY)
    answers = [post(e, body, t) for _ in range(5)]

    def chunks():
        for i in range(0, len(body), 16384):
            yield body[i:i + 16384]

    answers += [post(e, chunks(), t) for _ in range(5)]
    passed_untouched(up, at, [body] * 10, answers)
    assert all("chunked" in r["headers"].get("transfer-encoding", "") for r in up.requests[at + 5:at + 10])
    assert e.counter("loopguard.bodies_skipped_total.reason.too_large") - skipped == 10
    assert grew(stats, counters(e, RAW_POLICY)) == {"mcp_unjudged_total.reason.too_large": 10}


@pytest.mark.parametrize("answer,status", [("html", 200), ("500", 500)])
def test_a_result_that_is_not_json_rpc_is_never_a_repeat(raw, answer, status):
    """text/html with a 200, or the same JSON-RPC result with a 500: the
    result cannot be read, so six identical calls all reach the upstream."""
    e, up = raw
    t = token()
    body = call_body(4, "search", {"q": t})
    at, stats = up.count, counters(e, RAW_POLICY)
    answers = [post(e, body, t, x_answer=answer) for _ in range(6)]
    passed_untouched(up, at, [body] * 6, answers, status)
    assert grew(stats, counters(e, RAW_POLICY)) == {"mcp_calls_total": 6, "mcp_unjudged_total.reason.result_unreadable": 6}


def test_an_event_stream_that_never_answers_passes_as_it_comes(raw):
    """A tools/call answered by an event stream of pings and notifications
    for 3 s and never the response: the client gets every byte as it comes
    (not held), Envoy stays healthy, and the call after it is judged
    normally; a client that gives up mid-stream leaves its call unread
    (counted, never a repeat)."""
    e, up = raw
    t = token()
    body = call_body(5, "search", {"q": t})
    at, stats = up.count, counters(e, RAW_POLICY)
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "authorization": f"Bearer sk-{t}", "x-answer": "sse-forever", "x-stream-seconds": "3"}
    got, first_at = bytearray(), None
    start = time.monotonic()
    with httpx.Client(timeout=httpx.Timeout(5, read=1.0)) as c:
        with c.stream("POST", f"{e.url}/mcp", content=body, headers=headers) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            for data in r.iter_raw():
                if first_at is None and data:
                    first_at = time.monotonic() - start
                got += data
        took = time.monotonic() - start
    assert up.requests[at]["body"] == body
    assert bytes(got) == bytes(up.sent[at]) and got.count(b": ping") >= 20, got[:200]
    assert first_at is not None and first_at < 1.5 and took >= 2.9, (first_at, took)
    # A client that gives up after half a second.
    with httpx.Client(timeout=httpx.Timeout(5, read=1.0)) as c:
        with c.stream("POST", f"{e.url}/mcp", content=call_body(6, "search", {"q": t + "-abandoned"}), headers=headers) as r:
            deadline = time.monotonic() + 0.5
            for _ in r.iter_raw():
                if time.monotonic() > deadline:
                    break
    assert httpx.get(f"{e.admin}/ready", timeout=5).status_code == 200
    # The same call again is judged (answered first as an event stream with
    # a notification before the result, then as JSON): its 2nd identical
    # result is blocked. The endless stream's call was never read as a
    # result, so it is no repeat (the block says 2nd, not 3rd).
    n = up.count
    first = post(e, call_body(10, "search", {"q": t}), t, x_answer="sse")
    assert first.headers["content-type"] == "text/event-stream" and first.content == bytes(up.sent[n])
    after = [post(e, call_body(11 + i, "search", {"q": t}), t) for i in range(2)]
    assert [r.status_code for r in after] == [200, 200]
    after.insert(0, httpx.Response(200, json=json.loads(first.text.rsplit("data: ", 1)[1])))
    assert [r.json()["result"].get("isError") for r in after] == [False, True, True], [r.text for r in after]
    assert after[1].json()["result"]["content"][0]["text"].startswith(BLOCKED + "this is the 2nd call in a row")
    assert after[2].json()["result"]["content"][0]["text"].startswith(BLOCKED + "this is the 3rd call in a row")
    assert up.count == n + 1
    assert grew(stats, counters(e, RAW_POLICY)) == {
        "mcp_calls_total": 5,
        "mcp_unjudged_total.reason.result_unreadable": 2,
        "mcp_loops_total.tier.identical.step.block": 2,
    }


def test_get_streams_and_deletes_pass_untouched(raw):
    e, up = raw
    t = token()
    at, stats = up.count, counters(e, RAW_POLICY)
    h = {"mcp-session-id": f"s-{t}", "authorization": f"Bearer sk-{t}", "mcp-protocol-version": "2025-11-25"}
    answers = [httpx.get(f"{e.url}/mcp", headers={**h, "accept": "text/event-stream"}, timeout=10) for _ in range(3)]
    answers += [httpx.delete(f"{e.url}/mcp", headers=h, timeout=10) for _ in range(6)]
    passed_untouched(up, at, [b""] * 9, answers)
    assert [r["method"] for r in up.requests[at:]] == ["GET"] * 3 + ["DELETE"] * 6
    assert all(r.content.startswith(b": open\n\n") and r.headers["content-type"] == "text/event-stream" for r in answers[:3])
    assert all(r["headers"]["mcp-session-id"] == f"s-{t}" for r in up.requests[at:])
    assert grew(stats, counters(e, RAW_POLICY)) == {}
