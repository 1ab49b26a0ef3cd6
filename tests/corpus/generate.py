#!/usr/bin/env python3
"""Generate the labelled loop corpus in tests/corpus/ (see README.md there).

    python3 tests/corpus/generate.py           # (re)write scenarios/ and manifest.json
    python3 tests/corpus/generate.py --check   # exit 1 if the files on disk differ

Everything is derived from SEED: every scenario gets its own random.Random
seeded with "<SEED>:<scenario id>", so adding or editing one scenario never
changes another. No wall clock, no uuid module, no hash-order dependence.

Layout of this file:
  1. Random helpers, clock and volatile-token formats
  2. Tool registry
  3. Conversation: abstract events rendered into the three API formats
  4. Scenario: requests, headers, caller keys, labels
  5. Kind builders (loop kinds, then healthy kinds)
  6. Self-checks run on every generation
  7. Output, --check, main
"""

from __future__ import annotations

import argparse
import base64
import copy
import datetime as dt
import hashlib
import json
import random
import string
import sys
from dataclasses import dataclass, field
from pathlib import Path

SEED = 20261123
HERE = Path(__file__).resolve().parent
SCENARIO_DIR = HERE / "scenarios"
MANIFEST = HERE / "manifest.json"

# Tools an operator exempts from tool-loop counting (polling tools). Only the
# polling_exempt kind uses them; no loop scenario does.
EXEMPT_TOOLS = ["poll_job_status", "wait_for_deployment", "check_export_status"]

FORMATS = ("openai_chat", "openai_responses", "anthropic_messages")
PATHS = {
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
    "anthropic_messages": "/v1/messages",
}
MODELS = {
    "openai_chat": ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini"],
    "openai_responses": ["gpt-4.1", "gpt-4o", "o4-mini", "gpt-4.1-mini"],
    "anthropic_messages": ["claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1", "claude-3-7-sonnet-20250219"],
}
USER_AGENTS = {
    "openai_chat": ["OpenAI/Python 1.54.4", "OpenAI/JS 4.73.1", "langchain-openai/0.2.10 OpenAI/Python 1.54.4", "python-httpx/0.27.2"],
    "openai_responses": ["OpenAI/Python 1.82.0", "OpenAI/JS 5.1.0", "openai-agents/0.0.17 OpenAI/Python 1.82.0"],
    "anthropic_messages": ["Anthropic/Python 0.49.0", "Anthropic/TypeScript 0.39.0", "claude-agent-sdk/0.1.4"],
}

# --------------------------------------------------------------------------
# 1. Random helpers, clock and volatile-token formats
# --------------------------------------------------------------------------

B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
HEX = "0123456789abcdef"
UTC = dt.timezone.utc
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


class Rng(random.Random):
    """random.Random plus id/token helpers. Seeded with a string (sha512-based, stable)."""

    def tok(self, n: int, alphabet: str = B62) -> str:
        return "".join(self.choice(alphabet) for _ in range(n))

    def hex(self, n: int) -> str:
        return self.tok(n, HEX)

    def uuid(self) -> str:
        h = list(self.hex(32))
        h[12] = "4"
        h[16] = self.choice("89ab")
        s = "".join(h)
        return f"{s[:8]}-{s[8:12]}-{s[12:16]}-{s[16:20]}-{s[20:]}"

    def b64ish(self, n: int) -> str:
        """A bare base64url-looking token without any prefix."""
        return self.tok(n, B62 + "-_")

    def maybe(self, p: float) -> bool:
        return self.random() < p


class Clock:
    """A per-scenario clock in November 2026 that only moves forward."""

    def __init__(self, rng: Rng):
        self.rng = rng
        self.t = dt.datetime(2026, 11, rng.randint(2, 27), rng.randint(7, 21), rng.randint(0, 59),
                             rng.randint(0, 59), rng.randint(0, 999) * 1000, tzinfo=UTC)

    def tick(self, lo: float = 1.0, hi: float = 20.0) -> dt.datetime:
        self.t += dt.timedelta(milliseconds=self.rng.randint(int(lo * 1000), int(hi * 1000)))
        return self.t


