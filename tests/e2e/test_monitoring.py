"""The Grafana dashboard and the Prometheus alert rules of monitoring/,
against a real Prometheus scraping real Envoys.

One Prometheus (the Debian binary, on loopback, scraping every second)
scrapes two Envoys through their admin /stats/prometheus, with the
stats_tags of envoy/envoy.yaml, and evaluates the rule file every second:

- the main Envoy runs loopguard with four policies, driven into loops: an
  exact `reject` policy (many loops from one caller, and oversized bodies),
  a `shadow` policy, a throttling `slow` policy, and an LLM `agents` policy
  (llm_tail with a warn-then-reject escalation, tool_loops, and `prices`)
  in front of an upstream answering with OpenAI-style `usage`; and two
  budget policies: `spend` (caps on calls, tokens and dollars per caller,
  warning from half the calls cap) whose callers are driven past the calls
  cap (warned, near the cap, rejected) and sent responses without usage
  (estimated), and `spend-shadow`, a shadow policy whose caller runs over
  its cap (would-be rejections);
- a second Envoy runs the fault-injection build of the module with
  FAIL_RELOAD, crashed once, so Envoy reloads its VM;
- a third Envoy runs the shipped examples/mcp/envoy.yaml (its policy
  `mcp-tools`, plus a shadow MCP policy `mcp-shadow` with an exempt tool on
  /shadow/) in front of the real MCP server of tests/e2e/mcp_apps, which the
  Python MCP SDK client (tests/e2e/mcp_apps/client.py, in both of its
  protocol modes) drives into tool-call loops: noted, then blocked over and
  over (an MCP loop storm); and raw POSTs that are not JSON-RPC or whose
  Mcp-Method header disagrees with the body pass unjudged.

Then every dashboard query (Grafana's variables substituted) and every
alert expression is evaluated through Prometheus's HTTP API at one moment:
each must evaluate without error, and those listed in LIT must return a
series with the listed labels and a value above zero (so a renamed metric
or label fails here). The rest are listed in EVALUATE_ONLY with the reason
the traffic cannot light them. Every query of the dashboard must be in
exactly one of the two lists.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from harness import (FAULT_WASM, ROOT, ROUTER, Envoy, Upstream, bootstrap, buffer_filter, free_port, load_yaml, localize, plugin,
                     plugin_config_of, policy, set_plugin_config, stop_process, wait_for, wasm_filter)
from mcp_agents import McpServer, run_client

DASHBOARD = ROOT / "monitoring" / "grafana" / "loopguard.json"
RULES = ROOT / "monitoring" / "prometheus" / "loopguard-alerts.yaml"
WRAPPER = ROOT / "monitoring" / "prometheus" / "prometheusrule.sh"
# What Grafana's variables become in the queries sent here: a rate window
# well past the traffic phase's length (10 to 30 s today), so early traffic
# still counts when the queries run.
RATE_INTERVAL = "5m"
RANGE = "5m"

# --- the dashboard's queries and the rules' expressions ------------------------


def dashboard_targets() -> dict[tuple[str, str], str]:
    """(panel title, refId) -> PromQL expression, for every query."""
    d = json.loads(DASHBOARD.read_text())
    out = {}
    for p in d["panels"]:
        for panel in [p, *p.get("panels", [])]:
            for t in panel.get("targets", []):
                out[(panel["title"], t["refId"])] = t["expr"]
    return out


def alert_rules() -> dict[str, str]:
    return {r["alert"]: r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}


def substitute(expr: str, policy: str = ".*") -> str:
    """A dashboard query as Grafana sends it: `$policy` as a regex (All is
    `.*`), the interval variables as fixed durations."""
    values = {"policy": policy, "__rate_interval": RATE_INTERVAL, "__interval": RATE_INTERVAL, "__range": RANGE}

    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"unknown variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


TARGETS = dashboard_targets()
ALERTS = alert_rules()
HEX12 = "[0-9a-f]{12}"

# Queries the traffic below lights up: each must return, for every label
# set listed, a series whose labels match it (values are regexes matched in
# full; "{main}" and "{fault}" are the two Envoys' instance labels) with a
# value above 0.
LIT: dict[tuple[str, str], list[dict[str, str]]] = {
    ("Loops detected", "A"): [{}],
    ("Requests rejected", "A"): [{}],
    ("Share of tokens spent in loops", "A"): [{}],
    ("Dollars spent in loops", "A"): [{}],
    ("Dollars avoided (estimate)", "A"): [{}],
    ("VM reloads after crashes", "A"): [{}],
    ("Requests matched per policy", "A"): [{"policy": p} for p in ("reject", "shadow", "slow", "agents")],
    ("Loops detected per policy", "A"): [
        {"policy": "reject", "mode": "enforce"}, {"policy": "shadow", "mode": "shadow"}, {"policy": "agents", "mode": "enforce"}],
    ("Actions taken", "A"): [{"policy": "reject"}, {"policy": "agents"}],
    ("Actions taken", "B"): [{"policy": "slow"}],
    ("Actions taken", "C"): [{"policy": "agents"}],
    ("Shadow would-be actions", "A"): [{"policy": "shadow", "action": "reject"}],
    ("Tool loops by tier and step", "A"): [
        {"policy": "agents", "tier": "identical", "step": "nudge"}, {"policy": "agents", "tier": "identical", "step": "reject"}],
    # The reject policy's caller loops in two rounds with a scrape between
    # them: its series (defined when first counted) grows after its first
    # sample. The agents policy's caller loops within one scrape interval.
    ("Top looping callers", "A"): [{"policy": "reject", "caller": HEX12}],
    ("Tokens spent in loops and outside", "A"): [
        {"token_type": t, "loop": lp} for t in ("input", "output") for lp in ("true", "false")],
    ("Tokens in loops by policy and model", "A"): [{"policy": "agents", "model": "gpt-4o-mini"}],
    ("Tokens avoided (estimate)", "A"): [{"policy": "agents", "token_type": "input"}, {"policy": "agents", "token_type": "output"}],
    ("Dollars per hour: in loops, outside, avoided", "A"): [{"policy": "agents"}],
    ("Dollars per hour: in loops, outside, avoided", "B"): [{"policy": "agents"}],
    ("Dollars per hour: in loops, outside, avoided", "C"): [{"policy": "agents"}],
    ("Dollars by model over the time range", "A"): [{"policy": "agents", "model": "gpt-4o-mini"}],
    ("Dollars by model over the time range", "B"): [{"policy": "agents", "model": "gpt-4o-mini"}],
    ("Dollars by model over the time range", "C"): [{"policy": "agents", "model": "gpt-4o-mini"}],
    ("Responses without usage", "A"): [{"policy": "agents"}],
    ("Table entries used", "A"): [{"instance": "{main}"}],
    ("Bodies skipped by reason", "A"): [{"reason": "too_large"}],
    ("Share of matched requests with a skipped body", "A"): [{"instance": "{main}"}],
    ("VM reloads", "A"): [{"instance": "{fault}"}],
    ("MCP calls judged", "A"): [{"policy": "mcp-tools"}, {"policy": "mcp-shadow"}],
    ("MCP calls judged", "B"): [{"policy": "mcp-shadow"}],
    ("MCP loops acted on by tier and step", "A"): [
        {"policy": "mcp-tools", "tier": "identical", "step": "note"},
        {"policy": "mcp-tools", "tier": "identical", "step": "block"}],
    ("MCP shadow would-be actions", "A"): [
        {"policy": "mcp-shadow", "tier": "identical", "step": "note"},
        {"policy": "mcp-shadow", "tier": "identical", "step": "block"}],
    ("MCP traffic passed unjudged by reason", "A"): [
        {"policy": "mcp-tools", "reason": "malformed"}, {"policy": "mcp-tools", "reason": "headers_disagree"}],
    # Budgets: the agent's key spends in round 2 on every budget of `spend`
    # (the first caller's, spent in round 1 only, stays flat).
    ("Spend per budget over the time range", "A"): [
        *({"policy": "spend", "budget": b} for b in ("calls-10m", "tokens-hour", "usd-hour")),
        {"policy": "spend-shadow", "budget": "calls-10m"}],
    ("Top spenders per budget", "A"): [
        *({"policy": "spend", "budget": b, "key": HEX12} for b in ("calls-10m", "tokens-hour", "usd-hour")),
        {"policy": "spend-shadow", "budget": "calls-10m", "key": HEX12}],
    ("Budget rejections", "A"): [{"policy": "spend", "budget": "calls-10m"}],
    ("Budget warnings and near cap", "A"): [{"policy": "spend", "budget": "calls-10m"}],
    ("Budget warnings and near cap", "B"): [{"policy": "spend", "budget": "calls-10m"}],
    ("Budget shadow would-be rejections", "A"): [{"policy": "spend-shadow", "budget": "calls-10m"}],
    ("Budget spending estimated", "A"): [{"policy": "spend"}],
}
# Queries that must evaluate without error; this traffic cannot light them.
EVALUATE_ONLY: dict[tuple[str, str], str] = {
    ("Degenerate outputs", "A"): "needs a streamed response repeating itself",
    ("Redis store calls by result", "A"): "needs the Redis store",
    ("Store fallbacks and fail-open", "A"): "needs a failing Redis store",
    ("Store fallbacks and fail-open", "B"): "needs a failing local table",
    ("Table contention and evictions", "A"): "compare-and-swap races are chance",
    ("Table contention and evictions", "B"): "needs a full table",
    ("VM reloads", "B"): "needs a reload that fails",
    ("VM reloads", "C"): "needs a request inside the reload backoff",
    ("Budget calls unpriced, priced by the upstream, tunnels", "A"): "needs a model no price names under a dollar cap",
    ("Budget calls unpriced, priced by the upstream, tunnels", "B"): "needs an upstream that reports its cost",
    ("Budget calls unpriced, priced by the upstream, tunnels", "C"): "needs a WebSocket or CONNECT under a budget",
}
# Alert expressions: those the traffic must light (with these labels), and
# those that must return nothing for it.
ALERTS_LIT: dict[str, list[dict[str, str]]] = {
    "LoopguardLoopStorm": [{"policy": "reject", "mode": "enforce"}],
    "LoopguardCallerLoopingLong": [{"policy": "reject", "caller": HEX12}],
    "LoopguardVmReloading": [{"instance": "{fault}"}],
    "LoopguardBodiesSkipped": [{"instance": "{main}"}],
    "LoopguardMcpLoopStorm": [{"policy": "mcp-tools"}],
    "LoopguardMcpUnjudged": [{"policy": "mcp-tools"}],
    "LoopguardBudgetNearCap": [{"policy": "spend", "budget": "calls-10m"}],
    "LoopguardBudgetRejecting": [{"policy": "spend", "budget": "calls-10m"}],
}
ALERTS_QUIET = {"LoopguardStoreFailingOpen", "LoopguardBudgetUnpriced"}
# Alerts Prometheus itself must hold once it has evaluated the rules: no
# `for` fires at once; the others wait in pending.
ALERT_STATES = {
    "LoopguardVmReloading": "firing",
    "LoopguardBudgetNearCap": "firing",
    "LoopguardBudgetRejecting": "firing",
    "LoopguardLoopStorm": "pending",
    "LoopguardCallerLoopingLong": "pending",
    "LoopguardBodiesSkipped": "pending",
    "LoopguardMcpLoopStorm": "pending",
    "LoopguardMcpUnjudged": "pending",
}

# --- the traffic ------------------------------------------------------------------

PRICES = {"gpt-4o-mini": {"input_per_million": 2.5, "output_per_million": 10}}
CONFIG = plugin(
    [
        policy("reject", threshold=3, selector={"pathPrefix": "/r/"}),
        policy("shadow", threshold=2, mode="shadow", selector={"pathPrefix": "/s/"}),
        policy("slow", threshold=2, action="throttle", throttle_step_ms=10, selector={"pathPrefix": "/t/"}),
        {"id": "agents", "spec": {
            "selector": {"pathPrefix": "/v1/", "methods": ["POST"]},
            "loop_detection": {"enabled": True, "window_seconds": 60, "similarity": "llm_tail",
                               "escalation": [{"at": 2, "action": "warn"}, {"at": 4, "action": "reject"}]},
            "tool_loops": {"enabled": True},
        }},
    ],
    max_body_bytes=65536,
    prices=PRICES,
)
# Budgets (the `budget` block of a policy). The windows outlast the test,
# so nothing slides out of them while it runs.
BUDGET_CALLS = 5
CONFIG["policies"] += [
    {"id": "spend", "spec": {
        **policy("spend", threshold=10, selector={"pathPrefix": "/b/", "methods": ["POST"]})["spec"],
        "budget": {
            "limits": [
                {"name": "calls-10m", "per": "caller", "window_seconds": 600, "calls": BUDGET_CALLS},
                {"name": "tokens-hour", "per": "caller", "window_seconds": 3600, "tokens": 1_000_000_000},
                {"name": "usd-hour", "per": "caller", "window_seconds": 3600, "usd": 1000},
            ],
            "warn_at": 0.5,
        },
    }},
    {"id": "spend-shadow", "spec": {
        **policy("spend-shadow", threshold=10, mode="shadow", selector={"pathPrefix": "/bs/", "methods": ["POST"]})["spec"],
        "budget": {"limits": [{"name": "calls-10m", "per": "caller", "window_seconds": 600, "calls": 2}]},
    }},
]
# The stats tags of the budget metrics (`.budget.<name>`, `.key.<tag>`),
# placed before `model` (the last tag, which takes the rest of the name)
# when envoy/envoy.yaml does not carry them.
BUDGET_TAGS = [
    {"tag_name": "budget", "regex": r"^wasmcustom\.loopguard\..*(\.budget\.([^.]+))"},
    {"tag_name": "key", "regex": r"^wasmcustom\.loopguard\..*(\.key\.([^.]+))"},
]
# Distinct loops the reject policy's caller runs: enough for the storm
# alert's rate (> 5 a minute over 5 minutes, i.e. > 25 in the window).
STORM_LOOPS = 40
BIG_BODIES = 30


def provider(request: dict) -> tuple[int, dict]:
    """OpenAI Chat Completions with usage; without it under a path holding
    /nousage/."""
    try:
        body = json.loads(request["body"] or b"{}")
    except ValueError:
        body = {}
    answer = {
        "id": "chatcmpl-mon", "object": "chat.completion", "created": 1, "model": body.get("model", "gpt-4o-mini"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Still checking."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12000, "completion_tokens": 800, "total_tokens": 12800},
    }
    if "/nousage/" in request["path"]:
        del answer["usage"]
    return 200, answer


def tool_history(calls: int, topic: str) -> list[dict]:
    """A conversation in which the model called the same tool with the same
    arguments `calls` times."""
    messages = [{"role": "user", "content": f"Is the {topic} build green?"}]
    call = {"type": "function", "function": {"name": "get_build_status", "arguments": "{\"branch\": \"main\"}"}}
    for i in range(calls):
        messages.append({"role": "assistant", "content": None, "tool_calls": [dict(call, id=f"call_{topic}_{i}")]})
        messages.append({"role": "tool", "tool_call_id": f"call_{topic}_{i}", "content": "ERROR: CI API timed out"})
    return messages


def reject_loops(c: httpx.Client, first: int, count: int) -> list[int]:
    codes = []
    for i in range(first, first + count):
        codes += [c.post(f"/r/loop/{i}", content=f"loop {i}".encode()).status_code for _ in range(3)]
    return codes


def budget_calls(url: str, caller: str, count: int, path: str = "/b/v1/chat/completions") -> list[int]:
    """`count` different chat completions of one caller (its API key),
    one after the other (a call is counted when its response ends)."""
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {caller}"}, timeout=30) as c:
        ask = lambda i: {"model": "gpt-4o-mini", "messages": [  # noqa: E731
            {"role": "user", "content": f"Step {i} of task {uuid.uuid4().hex}"}]}
        return [c.post(path, json=ask(i)).status_code for i in range(count)]


def budget_round(url: str, first: bool) -> None:
    """Budget traffic in two rounds (each series is defined when first
    counted: its first sample is not 0, so round 1 defines and round 2,
    once Prometheus has them, grows them). Under `spend`'s cap of 5 calls
    (warning from 2.5, near the cap from 4): round 1 runs one caller to its
    cap (calls 4 and 5 warned, 5 and 6 near the cap, 6 rejected) and makes
    the first call of another; round 2 runs that one to its cap. The
    shadow caller goes over its cap of 2 in both rounds, and one response
    without usage each round is estimated."""
    ok, capped = [200] * BUDGET_CALLS, [429]
    if first:
        assert budget_calls(url, "sk-budget-first", BUDGET_CALLS + 1) == ok + capped
        assert budget_calls(url, "sk-budget-agent", 1) == [200]
        assert budget_calls(url, "sk-budget-shadow", 3, "/bs/v1/chat/completions") == [200] * 3
    else:
        assert budget_calls(url, "sk-budget-agent", BUDGET_CALLS) == ok[1:] + capped
        assert budget_calls(url, "sk-budget-shadow", 1, "/bs/v1/chat/completions") == [200]
    assert budget_calls(url, "sk-budget-nousage", 1, "/b/nousage/chat/completions") == [200]


def _budget_total(e: Envoy) -> float:
    return sum(v for k, v in e.prometheus().items() if k.startswith("loopguard_budget_"))


# --- MCP ------------------------------------------------------------------------

MCP_EXAMPLE = ROOT / "examples" / "mcp" / "envoy.yaml"
# Calls of the looping MCP agent blocked in the second round: enough for
# LoopguardMcpLoopStorm (more than 20 in 10 minutes, counted from the first
# sample of the series, which the first round defines).
MCP_STORM = 25
BLOCKED = "[loopguard] This call was not run: "


def mcp_gateway(server_port: int) -> dict:
    """The shipped MCP example pointed at `server_port`, with a shadow
    policy (its own tool `read` exempt) on /shadow/, rewritten to /mcp."""
    cfg = localize(load_yaml(MCP_EXAMPLE), {"mcp_server": server_port})
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    [wasm] = [f for f in hcm["http_filters"] if f["name"] == "loopguard"]
    plugin_config = plugin_config_of(wasm)
    [example] = plugin_config["policies"]
    plugin_config["policies"].append({"id": "mcp-shadow", "spec": {
        "mode": "shadow", "selector": {"pathPrefix": "/shadow/"},
        "mcp": {**example["spec"]["mcp"], "exempt_tools": ["read"]}}})
    set_plugin_config(wasm, plugin_config)
    hcm["route_config"]["virtual_hosts"][0]["routes"].insert(
        0, {"match": {"prefix": "/shadow/"}, "route": {"cluster": "mcp_server", "timeout": "0s", "prefix_rewrite": "/"}})
    return cfg


def mcp_agent(url: str, mode: str, script: list[dict]) -> list[dict]:
    """The Python MCP SDK client running `script` in `mode` (auto:
    2026-07-28 stateless, legacy: 2025-11-25 sessions) as a caller of its
    own; its output line of each step."""
    return list(run_client(f"python-{mode}", url, script, uuid.uuid4().hex[:10]).values())


def search(query: str) -> dict:
    return {"call": "search", "args": {"query": query}}


def mcp_round(e: Envoy, repeats: int, unjudged: tuple[int, int]) -> None:
    """One round of MCP traffic: an agent repeating one search `repeats`
    times under `mcp-tools` (3 real results, the 3rd with a note, then
    blocked), an agent looping 4 times and reading (exempt) under
    `mcp-shadow` (all real), and raw POSTs passed unjudged: `unjudged[0]`
    not JSON-RPC, `unjudged[1]` with an Mcp-Method that disagrees."""
    t = uuid.uuid4().hex[:8]
    # Both protocol modes, in turn: sessions in one round, none in the other.
    enforce_mode, shadow_mode = ("legacy", "auto") if repeats <= 4 else ("auto", "legacy")
    with ThreadPoolExecutor(2) as pool:
        enforce = pool.submit(mcp_agent, f"{e.url}/mcp", enforce_mode, [search(f"storm {t}")] * repeats)
        shadow = pool.submit(mcp_agent, f"{e.url}/shadow/mcp", shadow_mode,
                             [search(f"shadow {t}")] * 4 + [{"call": "read", "args": {"path": f"/{t}"}}])
        with httpx.Client(base_url=e.url, timeout=10, headers={"accept": "application/json, text/event-stream"}) as c:
            for _ in range(unjudged[0]):
                c.post("/mcp", content=b"not json-rpc", headers={"content-type": "application/json"})
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search", "arguments": {}}}
            for _ in range(unjudged[1]):
                c.post("/mcp", json=call, headers={"mcp-method": "tools/list", "mcp-protocol-version": "2026-07-28"})
        enforce, shadow = enforce.result(), shadow.result()
    for step in enforce[:3] + shadow:
        assert step["exception"] is None and step["is_error"] is False, step
    assert len(enforce[2]["texts"]) == 2, enforce[2]  # the note
    for step in enforce[3:]:
        assert step["is_error"] is True and step["text"].startswith(BLOCKED), step


def mcp_traffic(e: Envoy, prom: "Prometheus", instance: str) -> None:
    """Round 1 defines every MCP series (each is defined when first
    counted: its first sample is not 0); round 2, once Prometheus has
    them, grows them all: the MCP loop storm and the unjudged traffic."""
    mcp_round(e, 4, (1, 1))
    first = sum(v for k, v in e.prometheus().items() if k.startswith("loopguard_mcp_"))
    scraped = f'sum({{__name__=~"loopguard_mcp_.+_total",instance="{instance}"}})'
    assert wait_for(lambda: prom.value(scraped) == first, timeout=15, interval=0.2), (
        f"prometheus never scraped the first MCP counts ({first}): {prom.value(scraped)}")
    mcp_round(e, 3 + MCP_STORM, (20, 5))


# --- Prometheus -----------------------------------------------------------------


class Prometheus:
    """A real Prometheus on loopback: scrapes `targets` (host:port) at
    /stats/prometheus every second and evaluates `rules` every second."""

    def __init__(self, targets: list[str], rules: Path) -> None:
        binary = shutil.which("prometheus")
        if not binary:
            pytest.fail("prometheus is not installed: run the tests through `make test` (make test-tools installs it)")
        self.dir = Path(tempfile.mkdtemp(prefix="loopguard-prometheus-"))
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "envoy", "metrics_path": "/stats/prometheus",
                                "static_configs": [{"targets": targets}]}],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = self.dir / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=self.dir,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        ready = lambda: self.proc.poll() is None and self._get("/-/ready") == 200  # noqa: E731
        if not wait_for(ready, timeout=30, interval=0.2):
            log = self.log()
            self.stop()
            raise AssertionError(f"prometheus did not become ready:\n{log[-5000:]}")

    def _get(self, path: str) -> int:
        try:
            return httpx.get(self.url + path, timeout=2).status_code
        except httpx.HTTPError:
            return 0

    def api(self, path: str, **params) -> dict:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise QueryError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        assert data["resultType"] == "vector", f"{expr}: a {data['resultType']}, not an instant vector"
        return data["result"]

    def value(self, expr: str) -> float | None:
        try:
            result = self.query(expr)
        except (QueryError, httpx.HTTPError):
            return None
        return float(result[0]["value"][1]) if result else None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class QueryError(Exception):
    pass


@dataclass
class Observed:
    """Everything evaluated at one moment, after the traffic."""

    main: str
    fault: str
    at: float
    results: dict[tuple[str, str], list[dict] | QueryError] = field(default_factory=dict)
    per_policy: dict[tuple[str, str], list[dict] | QueryError] = field(default_factory=dict)
    alerts: dict[str, list[dict] | QueryError] = field(default_factory=dict)
    alert_states: dict[str, set[str]] = field(default_factory=dict)
    rules: list[dict] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _evaluate(prom: Prometheus, expr: str, at: float) -> list[dict] | QueryError:
    try:
        return prom.query(expr, at)
    except QueryError as e:
        return e


def _loopguard_total(e: Envoy) -> float:
    """The sum of every loopguard counter of an Envoy's /stats/prometheus."""
    return sum(v for k, v in e.prometheus().items() if k.startswith("loopguard_") and k.split("{")[0].endswith("_total"))


