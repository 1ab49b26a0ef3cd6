"""Both hosts give the same answers.

The Wasm module and the dynamic module are one core behind two thin hosts;
what the core decides must reach the client the same way through either.
So the native host's suite runs only what depends on the host (loading,
holding headers, bodies, timers, store calls, stats, reload: see the
Makefile's E2E_NATIVE_FILES), and this file shows that the rest agrees: the
same traffic goes through a Wasm Envoy and a native Envoy side by side,
each request to both at the same moment, and every answer is compared:
status, loopguard's headers, the body the client read (loopguard's own
429s in each API's shape, notes inserted into answers), the decision the
filter published, and in the end every loopguard counter.

The traffic covers what the files not re-run natively test: both labelled
corpora (a scenario of every kind, the recommended setup), a slice of the
real recorded runs of every request shape, windows, cooldowns, throttles,
warnings and ladders, a provider's errors and the SDK's retries, spend caps
read from the answers' usage, and MCP tool calls answered as JSON and as
event streams.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import harness as h
from harness import ROOT
from replaying import Answers, corpus_steps, decision_log, decisions, real_runs_slice, spend_caps_mix, windows_mix

sys.path.insert(0, str(ROOT / "eval"))
import eval as corpus  # noqa: E402

pytestmark = pytest.mark.skipif(h.HOST != "wasm", reason="starts both hosts itself; run once, with the Wasm host's suite")

# Answer headers that differ between any two Envoys (times, ids) and are no
# decision of loopguard's.
VOLATILE = {"date", "x-envoy-upstream-service-time", "x-request-id", "server", "content-length"}


def answer_of(resp: httpx.Response) -> dict:
    """What a client read: status, headers (the volatile ones aside), body."""
    headers = {k: v for k, v in resp.headers.items() if k not in VOLATILE}
    body = resp.content
    if resp.headers.get("content-type", "").startswith("application/json"):
        try:
            body = json.loads(body)
        except ValueError:
            pass
    return {"status": resp.status_code, "headers": headers, "body": body}


# Time left until a caller may retry is read at the moment each Envoy
# answered: the two answers of one step are compared within this much.
TIME_LEFT_MS = {"retry-after-ms": 1000}
TIME_LEFT_S = {"retry-after": 1}
TIME_LEFT_BODY = ("retry_after_seconds", "retry_after_ms")


def same_but_time_left(w: dict, n: dict) -> bool:
    """Two answers are the same, a retry's time left aside (checked to be
    close instead)."""
    def close(a, b, within) -> bool:
        try:
            return abs(float(a) - float(b)) <= within
        except (TypeError, ValueError):
            return a == b

    def strip(answer: dict) -> tuple[dict, dict]:
        answer = json.loads(json.dumps(answer, default=repr))
        left = {}
        for k in [*TIME_LEFT_MS, *TIME_LEFT_S]:
            if k in answer["headers"]:
                left[k] = answer["headers"].pop(k)
        err = answer["body"].get("error") if isinstance(answer["body"], dict) else None
        for k in TIME_LEFT_BODY:
            if isinstance(err, dict) and k in err:
                left["body." + k] = err.pop(k)
        # A message says the same seconds ("Retry after 596 seconds."),
        # in whichever shape the reply has.
        text = json.dumps(answer)
        for i, said in enumerate(re.findall(r"etry after (\d+) second", text)):
            left[f"said.{i}"] = said
        return json.loads(re.sub(r"etry after \d+ second", "etry after N second", text)), left

    (wa, wl), (na, nl) = strip(w), strip(n)
    limits = {**TIME_LEFT_MS, **TIME_LEFT_S, "body.retry_after_seconds": 1, "body.retry_after_ms": 1000}
    return wa == na and wl.keys() == nl.keys() and all(close(wl[k], nl[k], limits.get(k, 1)) for k in wl)


def loopguard_counters(envoy: h.Envoy) -> dict[str, int]:
    return {k: v for k, v in envoy.stats().items() if k.startswith("wasmcustom.loopguard")}


def side_by_side(plugin: dict, steps: list[dict]) -> tuple[dict, dict]:
    """Send every step to a Wasm and a native Envoy at the same moment
    (after the step's `wait`); what each client read, and each Envoy's
    decisions and counters."""
    ups = {host: h.Upstream(Answers(steps, "x-agree-id")) for host in ("wasm", "native")}
    envoys = {}
    for host in ("wasm", "native"):
        e = h.Envoy(h.bootstrap(plugin, ups[host].port, hold=True, buffer_limit=8 << 20, host=host), concurrency=2, name=host)
        envoys[host] = (e, decision_log(e, "x-agree-id"))
    seen: dict[str, dict] = {"wasm": {}, "native": {}}
    try:
        for e, _ in envoys.values():
            e.start()
        clients = {host: httpx.Client(base_url=e.url, timeout=30) for host, (e, _) in envoys.items()}
        go = threading.Barrier(2)

        def send(host: str, s: dict) -> None:
            go.wait(timeout=30)
            resp = clients[host].request(s["method"], s["path"], content=s["body"],
                                         headers={**s["headers"], "x-agree-id": s["id"]})
            seen[host][s["id"]] = answer_of(resp)

        with ThreadPoolExecutor(2) as pool:
            for s in steps:
                if s.get("wait"):
                    time.sleep(s["wait"])  # the traffic's own pace (a window expiring), not a wait for an event
                for f in [pool.submit(send, host, s) for host in ("wasm", "native")]:
                    f.result(timeout=60)
        for c in clients.values():
            c.close()
        ids = {s["id"] for s in steps}
        for host, (e, log) in envoys.items():
            for sid, d in decisions(log, ids, timeout=15).items():
                if sid in seen[host]:
                    seen[host][sid]["decision"] = d
            # What went on to the provider: the request as loopguard left it
            # (a nudge or a directive rewrites the body).
            for r in ups[host].requests:
                sid = r["headers"].get("x-agree-id", "")
                if sid in seen[host]:
                    seen[host][sid]["forwarded"] = {"path": r["path"], "body": r["body"],
                                                   "headers": {k: v for k, v in r["headers"].items() if k.startswith("x-loopguard")}}
        # Counters are flushed to the admin as they change; wait until both
        # have counted every request.
        counted = {host: loopguard_counters(e) for host, (e, _) in envoys.items()}
        h.wait_for(lambda: counted.update({host: loopguard_counters(e) for host, (e, _) in envoys.items()})
                   or counted["wasm"] == counted["native"], timeout=5)
        return seen, counted
    finally:
        for e, _ in envoys.values():
            e.stop()
        for up in ups.values():
            up.stop()


def assert_same(steps: list[dict], seen: dict, counted: dict) -> int:
    """Every request answered alike by both hosts; returns how many
    loopguard acted on (so an agreement is never about nothing)."""
    acted = 0
    for s in steps:
        w, n = seen["wasm"][s["id"]], seen["native"][s["id"]]
        assert same_but_time_left(w, n), f"{s['id']}: the hosts differ\nwasm:   {w}\nnative: {n}"
        d = w.get("decision") or {}
        acted += isinstance(d, dict) and d.get("action") in ("warn", "throttle", "nudge", "directive", "reject", "note", "block")
    assert counted["wasm"] == counted["native"], {
        k: (counted["wasm"].get(k), counted["native"].get(k))
        for k in set(counted["wasm"]) | set(counted["native"]) if counted["wasm"].get(k) != counted["native"].get(k)}
    assert counted["wasm"], "no loopguard counter at all"
    return acted


@pytest.mark.parametrize("name", ["tuning", "heldout"])
def test_the_hosts_agree_on_the_labelled_corpora(name):
    plugin = {**corpus.plugin_config(corpus.recommended_for(name)), "access_log": "all"}
    steps = corpus_steps(corpus.load_scenarios(name, per_kind=1))
    seen, counted = side_by_side(plugin, steps)
    assert assert_same(steps, seen, counted) >= 6
    # Requests the ladder rewrote on their way (a nudge, a directive) were
    # compared as the provider got them.
    rewritten = [s for s in steps if seen["wasm"][s["id"]].get("forwarded", {}).get("body", s["body"]) != s["body"]]
    assert rewritten, "no request was rewritten: the comparison of forwarded bodies compared nothing"


def test_the_hosts_agree_on_real_runs():
    """Two runs of each request shape (text actions, OpenAI tool calls,
    Anthropic tool use), one stuck and one successful, recommended setup."""
    plugin, steps = real_runs_slice()
    seen, counted = side_by_side(plugin, steps)
    assert assert_same(steps, seen, counted) >= 2


def test_the_hosts_agree_on_windows_cooldowns_actions_and_retries():
    """The replay tests' mix (windows that expire, a cooldown, a throttle's
    growing delay, warnings, a path no policy covers, a provider's 503s
    with the SDK's retries), and shadow mode, a query read in sorted order,
    the caller's address as its key, and OpenAI, Anthropic and plain HTTP
    callers, so each API's 429 is compared byte for byte."""
    plugin, steps = windows_mix()
    def spec(prefix: str, threshold: int, **extra) -> dict:
        return {"selector": {"pathPrefix": prefix, "methods": ["POST"]}, "limit_keys": ["header:x-user"],
                "loop_detection": {"enabled": True, "window_seconds": 2, "similarity": "exact",
                                   "threshold_identical_requests": threshold, "action": "reject"}, **extra}
    plugin["policies"] += [
        {"id": "shadow", "spec": spec("/v1/shadow", 2, mode="shadow")},
        {"id": "chat", "spec": spec("/v1/chat/completions", 3)},
        {"id": "messages", "spec": spec("/v1/messages", 3)},
        {"id": "query", "spec": spec("/v1/q", 3, selector={"pathPrefix": "/v1/q", "methods": ["GET"]})},
        # The caller is its address (the downstream's, port aside).
        {"id": "by-ip", "spec": spec("/v1/ip", 2, limit_keys=["ip:address"])},
    ]
    chat = json.dumps({"model": "gpt-x", "messages": [{"role": "user", "content": "again"}]})
    messages = json.dumps({"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "again"}]})
    more = [*[("/v1/shadow", "a", "{}")] * 3, *[("/v1/chat/completions", "a", chat)] * 4,
            *[("/v1/messages", "a", messages)] * 4, ("/v1/ip", "a", "{}"), ("/v1/ip", "b", "{}")]
    steps += [{"id": f"more/{i}", "method": "POST", "path": p, "headers": {"x-user": u, "content-type": "application/json"},
               "body": b.encode()} for i, (p, u, b) in enumerate(more)]
    # The query read in sorted order: one fingerprint for all three.
    steps += [{"id": f"query/{i}", "method": "GET", "path": q, "headers": {"x-user": "q"}, "body": b""}
              for i, q in enumerate(["/v1/q?b=2&a=1", "/v1/q?a=1&b=2", "/v1/q?b=2&a=1", "/v1/q?a=1&c=3"])]
    seen, counted = side_by_side(plugin, steps)
    assert assert_same(steps, seen, counted) >= 10
    statuses = [seen["wasm"][s["id"]]["status"] for s in steps]
    assert statuses.count(429) >= 6, statuses
    assert [seen["wasm"][f"query/{i}"]["status"] for i in range(4)] == [200, 200, 429, 200]
    ip_steps = [s["id"] for s in steps if s["path"] == "/v1/ip"]
    assert [seen["wasm"][i]["status"] for i in ip_steps] == [200, 429]
    delays = [seen["wasm"][f"mix/{i}"]["headers"].get("x-loopguard-delay-ms") for i in range(11, 17)]
    assert delays == [None, "100", "150", "200", "200", "200"], delays


def test_the_hosts_agree_on_spend_caps():
    """The replay tests' caps: dollars, tokens and calls, per session,
    caller and conversation, read from the answers' usage; a cap in shadow
    mode; a cap beside loop detection."""
    plugin, steps = spend_caps_mix()
    seen, counted = side_by_side(plugin, steps)
    assert assert_same(steps, seen, counted) >= 3
    budgets = [seen["wasm"][s["id"]]["headers"].get("x-loopguard-budget") for s in steps]
    assert "session-usd; spent=0.80; cap=1.00; unit=usd; window=600" in budgets, budgets


def mcp_call(i: int, name: str, args: dict) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": name, "arguments": args}}).encode()


def test_the_hosts_agree_on_mcp_tool_calls():
    """The shipped MCP example's policy: the same tools/call again and again
    (noted in the answer, then refused in JSON-RPC's shape), a failing call,
    a poll of an exempt tool; answered as JSON and as an event stream."""
    example = h.load_yaml(ROOT / "examples" / "mcp" / "envoy.yaml")
    hcm = example["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    (f,) = [f for f in hcm["http_filters"] if h.is_loopguard_filter(f)]
    plugin = {**h.plugin_config_of(f), "access_log": "all"}
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-session-id": "s-1", "mcp-protocol-version": "2025-11-25"}
    result = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    failed = {"content": [{"type": "text", "text": "no such file"}], "isError": True}
    steps = []
    for i in range(5):
        steps.append({"id": f"mcp/same/{i}", "method": "POST", "path": "/mcp", "headers": headers,
                      "body": mcp_call(10 + i, "read_file", {"path": "a.txt"}),
                      "answer": {"jsonrpc": "2.0", "id": 10 + i, "result": result}})
    for i in range(5):
        steps.append({"id": f"mcp/fail/{i}", "method": "POST", "path": "/mcp", "headers": headers,
                      "body": mcp_call(20 + i, "open", {"path": "missing.txt"}),
                      "answer": {"jsonrpc": "2.0", "id": 20 + i, "result": failed}})
    for i in range(5):
        steps.append({"id": f"mcp/other/{i}", "method": "POST", "path": "/mcp", "headers": headers,
                      "body": mcp_call(30 + i, "search", {"q": f"term {i}"}),
                      "answer": {"jsonrpc": "2.0", "id": 30 + i, "result": result}})
    for i in range(5):
        steps.append({"id": f"mcp/stream/{i}", "method": "POST", "path": "/mcp", "headers": headers,
                      "body": mcp_call(40 + i, "list_dir", {"path": "src"}), "stream": True,
                      "answer": {"jsonrpc": "2.0", "id": 40 + i, "result": result}})
    seen, counted = side_by_side(plugin, steps)
    assert assert_same(steps, seen, counted) >= 6
    # Noted (the answer rewritten) at the 3rd, blocked from the 4th.
    steps_of = {s["id"]: seen["wasm"][s["id"]].get("decision") or {} for s in steps}
    assert [steps_of[f"mcp/same/{i}"].get("action") for i in range(5)] == [None, None, "note", "block", "block"], steps_of
    assert [steps_of[f"mcp/other/{i}"].get("action") for i in range(5)] == [None] * 5
    # Answered as event streams: the note goes into the stream's result.
    assert [steps_of[f"mcp/stream/{i}"].get("action") for i in range(5)] == [None, None, "note", "block", "block"], steps_of
    assert b"[loopguard]" in seen["wasm"]["mcp/stream/2"]["body"], seen["wasm"]["mcp/stream/2"]


def test_every_callback_the_module_binds_is_exercised_by_a_native_run():
    """docs/native.md names, for each callback of the dynamic-module ABI the
    module binds, the tests that exercise it: each is run with the native
    host (the Makefile's E2E_NATIVE_FILES) or is this file."""
    import re

    make = (ROOT / "Makefile").read_text()
    listed = re.search(r"^E2E_NATIVE_FILES :=((?:.*\\\n)*.*)$", make, re.M)
    assert listed, "the Makefile lists no E2E_NATIVE_FILES"
    native_files = {f"{name}.py" for name in listed.group(1).replace("\\\n", " ").split()}
    doc = (ROOT / "docs" / "native.md").read_text()
    table = doc[doc.index("## Each callback and the test that exercises it"):]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 15, rows
    for row in rows:
        cell = row.rsplit("|", 2)[-2].strip()
        named = set(re.findall(r"`(test_\w+\.py)`", cell))
        assert named or cell == "every test", f"no test named for {row}"
        for f in named:
            assert (ROOT / "tests" / "e2e" / f).is_file(), f"docs/native.md names {f}, which does not exist"
            assert f in native_files | {"test_hosts_agree.py"}, f"{f} exercises {row.split('|')[1].strip()} but is not run natively"