# Formats inside the usual volatile-token mask list.
def rfc3339z(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def rfc3339_offset(t: dt.datetime, hours: int) -> str:
    return t.astimezone(dt.timezone(dt.timedelta(hours=hours))).isoformat(timespec="microseconds")


def iso_seconds(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def plain_date(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%d")


def epoch_s(t: dt.datetime) -> int:
    return int(t.timestamp())


def epoch_ms(t: dt.datetime) -> int:
    return int(t.timestamp() * 1000)


# Formats outside the usual mask list (tag "outside_mask_list").
def syslog_time(t: dt.datetime) -> str:
    return f"{MONTHS[t.month - 1]} {t.day:2d} {t.strftime('%H:%M:%S')}"


def rfc1123(t: dt.datetime) -> str:
    return f"{WEEKDAYS[t.weekday()]}, {t.day:02d} {MONTHS[t.month - 1]} {t.year} {t.strftime('%H:%M:%S')} GMT"


def go_duration(seconds: int) -> str:
    return f"{seconds // 60}m{seconds % 60:02d}s"


def cj(obj) -> str:
    """Compact JSON, the way models emit function-call arguments."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def pj(obj) -> str:
    """JSON the way a Python tool implementation returns it (json.dumps defaults)."""
    return json.dumps(obj, ensure_ascii=False)


# --------------------------------------------------------------------------
# 2. Tool registry
# --------------------------------------------------------------------------

TOOLS: dict[str, dict] = {}


def _tool(name: str, description: str, props: dict[str, str]) -> None:
    """Register a tool. props: param -> JSON type; a trailing '?' on the type marks it optional."""
    properties, required = {}, []
    for pname, ptype in props.items():
        optional = ptype.endswith("?")
        ptype = ptype.rstrip("?")
        if ptype == "string[]":
            properties[pname] = {"type": "array", "items": {"type": "string"}}
        else:
            properties[pname] = {"type": ptype}
        if not optional:
            required.append(pname)
    TOOLS[name] = {"name": name, "description": description,
                   "parameters": {"type": "object", "properties": properties, "required": required}}


for _spec in [
    # coding
    ("list_files", "List files in a directory of the repository.", {"path": "string"}),
    ("read_file", "Read a file from the repository.", {"path": "string"}),
    ("search_code", "Search the repository for a string or regex.", {"query": "string", "path": "string?"}),
    ("edit_file", "Replace an exact snippet in a file.", {"path": "string", "old": "string", "new": "string"}),
    ("run_tests", "Run the test suite or a subset of it.", {"path": "string?", "filter": "string?"}),
    ("run_linter", "Run the linter on a path.", {"path": "string"}),
    ("apply_formatter", "Run the code formatter on a path and write changes.", {"path": "string"}),
    ("git_diff", "Show the working-tree diff.", {"path": "string?"}),
    ("run_build", "Build a target with the CI build system.", {"target": "string"}),
    ("get_build_status", "Get the latest CI status of a pipeline.", {"pipeline": "string", "branch": "string"}),
    ("get_ci_logs", "Fetch the log of a CI job.", {"job_id": "string"}),
    # data
    ("query_database", "Run a read-only SQL query against the analytics warehouse.", {"sql": "string"}),
    ("run_sql", "Run a read-only SQL query and return rows.", {"sql": "string"}),
    ("list_tables", "List tables in the warehouse.", {"schema": "string"}),
    ("describe_table", "Show the columns of a table.", {"table": "string"}),
    ("make_chart", "Render a chart from the last query result.", {"kind": "string", "x": "string", "y": "string", "title": "string"}),
    ("export_csv", "Export the last query result as a CSV file.", {"filename": "string"}),
    ("get_sales", "Total sales for one day.", {"date": "string", "region": "string?"}),
    ("convert_currency", "Convert an amount between currencies at today's rate.", {"amount": "number", "from": "string", "to": "string"}),
    ("get_exchange_rate", "Get the exchange rate between two currencies.", {"base": "string", "quote": "string"}),
    ("log_hours", "Log worked hours on a project for a day.", {"project": "string", "date": "string", "hours": "number"}),
    # support / commerce
    ("search_kb", "Search the help-center knowledge base.", {"query": "string", "limit": "integer?"}),
    ("get_customer", "Look up a customer by id or email.", {"customer_id": "string?", "email": "string?"}),
    ("list_orders", "List orders, paginated.", {"customer_id": "string?", "status": "string?", "since": "string?", "cursor": "string?"}),
    ("get_order", "Get one order by id.", {"order_id": "string"}),
    ("check_refund_eligibility", "Check whether an order can be refunded.", {"order_id": "string"}),
    ("create_refund", "Refund an order.", {"order_id": "string", "amount": "number", "reason": "string"}),
    ("send_email", "Send an email to a customer.", {"to": "string", "subject": "string", "body": "string"}),
    ("add_note", "Add an internal note to a ticket.", {"ticket_id": "string", "note": "string"}),
    ("update_address", "Update a customer's shipping address.", {"customer_id": "string", "address": "string"}),
    ("get_ticket", "Get a support ticket.", {"ticket_id": "string"}),
    ("update_ticket", "Update fields of a support ticket.", {"ticket_id": "string", "status": "string", "assignee": "string?"}),
    ("list_tickets", "List support tickets, paginated.", {"queue": "string", "page": "integer?"}),
    ("search_tickets", "Search support tickets.", {"query": "string", "page": "integer?"}),
    ("create_invoice", "Create an invoice in the billing system.", {"customer_id": "string", "amount": "number", "currency": "string"}),
    ("list_invoices", "List invoices, paginated by cursor.", {"status": "string", "cursor": "string?"}),
    ("check_inventory", "Check stock for a SKU in a warehouse.", {"sku": "string", "warehouse": "string"}),
    ("reserve_stock", "Reserve stock for an order.", {"sku": "string", "warehouse": "string", "quantity": "integer"}),
    ("search_products", "Search the product catalogue.", {"query": "string"}),
    ("check_shipment", "Track a shipment by its 10-digit tracking number.", {"tracking_number": "string"}),
    ("call_partner_api", "Call the carrier partner API.", {"endpoint": "string", "method": "string", "payload": "object?"}),
    # ops
    ("get_pods", "List pods of a deployment.", {"namespace": "string", "selector": "string"}),
    ("get_logs", "Get recent logs of a pod.", {"namespace": "string", "pod": "string", "tail": "integer?"}),
    ("describe_pod", "Describe a pod.", {"namespace": "string", "pod": "string"}),
    ("get_metrics", "Query a metric over a time range.", {"query": "string", "range": "string"}),
    ("rollout_restart", "Restart a deployment.", {"namespace": "string", "deployment": "string"}),
    ("set_env", "Set an environment variable on a deployment.", {"namespace": "string", "deployment": "string", "name": "string", "value": "string"}),
    ("deploy_service", "Deploy a service version to an environment.", {"service": "string", "version": "string", "env": "string"}),
    ("run_migration", "Run pending database migrations.", {"database": "string"}),
    ("get_device_status", "Get the status of an IoT device.", {"device_id": "string"}),
    ("list_objects", "List objects in a storage bucket.", {"bucket": "string", "prefix": "string", "page_token": "string?"}),
    ("get_audit_log", "Read the audit log.", {"actor": "string", "after": "string?"}),
    # web / research / docs
    ("web_search", "Search the web.", {"query": "string"}),
    ("fetch_url", "Fetch a URL and return its text.", {"url": "string"}),
    ("fetch_page", "Fetch a web page as text.", {"url": "string"}),
    ("write_file", "Write a file in the workspace.", {"path": "string", "content": "string"}),
    ("search_issues", "Search issues in a repository.", {"repo": "string", "query": "string", "state": "string?"}),
    ("list_issues", "List issues in a repository.", {"repo": "string", "state": "string", "page": "integer?"}),
    ("get_channel_history", "Read messages from a chat channel.", {"channel": "string", "cursor": "string?", "limit": "integer?"}),
    ("search_docs", "Search internal documentation.", {"query": "string"}),
    ("fetch_doc", "Fetch an internal document by id.", {"doc_id": "string"}),
    ("read_document", "Read a document by id.", {"document_id": "string"}),
    ("summarize_document", "Summarise a document with the summarisation model.", {"doc_id": "string"}),
    ("delegate_to_subagent", "Hand a task to a research sub-agent.", {"task": "string"}),
    ("click_element", "Click an element on the current browser page.", {"selector": "string"}),
    ("take_screenshot", "Describe the current browser page.", {}),
    ("get_weather", "Weather forecast for a city and date.", {"city": "string", "date": "string"}),
    ("search_flights", "Search flights.", {"from": "string", "to": "string", "date": "string"}),
    ("get_fare_rules", "Get the fare rules of a flight offer.", {"offer_id": "string"}),
    ("create_booking", "Book a flight offer.", {"offer_id": "string", "passenger": "string"}),
    ("export_report", "Export a report file.", {"report": "string", "format": "string"}),
    ("start_export", "Start an asynchronous export job.", {"dataset": "string", "format": "string"}),
    ("start_job", "Start an asynchronous batch job.", {"job": "string", "params": "object?"}),
    ("download_file", "Download a finished export.", {"url": "string"}),
    # exempt polling tools
    ("poll_job_status", "Poll the status of an asynchronous job.", {"job_id": "string"}),
    ("wait_for_deployment", "Check whether a deployment has finished rolling out.", {"deployment_id": "string"}),
    ("check_export_status", "Check the status of an export job.", {"export_id": "string"}),
]:
    _tool(*_spec)


# --------------------------------------------------------------------------
# 3. Conversation: abstract events rendered into the three API formats
# --------------------------------------------------------------------------

@dataclass
class Call:
    token: str            # random part of the call id; rendered per format
    name: str
    args: dict
    raw: str | None = None  # exact OpenAI arguments string when it is not cj(args)


@dataclass
class Result:
    token: str
    output: str
    error: bool = False


@dataclass
class Event:
    role: str  # "user" | "assistant" | "results"
    text: str | None = None
    calls: list[Call] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)


def openai_call_id(token: str) -> str:
    return "call_" + token


def anthropic_call_id(token: str) -> str:
    return "toolu_01" + token[:22]


class Conversation:
    """A conversation as abstract events; body() renders the request an agent sends now."""

    def __init__(self, fmt: str, rng: Rng, *, model: str, system: str, tools: list[str] = (),
                 extras: dict | None = None, max_tokens: int = 1024):
        self.fmt, self.rng, self.model, self.system = fmt, rng, model, system
        self.tools = list(tools)
        for t in self.tools:
            if t not in TOOLS:
                raise KeyError(f"unknown tool {t}")
        self.extras = dict(extras or {})
        self.max_tokens = max_tokens
        self.events: list[Event] = []

    # -- abstract events -------------------------------------------------
    def user(self, text: str) -> None:
        self.events.append(Event("user", text=text))

    def say(self, text: str) -> None:
        self.events.append(Event("assistant", text=text))

    def calls(self, specs: list[tuple], text: str | None = None) -> None:
        """specs: (name, args, output[, error[, raw]]) per call; one assistant turn, then results."""
        calls, results = [], []
        for spec in specs:
            name, args, output = spec[0], spec[1], spec[2]
            error = spec[3] if len(spec) > 3 else False
            raw = spec[4] if len(spec) > 4 else None
            if name not in self.tools:
                raise KeyError(f"tool {name} not offered in this conversation")
            token = self.rng.tok(24)
            calls.append(Call(token, name, args, raw))
            results.append(Result(token, output, error))
        self.events.append(Event("assistant", text=text, calls=calls))
        self.events.append(Event("results", results=results))

    def call(self, name: str, args: dict, output: str, *, text: str | None = None,
             error: bool = False, raw: str | None = None) -> None:
        self.calls([(name, args, output, error, raw)], text=text)

    # -- rendering ---------------------------------------------------------
    def body(self) -> dict:
        return {"openai_chat": self._chat, "openai_responses": self._responses,
                "anthropic_messages": self._anthropic}[self.fmt]()

    @staticmethod
    def _args(c: Call) -> str:
        return c.raw if c.raw is not None else cj(c.args)

    def _chat(self) -> dict:
        msgs: list[dict] = [{"role": "system", "content": self.system}]
        for ev in self.events:
            if ev.role == "user":
                msgs.append({"role": "user", "content": ev.text})
            elif ev.role == "assistant":
                m = {"role": "assistant", "content": ev.text}
                if ev.calls:
                    m["tool_calls"] = [{"id": openai_call_id(c.token), "type": "function",
                                        "function": {"name": c.name, "arguments": self._args(c)}}
                                       for c in ev.calls]
                msgs.append(m)
            else:
                for r in ev.results:
                    msgs.append({"role": "tool", "tool_call_id": openai_call_id(r.token), "content": r.output})
        body = {"model": self.model, "messages": msgs}
        if self.tools:
            body["tools"] = [{"type": "function", "function": copy.deepcopy(TOOLS[t])} for t in self.tools]
        body.update(copy.deepcopy(self.extras))
        return body

    def _responses(self) -> dict:
        items: list[dict] = []
        for ev in self.events:
            if ev.role == "user":
                items.append({"role": "user", "content": ev.text})
            elif ev.role == "assistant":
                if ev.text:
                    items.append({"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": ev.text}]})
                for c in ev.calls:
                    items.append({"type": "function_call", "call_id": openai_call_id(c.token),
                                  "name": c.name, "arguments": self._args(c)})
            else:
                for r in ev.results:
                    items.append({"type": "function_call_output", "call_id": openai_call_id(r.token),
                                  "output": r.output})
        body = {"model": self.model, "instructions": self.system, "input": items}
        if self.tools:
            body["tools"] = [{"type": "function", **copy.deepcopy(TOOLS[t])} for t in self.tools]
        body.update(copy.deepcopy(self.extras))
        return body

    def _anthropic(self) -> dict:
        msgs: list[dict] = []

        def push(role: str, content) -> None:
            if msgs and msgs[-1]["role"] == role:  # merge: roles must alternate
                prev = msgs[-1]["content"]
                if isinstance(prev, str):
                    prev = [{"type": "text", "text": prev}]
                if isinstance(content, str):
                    content = [{"type": "text", "text": content}]
                msgs[-1]["content"] = prev + content
            else:
                msgs.append({"role": role, "content": content})

        for ev in self.events:
            if ev.role == "user":
                push("user", ev.text)
            elif ev.role == "assistant":
                if not ev.calls:
                    push("assistant", ev.text)
                else:
                    blocks = [{"type": "text", "text": ev.text}] if ev.text else []
                    blocks += [{"type": "tool_use", "id": anthropic_call_id(c.token), "name": c.name,
                                "input": copy.deepcopy(c.args)} for c in ev.calls]
                    push("assistant", blocks)
            else:
                blocks = []
                for r in ev.results:
                    b = {"type": "tool_result", "tool_use_id": anthropic_call_id(r.token), "content": r.output}
                    if r.error:
                        b["is_error"] = True
                    blocks.append(b)
                push("user", blocks)
        body = {"model": self.model, "max_tokens": self.max_tokens, "system": self.system, "messages": msgs}
        if self.tools:
            body["tools"] = [{"name": TOOLS[t]["name"], "description": TOOLS[t]["description"],
                              "input_schema": copy.deepcopy(TOOLS[t]["parameters"])} for t in self.tools]
        body.update(copy.deepcopy(self.extras))
        return body


def default_extras(rng: Rng, fmt: str, has_tools: bool) -> dict:
    """Realistic optional request fields, chosen per conversation."""
    extras: dict = {}
    if fmt == "openai_chat":
        if has_tools and rng.maybe(0.4):
            extras["tool_choice"] = "auto"
        if rng.maybe(0.5):
            extras["temperature"] = rng.choice([0, 0.2, 0.7, 1])
        if has_tools and rng.maybe(0.2):
            extras["parallel_tool_calls"] = False
        if rng.maybe(0.25):
            extras["stream"] = True
            extras["stream_options"] = {"include_usage": True}
    elif fmt == "openai_responses":
        if rng.maybe(0.4):
            extras["temperature"] = rng.choice([0, 0.2, 0.7])
        if rng.maybe(0.4):
            extras["store"] = False
        if rng.maybe(0.25):
            extras["stream"] = True
    else:
        if rng.maybe(0.4):
            extras["temperature"] = rng.choice([0, 0.3, 1])
        if rng.maybe(0.25):
            extras["stream"] = True
    return extras


# --------------------------------------------------------------------------
# 4. Scenario: requests, headers, caller keys, labels
# --------------------------------------------------------------------------

class Scenario:
    def __init__(self, label: str, kind: str, index: int, fmt: str):
        self.id = f"{label}-{kind}-{index:02d}"
        self.label, self.kind, self.index, self.fmt = label, kind, index, fmt
        self.rng = Rng(f"{SEED}:{self.id}")
        self.clock = Clock(self.rng)
        self.tags: list[str] = []
        self.description = ""
        self.loop_turn: int | None = None
        self.requests: list[dict] = []
        self.key = self.new_key()
        self.user_agent = self.rng.choice(USER_AGENTS[fmt])
        self.sessions = 0

    def new_key(self, tag: str = "") -> str:
        return f"sk-corpus-{self.id}-{tag}{self.rng.hex(12)}"

    def conversation(self, system: str, tools: list[str] = (), *, extras: dict | None = None,
                     model: str | None = None, max_tokens: int | None = None) -> Conversation:
        if extras is None:
            extras = default_extras(self.rng, self.fmt, bool(tools))
        return Conversation(self.fmt, self.rng, model=model or self.rng.choice(MODELS[self.fmt]),
                            system=system, tools=tools, extras=extras,
                            max_tokens=max_tokens or self.rng.choice([1024, 2048, 4096, 8192]))

    def headers(self, key: str, user_agent: str) -> dict:
        h = {"content-type": "application/json"}
        if self.fmt == "anthropic_messages":
            h["x-api-key"] = key
            h["anthropic-version"] = "2023-06-01"
        else:
            h["authorization"] = f"Bearer {key}"
        h["user-agent"] = user_agent
        return h

    def send(self, conv: Conversation, *, mark: bool = False, key: str | None = None,
             user_agent: str | None = None) -> None:
        # Every conversation carries its own session id, as agent frameworks
        # that tag their calls send one (not drawn from the RNG, so adding it
        # changed nothing else).
        if getattr(conv, "session_id", None) is None:
            self.sessions += 1
            conv.session_id = f"{self.id}-s{self.sessions}"
        headers = self.headers(key or self.key, user_agent or self.user_agent)
        headers["x-session-id"] = conv.session_id
        self.requests.append({"method": "POST", "path": PATHS[self.fmt],
                              "headers": headers,
                              "body": conv.body()})
        if mark:
            if self.loop_turn is not None:
                raise AssertionError(f"{self.id}: loop_turn marked twice")
            self.loop_turn = len(self.requests)

    def envelope(self) -> dict:
        return {"id": self.id, "label": self.label, "kind": self.kind, "format": self.fmt,
                "loop_turn": self.loop_turn, "tags": self.tags, "description": self.description,
                "requests": self.requests}


class Run:
    """Drives a conversation turn by turn: every user message and every tool result is one request."""

    def __init__(self, sc: Scenario, conv: Conversation):
        self.sc, self.conv = sc, conv

    def user(self, text: str, *, mark: bool = False) -> None:
        self.conv.user(text)
        self.sc.send(self.conv, mark=mark)

    def say(self, text: str) -> None:
        self.conv.say(text)

    def call(self, name: str, args: dict, output: str, *, text: str | None = None, error: bool = False,
             raw: str | None = None, mark: bool = False) -> None:
        self.conv.call(name, args, output, text=text, error=error, raw=raw)
        self.sc.send(self.conv, mark=mark)

    def calls(self, specs: list[tuple], *, text: str | None = None, mark: bool = False) -> None:
        self.conv.calls(specs, text=text)
        self.sc.send(self.conv, mark=mark)

    def step(self, item: tuple) -> None:
        """Execute a scripted step: ("user", text) | ("say", text) | ("call", name, args, output[, error])."""
        op = item[0]
        if op == "user":
            self.user(item[1])
        elif op == "say":
            self.say(item[1])
        elif op == "call":
            self.call(item[1], item[2], item[3], error=item[4] if len(item) > 4 else False)
        elif op == "calls":
            self.calls(item[1])
        else:
            raise ValueError(op)


def pick_text(rng: Rng, pool: list[str | None] | None, attempt: int, p: float = 0.6) -> str | None:
    """An optional short assistant preface to a tool call: pool[0] opens the first
    attempt, pool[1:] (None = no text) are what a model says when trying again."""
    if not pool or not rng.maybe(p):
        return None
    return pool[0] if attempt == 1 else rng.choice(pool[1:])


# --------------------------------------------------------------------------
# 5a. Loop kinds
# --------------------------------------------------------------------------

# ---- identical_retry -------------------------------------------------------
# Rule: loop_turn = the third byte-identical send of the retried request.

def _ir_single_question(sc: Scenario):
    conv = sc.conversation("You are a concise assistant for an on-call operations team.")
    conv.user("Summarise this incident report in three bullet points:\n\nAt 02:14 UTC the payments API started "
              "returning 502s for about 9% of requests. The on-call engineer traced it to a connection-pool "
              "limit on the ledger database after the nightly reindex job overlapped with peak EU traffic. "
              "The pool size was raised from 40 to 80 at 02:51 and errors stopped by 02:58. No payments were "
              "lost; 312 were retried by clients.")
    return conv, "A single summarisation request resent byte-for-byte by a client whose HTTP timeout is shorter than the model's latency."


def _ir_after_tool_result(sc: Scenario):
    conv = sc.conversation("You are a helpful travel assistant. Use tools for live data.", ["get_weather"])
    Run(sc, conv).user("Do I need an umbrella in Lisbon tomorrow? I land at 9am.")
    # the next request, carrying the tool result, is the one that gets retried
    conv.call("get_weather", {"city": "Lisbon", "date": "2026-11-24"},
              pj({"city": "Lisbon", "date": "2026-11-24", "summary": "Light rain in the morning, clearing after 13:00",
                  "precip_mm": 3.2, "temp_c": {"min": 11, "max": 17}}))
    return conv, "An agent's request carrying a weather tool result is retried identically by a client retry wrapper."


def _ir_multi_turn(sc: Scenario):
    conv = sc.conversation("You are a friendly writing assistant.")
    r = Run(sc, conv)
    r.user("I need a subject line for an email telling customers our office moves on 1 December.")
    r.say("How about: \"We're moving! New office address from 1 December\"")
    r.user("Nice. Make it a bit more formal.")
    r.say("\"Notice of Office Relocation, Effective 1 December 2026\"")
    conv.user("Great. Now write the first paragraph of the email, two sentences max.")
    return conv, "A three-turn writing chat whose third request is then resent identically by a retrying client."


def _ir_streaming(sc: Scenario):
    extras = {"stream": True}
    if sc.fmt == "openai_chat":
        extras["stream_options"] = {"include_usage": True}
    conv = sc.conversation("You are an expert SQL assistant. Answer with a single query.", extras=extras)
    conv.user("Postgres: list the 5 customers with the highest total order value in October 2026, "
              "from tables customers(id, name) and orders(id, customer_id, total, created_at).")
    return conv, "A streaming SQL-help request whose stream keeps getting cut by a proxy, so the client resends it identically."


def _ir_rag_context(sc: Scenario):
    system = ("You answer questions about the Acme employee handbook using only the excerpts below.\n\n"
              "[1] Employees accrue 2.25 days of paid leave per month, up to 27 days per year.\n"
              "[2] Unused leave of up to 5 days carries over to the next year and expires on 31 March.\n"
              "[3] Leave requests longer than 10 consecutive working days need approval two levels up.")
    conv = sc.conversation(system)
    conv.user("If I have 7 days left at the end of December, how many carry over and until when can I use them?")
    return conv, "A retrieval-augmented handbook question resent identically in a tight client retry loop."


def _ir_translation(sc: Scenario):
    conv = sc.conversation("Translate the user's text. Keep product names untranslated.")
    conv.user("Translate to German and Spanish: \"Your Acme Cloud backup finished successfully. 1,204 files "
              "were uploaded and 3 were skipped because they were open in another program.\"")
    return conv, "A translation request that a batch worker resends identically after each client-side timeout."


def _ir_json_classify(sc: Scenario):
    extras: dict = {"temperature": 0}
    if sc.fmt == "openai_chat":
        extras["response_format"] = {"type": "json_object"}
    elif sc.fmt == "openai_responses":
        extras["text"] = {"format": {"type": "json_object"}}
    conv = sc.conversation("Classify support messages. Reply with JSON: {\"category\": ..., \"urgency\": 1-5}.",
                           extras=extras)
    conv.user("My card was charged three times for the same order and the app now says my account is locked.")
    return conv, "A JSON classification request at temperature 0 resent identically by a queue consumer that never acks."


def _ir_code_review(sc: Scenario):
    conv = sc.conversation("You are a senior engineer doing security reviews. Be specific.", ["read_file"])
    r = Run(sc, conv)
    r.user("Review src/auth/session.ts for security problems.")
    r.call("read_file", {"path": "src/auth/session.ts"},
           "export function newSession(userId: string) {\n  const token = Math.random().toString(36).slice(2);\n"
           "  sessions.set(token, { userId, created: Date.now() });\n  return token;\n}\n")
    conv.call("read_file", {"path": "src/auth/cookies.ts"},  # this request is the one retried
              "export const sessionCookie = (t: string) => `sid=${t}; Path=/`;\n")
    return conv, "A code-review agent whose request carrying two file reads is resent identically by a retry middleware."


IDENTICAL_RETRY_SETUPS = [_ir_single_question, _ir_after_tool_result, _ir_multi_turn, _ir_streaming,
                          _ir_rag_context, _ir_translation, _ir_json_classify, _ir_code_review]


def build_identical_retry(sc: Scenario) -> None:
    conv, desc = IDENTICAL_RETRY_SETUPS[(sc.index - 1) % len(IDENTICAL_RETRY_SETUPS)](sc)
    sends = sc.rng.randint(6, 8)
    for k in range(1, sends + 1):
        sc.send(conv, mark=(k == 3))
    sc.description = desc


# ---- volatile_tool_error ---------------------------------------------------
# Rule: loop_turn = the request whose history first holds the third identical
# failing call (same tool, same arguments) with its error result.

def _err_build(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"Error 503 at {rfc3339z(t)} (request id req_{r.tok(14)}, trace {r.hex(32)}) "
            f"after {r.randint(900, 4000)} ms, attempt {n}")


def _err_sql(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"ERROR: canceling statement due to statement timeout (query_id {r.uuid()}, "
            f"started {rfc3339_offset(t, 1)}, elapsed {r.randint(30000, 30900)}ms)")


def _err_smtp(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"SMTP 421 4.7.0 Temporary System Problem. Try again later. queue-id {r.hex(20)} "
            f"session {r.hex(16)} at {epoch_s(t)}")


def _err_invoice(r: Rng, t: dt.datetime, n: int) -> str:
    return pj({"error": {"code": "upstream_unavailable", "message": "Billing backend unavailable",
                         "request_id": r.uuid(), "timestamp": epoch_ms(t)}, "attempt": n})


def _err_summarize(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"UpstreamModelError: provider returned 529 overloaded for chatcmpl-{r.tok(29)} "
            f"(created {epoch_s(t)}); retry budget {n}/10 used")


def _err_rate(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"HTTP 429 Too Many Requests on {plain_date(t)}; x-request-id: {r.uuid()}; "
            f"window resets at {epoch_s(t) + r.randint(20, 60)}; {r.randint(180, 420)} bytes")


def _err_deploy(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"Deployment failed: evt_{r.tok(20)} health check timed out after {r.randint(60000, 61500)} ms "
            f"(trace_id={r.hex(32)}, span_id={r.hex(16)}), attempt {n}")


def _err_fetch(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"FetchError: read timeout after {r.randint(1000, 64000)} bytes received in {r.randint(10000, 10400)} ms; "
            f"call_{r.tok(24)}; at {iso_seconds(t)}")


def _err_subagent(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"SubagentError: tool_use toolu_01{r.tok(22)} in msg_01{r.tok(22)} produced no result "
            f"before the deadline ({r.randint(120000, 121000)} ms) at {rfc3339z(t)}; attempt {n}")


# outside the usual mask list
def _err_syslog(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"{syslog_time(t)} ci-runner-3 buildkitd[2231]: ERROR failed to solve: failed to fetch base image "
            f"layer: unexpected EOF (session {r.b64ish(25)})")


def _err_rfc1123(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"504 Gateway Timeout from carrier-gateway.internal at {rfc1123(t)}; upstream node {r.hex(8)} "
            f"did not answer")


def _err_duration(r: Rng, t: dt.datetime, n: int) -> str:
    return (f"Export aborted after {go_duration(r.randint(600, 660))}: worker {r.hex(8)} lost its lease; "
            f"resume token {r.b64ish(24)}")


VOLATILE = [
    dict(system="You are a release assistant with CI access.", tools=["get_build_status", "get_ci_logs"],
         prompt="Is main green on web-frontend? I want to cut the release.",
         pre=[], call=("get_build_status", {"pipeline": "web-frontend", "branch": "main"}), error=_err_build,
         texts=["Let me check the pipeline status.", "Retrying the status check.", "The CI API returned 503; trying again."],
         desc="A release agent re-polls a CI status API that keeps failing with 503s carrying fresh request ids, traces, latencies and attempt counters."),
    dict(system="You are a data analyst with read access to the warehouse.", tools=["query_database", "list_tables"],
         prompt="What was revenue by region since 1 November?",
         pre=[("list_tables", {"schema": "analytics"}, "orders\ncustomers\nregions\nrefunds")],
         call=("query_database", {"sql": "SELECT region, SUM(total) FROM orders WHERE created_at >= '2026-11-01' GROUP BY region"}),
         error=_err_sql, texts=None,
         desc="An analyst agent reruns the same timing-out SQL query; each error carries a new query UUID, an offset timestamp with microseconds and an elapsed time."),
    dict(system="You are a customer-success assistant that can email customers.", tools=["send_email", "get_customer"],
         prompt="Email Priya Raman at priya.raman@example.com that her onboarding call moved to Thursday 10:00.",
         pre=[], call=("send_email", {"to": "priya.raman@example.com", "subject": "Onboarding call moved",
                                      "body": "Hi Priya, your onboarding call is now on Thursday at 10:00. Best, Acme"}),
         error=_err_smtp, texts=["Sending the email now.", "The mail server deferred it; sending again."],
         desc="An agent keeps resending the same email through an SMTP relay answering 421 with new queue ids, hex session ids and epoch seconds."),
    dict(system="You are a billing assistant.", tools=["create_invoice", "get_customer"],
         prompt="Create an invoice of 1,250 EUR for customer 7730018842.",
         pre=[("get_customer", {"customer_id": "7730018842"}, pj({"id": "7730018842", "name": "Nordlicht GmbH", "currency": "EUR", "status": "active"}))],
         call=("create_invoice", {"customer_id": "7730018842", "amount": 1250, "currency": "EUR"}), error=_err_invoice,
         texts=["Creating the invoice.", None, "Let me retry creating the invoice."],
         desc="A billing agent repeats a failing create_invoice call whose JSON error has a fresh request UUID, an epoch-millisecond timestamp and an attempt counter."),
    dict(system="You are a research assistant. Summarise documents with the summarisation tool.", tools=["summarize_document", "read_document"],
         prompt="Give me a summary of doc_7781 (the Q3 vendor review).",
         pre=[], call=("summarize_document", {"doc_id": "doc_7781"}), error=_err_summarize, texts=None,
         desc="An agent keeps calling a summarisation tool whose nested model call fails with a new chatcmpl- id and creation epoch each time."),
    dict(system="You are a finance assistant.", tools=["get_exchange_rate", "convert_currency"],
         prompt="What's the EUR/JPY rate right now?",
         pre=[], call=("get_exchange_rate", {"base": "EUR", "quote": "JPY"}), error=_err_rate,
         texts=["Fetching the current rate.", "Rate limited; retrying."],
         desc="A finance agent hammers a rate-limited FX endpoint; every 429 has a new request UUID, reset epoch and byte count."),
    dict(system="You are a deployment assistant for the platform team.", tools=["deploy_service", "get_build_status"],
         prompt="Deploy checkout v2.14.3 to staging.",
         pre=[("get_build_status", {"pipeline": "checkout", "branch": "release/2.14"}, "passed (build 2211, 14 min ago)")],
         call=("deploy_service", {"service": "checkout", "version": "v2.14.3", "env": "staging"}), error=_err_deploy,
         texts=["Deploying now.", "Health check failed; redeploying.", None],
         desc="A deploy agent redeploys the same version after each failed health check; errors carry evt_ ids, 32- and 16-hex trace ids and attempt counters."),
    dict(system="You are an inventory assistant with HTTP access to internal services.", tools=["fetch_url"],
         prompt="How many units of SKU HX-4410 do we have in stock?",
         pre=[], call=("fetch_url", {"url": "http://inventory.internal/api/stock?sku=HX-4410"}), error=_err_fetch,
         texts=None,
         desc="An agent refetches the same internal URL that times out, each error with a new byte count, latency, call_ id and ISO timestamp."),
    dict(system="You are an orchestrator that delegates research to sub-agents.", tools=["delegate_to_subagent", "web_search"],
         prompt="Collect our Q3 churn numbers and compare them with last year.",
         pre=[], call=("delegate_to_subagent", {"task": "Collect Q3 2026 churn numbers from the metrics warehouse"}),
         error=_err_subagent, texts=["Delegating this to the research sub-agent.", "The sub-agent timed out; delegating again."],
         desc="An orchestrator keeps re-delegating the same task to a sub-agent that times out; errors carry toolu_ and msg_ ids and RFC 3339 times."),
    dict(system="You are a build assistant.", tools=["run_build", "get_ci_logs"],
         prompt="Build the API image so I can test it.",
         pre=[], call=("run_build", {"target": "//services/api:image"}), error=_err_syslog, texts=None, outside=True,
         desc="A build agent reruns a failing build whose syslog-style error line has a new 'Nov 23 13:40:01' time and an unprefixed base64-ish session token."),
    dict(system="You are a logistics assistant.", tools=["call_partner_api", "check_shipment"],
         prompt="Book a pickup with the carrier for shipment 4000216735.",
         pre=[("check_shipment", {"tracking_number": "4000216735"}, pj({"status": "label_created", "weight_kg": 4.2}))],
         call=("call_partner_api", {"endpoint": "/v1/pickups", "method": "POST", "payload": {"tracking_number": "4000216735", "window": "2026-11-25T09:00/12:00"}}),
         error=_err_rfc1123, texts=["Requesting the pickup.", "Gateway timeout; trying again."], outside=True,
         desc="A logistics agent retries a partner API call answered with 504s stamped in RFC 1123 time with a short 8-hex node id."),
    dict(system="You are a reporting assistant.", tools=["export_report", "send_email"],
         prompt="Export the monthly revenue report as xlsx.",
         pre=[], call=("export_report", {"report": "monthly-revenue", "format": "xlsx"}), error=_err_duration,
         texts=None, outside=True, tick=(665, 720),
         desc="A reporting agent re-requests an export that aborts with a Go-style '12m34s' duration, an 8-hex worker id and a bare base64-ish token."),
]


def build_volatile_tool_error(sc: Scenario) -> None:
    spec = VOLATILE[sc.index - 1]
    rng = sc.rng
    r = Run(sc, sc.conversation(spec["system"], spec["tools"]))
    r.user(spec["prompt"])
    for name, args, out in spec["pre"]:
        sc.clock.tick()
        r.call(name, args, out)
    for attempt in range(1, rng.randint(6, 8) + 1):
        t = sc.clock.tick(*spec.get("tick", (2, 25)))
        r.call(spec["call"][0], spec["call"][1], spec["error"](rng, t, attempt),
               text=pick_text(rng, spec["texts"], attempt), error=True, mark=(attempt == 3))
    if spec.get("outside"):
        sc.tags.append("outside_mask_list")
    sc.description = spec["desc"]


# ---- rephrased_text ----------------------------------------------------------
# Rule: loop_turn = the request whose history first holds the third assistant
# answer with the same substance (the wording differs every time). When the
# conversation opens with a first attempt ("first"), it already has that
# substance (same regex, same haiku, same fix) and counts as occurrence 1.

REPHRASED = [
    dict(system="You are a helpful programming assistant.",
         question="Write a regex that matches UK postcodes like SW1A 1AA, M1 1AE and EC1A 1BB.",
         first="Here you go: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`. It matches M1 1AE and similar postcodes.",
         complaint="That doesn't match EC1A 1BB or SW1A 1AA.",
         drivers=["Still doesn't match EC1A 1BB. Try again.", "try again", "please fix it", "same problem", "It still fails on SW1A 1AA.", "try again please", "no, still wrong"],
         slots=[["You're right, I apologize for the mistake.", "Sorry about that, you're correct.", "My apologies, you're absolutely right.", "You're correct, and I'm sorry for the confusion."],
                ["The district part needs to accept an optional trailing letter.", "The pattern should allow a letter after the district digit.", "The issue is that the district section must permit a letter after the digit."],
                ["Here is the corrected version: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`", "Corrected pattern: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`", "Use this instead: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`"],
                ["This should now match EC1A 1BB.", "It will now correctly match EC1A 1BB.", "Now EC1A 1BB will be matched as expected.", ""]],
         desc="A coding chat where the user keeps reporting the same failure and the model rephrases the same apology and the same wrong regex."),
    dict(system="You are an autonomous planning agent. Work until the plan is complete, then say so.",
         question="Draft a migration plan for moving our cron jobs from the old VM to Kubernetes CronJobs.",
         first=None, complaint=None, drivers=["continue"],
         slots=[["I've completed the migration plan above.", "The migration plan is now complete.", "The plan for the migration is finished.", "That completes the migration plan."],
                ["All five cron jobs are covered, including the backup and report jobs.", "It covers all five jobs, from backups to the weekly reports.", "Every one of the five cron jobs, including backups and reports, is included."],
                ["Let me know if you'd like any changes.", "Tell me if anything should be adjusted.", "If you want changes, just let me know.", "Happy to revise any part of it."]],
         desc="An autonomous driver keeps sending 'continue' and the model keeps announcing, in new words each time, that the plan is already complete."),
    dict(system="You are a creative writing assistant.",
         question="Write a haiku about autumn rain without using the letter e.",
         first="Autumn rain falls soft\nOn a roof of old gray slate\nLeaves drift down the lane",
         complaint="That uses the letter e several times.",
         drivers=["Still has an e. Try again.", "There's still an 'e' in it.", "try again", "no e please!", "still wrong"],
         slots=[["I apologize!", "Sorry about that!", "My mistake, apologies!", "You're right, sorry!"],
                ["Here's a version without the letter e:", "Here is one that avoids the letter e:", "This one has no letter e:", "Let me try again without any e:"],
                ["\n\nAutumn rain falls soft\nOn a roof of old gray slate\nLeaves drift down the lane"]],
         joiner=" ", swap=None,
         desc="A creative chat where the model apologises in varied words but returns the same non-compliant haiku every time."),
    dict(system="You are Acme's virtual support assistant. You cannot transfer chats.",
         question="My package says delivered but it's not here. I want to talk to a human.",
         first=None, complaint=None,
         drivers=["human please", "agent", "Let me speak to a person.", "I said HUMAN.", "representative", "talk to someone real", "human"],
         slots=[["I understand how frustrating this is.", "I'm sorry for the trouble with your delivery.", "I completely understand your frustration.", "I'm really sorry about this experience."],
                ["Unfortunately I'm not able to transfer you to a live agent.", "I can't connect you with a human agent from this chat.", "Transferring to a person isn't something I can do here."],
                ["You can file a missing-package claim at acme.example/claims and our team will review it within 48 hours.", "Please submit a claim at acme.example/claims; the team reviews claims within 48 hours.", "Our team reviews missing-package claims filed at acme.example/claims within 48 hours."]],
         desc="A support bot answers every demand for a human with a reworded version of the same refusal and claim link."),
    dict(system="Reply with JSON only, no prose.",
         question="Extract name, email and company from: 'Hi, this is Tomasz Wojcik (tomasz@wojcik-design.pl) from Wojcik Design.'",
         first=None, complaint=None,
         drivers=["Your previous reply was not valid JSON. Reply with JSON only."],
         slots=[["Apologies!", "Sorry for that.", "My apologies.", "You're right, sorry."],
                ["Here is the JSON you asked for:", "Here's the data as JSON:", "Below is the JSON only:", "Here is the extracted JSON:"],
                ["```json\n{\"name\": \"Tomasz Wojcik\", \"email\": \"tomasz@wojcik-design.pl\", \"company\": \"Wojcik Design\"}\n```"]],
         joiner=" ", swap=(0, 1),
         desc="An extraction pipeline's validator keeps sending the same 'not valid JSON' message and the model keeps wrapping the same JSON in reworded prose."),
    dict(system="You are a helpful Python tutor.",
         question="Why does datetime.strptime('23/11/2026 13:40', '%m/%d/%Y %H:%M') raise ValueError?",
         first="Because '23' is not a valid month. Swap the directives: use '%d/%m/%Y %H:%M'.",
         complaint="I did that and it still fails with 'unconverted data remains: :01'.",
         drivers=["still the same error", "please fix it", "Still: unconverted data remains: :01", "try again", "that's what I have, same error"],
         slots=[["Sorry for the confusion!", "Apologies for the trouble.", "I'm sorry that didn't work.", "My apologies."],
                ["The problem is the order of day and month in the format.", "The format string has day and month swapped.", "Day and month are reversed in your format string."],
                ["Use '%d/%m/%Y %H:%M' and it will parse correctly.", "Changing it to '%d/%m/%Y %H:%M' fixes the error.", "With '%d/%m/%Y %H:%M' the string parses fine."]],
         desc="A tutoring chat where the model ignores the new error and restates, reworded, the same fix the user already applied."),
    dict(system="You are an editor. Keep summaries under 40 words when asked.",
         question="Summarise in under 40 words: our team migrated billing from the monolith to a dedicated service, cutting invoice latency from 9 s to 400 ms while removing two nightly batch jobs and one on-call rotation.",
         first=None, complaint=None,
         drivers=["Shorter, please.", "try again, shorter", "Still too long.", "shorter", "Under 20 words please."],
         slots=[["Sure, here's a shorter version:", "Here's a more concise summary:", "A tighter version:", "Shorter summary:"],
                ["Billing moved from the monolith to its own service, cutting invoice latency from 9 s to 400 ms and removing two nightly jobs and an on-call rotation.",
                 "Billing now runs as its own service instead of in the monolith, dropping invoice latency from 9 s to 400 ms and eliminating two nightly jobs and one on-call rotation.",
                 "Moving billing out of the monolith into a dedicated service cut invoice latency from 9 s to 400 ms and removed two nightly jobs plus an on-call rotation."]],
         joiner=" ", swap=None,
         desc="The user keeps asking for a shorter summary and the model returns the same-length summary in reshuffled wording."),
]


def rephrasings(rng: Rng, slots: list[list[str]], n: int, joiner: str = " ", swap: tuple | None = (1, 2)) -> list[str]:
    """n distinct renderings of the same answer: synonym choice per slot, sometimes two slots swapped."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        parts = [rng.choice(s) for s in slots]
        if swap and rng.maybe(0.4):
            a, b = swap
            parts[a], parts[b] = parts[b], parts[a]
        text = joiner.join(p for p in parts if p).replace(" \n", "\n")
        if text in seen:
            continue
        seen.add(text)
        out.append(text)
    return out


def driver_messages(drivers: list[str], n: int) -> list[str]:
    return [drivers[i % len(drivers)] for i in range(n)]


def build_rephrased_text(sc: Scenario) -> None:
    spec = REPHRASED[sc.index - 1]
    rng = sc.rng
    r = Run(sc, sc.conversation(spec["system"]))
    r.user(spec["question"])
    occurrences = 0
    if spec["first"]:
        r.say(spec["first"])
        r.user(spec["complaint"])
        occurrences = 1
    n = rng.randint(6, 8)
    answers = rephrasings(rng, spec["slots"], n, spec.get("joiner", " "), spec.get("swap", (1, 2)))
    for answer, driver in zip(answers, driver_messages(spec["drivers"], n)):
        occurrences += 1
        r.say(answer)
        r.user(driver, mark=(occurrences == 3))
    sc.description = spec["desc"]


# ---- stuck_search ------------------------------------------------------------
# Rule: loop_turn = the request whose history first holds the third
# occurrence of the same search (same cursor/page, or arguments that differ
# only trivially: case, whitespace, plural, key order, punctuation).

def _kb_result(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"hits": [{"id": "kb-1042", "title": "Returns for physical items", "score": 0.61},
                        {"id": "kb-0877", "title": "How gift cards work", "score": 0.58}], "total": 2})


def _orders_page(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"items": [{"id": "ord_5521", "status": "pending", "total": 84.0},
                         {"id": "ord_5524", "status": "pending", "total": 19.5},
                         {"id": "ord_5530", "status": "pending", "total": 240.0}],
               "next_cursor": "cur_8fJ2kLm3nQ7x", "has_more": True})


def _tickets_page2(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"page": 2, "per_page": 3, "total_pages": 5,
               "tickets": [{"id": 30418, "subject": "Cannot reset password"},
                           {"id": 30422, "subject": "Invoice shows wrong VAT"},
                           {"id": 30431, "subject": "App crashes on login"}],
               "fetched_at": rfc3339z(t), "request_id": f"req_{r.tok(16)}"})