@pytest.fixture(scope="module")
def observed():
    if not Path(FAULT_WASM).exists():
        pytest.fail(f"{FAULT_WASM} is missing: run the tests through `make test`, which builds it")
    stats_config = load_yaml(ROOT / "envoy" / "envoy.yaml")["stats_config"]
    tags = stats_config["stats_tags"]
    names = [t["tag_name"] for t in tags]
    before = names.index("model") if "model" in names else len(tags)
    tags[before:before] = [t for t in BUDGET_TAGS if t["tag_name"] not in names]
    up = Upstream(responder=provider)
    started: list[Envoy] = []
    prom = None
    mcp_server = McpServer("sse", wait=False)
    try:
        cfg = bootstrap(CONFIG, up.port)
        cfg["stats_config"] = stats_config
        main = Envoy(cfg, name="main")
        started.append(main)
        main.start()

        # The Wasm VM's reload (the dashboard's and the rules' VM series):
        # a Wasm filter under either host.
        fcfg = bootstrap(None, up.port, http_filters=[wasm_filter(plugin([policy("p", threshold=3)])), buffer_filter(), ROUTER])
        fcfg["stats_config"] = stats_config
        wasm = fcfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]
        wasm["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = FAULT_WASM
        wasm["typed_config"]["config"]["failure_policy"] = "FAIL_RELOAD"
        wasm["typed_config"]["config"]["reload_config"] = {"backoff": {"base_interval": "0.1s"}}
        fault = Envoy(fcfg, concurrency=1, name="fault")
        started.append(fault)
        fault.start()

        mcp_server.ready()
        mcp = Envoy(mcp_gateway(mcp_server.port), name="mcp")
        started.append(mcp)
        mcp.start()

        mi, fi, pi = (f"127.0.0.1:{e.admin_port}" for e in (main, fault, mcp))
        prom = Prometheus([mi, fi, pi], RULES)
        # The Envoys scraped once before any traffic: every counter's
        # first sample is its 0, so increase() sees all that follows.
        every = f'instance=~"{mi}|{fi}|{pi}"'
        scraped = lambda: (  # noqa: E731
            prom.value(f"count(up{{{every}}} == 1)") == 3 and prom.value(f"count(loopguard_requests_total{{{every}}})") == 3
        )
        assert wait_for(scraped, timeout=30, interval=0.2), f"prometheus never scraped the Envoys:\n{prom.log()[-5000:]}"
        obs = Observed(main=mi, fault=fi, at=0.0)

        # The MCP traffic runs meanwhile, on its own Envoy.
        background = ThreadPoolExecutor(1)
        mcp_done = background.submit(mcp_traffic, mcp, prom, pi)
        background.shutdown(wait=False)

        # Budgets, round 1 (see budget_round); round 2 comes last, so that
        # its rates are inside the last minute when the queries run.
        budget_round(main.url, first=True)
        budget_scraped = lambda: prom.value(  # noqa: E731
            f'sum({{__name__=~"loopguard_budget_.+",instance="{mi}"}})') == _budget_total(main)
        if not wait_for(budget_scraped, timeout=15, interval=0.2):
            obs.notes.append(f"prometheus never scraped the first budget counts ({_budget_total(main)})")

        with httpx.Client(base_url=main.url, headers={"authorization": "Bearer sk-looping-agent"}, timeout=30) as c:
            # Round 1: the caller's first loops (its series is defined when
            # first counted: its first sample is not 0).
            assert reject_loops(c, 0, 3) == [200, 200, 429] * 3
            seen = wait_for(lambda: prom.value(f'count(loopguard_caller_loop_requests_total{{instance="{mi}"}})') is not None,
                            timeout=15, interval=0.2)
            if not seen:
                obs.notes.append("no loopguard_caller_loop_requests_total series with a caller label reached Prometheus "
                                 "(is the `caller` stats_tag in envoy/envoy.yaml?)")
                time.sleep(2)  # the pace: two scrapes (1 s apart) between the rounds
            # Round 2: the storm, oversized bodies, shadow, throttle.
            assert reject_loops(c, 3, STORM_LOOPS) == [200, 200, 429] * STORM_LOOPS
            big = [c.post(f"/r/big/{i}", content=b"x" * 100_000).status_code for i in range(BIG_BODIES)]
            assert big == [200] * BIG_BODIES
            assert [c.get("/s/x").status_code for _ in range(3)] == [200] * 3
            assert [c.get("/t/x").status_code for _ in range(3)] == [200] * 3

        with httpx.Client(base_url=main.url, headers={"authorization": "Bearer sk-llm-agent"}, timeout=30) as c:
            ask = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Is the build green?"}]}
            # 1 allowed, 2 and 3 warned (a detected loop: their tokens are
            # the loop's), 4 and 5 rejected (their tokens avoided).
            assert [c.post("/v1/chat/completions", json=ask).status_code for _ in range(5)] == [200, 200, 200, 429, 429]
            other = {"model": "mystery-model", "messages": [{"role": "user", "content": "Anything else?"}]}
            assert c.post("/v1/chat/completions", json=other).status_code == 200
            nousage = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "No usage, please."}]}
            assert c.post("/v1/nousage/chat/completions", json=nousage).status_code == 200
            nudged = {"model": "gpt-4o-mini", "messages": tool_history(3, "nudge")}
            assert c.post("/v1/chat/completions", json=nudged).status_code == 200
            blocked = {"model": "gpt-4o-mini", "messages": tool_history(5, "reject")}
            assert c.post("/v1/chat/completions", json=blocked).status_code == 429

        # The fault Envoy's VM crashes on a request; the next one reloads it.
        assert httpx.post(f"{fault.url}/v1/x", content=b"x", headers={"x-loopguard-fault": "crash"}, timeout=10).status_code == 503
        assert httpx.post(f"{fault.url}/v1/x", content=b"y", timeout=10).status_code == 200
        assert fault.stats().get("wasm.loopguard.vm_reload_success") == 1

        mcp_done.result(timeout=120)
        budget_round(main.url, first=False)
        # Wait until Prometheus holds the final counts of the Envoys (final
        # once every request is over).
        main.quiet()
        mcp.quiet()
        want, want_mcp = _loopguard_total(main), _loopguard_total(mcp)
        final = lambda: (  # noqa: E731
            prom.value(f'sum({{__name__=~"loopguard_.+_total",instance="{mi}"}})') == want
            and prom.value(f'sum({{__name__=~"loopguard_.+_total",instance="{pi}"}})') == want_mcp
            and prom.value(f'envoy_wasm_loopguard_vm_reload_success{{instance="{fi}"}}') == 1
        )
        assert wait_for(final, timeout=20, interval=0.2), "prometheus never scraped the final counts"
        # And until it has evaluated the rules on them.
        firing = lambda: any(  # noqa: E731
            a["labels"].get("alertname") == "LoopguardVmReloading" and a["state"] == "firing"
            for a in prom.api("alerts")["alerts"])
        if not wait_for(firing, timeout=20, interval=0.2):
            obs.notes.append("LoopguardVmReloading never fired")
        budget_firing = lambda: {"LoopguardBudgetNearCap", "LoopguardBudgetRejecting"} <= {  # noqa: E731
            a["labels"].get("alertname") for a in prom.api("alerts")["alerts"] if a["state"] == "firing"}
        if not wait_for(budget_firing, timeout=20, interval=0.2):
            obs.notes.append("LoopguardBudgetNearCap or LoopguardBudgetRejecting never fired")

        obs.at = time.time()
        for key, expr in TARGETS.items():
            obs.results[key] = _evaluate(prom, substitute(expr), obs.at)
            if "$policy" in expr or "${policy}" in expr:
                obs.per_policy[key] = _evaluate(prom, substitute(expr, "agents"), obs.at)
        for name, expr in ALERTS.items():
            obs.alerts[name] = _evaluate(prom, expr, obs.at)
        for a in prom.api("alerts")["alerts"]:
            obs.alert_states.setdefault(a["labels"]["alertname"], set()).add(a["state"])
        obs.rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        obs.policies = prom.api("label/policy/values", **{"match[]": "loopguard_matched_total"})
        yield obs
    finally:
        if prom:
            prom.stop()
        for e in started:
            e.stop()
            shutil.rmtree(e.dir, ignore_errors=True)
        mcp_server.stop()
        up.stop()