def _web_results(r: Rng, t: dt.datetime, k: int) -> str:
    return ("1. asyncio.wait_for - Python docs: 'If a timeout occurs, it cancels the task and raises TimeoutError.'\n"
            "2. Stack Overflow: 'asyncio.wait_for does not cancel my coroutine' (2019)\n"
            "3. Blog: Timeouts in asyncio, a practical guide")


def _issues_empty(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"total_count": 0, "items": []})


def _products_none(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"results": [], "total": 0, "search_id": r.uuid(), "took_ms": r.randint(8, 40)})


def _channel_page(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"messages": [{"user": "U061NFTT2", "text": "deploy is blocked on the flaky e2e test again", "ts": "1795172045.000200"},
                            {"user": "U02B7KQ1L", "text": "I'll take a look after lunch", "ts": "1795172101.000400"}],
               "has_more": True, "next_cursor": "dXNlcjpVMEc5V0ZYTlo="})


def _no_flights(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"offers": [], "message": "No direct flights found for this date.", "quote_id": f"q_{r.tok(12)}"})


STUCK_SEARCH = [
    dict(system="You are Acme's support assistant. Search the knowledge base before answering.", tools=["search_kb", "get_order"],
         prompt="Can I get a refund for a digital gift card I bought 40 days ago?", pre=[], name="search_kb",
         seq=[{"query": "refund policy"}, {"query": "Refund policy "}, {"query": "refund  policies"},
              {"query": "refund policy", "limit": 10}, {"limit": 10, "query": "refund policy"}, {"query": "refund policy."},
              {"query": "REFUND POLICY"}, {"query": "refund-policy"}],
         result=_kb_result, texts=["Let me search the help center.", "Searching again with a slightly different query.", None],
         desc="A support agent reruns the same knowledge-base search with trivial variations (case, trailing space, double space, plural, key order) and gets the same two hits."),
    dict(system="You are an operations assistant.", tools=["list_orders", "get_order"],
         prompt="List all pending orders so I can see the total value.",
         pre=[("list_orders", {"status": "pending"}, lambda r, t, k: pj({"items": [{"id": "ord_5507", "status": "pending", "total": 42.0}, {"id": "ord_5512", "status": "pending", "total": 310.0}, {"id": "ord_5518", "status": "pending", "total": 12.99}], "next_cursor": "cur_8fJ2kLm3nQ7x", "has_more": True}))], name="list_orders",
         seq=[{"status": "pending", "cursor": "cur_8fJ2kLm3nQ7x"}], result=_orders_page, texts=None,
         desc="Non-advancing pagination: the API keeps returning the cursor it was given and the agent keeps requesting the same page."),
    dict(system="You are a support-queue assistant.", tools=["list_tickets", "get_ticket"],
         prompt="Go through the billing queue and tell me which tickets mention VAT.",
         pre=[("list_tickets", {"queue": "billing", "page": 1}, lambda r, t, k: pj({"page": 1, "per_page": 3, "total_pages": 5, "tickets": [{"id": 30401, "subject": "Refund not received"}, {"id": 30407, "subject": "Change billing email"}, {"id": 30412, "subject": "Double charge"}], "fetched_at": rfc3339z(t)}))],
         name="list_tickets", seq=[{"queue": "billing", "page": 2}], result=_tickets_page2,
         texts=["Fetching the next page.", None, "Getting page 2."],
         desc="An agent requests page 2 of a ticket queue over and over; the page is the same except for a fetched_at timestamp and request id."),
    dict(system="You are a research assistant with web search.", tools=["web_search", "fetch_page"],
         prompt="Why doesn't asyncio.wait_for cancel my task on timeout in Python 3.11?", pre=[], name="web_search",
         seq=[{"query": "python asyncio wait_for timeout cancel"}, {"query": "Python asyncio wait_for timeout cancel"},
              {"query": "python asyncio wait_for timeout cancel?"}, {"query": "python asyncio  wait_for timeout cancel"},
              {"query": "python asyncio wait_for timeout cancel 3.11"}, {"query": "python asyncio wait_for timeout cancels"},
              {"query": "Python asyncio wait_for timeout cancel"}],
         result=_web_results, texts=None,
         desc="A research agent repeats a web search with capitalisation, punctuation, spacing and plural changes and reads the same three results each time."),
    dict(system="You are a triage assistant for the acme/api repository.", tools=["search_issues", "list_issues"],
         prompt="Is there already an open issue about the memory leak in the websocket handler?", pre=[], name="search_issues",
         seq=[({"repo": "acme/api", "query": "memory leak", "state": "open"}, None),
              ({"query": "memory leak", "repo": "acme/api", "state": "open"}, None),
              ({"repo": "acme/api", "query": "memory leak", "state": "open"}, '{"repo": "acme/api", "query": "memory leak", "state": "open"}'),
              ({"state": "open", "query": "memory leak ", "repo": "acme/api"}, None),
              ({"repo": "acme/api", "query": "memory leak", "state": "open"}, '{ "repo":"acme/api","query":"memory leak","state":"open" }'),
              ({"repo": "acme/api", "query": "Memory leak", "state": "open"}, None)],
         result=_issues_empty, texts=["Searching the issue tracker.", None],
         desc="An agent reissues the same issue search with reordered keys, extra whitespace inside and around the JSON arguments, and a trailing space."),
    dict(system="You are a shopping assistant.", tools=["search_products"],
         prompt="Find me a 65W USB-C charger under 40 euros.", pre=[], name="search_products",
         seq=[{"query": "usb-c charger 65w"}, {"query": "USB-C charger 65W"}, {"query": "usb-c  charger 65w"},
              {"query": "usb-c charger 65w "}, {"query": "usb-c chargers 65w"}, {"query": "Usb-c charger 65w"}],
         result=_products_none, texts=["Let me search the catalogue.", "No results; trying a variation.", None],
         desc="A shopping agent repeats an empty product search with trivial variations; each empty result has a new search UUID and timing."),
    dict(system="You are a team assistant with read access to chat channels.", tools=["get_channel_history"],
         prompt="Summarise everything discussed in #deploys this week.",
         pre=[("get_channel_history", {"channel": "C024BE91L", "limit": 2}, lambda r, t, k: pj({"messages": [{"user": "U02B7KQ1L", "text": "staging deploy green", "ts": "1795258501.000100"}, {"user": "U061NFTT2", "text": "prod deploy at 3pm", "ts": "1795259003.000300"}], "has_more": True, "next_cursor": "dXNlcjpVMEc5V0ZYTlo="}))], name="get_channel_history",
         seq=[{"channel": "C024BE91L", "limit": 2, "cursor": "dXNlcjpVMEc5V0ZYTlo="}], result=_channel_page, texts=None,
         desc="A chat-history reader keeps following a base64 cursor that the API hands back unchanged, reading the same two messages every time."),
    dict(system="You are a travel assistant.", tools=["search_flights", "get_fare_rules"],
         prompt="Find me a direct flight from Lisbon to Berlin on 4 December.", pre=[], name="search_flights",
         seq=[{"from": "LIS", "to": "BER", "date": "2026-12-04"}, {"to": "BER", "from": "LIS", "date": "2026-12-04"},
              {"from": "lis", "to": "ber", "date": "2026-12-04"}, {"from": "LIS", "to": "BER", "date": "2026-12-04 "},
              {"date": "2026-12-04", "from": "LIS", "to": "BER"}],
         result=_no_flights, texts=["Searching flights.", "Let me search once more.", None],
         desc="A travel agent repeats the same flight search with reordered keys, lower-case airport codes and a trailing space; each empty answer has a new quote id."),
]


def _seq_item(item):
    return item if isinstance(item, tuple) else (item, None)


def build_stuck_search(sc: Scenario) -> None:
    spec = STUCK_SEARCH[sc.index - 1]
    rng = sc.rng
    r = Run(sc, sc.conversation(spec["system"], spec["tools"]))
    r.user(spec["prompt"])
    for name, args, out in spec["pre"]:
        r.call(name, args, out(rng, sc.clock.tick(), 0))
    seq = spec["seq"]
    for k in range(1, rng.randint(6, 8) + 1):
        args, raw = _seq_item(seq[(k - 1) % len(seq)])
        r.call(spec["name"], args, spec["result"](rng, sc.clock.tick(), k), raw=raw,
               text=pick_text(rng, spec["texts"], k), mark=(k == 3))
    sc.description = spec["desc"]


# ---- alternating_tools -------------------------------------------------------
# Rule: loop_turn = the request whose history first completes the third
# repetition of the whole cycle (A,B x3: after the 6th call; A,B,C x3: after the 9th).

TEST_FAIL = ("FAILED tests/test_parser.py::test_parse_duration_hours - AssertionError: assert 5400 == 3600\n"
             "1 failed, 41 passed in {secs}s")

ALTERNATING = [
    dict(system="You are a coding agent working in the user's repository.", tools=["read_file", "run_tests", "edit_file"],
         prompt="test_parse_duration_hours is failing, please fix it.",
         cycle=[("read_file", {"path": "src/parser.py"}, lambda r, t, k: "def parse_duration(s):\n    h, m = s.split('h')\n    return int(h) * 3600 + int(m.rstrip('m') or 0) * 60\n", False),
                ("run_tests", {"filter": "test_parse_duration"}, lambda r, t, k: TEST_FAIL.format(secs=f"{r.randint(38, 61) / 100:.2f}"), False)],
         desc="A coding agent alternates read_file and run_tests on the same file and test filter without ever editing; the failing output differs only in its timing."),
    dict(system="You are a helpdesk agent.", tools=["get_ticket", "update_ticket"],
         prompt="Close ticket 88410 as resolved and assign it to me (agent j.moreau).",
         cycle=[("get_ticket", {"ticket_id": "88410"}, lambda r, t, k: pj({"id": "88410", "status": "pending_customer", "assignee": None, "required_fields": ["resolution_code"]}), False),
                ("update_ticket", {"ticket_id": "88410", "status": "resolved", "assignee": "j.moreau"}, lambda r, t, k: pj({"error": "validation_failed", "detail": "resolution_code is required to resolve", "request_id": r.uuid()}), True)],
         desc="A helpdesk agent alternates get_ticket and an update_ticket that fails validation for a missing field it never supplies."),
    dict(system="You are a browser automation agent.", tools=["click_element", "take_screenshot"],
         prompt="Download last month's invoice from the billing portal (you're already logged in).",
         cycle=[("click_element", {"selector": "button#download-invoice"}, lambda r, t, k: "clicked", False),
                ("take_screenshot", {}, lambda r, t, k: "Billing > Invoices. A modal says 'Please accept the updated terms to continue' with buttons 'Review terms' and 'Accept'. The invoice list is greyed out behind it.", False)],
         desc="A browser agent alternates clicking a download button and taking a screenshot that shows the same blocking modal."),
    dict(system="You are a fulfilment assistant.", tools=["check_inventory", "reserve_stock"],
         prompt="Reserve 12 units of SKU CB-2207 in the Rotterdam warehouse for order 55012.",
         cycle=[("check_inventory", {"sku": "CB-2207", "warehouse": "RTM"}, lambda r, t, k: pj({"sku": "CB-2207", "warehouse": "RTM", "on_hand": 9, "reserved": 0}), False),
                ("reserve_stock", {"sku": "CB-2207", "warehouse": "RTM", "quantity": 12}, lambda r, t, k: f"insufficient stock: requested 12, available 9 (evt_{r.tok(18)})", True)],
         desc="A fulfilment agent alternates an inventory check and a reservation of more units than are on hand; each failure has a new event id."),
    dict(system="You are a code-quality assistant.", tools=["run_linter", "apply_formatter"],
         prompt="Make the linter pass on src/api/handlers.py.",
         cycle=[("run_linter", {"path": "src/api/handlers.py"}, lambda r, t, k: "src/api/handlers.py:88:5: B006 Do not use mutable data structures for argument defaults\nFound 1 error.", False),
                ("apply_formatter", {"path": "src/api/handlers.py"}, lambda r, t, k: "1 file left unchanged.", False)],
         desc="An agent alternates running the linter and the formatter, which cannot fix the reported issue, with identical outputs every time."),
    dict(system="You are a coding agent working in the user's repository.", tools=["read_file", "edit_file", "run_tests"],
         prompt="Fix the failing test in tests/test_cart.py.",
         cycle=[("read_file", {"path": "src/cart.py"}, lambda r, t, k: "def total(items):\n    return round(sum(i.price * i.qty for i in items), 1)\n", False),
                ("edit_file", {"path": "src/cart.py", "old": "round(sum(i.price * i.qty for i in items), 1)", "new": "round(sum(i.price * i.qty for i in items), 2)"}, lambda r, t, k: "error: old text not found in src/cart.py", True),
                ("run_tests", {"path": "tests/test_cart.py"}, lambda r, t, k: f"FAILED tests/test_cart.py::test_total_rounding - assert 10.0 == 9.99\n1 failed, 7 passed in {r.randint(20, 35) / 100:.2f}s", False)],
         desc="A three-call cycle: read a file, try the same edit, run the same failing tests, repeated."),
    dict(system="You are a travel booking agent.", tools=["search_flights", "get_fare_rules", "create_booking"],
         prompt="Book the cheapest flight Porto to Paris on 12 December for Ana Ribeiro.",
         cycle=[("search_flights", {"from": "OPO", "to": "CDG", "date": "2026-12-12"}, lambda r, t, k: pj({"offers": [{"offer_id": "off_51Hc9", "price_eur": 74, "dep": "06:15"}, {"offer_id": "off_51Hd2", "price_eur": 118, "dep": "13:40"}]}), False),
                ("get_fare_rules", {"offer_id": "off_51Hc9"}, lambda r, t, k: "Basic fare: no changes, no refund, cabin bag only.", False),
                ("create_booking", {"offer_id": "off_51Hc9", "passenger": "Ana Ribeiro"}, lambda r, t, k: f"offer expired: price no longer available (booking attempt bk_{r.tok(14)} at {iso_seconds(t)})", True)],
         desc="A three-call cycle: search, read fare rules, book an offer that is expired, and start over with the same stale offer."),
    dict(system="You are an SRE assistant with kubectl-like tools.", tools=["get_pods", "get_logs", "rollout_restart"],
         prompt="The orders-worker deployment is crashlooping in prod. Get it healthy.",
         cycle=[("get_pods", {"namespace": "prod", "selector": "app=orders-worker"}, lambda r, t, k: f"orders-worker-7d9c6b5f4-x2kqp   0/1   CrashLoopBackOff   {k + 6}   {r.randint(2, 9)}m", False),
                ("get_logs", {"namespace": "prod", "pod": "orders-worker-7d9c6b5f4-x2kqp", "tail": 5}, lambda r, t, k: "KeyError: 'ORDERS_QUEUE_URL'\n  File \"/app/worker.py\", line 12, in <module>", False),
                ("rollout_restart", {"namespace": "prod", "deployment": "orders-worker"}, lambda r, t, k: "deployment.apps/orders-worker restarted", False)],
         desc="A three-call SRE cycle: list pods, read the same missing-env-var crash, restart the deployment, and repeat without fixing the config."),
]