def _instance(pattern: str, obs: Observed) -> str:
    return pattern.replace("{main}", re.escape(obs.main)).replace("{fault}", re.escape(obs.fault))


def _lit(result: list[dict], want: list[dict[str, str]], obs: Observed) -> list[str]:
    """What is missing from `result` among the label sets `want` (each with
    a value above 0)."""
    missing = []
    for labels in want:
        ok = any(
            all(re.fullmatch(_instance(v, obs), s["metric"].get(k, "")) for k, v in labels.items())
            and not math.isnan(float(s["value"][1])) and float(s["value"][1]) > 0
            for s in result
        )
        if not ok:
            missing.append(json.dumps(labels))
    return missing


def _show(result: list[dict]) -> str:
    return json.dumps([{**s["metric"], "value": s["value"][1]} for s in result])[:1500]


# --- tests -------------------------------------------------------------------------


def test_every_dashboard_query_is_classified():
    """A new panel's queries must be listed as lit or evaluate-only."""
    assert not set(LIT) & set(EVALUATE_ONLY)
    assert set(LIT) | set(EVALUATE_ONLY) == set(TARGETS), (
        f"unlisted: {sorted(set(TARGETS) - set(LIT) - set(EVALUATE_ONLY))}; "
        f"not in the dashboard: {sorted((set(LIT) | set(EVALUATE_ONLY)) - set(TARGETS))}")
    assert set(ALERTS_LIT) | ALERTS_QUIET == set(ALERTS)