def build_alternating_tools(sc: Scenario) -> None:
    spec = ALTERNATING[sc.index - 1]
    rng = sc.rng
    cycle = spec["cycle"]
    r = Run(sc, sc.conversation(spec["system"], spec["tools"]))
    r.user(spec["prompt"])
    total = rng.randint(9, 11) if len(cycle) == 2 else rng.randint(12, 13)
    for n in range(total):
        name, args, out, err = cycle[n % len(cycle)]
        k = n // len(cycle) + 1
        r.call(name, args, out(rng, sc.clock.tick(), k), error=err, mark=(n + 1 == 3 * len(cycle)))
    if len(cycle) == 3:
        sc.tags.append("three_cycle")
    sc.description = spec["desc"]


# ---- resumed_loop ------------------------------------------------------------
# Rule: the loop runs twice (two occurrences of the step or cycle), the agent
# does 2-4 productive requests, then resumes the same loop. loop_turn = the
# request whose history first holds the SECOND occurrence after the break
# (4 occurrences in total): the first one back could be a legitimate retry
# after the detour; the second one back, with the same outcome, is unmistakable.

def _kb_cancel(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"hits": [{"id": "kb-2210", "title": "Managing your plan", "score": 0.55},
                        {"id": "kb-1042", "title": "Returns for physical items", "score": 0.41}], "total": 2})


def _invoices_stuck(r: Rng, t: dt.datetime, k: int) -> str:
    return pj({"data": [{"id": "in_7Hq2", "customer_id": "5518830092", "amount_due": 420.0, "due": "2026-10-15"},
                        {"id": "in_7Hq9", "customer_id": "5518830417", "amount_due": 96.5, "due": "2026-10-21"}],
               "next_cursor": "cur_Q2mV7tLp0aZk", "has_more": True})


RESUMED = [
    dict(style="tool", system="You are a release assistant with repository and CI access.",
         tools=["get_build_status", "read_file", "edit_file", "git_diff"],
         prompt="Check that main is green on payments-api, then update the changelog for v3.8.0.", pre=[],
         cycle=[("get_build_status", {"pipeline": "payments-api", "branch": "main"}, _err_build, True)],
         break_text="The CI API keeps failing. While it recovers I'll update the changelog.",
         interlude=[("read_file", {"path": "CHANGELOG.md"}, "# Changelog\n\n## 3.7.2 - 2026-11-02\n- Fix rounding in refunds\n"),
                    ("edit_file", {"path": "CHANGELOG.md", "old": "# Changelog\n", "new": "# Changelog\n\n## 3.8.0 - unreleased\n- Add SEPA instant payouts\n"}, "ok: 1 replacement"),
                    ("git_diff", {"path": "CHANGELOG.md"}, "+## 3.8.0 - unreleased\n+- Add SEPA instant payouts\n"),
                    ("read_file", {"path": "VERSION"}, "3.7.2\n")],
         resume_text="Changelog done. Checking the build status again.",
         desc="A release agent retries a failing CI status call twice, updates the changelog, then goes back to the same failing call."),
    dict(style="tool", system="You are Acme's support assistant.", tools=["search_kb", "get_customer", "list_orders"],
         prompt="How do I cancel my subscription and do I get money back? My email is leo.hartmann@example.com", pre=[],
         cycle=[("search_kb", [{"query": "cancel subscription"}, {"query": "Cancel subscription"}, {"query": "cancel  subscription"},
                               {"query": "cancel subscriptions"}, {"query": "cancel subscription "}, {"query": "cancel subscription", "limit": 5},
                               {"limit": 5, "query": "cancel subscription"}, {"query": "CANCEL SUBSCRIPTION"}], _kb_cancel, False)],
         break_text="Let me look up your account first.",
         interlude=[("get_customer", {"email": "leo.hartmann@example.com"}, pj({"id": "3310475529", "plan": "pro-annual", "renews": "2027-03-02"})),
                    ("list_orders", {"customer_id": "3310475529", "since": "2026-01-01"}, pj({"items": [{"id": "ord_9912", "total": 228.0, "kind": "subscription"}], "has_more": False})),
                    ("get_customer", {"customer_id": "3310475529"}, pj({"id": "3310475529", "plan": "pro-annual", "payment_method": "card ending 4421"}))],
         resume_text="Now let me find the cancellation policy.",
         desc="A support agent repeats a near-identical knowledge-base search, looks up the customer, then resumes the same search loop."),
    dict(style="text", system="You are a helpful Linux assistant.",
         question="Give me a one-liner that lists files over 100 MB modified in the last 7 days under /var/log.",
         first="`find /var/log -type f -size +100M -mtime 7`",
         complaint="That returns nothing, but I know there are big files from yesterday.",
         drivers=["still nothing", "try again", "Same result, empty.", "please fix it", "still empty"],
         slots=[["You're right, my apologies.", "Sorry about that.", "Apologies for the confusion.", "My mistake, sorry."],
                ["This version should work:", "Try this command:", "Here's the corrected one-liner:"],
                ["`find /var/log -type f -size +100M -mtime 7`"],
                ["It lists files larger than 100 MB changed in the last week.", "It finds files above 100 MB modified within 7 days.", ""]],
         interlude=[("OK, different question: how do I see which process is listening on port 8080?", "Use `sudo ss -ltnp 'sport = :8080'` or `sudo lsof -i :8080`."),
                    ("And how do I follow a log file live?", "`tail -F /var/log/syslog` follows it, even across log rotation."),
                    ("How do I count the lines that contain ERROR in it?", "`grep -c ERROR /var/log/syslog`"),
                    ("Thanks. And the disk usage of /var/log per directory?", "`sudo du -h --max-depth=1 /var/log | sort -h`")],
         resume="Back to the find command: it still returns nothing for yesterday's big files.", swap=None,
         desc="A shell-help chat where the model repeats the same wrong find command in new words, answers a few unrelated questions correctly, then falls back into the same loop."),
    dict(style="tool", system="You are a coding agent working in the user's repository.",
         tools=["read_file", "run_tests", "search_code", "list_files"],
         prompt="test_checkout_total fails on CI. Find out why and fix it.", pre=[],
         cycle=[("read_file", {"path": "src/checkout.py"}, lambda r, t, k: "def checkout_total(cart):\n    subtotal = sum(i.price for i in cart.items)\n    return apply_discount(subtotal, cart.code)\n", False),
                ("run_tests", {"filter": "test_checkout_total"}, lambda r, t, k: f"FAILED tests/test_checkout.py::test_checkout_total - assert 90.0 == 81.0\n1 failed in {r.randint(20, 40) / 100:.2f}s", False)],
         break_text="Let me look at how discounts are applied elsewhere.",
         interlude=[("search_code", {"query": "def apply_discount"}, "src/discounts.py:8:def apply_discount(amount, code):"),
                    ("read_file", {"path": "src/discounts.py"}, "def apply_discount(amount, code):\n    pct = CODES.get(code, 0)\n    return amount * (1 - pct / 100)\n"),
                    ("list_files", {"path": "tests/fixtures"}, "carts.json\ncodes.json"),
                    ("read_file", {"path": "tests/fixtures/codes.json"}, "{\"WELCOME10\": 10, \"VIP\": 20}")],
         resume_text="Back to the checkout module.",
         desc="A coding agent alternates read_file and run_tests on the same target, detours through the discount code, then resumes the same alternation."),
    dict(style="tool", system="You are a data analyst with read access to the warehouse.",
         tools=["query_database", "describe_table", "list_tables"],
         prompt="How many active subscriptions did we have at the end of each month this year?", pre=[],
         cycle=[("query_database", {"sql": "SELECT date_trunc('month', d) AS m, COUNT(*) FROM generate_series('2026-01-01'::date, '2026-11-30', '1 day') d JOIN subscriptions s ON s.started_at <= d AND (s.ended_at IS NULL OR s.ended_at > d) GROUP BY 1 ORDER BY 1"}, _err_sql, True)],
         break_text="The query is timing out. Let me look at the tables to write a cheaper one.",
         interlude=[("list_tables", {"schema": "billing"}, "subscriptions\nplans\nsubscription_events"),
                    ("describe_table", {"table": "subscriptions"}, "id uuid, customer_id bigint, plan_id int, started_at timestamptz, ended_at timestamptz"),
                    ("describe_table", {"table": "subscription_events"}, "id bigint, subscription_id uuid, kind text, at timestamptz"),
                    ("query_database", {"sql": "SELECT COUNT(*) FROM subscriptions WHERE ended_at IS NULL"}, "count\n41208")],
         resume_text="Now the monthly breakdown.",
         desc="An analyst agent reruns a timing-out query twice, explores the schema successfully, then reruns the very same heavy query again."),
    dict(style="tool", system="You are a collections assistant.", tools=["list_invoices", "get_customer", "send_email"],
         prompt="Find all overdue invoices and email each customer a friendly reminder.",
         pre=[("list_invoices", {"status": "overdue"}, lambda r, t, k: pj({"data": [{"id": "in_7Gx1", "customer_id": "5518830011", "amount_due": 1200.0, "due": "2026-10-02"}], "next_cursor": "cur_Q2mV7tLp0aZk", "has_more": True}))],
         cycle=[("list_invoices", {"status": "overdue", "cursor": "cur_Q2mV7tLp0aZk"}, _invoices_stuck, False)],
         break_text="I'll email the customers on this page first.",
         interlude=[("get_customer", {"customer_id": "5518830092"}, pj({"id": "5518830092", "name": "Fenwick & Daughters", "email": "ap@fenwick.example"})),
                    ("send_email", {"to": "ap@fenwick.example", "subject": "Friendly reminder: invoice in_7Hq2", "body": "Hello, invoice in_7Hq2 (420.00 EUR) was due on 15 October. Kind regards, Acme"}, "queued"),
                    ("get_customer", {"customer_id": "5518830417"}, pj({"id": "5518830417", "name": "Birchwood Dental", "email": "office@birchwood.example"})),
                    ("send_email", {"to": "office@birchwood.example", "subject": "Friendly reminder: invoice in_7Hq9", "body": "Hello, invoice in_7Hq9 (96.50 EUR) was due on 21 October. Kind regards, Acme"}, "queued")],
         resume_text="Now fetching the next page of overdue invoices.",
         desc="A collections agent follows a cursor that never advances, works on reminder emails in between, then follows the same stuck cursor again."),
    dict(style="tool", system="You are a browser automation agent.", tools=["click_element", "take_screenshot"],
         prompt="Export my contacts from the CRM as CSV.", pre=[],
         cycle=[("click_element", {"selector": "button#export-csv"}, lambda r, t, k: "clicked", False),
                ("take_screenshot", {}, lambda r, t, k: "Contacts page. Banner: 'Your role (Viewer) cannot export data. Ask an admin.' The Export CSV button is disabled.", False)],
         break_text="Let me check my permissions in settings.",
         interlude=[("click_element", {"selector": "nav a[href='/settings']"}, "clicked"),
                    ("take_screenshot", {}, "Settings > Profile. Role: Viewer. Workspace admin: m.okafor@example.com."),
                    ("click_element", {"selector": "nav a[href='/contacts']"}, "clicked")],
         resume_text="Back on the contacts page; trying the export again.",
         desc="A browser agent alternates clicking a disabled export button and screenshotting the same banner, checks its role in settings, then resumes the alternation."),
]


def build_resumed_loop(sc: Scenario) -> None:
    spec = RESUMED[sc.index - 1]
    rng = sc.rng
    if spec["style"] == "text":
        _build_resumed_text(sc, spec)
        sc.description = spec["desc"]
        return
    r = Run(sc, sc.conversation(spec["system"], spec["tools"]))
    r.user(spec["prompt"])
    for name, args, out in spec["pre"]:
        r.call(name, args, out(rng, sc.clock.tick(), 0))
    cycle = spec["cycle"]
    occurrence = 0  # global index into argument sequences

    def run_cycle(text: str | None, mark_at_end: bool) -> None:
        nonlocal occurrence
        occurrence += 1
        for i, (name, args, out, err) in enumerate(cycle):
            if isinstance(args, list):
                args = args[(occurrence - 1) % len(args)]
            r.call(name, args, out(rng, sc.clock.tick(2, 20), occurrence), error=err,
                   text=text if i == 0 else None, mark=mark_at_end and i == len(cycle) - 1)

    for c in range(2):
        run_cycle(None, False)
    n_inter = rng.randint(2, min(4, len(spec["interlude"])))
    for i, (name, args, out) in enumerate(spec["interlude"][:n_inter]):
        r.call(name, args, out, text=spec["break_text"] if i == 0 else None)
    after = rng.randint(5, 6) if len(cycle) == 1 else 4
    for c in range(1, after + 1):
        run_cycle(spec["resume_text"] if c == 1 else None, c == 1)
    sc.description = spec["desc"]


def _build_resumed_text(sc: Scenario, spec: dict) -> None:
    rng = sc.rng
    r = Run(sc, sc.conversation(spec["system"]))
    after = rng.randint(5, 6)
    answers = rephrasings(rng, spec["slots"], 1 + after, " ", spec.get("swap", (1, 2)))
    drivers = driver_messages(spec["drivers"], 1 + after)
    r.user(spec["question"])
    r.say(spec["first"])  # occurrence 1: the first answer is already the wrong command
    r.user(spec["complaint"])
    r.say(answers[0])  # occurrence 2
    answers = answers[1:]
    n_inter = rng.randint(2, min(4, len(spec["interlude"])))
    for q, a in spec["interlude"][:n_inter]:
        r.user(q)
        r.say(a)
    r.user(spec["resume"])
    for k in range(1, after + 1):
        r.say(answers[k - 1])
        r.user(drivers[k], mark=(k == 1))


# --------------------------------------------------------------------------
# 5b. Healthy kinds
# --------------------------------------------------------------------------

# ---- productive_session --------------------------------------------------------
# Long sessions that progress. Some repeat a tool with the same arguments
# legitimately (tests rerun after an edit, with different results): those
# are tagged near_miss.

def _ps_csv_export(rng: Rng) -> tuple[list, list, str, str, bool]:
    tools = ["list_files", "read_file", "search_code", "edit_file", "run_tests", "git_diff"]
    steps = [
        ("user", "Our CSV export drops rows whose notes field contains a newline. Find and fix it, and make sure the tests pass."),
        ("call", "list_files", {"path": "src/export"}, "__init__.py\ncsv_writer.py\nformats.py\nrows.py"),
        ("call", "read_file", {"path": "src/export/csv_writer.py"}, "import csv\n\ndef write_rows(fh, rows):\n    w = csv.writer(fh)\n    for row in rows:\n        if '\\n' in ''.join(map(str, row)):\n            continue  # TODO: multiline\n        w.writerow(row)\n"),
        ("call", "search_code", {"query": "write_rows(", "path": "src"}, "src/export/formats.py:14:    write_rows(fh, rows)\nsrc/reports/monthly.py:52:    write_rows(out, data)"),
        ("call", "read_file", {"path": "tests/export/test_csv_writer.py"}, "from .helpers import read_back\n\ndef test_basic_rows(tmp_path):\n    rows = [[1, 'a'], [2, 'b']]\n    assert read_back(tmp_path, rows) == rows\n\ndef test_unicode(tmp_path):\n    ...\n"),
        ("call", "run_tests", {"path": "tests/export"}, "8 passed in 0.41s"),
        ("call", "edit_file", {"path": "tests/export/test_csv_writer.py", "old": "def test_unicode(tmp_path):", "new": "def test_multiline_notes(tmp_path):\n    rows = [[1, 'line one\\nline two']]\n    assert read_back(tmp_path, rows) == rows\n\ndef test_unicode(tmp_path):"}, "ok: 1 replacement"),
        ("call", "run_tests", {"path": "tests/export"}, "FAILED tests/export/test_csv_writer.py::test_multiline_notes - AssertionError: assert [] == [[1, 'line one\\nline two']]\n1 failed, 8 passed in 0.44s"),
        ("call", "edit_file", {"path": "src/export/csv_writer.py", "old": "        if '\\n' in ''.join(map(str, row)):\n            continue  # TODO: multiline\n", "new": ""}, "ok: 1 replacement"),
        ("call", "run_tests", {"path": "tests/export"}, "9 passed in 0.40s"),
        ("call", "read_file", {"path": "src/reports/monthly.py"}, "def write_monthly(path, data):\n    with open(path, 'w', newline='') as out:\n        write_rows(out, data)\n"),
        ("call", "run_tests", {}, "412 passed, 3 skipped in 38.21s"),
        ("call", "git_diff", {}, "--- a/src/export/csv_writer.py\n+++ b/src/export/csv_writer.py\n@@ -4,6 +4,4 @@\n     for row in rows:\n-        if '\\n' in ''.join(map(str, row)):\n-            continue  # TODO: multiline\n         w.writerow(row)\n"),
        ("say", "Fixed: write_rows skipped every row containing a newline, although csv.writer already quotes such fields. I removed the skip and added test_multiline_notes; the full suite passes (412 passed)."),
        ("user", "Nice. Can you also add a changelog entry under Unreleased?"),
        ("call", "read_file", {"path": "CHANGELOG.md"}, "# Changelog\n\n## Unreleased\n\n### Added\n- Monthly report filters\n\n## 4.2.0 - 2026-10-30\n"),
        ("call", "edit_file", {"path": "CHANGELOG.md", "old": "### Added\n- Monthly report filters\n", "new": "### Added\n- Monthly report filters\n\n### Fixed\n- CSV export no longer drops rows whose fields contain newlines\n"}, "ok: 1 replacement"),
        ("call", "git_diff", {"path": "CHANGELOG.md"}, "+### Fixed\n+- CSV export no longer drops rows whose fields contain newlines\n"),
        ("say", "Added under Unreleased > Fixed."),
        ("user", "Thanks. Does the XLSX export have the same problem?"),
        ("call", "search_code", {"query": "TODO: multiline", "path": "src"}, "no matches"),
        ("call", "read_file", {"path": "src/export/formats.py"}, "def export(rows, fmt, fh):\n    if fmt == 'xlsx':\n        return xlsx.write(rows, fh)\n    write_rows(fh, rows)\n"),
        ("say", "No: XLSX goes through its own writer, which never had the skip."),
    ]
    return tools, steps, "You are a coding agent working in the user's repository. Use the tools; keep the user informed.", \
        "A coding agent finds and fixes a CSV export bug, writes a regression test, reruns the tests after each edit (different results) and answers follow-ups.", True


def _ps_rust_duration(rng: Rng):
    tools = ["list_files", "read_file", "search_code", "edit_file", "run_tests", "run_linter", "git_diff"]
    steps = [
        ("user", "parse_duration(\"1h30m\") returns 3600 instead of 5400 in crates/config. Please fix it."),
        ("call", "list_files", {"path": "crates/config/src"}, "lib.rs\nduration.rs\nerror.rs"),
        ("call", "read_file", {"path": "crates/config/src/duration.rs"}, "pub fn parse_duration(s: &str) -> Result<u64, Error> {\n    let (h, rest) = s.split_once('h').unwrap_or((\"0\", s));\n    let m = rest.trim_end_matches('m');\n    Ok(h.parse::<u64>()? * 3600 + m.parse::<u64>().unwrap_or(0))\n}\n"),
        ("call", "search_code", {"query": "parse_duration", "path": "crates"}, "crates/config/src/duration.rs:1\ncrates/config/src/lib.rs:44\ncrates/cli/src/args.rs:19"),
        ("call", "run_tests", {"filter": "duration"}, "running 4 tests\ntest duration::hours ... ok\ntest duration::minutes ... ok\ntest duration::zero ... ok\ntest duration::invalid ... ok\ntest result: ok. 4 passed; 0 failed"),
        ("call", "edit_file", {"path": "crates/config/src/duration.rs", "old": "    #[test]\n    fn zero()", "new": "    #[test]\n    fn hours_and_minutes() {\n        assert_eq!(parse_duration(\"1h30m\").unwrap(), 5400);\n    }\n\n    #[test]\n    fn zero()"}, "ok: 1 replacement"),
        ("call", "run_tests", {"filter": "duration"}, "test duration::hours_and_minutes ... FAILED\nassertion `left == right` failed\n  left: 3630\n right: 5400\ntest result: FAILED. 4 passed; 1 failed"),
        ("call", "edit_file", {"path": "crates/config/src/duration.rs", "old": "m.parse::<u64>().unwrap_or(0))", "new": "m.parse::<u64>().unwrap_or(0) * 60)"}, "ok: 1 replacement"),
        ("call", "run_tests", {"filter": "duration"}, "running 5 tests\ntest result: ok. 5 passed; 0 failed"),
        ("call", "run_linter", {"path": "crates/config"}, "warning: this `if` statement can be collapsed\n  --> crates/config/src/lib.rs:51:9\nwarning: 1 warning emitted"),
        ("call", "read_file", {"path": "crates/config/src/lib.rs"}, "        if let Some(d) = raw.timeout {\n            if !d.is_empty() {\n                cfg.timeout = parse_duration(&d)?;\n            }\n        }\n"),
        ("call", "edit_file", {"path": "crates/config/src/lib.rs", "old": "        if let Some(d) = raw.timeout {\n            if !d.is_empty() {\n                cfg.timeout = parse_duration(&d)?;\n            }\n        }\n", "new": "        if let Some(d) = raw.timeout.filter(|d| !d.is_empty()) {\n            cfg.timeout = parse_duration(&d)?;\n        }\n"}, "ok: 1 replacement"),
        ("call", "run_linter", {"path": "crates/config"}, "Finished: no warnings"),
        ("call", "run_tests", {}, "test result: ok. 188 passed; 0 failed; 2 ignored"),
        ("call", "git_diff", {}, " crates/config/src/duration.rs | 7 ++++++-\n crates/config/src/lib.rs      | 6 ++----\n 2 files changed, 8 insertions(+), 5 deletions(-)"),
        ("say", "Fixed: minutes were added as seconds. Added a 1h30m test, fixed the multiplication, and cleaned up the clippy warning the linter reported. All 188 tests pass."),
        ("user", "Does the CLI help text mention the duration format?"),
        ("call", "read_file", {"path": "crates/cli/src/args.rs"}, "    /// Request timeout, e.g. 30s\n    #[arg(long, value_parser = parse_duration)]\n    timeout: u64,\n"),
        ("call", "edit_file", {"path": "crates/cli/src/args.rs", "old": "/// Request timeout, e.g. 30s", "new": "/// Request timeout, e.g. 30s, 5m or 1h30m"}, "ok: 1 replacement"),
        ("say", "It only showed 30s; it now lists 30s, 5m and 1h30m."),
    ]
    return tools, steps, "You are a coding agent in a Rust workspace. Use tools; make minimal changes.", \
        "A Rust coding agent reproduces a duration-parsing bug with a new test, fixes it, reruns tests and the linter with changing results, and updates help text.", True


def _ps_support_double_charge(rng: Rng):
    cust = str(rng.randint(6000000000, 6999999999))
    o1, o2, o3 = rng.uuid(), rng.uuid(), rng.uuid()
    tools = ["get_customer", "list_orders", "get_order", "check_refund_eligibility", "create_refund", "send_email", "add_note", "update_address"]
    steps = [
        ("user", "Hi, I'm Dana Whitfield (dana.whitfield@example.com). I was charged twice for my order last week."),
        ("call", "get_customer", {"email": "dana.whitfield@example.com"}, pj({"id": cust, "name": "Dana Whitfield", "tier": "plus", "address": "Prinsengracht 12, 1015 DK Amsterdam"})),
        ("call", "list_orders", {"customer_id": cust, "since": "2026-11-01"}, pj({"items": [{"id": o1, "total": 86.4, "placed": "2026-11-14"}, {"id": o2, "total": 19.99, "placed": "2026-11-09"}, {"id": o3, "total": 142.0, "placed": "2026-11-20"}], "has_more": False})),
        ("call", "get_order", {"order_id": o1}, pj({"id": o1, "status": "delivered", "payments": [{"captured": 86.4, "at": "2026-11-14T10:02:11Z"}, {"captured": 86.4, "at": "2026-11-14T10:02:13Z"}]})),
        ("call", "get_order", {"order_id": o2}, pj({"id": o2, "status": "delivered", "payments": [{"captured": 19.99, "at": "2026-11-09T18:40:55Z"}]})),
        ("say", f"I can see order {o1[:8]}… was captured twice (86.40 EUR each, two seconds apart). Shall I refund the duplicate charge?"),
        ("user", "Yes please, to the original card."),
        ("call", "check_refund_eligibility", {"order_id": o1}, pj({"eligible": True, "max_amount": 86.4, "method": "original_payment"})),
        ("call", "create_refund", {"order_id": o1, "amount": 86.4, "reason": "duplicate_charge"}, pj({"refund_id": "re_" + rng.tok(14), "status": "pending", "eta_days": 5})),
        ("call", "send_email", {"to": "dana.whitfield@example.com", "subject": "Your refund of 86.40 EUR", "body": "Hi Dana, we've refunded the duplicate charge of 86.40 EUR. It will reach your card within 5 business days."}, "queued"),
        ("call", "add_note", {"ticket_id": "T-" + str(rng.randint(100000, 999999)), "note": "Duplicate capture on order; refunded 86.40 EUR to card."}, "ok"),
        ("say", "Done: 86.40 EUR is on its way back to your card (up to 5 business days) and you'll get a confirmation email."),
        ("user", "Thanks! Also, I moved. New address: Keizersgracht 221, 1016 DV Amsterdam."),
        ("call", "update_address", {"customer_id": cust, "address": "Keizersgracht 221, 1016 DV Amsterdam"}, "ok"),
        ("call", "get_customer", {"customer_id": cust}, pj({"id": cust, "name": "Dana Whitfield", "address": "Keizersgracht 221, 1016 DV Amsterdam"})),
        ("say", "Your address is updated."),
        ("user", "Will my open order go to the new address?"),
        ("call", "get_order", {"order_id": o3}, pj({"id": o3, "status": "processing", "ship_to": "Prinsengracht 12, 1015 DK Amsterdam"})),
        ("say", "That order is still processing and set to the old address. Want me to ask the warehouse to change it?"),
        ("user", "Yes, please."),
        ("call", "add_note", {"ticket_id": "T-" + str(rng.randint(100000, 999999)), "note": f"Please reroute order {o3} to Keizersgracht 221, 1016 DV Amsterdam before dispatch."}, "ok"),
        ("say", "I've asked the warehouse to reroute it before dispatch. Anything else?"),
        ("user", "No, that's all. Thanks!"),
    ]
    return tools, steps, "You are Acme's customer support agent. Verify before acting; be brief and friendly.", \
        "A support agent resolves a duplicate charge with a refund, updates an address and reroutes an open order across several customer turns.", False


def _ps_data_analysis(rng: Rng):
    tools = ["list_tables", "describe_table", "run_sql", "make_chart", "export_csv"]
    q3 = ("SELECT r.name AS region, p.category, SUM(oi.qty * oi.unit_price) AS revenue FROM order_items oi JOIN orders o ON o.id = oi.order_id "
          "JOIN products p ON p.id = oi.product_id JOIN regions r ON r.id = o.region_id WHERE o.created_at >= '2026-07-01' AND o.created_at < '2026-10-01' GROUP BY 1, 2 ORDER BY 3 DESC")
    q3_rows = "region | category | revenue\nEMEA | Garden | 812,440\nNA | Kitchen | 790,115\nEMEA | Kitchen | 505,210\nAPAC | Garden | 388,900\n... (16 rows)"
    steps = [
        ("user", "Which product categories grew fastest quarter over quarter in 2026?"),
        ("call", "list_tables", {"schema": "sales"}, "orders\norder_items\nproducts\nregions\ncustomers"),
        ("call", "describe_table", {"table": "orders"}, "id bigint, customer_id bigint, region_id int, created_at timestamptz, status text"),
        ("call", "describe_table", {"table": "order_items"}, "order_id bigint, product_id int, qty int, unit_price numeric"),
        ("call", "run_sql", {"sql": "SELECT category, date_trunc('quarter', created_at) q, SUM(qty * unit_price) FROM order_items GROUP BY 1, 2"}, "ERROR: column \"category\" does not exist\nLINE 1: SELECT category, date_trunc('quarter', created_at) q, ...", True),
        ("call", "describe_table", {"table": "products"}, "id int, name text, category text, launched_at date"),
        ("call", "run_sql", {"sql": "SELECT p.category, date_trunc('quarter', o.created_at) AS q, SUM(oi.qty * oi.unit_price) AS revenue FROM order_items oi JOIN orders o ON o.id = oi.order_id JOIN products p ON p.id = oi.product_id WHERE o.created_at >= '2026-01-01' GROUP BY 1, 2 ORDER BY 1, 2"},
         "category | q | revenue\nGarden | 2026-Q1 | 801,220\nGarden | 2026-Q2 | 1,104,870\nGarden | 2026-Q3 | 1,496,300\nKitchen | 2026-Q1 | 1,630,400\nKitchen | 2026-Q2 | 1,702,950\nKitchen | 2026-Q3 | 1,744,010\n... (18 rows)"),
        ("call", "make_chart", {"kind": "line", "x": "q", "y": "revenue", "title": "Revenue by category, 2026"}, "chart saved: charts/revenue_by_category_2026.png"),
        ("say", "Garden grew fastest: +37.9% Q1→Q2 and +35.4% Q2→Q3. Kitchen is the largest category but grew only 2-4% per quarter. Chart: charts/revenue_by_category_2026.png."),
        ("user", "Break Q3 down by region."),
        ("call", "describe_table", {"table": "regions"}, "id int, name text"),
        ("call", "run_sql", {"sql": q3}, q3_rows),
        ("call", "make_chart", {"kind": "bar", "x": "region", "y": "revenue", "title": "Q3 2026 revenue by region and category"}, "chart saved: charts/q3_region_category.png"),
        ("say", "In Q3, EMEA Garden leads (812k), then NA Kitchen (790k). Chart: charts/q3_region_category.png."),
        ("user", "What's driving Garden in EMEA?"),
        ("call", "run_sql", {"sql": "SELECT p.name, SUM(oi.qty) AS units FROM order_items oi JOIN orders o ON o.id = oi.order_id JOIN products p ON p.id = oi.product_id JOIN regions r ON r.id = o.region_id WHERE r.name = 'EMEA' AND p.category = 'Garden' AND o.created_at >= '2026-07-01' AND o.created_at < '2026-10-01' GROUP BY 1 ORDER BY 2 DESC LIMIT 5"},
         "name | units\nSolar path light (4-pack) | 18,204\nRaised bed kit 120cm | 6,930\nDrip irrigation set | 5,112\nCompost bin 300L | 2,480\nPruning shears | 2,301"),
        ("call", "run_sql", {"sql": "SELECT p.launched_at FROM products p WHERE p.name = 'Solar path light (4-pack)'"}, "launched_at\n2026-06-02"),
        ("say", "Mostly the Solar path light 4-pack, launched 2 June 2026: 18k units in EMEA in Q3."),
        ("user", "Great. Export the Q3 by-region table as CSV."),
        ("call", "run_sql", {"sql": q3}, q3_rows),
        ("call", "export_csv", {"filename": "q3_2026_region_category.csv"}, "exported 16 rows to exports/q3_2026_region_category.csv"),
        ("say", "Exported to exports/q3_2026_region_category.csv (16 rows)."),
        ("user", "Compare Garden month by month in EMEA vs NA for Q3."),
        ("call", "run_sql", {"sql": "SELECT r.name AS region, date_trunc('month', o.created_at) AS m, SUM(oi.qty * oi.unit_price) AS revenue FROM order_items oi JOIN orders o ON o.id = oi.order_id JOIN products p ON p.id = oi.product_id JOIN regions r ON r.id = o.region_id WHERE p.category = 'Garden' AND r.name IN ('EMEA', 'NA') AND o.created_at >= '2026-07-01' AND o.created_at < '2026-10-01' GROUP BY 1, 2 ORDER BY 2, 1"},
         "region | m | revenue\nEMEA | 2026-07 | 301,200\nNA | 2026-07 | 88,410\nEMEA | 2026-08 | 279,950\nNA | 2026-08 | 91,005\nEMEA | 2026-09 | 231,290\nNA | 2026-09 | 97,730"),
        ("call", "make_chart", {"kind": "line", "x": "m", "y": "revenue", "title": "Garden revenue, EMEA vs NA, Q3 2026"}, "chart saved: charts/garden_emea_na_q3.png"),
        ("say", "EMEA peaked in July and declined through September (301k to 231k); NA grew slowly (88k to 98k). Chart: charts/garden_emea_na_q3.png."),
        ("user", "Is the solar light running low on stock anywhere?"),
        ("call", "run_sql", {"sql": "SELECT warehouse, on_hand FROM stock WHERE product_name = 'Solar path light (4-pack)'"}, "ERROR: relation \"stock\" does not exist", True),
        ("call", "list_tables", {"schema": "inventory"}, "stock_levels\nwarehouses"),
        ("call", "describe_table", {"table": "inventory.stock_levels"}, "product_id int, warehouse_id int, on_hand int, updated_at timestamptz"),
        ("call", "run_sql", {"sql": "SELECT w.code, s.on_hand FROM inventory.stock_levels s JOIN inventory.warehouses w ON w.id = s.warehouse_id JOIN products p ON p.id = s.product_id WHERE p.name = 'Solar path light (4-pack)' ORDER BY 2"},
         "code | on_hand\nRTM | 212\nMAD | 1,480\nNJ1 | 3,905"),
        ("say", "Rotterdam (RTM) is down to 212 units, roughly four days of EMEA demand at Q3 rates; Madrid and New Jersey are fine."),
    ]
    return tools, steps, "You are a data analyst. Explore the schema before querying. Report numbers precisely.", \
        "A data-analysis session that explores a schema, recovers from a SQL error, charts results and reruns one query verbatim to export it.", True


def _ps_devops_incident(rng: Rng):
    pods = [f"search-api-6c8f9d7b5-{rng.tok(5, string.ascii_lowercase + string.digits)}" for _ in range(4)]
    new_pod = f"search-api-5b7d8c9f6-{rng.tok(5, string.ascii_lowercase + string.digits)}"
    tools = ["get_metrics", "get_pods", "describe_pod", "get_logs", "set_env", "rollout_restart"]
    p95 = "histogram_quantile(0.95, sum(rate(http_request_duration_seconds_bucket{app=\"search-api\"}[5m])) by (le))"
    mem = "sum(container_memory_working_set_bytes{pod=~\"search-api-.*\"}) by (pod)"
    steps = [
        ("user", "p95 latency on search-api doubled in the last hour. Please investigate."),
        ("call", "get_metrics", {"query": p95, "range": "3h"}, "12:00 0.21s | 12:30 0.22s | 13:00 0.23s | 13:15 0.38s | 13:30 0.47s | 13:45 0.49s"),
        ("call", "get_pods", {"namespace": "prod", "selector": "app=search-api"}, "\n".join(f"{p}   1/1   Running   {n}   2d" for p, n in zip(pods, [0, 0, 3, 0]))),
        ("call", "describe_pod", {"namespace": "prod", "pod": pods[2]}, "Last State: Terminated\n  Reason: OOMKilled\n  Exit Code: 137\nLimits: memory 1Gi\nEnvironment: SEARCH_CACHE_MAX_MB=2048"),
        ("call", "get_logs", {"namespace": "prod", "pod": pods[2], "tail": 20}, "WARN gc pause 840ms\nWARN gc pause 1120ms\nINFO cache size 1890MB\nWARN gc pause 1310ms"),
        ("call", "get_logs", {"namespace": "prod", "pod": pods[0], "tail": 20}, "INFO cache size 1702MB\nWARN gc pause 610ms\nINFO request served in 412ms"),
        ("call", "get_metrics", {"query": mem, "range": "3h"}, "all pods: ~600MiB until 13:02, then rising to 950-1010MiB"),
        ("call", "get_metrics", {"query": "kube_deployment_status_observed_generation{deployment=\"search-api\"}", "range": "3h"}, "generation 41 -> 42 at 13:02"),
        ("say", "Deploy generation 42 at 13:02 raised SEARCH_CACHE_MAX_MB to 2048 while the memory limit is 1Gi; pods now spend their time in GC and one was OOMKilled 3 times. Should I set it back to 512 and restart?"),
        ("user", "Yes, set SEARCH_CACHE_MAX_MB back to 512 and restart."),
        ("call", "set_env", {"namespace": "prod", "deployment": "search-api", "name": "SEARCH_CACHE_MAX_MB", "value": "512"}, "deployment.apps/search-api env updated"),
        ("call", "rollout_restart", {"namespace": "prod", "deployment": "search-api"}, "deployment.apps/search-api restarted"),
        ("call", "get_pods", {"namespace": "prod", "selector": "app=search-api"}, f"{new_pod}   1/1   Running   0   40s\n{pods[1]}   1/1   Terminating   0   2d"),
        ("call", "get_metrics", {"query": p95, "range": "15m"}, "14:02 0.45s | 14:06 0.31s | 14:10 0.23s | 14:14 0.21s"),
        ("say", "Rolled out; p95 is back to 0.21s."),
        ("user", "Check memory again to be sure."),
        ("call", "get_metrics", {"query": mem, "range": "15m"}, "all pods: 540-610MiB, flat"),
        ("call", "get_logs", {"namespace": "prod", "pod": new_pod, "tail": 20}, "INFO cache size 498MB\nINFO request served in 188ms"),
        ("say", "Memory is flat around 600MiB and no GC warnings. I'd add an alert on cache size vs. limit."),
    ]
    return tools, steps, "You are an SRE assistant with read/write access to the prod cluster. Ask before changing anything.", \
        "An SRE agent investigates a latency regression through metrics, pods and logs, fixes a bad env var after approval and verifies the recovery.", True