@pytest.mark.parametrize("key", sorted(TARGETS), ids=lambda k: f"{k[0]}/{k[1]}")
def test_dashboard_query(observed, key):
    result = observed.results[key]
    assert not isinstance(result, QueryError), f"{TARGETS[key]}: {result}"
    if key in LIT:
        missing = _lit(result, LIT[key], observed)
        assert not missing, f"{substitute(TARGETS[key])}\nreturned no series > 0 with {missing}; it returned {_show(result)}" + (
            f"\nnotes: {observed.notes}" if observed.notes else "")
    # With one policy picked, only that policy's series come back.
    if key in observed.per_policy:
        picked = observed.per_policy[key]
        assert not isinstance(picked, QueryError), f"{TARGETS[key]} with policy=agents: {picked}"
        assert {s["metric"]["policy"] for s in picked if "policy" in s["metric"]} <= {"agents"}


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_expression(observed, name):
    result = observed.alerts[name]
    assert not isinstance(result, QueryError), f"{ALERTS[name]}: {result}"
    if name in ALERTS_LIT:
        missing = _lit(result, ALERTS_LIT[name], observed)
        assert not missing, f"{ALERTS[name]}\nreturned no series with {missing}; it returned {_show(result)}" + (
            f"\nnotes: {observed.notes}" if observed.notes else "")
        if name == "LoopguardVmReloading":
            assert all(s["metric"].get("instance") == observed.fault for s in result), _show(result)
    else:
        assert result == [], f"{name} must not fire for this traffic: {_show(result)}"


def test_prometheus_loads_the_rules_and_holds_the_alerts(observed):
    assert {r["name"] for r in observed.rules if r["type"] == "alerting"} == set(ALERTS)
    bad = {r["name"]: r.get("lastError") for r in observed.rules if r["health"] != "ok" or r.get("lastError")}
    assert not bad, bad
    for name, state in ALERT_STATES.items():
        assert state in observed.alert_states.get(name, set()), (name, observed.alert_states, observed.notes)
    assert "LoopguardStoreFailingOpen" not in observed.alert_states


def test_the_policy_variable_lists_the_policies(observed):
    assert {"reject", "shadow", "slow", "agents", "spend", "spend-shadow", "mcp-tools", "mcp-shadow"} <= set(observed.policies)


def test_the_prometheusrule_wrapper_carries_the_rule_file_unchanged():
    out = subprocess.run([str(WRAPPER), "observability", "release=kube-prometheus-stack"],
                         capture_output=True, text=True, check=True).stdout
    resource = yaml.safe_load(out)
    assert resource["apiVersion"] == "monitoring.coreos.com/v1" and resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["namespace"] == "observability"
    assert resource["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert resource["spec"] == yaml.safe_load(RULES.read_text())