def _ps_research_brief(rng: Rng):
    tools = ["web_search", "fetch_page", "write_file", "read_file"]
    steps = [
        ("user", "Write a one-page brief comparing Postgres logical replication and Debezium CDC for our migration; save it to docs/cdc-brief.md."),
        ("call", "web_search", {"query": "postgres logical replication restrictions"}, "1. Logical Replication: Restrictions - PostgreSQL docs\n2. Gotchas with logical replication slots (blog)\n3. DDL and logical replication (mailing list)"),
        ("call", "fetch_page", {"url": "https://www.postgresql.org/docs/16/logical-replication-restrictions.html"}, "The database schema and DDL commands are not replicated. Sequence data is not replicated. TRUNCATE is replicated. Large objects are not replicated."),
        ("call", "web_search", {"query": "debezium postgres connector initial snapshot"}, "1. Debezium connector for PostgreSQL - snapshots\n2. Incremental snapshots in Debezium\n3. Debezium vs native replication (talk)"),
        ("call", "fetch_page", {"url": "https://debezium.io/documentation/reference/stable/connectors/postgresql.html"}, "The connector reads from a logical replication slot using pgoutput; it performs an initial consistent snapshot and then streams changes to Kafka topics, one per table."),
        ("call", "fetch_page", {"url": "https://debezium.io/documentation/reference/stable/connectors/postgresql.html#postgresql-incremental-snapshots"}, "Incremental snapshots run in chunks and can run in parallel with streaming, so they can be restarted without a full resnapshot."),
        ("call", "web_search", {"query": "replication slot wal retention disk full"}, "1. Monitoring replication slots to avoid disk exhaustion\n2. max_slot_wal_keep_size explained"),
        ("call", "fetch_page", {"url": "https://www.postgresql.org/docs/16/runtime-config-replication.html"}, "max_slot_wal_keep_size: maximum size of WAL files that replication slots are allowed to retain."),
        ("call", "write_file", {"path": "docs/cdc-brief.md", "content": "# CDC options for the migration\n\n## Native logical replication\n- No DDL, no sequences...\n\n## Debezium\n- Snapshot + streaming to Kafka...\n\n## Risks\n- Slot WAL retention: set max_slot_wal_keep_size\n"}, "wrote 3412 bytes"),
        ("say", "Saved docs/cdc-brief.md covering both options, their limits and slot WAL-retention risk."),
        ("user", "Add a section on operational cost; we run on RDS."),
        ("call", "web_search", {"query": "rds postgres rds.logical_replication parameter reboot"}, "1. Setting up logical replication on RDS for PostgreSQL\n2. MSK pricing overview"),
        ("call", "fetch_page", {"url": "https://docs.aws.amazon.com/AmazonRDS/latest/UserGuide/PostgreSQL.Concepts.General.FeatureSupport.LogicalReplication.html"}, "Set rds.logical_replication to 1 in a custom parameter group; the change requires a reboot."),
        ("call", "read_file", {"path": "docs/cdc-brief.md"}, "# CDC options for the migration\n\n## Native logical replication\n...\n## Risks\n- Slot WAL retention: set max_slot_wal_keep_size\n"),
        ("call", "write_file", {"path": "docs/cdc-brief.md", "content": "# CDC options for the migration\n\n...\n## Operational cost on RDS\n- Enabling logical replication needs a parameter-group change and a reboot\n- Debezium adds Kafka (MSK) and Connect workers\n"}, "wrote 4107 bytes"),
        ("say", "Added an operational-cost section (parameter group + reboot; Kafka/Connect for Debezium)."),
        ("user", "Good. Add a one-paragraph recommendation at the end."),
        ("call", "read_file", {"path": "docs/cdc-brief.md"}, "# CDC options for the migration\n...\n## Operational cost on RDS\n- Enabling logical replication needs a parameter-group change and a reboot\n- Debezium adds Kafka (MSK) and Connect workers\n"),
        ("call", "write_file", {"path": "docs/cdc-brief.md", "content": "# CDC options for the migration\n\n...\n## Recommendation\nUse native logical replication for the one-off cut-over; adopt Debezium only if we need a durable change stream afterwards.\n"}, "wrote 4488 bytes"),
        ("say", "Added the recommendation: native replication for the cut-over, Debezium only if a durable change stream is needed later."),
    ]
    return tools, steps, "You are a technical writer with web access. Cite what you read.", \
        "A research agent searches, reads several pages, writes a brief, and revises it twice on request, rereading the file before each rewrite.", True


def _ps_support_multi_order(rng: Rng):
    cust = str(rng.randint(2000000000, 2999999999))
    orders = [rng.uuid() for _ in range(4)]
    tracks = [str(rng.randint(1000000000, 9999999999)) for _ in range(2)]
    tools = ["get_customer", "list_orders", "get_order", "check_shipment", "check_refund_eligibility", "create_refund", "send_email", "add_note"]
    steps = [
        ("user", "Hello, this is Marco Bellini, marco.bellini@example.com. I have a few questions about my recent orders."),
        ("call", "get_customer", {"email": "marco.bellini@example.com"}, pj({"id": cust, "name": "Marco Bellini", "tier": "standard"})),
        ("say", "Hi Marco, I found your account. What would you like to know?"),
        ("user", "Where's my espresso machine? It was supposed to arrive Friday."),
        ("call", "list_orders", {"customer_id": cust, "since": "2026-10-15"}, pj({"items": [{"id": o, "title": t} for o, t in zip(orders, ["Espresso machine", "Milk jug", "Coffee beans 1kg", "Descaler"])], "has_more": False})),
        ("call", "get_order", {"order_id": orders[0]}, pj({"id": orders[0], "status": "shipped", "tracking_number": tracks[0]})),
        ("call", "check_shipment", {"tracking_number": tracks[0]}, pj({"status": "held_at_depot", "reason": "address incomplete: missing apartment number", "depot": "Milano Nord"})),
        ("say", "The carrier is holding it at the Milano Nord depot because the apartment number is missing. What's your apartment number?"),
        ("user", "It's interno 7."),
        ("call", "add_note", {"ticket_id": "T-" + str(rng.randint(100000, 999999)), "note": f"Carrier hold on {tracks[0]}: add 'interno 7' to the address and release."}, "ok"),
        ("call", "send_email", {"to": "marco.bellini@example.com", "subject": "Your espresso machine delivery", "body": "We've asked the carrier to add 'interno 7' and release your parcel."}, "queued"),
        ("say", "I've asked the carrier to add interno 7 and release it; you'll get an email with the new date."),
        ("user", "Thanks. Also the milk jug arrived dented."),
        ("call", "get_order", {"order_id": orders[1]}, pj({"id": orders[1], "status": "delivered", "total": 24.9, "delivered": "2026-11-18"})),
        ("call", "check_refund_eligibility", {"order_id": orders[1]}, pj({"eligible": True, "max_amount": 24.9, "requires_return": False})),
        ("say", "Sorry about that. I can refund the 24.90 EUR without needing the jug back. OK?"),
        ("user", "Yes, please."),
        ("call", "create_refund", {"order_id": orders[1], "amount": 24.9, "reason": "damaged_on_arrival"}, pj({"refund_id": "re_" + rng.tok(14), "status": "pending"})),
        ("say", "Refunded 24.90 EUR."),
        ("user", "And did the beans and descaler ship together?"),
        ("call", "get_order", {"order_id": orders[2]}, pj({"id": orders[2], "status": "shipped", "tracking_number": tracks[1]})),
        ("call", "get_order", {"order_id": orders[3]}, pj({"id": orders[3], "status": "shipped", "tracking_number": tracks[1]})),
        ("call", "check_shipment", {"tracking_number": tracks[1]}, pj({"status": "out_for_delivery", "eta": "2026-11-25"})),
        ("say", "Yes, same parcel; it's out for delivery, expected 25 November."),
        ("user", "Could you send me a summary of all this by email?"),
        ("call", "send_email", {"to": "marco.bellini@example.com", "subject": "Summary of your orders", "body": "Espresso machine: released by carrier after address fix. Milk jug: refunded 24.90 EUR. Beans + descaler: arriving 25 November."}, "queued"),
        ("say", "Sent. Anything else?"),
        ("user", "No, that's everything, grazie!"),
    ]
    return tools, steps, "You are Acme's customer support agent. Verify before acting; be brief and friendly.", \
        "A long support conversation about four orders: a held shipment, a damaged item refund and tracking, with the same tools used on different resources.", False


PRODUCTIVE_SCRIPTS = [_ps_csv_export, _ps_support_double_charge, _ps_data_analysis, _ps_devops_incident,
                      _ps_research_brief, _ps_rust_duration, _ps_support_multi_order]


def build_productive_session(sc: Scenario) -> None:
    tools, steps, system, desc, near_miss = PRODUCTIVE_SCRIPTS[sc.index - 1](sc.rng)
    r = Run(sc, sc.conversation(system, tools))
    for step in steps:
        r.step(step)
    if near_miss:
        sc.tags.append("near_miss")
    sc.description = desc


# ---- same_prompt_many_users ------------------------------------------------------
# Twenty distinct callers (keys) send the same prompt (same app, same model,
# same settings), some a second turn. Bodies repeat byte-for-byte across callers.

SAME_PROMPT = [
    dict(system="You explain programming errors to beginners in three sentences.",
         prompt="Explain this error: TypeError: Cannot read properties of undefined (reading 'map')",
         answer="The code calls .map() on a value that is undefined, usually because data hasn't loaded yet or a property name is wrong. Check where the array comes from. Default it with `(items ?? []).map(...)` while it loads.",
         followup="Can you show the fix in a React component?"),
    dict(system="You are a writing assistant inside an HR tool.",
         prompt="Write a short welcome message for a new employee joining the sales team.",
         answer="Welcome to the sales team! We're thrilled to have you on board and can't wait to see the energy and ideas you'll bring. Your buddy will reach out today to help you settle in.",
         followup="Make it a bit more casual."),
    dict(system="You are a travel assistant. Use tools for live data.", tools=["get_weather"],
         prompt="What's the weather in Berlin tomorrow?",
         call=("get_weather", {"city": "Berlin", "date": "2026-11-24"}, pj({"city": "Berlin", "date": "2026-11-24", "summary": "Overcast, light drizzle in the afternoon", "temp_c": {"min": 3, "max": 7}}))),
    dict(system="You are a localisation assistant.",
         prompt="Translate 'Your order has shipped' into German, French and Spanish.",
         answer="German: Ihre Bestellung wurde versandt.\nFrench: Votre commande a été expédiée.\nSpanish: Tu pedido ha sido enviado.",
         followup="And Italian?"),
    dict(system="You are a creative assistant.",
         prompt="Give me three name ideas for a small coffee shop near a university.",
         answer="1. Study Grounds\n2. The Daily Grind Hall\n3. Footnote Coffee",
         followup="More playful ones, please."),
    dict(system="You are the in-app assistant of Acme Notes.",
         prompt="What can you help me with?",
         answer="I can summarise your notes, turn them into to-do lists, find notes by topic, and draft emails from them. Try: 'Summarise my notes from this week'.",
         followup="Summarise my notes from this week."),
]


def build_same_prompt_many_users(sc: Scenario) -> None:
    spec = SAME_PROMPT[sc.index - 1]
    rng = sc.rng
    tools = spec.get("tools", [])
    model = rng.choice(MODELS[sc.fmt])
    extras = default_extras(rng, sc.fmt, bool(tools))
    max_tokens = 1024
    users = []
    for u in range(1, 21):
        users.append(dict(key=sc.new_key(f"u{u:02d}-"), ua=rng.choice(USER_AGENTS[sc.fmt]),
                          conv=Conversation(sc.fmt, rng, model=model, system=spec["system"], tools=tools,
                                            extras=extras, max_tokens=max_tokens),
                          turns=2 if (tools or rng.maybe(0.5)) else 1))
    # Arrival schedule: turn 1 at a random second within ten minutes, turn 2 20-120 s later.
    schedule = []
    for u, user in enumerate(users):
        t1 = rng.randint(0, 600)
        schedule.append((t1, u, 1))
        if user["turns"] == 2:
            schedule.append((t1 + rng.randint(20, 120), u, 2))
    schedule.sort()
    for _, u, turn in schedule:
        user = users[u]
        conv = user["conv"]
        if turn == 1:
            conv.user(spec["prompt"])
        elif "call" in spec:
            conv.call(*spec["call"])
        else:
            conv.say(spec["answer"])
            conv.user(spec["followup"])
        sc.send(conv, key=user["key"], user_agent=user["ua"])
    sc.key = None
    sc.tags.append("near_miss")
    prompt = spec["prompt"] if len(spec["prompt"]) <= 60 else spec["prompt"][:57].rstrip() + "..."
    sc.description = (f"Twenty distinct callers of the same app send the same prompt (\"{prompt}\"), some with a "
                      "follow-up turn; bodies repeat across callers but never within one caller.")


# ---- templated_batch ---------------------------------------------------------------
# One batch caller; single-turn requests from one template with different documents.

PRODUCTS = ["smart thermostat", "wireless earbuds", "robot vacuum", "standing desk", "e-reader", "electric kettle",
            "security camera", "mesh router", "air purifier", "label printer", "monitor arm", "coffee grinder"]
SYMPTOMS = ["stopped connecting to Wi-Fi", "won't turn on", "makes a grinding noise", "shows error E4",
            "loses its settings overnight", "charges only to 60%", "disconnects every few minutes", "arrived with a cracked casing"]
EVENTS = ["the last firmware update", "a power cut", "moving house", "two weeks of normal use", "the first use", "I changed my router"]
TRIED = ["restarting it", "a factory reset", "a different outlet", "reinstalling the app", "nothing yet", "the steps in the manual"]
NAMES = ["Aisha", "Bruno", "Chen", "Dolores", "Emeka", "Freya", "Gustavo", "Hana", "Ivan", "Jonas", "Keiko", "Lucia", "Mateo", "Nadia", "Omar", "Priya"]


def _docs_varied(rng: Rng, n: int) -> list[str]:
    docs = []
    for i in range(n):
        docs.append(f"Hi, my {rng.choice(PRODUCTS)} {rng.choice(SYMPTOMS)} after {rng.choice(EVENTS)}. "
                    f"I've tried {rng.choice(TRIED)}. Order #{rng.randint(100000, 999999)}. "
                    f"{rng.choice(['Please help.', 'I need this fixed before Friday.', 'Can I get a replacement?', 'Very disappointed.', 'Thanks in advance.'])} - {NAMES[i % len(NAMES)]}")
    return docs


def _docs_short_similar(rng: Rng, n: int) -> list[str]:
    pool = ["Printer offline.", "Printer offline again.", "printer is offline", "Printer offline since Monday.",
            "Printer offline on floor 3.", "Printer won't print.", "Printer offline!!", "The printer is offline.",
            "Printer jammed.", "Printer offline after update.", "Printer says offline.", "Printer offline, urgent.",
            "Printer out of toner.", "Printer offline (2nd floor).", "printer offline again", "Printer not responding."]
    return pool[:n]


def _docs_ids_amounts(rng: Rng, n: int) -> list[str]:
    return [f"Refund request for order ORD-{rng.randint(10000000, 99999999)}: customer reports the parcel never arrived. "
            f"Amount: {rng.randint(10, 400)}.{rng.randint(0, 99):02d} EUR. Carrier tracking {rng.randint(1000000000, 9999999999)}. "
            f"Customer id {rng.uuid()}." for _ in range(n)]


def _docs_sha256(rng: Rng, n: int) -> list[str]:
    docs = []
    for i in range(n):
        expected = hashlib.sha256(f"report-{i}-expected".encode()).hexdigest()
        got = hashlib.sha256(f"report-{i}-got-{rng.random()}".encode()).hexdigest()
        docs.append(f"Attachment integrity check failed for upload quarterly-report.pdf. Expected sha256 {expected}, "
                    f"got {got}. The customer asks whether the file was corrupted in transit.")
    return docs


def _docs_invoices(rng: Rng, n: int) -> list[str]:
    docs = []
    for _ in range(n):
        qty = rng.randint(10, 99)
        unit = rng.randint(1000, 9999)
        total = qty * unit
        docs.append(f"INVOICE INV-2026-{rng.randint(10000, 99999)}\nDate: 2026-11-{rng.randint(10, 28)}\n"
                    f"Customer: C-{rng.randint(100000, 999999)}\nItem: Widget type {rng.choice('ABCDEFGH')} x {qty} @ {unit // 100}.{unit % 100:02d} EUR\n"
                    f"Total: {total // 100:07d}.{total % 100:02d} EUR\nDue: 2026-12-{rng.randint(10, 28)}")
    return docs


TEMPLATED = [
    dict(template="Summarise the following support ticket:\n{doc}", docs=_docs_varied, near_miss=False,
         desc="A batch job summarises varied support tickets with one template, one request per ticket."),
    dict(template="Summarise the following support ticket:\n{doc}", docs=_docs_short_similar, near_miss=True,
         desc="A batch job summarises very short, near-identical printer tickets with one template."),
    dict(template="Summarise the following support ticket:\n{doc}", docs=_docs_ids_amounts, near_miss=True,
         desc="A batch job summarises refund tickets that differ only in order ids, amounts, tracking numbers and customer UUIDs."),
    dict(template="Summarise the following support ticket:\n{doc}", docs=_docs_sha256, near_miss=True,
         desc="A batch job summarises integrity-check tickets that differ only in their sha256 hashes."),
    dict(template="Extract the invoice number, total and due date from this invoice as JSON:\n{doc}", docs=_docs_invoices, near_miss=True,
         desc="A batch job extracts fields from fixed-width invoices of identical length that differ only in numbers."),
    dict(template="Classify the sentiment (positive/neutral/negative) of this product review:\n{doc}", docs=None, near_miss=False,
         desc="A batch job classifies the sentiment of distinct short product reviews with one template."),
    dict(template="Summarise the following support ticket:\n{doc}", docs=_docs_varied, near_miss=False,
         desc="A nightly batch summarises a second set of varied support tickets, one request each."),
    dict(template="Extract the invoice number, total and due date from this invoice as JSON:\n{doc}", docs=_docs_invoices, near_miss=True,
         desc="A batch job extracts fields from another run of same-length invoices differing only in digits."),
]

REVIEWS = ["Arrived quickly and works great.", "Stopped working after a week.", "It's fine, does what it says.",
           "Battery life is amazing!", "Too loud for a bedroom.", "Average quality for the price.",
           "Customer service replaced it in two days, very happy.", "The app keeps crashing.", "Looks nice, a bit small.",
           "Would buy again.", "Not worth the money.", "Exactly as described.", "Instructions were confusing but it works.",
           "Terrible smell out of the box.", "Five stars, my kids love it."]


def build_templated_batch(sc: Scenario) -> None:
    spec = TEMPLATED[sc.index - 1]
    rng = sc.rng
    n = rng.randint(12, 16)
    docs = spec["docs"](rng, n) if spec["docs"] else REVIEWS[:n]
    model = rng.choice(MODELS[sc.fmt])
    extras = {"temperature": 0}
    system = "You process batch jobs. Be concise."
    for doc in docs:
        conv = Conversation(sc.fmt, rng, model=model, system=system, extras=extras, max_tokens=512)
        conv.user(spec["template"].format(doc=doc))
        sc.send(conv)
    if spec["near_miss"]:
        sc.tags.append("near_miss")
    sc.description = spec["desc"]


# ---- advancing_pagination ------------------------------------------------------------
# The same tool with a cursor or page that advances; every page differs.

def _b64_json(obj) -> str:
    return base64.b64encode(cj(obj).encode()).decode()


def build_advancing_pagination(sc: Scenario) -> None:
    rng = sc.rng
    i = sc.index
    n = rng.randint(5, 8)
    seen: list = []  # what the pages returned, for the final answer
    if i == 1:
        system, tools, prompt = "You are a finance assistant.", ["list_invoices"], "Total up all open invoices."
        cursors = [None] + [f"cur_{rng.tok(12)}" for _ in range(n - 1)]

        def page(k):
            items = [{"id": f"in_{rng.tok(6)}", "amount_due": round(rng.uniform(20, 900), 2)} for _ in range(3)]
            seen.extend(x["amount_due"] for x in items)
            nxt = cursors[k + 1] if k + 1 < n else None
            return ("list_invoices", {"status": "open"} | ({"cursor": cursors[k]} if cursors[k] else {}),
                    pj({"data": items, "next_cursor": nxt, "has_more": nxt is not None}))

        def final():
            return f"The {len(seen)} open invoices total {sum(seen):,.2f} EUR."
        desc = "An agent pages through open invoices with opaque cur_ cursors that advance on every page."
    elif i == 2:
        system, tools, prompt = "You are a support-queue assistant.", ["list_tickets"], "List every ticket in the returns queue and group them by reason."

        def page(k):
            tickets = [{"id": 40000 + k * 10 + j, "reason": rng.choice(["damaged", "wrong size", "late", "changed mind"])} for j in range(3)]
            seen.extend(t["reason"] for t in tickets)
            return ("list_tickets", {"queue": "returns", "page": k + 1},
                    pj({"page": k + 1, "total_pages": n, "tickets": tickets}))

        def final():
            reasons = ["damaged", "wrong size", "late", "changed mind"]
            return "Returns by reason: " + ", ".join(f"{x} {seen.count(x)}" for x in reasons) + f" ({len(seen)} tickets)."
        desc = "An agent requests pages 1..N of a ticket queue with increasing page numbers; every page lists different tickets."
    elif i == 3:
        system, tools, prompt = "You are a storage assistant.", ["list_objects"], "How much space do the 2026 backups take in bucket acme-backups?"
        tokens = [None] + [base64.b64encode(bytes(rng.randrange(256) for _ in range(36))).decode() for _ in range(n - 1)]

        def page(k):
            objs = [{"key": f"2026/{rng.randint(1, 11):02d}/db-{rng.hex(8)}.tar.zst", "size": rng.randint(10**8, 9 * 10**9)} for _ in range(3)]
            seen.extend(o["size"] for o in objs)
            args = {"bucket": "acme-backups", "prefix": "2026/"} | ({"page_token": tokens[k]} if tokens[k] else {})
            nxt = tokens[k + 1] if k + 1 < n else None
            return ("list_objects", args, pj({"objects": objs, "next_page_token": nxt, "is_truncated": nxt is not None}))

        def final():
            return f"{len(seen)} backup archives under 2026/, {sum(seen) / 1e9:.1f} GB in total."
        desc = "An agent lists a bucket with base64 continuation tokens that change on every page."
    elif i == 4:
        system, tools, prompt = "You are a team assistant with read access to chat channels.", ["get_channel_history"], "Summarise #incidents for November."
        users = [f"U0{rng.tok(8, string.ascii_uppercase + string.digits)}" for _ in range(n)]
        cursors = [None] + [base64.b64encode(f"user:{u}".encode()).decode() for u in users[1:]]

        def page(k):
            msgs = [{"user": rng.choice(users), "text": rng.choice(["paging db on-call", "rollback done", "root cause: expired cert", "postmortem draft shared", "alerts are quiet now"]),
                     "ts": f"{1793577600 + k * 86400 + j * 1200}.000{j}00"} for j in range(2)]
            seen.extend(m["text"] for m in msgs)
            args = {"channel": "C07INC1D3", "limit": 2} | ({"cursor": cursors[k]} if cursors[k] else {})
            nxt = cursors[k + 1] if k + 1 < n else ""
            return ("get_channel_history", args, pj({"messages": msgs, "has_more": bool(nxt), "next_cursor": nxt}))

        def final():
            return f"{len(seen)} messages in #incidents; recurring topics: " + ", ".join(sorted(set(seen))) + "."
        desc = "An agent reads a channel history with base64 cursors that advance page by page."
    elif i == 5:
        system, tools, prompt = "You are a triage assistant.", ["list_issues"], "Go through all open issues in acme/web and list the ones labelled bug."

        def page(k):
            issues = [{"number": 2100 - k * 3 - j, "title": rng.choice(["Login button misaligned", "Dark mode flicker", "Export hangs", "Typo on pricing page", "Search ignores accents"]), "labels": rng.choice([["bug"], ["enhancement"], ["bug", "ui"], []])} for j in range(3)]
            seen.extend(x["number"] for x in issues if "bug" in x["labels"])
            return ("list_issues", {"repo": "acme/web", "state": "open", "page": k + 1}, pj(issues))

        def final():
            return f"{len(seen)} open issues are labelled bug: " + ", ".join(f"#{x}" for x in seen) + "."
        desc = "An agent walks GitHub-style issue pages 1..N; each page returns different issues."
    elif i == 6:
        system, tools, prompt = "You are a security assistant.", ["get_audit_log"], "Show me everything svc-deploy did yesterday."
        times = []
        t = sc.clock.t
        for _ in range(n):
            t += dt.timedelta(minutes=rng.randint(20, 90))
            times.append(t)

        def page(k):
            events = [{"at": rfc3339z(times[k] + dt.timedelta(seconds=j * 7)), "action": rng.choice(["secret.read", "deploy.create", "role.assume", "bucket.write"])} for j in range(2)]
            seen.extend(e["action"] for e in events)
            args = {"actor": "svc-deploy"} | ({"after": rfc3339z(times[k - 1] + dt.timedelta(seconds=7))} if k else {})
            return ("get_audit_log", args, pj({"events": events, "more": k + 1 < n}))

        def final():
            return f"svc-deploy produced {len(seen)} audit events: " + ", ".join(f"{a} x{seen.count(a)}" for a in sorted(set(seen))) + "."
        desc = "An agent pages an audit log with an 'after' timestamp cursor that moves forward each page."
    else:
        system, tools, prompt = "You are a support analyst.", ["search_tickets"], "Find all tickets mentioning 'refund' this month and count them by product."

        def page(k):
            hits = [{"id": 50000 + k * 10 + j, "product": rng.choice(PRODUCTS)} for j in range(3)]
            seen.extend(h["product"] for h in hits)
            return ("search_tickets", {"query": "refund", "page": k + 1}, pj({"page": k + 1, "pages": n, "hits": hits}))

        def final():
            return "Refund tickets by product: " + ", ".join(f"{p} {seen.count(p)}" for p in sorted(set(seen))) + "."
        desc = "An agent repeats the same ticket search with an increasing page number; every page returns different hits."
    r = Run(sc, sc.conversation(system, tools))
    r.user(prompt)
    for k in range(n):
        name, args, out = page(k)
        r.call(name, args, out)
    r.say(final())
    r.user("Thanks. Put that in a short table, please.")
    sc.tags.append("near_miss")
    sc.description = desc


# ---- polling_exempt -------------------------------------------------------------------
# Polling a job with identical arguments until it finishes; the polling tool
# is in the manifest's exempt_tools, as an operator would configure it.

def _progress(rng: Rng, n: int) -> list[int]:
    """n non-decreasing percentages below 100, with occasional repeats."""
    vals, p = [], rng.randint(5, 20)
    for _ in range(n):
        vals.append(p)
        if rng.maybe(0.7):
            p = min(95, p + rng.randint(10, 30))
    return vals


POLLING = [
    dict(system="You are a data-platform assistant.", tools=["start_export", "check_export_status", "download_file"],
         prompt="Export the customers table as parquet and give me the link.",
         start=("start_export", {"dataset": "customers", "format": "parquet"}, lambda r: (f"exp_{r.tok(10)}", "export_id")),
         poll="check_export_status", id_arg="export_id",
         desc="An agent starts an export, polls its status with identical arguments until done, then downloads it."),
    dict(system="You are a batch-processing assistant.", tools=["start_job", "poll_job_status"],
         prompt="Re-index the product search catalogue and tell me when it's done.",
         start=("start_job", {"job": "reindex-products"}, lambda r: (f"job_{r.tok(12)}", "job_id")),
         poll="poll_job_status", id_arg="job_id",
         desc="An agent starts a reindex job and polls poll_job_status with the same job id until it reports done."),
    dict(system="You are a deployment assistant.", tools=["deploy_service", "wait_for_deployment"],
         prompt="Deploy notifications v1.9.0 to production and confirm when it's live.",
         start=("deploy_service", {"service": "notifications", "version": "v1.9.0", "env": "production"}, lambda r: (f"dep-{r.hex(8)}", "deployment_id")),
         poll="wait_for_deployment", id_arg="deployment_id",
         desc="An agent deploys a service and polls wait_for_deployment with identical arguments through the rollout."),
    dict(system="You are a media-processing assistant.", tools=["start_job", "poll_job_status"],
         prompt="Transcode the keynote recording to 1080p and 720p.",
         start=("start_job", {"job": "transcode", "params": {"source": "s3://media/keynote-2026.mov", "renditions": ["1080p", "720p"]}}, lambda r: (f"job_{r.tok(12)}", "job_id")),
         poll="poll_job_status", id_arg="job_id",
         desc="An agent polls a long transcode job whose progress sometimes stays the same between polls."),
    dict(system="You are a deployment assistant.", tools=["deploy_service", "wait_for_deployment"],
         prompt="Roll out pricing-api v4.2.1 to staging.",
         start=("deploy_service", {"service": "pricing-api", "version": "v4.2.1", "env": "staging"}, lambda r: (f"dep-{r.hex(8)}", "deployment_id")),
         poll="wait_for_deployment", id_arg="deployment_id",
         desc="An agent waits on a staging rollout by polling with the same deployment id until all replicas are updated."),
    dict(system="You are a data-platform assistant.", tools=["start_export", "check_export_status", "download_file"],
         prompt="Export the orders table for 2026 as CSV.",
         start=("start_export", {"dataset": "orders_2026", "format": "csv"}, lambda r: (f"exp_{r.tok(10)}", "export_id")),
         poll="check_export_status", id_arg="export_id",
         desc="An agent polls a CSV export with identical arguments, including several identical 'queued' answers, until it completes."),
]


def build_polling_exempt(sc: Scenario) -> None:
    spec = POLLING[sc.index - 1]
    rng = sc.rng
    r = Run(sc, sc.conversation(spec["system"], spec["tools"]))
    r.user(spec["prompt"])
    job_id, _ = spec["start"][2](rng)
    r.call(spec["start"][0], spec["start"][1], pj({spec["id_arg"]: job_id, "state": "queued"}))
    n = rng.randint(4, 8)
    progress = _progress(rng, n)
    if sc.index == 6:
        progress = [0, 0, 0] + progress[:n - 3]
    texts = [None, "Still running; checking again shortly.", "Checking progress.", None, None]
    for p in progress:
        sc.clock.tick(10, 60)
        state = {"state": "queued"} if p == 0 else {"state": "running", "progress": f"{p}%"}
        r.call(spec["poll"], {spec["id_arg"]: job_id}, pj({spec["id_arg"]: job_id} | state), text=pick_text(rng, texts, 2, 0.5))
    r.call(spec["poll"], {spec["id_arg"]: job_id},
           pj({spec["id_arg"]: job_id, "state": "done", "finished_at": iso_seconds(sc.clock.tick(10, 60))}))
    if "download_file" in spec["tools"]:
        r.call("download_file", {"url": f"https://exports.acme.internal/{job_id}"}, "saved to downloads/" + job_id + ".out (412 MB)")
    r.say(f"Done: {job_id} has finished.")
    r.user("Great, thanks.")
    sc.tags += ["near_miss", "exempt_tool"]
    sc.description = spec["desc"]


# ---- distinct_amounts_dates -----------------------------------------------------------------
# Similar questions that differ only in amounts or dates.

def build_distinct_amounts_dates(sc: Scenario) -> None:
    rng = sc.rng
    i = sc.index
    model = rng.choice(MODELS[sc.fmt])

    def single_turns(system: str, questions: list[str], tools: list[str] = ()) -> None:
        extras = default_extras(rng, sc.fmt, bool(tools))
        for q in questions:
            conv = Conversation(sc.fmt, rng, model=model, system=system, tools=tools, extras=extras, max_tokens=512)
            conv.user(q)
            sc.send(conv)

    if i == 1:
        amounts = [1000, 1037, 1250, 980, 1000.5, 12000, 75, 1037.25, 4410, 999]
        single_turns("You are a currency assistant.", [f"Convert {a} EUR to USD" for a in amounts])
        desc = "Single-turn currency questions from one caller that differ only in the amount."
    elif i == 2:
        single_turns("You are a sales analytics assistant.", [f"What were sales on 2026-11-{d:02d}?" for d in range(3, 13)], ["get_sales"])
        desc = "Single-turn daily-sales questions from one caller that differ only in the date."
    elif i == 3:
        r = Run(sc, sc.conversation("You are a sales analytics assistant.", ["get_sales"]))
        r.user("Give me daily sales for EMEA for the week of 9 November and tell me the best day.")
        for d in range(9, 16):
            r.call("get_sales", {"date": f"2026-11-{d:02d}", "region": "EMEA"}, pj({"date": f"2026-11-{d:02d}", "region": "EMEA", "total_eur": rng.randint(80000, 160000)}))
        r.say("The best day was the one with the highest total above.")
        r.user("Thanks!")
        desc = "An agent calls get_sales once per day for a week: same tool and region, only the date differs."
    elif i == 4:
        r = Run(sc, sc.conversation("You are a currency assistant.", ["convert_currency"]))
        for k, a in enumerate([1000, 1037, 1500, 1037.5, 250, 10000]):
            r.user(f"Convert {a} EUR to USD" if k == 0 else f"And {a} EUR?")
            usd = round(a * 1.0842, 2)
            r.call("convert_currency", {"amount": a, "from": "EUR", "to": "USD"}, pj({"amount": usd, "currency": "USD", "rate": 1.0842}))
            r.say(f"{a} EUR is {usd} USD.")
        desc = "One chat where the user asks for several conversions; the same tool is called with different amounts."
    elif i == 5:
        qs = []
        for _ in range(10):
            qs.append(f"Is invoice INV-2026-{rng.randint(100, 999):05d} for ${rng.randint(100, 9999):,}.{rng.randint(0, 99):02d} overdue as of 2026-11-{rng.randint(1, 28):02d}?")
        single_turns("You are an accounts-receivable assistant.", qs)
        desc = "Single-turn questions about invoices that differ only in invoice numbers, amounts and dates."
    elif i == 6:
        r = Run(sc, sc.conversation("You are a timesheet assistant.", ["log_hours"]))
        r.user("Log my hours on project Apollo for last week: Mon 7.5, Tue 8, Wed 6.5, Thu 8, Fri 4.")
        for d, h in zip(range(16, 21), [7.5, 8, 6.5, 8, 4]):
            r.call("log_hours", {"project": "Apollo", "date": f"2026-11-{d}", "hours": h}, pj({"ok": True, "entry_id": rng.randint(100000, 999999)}))
        r.say("All five days are logged (34 hours).")
        r.user("Thanks.")
        desc = "A timesheet agent logs hours day by day: same tool and project, different dates and hours."
    else:
        cats = ["taxi", "hotel", "lunch", "train", "conference fee", "parking"]
        qs = [f"Add an expense: {rng.randint(8, 480)}.{rng.randint(0, 99):02d} EUR for {rng.choice(cats)} on 2026-11-{rng.randint(1, 28):02d}" for _ in range(10)]
        single_turns("You are an expenses assistant. Confirm each expense in one line.", qs)
        desc = "Single-turn expense entries from one caller that differ in amounts, categories and dates."
    sc.tags.append("near_miss")
    sc.description = desc


# ---- distinct_resources ------------------------------------------------------------------------
# The same tool on different resources named by UUIDs or 10-digit ids.

def _count_by(rows: list[dict], key: str) -> str:
    values = [str(r[key]) for r in rows]
    return ", ".join(f"{v} {values.count(v)}" for v in sorted(set(values)))


def build_distinct_resources(sc: Scenario) -> None:
    rng = sc.rng
    i = sc.index
    surnames = ["Silva", "Novak", "Kim", "Okoro", "Berg"]
    if i == 1:
        ids = [rng.uuid() for _ in range(10)]
        system, tool, arg = "You are an order-operations assistant.", "get_order", "order_id"
        prompt = "Check the status of these orders: " + ", ".join(ids)
        record = lambda x: {"id": x, "status": rng.choice(["shipped", "processing", "delivered"]), "total": round(rng.uniform(10, 300), 2)}
        summary = lambda rows: "Order statuses: " + _count_by(rows, "status") + "."
        desc = "An agent fetches ten orders one by one by UUID."
    elif i == 2:
        ids = [str(4829103746 + k) for k in range(10)]
        system, tool, arg = "You are a CRM assistant.", "get_customer", "customer_id"
        prompt = f"Pull the profiles of customers {ids[0]} through {ids[-1]}."
        record = lambda x: {"id": x, "name": rng.choice(NAMES) + " " + rng.choice(surnames), "tier": rng.choice(["standard", "plus"])}
        summary = lambda rows: "Loaded all ten profiles; tiers: " + _count_by(rows, "tier") + "."
        desc = "An agent calls get_customer on ten consecutive 10-digit ids that differ only in the last digits."
    elif i == 3:
        ids = [rng.uuid() for _ in range(8)]
        system, tool, arg = "You are a legal research assistant.", "read_document", "document_id"
        prompt = "Read these contracts and list their termination clauses: " + ", ".join(ids)
        record = lambda x: {"document_id": x, "title": f"Master services agreement {x[:8]}", "termination_notice_days": rng.choice([30, 60, 90])}
        summary = lambda rows: "Termination notice periods (days): " + _count_by(rows, "termination_notice_days") + " contracts respectively."
        desc = "An agent reads eight documents one by one by UUID."
    elif i == 4:
        ids = [str(rng.randint(1000000000, 9999999999)) for _ in range(8)]
        system, tool, arg = "You are a helpdesk assistant.", "get_ticket", "ticket_id"
        prompt = "Summarise tickets " + ", ".join(ids) + "."
        record = lambda x: {"id": x, "subject": rng.choice(["VPN drops", "New laptop", "Password reset", "Printer offline", "Access to repo"]), "status": rng.choice(["open", "pending"])}
        summary = lambda rows: "Subjects: " + _count_by(rows, "subject") + "."
        desc = "An agent fetches eight tickets named by random 10-digit ids."
    elif i == 5:
        ids = [str(rng.randint(1000000000, 9999999999)) for _ in range(8)]
        system, tool, arg = "You are a logistics assistant.", "check_shipment", "tracking_number"
        prompt = "Which of these shipments are delayed? " + " ".join(ids)
        record = lambda x: {"tracking_number": x, "status": rng.choice(["in_transit", "delayed", "delivered"]), "eta": f"2026-11-{rng.randint(20, 30)}"}
        summary = lambda rows: "Delayed: " + (", ".join(r["tracking_number"] for r in rows if r["status"] == "delayed") or "none") + "."
        desc = "An agent tracks eight shipments by 10-digit tracking numbers."
    elif i == 6:
        ids = [rng.uuid() for _ in range(10)]
        system, tool, arg = "You are a fleet-monitoring assistant.", "get_device_status", "device_id"
        prompt = "Check all ten sensors in building B: " + ", ".join(ids)
        record = lambda x: {"device_id": x, "online": rng.maybe(0.85), "battery": rng.randint(5, 100)}
        summary = lambda rows: (f"{sum(r['online'] for r in rows)} of 10 sensors are online; low battery: "
                                + (", ".join(r["device_id"][:8] for r in rows if r["battery"] < 20) or "none") + ".")
        desc = "An agent checks ten devices by UUID, two parallel tool calls per turn."
    else:
        ids = [str(rng.randint(7000000000, 7099999999)) for _ in range(10)]
        system, tool, arg = "You are an order-operations assistant.", "get_order", "order_id"
        prompt = "Check these order numbers for missing payments: " + ", ".join(ids)
        record = lambda x: {"id": x, "paid": rng.maybe(0.8), "total": round(rng.uniform(10, 300), 2)}
        summary = lambda rows: "Unpaid: " + (", ".join(r["id"] for r in rows if not r["paid"]) or "none") + "."
        desc = "An agent fetches ten orders by 10-digit order numbers."
    r = Run(sc, sc.conversation(system, [tool]))
    r.user(prompt)
    rows = []
    per_turn = 2 if i == 6 else 1  # scenario 6 issues two parallel calls per assistant turn
    for k in range(0, len(ids), per_turn):
        batch = [record(x) for x in ids[k:k + per_turn]]
        rows += batch
        r.calls([(tool, {arg: row_id}, pj(row)) for row_id, row in zip(ids[k:k + per_turn], batch)])
    r.say(summary(rows))
    r.user("Thanks.")
    sc.tags.append("near_miss")
    sc.description = desc




# ---- iterative_editing ---------------------------------------------------------------------------
# A user revises a text with the model turn by turn: each answer is the whole
# text again with a small change (a name, a date, a sentence dropped, a tone
# shift). Consecutive answers are nearly identical, as in a text loop, but
# each one does what was asked. Added after the first replays, to measure the
# main risk of detecting text loops from repeated answers.

EDITING = [
    dict(system="You help write workplace emails. Reply with the full email only.",
         ask="Draft a short email inviting the team to the Q4 planning meeting on Tuesday at 10:00.",
         text="Subject: Q4 planning meeting\n\nHi all,\n\nLet's meet on Tuesday at 10:00 to plan Q4. Please bring your top three priorities and any open risks. The meeting will take about an hour.\n\nThanks!\nJordan",
         edits=[("Change Tuesday to Wednesday.", [("Tuesday", "Wednesday")]),
                ("Add that it's in room 4B.", [("about an hour.", "about an hour, in room 4B.")]),
                ("Make it a bit more formal.", [("Hi all,", "Dear colleagues,"), ("Let's meet", "I would like to invite you to meet"), ("Thanks!", "Kind regards,")]),
                ("Shorter please, drop the sentence about the duration.", [(" The meeting will take about an hour, in room 4B.", " We will meet in room 4B.")]),
                ("Sign it from Maria instead of Jordan.", [("Jordan", "Maria")]),
                ("Perfect, thanks.", None)]),
    dict(system="You are a copywriter for an online shop.",
         ask="Write a product description for our bamboo cutting board, 40 x 30 cm.",
         text="Our bamboo cutting board gives you a generous 40 x 30 cm surface for everyday prep. Bamboo is hard-wearing and gentle on knife edges, and the board is easy to clean with warm water. A juice groove keeps counters tidy.",
         edits=[("Mention that it's made from FSC-certified bamboo.", [("Our bamboo cutting board", "Our FSC-certified bamboo cutting board")]),
                ("Drop the juice groove sentence, the new model doesn't have one.", [(" A juice groove keeps counters tidy.", "")]),
                ("Make it sound warmer.", [("gives you a generous", "brings a generous, friendly"), ("everyday prep", "everyday cooking with the people you love")]),
                ("Add that it's dishwasher safe.", [("easy to clean with warm water.", "easy to clean with warm water, and it is dishwasher safe.")]),
                ("Actually it's not dishwasher safe, remove that.", [(", and it is dishwasher safe.", ".")]),
                ("Good.", None)]),
    dict(system="You write SQL for PostgreSQL. Reply with the query only.",
         ask="Write a query for the total revenue per customer in 2026 from orders(customer_id, total, created_at).",
         text="SELECT customer_id, SUM(total) AS revenue\nFROM orders\nWHERE created_at >= '2026-01-01' AND created_at < '2027-01-01'\nGROUP BY customer_id\nORDER BY revenue DESC;",
         edits=[("Only customers with more than 1000 in revenue.", [("GROUP BY customer_id\n", "GROUP BY customer_id\nHAVING SUM(total) > 1000\n")]),
                ("Limit to the top 20.", [("ORDER BY revenue DESC;", "ORDER BY revenue DESC\nLIMIT 20;")]),
                ("Exclude cancelled orders, there's a status column.", [("WHERE created_at", "WHERE status <> 'cancelled' AND created_at")]),
                ("Rename revenue to total_revenue.", [("AS revenue", "AS total_revenue"), ("ORDER BY revenue", "ORDER BY total_revenue")]),
                ("Use 500 as the threshold instead.", [("> 1000", "> 500")]),
                ("Thanks, works.", None)]),
    dict(system="You help with cover letters.",
         ask="Write an opening paragraph for a cover letter for a junior data analyst role at Northwind.",
         text="I am writing to apply for the Junior Data Analyst position at Northwind. During my studies in economics I built dashboards in Power BI and cleaned survey data in Python, and I enjoy turning messy numbers into clear answers.",
         edits=[("Mention my internship at Contoso.", [("in Python,", "in Python, and during my internship at Contoso I automated weekly sales reports,")]),
                ("Swap Power BI for Tableau.", [("Power BI", "Tableau")]),
                ("Make it one sentence shorter.", [(", and I enjoy turning messy numbers into clear answers.", ".")]),
                ("Say it's the Junior Data Analyst (Remote) position.", [("Junior Data Analyst position", "Junior Data Analyst (Remote) position")]),
                ("Use 'I am excited to apply' at the start.", [("I am writing to apply", "I am excited to apply")]),
                ("Great, thank you.", None)]),
    dict(system="You help write release notes.",
         ask="Write release notes for version 2.4: dark mode, faster search, and a fix for the CSV export.",
         text="Version 2.4\n\n- Dark mode: switch themes in Settings > Appearance.\n- Faster search: results now appear up to twice as fast.\n- Fixed: CSV exports no longer drop rows with line breaks in notes.",
         edits=[("Add a line thanking the community for the bug reports.", [("in notes.", "in notes.\n\nThanks to everyone who reported bugs this cycle.")]),
                ("It's 2.4.1, not 2.4.", [("Version 2.4", "Version 2.4.1")]),
                ("Say 'up to 2x faster' instead of 'twice as fast'.", [("results now appear up to twice as fast.", "results now appear up to 2x faster.")]),
                ("Remove the dark mode line, it slipped to 2.5.", [("- Dark mode: switch themes in Settings > Appearance.\n", "")]),
                ("Put the fix first.", [("- Faster search: results now appear up to 2x faster.\n- Fixed: CSV exports no longer drop rows with line breaks in notes.", "- Fixed: CSV exports no longer drop rows with line breaks in notes.\n- Faster search: results now appear up to 2x faster.")]),
                ("Ship it.", None)]),
    dict(system="You write short customer-support replies.",
         ask="Reply to a customer whose parcel is delayed; tell them it should arrive on Friday.",
         text="Hi Sam,\n\nThanks for your patience. Your parcel was delayed at our sorting centre, and it should now arrive on Friday. We're sorry for the wait.\n\nBest,\nThe Support Team",
         edits=[("Offer a 10% discount code for the trouble.", [("sorry for the wait.", "sorry for the wait, so here is a 10% discount code for your next order: SORRY10.")]),
                ("The customer's name is Samira, not Sam.", [("Hi Sam,", "Hi Samira,")]),
                ("Say Saturday instead of Friday.", [("on Friday", "on Saturday")]),
                ("Less formal please.", [("Thanks for your patience.", "Thanks so much for hanging in there!"), ("Best,", "Cheers,")]),
                ("Remove the discount code, we can't offer it.", [(", so here is a 10% discount code for your next order: SORRY10.", ".")]),
                ("Thanks!", None)]),
]


def build_iterative_editing(sc: Scenario) -> None:
    spec = EDITING[sc.index - 1]
    r = Run(sc, sc.conversation(spec["system"]))
    text = spec["text"]
    r.user(spec["ask"])
    for instruction, changes in spec["edits"]:
        r.say(text)
        r.user(instruction)
        for old, new in changes or []:
            if old not in text:
                raise AssertionError(f"{sc.id}: edit {old!r} does not apply")
            text = text.replace(old, new)
    sc.tags.append("near_miss")
    sc.description = "A user revises a text turn by turn; each answer is the whole text again with the requested small change."


# --------------------------------------------------------------------------
# 6. Self-checks (run on every generation; any failure aborts)
# --------------------------------------------------------------------------

class CorpusError(Exception):
    pass


def _require(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise CorpusError(f"{where}: {msg}")


def canon_args(value) -> str:
    """Arguments compared the way a careful reader would: parsed, keys sorted, no whitespace."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value.strip()
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def extract_calls(fmt: str, body: dict) -> list[tuple[str, str]]:
    """(tool name, canonical arguments) of every tool call in the history, in order."""
    out = []
    if fmt == "openai_chat":
        for m in body["messages"]:
            for c in m.get("tool_calls") or []:
                out.append((c["function"]["name"], canon_args(c["function"]["arguments"])))
    elif fmt == "openai_responses":
        for it in body["input"]:
            if it.get("type") == "function_call":
                out.append((it["name"], canon_args(it["arguments"])))
    else:
        for m in body["messages"]:
            if m["role"] == "assistant" and isinstance(m["content"], list):
                for b in m["content"]:
                    if b["type"] == "tool_use":
                        out.append((b["name"], canon_args(b["input"])))
    return out


def assistant_texts(fmt: str, body: dict) -> list[str]:
    """Plain-text assistant answers in the history (no tool calls)."""
    if fmt == "openai_responses":
        return [it["content"][0]["text"] for it in body["input"] if it.get("type") == "message"]
    return [m["content"] for m in body["messages"]
            if m["role"] == "assistant" and isinstance(m["content"], str) and not m.get("tool_calls")]


def _check_tools_offered(where: str, offered: list[str], used: list[str]) -> None:
    _require(len(set(offered)) == len(offered), where, "duplicate tool definitions")
    for name in used:
        _require(name in offered, where, f"tool {name} called but not offered")


def check_chat(where: str, body: dict) -> None:
    _require(isinstance(body.get("model"), str) and isinstance(body.get("messages"), list), where, "model/messages")
    msgs = body["messages"]
    _require(msgs and msgs[0]["role"] == "system", where, "first message must be system")
    offered = [t["function"]["name"] for t in body.get("tools", [])]
    for t in body.get("tools", []):
        _require(t["type"] == "function" and set(t["function"]) == {"name", "description", "parameters"}, where, "tool shape")
    pending: list[str] = []
    seen_ids: set[str] = set()
    used = []
    for m in msgs:
        role = m["role"]
        _require(role in ("system", "user", "assistant", "tool"), where, f"bad role {role}")
        if role == "tool":
            _require(m["tool_call_id"] in pending, where, f"tool_call_id {m['tool_call_id']} does not answer a pending call")
            pending.remove(m["tool_call_id"])
            _require(isinstance(m["content"], str), where, "tool content must be a string")
            continue
        _require(not pending, where, f"tool calls {pending} left unanswered before a {role} message")
        if role == "assistant" and m.get("tool_calls"):
            for c in m["tool_calls"]:
                _require(c["id"].startswith("call_") and c["id"] not in seen_ids, where, f"bad or reused call id {c['id']}")
                _require(c["type"] == "function" and isinstance(c["function"]["arguments"], str), where, "tool_call shape")
                json.loads(c["function"]["arguments"])
                seen_ids.add(c["id"])
                pending.append(c["id"])
                used.append(c["function"]["name"])
        else:
            _require(isinstance(m["content"], str), where, f"{role} content must be a string")
    _require(not pending, where, "unanswered tool calls at the end")
    _require(msgs[-1]["role"] in ("user", "tool"), where, "last message must be user or tool")
    _check_tools_offered(where, offered, used)


def check_responses(where: str, body: dict) -> None:
    _require(isinstance(body.get("model"), str) and isinstance(body.get("instructions"), str)
             and isinstance(body.get("input"), list), where, "model/instructions/input")
    offered = []
    for t in body.get("tools", []):
        _require(t["type"] == "function" and set(t) == {"type", "name", "description", "parameters"}, where, "tool shape")
        offered.append(t["name"])
    pending: list[str] = []
    seen_ids: set[str] = set()
    used = []
    for it in body["input"]:
        typ = it.get("type")
        if typ == "function_call_output":
            _require(it["call_id"] in pending, where, f"function_call_output {it['call_id']} matches no pending call")
            pending.remove(it["call_id"])
            _require(isinstance(it["output"], str), where, "output must be a string")
            continue
        if typ == "function_call":
            _require(it["call_id"].startswith("call_") and it["call_id"] not in seen_ids, where, "bad or reused call_id")
            _require(isinstance(it["arguments"], str), where, "arguments must be a string")
            json.loads(it["arguments"])
            seen_ids.add(it["call_id"])
            pending.append(it["call_id"])
            used.append(it["name"])
            continue
        _require(not pending, where, "function calls left unanswered before a message")
        if typ == "message":
            _require(it["role"] == "assistant" and it["content"][0]["type"] == "output_text", where, "assistant message shape")
        else:
            _require(typ is None and it["role"] == "user" and isinstance(it["content"], str), where, f"bad input item {it}")
    _require(not pending, where, "unanswered function calls at the end")
    last = body["input"][-1]
    _require(last.get("role") == "user" or last.get("type") == "function_call_output", where, "last item must be user or output")
    _check_tools_offered(where, offered, used)


def check_anthropic(where: str, body: dict) -> None:
    _require(isinstance(body.get("model"), str) and isinstance(body.get("max_tokens"), int)
             and isinstance(body.get("system"), str), where, "model/max_tokens/system")
    msgs = body["messages"]
    _require(msgs and msgs[0]["role"] == "user" and msgs[-1]["role"] == "user", where, "must start and end with user")
    offered = []
    for t in body.get("tools", []):
        _require(set(t) == {"name", "description", "input_schema"}, where, "tool shape")
        offered.append(t["name"])
    seen_ids: set[str] = set()
    used = []
    prev_tool_uses: list[str] = []
    for i, m in enumerate(msgs):
        _require(m["role"] == ("user" if i % 2 == 0 else "assistant"), where, f"roles must alternate (message {i})")
        blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        _require(bool(blocks), where, "empty content")
        if m["role"] == "assistant":
            prev_tool_uses = []
            for b in blocks:
                _require(b["type"] in ("text", "tool_use"), where, f"bad assistant block {b['type']}")
                if b["type"] == "tool_use":
                    _require(b["id"].startswith("toolu_") and b["id"] not in seen_ids, where, "bad or reused tool_use id")
                    _require(isinstance(b["input"], dict), where, "tool_use input must be an object")
                    seen_ids.add(b["id"])
                    prev_tool_uses.append(b["id"])
                    used.append(b["name"])
        else:
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            _require(sorted(results) == sorted(prev_tool_uses), where,
                     f"tool_result ids {results} must answer exactly the preceding tool_use ids {prev_tool_uses}")
            kinds = [b["type"] for b in blocks]
            _require(kinds == sorted(kinds, key=lambda k: k != "tool_result"), where, "tool_result blocks must come first")
            for b in blocks:
                _require(b["type"] in ("text", "tool_result"), where, f"bad user block {b['type']}")
            prev_tool_uses = []
    _check_tools_offered(where, offered, used)


BODY_CHECKS = {"openai_chat": check_chat, "openai_responses": check_responses, "anthropic_messages": check_anthropic}


def check_scenario(env: dict) -> None:
    sid = env["id"]
    _require(env["label"] in ("loop", "healthy") and sid == f"{env['label']}-{env['kind']}-{sid.rsplit('-', 1)[1]}", sid, "id/label/kind")
    _require(env["format"] in FORMATS, sid, "format")
    _require(env["description"].endswith(".") and len(env["description"]) > 20, sid, "description")
    reqs = env["requests"]
    _require(len(reqs) >= 2, sid, "too few requests")
    lt = env["loop_turn"]
    if env["label"] == "loop":
        _require(isinstance(lt, int) and 1 <= lt and len(reqs) - lt >= 3, sid, f"loop_turn {lt} needs >= 3 requests after it")
    else:
        _require(lt is None, sid, "healthy scenarios have loop_turn null")
    for n, req in enumerate(reqs, start=1):
        where = f"{sid} request {n}"
        _require(req["method"] == "POST" and req["path"] == PATHS[env["format"]], where, "method/path")
        h = req["headers"]
        if env["format"] == "anthropic_messages":
            _require(h["x-api-key"].startswith("sk-corpus-" + sid + "-") and h["anthropic-version"] == "2023-06-01"
                     and "authorization" not in h, where, "anthropic headers")
        else:
            _require(h["authorization"].startswith("Bearer sk-corpus-" + sid + "-") and "x-api-key" not in h, where, "openai headers")
        BODY_CHECKS[env["format"]](where, req["body"])
        for name, _ in extract_calls(env["format"], req["body"]):
            _require((name in EXEMPT_TOOLS) == False or env["kind"] == "polling_exempt", where, f"exempt tool {name} outside polling_exempt")  # noqa: E712
    kind = env["kind"]
    if kind == "identical_retry":
        bodies = [json.dumps(r, sort_keys=True) for r in reqs]
        _require(len(set(bodies[lt - 3:])) == 1, sid, "retries must be byte-identical from the first send on")
        _require(lt == 3 or bodies[lt - 4] != bodies[lt - 3], sid, "loop_turn must be the third identical send")
    if kind == "volatile_tool_error":
        def repeats(n: int) -> int:
            calls = extract_calls(env["format"], reqs[n - 1]["body"])
            return max((calls.count(c) for c in calls), default=0)
        _require(repeats(lt) == 3 and repeats(lt - 1) == 2, sid, "loop_turn must carry the third identical failing call")
    if kind == "rephrased_text":
        texts = assistant_texts(env["format"], reqs[-1]["body"])
        _require(len(set(texts)) == len(texts), sid, "rephrased answers must never repeat byte-for-byte")
    if kind == "polling_exempt":
        names = [c[0] for c in extract_calls(env["format"], reqs[-1]["body"])]
        _require(any(n in EXEMPT_TOOLS for n in names), sid, "polling_exempt must poll an exempt tool")


def keys_of(env: dict) -> list[str]:
    out = []
    for r in env["requests"]:
        h = r["headers"]
        k = h.get("x-api-key") or h["authorization"].removeprefix("Bearer ")
        if k not in out:
            out.append(k)
    return out


def check_corpus(envs: list[dict]) -> None:
    owner: dict[str, str] = {}
    for env in envs:
        check_scenario(env)
        ks = keys_of(env)
        if env["kind"] == "same_prompt_many_users":
            _require(len(ks) == 20, env["id"], "needs twenty distinct callers")
        else:
            _require(len(ks) == 1, env["id"], "one caller key per scenario")
        for k in ks:
            _require(k not in owner, env["id"], f"key shared with {owner.get(k)}")
            owner[k] = env["id"]
    labels = [e["label"] for e in envs]
    _require(labels.count("loop") >= 40 and labels.count("healthy") >= 40, "corpus", "at least 40 of each label")
    _require(len({e["id"] for e in envs}) == len(envs), "corpus", "duplicate ids")


# --------------------------------------------------------------------------
# 7. Output, --check, main
# --------------------------------------------------------------------------

# (label, kind, builder, number of scenarios, format offset). Order = manifest order.
# Scenario i of a kind uses FORMATS[(i - 1 + offset) % 3]; the offsets were chosen
# once so that each label is spread evenly over the three formats.
KINDS = [
    ("loop", "identical_retry", build_identical_retry, len(IDENTICAL_RETRY_SETUPS), 0),
    ("loop", "volatile_tool_error", build_volatile_tool_error, len(VOLATILE), 0),
    ("loop", "rephrased_text", build_rephrased_text, len(REPHRASED), 0),
    ("loop", "stuck_search", build_stuck_search, len(STUCK_SEARCH), 0),
    ("loop", "alternating_tools", build_alternating_tools, len(ALTERNATING), 1),
    ("loop", "resumed_loop", build_resumed_loop, len(RESUMED), 2),
    ("healthy", "productive_session", build_productive_session, len(PRODUCTIVE_SCRIPTS), 0),
    ("healthy", "same_prompt_many_users", build_same_prompt_many_users, len(SAME_PROMPT), 0),
    ("healthy", "templated_batch", build_templated_batch, len(TEMPLATED), 0),
    ("healthy", "advancing_pagination", build_advancing_pagination, 7, 1),
    ("healthy", "polling_exempt", build_polling_exempt, len(POLLING), 0),
    ("healthy", "distinct_amounts_dates", build_distinct_amounts_dates, 7, 2),
    ("healthy", "distinct_resources", build_distinct_resources, 7, 2),
    ("healthy", "iterative_editing", build_iterative_editing, len(EDITING), 0),
]


def build_all() -> list[dict]:
    envs = []
    for label, kind, builder, count, offset in KINDS:
        for index in range(1, count + 1):
            sc = Scenario(label, kind, index, FORMATS[(index - 1 + offset) % len(FORMATS)])
            builder(sc)
            envs.append(sc.envelope())
    return envs


def render_scenario(env: dict) -> str:
    """Compact JSON, one request per line, so diffs show which request changed."""
    head = {k: v for k, v in env.items() if k != "requests"}
    opening = json.dumps(head, ensure_ascii=False, separators=(",", ":"))[:-1] + ',"requests":[\n'
    lines = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in env["requests"]]
    return opening + ",\n".join(lines) + "\n]}\n"


def summarize(envs: list[dict]) -> dict:
    counts: dict = {"label": {}, "kind": {}, "format": {}, "label_format": {}, "tags": {}}
    for e in envs:
        counts["label"][e["label"]] = counts["label"].get(e["label"], 0) + 1
        counts["kind"][e["kind"]] = counts["kind"].get(e["kind"], 0) + 1
        counts["format"][e["format"]] = counts["format"].get(e["format"], 0) + 1
        lf = f"{e['label']}/{e['format']}"
        counts["label_format"][lf] = counts["label_format"].get(lf, 0) + 1
        for t in e["tags"]:
            counts["tags"][t] = counts["tags"].get(t, 0) + 1
    counts["requests"] = sum(len(e["requests"]) for e in envs)
    return counts


def generate() -> tuple[dict[str, str], dict]:
    envs = build_all()
    check_corpus(envs)
    files = {f"scenarios/{e['id']}.json": render_scenario(e) for e in envs}
    for rel, text in files.items():  # the rendered text must parse back to the same scenario
        _require(json.loads(text)["id"] in rel, rel, "render round-trip")
    counts = summarize(envs)
    manifest = {"seed": SEED, "exempt_tools": EXEMPT_TOOLS, "counts": counts, "scenarios": [e["id"] for e in envs]}
    files["manifest.json"] = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    return files, counts


def on_disk() -> dict[str, str]:
    found = {}
    if MANIFEST.exists():
        found["manifest.json"] = MANIFEST.read_text(encoding="utf-8")
    if SCENARIO_DIR.is_dir():
        for p in sorted(SCENARIO_DIR.glob("*.json")):
            found[f"scenarios/{p.name}"] = p.read_text(encoding="utf-8")
    return found


def print_summary(files: dict[str, str], counts: dict) -> None:
    print(f"labels:  {counts['label']}")
    print(f"formats: {counts['format']}")
    print(f"label/format: {counts['label_format']}")
    print(f"tags:    {counts['tags']}")
    print("kinds:")
    for label, kind, *_ in KINDS:
        print(f"  {label:8s} {kind:24s} {counts['kind'][kind]}")
    total = sum(len(t.encode("utf-8")) for t in files.values())
    print(f"{len(files) - 1} scenarios, {counts['requests']} requests, {total} bytes ({total / 1e6:.2f} MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="regenerate in memory; exit 1 if files on disk differ")
    args = ap.parse_args()
    try:
        files, counts = generate()
    except CorpusError as e:
        print(f"self-check failed: {e}", file=sys.stderr)
        return 2
    if args.check:
        disk = on_disk()
        stale = sorted(set(disk) - set(files))
        missing = sorted(set(files) - set(disk))
        changed = sorted(k for k in set(files) & set(disk) if files[k] != disk[k])
        for label, names in (("missing", missing), ("changed", changed), ("stale", stale)):
            for n in names:
                print(f"{label}: {n}", file=sys.stderr)
        if stale or missing or changed:
            print("corpus out of date: run python3 tests/corpus/generate.py", file=sys.stderr)
            return 1
        print(f"corpus up to date ({len(files) - 1} scenarios)")
        return 0
    SCENARIO_DIR.mkdir(parents=True, exist_ok=True)
    for p in SCENARIO_DIR.glob("*.json"):
        if f"scenarios/{p.name}" not in files:
            p.unlink()
    for rel, text in files.items():
        (HERE / rel).write_text(text, encoding="utf-8")
    print_summary(files, counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
