#!/usr/bin/env python3
"""Held-out labelled corpus of AI-agent HTTP traffic for loopguard.

This corpus is the *independent test set*: it was written from the scenario
format and labelling rules of tests/corpus/README.md alone, without looking at
how loopguard detects loops, at its tuning corpus's generator or scenarios, or
at any detector output.  See README.md next to this file.

Usage:
    python3 tests/heldout/generate.py          # rewrite scenarios/ and manifest.json
    python3 tests/heldout/generate.py --check  # regenerate in memory, exit 1 on drift

Python 3.11 standard library only.  Deterministic: every scenario draws from
its own ``random.Random(f"{SEED}:{scenario_id}")``; there is no wall clock, no
``uuid`` module and no dependence on hash order.

Sections
    1. Constants and deterministic helpers (ids, clock, tiny PNG images)
    2. Tool registry
    3. Conversation model and rendering into the three wire formats
    4. Scenario, client identities and the Run driver
    5. Text pools shared by builders
    6. Loop builders
    7. Healthy builders
    8. Kind table
    9. Self-checks
   10. Writing, manifest and --check
"""
from __future__ import annotations

import argparse
import base64
import datetime as dt
import difflib
import json
import random
import re
import string
import struct
import sys
import zlib
from pathlib import Path

# ---------------------------------------------------------------------------
# 1. Constants and deterministic helpers
# ---------------------------------------------------------------------------

SEED = "heldout-20270309"
HERE = Path(__file__).resolve().parent
SCEN_DIR = HERE / "scenarios"
MANIFEST = HERE / "manifest.json"

FORMATS = ("openai_chat", "openai_responses", "anthropic_messages")
PATHS = {
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
    "anthropic_messages": "/v1/messages",
}
MODELS = {
    "openai_chat": ["gpt-5", "gpt-5-mini", "gpt-4.1-nano", "gpt-4.1", "o3", "o4-mini"],
    "openai_responses": ["gpt-5", "gpt-5-mini", "o3", "o4-mini", "gpt-4.1"],
    "anthropic_messages": ["claude-sonnet-4-20250514", "claude-opus-4-20250514",
                           "claude-3-5-haiku-20241022", "claude-3-7-sonnet-20250219",
                           "claude-opus-4-1-20250805"],
}
# Anthropic models that support extended thinking.
THINKING_MODELS = {"claude-sonnet-4-20250514", "claude-opus-4-20250514",
                   "claude-3-7-sonnet-20250219", "claude-opus-4-1-20250805"}
# OpenAI models that produce reasoning items in the Responses API.
REASONING_MODELS = {"gpt-5", "gpt-5-mini", "o3", "o4-mini"}

HEX = "0123456789abcdef"
ALNUM = string.ascii_letters + string.digits
B62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def rhex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(HEX) for _ in range(n))


def rHEX(rng: random.Random, n: int) -> str:
    return rhex(rng, n).upper()


def ralnum(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALNUM) for _ in range(n))


def rb62(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(B62) for _ in range(n))


def rbytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def rb64(rng: random.Random, nbytes: int) -> str:
    return base64.b64encode(rbytes(rng, nbytes)).decode()


def rb64url(rng: random.Random, nbytes: int) -> str:
    return base64.urlsafe_b64encode(rbytes(rng, nbytes)).decode().rstrip("=")


def ruuid(rng: random.Random) -> str:
    h = rhex(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{rng.choice('89ab')}{h[17:20]}-{h[20:32]}"


def rulid(rng: random.Random) -> str:
    return "01J" + "".join(rng.choice(CROCKFORD) for _ in range(23))


def rdigits(rng: random.Random, n: int) -> str:
    return str(rng.randint(1, 9)) + "".join(rng.choice(string.digits) for _ in range(n - 1))


def b64json(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")


def jdump(obj) -> str:
    """Compact JSON, as models emit tool arguments and as files are written."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def canon_args(s: str) -> str:
    return json.dumps(json.loads(s), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Clock:
    """A per-scenario clock in March/April 2027, advanced explicitly."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        base = dt.datetime(2027, 3, 1, 6, 0, 0, tzinfo=dt.timezone.utc)
        self.t = base + dt.timedelta(days=rng.randrange(0, 45), seconds=rng.randrange(0, 40000),
                                     milliseconds=rng.randrange(0, 1000))

    def tick(self, lo: float = 2.0, hi: float = 40.0) -> "Clock":
        self.t += dt.timedelta(milliseconds=self.rng.randint(int(lo * 1000), int(hi * 1000)))
        return self

    def iso(self) -> str:
        return self.t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.t.microsecond // 1000:03d}Z"

    def iso_s(self) -> str:
        return self.t.strftime("%Y-%m-%dT%H:%M:%SZ")

    def http(self) -> str:
        return self.t.strftime("%a, %d %b %Y %H:%M:%S GMT")

    def syslog(self) -> str:
        return self.t.strftime("%b %d %H:%M:%S")

    def date(self) -> str:
        return self.t.strftime("%Y-%m-%d")

    def human(self) -> str:
        return self.t.strftime("%A, %d %B %Y, %H:%M:%S UTC")

    def hm(self) -> str:
        return self.t.strftime("%H:%M")

    def epoch(self) -> int:
        return int(self.t.timestamp())


def _png_chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def tiny_png(rng: random.Random, w: int = 12, h: int = 8) -> str:
    """A small, valid RGB PNG as base64.

    The deflate stream uses a single *stored* block (no compression) so the
    bytes do not depend on the zlib build; crc32/adler32 are fixed functions.
    The picture is a few coloured bands, like a thumbnail of a screenshot.
    """
    bands = [(rng.randrange(256), rng.randrange(256), rng.randrange(256)) for _ in range(3)]
    raw = bytearray()
    for y in range(h):
        raw.append(0)
        for x in range(w):
            r, g, b = bands[min(2, (y * 3) // h)]
            if (x + y) % 5 == 0:
                r, g, b = 255 - r, 255 - g, 255 - b
            raw += bytes((r, g, b))
    raw = bytes(raw)
    stored = b"\x01" + struct.pack("<HH", len(raw), len(raw) ^ 0xFFFF) + raw
    idat = b"\x78\x01" + stored + struct.pack(">I", zlib.adler32(raw) & 0xFFFFFFFF)
    png = (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
           + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b""))
    return base64.b64encode(png).decode()


def openai_file_id(rng: random.Random) -> str:
    return "file-" + rb62(rng, 22)


def anthropic_file_id(rng: random.Random) -> str:
    return "file_011C" + rb62(rng, 20)


# ---------------------------------------------------------------------------
# 2. Tool registry
# ---------------------------------------------------------------------------
# Each tool is declared with a tiny DSL: "name:type:description" items joined
# by ";".  Types: s string, i integer, n number, b boolean, as array of
# strings, o object, ao array of objects.  A trailing "?" on a name makes the
# parameter optional.

_TYPES = {
    "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"},
    "b": {"type": "boolean"}, "as": {"type": "array", "items": {"type": "string"}},
    "o": {"type": "object"}, "ao": {"type": "array", "items": {"type": "object"}},
}

TOOL_SPECS: dict[str, tuple[str, str]] = {
    # coding
    "open_source_file": ("Return the contents of a source file, optionally a line range.",
                         "path:s:Path relative to the repository root;start?:i:First line (1-based);end?:i:Last line"),
    "edit_source": ("Replace an exact snippet in a file with new text.",
                    "path:s:File path;old:s:Exact text to replace;new:s:Replacement text"),
    "edit_range": ("Replace a range of lines in a file.",
                   "path:s:File path;start:i:First line;end:i:Last line;text:s:New text for the range"),
    "exec_tests": ("Run a test command in the project sandbox and return its output.",
                   "cmd:s:Shell command, e.g. a test runner invocation;cwd?:s:Working directory"),
    "grep_repo": ("Search the repository with a regular expression.",
                  "pattern:s:Regular expression;glob?:s:Limit to files matching this glob"),
    "list_dir": ("List a directory of the workspace.", "path:s:Directory path"),
    "show_git_blame": ("Show who last changed a line.", "path:s:File path;line:i:Line number"),
    "git_show_commit": ("Show a commit with its diff.", "sha:s:Commit sha"),
    "build_image": ("Build a container image and return the build log.",
                    "context:s:Build context directory;tag:s:Image tag;dockerfile?:s:Dockerfile path"),
    "compile_project": ("Compile the project and return diagnostics.", "target?:s:Build target"),
    "check_types": ("Run the static type checker over paths.", "paths:as:Paths to check"),
    # sre
    "query_prometheus": ("Run a PromQL query.", "expr:s:PromQL expression;range?:s:Range like 30m"),
    "tail_service_logs": ("Return the last log lines of a service.",
                          "service:s:Service name;lines:i:Number of lines;since?:s:Only lines after this time"),
    "kubectl_get": ("List Kubernetes resources.", "resource:s:Resource type;namespace:s:Namespace;selector?:s:Label selector"),
    "kubectl_describe": ("Describe one Kubernetes object.", "kind:s:Object kind;name:s:Object name;namespace:s:Namespace"),
    "scale_deployment": ("Scale a deployment.", "namespace:s:Namespace;name:s:Deployment;replicas:i:Replica count"),
    "rollback_release": ("Roll a Helm release back to a revision.", "release:s:Release name;revision:i:Revision"),
    "http_probe": ("Send an HTTP request to a URL and report status, headers and timing.",
                   "url:s:URL;method?:s:HTTP method"),
    "ssh_exec": ("Run a read-only command on a host.", "host:s:Host name;cmd:s:Command"),
    "open_incident": ("Open an incident.", "title:s:Title;severity:s:sev1..sev4"),
    "post_chat_message": ("Post a message to a team chat channel.", "channel:s:Channel;text:s:Message"),
    "fetch_trace": ("Fetch a distributed trace by id.", "trace_id:s:Trace id"),
    # support
    "lookup_customer_account": ("Find a customer account by e-mail.", "email:s:Customer e-mail"),
    "find_order_by_email": ("List a customer's recent orders.", "email:s:Customer e-mail;limit?:i:Max orders"),
    "lookup_tracking": ("Get carrier tracking events.", "carrier:s:Carrier code;tracking_number:s:Tracking number"),
    "issue_store_credit": ("Issue store credit to an account.",
                           "account_id:s:Account;amount:n:Amount;currency:s:ISO currency;reason:s:Reason"),
    "reply_to_customer": ("Send a reply on a support case.", "case_id:s:Case id;body:s:Reply text"),
    "escalate_case": ("Escalate a case to a team.", "case_id:s:Case id;team:s:Team;note:s:Internal note"),
    "search_help_center": ("Search help-center articles.", "query:s:Query;locale?:s:Locale"),
    # data
    "execute_query": ("Run a read-only SQL query on the warehouse.", "sql:s:SQL text;warehouse?:s:Warehouse name"),
    "describe_dataset": ("Describe a dataset's columns and row count.", "name:s:Dataset name"),
    "plot_series": ("Render a chart from query results.", "title:s:Title;x:s:X column;y:s:Y column;kind:s:line|bar"),
    "save_notebook_cell": ("Save a cell in the analysis notebook.", "cell_id:s:Cell id;source:s:Cell source"),
    "read_sheet_range": ("Read a spreadsheet range.", "sheet:s:Sheet name;range:s:A1 range"),
    "write_sheet_range": ("Write values to a spreadsheet range.", "sheet:s:Sheet name;range:s:A1 range;values:ao:Rows"),
    # research
    "search_papers": ("Search an index of research papers.", "query:s:Query;year_from?:i:Earliest year"),
    "browse_url": ("Open a web page and return its text or HTML.", "url:s:URL"),
    "cite_source": ("Add a source to the report's bibliography.", "url:s:URL;title:s:Title;quote:s:Supporting quote"),
    "kv_put": ("Store a note in the agent's key-value memory.", "key:s:Key;value:s:Value"),
    "kv_get": ("Read a note from the agent's key-value memory.", "key:s:Key"),
    "vector_search": ("Semantic search over the team knowledge base.", "query:s:Query;top_k:i:Results;namespace?:s:Namespace"),
    # commerce / payments
    "catalog_search": ("Search the product catalog.", "q:s:Query;page?:i:Page number;page_size?:i:Page size"),
    "get_sku": ("Get one product by SKU.", "sku:s:SKU"),
    "update_listing": ("Update fields of a product listing.", "sku:s:SKU;fields:o:Fields to change"),
    "get_charge": ("Get a payment charge.", "charge_id:s:Charge id"),
    "stripe_list_charges": ("List charges, newest first.",
                            "limit:i:Page size;starting_after?:s:Cursor: last charge id of the previous page"),
    "refund_charge": ("Refund a charge, fully or partly.", "charge_id:s:Charge id;amount:i:Amount in minor units"),
    # storage
    "list_bucket_keys": ("List object keys in a bucket.",
                         "bucket:s:Bucket;prefix:s:Key prefix;continuation_token?:s:Token from the previous page"),
    "head_object": ("Get an object's metadata.", "bucket:s:Bucket;key:s:Key"),
    "upload_artifact": ("Upload a local file to object storage.", "bucket:s:Bucket;key:s:Key;path:s:Local path"),
    # github / jira / crm / audit
    "gh_list_pull_requests": ("List pull requests of a repository.",
                              "repo:s:owner/name;state:s:open|closed|all;page:i:Page;per_page:i:Page size"),
    "gh_get_pull_request": ("Get a pull request.", "repo:s:owner/name;number:i:PR number"),
    "gh_list_workflow_runs": ("List CI workflow runs of a branch.", "repo:s:owner/name;branch:s:Branch"),
    "jira_search": ("Search Jira issues with JQL.", "jql:s:JQL;startAt:i:Offset;maxResults:i:Page size"),
    "jira_get_issue": ("Get a Jira issue.", "key:s:Issue key"),
    "crm_list_contacts": ("List CRM contacts of a segment.", "segment:s:Segment;cursor?:s:Cursor;limit?:i:Page size"),
    "list_audit_events": ("List audit events after a time.", "since:s:RFC 3339 time;limit:i:Page size"),
    # calendar / travel / mail
    "calendar_free_busy": ("Get free/busy blocks for attendees.", "attendees:as:E-mails;start:s:Start;end:s:End"),
    "schedule_meeting": ("Create a calendar event.", "title:s:Title;attendees:as:E-mails;start:s:Start;minutes:i:Length"),
    "find_hotels": ("Search hotels.", "city:s:City;check_in:s:Date;check_out:s:Date;guests:i:Guests"),
    "dispatch_email": ("Send an e-mail.", "to:s:Recipient;subject:s:Subject;body:s:Body"),
    # assorted backends used by failing / timing loops
    "post_goods_receipt": ("Post a goods receipt against a purchase order in the ERP.",
                           "po:s:Purchase order;lines:ao:Received lines"),
    "submit_expense_report": ("Submit an expense report for approval.", "report_id:s:Report id"),
    "call_inventory_service": ("Call the inventory service for a SKU's stock.", "sku:s:SKU;warehouse:s:Warehouse code"),
    "render_pdf_report": ("Render a PDF report from a template.", "template:s:Template name;period:s:Period"),
    "storefront_graphql": ("Run a Storefront GraphQL query.", "query:s:GraphQL document;variables?:o:Variables"),
    "geocode_address": ("Geocode a postal address.", "address:s:Address"),
    "book_restaurant_table": ("Book a restaurant table.",
                              "restaurant_id:s:Restaurant;date:s:Date;time:s:Time;party_size:i:Guests"),
    "http_request": ("Send an arbitrary HTTP request.", "method:s:Method;url:s:URL;body?:o:JSON body"),
    "carrier_rate_quote": ("Ask the carrier API for a shipping rate.", "origin:s:Origin postcode;dest:s:Destination postcode;kg:n:Weight"),
    "sync_calendar": ("Synchronise an external calendar account.", "account:s:Account id"),
    # sub-agents
    "ask_research_agent": ("Ask the research sub-agent to complete a task.", "task:s:Task description"),
    "handoff_to_billing_agent": ("Hand the conversation to the billing agent.", "reason:s:Reason;context:s:Context for the agent"),
    "ask_sql_agent": ("Ask the SQL sub-agent a data question.", "question:s:Question"),
    "transfer_to_specialist": ("Transfer to a specialist agent.", "specialist:s:Specialist;summary:s:Case summary"),
    "ask_code_review_agent": ("Ask the code-review sub-agent to review a pull request.", "pr:s:PR reference;instructions:s:Instructions"),
    "handoff": ("Hand control to another agent of the crew.", "to:s:Agent name;payload:s:Task payload"),
    # progress through repeated calls (non-polling)
    "backfill_batch": ("Backfill one batch of rows and report what remains.",
                       "table:s:Table;column:s:Column;batch_size:i:Rows per batch"),
    "reindex_next_chunk": ("Reindex the next chunk of a search index.", "index:s:Index name"),
    "download_next_part": ("Download the next part of a large file.", "url:s:Source URL;dest:s:Destination path"),
    "drain_queue_batch": ("Replay a batch of messages from a queue.", "queue:s:Queue name;max:i:Max messages"),
    # polling tools, exempt by configuration
    "check_transcode_job": ("Get the state of a video transcode job.", "job_id:s:Job id"),
    "get_replica_sync_state": ("Get a database replica's initial-sync state.", "replica:s:Replica name"),
    "fetch_batch_run": ("Get the state of a batch inference run.", "run_id:s:Run id"),
    "get_cluster_upgrade_state": ("Get the state of a cluster version upgrade.", "cluster:s:Cluster name"),
    "check_payout_settlement": ("Get the settlement state of a payout.", "payout_id:s:Payout id"),
    "get_index_build": ("Get the state of a vector index build.", "index:s:Index;build_id:s:Build id"),
    # browser
    "browser_navigate": ("Navigate the browser to a URL and return the page text.", "url:s:URL"),
    "browser_click": ("Click an element and return the resulting page text.", "selector:s:CSS selector"),
    # language
    "translate_text": ("Translate text.", "text:s:Text;target_lang:s:Target language code"),
}

EXEMPT_TOOLS = ["check_transcode_job", "get_replica_sync_state", "fetch_batch_run",
                "get_cluster_upgrade_state", "check_payout_settlement", "get_index_build"]


def _schema(spec: str) -> dict:
    props, required = {}, []
    for item in spec.split(";"):
        if not item:
            continue
        name, typ, desc = item.split(":", 2)
        optional = name.endswith("?")
        name = name.rstrip("?")
        p = dict(_TYPES[typ])
        p["description"] = desc
        props[name] = p
        if not optional:
            required.append(name)
    return {"type": "object", "properties": props, "required": required}


def render_tool(name: str, fmt: str) -> dict:
    desc, spec = TOOL_SPECS[name]
    schema = _schema(spec)
    if fmt == "openai_chat":
        return {"type": "function", "function": {"name": name, "description": desc, "parameters": schema}}
    if fmt == "openai_responses":
        return {"type": "function", "name": name, "description": desc, "parameters": schema}
    return {"name": name, "description": desc, "input_schema": schema}


# ---------------------------------------------------------------------------
# 3. Conversation model and rendering
# ---------------------------------------------------------------------------

class Think:
    """Reasoning attached to an assistant turn.

    Rendered as Anthropic ``thinking`` (with ``signature``) and sometimes
    ``redacted_thinking`` blocks, as a Responses ``reasoning`` item, and not
    at all in Chat Completions (which does not return reasoning)."""

    def __init__(self, rng: random.Random, text: str, redacted: str | None, encrypted: bool, empty_summary: bool):
        self.text = text
        self.redacted = redacted  # None, "only" or "plus"
        self.signature = rb64(rng, rng.randint(140, 260))
        self.redacted_data = rb64(rng, rng.randint(180, 320)) if redacted else None
        self.rs_id = "rs_" + rhex(rng, 48)
        self.encrypted = ("gAAAAAB" + rb64url(rng, rng.randint(160, 300))) if encrypted else None
        self.empty_summary = empty_summary


class Call:
    """One tool call and its result."""

    def __init__(self, name: str, arg_str: str, cid: str, fc_id: str | None, output: str, is_error: bool):
        self.name = name
        self.arg_str = arg_str
        self.cid = cid
        self.fc_id = fc_id
        self.output = output
        self.is_error = is_error


class Event:
    def __init__(self, role: str, text: str | None = None, images=(), think: Think | None = None, calls=(),
                 msg_id: str | None = None):
        self.role = role          # "user" or "assistant"
        self.text = text
        self.images = list(images)
        self.think = think
        self.calls = list(calls)
        self.msg_id = msg_id


class Conversation:
    """Abstract events rendered into one of the three request formats.

    ``system`` is a string or a (static, dynamic) pair; it may be reassigned
    between requests (clocks, memory blocks, token budgets).  Options:

    thinking      Anthropic extended thinking (thinking blocks before tool_use)
    reasoning     Responses reasoning items before function calls
    encrypted     Responses reasoning items carry encrypted_content
    redacted_p    probability that an Anthropic turn's thinking is redacted
    sys_role      "system" or "developer" for Chat Completions
    user_items    Responses user input as typed message items
    echo_ids      Responses function_call/message items keep id and status
    result_blocks Anthropic tool_result content as text blocks
    extra         extra top-level body fields (temperature, stream, ...)
    """

    def __init__(self, sc: "Scenario", system, tools, model: str, *, thinking=False, reasoning=False,
                 encrypted=False, redacted_p=0.0, sys_role="system", user_items=False, echo_ids=True,
                 result_blocks=False, extra=None, max_tokens=None, tool_choice=None):
        self.sc = sc
        self.fmt = sc.format
        self.system = system
        self.tools = list(tools)
        self.model = model
        self.thinking = thinking and self.fmt == "anthropic_messages"
        self.reasoning = reasoning and self.fmt == "openai_responses"
        self.encrypted = encrypted
        self.redacted_p = redacted_p
        self.sys_role = sys_role
        self.user_items = user_items
        self.echo_ids = echo_ids
        self.result_blocks = result_blocks
        self.extra = self._sanitize_extra(dict(extra or {}))
        self.max_tokens = max_tokens
        self.tool_choice = tool_choice
        self.events: list[Event] = []
        self.uses_files = False

    def _sanitize_extra(self, extra: dict) -> dict:
        """Keep only body fields the target API accepts, translating JSON modes."""
        fmt = self.fmt
        rf = extra.pop("response_format", None)
        tf = extra.pop("text", None)
        if fmt == "openai_chat":
            if rf is None and tf is not None:
                rf = {"type": tf["format"]["type"]} if tf["format"]["type"] == "json_object" else None
            if rf is not None:
                extra["response_format"] = rf
        elif fmt == "openai_responses":
            extra.pop("stream_options", None)
            if tf is None and rf is not None:
                if rf["type"] == "json_schema":
                    js = rf["json_schema"]
                    tf = {"format": {"type": "json_schema", "name": js["name"], "schema": js["schema"],
                                     "strict": js.get("strict", False)}}
                else:
                    tf = {"format": {"type": rf["type"]}}
            if tf is not None:
                extra["text"] = tf
        else:
            for k in ("stream_options", "parallel_tool_calls"):
                extra.pop(k, None)
            if self.thinking:
                extra.pop("temperature", None)
        return extra

    # -- event construction -------------------------------------------------
    def make_think(self, text: str | None, has_calls: bool) -> Think | None:
        rng = self.sc.rng
        if self.thinking:
            red = None
            if self.redacted_p and rng.random() < self.redacted_p:
                red = rng.choice(["only", "plus"])
            return Think(rng, text or "Deciding the next step.", red, False, False)
        if self.reasoning and (has_calls or text):
            return Think(rng, text or "", None, self.encrypted, not text or rng.random() < 0.15)
        return None

    def new_call(self, name: str, args, output: str, is_error: bool = False, arg_str: str | None = None) -> Call:
        rng = self.sc.rng
        if arg_str is None:
            arg_str = jdump(args)
        json.loads(arg_str)
        if self.fmt == "anthropic_messages":
            return Call(name, arg_str, "toolu_01" + rb62(rng, 22), None, output, is_error)
        fc = "fc_" + rhex(rng, 48) if self.fmt == "openai_responses" else None
        return Call(name, arg_str, "call_" + ralnum(rng, 24), fc, output, is_error)

    def add_user(self, text: str, images=()):
        if any("file_id" in im for im in images):
            self.uses_files = True
        self.events.append(Event("user", text, images))

    def add_assistant(self, text: str | None, think_text: str | None = None, calls=()):
        msg_id = "msg_" + rhex(self.sc.rng, 48) if self.fmt == "openai_responses" else None
        think = self.make_think(think_text, bool(calls))
        self.events.append(Event("assistant", text, (), think, calls, msg_id))

    # -- rendering ----------------------------------------------------------
    def system_text(self) -> str | None:
        if self.system is None:
            return None
        if isinstance(self.system, tuple):
            return "\n\n".join(self.system)
        return self.system

    def render(self) -> dict:
        return {"openai_chat": self._chat, "openai_responses": self._responses,
                "anthropic_messages": self._anthropic}[self.fmt]()

    def _image_part(self, im: dict) -> dict:
        if self.fmt == "openai_chat":
            url = f"data:image/png;base64,{im['png']}" if "png" in im else im["url"]
            part = {"type": "image_url", "image_url": {"url": url}}
            if im.get("detail"):
                part["image_url"]["detail"] = im["detail"]
            return part
        if self.fmt == "openai_responses":
            if "png" in im:
                return {"type": "input_image", "image_url": f"data:image/png;base64,{im['png']}", "detail": im.get("detail", "auto")}
            return {"type": "input_image", "file_id": im["file_id"], "detail": im.get("detail", "auto")}
        if "png" in im:
            return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": im["png"]}}
        return {"type": "image", "source": {"type": "file", "file_id": im["file_id"]}}

    def _chat(self) -> dict:
        msgs = []
        st = self.system_text()
        if st is not None:
            msgs.append({"role": self.sys_role, "content": st})
        for ev in self.events:
            if ev.role == "user":
                if ev.images:
                    content = [{"type": "text", "text": ev.text}] + [self._image_part(im) for im in ev.images]
                else:
                    content = ev.text
                msgs.append({"role": "user", "content": content})
                continue
            m = {"role": "assistant", "content": ev.text}
            if ev.calls:
                m["tool_calls"] = [{"id": c.cid, "type": "function",
                                    "function": {"name": c.name, "arguments": c.arg_str}} for c in ev.calls]
            msgs.append(m)
            for c in ev.calls:
                msgs.append({"role": "tool", "tool_call_id": c.cid, "content": c.output})
        body = {"model": self.model, "messages": msgs}
        if self.tools:
            body["tools"] = [render_tool(t, self.fmt) for t in self.tools]
            if self.tool_choice:
                body["tool_choice"] = self.tool_choice
        body.update(self.extra)
        return body

    def _responses(self) -> dict:
        items = []
        for ev in self.events:
            if ev.role == "user":
                if self.user_items or ev.images:
                    parts = [{"type": "input_text", "text": ev.text}] + [self._image_part(im) for im in ev.images]
                    item = {"type": "message", "role": "user", "content": parts} if self.user_items else {"role": "user", "content": parts}
                else:
                    item = {"role": "user", "content": ev.text}
                items.append(item)
                continue
            if ev.think is not None:
                r = {"type": "reasoning", "id": ev.think.rs_id,
                     "summary": [] if ev.think.empty_summary else [{"type": "summary_text", "text": ev.think.text}]}
                if ev.think.encrypted:
                    r["encrypted_content"] = ev.think.encrypted
                items.append(r)
            if ev.text is not None:
                m = {"type": "message", "role": "assistant",
                     "content": [{"type": "output_text", "text": ev.text, "annotations": []}]}
                if self.echo_ids:
                    m = {"id": ev.msg_id, "type": "message", "status": "completed", "role": "assistant",
                         "content": m["content"]}
                items.append(m)
            for c in ev.calls:
                fc = {"type": "function_call", "call_id": c.cid, "name": c.name, "arguments": c.arg_str}
                if self.echo_ids:
                    fc = {"type": "function_call", "id": c.fc_id, "call_id": c.cid, "name": c.name,
                          "arguments": c.arg_str, "status": "completed"}
                items.append(fc)
            for c in ev.calls:
                items.append({"type": "function_call_output", "call_id": c.cid, "output": c.output})
        body = {"model": self.model}
        st = self.system_text()
        if st is not None:
            body["instructions"] = st
        body["input"] = items
        if self.tools:
            body["tools"] = [render_tool(t, self.fmt) for t in self.tools]
            if self.tool_choice:
                body["tool_choice"] = self.tool_choice
        if self.reasoning:
            body["reasoning"] = {"effort": "medium", "summary": "auto"}
            if self.encrypted:
                body["include"] = ["reasoning.encrypted_content"]
                body["store"] = False
        body.update(self.extra)
        return body

    def _anthropic(self) -> dict:
        msgs: list[dict] = []

        def push(role: str, blocks: list):
            if msgs and msgs[-1]["role"] == role:
                msgs[-1]["content"].extend(blocks)
            else:
                msgs.append({"role": role, "content": list(blocks)})

        for ev in self.events:
            if ev.role == "user":
                push("user", [self._image_part(im) for im in ev.images] + [{"type": "text", "text": ev.text}])
                continue
            blocks = []
            if ev.think is not None:
                if ev.think.redacted:
                    blocks.append({"type": "redacted_thinking", "data": ev.think.redacted_data})
                if ev.think.redacted != "only":
                    blocks.append({"type": "thinking", "thinking": ev.think.text, "signature": ev.think.signature})
            if ev.text is not None:
                blocks.append({"type": "text", "text": ev.text})
            for c in ev.calls:
                blocks.append({"type": "tool_use", "id": c.cid, "name": c.name, "input": json.loads(c.arg_str)})
            push("assistant", blocks)
            if ev.calls:
                results = []
                for c in ev.calls:
                    tr = {"type": "tool_result", "tool_use_id": c.cid,
                          "content": [{"type": "text", "text": c.output}] if self.result_blocks else c.output}
                    if c.is_error:
                        tr["is_error"] = True
                    results.append(tr)
                push("user", results)
        # Plain single-text turns are sent as strings, as most clients do.
        for m in msgs:
            c = m["content"]
            if len(c) == 1 and c[0]["type"] == "text" and not (m["role"] == "assistant" and self.thinking):
                m["content"] = c[0]["text"]
        body = {"model": self.model, "max_tokens": self.max_tokens or (16000 if self.thinking else 4096)}
        if isinstance(self.system, tuple):
            body["system"] = [{"type": "text", "text": self.system[0], "cache_control": {"type": "ephemeral"}},
                              {"type": "text", "text": self.system[1]}]
        elif self.system is not None:
            body["system"] = self.system
        body["messages"] = msgs
        if self.tools:
            body["tools"] = [render_tool(t, self.fmt) for t in self.tools]
            if self.tool_choice:
                body["tool_choice"] = self.tool_choice
        if self.thinking:
            body["thinking"] = {"type": "enabled", "budget_tokens": 8000}
        body.update(self.extra)
        return body


# ---------------------------------------------------------------------------
# 4. Scenario, client identities and the Run driver
# ---------------------------------------------------------------------------

# Client profiles: SDKs send x-stainless-* headers (and retry on 408/409/429/5xx
# up to twice, adding x-stainless-retry-count); plain HTTP clients do not.
UA_PROFILES = {
    "openai-python": {"ua": "OpenAI/Python 1.99.9", "sdk": "openai", "lang": "python", "pkg": "1.99.9",
                      "runtime": "CPython", "rtv": "3.12.4"},
    "openai-python-async": {"ua": "AsyncOpenAI/Python 1.102.0", "sdk": "openai", "lang": "python", "pkg": "1.102.0",
                            "runtime": "CPython", "rtv": "3.11.9", "async": "async:asyncio"},
    "openai-node": {"ua": "OpenAI/JS 5.12.2", "sdk": "openai", "lang": "js", "pkg": "5.12.2",
                    "runtime": "node", "rtv": "v22.11.0"},
    "anthropic-python": {"ua": "Anthropic/Python 0.64.0", "sdk": "anthropic", "lang": "python", "pkg": "0.64.0",
                         "runtime": "CPython", "rtv": "3.12.7"},
    "anthropic-ts": {"ua": "Anthropic/JS 0.60.0", "sdk": "anthropic", "lang": "js", "pkg": "0.60.0",
                     "runtime": "node", "rtv": "v20.18.1"},
    "httpx": {"ua": "python-httpx/0.28.1"},
    "requests": {"ua": "python-requests/2.32.3"},
    "aiohttp": {"ua": "Python/3.12 aiohttp/3.10.11"},
    "curl": {"ua": "curl/8.7.1"},
    "go": {"ua": "Go-http-client/2.0"},
    "axios": {"ua": "axios/1.11.0"},
    "okhttp": {"ua": "okhttp/4.12.0"},
}
SDK_FOR = {"openai_chat": ["openai-python", "openai-python-async", "openai-node"],
           "openai_responses": ["openai-python", "openai-python-async", "openai-node"],
           "anthropic_messages": ["anthropic-python", "anthropic-ts"]}
PLAIN = ["httpx", "requests", "aiohttp", "curl", "go", "axios", "okhttp"]


class Client:
    """One caller: an API key plus a user-agent profile."""

    def __init__(self, sc: "Scenario", key: str, profile: str, zero_header: bool):
        self.sc = sc
        self.key = key
        self.profile = profile
        self.p = UA_PROFILES[profile]
        self.zero_header = zero_header and "sdk" in self.p
        self.os = sc.rng.choice(["Linux", "Linux", "MacOS"])
        self.arch = "arm64" if self.os == "MacOS" else sc.rng.choice(["x64", "x64", "arm64"])

    @property
    def is_sdk(self) -> bool:
        return "sdk" in self.p

    def headers(self, fmt: str, session: str, retry: int | None = None, files: bool = False,
                extra: dict | None = None) -> dict:
        h = {"content-type": "application/json"}
        if fmt == "anthropic_messages":
            h["x-api-key"] = self.key
            h["anthropic-version"] = "2023-06-01"
            if files:
                h["anthropic-beta"] = "files-api-2025-04-14"
        else:
            h["authorization"] = f"Bearer {self.key}"
        h["user-agent"] = self.p["ua"]
        h["accept"] = "application/json"
        if self.is_sdk:
            h["x-stainless-lang"] = self.p["lang"]
            h["x-stainless-package-version"] = self.p["pkg"]
            h["x-stainless-os"] = self.os
            h["x-stainless-arch"] = self.arch
            h["x-stainless-runtime"] = self.p["runtime"]
            h["x-stainless-runtime-version"] = self.p["rtv"]
            if "async" in self.p:
                h["x-stainless-async"] = self.p["async"]
            if retry is not None:
                h["x-stainless-retry-count"] = str(retry)
            elif self.zero_header:
                h["x-stainless-retry-count"] = "0"
        h["x-session-id"] = session
        if extra:
            h.update(extra)
        return h


class Scenario:
    """One labelled scenario: envelope fields plus the recorded requests."""

    def __init__(self, label: str, kind: str, index: int, fmt: str):
        self.label = label
        self.kind = kind
        self.index = index
        self.format = fmt
        self.id = f"{label}-{kind}-{index:02d}"
        self.rng = random.Random(f"{SEED}:{self.id}")
        self.clock = Clock(self.rng)
        self.description = ""
        self.tags: list[str] = []
        self.requests: list[dict] = []
        self.keys: list[str] = []
        self.occ_requests: list[int] = []   # 1-based request index first carrying each loop occurrence
        self.loop_sig: tuple | None = None  # (tool name, canonical args) of a tool loop, when strict
        self.loop_turn: int | None = None
        self._session_style = self.rng.choice(["uuid", "sess", "run", "thr"])

    # identities
    def new_key(self, tag: str = "") -> str:
        key = f"sk-heldout-{self.id}-{tag + '-' if tag else ''}{rhex(self.rng, 20)}"
        self.keys.append(key)
        return key

    def client(self, profile: str | None = None, sdk: bool | None = None, tag: str = "") -> Client:
        if profile is None:
            if sdk is None:
                sdk = self.rng.random() < 0.75
            profile = self.rng.choice(SDK_FOR[self.format] if sdk else PLAIN)
        # The Python SDKs send x-stainless-retry-count: 0 on first attempts; the JS profiles here omit it.
        return Client(self, self.new_key(tag), profile, UA_PROFILES[profile].get("lang") == "python")

    def new_session(self) -> str:
        s = self._session_style
        if s == "uuid":
            return ruuid(self.rng)
        if s == "sess":
            return "sess_" + rhex(self.rng, 24)
        if s == "run":
            return "agent-run-" + rulid(self.rng).lower()
        return "thr_" + ralnum(self.rng, 20)

    def model(self, want_thinking: bool = False, choices=None) -> str:
        opts = list(choices or MODELS[self.format])
        if want_thinking and self.format == "anthropic_messages":
            opts = [m for m in opts if m in THINKING_MODELS]
        if want_thinking and self.format == "openai_responses":
            opts = [m for m in opts if m in REASONING_MODELS]
        return self.rng.choice(opts)

    def conv(self, system, tools, model: str | None = None, **kw) -> Conversation:
        if model is None:
            model = self.model(kw.get("thinking") or kw.get("reasoning"))
        if self.format == "openai_chat" and "sys_role" not in kw and model.startswith(("o3", "o4", "gpt-5")):
            kw["sys_role"] = self.rng.choice(["system", "developer"])
        if self.format == "anthropic_messages" and model not in THINKING_MODELS:
            kw["thinking"] = False
        if self.format == "openai_responses" and model not in REASONING_MODELS:
            kw["reasoning"] = False
        return Conversation(self, system, tools, model, **kw)

    def image(self, detail: str | None = None) -> dict:
        """A user-attached image, inline PNG."""
        im = {"png": tiny_png(self.rng, self.rng.randint(8, 16), self.rng.randint(6, 12))}
        if detail:
            im["detail"] = detail
        return im

    def image_ref(self, name: str) -> dict:
        """A user-attached image by reference: a file id (Responses, Anthropic) or URL (Chat)."""
        if self.format == "openai_responses":
            return {"file_id": openai_file_id(self.rng)}
        if self.format == "anthropic_messages":
            return {"file_id": anthropic_file_id(self.rng)}
        return {"url": f"https://uploads.assetbay.net/{rhex(self.rng, 12)}/{name}", "detail": "high"}

    def add_request(self, client: Client, session: str, body: dict, status: int | None = None,
                    retry: int | None = None, files: bool = False, extra_headers: dict | None = None) -> int:
        req = {"method": "POST", "path": PATHS[self.format],
               "headers": client.headers(self.format, session, retry, files, extra_headers),
               "body": body}
        if status is not None and status != 200:
            req["response"] = {"status": status}
        self.requests.append(req)
        return len(self.requests)

    def mark_occurrence(self, req_index: int):
        self.occ_requests.append(req_index)


class Dead(Exception):
    """The client gave up after its SDK retries; the conversation ends."""


class Run:
    """Drives one conversation: each user turn and each tool round trip sends a request.

    ``occ=True`` marks a loop occurrence; the scenario's loop_turn is derived
    from these markers (the request first carrying the third occurrence).
    ``errors=[...]`` makes the provider answer the request with those statuses
    first; the SDK resends the identical body with x-stainless-retry-count
    1, 2 until a 200 (or gives up after three failed attempts)."""

    def __init__(self, sc: Scenario, conv: Conversation, client: Client | None = None, session: str | None = None):
        self.sc = sc
        self.conv = conv
        self.client = client or sc.client()
        self.session = session or sc.new_session()
        self.pending_occ = 0
        self.hook = None   # called before each new request (not before SDK resends)
        self.sent = 0      # new requests sent by this run (resends excluded)

    def send(self, occ: bool = False, errors=(), extra_headers: dict | None = None) -> int:
        if self.hook:
            self.hook(self)
        self.sent += 1
        body = self.conv.render()
        files = self.conv.uses_files
        statuses = list(errors)
        idx = self.sc.add_request(self.client, self.session, body, statuses[0] if statuses else None,
                                  None, files, extra_headers)
        for attempt in range(1, len(statuses) + 1):
            if attempt > 2:
                raise Dead()
            st = statuses[attempt] if attempt < len(statuses) else None
            idx = self.sc.add_request(self.client, self.session, self.conv.render(), st, attempt, files, extra_headers)
        if len(statuses) >= 3:
            raise Dead()
        first = idx - len(statuses)
        for _ in range(self.pending_occ):
            self.sc.mark_occurrence(first)
        self.pending_occ = 0
        if occ:
            self.sc.mark_occurrence(first)
        return idx

    def user(self, text: str, images=(), send: bool = True, occ: bool = False, errors=()) -> int | None:
        self.conv.add_user(text, images)
        if send:
            return self.send(occ=occ, errors=errors)
        return None

    def say(self, text: str, think: str | None = None, occ: bool = False):
        """An assistant answer; it reaches the wire with the next request."""
        self.conv.add_assistant(text, think)
        if occ:
            self.pending_occ += 1

    def call(self, name: str, args, output: str, error: bool = False, think: str | None = None,
             text: str | None = None, occ: bool = False, arg_str: str | None = None, errors=()) -> int:
        c = self.conv.new_call(name, args, output, error, arg_str)
        self.conv.add_assistant(text, think, [c])
        return self.send(occ=occ, errors=errors)

    def calls(self, items, think: str | None = None, text: str | None = None, occ: bool = False, errors=()) -> int:
        cs = []
        for it in items:
            name, args, output = it[0], it[1], it[2]
            err = it[3] if len(it) > 3 else False
            cs.append(self.conv.new_call(name, args, output, err))
        self.conv.add_assistant(text, think, cs)
        return self.send(occ=occ, errors=errors)


# ---------------------------------------------------------------------------
# 5. Text pools shared by builders
# ---------------------------------------------------------------------------

# Short visible texts an agent writes next to a retried tool call.
SAY_RETRY = {
    "en": ["Retrying.", "That failed; trying again.", "Let me try that once more.", "Still erroring, another attempt.",
           "Trying the same call again.", "One more try.", "The service errored again, retrying.", "Retrying the request.",
           "Hm, same failure. Trying again."],
    "de": ["Ich versuche es erneut.", "Der Aufruf ist fehlgeschlagen, neuer Versuch.", "Noch ein Versuch.",
           "Das Gateway antwortet nicht, ich probiere es noch einmal.", "Erneuter Versuch mit denselben Daten.",
           "Ich wiederhole die Buchung.", "Weiterer Versuch.", "Ich versuche die Buchung nochmals.", "Nochmal."],
    "ja": ["もう一度試します。", "再試行します。", "エラーが続いているため、再度申請します。", "もう一度だけ試してみます。",
           "同じ内容で再送信します。", "再度実行します。", "引き続き再試行します。", "もう一度申請を送ります。", "再送します。"],
    "fr": ["Je réessaie.", "Nouvel essai.", "Le service n'a pas répondu, je relance.", "Encore une tentative.",
           "Je retente la réservation.", "Je relance la même demande.", "Une tentative de plus.",
           "Je réessaie la réservation.", "Je relance."],
    "zh": ["我再试一次。", "重新同步。", "仍然超时，再试一次。", "再尝试同步一次。", "继续重试。", "我重新发起同步。",
           "再试一遍。", "重试同步。", "再同步一次看看。"],
    "es": ["Lo intento de nuevo.", "Reintentando.", "Vuelvo a consultar.", "Otro intento.",
           "Pruebo otra vez con los mismos datos.", "Consulto de nuevo la tarifa.", "Un intento más.",
           "Reintento la consulta.", "Vuelvo a probar."],
}

# Reasoning an agent writes (Anthropic thinking / Responses summaries) while retrying.
THINK_RETRY = [
    "The tool returned an error. It looks transient, so retrying with the same parameters is reasonable.",
    "Another failure from the backend. Nothing about my inputs seems wrong; I'll retry.",
    "Still failing. Perhaps the service needs a moment. Retry the same call.",
    "The error persists, but the request itself is valid. Trying again.",
    "Retrying once more; the previous attempt errored server-side.",
    "Same class of error. I'll attempt the call again before reporting back.",
    "I should get this done for the user; one more attempt with identical arguments.",
    "The failure is on the service side. Try again.",
    "Let me try again, the user is waiting on this.",
]
THINK_RERUN = [
    "The failure might be flaky. Re-run the suite to confirm.",
    "Let me run the tests again; timing-dependent tests sometimes fail spuriously.",
    "Re-running to see whether the failure reproduces.",
    "It failed again. One more run before I dig in.",
    "Maybe a stale cache. Run it again.",
    "Run again to double-check the result.",
    "I'll rerun the command and compare.",
    "Perhaps it passes this time. Rerun.",
]
THINK_PAGE = [
    "Fetch the next page of results.", "Continue with the next page.", "Get more results using the cursor.",
    "There are more results; request the following page.", "Keep paging until the list is complete.",
    "Next page.", "Request the next batch.", "Continue listing.",
]


def pick_cycle(seq, k):
    return seq[k % len(seq)]


def play(r: Run, steps):
    """Execute scripted productive steps.

    ("user", text[, images])   a user turn (sends)
    ("say", text)              an assistant answer (sent with the next request)
    ("call", name, args, output[, think[, text]])
    ("par", [(name, args, output), ...][, think])  parallel calls in one turn
    """
    for st in steps:
        op = st[0]
        if op == "user":
            r.user(st[1], st[2] if len(st) > 2 else ())
        elif op == "say":
            r.say(st[1])
        elif op == "call":
            r.call(st[1], st[2], st[3], think=st[4] if len(st) > 4 else None, text=st[5] if len(st) > 5 else None)
        elif op == "par":
            r.calls(st[1], think=st[2] if len(st) > 2 else None)
        else:
            raise ValueError(op)


def tool_loop(sc: Scenario, spec: dict) -> Run:
    """A conversation that opens with productive steps and then repeats one
    tool call (or one set of parallel calls) with the same arguments.

    spec: system, tools, user, images?, prelude?, name, args, out(k), n,
    error?, lang?, say_p?, thinks?, conv?, hook?, par? (list of (name, args,
    out(k, j)) for a repeated parallel batch), strict? (default True).
    """
    conv = sc.conv(spec["system"], spec["tools"], **spec.get("conv", {}))
    r = Run(sc, conv, sc.client(spec.get("profile")))
    if spec.get("hook"):
        r.hook = spec["hook"]
    r.user(spec["user"], spec.get("images", ()))
    play(r, spec.get("prelude", ()))
    lang = spec.get("lang", "en")
    thinks = spec.get("thinks", THINK_RETRY)
    says = spec.get("says", SAY_RETRY.get(lang, SAY_RETRY["en"]))
    say_p = spec.get("say_p", 0.4)
    # Scenario-specific pools are written in order; shared pools start anywhere.
    t_off = 0 if "thinks" in spec else sc.rng.randrange(len(thinks))
    s_off = -1 if "says" in spec else sc.rng.randrange(len(says))
    for k in range(spec["n"]):
        text = pick_cycle(says, k + s_off) if k and sc.rng.random() < say_p else None
        think = pick_cycle(thinks, k + t_off)
        if spec.get("par"):
            items = [(nm, a, fn(k, j), spec.get("error", False)) for j, (nm, a, fn) in enumerate(spec["par"])]
            r.calls(items, think=think, text=text, occ=True)
        else:
            r.call(spec["name"], spec["args"], spec["out"](k), error=spec.get("error", False),
                   think=think, text=text, occ=True)
    if spec.get("strict", True):
        nm, a = (spec["par"][0][0], spec["par"][0][1]) if spec.get("par") else (spec["name"], spec["args"])
        sc.loop_sig = (nm, canon_args(jdump(a)))
    return r


def text_table(rows, header=None) -> str:
    rows = ([header] if header else []) + rows
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# ---------------------------------------------------------------------------
# 6. Loop builders
# ---------------------------------------------------------------------------

# 6.1 failing_tool_fresh_ids ------------------------------------------------

JAVA_FRAMES = """\tat com.acme.inventory.ledger.LedgerLock.acquire(LedgerLock.java:88)
\tat com.acme.inventory.ledger.ReservationLedger.withLock(ReservationLedger.java:141)
\tat com.acme.inventory.ledger.ReservationLedger.available(ReservationLedger.java:97)
\tat com.acme.inventory.api.StockController.stock(StockController.java:54)
\tat java.base/jdk.internal.reflect.DirectMethodHandleAccessor.invoke(DirectMethodHandleAccessor.java:103)
\tat java.base/java.lang.reflect.Method.invoke(Method.java:580)
\tat org.springframework.web.method.support.InvocableHandlerMethod.doInvoke(InvocableHandlerMethod.java:255)
\tat org.springframework.web.method.support.InvocableHandlerMethod.invokeForRequest(InvocableHandlerMethod.java:188)
\tat org.springframework.web.servlet.mvc.method.annotation.ServletInvocableHandlerMethod.invokeAndHandle(ServletInvocableHandlerMethod.java:118)
\tat org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerAdapter.invokeHandlerMethod(RequestMappingHandlerAdapter.java:926)
\tat org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerAdapter.handleInternal(RequestMappingHandlerAdapter.java:831)
\tat org.springframework.web.servlet.DispatcherServlet.doDispatch(DispatcherServlet.java:1089)
\tat org.springframework.web.servlet.DispatcherServlet.doService(DispatcherServlet.java:979)
\tat org.springframework.web.servlet.FrameworkServlet.processRequest(FrameworkServlet.java:1014)
\tat org.springframework.web.servlet.FrameworkServlet.doGet(FrameworkServlet.java:903)
\tat jakarta.servlet.http.HttpServlet.service(HttpServlet.java:564)
\tat org.springframework.web.filter.OncePerRequestFilter.doFilter(OncePerRequestFilter.java:116)
\tat org.apache.catalina.core.ApplicationFilterChain.internalDoFilter(ApplicationFilterChain.java:174)
\tat org.apache.catalina.core.ApplicationFilterChain.doFilter(ApplicationFilterChain.java:149)
\tat io.micrometer.tracing.brave.bridge.BraveTracingFilter.doFilter(BraveTracingFilter.java:76)
\tat org.apache.catalina.core.StandardWrapperValve.invoke(StandardWrapperValve.java:167)
\tat org.apache.catalina.core.StandardContextValve.invoke(StandardContextValve.java:90)
\tat org.apache.catalina.connector.CoyoteAdapter.service(CoyoteAdapter.java:340)
\tat org.apache.coyote.http11.Http11Processor.service(Http11Processor.java:391)
\tat org.apache.tomcat.util.net.NioEndpoint$SocketProcessor.doRun(NioEndpoint.java:1736)
\tat java.base/java.lang.Thread.run(Thread.java:1583)
Caused by: org.postgresql.util.PSQLException: ERROR: could not obtain lock on row in relation "reservation_ledger"
  Where: SQL statement "SELECT 1 FROM reservation_ledger WHERE sku = $1 FOR UPDATE NOWAIT"
\tat org.postgresql.core.v3.QueryExecutorImpl.receiveErrorResponse(QueryExecutorImpl.java:2725)
\tat org.postgresql.core.v3.QueryExecutorImpl.processResults(QueryExecutorImpl.java:2412)
\tat org.postgresql.jdbc.PgPreparedStatement.executeWithFlags(PgPreparedStatement.java:152)
\tat com.zaxxer.hikari.pool.HikariProxyPreparedStatement.executeQuery(HikariProxyPreparedStatement.java)
\tat com.acme.inventory.ledger.LedgerLock.acquire(LedgerLock.java:81)
\t... 25 common frames omitted"""

PY_TRACE = """Traceback (most recent call last):
  File "/srv/reports/.venv/lib/python3.11/site-packages/reportkit/worker.py", line 212, in run_job
    pdf = renderer.render(template, context)
  File "/srv/reports/.venv/lib/python3.11/site-packages/reportkit/render.py", line 88, in render
    html = self._jinja.get_template(name).render(**context)
  File "/srv/reports/.venv/lib/python3.11/site-packages/jinja2/environment.py", line 1304, in render
    self.environment.handle_exception()
  File "/srv/reports/.venv/lib/python3.11/site-packages/jinja2/environment.py", line 939, in handle_exception
    raise rewrite_traceback_stack(source=source)
  File "/srv/reports/templates/quarterly_board.html.j2", line 57, in top-level template code
    {% for region in regions|sort(attribute='revenue', reverse=True) %}
  File "/srv/reports/.venv/lib/python3.11/site-packages/jinja2/filters.py", line 441, in sync_do_sort
    return sorted(value, key=key_func, reverse=reverse)
TypeError: '<' not supported between instances of 'NoneType' and 'Decimal'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/srv/reports/.venv/lib/python3.11/site-packages/reportkit/worker.py", line 219, in run_job
    self._cleanup(workdir)
  File "/srv/reports/.venv/lib/python3.11/site-packages/reportkit/worker.py", line 301, in _cleanup
    shutil.rmtree(workdir)
  File "/usr/lib/python3.11/shutil.py", line 738, in rmtree
    onerror(os.rmdir, path, sys.exc_info())
OSError: [Errno 39] Directory not empty: '{tmp}'"""


def fail_refund(sc: Scenario):
    rng = sc.rng
    ch1, ch2 = "ch_3Pz" + rb62(rng, 18), "ch_3Pz" + rb62(rng, 18)
    orders = [{"order": "LO-88214", "charges": [
        {"id": ch1, "amount": 4200, "currency": "eur", "created": "2027-03-02T09:14:22Z", "status": "succeeded"},
        {"id": ch2, "amount": 4200, "currency": "eur", "created": "2027-03-02T09:14:25Z", "status": "succeeded"}]}]
    spec = {
        "system": "You are the refunds assistant for Lumen Outdoor. Verify the customer, find the duplicate "
                  "charge and refund it. Never refund more than the duplicated amount.",
        "tools": ["lookup_customer_account", "find_order_by_email", "refund_charge", "reply_to_customer"],
        "user": "Customer maria.keller@example.org says she was charged twice for order LO-88214 (42,00 EUR). "
                "Please refund the duplicate and tell me when it's done.",
        "prelude": [
            ("call", "lookup_customer_account", {"email": "maria.keller@example.org"},
             jdump({"account_id": "acct_7HqP2mLx", "name": "Maria Keller", "country": "DE", "currency": "EUR",
                    "since": "2024-06-02"}), "Verify the account first."),
            ("call", "find_order_by_email", {"email": "maria.keller@example.org", "limit": 3}, jdump(orders),
             "Two identical charges three seconds apart; the second one is the duplicate."),
        ],
        "name": "refund_charge", "args": {"charge_id": ch2, "amount": 4200},
        "out": lambda k: jdump({"error": {"type": "api_error", "code": "refund_processing_failed",
                                          "message": "An unknown error occurred while processing the refund. Please retry.",
                                          "request_id": "req_" + rb62(rng, 14), "idempotency_key": ruuid(rng)}}),
        "n": 7, "error": True, "conv": {"thinking": True, "redacted_p": 0.2, "reasoning": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A refunds agent retries the same refund_charge call seven times; every error carries a fresh "
                      "req_ id and idempotency UUID.")


def fail_scale(sc: Scenario):
    rng = sc.rng
    table = text_table([["cart-api", "3/3", "3", "3", "41d"], ["cart-worker", "2/2", "2", "2", "41d"],
                        ["pricing", "4/4", "4", "4", "12d"]], ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"])

    def out(k):
        return ('Error from server (InternalError): Internal error occurred: failed calling webhook '
                '"vpa-admission.k8s.io": failed to call webhook: Post '
                '"https://vpa-webhook.kube-system.svc:443/?timeout=10s": context deadline exceeded\n'
                f"audit-id: {ruuid(rng)}\ntrace-id: {rhex(rng, 32)}\nwebhook-pod: vpa-admission-{rhex(rng, 10)}-{rb62(rng, 5).lower()}")
    spec = {
        "system": "You are an SRE assistant with access to the production Kubernetes cluster (read + scale only).",
        "tools": ["kubectl_get", "scale_deployment", "post_chat_message"],
        "user": "Traffic on checkout is ramping for the spring sale. Scale cart-api in namespace checkout to 6 "
                "replicas and confirm in #sre-sale when done.",
        "prelude": [("call", "kubectl_get", {"resource": "deployments", "namespace": "checkout"}, table,
                     "Check the current replica counts.")],
        "name": "scale_deployment", "args": {"namespace": "checkout", "name": "cart-api", "replicas": 6},
        "out": out, "n": 7, "error": True, "conv": {"reasoning": True, "encrypted": True},
    }
    tool_loop(sc, spec)
    sc.description = ("An SRE agent calls scale_deployment seven times with the same arguments while an admission "
                      "webhook times out, each error with a fresh audit id, trace id and pod suffix.")


def fail_erp_de(sc: Scenario):
    rng = sc.rng
    sheet = text_table([["Pos", "Material", "Menge", "Einheit"], ["10", "Kupferrohr 15x1 mm", "120", "m"],
                        ["20", "Pressfitting Bogen 90° 15 mm", "80", "St"], ["30", "Kugelhahn DN15", "24", "St"]])
    spec = {
        "system": "Du bist der Einkaufsassistent der Müller Haustechnik GmbH. Du buchst Wareneingänge im ERP "
                  "und antwortest immer auf Deutsch.",
        "tools": ["read_sheet_range", "post_goods_receipt", "dispatch_email"],
        "user": "Die Lieferung zur Bestellung 4500012873 ist heute vollständig angekommen, Lieferschein 88123. "
                "Bitte den Wareneingang buchen.",
        "prelude": [("call", "read_sheet_range", {"sheet": "Lieferschein 88123", "range": "A1:D4"}, sheet,
                     "Read the delivery note lines first.", "Ich lese zuerst den Lieferschein.")],
        "name": "post_goods_receipt",
        "args": {"po": "4500012873", "lines": [{"pos": 10, "qty": 120, "uom": "m"}, {"pos": 20, "qty": 80, "uom": "St"},
                                               {"pos": 30, "qty": 24, "uom": "St"}]},
        "out": lambda k: ("Fehler 503 (Service Unavailable): Das ERP-Gateway hat die Buchung nicht angenommen.\n"
                          f"Vorgangs-ID: {rhex(rng, 8)}\nKorrelations-ID: {rb64url(rng, 18)}\n"
                          "Bitte versuchen Sie es später erneut."),
        "n": 8, "error": True, "lang": "de", "say_p": 0.8,
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("A German purchasing agent posts the same goods receipt eight times against a failing ERP "
                      "gateway whose German errors carry a fresh 8-hex Vorgangs-ID and a correlation token.")


def fail_expense_ja(sc: Scenario):
    rng = sc.rng
    sheet = text_table([["日付", "区分", "金額", "備考"], ["3/03", "新幹線 東京-大阪", "14,720", "往路"],
                        ["3/03", "宿泊 大阪", "12,800", "1泊"], ["3/04", "新幹線 大阪-東京", "14,720", "復路"],
                        ["3/04", "会食", "8,400", "取引先2名"]])
    spec = {
        "system": "あなたは株式会社ブルーピークの経費精算アシスタントです。日本語で丁寧に回答してください。",
        "tools": ["read_sheet_range", "submit_expense_report"],
        "user": "3月の大阪出張の経費レポート EXP-2027-0311 を確認して、承認申請まで進めてください。",
        "prelude": [("call", "read_sheet_range", {"sheet": "EXP-2027-0311", "range": "A1:D5"}, sheet,
                     "Review the report lines before submitting.", "まず明細を確認します。"),
                    ],
        "name": "submit_expense_report", "args": {"report_id": "EXP-2027-0311"},
        "out": lambda k: ("エラー: 承認ワークフローAPIが応答しませんでした（コード WF-5004）。\n"
                          f"リクエストID: {rulid(rng)}\nセッショントークン: {rb64url(rng, 15)}\n"
                          "時間をおいて再試行してください。"),
        "n": 7, "error": True, "lang": "ja", "say_p": 0.7, "conv": {"thinking": True},
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("A Japanese expense assistant resubmits the same report seven times; each workflow error has "
                      "a fresh ULID request id and session token.")


def fail_java_trace(sc: Scenario):
    rng = sc.rng

    def out(k):
        return (f"HTTP 500 from inventory-svc (GET /v2/stock/TRK-2291-BLK?warehouse=DUS1)\n"
                f"X-B3-TraceId: {rhex(rng, 16)}\nX-B3-SpanId: {rhex(rng, 16)}\n\n"
                f"java.lang.IllegalStateException: Reservation ledger is locked "
                f"(holder=inventory-ledger-7c9d6f5b8-{rb62(rng, 5).lower()}, lock=ReservationLock@{rhex(rng, 8)})\n"
                + JAVA_FRAMES)
    spec = {
        "system": "You are a fulfilment assistant. Use the inventory service to check stock before promising dates.",
        "tools": ["call_inventory_service", "get_sku", "reply_to_customer"],
        "user": "Can we ship 40 units of TRK-2291-BLK from Düsseldorf by Friday? Customer case 55102 is waiting.",
        "prelude": [("call", "get_sku", {"sku": "TRK-2291-BLK"},
                     jdump({"sku": "TRK-2291-BLK", "title": "Trekking pole, carbon, black", "warehouses": ["DUS1", "LEJ2"],
                            "lead_time_days": 2}), "Confirm the SKU and which warehouses stock it.")],
        "name": "call_inventory_service", "args": {"sku": "TRK-2291-BLK", "warehouse": "DUS1"},
        "out": out, "n": 6, "error": True,
    }
    tool_loop(sc, spec)
    sc.description = ("A fulfilment agent calls the inventory service six times and gets the same 3 KB Java stack "
                      "trace, differing only in B3 trace/span ids, a pod suffix and a lock hash.")


def fail_py_trace(sc: Scenario):
    rng = sc.rng

    def out(k):
        return (f"render failed (job {ruuid(rng)})\n\n" + PY_TRACE.replace("{tmp}", f"/tmp/reportkit-{ralnum(rng, 8).lower()}"))
    spec = {
        "system": "You are the finance reporting assistant. Produce board reports on request.",
        "tools": ["render_pdf_report", "execute_query", "dispatch_email"],
        "user": "Render the quarterly board report for 2027-Q1 and e-mail it to cfo@harbor-freight.example.",
        "prelude": [("call", "execute_query",
                     {"sql": "SELECT region, SUM(revenue) FROM finance.revenue_by_region WHERE quarter = '2027-Q1' GROUP BY 1"},
                     text_table([["EMEA", "4812300.00"], ["NA", "7120455.50"], ["APAC", "2210980.25"], ["LATAM", None]],
                                ["region", "sum"]), "Sanity-check the numbers first.")],
        "name": "render_pdf_report", "args": {"template": "quarterly_board", "period": "2027-Q1"},
        "out": out, "n": 6, "error": True, "conv": {"thinking": True, "result_blocks": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A reporting agent re-renders the same PDF six times; the 2 KB Python traceback differs only "
                      "in the job UUID and a random temp-directory name.")


def fail_geocode_parallel(sc: Scenario):
    rng = sc.rng
    addrs = ["Calle de Alcalá 48, 28014 Madrid", "Passeig de Gràcia 92, 08008 Barcelona"]

    def fn(k, j):
        return jdump({"status": "OVER_QUERY_LIMIT", "error_message": "You have exceeded your daily request quota for this API.",
                      "error_id": rhex(rng, 8), "trace_token": rb64url(rng, 12)})
    spec = {
        "system": "You plan delivery routes. Geocode addresses before computing distances.",
        "tools": ["geocode_address", "carrier_rate_quote"],
        "user": "Geocode our two showroom addresses and tell me the straight-line distance between them.",
        "par": [("geocode_address", {"address": addrs[0]}, fn), ("geocode_address", {"address": addrs[1]}, fn)],
        "n": 6, "error": True, "conv": {"extra": {"parallel_tool_calls": True}},
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("A routing agent sends the same two parallel geocode calls six times; every quota error has a "
                      "fresh short hex error_id and trace token.")


def fail_s3(sc: Scenario):
    rng = sc.rng
    spec = {
        "system": "You are a release assistant for the mobile team. Publish build artifacts and post the links.",
        "tools": ["list_dir", "upload_artifact", "post_chat_message"],
        "user": "Upload the 4.18.0 Android bundle to the release bucket and share the link in #mobile-release.",
        "prelude": [("call", "list_dir", {"path": "build/outputs/bundle/release"},
                     "app-release.aab  41.8 MB\nmapping.txt  12.1 MB\noutput-metadata.json  0.4 KB",
                     "Find the artifact path.")],
        "name": "upload_artifact",
        "args": {"bucket": "acme-mobile-releases", "key": "android/4.18.0/app-release.aab",
                 "path": "build/outputs/bundle/release/app-release.aab"},
        "out": lambda k: ("An error occurred (AccessDenied) when calling the PutObject operation: Access Denied\n"
                          f"RequestId: {rHEX(rng, 16)}\nHostId: {rb64(rng, 57)}"),
        "n": 7, "error": True, "conv": {"reasoning": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A release agent retries the same S3 upload seven times; each AccessDenied error carries a "
                      "fresh RequestId and base64 HostId.")


def fail_booking_fr(sc: Scenario):
    rng = sc.rng
    spec = {
        "system": "Tu es l'assistant de conciergerie de l'hôtel Lumière à Lyon. Réponds toujours en français.",
        "tools": ["book_restaurant_table", "search_help_center"],
        "user": "Bonsoir, pouvez-vous réserver une table pour quatre personnes chez Les Halles de Saône samedi 20 mars à 20h ?",
        "prelude": [("call", "search_help_center", {"query": "Les Halles de Saône réservation", "locale": "fr-FR"},
                     jdump([{"title": "Les Halles de Saône", "restaurant_id": "rst_lyon_0412", "reservable": True}]),
                     "Find the restaurant id.", "Je recherche le restaurant.")],
        "name": "book_restaurant_table",
        "args": {"restaurant_id": "rst_lyon_0412", "date": "2027-03-20", "time": "20:00", "party_size": 4},
        "out": lambda k: ("Erreur 502 Bad Gateway : le service de réservation n'a pas répondu.\n"
                          f"Identifiant de requête : {ruuid(rng)}\nRay ID : {rhex(rng, 16)}-CDG\n"
                          f"Jeton de session : {ralnum(rng, 22)}"),
        "n": 7, "error": True, "lang": "fr", "say_p": 0.7, "conv": {"thinking": True, "redacted_p": 0.3},
    }
    tool_loop(sc, spec)
    sc.description = ("A French hotel concierge agent retries the same table booking seven times; each 502 error "
                      "has a fresh request UUID, Ray ID and session token.")


# 6.2 timing_only_change ----------------------------------------------------

def _pytest_center(text: str) -> str:
    text = f" {text} "
    left = (80 - len(text)) // 2
    return "=" * left + text + "=" * (80 - len(text) - left)


PYTEST_FAIL_BODY = """============================= test session starts ==============================
platform linux -- Python 3.11.9, pytest-8.3.4, pluggy-1.5.0
rootdir: /workspace/ledgerly
configfile: pyproject.toml
plugins: cov-5.0.0, xdist-3.6.1
collected 42 items

tests/test_tax.py .................F........................            [100%]

=================================== FAILURES ===================================
_________________________ test_reverse_charge_rounding _________________________

    def test_reverse_charge_rounding():
        inv = Invoice(lines=[Line(net=Decimal("19.99"), qty=3, vat_rate=Decimal("0.19"))],
                      reverse_charge=True, seller_country="DE", buyer_country="AT")
>       assert inv.totals() == Totals(net=Decimal("59.97"), vat=Decimal("0.00"), gross=Decimal("59.97"))
E       AssertionError: assert Totals(net=Decimal('59.97'), vat=Decimal('11.39'), gross=Decimal('71.36')) == Totals(net=Decimal('59.97'), vat=Decimal('0.00'), gross=Decimal('59.97'))
E
E         Full diff:
E         - Totals(net=Decimal('59.97'), vat=Decimal('0.00'), gross=Decimal('59.97'))
E         ?                                        ^ ^^                        ^^^^
E         + Totals(net=Decimal('59.97'), vat=Decimal('11.39'), gross=Decimal('71.36'))
E         ?                                        ^^ ^^                        ^^^^

tests/test_tax.py:211: AssertionError
=========================== short test summary info ============================
FAILED tests/test_tax.py::test_reverse_charge_rounding - AssertionError: assert Totals(net=Decimal('59.97'), vat=Decimal('11.39'), ...
"""


def time_pytest(sc: Scenario):
    rng = sc.rng

    def out(k):
        return PYTEST_FAIL_BODY + _pytest_center(f"1 failed, 41 passed in {rng.uniform(2.6, 3.9):.2f}s")
    src = ('    def totals(self) -> Totals:\n        net = sum(l.net * l.qty for l in self.lines)\n'
           '        vat = sum(l.net * l.qty * l.vat_rate for l in self.lines)\n'
           '        if self.reverse_charge and self.seller_country == self.buyer_country:\n'
           '            vat = Decimal("0.00")\n        return Totals(net=net, vat=vat.quantize(CENT), gross=(net + vat).quantize(CENT))')
    spec = {
        "system": "You are a coding agent working in /workspace/ledgerly. Make the failing tax test pass without "
                  "breaking others. Run tests after each change.",
        "tools": ["open_source_file", "edit_source", "exec_tests", "grep_repo"],
        "user": "test_reverse_charge_rounding started failing after yesterday's refactor. Fix it please.",
        "prelude": [
            ("call", "open_source_file", {"path": "ledgerly/invoice.py", "start": 120, "end": 126}, src,
             "Look at Invoice.totals."),
            ("call", "edit_source", {"path": "ledgerly/invoice.py", "old": "vat = sum(l.net * l.qty * l.vat_rate for l in self.lines)",
                                     "new": "vat = sum((l.net * l.qty * l.vat_rate for l in self.lines), Decimal(\"0\"))"},
             "Applied 1 replacement in ledgerly/invoice.py (line 122).", "Make the sum start from a Decimal."),
        ],
        "name": "exec_tests", "args": {"cmd": "pytest tests/test_tax.py -q -p no:cacheprovider"},
        "out": out, "n": 7, "thinks": THINK_RERUN,
        "says": ["Running the tests.", "Let me rerun; it may be flaky.", "Rerunning.", "Once more.",
                 "Trying the suite again.", "Re-running to confirm.", "Run again."],
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("A coding agent reruns the same pytest command seven times without editing; the 2 KB failure "
                      "output differs only in the run duration.")


DOC_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Bulk Import API · Parcelwise Docs</title>
<link rel="stylesheet" href="/assets/docs.7d1e2c.css"></head>
<body><nav class="sidebar"><ul><li><a href="/docs/api/auth">Authentication</a></li><li><a href="/docs/api/shipments">Shipments</a></li>
<li class="active"><a href="/docs/api/bulk-import">Bulk import</a></li><li><a href="/docs/api/webhooks">Webhooks</a></li>
<li><a href="/docs/api/errors">Errors</a></li></ul></nav>
<main><h1>Bulk import</h1>
<p>Use <code>POST /v3/imports</code> to create up to 10,000 shipments from a single CSV or JSON Lines file.
Imports run asynchronously; poll <code>GET /v3/imports/{id}</code> or subscribe to the <code>import.completed</code> webhook.</p>
<h2>Request</h2>
<pre><code>curl https://api.parcelwise.example/v3/imports \\
  -H "Authorization: Bearer $PW_KEY" \\
  -F file=@shipments.jsonl \\
  -F format=jsonl \\
  -F dry_run=false</code></pre>
<h2>File format</h2>
<table><tr><th>Field</th><th>Type</th><th>Notes</th></tr>
<tr><td>reference</td><td>string</td><td>Your id, unique per import</td></tr>
<tr><td>recipient.name</td><td>string</td><td>Max 70 characters</td></tr>
<tr><td>recipient.address</td><td>object</td><td>See <a href="/docs/api/addresses">Addresses</a></td></tr>
<tr><td>parcels[]</td><td>array</td><td>Weight in grams, dimensions in mm</td></tr>
<tr><td>service</td><td>string</td><td><code>standard</code>, <code>express</code> or <code>economy</code></td></tr></table>
<h2>Response</h2>
<pre><code>{"id": "imp_2Jx9...", "status": "queued", "rows": 2412, "created_at": "..."}</code></pre>
<h2>Errors</h2>
<p>Rows that fail validation are reported in <code>errors[]</code> with their line number; the rest of the file is imported.
A file larger than 50 MB is rejected with <code>413</code>.</p>
<h2>See also</h2><ul><li><a href="/docs/api/shipments#create">Create a single shipment</a></li>
<li><a href="/docs/guides/csv-templates">CSV templates</a></li></ul>
</main>
<footer><p>&copy; 2027 Parcelwise Ltd. · <a href="/status">Status</a> · <a href="/changelog">Changelog</a></p>
<p class="build">Rendered {rendered} in {ms} ms · edge {edge}</p></footer></body></html>"""


def time_docs_html(sc: Scenario):
    rng, clock = sc.rng, sc.clock

    def out(k):
        clock.tick(8, 30)
        return (f"HTTP/1.1 200 OK\ndate: {clock.http()}\ncontent-type: text/html; charset=utf-8\n"
                f"cache-control: no-cache\nx-response-time: {rng.randint(38, 160)}ms\n\n"
                + DOC_HTML.replace("{rendered}", clock.iso_s()).replace("{ms}", str(rng.randint(12, 90)))
                .replace("{edge}", "FRA"))
    spec = {
        "system": "You are an integration assistant. Answer questions about partner APIs by reading their documentation.",
        "tools": ["browse_url", "search_help_center"],
        "user": "What's the rate limit on Parcelwise's bulk import endpoint? We need to push ~30k shipments tonight.",
        "name": "browse_url", "args": {"url": "https://docs.parcelwise.example/docs/api/bulk-import"},
        "out": out, "n": 7,
        "thinks": ["Read the bulk import page for the rate limit.", "The rate limit must be on this page; read it again carefully.",
                   "I may have missed a section. Re-open the page.", "Look again for 'rate' or 'limit' on the bulk import page.",
                   "Check the page once more; perhaps the limit is in the errors section.",
                   "Re-read the documentation page.", "Open the bulk-import page again."],
        "says": ["Let me re-check the page.", "Reading it again.", "Checking the docs once more."], "say_p": 0.3,
        "conv": {"reasoning": True},
    }
    tool_loop(sc, spec)
    sc.description = ("An integration agent re-opens the same 3 KB documentation page seven times; only the HTTP "
                      "Date header, the render timestamp and two millisecond figures change.")


def time_http_timeout(sc: Scenario):
    rng = sc.rng
    spec = {
        "system": "You reconcile partner settlements. Use http_request against the partner ledger API.",
        "tools": ["http_request", "execute_query"],
        "user": "Pull yesterday's settlement batch from the partner ledger (batch 2027-03-18) and tell me if it matches our books.",
        "prelude": [("call", "execute_query",
                     {"sql": "SELECT count(*), sum(amount_minor) FROM payouts WHERE settled_on = DATE '2027-03-18'"},
                     "count | sum\n------+-----------\n  812 | 190448210", "Get our side first.")],
        "name": "http_request",
        "args": {"method": "POST", "url": "https://api.partner-ledger.example/v2/settlements/query",
                 "body": {"batch": "2027-03-18", "include": ["lines"]}},
        "out": lambda k: jdump({"error": "timeout", "detail": f"request timed out after {rng.randint(30001, 30099)} ms",
                                "upstream": "settlements-v2"}),
        "n": 7, "error": True, "conv": {"thinking": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A reconciliation agent repeats the same partner API POST seven times; the timeout error "
                      "differs only in its millisecond count.")


def time_sql_timeout(sc: Scenario):
    rng = sc.rng
    spec = {
        "system": "You are a product analytics assistant with read-only access to the events warehouse.",
        "tools": ["execute_query", "describe_dataset", "plot_series"],
        "user": "How many distinct users triggered 'export_clicked' per day in March? A chart would be great.",
        "prelude": [("call", "describe_dataset", {"name": "analytics.events_2027_03"},
                     "analytics.events_2027_03: 1,842,331,904 rows\ncolumns: event_time timestamptz, user_id uuid, "
                     "event_name text, props jsonb\npartitioned by: day(event_time)\nindexes: none on event_name",
                     "Check the table size.")],
        "name": "execute_query",
        "args": {"sql": "SELECT date_trunc('day', event_time) AS day, count(DISTINCT user_id) FROM analytics.events_2027_03 "
                        "WHERE event_name = 'export_clicked' GROUP BY 1 ORDER BY 1"},
        "out": lambda k: ("ERROR:  canceling statement due to statement timeout\n"
                          "CONTEXT:  parallel worker while scanning relation \"events_2027_03\"\n"
                          f"Time: {rng.uniform(15000.5, 15090.0):.3f} ms"),
        "n": 7, "error": True,
    }
    tool_loop(sc, spec)
    sc.description = ("An analytics agent reruns the same full-scan SQL seven times; the statement-timeout error "
                      "differs only in the reported time.")


DOCKER_LOG = """#0 building with "default" instance using docker driver

#1 [internal] load build definition from Dockerfile
#1 transferring dockerfile: 1.02kB done
#1 DONE {t1}s

#2 [internal] load metadata for docker.io/library/node:22-alpine
#2 DONE {t2}s

#3 [internal] load .dockerignore
#3 transferring context: 112B done
#3 DONE {t3}s

#4 [build 1/6] FROM docker.io/library/node:22-alpine@sha256:6e80991f69cc7722c561e5d14d5e72ab47c0d6b6cfb3ae50fb9cf9a7b30fdf97
#4 CACHED

#5 [internal] load build context
#5 transferring context: 2.41MB 0.3s done
#5 DONE {t5}s

#6 [build 2/6] WORKDIR /app
#6 CACHED

#7 [build 3/6] COPY package.json package-lock.json ./
#7 CACHED

#8 [build 4/6] RUN npm ci --omit=dev
#8 2.113 npm error code ERESOLVE
#8 2.114 npm error ERESOLVE could not resolve
#8 2.114 npm error
#8 2.114 npm error While resolving: @acme/web@3.9.0
#8 2.114 npm error Found: react@19.0.0
#8 2.114 npm error node_modules/react
#8 2.114 npm error   react@"^19.0.0" from the root project
#8 2.115 npm error
#8 2.115 npm error Could not resolve dependency:
#8 2.115 npm error peer react@"^17.0.0 || ^18.0.0" from react-beautiful-dnd@13.1.1
#8 2.115 npm error node_modules/react-beautiful-dnd
#8 2.115 npm error   react-beautiful-dnd@"^13.1.1" from the root project
#8 2.116 npm error
#8 2.116 npm error Fix the upstream dependency conflict, or retry
#8 2.116 npm error this command with --force or --legacy-peer-deps
#8 2.116 npm error to accept an incorrect (and potentially broken) dependency resolution.
#8 ERROR: process "/bin/sh -c npm ci --omit=dev" did not complete successfully: exit code: 1
------
 > [build 4/6] RUN npm ci --omit=dev:
2.115 npm error   react-beautiful-dnd@"^13.1.1" from the root project
2.116 npm error
2.116 npm error Fix the upstream dependency conflict, or retry
2.116 npm error this command with --force or --legacy-peer-deps
2.116 npm error to accept an incorrect (and potentially broken) dependency resolution.
------
Dockerfile:7
--------------------
   5 |     WORKDIR /app
   6 |     COPY package.json package-lock.json ./
   7 | >>> RUN npm ci --omit=dev
   8 |     COPY . .
   9 |     RUN npm run build
--------------------
ERROR: failed to solve: process "/bin/sh -c npm ci --omit=dev" did not complete successfully: exit code: 1
Build failed after {total}s"""


def time_docker(sc: Scenario):
    rng = sc.rng

    def out(k):
        s = DOCKER_LOG
        for key, lo, hi in (("t1", 0.0, 0.2), ("t2", 0.6, 1.9), ("t3", 0.0, 0.1), ("t5", 0.3, 0.6)):
            s = s.replace("{" + key + "}", f"{rng.uniform(lo, hi):.1f}")
        return s.replace("{total}", f"{rng.uniform(6.0, 9.9):.1f}")
    spec = {
        "system": "You are a build engineer agent. Build and publish container images for the web app.",
        "tools": ["build_image", "open_source_file", "edit_source"],
        "user": "Build the web image as web:3.9.0 so QA can test the new checkout.",
        "name": "build_image", "args": {"context": ".", "tag": "web:3.9.0", "dockerfile": "Dockerfile"},
        "out": out, "n": 7, "error": True,
        "thinks": ["Build the image.", "The npm step failed; registry hiccups happen, build again.",
                   "Try the build again; the cache may help this time.", "Rebuild.", "Build once more.",
                   "Perhaps the registry was flaky; rebuild.", "Another build attempt."],
        "conv": {"reasoning": True, "encrypted": True},
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("A build agent reruns the same docker build seven times; the 3 KB log fails identically at "
                      "npm ci and differs only in step durations.")


def time_systemctl(sc: Scenario):
    rng, clock = sc.rng, sc.clock
    since = clock.t - dt.timedelta(seconds=rng.randint(20, 50))
    j1 = (since - dt.timedelta(seconds=1)).strftime("%b %d %H:%M:%S")
    j2 = since.strftime("%b %d %H:%M:%S")
    since_str = since.strftime("%a %Y-%m-%d %H:%M:%S UTC")
    journal = (f"{j1} db-replica-2 pgbouncer[41822]: FATAL unable to parse config file: "
               "/etc/pgbouncer/pgbouncer.ini:41: syntax error\n"
               f"{j1} db-replica-2 systemd[1]: pgbouncer.service: Main process exited, code=exited, status=1/FAILURE\n"
               f"{j1} db-replica-2 systemd[1]: pgbouncer.service: Failed with result 'exit-code'.\n"
               f"{j2} db-replica-2 systemd[1]: Failed to start pgbouncer.service - PgBouncer connection pooler.")

    def out(k):
        clock.tick(6, 25)
        secs = int((clock.t - since).total_seconds())
        rel = f"{secs}s" if secs < 60 else f"{secs // 60}min {secs % 60}s"
        return ("× pgbouncer.service - PgBouncer connection pooler\n"
                "     Loaded: loaded (/lib/systemd/system/pgbouncer.service; enabled; preset: enabled)\n"
                f"     Active: failed (Result: exit-code) since {since_str}; {rel} ago\n"
                "   Duration: 2d 4h 11min 3.208s\n"
                "    Process: 41822 ExecStart=/usr/sbin/pgbouncer /etc/pgbouncer/pgbouncer.ini (code=exited, status=1/FAILURE)\n"
                "   Main PID: 41822 (code=exited, status=1/FAILURE)\n        CPU: 21ms\n\n" + journal)
    spec = {
        "system": "You are an on-call assistant. You may run read-only commands on hosts via ssh_exec.",
        "tools": ["ssh_exec", "tail_service_logs", "post_chat_message"],
        "user": "Apps on db-replica-2 can't connect through pgbouncer since a few minutes ago. What's going on?",
        "name": "ssh_exec", "args": {"host": "db-replica-2", "cmd": "systemctl status pgbouncer --no-pager"},
        "out": out, "n": 7,
        "thinks": ["Check the service status.", "Check whether it came back up.", "Look at the status again.",
                   "Maybe systemd restarted it; check again.", "Status once more.", "Check pgbouncer status.",
                   "See if anything changed."],
        "conv": {"thinking": True},
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("An on-call agent runs the same systemctl status seven times on a failed unit; only the "
                      "'Ns ago' duration in the output changes.")


def time_caldav_zh(sc: Scenario):
    rng, clock = sc.rng, sc.clock

    def out(k):
        clock.tick(5, 20)
        return (f"同步失败：连接 CalDAV 服务器超时（耗时 {rng.uniform(10.0, 10.09):.2f} 秒）。\n"
                f"时间：{clock.iso()}\n账户：wang.lei@bluepeak.example\n服务器：caldav.bluepeak.example:443")
    spec = {
        "system": "你是王磊的日程助理。请用中文回答。",
        "tools": ["sync_calendar", "calendar_free_busy", "schedule_meeting"],
        "user": "帮我同步一下公司日历，然后看看下周二下午有没有空。",
        "name": "sync_calendar", "args": {"account": "wang.lei@bluepeak.example"},
        "out": out, "n": 7, "error": True, "lang": "zh", "say_p": 0.7,
    }
    tool_loop(sc, spec)
    sc.description = ("A Chinese calendar assistant retries the same CalDAV sync seven times; the timeout message "
                      "differs only in the elapsed seconds and an ISO timestamp.")


def time_carrier_es(sc: Scenario):
    rng, clock = sc.rng, sc.clock

    def out(k):
        clock.tick(3, 15)
        return jdump({"ok": False, "error": "upstream_timeout", "message": "El transportista no respondió a tiempo.",
                      "elapsed_ms": rng.randint(5001, 5090), "ts": clock.iso()})
    spec = {
        "system": "Eres el asistente logístico de Tienda Verde. Respondes en español.",
        "tools": ["carrier_rate_quote", "get_sku"],
        "user": "¿Cuánto costaría enviar el pedido 7731 (12 kg) desde Madrid 28001 a Barcelona 08001 con el transportista habitual?",
        "name": "carrier_rate_quote", "args": {"origin": "28001", "dest": "08001", "kg": 12},
        "out": out, "n": 7, "error": True, "lang": "es", "say_p": 0.6, "conv": {"reasoning": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A Spanish logistics agent asks for the same shipping quote seven times; the JSON timeout "
                      "differs only in elapsed_ms and an ISO timestamp.")


CARGO_FAIL = """   Compiling edgecache v0.7.2 (/workspace/edgecache)
    Finished `test` profile [unoptimized + debuginfo] target(s) in {build}s
     Running unittests src/lib.rs (target/debug/deps/edgecache-3b1f0c9d2e7a4c11)

running 58 tests
test lru::tests::evicts_oldest_first ... ok
test lru::tests::get_refreshes_recency ... ok
test lru::tests::respects_byte_budget ... FAILED
test lru::tests::zero_capacity_stores_nothing ... ok
test ttl::tests::expires_after_deadline ... ok
test ttl::tests::refresh_extends_deadline ... ok

failures:

---- lru::tests::respects_byte_budget stdout ----

thread 'lru::tests::respects_byte_budget' panicked at src/lru.rs:212:9:
assertion `left == right` failed: cache held 3 entries after inserting 4 x 400 B into a 1 KiB budget
  left: 3
 right: 2
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    lru::tests::respects_byte_budget

test result: FAILED. 57 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in {run}s

error: test failed, to rerun pass `--lib`"""


def time_cargo(sc: Scenario):
    rng = sc.rng

    def out(k):
        return CARGO_FAIL.replace("{build}", f"{rng.uniform(1.1, 4.9):.2f}").replace("{run}", f"{rng.uniform(0.02, 0.09):.2f}")
    spec = {
        "system": "You are a Rust coding agent in /workspace/edgecache. Keep `cargo test` green.",
        "tools": ["open_source_file", "edit_source", "exec_tests"],
        "user": "respects_byte_budget fails on main. Can you find out why and fix it?",
        "prelude": [("call", "open_source_file", {"path": "src/lru.rs", "start": 60, "end": 72},
                     "    pub fn insert(&mut self, key: K, value: V) {\n        let size = value.byte_len();\n"
                     "        while self.bytes + size > self.budget && !self.map.is_empty() {\n"
                     "            self.evict_oldest();\n        }\n        self.bytes += size;\n"
                     "        self.map.insert(key, value);\n    }", "Look at insert().")],
        "name": "exec_tests", "args": {"cmd": "cargo test --lib"},
        "out": out, "n": 7, "thinks": THINK_RERUN, "conv": {"thinking": True, "redacted_p": 0.15},
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("A Rust agent reruns the same cargo test seven times without changing code; the output "
                      "differs only in the build and run durations.")


# 6.3 same_answer_reworded --------------------------------------------------

APOLOGY = {
    "en": ["You're right, sorry about that.", "Apologies for the confusion.", "My mistake, let me correct that.",
           "Sorry, that's frustrating.", "I apologize for the trouble.", "Thanks for bearing with me.",
           "Sorry again, let's get this sorted.", "I understand, apologies."],
    "es": ["Tienes razón, disculpa.", "Perdona la confusión.", "Lo siento, fue un error mío.", "Disculpa las molestias.",
           "Lamento el inconveniente.", "Gracias por la paciencia.", "Perdón otra vez.", "Entiendo, disculpa."],
    "de": ["Sie haben recht, Entschuldigung.", "Tut mir leid für die Verwirrung.", "Mein Fehler, ich korrigiere das.",
           "Entschuldigen Sie die Umstände.", "Das ist ärgerlich, sorry.", "Danke für Ihre Geduld.",
           "Nochmals Entschuldigung.", "Verstehe, tut mir leid."],
    "fr": ["Vous avez raison, désolé.", "Toutes mes excuses pour la confusion.", "C'est une erreur de ma part.",
           "Désolé pour le désagrément.", "Je comprends votre frustration.", "Merci de votre patience.",
           "Encore désolé.", "Pardon, je reprends."],
    "ja": ["申し訳ありません。", "ご指摘ありがとうございます。失礼しました。", "重ねてお詫びいたします。",
           "ご不便をおかけしてすみません。", "失礼いたしました。", "おっしゃる通りです。申し訳ございません。",
           "度々すみません。", "大変失礼しました。"],
    "zh": ["抱歉，是我的问题。", "不好意思，给您带来困扰了。", "您说得对，抱歉。", "再次向您道歉。",
           "抱歉让您久等了。", "明白了，抱歉。", "对不起，我重新说明一下。", "非常抱歉。"],
    "pt": ["Tem razão, desculpe.", "Peço desculpas pela confusão.", "Foi um erro meu.", "Lamento o transtorno.",
           "Entendo a sua frustração.", "Obrigado pela paciência.", "Desculpe mais uma vez.", "Compreendo, desculpe."],
}
CLOSERS = {
    "en": ["Then run it again.", "That should resolve it.", "Let me know if anything else comes up.",
           "Give that a try.", "That ought to do it.", "Try again after that.", "Hope that helps!", "It should work now."],
    "es": ["Pruébalo de nuevo.", "Con eso debería funcionar.", "Avísame si sigue fallando.", "Cuéntame cómo va.",
           "Eso debería resolverlo.", "Vuelve a ejecutarla.", "¡Espero que sirva!", "Ahora debería ir bien."],
    "de": ["Danach sollte es klappen.", "Probieren Sie es bitte erneut.", "Geben Sie Bescheid, ob es funktioniert.",
           "Das sollte das Problem lösen.", "Danach nginx neu laden.", "Melden Sie sich, falls nicht.",
           "Viel Erfolg!", "So sollte es gehen."],
    "fr": ["Réessayez ensuite.", "Cela devrait régler le problème.", "Dites-moi si cela fonctionne.",
           "Tenez-moi au courant.", "Normalement, c'est bon.", "Essayez et revenez vers moi.",
           "J'espère que cela aide !", "Ça devrait fonctionner maintenant."],
    "ja": ["ご確認ください。", "いかがでしょうか。", "ご検討ください。", "こちらでお試しください。",
           "修正版です。", "よろしくお願いします。", "ご確認をお願いいたします。", "こちらでいかがでしょう。"],
    "zh": ["请再试一次。", "这样应该就可以了。", "如果还有问题请告诉我。", "试试看吧。", "应该能解决。",
           "改完后重新计算一下。", "希望有帮助！", "现在应该没问题了。"],
    "pt": ["Tente novamente.", "Isso deve resolver.", "Me avise se continuar.", "Qualquer dúvida, estou aqui.",
           "Deve funcionar agora.", "Experimente de novo.", "Espero ter ajudado!", "Pronto, deve dar certo."],
}

REWORD_SPECS = [
    {   # 1 English: same pip fix, user attached a screenshot
        "topic": "the same pip install fix",
        "lang": "en", "image": "png",
        "system": "You are a friendly Python helper for beginners.",
        "user": "Running my script gives this error (screenshot attached). How do I fix it?\n\n"
                "ModuleNotFoundError: No module named 'yaml'",
        "first": "",
        "cores": ["The error means the PyYAML package isn't installed in the environment you're running the script with. Install it with pip:",
                  "The `yaml` module comes from the PyYAML distribution, which your interpreter can't find. Installing it should fix this:",
                  "Python can't import `yaml`, and that module is provided by PyYAML. Run:",
                  "This happens when PyYAML is missing; the package name differs from the import name. Install it like this:",
                  "`import yaml` needs the PyYAML package. Please install it:",
                  "The fix is to add PyYAML to the environment the script runs in:",
                  "What's missing is the PyYAML library; install it and re-run:"],
        "snippets": ["```bash\npip install pyyaml\n```", "```\npip install PyYAML\n```", "```sh\npip3 install pyyaml\n```"],
        "pushbacks": ["I already ran pip install pyyaml, it says Requirement already satisfied. Same error.",
                      "Still the same ModuleNotFoundError.", "That's what you told me last time, it doesn't help.",
                      "nope. still broken", "I literally did that three times now",
                      "Same error, same screenshot. Any other idea?", "You keep saying the same thing!!"],
    },
    {   # 2 English: automated JSON driver, model keeps wrapping JSON in prose and fences
        "topic": "the same prose-wrapped, fenced JSON",
        "lang": "en", "driver": True,
        "system": "Extract the meeting details as JSON matching this schema: {\"title\": string, \"date\": \"YYYY-MM-DD\", "
                  "\"start\": \"HH:MM\", \"attendees\": [string]}. Output only the JSON object, no prose, no code fences.",
        "user": "Hi all, let's do the Q2 roadmap review on Thursday 18 March 2027 at 14:30. Priya, Tomás and Ade please join. Thanks, Lin",
        "first": "",
        "cores": ["Here is the extracted JSON:", "Sure, here's the meeting as JSON:", "Below is the JSON object for the meeting:",
                  "Here's the JSON only, as requested:", "This is the meeting in the requested schema:",
                  "The JSON object follows:", "Here it is as a single JSON object:"],
        "snippets": ['```json\n{\n  "title": "Q2 roadmap review",\n  "date": "2027-03-18",\n  "start": "14:30",\n  "attendees": ["Priya", "Tomás", "Ade"]\n}\n```',
                     '```json\n{"title": "Q2 roadmap review", "date": "2027-03-18", "start": "14:30", "attendees": ["Priya", "Tomás", "Ade"]}\n```',
                     '```\n{\n  "title": "Q2 roadmap review",\n  "attendees": ["Priya", "Tomás", "Ade"],\n  "date": "2027-03-18",\n  "start": "14:30"\n}\n```'],
        "closers": ["", "Let me know if you need other fields.", "", "All fields match the schema.", "", "", "This follows the schema exactly."],
        "pushbacks": ["Validation failed (attempt 2 of 8): response must start with '{'. Return only the JSON object.",
                      "Attempt 3/8: JSONDecodeError: Expecting value: line 1 column 1 (char 0). No prose, no code fences.",
                      "Your previous reply was rejected by the parser (attempt 4). Output raw JSON only.",
                      "Retry 5 of 8: schema check could not run because the output is not JSON. Remove the markdown fence.",
                      "Attempt 6/8 failed: unexpected token '`' at position 0.",
                      "Parser error on attempt 7: text before the JSON object. Send the object alone.",
                      "Attempt 8/8: still not parseable JSON. Return exactly one JSON object."],
    },
    {   # 3 Spanish: window-function SQL on MySQL 5.7, error screenshot inline
        "topic": "the same window-function SQL that MySQL 5.7 rejects",
        "lang": "es", "image": "png",
        "system": "Eres un asistente experto en SQL. Responde en español.",
        "user": "Necesito los 3 clientes con más facturación por región. La base de datos es MySQL 5.7. Tabla: facturas(region, cliente, importe).",
        "first": "",
        "cores": ["Puedes numerar los clientes dentro de cada región con una función de ventana y quedarte con los tres primeros:",
                  "La forma más limpia es usar ROW_NUMBER() particionando por región y filtrar las tres primeras posiciones:",
                  "Prueba con esta versión, que ordena a los clientes por total dentro de cada región:",
                  "El ranking por región se resuelve con ROW_NUMBER() sobre la suma del importe:",
                  "Esta consulta agrupa por región y cliente, numera por total y filtra:",
                  "Te dejo la consulta corregida; numera a los clientes de cada región y se queda con el top 3:",
                  "Usa una subconsulta con la numeración por región y luego filtra las filas 1 a 3:"],
        "snippets": ["```sql\nSELECT region, cliente, total\nFROM (\n  SELECT region, cliente, SUM(importe) AS total,\n"
                     "         ROW_NUMBER() OVER (PARTITION BY region ORDER BY SUM(importe) DESC) AS rn\n"
                     "  FROM facturas\n  GROUP BY region, cliente\n) t\nWHERE rn <= 3;\n```",
                     "```sql\nselect region, cliente, total\nfrom (\n    select region, cliente, sum(importe) as total,\n"
                     "           row_number() over (partition by region order by sum(importe) desc) as posicion\n"
                     "    from facturas\n    group by region, cliente\n) ranking\nwhere posicion <= 3;\n```",
                     "```sql\nSELECT x.region, x.cliente, x.total\nFROM (\n  SELECT f.region, f.cliente, SUM(f.importe) total,\n"
                     "    ROW_NUMBER() OVER (PARTITION BY f.region ORDER BY SUM(f.importe) DESC) AS n\n"
                     "  FROM facturas f GROUP BY f.region, f.cliente\n) AS x\nWHERE x.n BETWEEN 1 AND 3;\n```"],
        "pushbacks": ["Me da error: You have an error in your SQL syntax near '(PARTITION BY region'.",
                      "Sigue fallando con el mismo error de sintaxis.", "Te dije que es MySQL 5.7, no funciona.",
                      "Mismo error otra vez.", "¿No hay otra forma? Esa ya la probé.",
                      "Es la misma consulta que antes con otros nombres...", "Sigue sin funcionar."],
    },
    {   # 4 German: same nginx redirect snippet for a redirect loop
        "topic": "the same nginx redirect block",
        "lang": "de",
        "system": "Du bist ein hilfsbereiter Linux- und nginx-Experte.",
        "user": "Ich will http://shop.beispiel.de auf https://www.beispiel.de/shop umleiten, bekomme aber im Browser "
                "ERR_TOO_MANY_REDIRECTS. Die Domain läuft über Cloudflare. Was mache ich falsch?",
        "first": "",
        "cores": ["Am saubersten lösen Sie das mit einem eigenen server-Block für Port 80 und einem 301-Redirect:",
                  "Legen Sie für shop.beispiel.de einen separaten server-Block an, der dauerhaft umleitet:",
                  "Verwenden Sie statt rewrite ein einfaches return 301 in einem eigenen server-Block:",
                  "Die Umleitung gehört in einen eigenen server-Block, der nur auf Port 80 lauscht:",
                  "Mit folgendem Block wird jede Anfrage an die neue Adresse weitergeleitet:",
                  "Bitte ersetzen Sie die bisherige Regel durch diesen server-Block:",
                  "So sieht die korrigierte Konfiguration aus:"],
        "snippets": ["```nginx\nserver {\n    listen 80;\n    server_name shop.beispiel.de;\n    return 301 https://www.beispiel.de/shop$request_uri;\n}\n```",
                     "```nginx\nserver {\n    listen      80;\n    server_name shop.beispiel.de;\n\n    return 301 https://www.beispiel.de/shop$request_uri;\n}\n```",
                     "```\nserver {\n  server_name shop.beispiel.de;\n  listen 80;\n  return 301 https://www.beispiel.de/shop$request_uri;\n}\n```"],
        "pushbacks": ["Genau das habe ich drin, immer noch ERR_TOO_MANY_REDIRECTS.", "Funktioniert weiterhin nicht.",
                      "Das ist dieselbe Konfiguration wie vorhin.", "Immer noch Endlosschleife. Liegt es vielleicht an Cloudflare?",
                      "Nein, gleiche Fehlermeldung.", "Hab nginx neu geladen, nichts geändert.", "Bringt nichts, leider."],
    },
    {   # 5 Japanese: app-store subtitle translation that stays too long
        "topic": "the same over-long subtitle translation",
        "lang": "ja",
        "system": "あなたはローカライズ担当の翻訳アシスタントです。",
        "user": "アプリストアのサブタイトル（英語、30文字以内）に訳してください：「家計簿をもっとかんたんに、もっと楽しく」",
        "first": "",
        "cores": ["英語のサブタイトル案です：\n\nMake budgeting simpler and more fun",
                  "こちらの訳はいかがでしょうか：\n\nBudgeting made simpler and more fun",
                  "簡潔にまとめました：\n\nMake your budget easier and more fun",
                  "自然な英語にすると次のようになります：\n\nMaking budgeting simpler and fun",
                  "短くした案です：\n\nBudgeting, simpler and more fun",
                  "修正案：\n\nMake budget tracking easy and fun",
                  "こちらで調整しました：\n\nBudgeting that's simpler and more fun"],
        "snippets": [""],
        "pushbacks": ["30文字を超えています。", "まだ長すぎます。30文字以内でお願いします。",
                      "文字数を数えてください。超えています。", "ほぼ同じ長さですよね？", "もっと短くできませんか。",
                      "やはり30文字オーバーです。", "これも入りません。"],
    },
    {   # 6 Chinese: same VLOOKUP advice
        "topic": "the same VLOOKUP formula",
        "lang": "zh",
        "system": "你是一名 Excel 助手。",
        "user": "我用 VLOOKUP 从另一个表查价格，结果全是 #N/A。公式：=VLOOKUP(A2,价格表!A:B,2,FALSE)，A 列是商品编号。",
        "first": "",
        "cores": ["建议把查找区域改成绝对引用，这样往下填充时范围不会偏移：",
                  "问题多半出在引用范围上，请锁定区域再填充：",
                  "把区域加上 $ 符号固定住，公式如下：",
                  "使用绝对引用的版本：",
                  "请将公式改为固定区域的写法：",
                  "这样写可以避免拖动公式时范围变化：",
                  "用锁定列的方式改写公式："],
        "snippets": ["```\n=VLOOKUP(A2,价格表!$A:$B,2,FALSE)\n```", "```\n=VLOOKUP($A2,价格表!$A:$B,2,FALSE)\n```",
                     "```\n=VLOOKUP(A2, 价格表!$A:$B, 2, FALSE)\n```"],
        "pushbacks": ["还是 #N/A。", "改了，没用，还是全部 #N/A。", "你上次也是这么说的。", "依然不行。",
                      "编号看起来一模一样，但还是找不到。", "有没有别的可能？", "还是不行啊。"],
    },
    {   # 7 Portuguese: same cancellation path that does not exist for App Store subscribers
        "topic": "the same non-existent cancellation path",
        "lang": "pt", "image": "ref",
        "system": "Você é o assistente de suporte da StreamBox. Seja cordial e objetivo.",
        "user": "Quero cancelar minha assinatura da StreamBox.",
        "first": "",
        "cores": ["Para cancelar, abra o app e vá em Configurações > Conta > Assinatura, depois toque em \"Cancelar assinatura\".",
                  "O cancelamento é feito no próprio app: Configurações, depois Conta, depois Assinatura, e por fim \"Cancelar assinatura\".",
                  "Você pode cancelar em Configurações > Conta > Assinatura, usando o botão \"Cancelar assinatura\".",
                  "No aplicativo, entre em Configurações, toque em Conta e depois em Assinatura; lá está a opção \"Cancelar assinatura\".",
                  "Basta acessar Configurações > Conta > Assinatura e escolher \"Cancelar assinatura\".",
                  "O caminho é: Configurações → Conta → Assinatura → \"Cancelar assinatura\".",
                  "Vá em Configurações, seção Conta, item Assinatura, e toque em \"Cancelar assinatura\"."],
        "snippets": [""],
        "pushbacks": ["Não aparece essa opção no meu app. Assinei pelo iPhone.", "Já procurei, não tem \"Cancelar assinatura\" aí.",
                      "Você está repetindo a mesma coisa.", "Não existe esse botão!", "Continua sem a opção.",
                      "Já disse que não aparece. Tem outro jeito?", "Quero falar com um humano."],
    },
    {   # 8 English: first a different suggestion, then the same memory-limit YAML, apologising
        "topic": "the same memory-limit YAML",
        "lang": "en", "image": "ref", "first_differs": True,
        "system": "You are a Kubernetes troubleshooting assistant.",
        "user": "My worker pod keeps restarting. Screenshot of `kubectl get pods` attached. What should I do?",
        "first": "The pod is in CrashLoopBackOff. Before changing anything, could you run `kubectl logs worker-7f9c --previous` "
                 "and `kubectl describe pod worker-7f9c` and paste the last lines? The reason for the restart will be in "
                 "the container's last state.",
        "first_push": "describe says: Last State: Terminated, Reason: OOMKilled, Exit Code: 137. Limits: memory 512Mi.",
        "cores": ["The container is being OOM-killed, so it needs more memory. Raise the limit in the deployment:",
                  "Exit code 137 with OOMKilled means the memory limit is too low. Increase it like this:",
                  "The fix is to give the worker more memory headroom:",
                  "Since the kernel kills it for exceeding its limit, bump the memory limit:",
                  "You'll want a higher memory limit on the worker container:",
                  "OOMKilled means it hit the ceiling; set the limit higher:",
                  "Increase the memory request and limit for the container:"],
        "snippets": ["```yaml\nresources:\n  requests:\n    memory: \"256Mi\"\n  limits:\n    memory: \"512Mi\"\n```",
                     "```yaml\nresources:\n  limits:\n    memory: 512Mi\n  requests:\n    memory: 256Mi\n```",
                     "```yaml\n        resources:\n          requests: {memory: 256Mi}\n          limits: {memory: 512Mi}\n```"],
        "pushbacks": ["It's already 512Mi, I told you. Still OOMKilled.", "Same thing again? The limit IS 512Mi.",
                      "That's the config I have.", "Still crashing with 137.", "You're giving me the same YAML.",
                      "Doesn't change anything.", "ok this is going nowhere"],
    },
    {   # 9 French: same clear-cookies advice, screenshot by file reference
        "topic": "the same clear-cookies advice",
        "lang": "fr", "image": "ref",
        "system": "Vous êtes l'assistant d'aide à la connexion de la banque en ligne Crédit Horizon.",
        "user": "Je n'arrive pas à me connecter : le message « Session expirée » revient en boucle (capture jointe).",
        "first": "",
        "cores": ["Ce message vient souvent de cookies corrompus. Videz le cache et les cookies du navigateur, puis reconnectez-vous :",
                  "Je vous conseille d'effacer les cookies et le cache, qui provoquent souvent cette boucle :",
                  "La solution la plus fréquente consiste à supprimer les cookies du site et le cache :",
                  "Essayez de nettoyer les données de navigation (cookies et cache) :",
                  "Le plus simple est de supprimer les cookies et de vider le cache, puis de réessayer :",
                  "Effacez les cookies et le cache du navigateur ; cela règle généralement ce message :",
                  "Pour sortir de cette boucle, supprimez les cookies et videz le cache :"],
        "snippets": ["1. Paramètres du navigateur → Confidentialité\n2. Effacer les cookies et le cache\n3. Fermer et rouvrir le navigateur",
                     "- Ouvrez les paramètres de confidentialité\n- Supprimez cookies et fichiers en cache\n- Redémarrez le navigateur",
                     "1) Confidentialité et sécurité → Effacer les données\n2) Cochez cookies + images en cache\n3) Relancez le navigateur"],
        "pushbacks": ["J'ai déjà vidé le cache et les cookies, même problème.", "Toujours « Session expirée ».",
                      "Vous m'avez déjà dit ça.", "Même chose en navigation privée.", "Ça ne marche toujours pas.",
                      "C'est la même réponse qu'avant.", "Rien ne change."],
    },
]


def build_same_answer_reworded(sc: Scenario):
    spec = REWORD_SPECS[sc.index - 1]
    rng = sc.rng
    lang = spec["lang"]
    conv = sc.conv(spec["system"], [], extra={"temperature": round(rng.choice([0.2, 0.5, 0.7, 1.0]), 1)}
                   if sc.format != "anthropic_messages" or rng.random() < 0.5 else {})
    r = Run(sc, conv)
    images = ()
    if spec.get("image") == "png":
        images = (sc.image("high"),)
    elif spec.get("image") == "ref":
        images = (sc.image_ref("screenshot.png"),)
    r.user(spec["user"], images)
    closers = spec.get("closers", CLOSERS[lang])
    apologies = APOLOGY[lang]
    n = len(spec["cores"])
    off = rng.randrange(len(apologies))
    if spec.get("first_differs"):
        r.say(spec["first"])
        r.user(spec["first_push"])
    seen = set()
    for k in range(n):
        opener = "" if k == 0 and not spec.get("first_differs") else apologies[(k + off) % len(apologies)]
        if spec.get("driver") and k and rng.random() < 0.5:
            opener = ""
        parts = [p for p in (opener, spec["cores"][k]) if p]
        sep = "" if lang in ("ja", "zh") else " "
        text = sep.join(parts)
        snip = spec["snippets"][k % len(spec["snippets"])]
        if snip:
            text += "\n\n" + snip
        close = closers[(k + off) % len(closers)]
        if close:
            text += "\n\n" + close
        assert text not in seen
        seen.add(text)
        r.say(text, occ=True)
        r.user(spec["pushbacks"][k])
    what = {"en": "English", "es": "Spanish", "de": "German", "fr": "French", "ja": "Japanese", "zh": "Chinese",
            "pt": "Portuguese"}[lang]
    who = "an automated JSON validator" if spec.get("driver") else "the user"
    article = "An" if what[0] in "AEIOU" else "A"
    sc.description = (f"{article} {what} chat in which {who} pushes back {n} times in different words and the model "
                      f"returns {spec['topic']} reworded each time"
                      + (" after one different first suggestion." if spec.get("first_differs") else "."))


# 6.4 tool_cycle ------------------------------------------------------------

def cycle_loop(sc: Scenario, system, tools, user, cycle, n_cycles, prelude=(), thinks=None, conv_kw=None):
    """Repeat a cycle of steps; each step is (name, args, output) or a list of them (parallel)."""
    conv = sc.conv(system, tools, **(conv_kw or {}))
    r = Run(sc, conv)
    r.user(user)
    play(r, prelude)
    thinks = thinks or ["Next step."]
    t = sc.rng.randrange(len(thinks))
    for c in range(n_cycles):
        for i, step in enumerate(cycle):
            last = i == len(cycle) - 1
            t += 1
            if isinstance(step, list):
                r.calls(step, think=thinks[t % len(thinks)], occ=last)
            else:
                r.call(step[0], step[1], step[2], think=thinks[t % len(thinks)], occ=last)
    return r


def cyc_sheet(sc: Scenario):
    rows = [["Region", "Jan", "Feb", "Mar", "Q1"], ["North", 1200, 1340, 1410, "=SUM(B2:D2)"],
            ["South", 980, 1010, 1150, "=SUM(B3:D3)"], ["West", 1505, 1490, 1620, "=SUM(B4:D4)"]]
    read_out = jdump({"range": "Q1!A1:E4", "values": [["Region", "Jan", "Feb", "Mar", "Q1"], ["North", 1200, 1340, 1410, 3950],
                                                       ["South", 980, 1010, 1150, 3140], ["West", 1505, 1490, 1620, 4615]],
                      "note": "E2:E4 are formulas"})
    write_args = {"sheet": "Q1", "range": "E2:E4", "values": [{"E": 3960}, {"E": 3140}, {"E": 4615}]}
    write_out = jdump({"updatedRange": "Q1!E2:E4", "updatedCells": 3, "warning": "cells contain formulas; values were recalculated"})
    cycle = [("read_sheet_range", {"sheet": "Q1", "range": "A1:E4"}, read_out),
             ("write_sheet_range", write_args, write_out)]
    cycle_loop(sc, "You maintain the sales spreadsheet for the regional team.", ["read_sheet_range", "write_sheet_range"],
               "The Q1 totals in column E look off to me — North should be 3,960. Can you fix them?", cycle, 5,
               thinks=["Read the totals.", "Write corrected totals.", "Verify the totals after writing.",
                       "The totals still read 3950; write them again.", "Check the sheet.", "Overwrite column E."],
               conv_kw={"thinking": True})
    sc.description = ("A spreadsheet agent alternates reading the Q1 range and writing the same three totals five "
                      "times; both results are identical each time.")


def cyc_pods_logs(sc: Scenario):
    pods = text_table([["payments-api-6d8f7b9c5-2xkqp", "0/1", "CrashLoopBackOff", "14", "38m"],
                       ["payments-api-6d8f7b9c5-9vtzn", "0/1", "CrashLoopBackOff", "14", "38m"],
                       ["payments-worker-7c55d8f4b-lq8rm", "1/1", "Running", "0", "3d"]],
                      ["NAME", "READY", "STATUS", "RESTARTS", "AGE"])
    logs = ("2027-03-11T08:02:13Z INFO  starting payments-api v2.31.0\n"
            "2027-03-11T08:02:13Z INFO  loading config from /etc/payments/config.yaml\n"
            "2027-03-11T08:02:14Z ERROR failed to connect to vault: permission denied (role=payments-api)\n"
            "2027-03-11T08:02:14Z FATAL exiting: secrets unavailable")
    cycle = [("kubectl_get", {"resource": "pods", "namespace": "payments", "selector": "app=payments-api"}, pods),
             ("tail_service_logs", {"service": "payments-api", "lines": 50}, logs)]
    cycle_loop(sc, "You are an incident responder for the payments platform.", ["kubectl_get", "tail_service_logs",
               "kubectl_describe", "post_chat_message"],
               "payments-api is down after this morning's deploy. Investigate and tell me what's wrong.", cycle, 5,
               thinks=["Check pod status.", "Look at the logs.", "Check whether the pods recovered.", "Look at logs again.",
                       "Re-check pod status.", "Read the latest log lines."],
               conv_kw={"reasoning": True})
    sc.description = ("An incident agent alternates listing the same pods and tailing the same logs five times; "
                      "both outputs are unchanged each time.")


def cyc_browser(sc: Scenario):
    settings = "https://admin.shopwave.example/settings/notifications"
    login = ("Shopwave Admin — Sign in\n[input#email] Email\n[input#password] Password\n[button#signin] Sign in\n"
             "Your session has expired. Please sign in again.")
    cycle = [("browser_navigate", {"url": settings},
              "Shopwave Admin — Notification settings\n[x] Order confirmation e-mails\n[ ] Low-stock alerts\n"
              "[ ] Weekly summary\n[button#save] Save changes"),
             ("browser_click", {"selector": "#save"}, login)]
    cycle_loop(sc, "You are a browser automation agent operating the Shopwave admin console for the store owner.",
               ["browser_navigate", "browser_click"],
               "Turn on low-stock alerts in the notification settings and save.", cycle, 5,
               thinks=["Open the settings page.", "Click save.", "The save redirected to login; go back to settings.",
                       "Save again.", "Navigate back to the settings.", "Try the save button again."],
               conv_kw={"thinking": True, "redacted_p": 0.2})
    sc.description = ("A browser agent alternates opening the settings page and clicking Save, which lands on an "
                      "expired-session login page, five times with identical page text.")


def cyc_code_three(sc: Scenario):
    grep = ("src/billing/proration.ts:41:  const days = differenceInDays(periodEnd, changeDate);\n"
            "src/billing/proration.ts:57:  return Math.round(amount * days / totalDays);\n"
            "test/billing/proration.test.ts:22:    expect(prorate(3000, feb1, feb15, mar1)).toBe(1500);")
    src = ("export function prorate(amount: number, periodStart: Date, changeDate: Date, periodEnd: Date): number {\n"
           "  const totalDays = differenceInDays(periodEnd, periodStart);\n"
           "  const days = differenceInDays(periodEnd, changeDate);\n"
           "  if (days <= 0) return 0;\n"
           "  return Math.round(amount * days / totalDays);\n}")
    blame = "a41f9c2e (Dana Ortiz 2026-11-02 14:11:09 +0100 57)   return Math.round(amount * days / totalDays);"
    cycle = [("grep_repo", {"pattern": "totalDays", "glob": "src/billing/**"}, grep),
             ("open_source_file", {"path": "src/billing/proration.ts", "start": 38, "end": 58}, src),
             ("show_git_blame", {"path": "src/billing/proration.ts", "line": 57}, blame)]
    cycle_loop(sc, "You are a coding agent for the billing service (TypeScript).",
               ["grep_repo", "open_source_file", "show_git_blame", "edit_source", "exec_tests"],
               "Customers upgrading mid-February get prorated wrong (off by a few cents). Find the bug and fix it.",
               cycle, 4,
               thinks=["Search for the proration math.", "Open the function.", "Who wrote this line?",
                       "Search again for related code.", "Re-read the implementation.", "Check blame again."],
               conv_kw={"reasoning": True})
    sc.tags.append("three_cycle")
    sc.description = ("A coding agent cycles grep, open file and git blame on the same proration code four times "
                      "without editing, with identical results.")


def cyc_ticket_three(sc: Scenario):
    issue = jdump({"key": "PAY-4182", "summary": "Webhook retries double-post refunds", "status": "In Review",
                   "assignee": "k.nakamura", "links": [{"type": "pr", "ref": "acme/payments#2291"}]})
    pr = jdump({"number": 2291, "title": "Idempotency keys for refund webhooks", "state": "open", "mergeable": False,
                "mergeable_state": "blocked", "reviews": [{"user": "j.ruiz", "state": "APPROVED"}],
                "required_checks": ["ci/test", "ci/lint"]})
    runs = jdump({"workflow_runs": [{"id": 8123340091, "name": "ci", "head_branch": "pay-4182-idempotency",
                                     "status": "completed", "conclusion": "failure", "failed_job": "lint"}]})
    cycle = [("jira_get_issue", {"key": "PAY-4182"}, issue),
             ("gh_get_pull_request", {"repo": "acme/payments", "number": 2291}, pr),
             ("gh_list_workflow_runs", {"repo": "acme/payments", "branch": "pay-4182-idempotency"}, runs)]
    cycle_loop(sc, "You are a release coordinator agent. You read Jira and GitHub and report blockers.",
               ["jira_get_issue", "gh_get_pull_request", "gh_list_workflow_runs", "post_chat_message"],
               "Why isn't PAY-4182 shipped yet? Give me a one-line status for the release channel.", cycle, 4,
               thinks=["Check the Jira issue.", "Look at the linked PR.", "Check CI on the branch.",
                       "Re-check the issue status.", "Look at the PR again.", "Check CI again."],
               conv_kw={"thinking": True})
    sc.tags.append("three_cycle")
    sc.description = ("A release agent cycles Jira issue, pull request and CI runs for the same ticket four times "
                      "with identical results and never posts the status.")


def cyc_parallel_kv(sc: Scenario):
    note = "Customer ACME-0091 prefers invoices in EUR; VAT id DE811907980; billing contact ap@acme-gmbh.example"
    hits = jdump([{"id": "kb-311", "score": 0.82, "text": "Invoices are issued in the account's billing currency."},
                  {"id": "kb-118", "score": 0.77, "text": "To change billing currency, contact finance before the next cycle."}])
    cycle = [[("kv_get", {"key": "customer/ACME-0091/billing"}, note),
              ("vector_search", {"query": "change invoice currency for an existing customer", "top_k": 2}, hits)],
             ("kv_put", {"key": "customer/ACME-0091/billing", "value": note}, "ok")]
    cycle_loop(sc, "You are an account-management agent with a key-value memory and a knowledge base.",
               ["kv_get", "kv_put", "vector_search", "dispatch_email"],
               "ACME GmbH wants future invoices in CHF instead of EUR. Update what's needed and tell finance.", cycle, 5,
               thinks=["Look up the stored billing note and the policy in parallel.", "Save the note.",
                       "Re-read memory and policy.", "Store the note again.", "Check memory and KB.", "Persist the note."])
    sc.description = ("An account agent alternates a parallel memory read plus knowledge-base search with writing "
                      "back the same unchanged note, five times.")


# 6.5 stalled_pagination ----------------------------------------------------

def _contacts(rng, n, start):
    first = ["Ana", "Bilal", "Chloé", "Dmitri", "Esra", "Femi", "Grace", "Hiro", "Ines", "Jonas", "Kavya", "Lukas",
             "Mei", "Nora", "Omar", "Paula", "Quinn", "Rafael", "Sven", "Tara"]
    last = ["Silva", "Khan", "Martin", "Ivanov", "Yilmaz", "Adeyemi", "Okafor", "Tanaka", "Duarte", "Berg"]
    out = []
    for i in range(n):
        f, l = rng.choice(first), rng.choice(last)
        out.append({"id": f"ct_{start + i:06d}", "name": f"{f} {l}", "email": f"{f.lower()}.{l.lower()}@example.com",
                    "trial_ends": f"2027-03-{rng.randint(10, 31):02d}"})
    return out


def page_crm_echo(sc: Scenario):
    rng = sc.rng
    cur1 = b64json({"after": "ct_000025", "seg": "trial-expiring"})
    page1 = jdump({"data": _contacts(rng, 8, 18), "has_more": True, "next_cursor": cur1})
    page2 = jdump({"data": _contacts(rng, 8, 26), "has_more": True, "next_cursor": cur1})
    spec = {
        "system": "You are a lifecycle-marketing agent. Build contact lists from the CRM.",
        "tools": ["crm_list_contacts", "dispatch_email"],
        "user": "Collect every contact in the 'trial-expiring' segment so we can send the reminder campaign.",
        "prelude": [("call", "crm_list_contacts", {"segment": "trial-expiring", "limit": 8}, page1, "Start listing.")],
        "name": "crm_list_contacts", "args": {"segment": "trial-expiring", "cursor": cur1, "limit": 8},
        "out": lambda k: page2, "n": 6, "thinks": THINK_PAGE, "conv": {"thinking": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A CRM agent keeps requesting the same cursor six times because the API echoes it back as "
                      "next_cursor; the page is identical each time.")


def page_jira_stuck(sc: Scenario):
    rng = sc.rng

    def issues(a, b):
        return [{"key": f"OPS-{k}", "summary": rng.choice(["Disk alert on", "Cert expiry for", "Rotate keys for",
                                                           "Upgrade agent on"]) + f" node-{k % 37}", "status": "Open"}
                for k in range(a, b)]
    p1 = jdump({"startAt": 0, "maxResults": 10, "total": 64, "issues": issues(1100, 1110)})
    p2 = jdump({"startAt": 10, "maxResults": 10, "total": 64, "issues": issues(1110, 1120)})
    jql = "project = OPS AND status = Open AND labels = quarterly-hygiene ORDER BY key"
    spec = {
        "system": "You are an operations assistant that triages Jira backlogs.",
        "tools": ["jira_search", "jira_get_issue", "post_chat_message"],
        "user": "List all open quarterly-hygiene tickets in OPS and group them by type.",
        "prelude": [("call", "jira_search", {"jql": jql, "startAt": 0, "maxResults": 10}, p1, "First page.")],
        "name": "jira_search", "args": {"jql": jql, "startAt": 10, "maxResults": 10},
        "out": lambda k: p2, "n": 6, "thinks": THINK_PAGE, "conv": {"reasoning": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A Jira agent requests startAt=10 six times instead of advancing, getting the same second "
                      "page of the 64 results each time.")


def page_bucket_stale(sc: Scenario):
    rng = sc.rng
    t1, t2 = rb64(rng, 48), rb64(rng, 48)

    def keys(n):
        return [{"Key": f"exports/2027/03/{rng.randint(1, 28):02d}/orders-{rhex(rng, 8)}.parquet",
                 "Size": rng.randint(2_000_000, 90_000_000)} for _ in range(n)]
    p1 = jdump({"Contents": keys(10), "IsTruncated": True, "NextContinuationToken": t1})
    p2 = jdump({"Contents": keys(10), "IsTruncated": True, "NextContinuationToken": t2})
    spec = {
        "system": "You are a data-platform assistant with read access to object storage.",
        "tools": ["list_bucket_keys", "head_object"],
        "user": "How many order export files did we write in March 2027, and how much space do they take?",
        "prelude": [("call", "list_bucket_keys", {"bucket": "acme-data-exports", "prefix": "exports/2027/03/"}, p1,
                     "List the prefix.")],
        "name": "list_bucket_keys",
        "args": {"bucket": "acme-data-exports", "prefix": "exports/2027/03/", "continuation_token": t1},
        "out": lambda k: p2, "n": 6, "thinks": THINK_PAGE,
    }
    tool_loop(sc, spec)
    sc.description = ("A storage agent passes the first page's continuation token six times instead of the new "
                      "one, getting the same second page each time.")


def _charges(rng, n):
    out = []
    for _ in range(n):
        out.append({"id": "ch_3Q" + rb62(rng, 22), "object": "charge", "amount": rng.randint(900, 48000),
                    "currency": "usd", "status": "succeeded", "paid": True, "refunded": False,
                    "customer": "cus_" + rb62(rng, 14), "description": rng.choice(["Pro plan", "Team plan", "Add-on seats"]),
                    "payment_method_details": {"type": "card", "card": {"brand": rng.choice(["visa", "mastercard", "amex"]),
                                                                        "last4": rdigits(rng, 4), "exp_year": rng.randint(2027, 2031)}},
                    "created": 1_804_000_000 + rng.randint(0, 900_000)})
    return out


def page_stripe_stuck(sc: Scenario):
    rng = sc.rng
    c1 = _charges(rng, 10)
    c2 = _charges(rng, 10)
    p1 = jdump({"object": "list", "url": "/v1/charges", "has_more": True, "data": c1})
    p2 = jdump({"object": "list", "url": "/v1/charges", "has_more": True, "data": c2})
    spec = {
        "system": "You are a finance operations agent. Summarise payment data on request.",
        "tools": ["stripe_list_charges", "get_charge"],
        "user": "What's our total successful card volume this week, split by card brand?",
        "prelude": [("call", "stripe_list_charges", {"limit": 10}, p1, "First page of charges.")],
        "name": "stripe_list_charges", "args": {"limit": 10, "starting_after": c1[-1]["id"]},
        "out": lambda k: p2, "n": 6, "thinks": THINK_PAGE, "conv": {"thinking": True, "redacted_p": 0.15},
    }
    tool_loop(sc, spec)
    sc.description = ("A finance agent requests the page after the first page's last charge six times, getting "
                      "the same 4 KB second page each time.")


def page_gh_ratelimit(sc: Scenario):
    rng = sc.rng
    prs1 = [{"number": n, "title": f"deps: bump {rng.choice(['serde', 'tokio', 'axum', 'tracing'])} to {rng.randint(1, 9)}.{rng.randint(0, 40)}",
             "user": "renovate[bot]", "state": "closed", "merged": True} for n in range(880, 870, -1)]
    prs2 = [{"number": n, "title": rng.choice(["fix: retry budget", "docs: readme", "feat: gzip", "chore: ci cache"]),
             "user": rng.choice(["mhoff", "lcarvalho", "tsato"]), "state": "closed", "merged": rng.random() < 0.8}
            for n in range(870, 860, -1)]
    remaining = [4981]

    def out(k):
        remaining[0] -= 1
        return f"x-ratelimit-limit: 5000\nx-ratelimit-remaining: {remaining[0]}\n\n" + jdump(prs2)
    spec = {
        "system": "You are a repository analytics agent.",
        "tools": ["gh_list_pull_requests", "gh_get_pull_request"],
        "user": "How many PRs did humans (not bots) merge in acme/edgeproxy this quarter?",
        "prelude": [("call", "gh_list_pull_requests", {"repo": "acme/edgeproxy", "state": "closed", "page": 1, "per_page": 10},
                     "x-ratelimit-limit: 5000\nx-ratelimit-remaining: 4981\n\n" + jdump(prs1), "List closed PRs.")],
        "name": "gh_list_pull_requests", "args": {"repo": "acme/edgeproxy", "state": "closed", "page": 2, "per_page": 10},
        "out": out, "n": 6, "thinks": THINK_PAGE,
    }
    tool_loop(sc, spec)
    sc.description = ("A repository agent requests page 2 six times; the page is identical except for the GitHub "
                      "rate-limit counter that drops by one per call.")


def page_catalog_es(sc: Scenario):
    rng = sc.rng
    names = ["Zapatilla Trail Ridge", "Zapatilla Sendero GTX", "Zapatilla Cumbre", "Zapatilla Montaña Ligera",
             "Zapatilla Roca Pro", "Zapatilla Bosque"]

    def items(n):
        return [{"sku": f"ZT-{rng.randint(1000, 9999)}", "nombre": rng.choice(names), "precio": rng.randint(59, 189),
                 "stock": rng.randint(0, 40)} for _ in range(n)]
    p3 = items(8)
    spec = {
        "system": "Eres el asistente de catálogo de Deportes Altura. Respondes en español.",
        "tools": ["catalog_search", "get_sku"],
        "user": "Hazme una lista de todas las zapatillas de trail con stock por debajo de 5 unidades.",
        "prelude": [("call", "catalog_search", {"q": "zapatillas trail", "page": 1, "page_size": 8},
                     jdump({"page": 1, "total_pages": 6, "resultados": items(8), "request_id": rb62(rng, 16)}),
                     "Primera página.", "Empiezo por la primera página."),
                    ("call", "catalog_search", {"q": "zapatillas trail", "page": 2, "page_size": 8},
                     jdump({"page": 2, "total_pages": 6, "resultados": items(8), "request_id": rb62(rng, 16)}),
                     "Segunda página.")],
        "name": "catalog_search", "args": {"q": "zapatillas trail", "page": 3, "page_size": 8},
        "out": lambda k: jdump({"page": 3, "total_pages": 6, "resultados": p3, "request_id": rb62(rng, 16)}),
        "n": 6, "lang": "es", "thinks": THINK_PAGE,
        "says": ["Sigo con la página 3.", "Consulto la siguiente página.", "Continúo.", "Página siguiente."], "say_p": 0.5,
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("A Spanish catalog agent pages correctly to page 3 and then requests page 3 six times; only "
                      "a fresh request_id changes.")


# 6.6 subagent_bounce -------------------------------------------------------

THINK_DELEGATE = ["Delegate this to the specialist agent.", "The sub-agent should be able to handle it; ask again.",
                  "Hand it over once more with the same request.", "Route the task to the sub-agent.",
                  "Try delegating again.", "This belongs to the sub-agent; send it over.",
                  "Ask the sub-agent again, maybe it has context now."]


def bounce_research(sc: Scenario):
    spec = {
        "system": "You are the orchestrator of a research crew. Delegate research to the research agent and "
                  "write the final answer yourself.",
        "tools": ["ask_research_agent", "ask_sql_agent", "kv_put"],
        "user": "What was Northwind Traders' 2026 revenue growth versus 2025? Cite where the number comes from.",
        "name": "ask_research_agent",
        "args": {"task": "Find Northwind Traders' 2026 and 2025 revenue and compute year-over-year growth. Cite the source."},
        "out": lambda k: ("[research-agent] I can't complete this: Northwind Traders is a private company and its "
                          "revenue isn't in public sources I can reach. The figures live in the internal finance "
                          "warehouse; please route this to the data agent."),
        "n": 6, "thinks": THINK_DELEGATE,
    }
    tool_loop(sc, spec)
    sc.description = ("An orchestrator sends the same task to its research sub-agent six times; the sub-agent hands "
                      "it back with the same refusal each time.")


def bounce_billing_reworded(sc: Scenario):
    rng = sc.rng
    contexts = ["Customer says parcel 1Z84F0 arrived damaged and wants the €89 charge reversed.",
                "Customer reports a damaged delivery (parcel 1Z84F0) and asks to reverse the €89 charge.",
                "Damaged parcel 1Z84F0; customer requests reversal of the €89 charge.",
                "The customer received parcel 1Z84F0 damaged and wants their €89 back.",
                "Parcel 1Z84F0 was damaged on arrival; customer asks us to reverse the €89 payment.",
                "Reverse the €89 charge: parcel 1Z84F0 arrived damaged, per the customer."]
    replies = ["[billing-agent] Damage claims are handled by shipping support, not billing. Returning this to triage.",
               "[billing-agent] This is a carrier damage issue; billing can't act until shipping support approves a claim. Handing back.",
               "[billing-agent] Not a billing matter: shipping support owns damaged-parcel claims. Sending it back to you.",
               "[billing-agent] I can only reverse charges once a shipping claim is approved. Please route to shipping support. Returning.",
               "[billing-agent] Handing back: damaged deliveries go to shipping support first.",
               "[billing-agent] Billing can't process this without an approved damage claim from shipping support; returning to triage."]
    conv = sc.conv("You are the triage agent for Kettle & Co. support. Route each case to the right agent.",
                   ["handoff_to_billing_agent", "lookup_tracking", "reply_to_customer"], reasoning=True)
    r = Run(sc, conv)
    r.user("Hi, my kettle arrived with a cracked base (order KC-22817, tracking 1Z84F0). I want my €89 back.")
    r.call("lookup_tracking", {"carrier": "ups", "tracking_number": "1Z84F0"},
           jdump({"status": "delivered", "delivered_at": "2027-03-14T11:02:00Z", "exceptions": []}),
           think="Confirm delivery first.")
    for k in range(6):
        r.call("handoff_to_billing_agent", {"reason": "refund request", "context": contexts[k]}, replies[k],
               think=THINK_DELEGATE[k % len(THINK_DELEGATE)], occ=True)
    sc.description = ("A triage agent hands the same damaged-parcel refund to the billing agent six times with "
                      "reworded context; the billing agent sends it back each time in other words.")


def bounce_sql_ambiguous(sc: Scenario):
    spec = {
        "system": "You are a business-intelligence orchestrator. The SQL agent answers data questions.",
        "tools": ["ask_sql_agent", "plot_series"],
        "user": "How did gross margin change last quarter compared with the quarter before?",
        "name": "ask_sql_agent", "args": {"question": "Gross margin last quarter vs. the previous quarter"},
        "out": lambda k: ("Ambiguous request: 'last quarter' can mean fiscal Q4 FY26 (Nov 2026 to Jan 2027) or calendar "
                          "Q4 2026 (Oct to Dec). I won't guess because the answers differ by 2.1 points. Please "
                          "specify which and ask again."),
        "n": 6, "thinks": THINK_DELEGATE, "conv": {"thinking": True},
    }
    tool_loop(sc, spec)
    sc.description = ("A BI orchestrator asks the SQL agent the same ambiguous question six times; the agent "
                      "returns the same clarification request and the orchestrator never clarifies.")


def bounce_legal_fr(sc: Scenario):
    spec = {
        "system": "Tu es l'agent général du service client d'Assurances Mistral. Tu transfères aux spécialistes "
                  "quand c'est nécessaire. Réponds en français.",
        "tools": ["transfer_to_specialist", "search_help_center"],
        "user": "Mon voisin a inondé mon appartement, son assureur refuse de payer. Est-ce que vous pouvez m'aider juridiquement ?",
        "name": "transfer_to_specialist",
        "args": {"specialist": "juridique", "summary": "Dégât des eaux causé par un voisin ; l'assureur du voisin refuse l'indemnisation. Le client demande une aide juridique."},
        "out": lambda k: ("[spécialiste juridique] Hors de mon périmètre : le contrat du client n'inclut pas la "
                          "protection juridique. La déclaration de sinistre relève de l'agent général. Retransfert."),
        "n": 6, "lang": "fr", "thinks": THINK_DELEGATE,
        "says": ["Je vous transfère au service juridique.", "Je transmets de nouveau votre dossier.",
                 "Je relance le transfert.", "Je réessaie le transfert vers le juridique."], "say_p": 0.6,
    }
    tool_loop(sc, spec)
    sc.description = ("A French insurance agent transfers the same case to the legal specialist six times; the "
                      "specialist sends it back with the same message each time.")


def bounce_review_reworded(sc: Scenario):
    instr = ["Review PR 4821 for correctness and security issues.",
             "Please review PR 4821; focus on correctness and security.",
             "Do a correctness + security review of PR 4821.",
             "Review pull request 4821 for bugs and security problems.",
             "Security and correctness review needed on PR 4821.",
             "Please review PR 4821 (correctness, security)."]
    conv = sc.conv("You coordinate code changes. Every PR must be reviewed by the code-review agent before merge.",
                   ["ask_code_review_agent", "gh_get_pull_request", "post_chat_message"], reasoning=True, encrypted=True)
    r = Run(sc, conv)
    r.user("Get PR 4821 (the monorepo-wide logging migration) reviewed and merged today.")
    r.call("gh_get_pull_request", {"repo": "acme/monorepo", "number": 4821},
           jdump({"number": 4821, "title": "Migrate all services to structured logging", "changed_files": 1284,
                  "additions": 18211, "deletions": 16990, "state": "open"}), think="Look at the PR size.")
    out = ("Cannot review: the diff touches 1,284 files (limit 400). Split the PR or give me a path filter, then ask again.")
    for k in range(6):
        r.call("ask_code_review_agent", {"pr": "acme/monorepo#4821", "instructions": instr[k]}, out,
               think=THINK_DELEGATE[k % len(THINK_DELEGATE)], occ=True)
    sc.description = ("A coordinator asks the review agent to review the same oversized PR six times with reworded "
                      "instructions; the agent refuses identically each time.")


def bounce_planner(sc: Scenario):
    payload = "Deploy partner-api v1.9 to staging. Blocked: deploy key rejected (403)."
    spec = {
        "system": "You are the executor agent of a two-agent crew. The planner decides; you execute plans with your tools.",
        "tools": ["handoff", "ssh_exec", "post_chat_message"],
        "user": "Ship partner-api v1.9 to staging.",
        "prelude": [("call", "ssh_exec", {"host": "deploy-01", "cmd": "deployctl push partner-api v1.9 --env staging"},
                     "error: deploy key rejected by registry (403 Forbidden)", "Try the deploy directly.")],
        "name": "handoff", "args": {"to": "planner", "payload": payload},
        "out": lambda k: ("[planner] Plan: 1) Executor verifies the deploy credentials at vault path "
                          "secret/data/partner-api/deploy. 2) Executor retries the deploy. Handing back to executor."),
        "n": 6, "thinks": ["I don't have vault access; ask the planner for another plan.",
                           "The plan requires vault, which I can't reach. Hand back to the planner.",
                           "Same plan. Escalate back to the planner.", "Return to the planner.",
                           "I can't execute step 1. Back to planner.", "Hand off again."],
        "conv": {"thinking": True, "redacted_p": 0.2},
    }
    tool_loop(sc, spec)
    sc.description = ("An executor agent hands a blocked deploy to its planner six times; the planner returns the "
                      "same plan requiring access the executor lacks.")


# 6.7 client_resend_storm ---------------------------------------------------

def storm(sc: Scenario, conv: Conversation, client: Client, sends: int, forged=None, statuses=None, warmup=None):
    """Send the current body ``sends`` times byte-identically (after 200 answers)."""
    r = Run(sc, conv, client)
    if warmup:
        warmup(r)
    for i in range(sends):
        extra = None
        if forged is not None:
            v = forged(i)
            if v is not None:
                extra = {"x-stainless-retry-count": str(v)}
        st = statuses[i] if statuses else None
        body = conv.render()
        idx = sc.add_request(client, r.session, body, st, None, conv.uses_files, extra)
        sc.mark_occurrence(idx)
    return r


def storm_curl(sc: Scenario):
    conv = sc.conv("You are a concise assistant.", [], extra={"temperature": 0})
    conv.add_user("Summarise in one sentence: The maintenance window for the EU cluster moves from Saturday 02:00 "
                  "to Sunday 03:00 UTC starting next month.")
    storm(sc, conv, sc.client("curl"), 8)
    sc.description = ("A plain HTTP script re-posts the same single-turn summarisation body eight times back to back "
                      "in one session, every send answered 200.")


def storm_forged_constant(sc: Scenario):
    conv = sc.conv("You help the marketing team write product copy.", [])
    client = sc.client(sdk=True)

    def warm(r):
        r.user("Write a tagline for our new insulated bottle, the Kelvin 750.")
        r.say("Kelvin 750: cold for 24 hours, hot for 12, and tough enough for every trail.")
        r.user("Shorter, and mention it's made from recycled steel.")
        r.say("Kelvin 750: recycled steel, 24 hours cold.")
        conv.add_user("Give me three more options in that style.")
    storm(sc, conv, client, 7, forged=lambda i: 1 if i else None, warmup=warm)
    sc.description = ("After two normal turns a copywriting client re-sends the same body seven times after 200 "
                      "answers, the resends carrying a constant forged x-stainless-retry-count: 1.")


def storm_forged_increment(sc: Scenario):
    conv = sc.conv("You are an assistant for warehouse staff.", ["lookup_tracking"])
    client = sc.client(sdk=True)

    def warm(r):
        r.user("Where is parcel 00340434161094287395 (DHL)?")
        r.call("lookup_tracking", {"carrier": "dhl", "tracking_number": "00340434161094287395"},
               jdump({"status": "in_transit", "last_event": "Arrived at hub Leipzig", "eta": "2027-03-17"}))
        r.say("It's in transit, last seen at the Leipzig hub; expected delivery 17 March.")
        conv.add_user("Thanks. Can you also tell me what time the Leipzig hub closes?")
    storm(sc, conv, client, 6, forged=lambda i: i if i else None, warmup=warm)
    sc.description = ("After one tool round trip a client re-sends the same body six times after 200 answers with "
                      "x-stainless-retry-count forged as 1 to 5, beyond the SDK's limit of two retries.")


def storm_stream_sdk(sc: Scenario):
    conv = sc.conv("You are Ledgerly's in-app assistant. Answer questions about invoices.", [],
                   extra={"stream": True, "stream_options": {"include_usage": True}})
    conv.add_user("How do I add a second VAT rate to one invoice?")
    client = sc.client(sdk=True)
    storm(sc, conv, client, 9)
    sc.description = ("A streaming app client re-sends the same question nine times after 200 answers (a re-render "
                      "bug) with its ordinary, unforged SDK headers.")


def storm_image_429(sc: Scenario):
    conv = sc.conv("Describe product photos for alt text. One sentence.", [])
    conv.add_user("Alt text for this photo, please.", [sc.image("low")])
    storm(sc, conv, sc.client("axios"), 7, statuses=[None, None, None, None, None, 429, 429])
    sc.description = ("A web client re-posts the same alt-text request with an inline image seven times after 200 "
                      "answers, until the provider starts answering 429.")


def storm_thinking_forged(sc: Scenario):
    conv = sc.conv("You are a careful travel planner.", ["find_hotels"], thinking=True)
    client = sc.client(sdk=True)

    def warm(r):
        r.user("Find me a hotel in Porto for 2 adults, 12-15 April 2027, near Ribeira, under €150/night.")
        r.call("find_hotels", {"city": "Porto", "check_in": "2027-04-12", "check_out": "2027-04-15", "guests": 2},
               jdump([{"name": "Casa do Cais", "area": "Ribeira", "eur_night": 138, "rating": 8.9},
                      {"name": "Hotel Miradouro", "area": "Sé", "eur_night": 121, "rating": 8.4}]),
               think="Search hotels for the dates.")
        r.say("Casa do Cais in Ribeira fits: €138/night, rated 8.9. Hotel Miradouro in Sé is cheaper at €121.",
              think="Summarise the two options.")
        r.user("Does Casa do Cais have air conditioning?")
        r.say("Yes, all rooms at Casa do Cais have air conditioning, according to the listing.", think="Answer from listing.")
        conv.add_user("Great, and is breakfast included?")
    storm(sc, conv, client, 7, forged=lambda i: 2 if i else None, warmup=warm)
    sc.description = ("After three normal turns a travel client re-sends the same body seven times after 200 "
                      "answers, each resend carrying a forged x-stainless-retry-count: 2.")


# 6.8 loop_under_changing_context -------------------------------------------

def ctx_calendar(sc: Scenario):
    clock = sc.clock
    base = "You are Juno, the executive assistant of Dana Whitfield (dana@whitfield-partners.example)."
    busy = jdump({"dana@whitfield-partners.example": [["09:00", "12:30"], ["13:00", "18:00"]],
                  "r.osei@northwind.example": [["08:30", "11:00"], ["12:00", "17:30"]]})
    spec = {
        "system": base,
        "tools": ["calendar_free_busy", "schedule_meeting"],
        "user": "Set up a 45-minute call with Richard Osei from Northwind on Tuesday.",
        "name": "calendar_free_busy",
        "args": {"attendees": ["dana@whitfield-partners.example", "r.osei@northwind.example"],
                 "start": "2027-03-16T08:00:00-05:00", "end": "2027-03-16T18:00:00-05:00"},
        "out": lambda k: busy, "n": 7,
        "thinks": ["Check both calendars for Tuesday.", "No overlap yet; check Tuesday again.",
                   "Look at Tuesday's availability once more.", "Re-check free/busy for Tuesday.",
                   "Check again; maybe something freed up.", "Free/busy for Tuesday.", "Check Tuesday."],
        "hook": lambda r: (clock.tick(15, 70), setattr(r.conv, "system", f"{base}\nCurrent date and time: {clock.human()}")),
    }
    tool_loop(sc, spec)
    sc.description = ("An assistant whose system prompt carries the current time checks the same Tuesday free/busy "
                      "seven times, always fully booked, and never proposes another day.")


def ctx_budget(sc: Scenario):
    rng = sc.rng
    left = [rng.randint(180_000, 200_000)]
    static = "You are the Helix knowledge agent. Answer engineers' questions from the internal knowledge base."

    def hook(r):
        left[0] -= rng.randint(2500, 6000)
        r.conv.system = f"{static}\n\nToken budget remaining for this task: {left[0]:,}"
    hits = jdump([{"doc": "runbooks/kafka-rebalance.md", "score": 0.71, "snippet": "Rebalances are triggered when a consumer joins or leaves..."},
                  {"doc": "adr/014-consumer-groups.md", "score": 0.69, "snippet": "We use static membership for the billing consumers..."}])
    spec = {
        "system": static, "tools": ["vector_search", "browse_url"],
        "user": "Why do the ledger consumers rebalance every time we deploy, and how do we stop it?",
        "name": "vector_search", "args": {"query": "ledger consumer rebalance on deploy", "top_k": 2},
        "out": lambda k: hits, "n": 7, "hook": hook, "conv": {"reasoning": True},
        "thinks": ["Search the knowledge base.", "Results mention static membership; search again for the ledger specifics.",
                   "Search once more.", "Try the same search to get more detail.", "Search again.",
                   "Look for the ledger consumers in the KB.", "Search."],
    }
    tool_loop(sc, spec)
    sc.description = ("A knowledge agent whose instructions show a shrinking token budget runs the same vector "
                      "search seven times with identical hits.")


def ctx_memory_tracking(sc: Scenario):
    clock = sc.clock
    static = ("You are the post-purchase assistant of Hearth & Loom. Keep your <memory> block up to date; it is "
              "rewritten by the runtime after each step.")
    def hook(r):
        clock.tick(20, 60)
        n = r.sent
        lines = [f"updated: {clock.iso_s()}", "task: tell customer when order HL-5521 arrives",
                 f"tracking checks so far: {n}"]
        if n:
            lines.append("last result: label created, no carrier scan yet")
            lines.append("next: check tracking again")
        r.conv.system = (static, "<memory>\n" + "\n".join(lines) + "\n</memory>")
    out = jdump({"carrier": "ups", "tracking_number": "1Z999AA10123456784", "status": "label_created",
                 "events": [{"time": "2027-03-10T16:22:00Z", "desc": "Shipper created a label, UPS has not received the package yet."}]})
    spec = {
        "system": (static, "<memory>\n</memory>"), "tools": ["lookup_tracking", "reply_to_customer"],
        "user": "Hi, when will my rug (order HL-5521) arrive? Tracking 1Z999AA10123456784.",
        "name": "lookup_tracking", "args": {"carrier": "ups", "tracking_number": "1Z999AA10123456784"},
        "out": lambda k: out, "n": 7, "hook": hook, "conv": {"thinking": True},
        "thinks": ["Check the tracking.", "Still label created. Check again.", "Memory says check again.",
                   "Look up tracking once more.", "Check UPS again.", "Tracking again.", "One more check."],
    }
    tool_loop(sc, spec)
    sc.description = ("A support agent whose system memory block is rewritten every turn looks up the same "
                      "label-created tracking number seven times.")


def ctx_hotels_es(sc: Scenario):
    clock = sc.clock
    base = "Eres Viajero, el asistente de viajes de Ruta Azul. Respondes en español."
    hotels = jdump([{"nombre": "Hotel Alameda", "precio_noche": 212, "zona": "Centro"},
                    {"nombre": "Sevilla Palacio", "precio_noche": 245, "zona": "Triana"},
                    {"nombre": "Casa Giralda", "precio_noche": 198, "zona": "Santa Cruz"}])
    def hook(r):
        clock.tick(10, 40)
        r.conv.system = (f"{base}\nFecha y hora actual: {clock.t.strftime('%d/%m/%Y %H:%M')} UTC\n"
                         f"Memoria: búsquedas realizadas = {r.sent}; presupuesto del cliente = 150 €/noche")
    spec = {
        "system": base, "tools": ["find_hotels"],
        "user": "Busco hotel en Sevilla para 2 personas del 2 al 5 de abril, máximo 150 € la noche.",
        "name": "find_hotels", "args": {"city": "Sevilla", "check_in": "2027-04-02", "check_out": "2027-04-05", "guests": 2},
        "out": lambda k: hotels, "n": 7, "hook": hook, "lang": "es",
        "says": ["Busco de nuevo.", "Vuelvo a buscar por si hay algo más barato.", "Repito la búsqueda.",
                 "Otra búsqueda.", "Consulto otra vez la disponibilidad."], "say_p": 0.6,
        "thinks": ["Search hotels.", "All over budget; search again.", "Maybe prices changed; search again.",
                   "Search once more.", "Search.", "Retry the search.", "Another search."],
    }
    tool_loop(sc, spec)
    sc.description = ("A Spanish travel agent whose system prompt carries the time and a search counter repeats "
                      "the same hotel search seven times, every result over budget.")


def ctx_parallel_skus(sc: Scenario):
    clock = sc.clock
    base = "You are the merchandising agent for Fjord Supply. Keep product pages accurate."
    skus = ["FS-JKT-0142", "FS-JKT-0143", "FS-JKT-0151"]

    def fn(k, j):
        return jdump({"sku": skus[j], "title": ["Storm Shell Jacket M", "Storm Shell Jacket L", "Storm Shell Jacket XL"][j],
                      "price": 229.0, "compare_at": None, "status": "active"})

    def hook(r):
        clock.tick(45, 150)
        r.conv.system = f"{base}\nToday: {clock.date()} · Local time {clock.hm()} (UTC)"
    spec = {
        "system": base, "tools": ["get_sku", "update_listing"],
        "user": "Put the Storm Shell jackets (M, L, XL) on sale at 20% off with the old price shown as compare-at.",
        "par": [("get_sku", {"sku": s}, fn) for s in skus], "n": 6, "hook": hook,
        "conv": {"reasoning": True, "extra": {"parallel_tool_calls": True}},
        "thinks": ["Fetch the three SKUs in parallel.", "Check the current prices again before updating.",
                   "Re-fetch the SKUs.", "Look at the three products again.", "Fetch them again.", "Get the SKUs."],
    }
    tool_loop(sc, spec)
    sc.description = ("A merchandising agent with a clock in its instructions fetches the same three SKUs in "
                      "parallel six times and never updates them.")


def ctx_context_meter(sc: Scenario):
    rng = sc.rng
    used = [rng.randint(30, 40)]
    static = "You are an SRE copilot for the search cluster."

    def hook(r):
        used[0] += rng.randint(2, 5)
        r.conv.system = (static, f"Context window used: {min(used[0], 99)}%. Summarise findings before reaching 90%.")
    nodes = text_table([["es-data-0", "Ready", "v1.29.4"], ["es-data-1", "Ready", "v1.29.4"],
                        ["es-data-2", "NotReady", "v1.29.4"]], ["NAME", "STATUS", "VERSION"])
    spec = {
        "system": (static, "Context window used: 30%."), "tools": ["kubectl_get", "kubectl_describe", "post_chat_message"],
        "user": "Search latency doubled ten minutes ago. Is a node down?",
        "name": "kubectl_get", "args": {"resource": "nodes", "namespace": "search", "selector": "pool=es-data"},
        "out": lambda k: nodes, "n": 7, "hook": hook, "conv": {"thinking": True, "redacted_p": 0.15},
        "thinks": ["List the nodes.", "es-data-2 is NotReady; list again to confirm.", "Check nodes again.",
                   "Re-list nodes.", "Check once more.", "Look at node status.", "Nodes again."],
    }
    tool_loop(sc, spec)
    sc.description = ("An SRE copilot with a rising context-usage meter in its system prompt lists the same nodes "
                      "seven times and never describes the NotReady one.")


PLAN_VARIANTS = [
    "Plan:\n1. Export the churned accounts from the CRM.\n2. Join them with last quarter's support tickets.\n"
    "3. Tag the top five complaint themes.\n4. Draft the summary for the retention meeting.",
    "Here's the plan:\n1. Pull churned accounts out of the CRM.\n2. Match them against support tickets from last quarter.\n"
    "3. Identify the five most common complaint themes.\n4. Write up the summary for the retention meeting.",
    "Plan of action:\n1. Get the list of churned accounts from the CRM.\n2. Combine it with Q4 support tickets.\n"
    "3. Label the five leading complaint themes.\n4. Prepare the retention-meeting summary.",
    "Steps:\n1. CRM export of churned accounts.\n2. Join with the previous quarter's tickets.\n"
    "3. Find the top 5 complaint themes.\n4. Draft the summary for the retention sync.",
    "My plan:\n1. Export churned customers from the CRM.\n2. Link them to last quarter's support tickets.\n"
    "3. Tag the five biggest complaint themes.\n4. Draft a summary for the retention meeting.",
    "Proposed plan:\n1. Extract churned accounts (CRM).\n2. Join to support tickets, last quarter.\n"
    "3. Categorise the top five complaint themes.\n4. Summarise for the retention meeting.",
    "Plan:\n1. Fetch churned accounts from the CRM.\n2. Cross-reference last quarter's support tickets.\n"
    "3. Pick out the five main complaint themes.\n4. Put together the retention-meeting summary.",
]


def ctx_plan_text(sc: Scenario):
    clock = sc.clock
    static = "You are the planning module of an analysis agent. Each turn, continue the task from the progress log."
    log = []
    conv = sc.conv(static, [])
    r = Run(sc, conv)

    def hook(run):
        clock.tick(30, 90)
        log.append(f"{clock.hm()} planner turn {len(log) + 1}: plan emitted, no step executed")
        run.conv.system = static + "\n\nProgress log:\n" + "\n".join(log[-6:])
    r.hook = hook
    r.user("Task: explain why customers churned last quarter, for Thursday's retention meeting.")
    drivers = ["Proceed with the next step.", "Continue.", "Go on with the task.", "Next step, please.",
               "Keep going.", "Continue with the task.", "Proceed."]
    for k, plan in enumerate(PLAN_VARIANTS):
        r.say(plan, occ=True)
        r.user(drivers[k])
    sc.description = ("A planner whose system prompt carries a rewritten progress log restates the same four-step "
                      "plan in new words seven times while the driver says 'continue'.")


def ctx_email_resend(sc: Scenario):
    rng, clock = sc.rng, sc.clock
    static = "You are the accounts-receivable agent of Bluepeak Ltd."

    def hook(r):
        clock.tick(20, 60)
        r.conv.system = (f"{static}\nNow: {clock.iso_s()}\nScratchpad: reminder to Orbis Retail for invoice INV-20417 "
                         "(EUR 18,400, 21 days overdue) — delivery not yet confirmed.")
    spec = {
        "system": static, "tools": ["dispatch_email", "execute_query"],
        "user": "Chase Orbis Retail about invoice INV-20417. Make sure they get the reminder.",
        "name": "dispatch_email",
        "args": {"to": "ap@orbis-retail.example", "subject": "Reminder: invoice INV-20417 is overdue",
                 "body": "Dear Orbis Retail team,\n\ninvoice INV-20417 (EUR 18,400.00) was due on 22 February 2027. "
                         "Could you let us know when payment is scheduled?\n\nKind regards,\nBluepeak Accounts Receivable"},
        "out": lambda k: f"accepted: message <{rhex(rng, 12)}.{rhex(rng, 6)}@mail.bluepeak.example> queued for delivery",
        "n": 6, "hook": hook, "conv": {"reasoning": True},
        "thinks": ["Send the reminder.", "Delivery isn't confirmed in the scratchpad; send again to be sure.",
                   "Still not confirmed. Resend.", "Send the reminder again.", "Make sure they get it; send.",
                   "Resend the e-mail."],
    }
    tool_loop(sc, spec)
    sc.tags.append("outside_mask_list")
    sc.description = ("An accounts-receivable agent with a clock and scratchpad in its instructions sends the same "
                      "reminder e-mail six times; only the queued message id changes.")


def ctx_helpcenter_de(sc: Scenario):
    clock = sc.clock
    base = "Du bist der Kundenservice-Assistent von Nordlicht Möbel. Antworte auf Deutsch."

    def hook(r):
        clock.tick(10, 45)
        r.conv.system = (base, f"Aktuelles Datum und Uhrzeit: {clock.t.strftime('%d.%m.%Y, %H:%M:%S')} UTC")
    arts = jdump([{"titel": "Rücksendung innerhalb von 30 Tagen", "auszug": "Unbenutzte Artikel können innerhalb von 30 Tagen zurückgesendet werden..."},
                  {"titel": "Sperrgut abholen lassen", "auszug": "Für Sofas und Schränke vereinbaren wir einen Abholtermin..."}])
    spec = {
        "system": (base, "Aktuelles Datum und Uhrzeit: –"), "tools": ["search_help_center", "escalate_case"],
        "user": "Ich habe mein Sofa vor 34 Tagen bekommen, der Bezug reißt schon. Kann ich es noch zurückgeben?",
        "name": "search_help_center", "args": {"query": "Rückgabe nach 30 Tagen Mangel Sofa", "locale": "de-DE"},
        "out": lambda k: arts, "n": 7, "hook": hook, "lang": "de", "conv": {"thinking": True},
        "says": ["Ich schaue in unseren Hilfeartikeln nach.", "Ich suche noch einmal.", "Einen Moment, ich prüfe das erneut.",
                 "Ich suche weiter."], "say_p": 0.6,
        "thinks": ["Search the help center.", "The results don't cover defects after 30 days; search again.",
                   "Search once more.", "Search again for warranty.", "Same search.", "Search.", "Try again."],
    }
    tool_loop(sc, spec)
    sc.description = ("A German furniture-support agent with the current time in its system prompt runs the same "
                      "help-center search seven times and never escalates the warranty case.")


# ---------------------------------------------------------------------------
# 7. Healthy builders
# ---------------------------------------------------------------------------

# 7.1 marathon_session: 50+ requests of real-looking work -------------------

def _budget_hook(sc: Scenario, static: str, start: int, label: str = "Token budget"):
    left = [start]

    def hook(r):
        left[0] -= sc.rng.randint(900, 3800)
        r.conv.system = f"{static}\n\n{label}: {left[0]:,} tokens remaining."
    return hook


def marathon_httpx(sc: Scenario):
    rng = sc.rng
    mods = ["billing/client", "billing/webhooks", "catalog/sync", "catalog/images", "shipping/rates", "shipping/labels",
            "auth/oidc", "auth/session", "search/indexer", "notify/sms", "notify/push", "reports/exporter"]
    fails = set(rng.sample(range(len(mods)), 4))
    twice = set(rng.sample([i for i in range(len(mods)) if i not in fails], 5))
    static = ("You are a senior Python engineer agent working in /workspace/orbit. Make small, verified changes and "
              "run the relevant tests after each module.")
    conv = sc.conv(static, ["grep_repo", "open_source_file", "edit_source", "exec_tests", "check_types"])
    r = Run(sc, conv)
    r.hook = _budget_hook(sc, static, rng.randint(900_000, 1_000_000))
    r.user("We're replacing `requests` with `httpx` across the service. Go module by module, run each module's "
           "tests, and keep every timeout at 10 seconds.")
    r.call("grep_repo", {"pattern": r"^(import requests|from requests)", "glob": "app/**/*.py"},
           "\n".join(f"app/{m}.py:{rng.randint(1, 9)}:import requests" for m in mods))
    fn_names = ["fetch_invoice", "post_event", "pull_feed", "download_image", "quote_rate", "create_label",
                "exchange_code", "refresh_session", "push_batch", "send_sms", "send_push", "upload_report"]
    for i, m in enumerate(mods):
        path = f"app/{m}.py"
        test = f"tests/{m.replace('/', '/test_')}.py"
        line = rng.randint(20, 140)
        fn = fn_names[i]
        verb = rng.choice(["get", "post"])
        r.call("open_source_file", {"path": path, "start": line, "end": line + 6},
               f"def {fn}(self, url, payload=None):\n    resp = requests.{verb}(url, json=payload, timeout=10,\n"
               f"                         headers=self._headers())\n    resp.raise_for_status()\n    return resp.json()")
        r.call("edit_source", {"path": path, "old": "import requests", "new": "import httpx"},
               f"Applied 1 replacement in {path} (line {rng.randint(1, 9)}).")
        r.call("edit_source", {"path": path, "old": f"requests.{verb}(url, json=payload, timeout=10,",
                               "new": f"httpx.{verb}(url, json=payload, timeout=10.0,"},
               f"Applied 1 replacement in {path} (line {line + 1}).")
        if i in twice:
            r.call("edit_source", {"path": path, "old": "except requests.RequestException", "new": "except httpx.HTTPError"},
                   f"Applied 1 replacement in {path} (line {line + rng.randint(8, 30)}).")
        n = rng.randint(4, 19)
        cmd = {"cmd": f"pytest {test} -q"}
        if i in fails:
            r.call("exec_tests", cmd, f"{n - 1} passed, 1 failed in {rng.uniform(0.3, 2.0):.2f}s\nFAILED {test}::test_{fn}_timeout - "
                                      "AttributeError: module 'httpx' has no attribute 'Timeout' used as exception")
            r.call("edit_source", {"path": path, "old": "except requests.Timeout", "new": "except httpx.TimeoutException"},
                   f"Applied 1 replacement in {path} (line {line + rng.randint(8, 30)}).")
            sc.tags.append("near_miss")  # the same test command is legitimately rerun after the fix
        r.call("exec_tests", cmd, f"{n} passed in {rng.uniform(0.3, 2.0):.2f}s")
        if i in (3, 7):
            r.say(f"Progress: {i + 1} of {len(mods)} modules migrated, all their tests pass.")
            r.user(["Nice. For the webhook retries, keep the old behaviour of 3 attempts.",
                    "Good. Skip nothing; the SMS module is used by on-call paging too."][i == 7])
    r.call("exec_tests", {"cmd": "pytest -q -x"}, f"{rng.randint(400, 520)} passed, 3 skipped in {rng.uniform(30, 60):.2f}s")
    r.call("check_types", {"paths": ["app"]}, "Success: no issues found in 212 source files")
    r.say("All 12 modules now use httpx with 10 s timeouts; the full suite and mypy pass.")
    r.user("Great work, open a PR titled 'Replace requests with httpx'.")
    sc.description = ("A coding agent with a token budget in its system prompt migrates twelve modules from requests "
                      "to httpx, opening, editing and testing each one, rerunning tests after fixes.")


def marathon_incident(sc: Scenario):
    rng, clock = sc.rng, sc.clock
    svcs = ["edge-gateway", "auth", "catalog", "cart", "checkout", "payments", "inventory", "search",
            "recommendations", "notifications"]
    static = "You are the incident copilot for the commerce platform. Be precise; post updates to #inc-commerce."
    conv = sc.conv(static, ["query_prometheus", "tail_service_logs", "kubectl_get", "fetch_trace", "rollback_release",
                            "scale_deployment", "post_chat_message", "open_incident"], reasoning=True)
    r = Run(sc, conv)

    def hook(run):
        clock.tick(20, 75)
        run.conv.system = f"{static}\nCurrent time: {clock.iso_s()}"
    r.hook = hook
    t0 = clock.t

    def at(minutes: int) -> str:
        """Wall-clock HH:MM relative to the start of the incident chat."""
        return (t0 + dt.timedelta(minutes=minutes)).strftime("%H:%M")
    r.user("Checkout conversion dropped 30% in the last 15 minutes. Start an incident and find the cause.")
    r.call("open_incident", {"title": "Checkout conversion drop", "severity": "sev2"},
           jdump({"id": "INC-7731", "channel": "#inc-commerce", "commander": "you"}), think="Open the incident first.")
    p99 = {s: rng.randint(40, 260) for s in svcs}
    p99["payments"] = rng.randint(2400, 3900)
    p99["checkout"] = rng.randint(1800, 2600)
    for chunk in (svcs[0:4], svcs[4:7], svcs[7:10]):
        r.calls([("query_prometheus", {"expr": f'histogram_quantile(0.99, sum by (le) (rate(http_server_duration_seconds_bucket{{service="{s}"}}[5m])))',
                                       "range": "30m"}, f"{s}: p99 {p99[s]} ms (30m ago: {rng.randint(40, 250)} ms)")
                 for s in chunk], think="Compare p99 latency across services.")
    for s in svcs:
        r.call("query_prometheus", {"expr": f'sum(rate(http_server_requests_total{{service="{s}",code=~"5.."}}[5m]))', "range": "30m"},
               f"{s}: {rng.uniform(0, 0.4) if s not in ('payments', 'checkout') else rng.uniform(12, 40):.2f} errors/s")
    r.call("post_chat_message", {"channel": "#inc-commerce", "text": "INC-7731: payments p99 ~3s and 5xx elevated; checkout follows. Investigating payments."},
           "ok: message posted")
    r.user(f"Payments deployed v4.12.0 at {at(-17)}. Related?")
    r.call("tail_service_logs", {"service": "payments", "lines": 40, "since": at(-22)},
           f"{at(-16)}:02 WARN pool exhausted (max=20, waiting=143)\n{at(-16)}:03 ERROR timeout acquiring connection after 3000ms\n"
           f"{at(-16)}:05 WARN pool exhausted (max=20, waiting=151)")
    r.call("kubectl_get", {"resource": "deployments", "namespace": "payments"},
           text_table([["payments-api", "12/12", "v4.12.0"], ["payments-worker", "4/4", "v4.12.0"]], ["NAME", "READY", "IMAGE"]))
    trace_ids = [rhex(rng, 32) for _ in range(3)]
    for t in trace_ids:
        r.call("fetch_trace", {"trace_id": t},
               f"trace {t}: checkout.submit 3.4s → payments.authorize 3.2s → db.acquire 3.0s (timeout)")
    r.call("query_prometheus", {"expr": 'max(db_pool_max_connections{service="payments"})', "range": "2h"},
           f"before {at(-17)}: 60 · after {at(-17)}: 20")
    r.say("v4.12.0 lowered the payments DB pool from 60 to 20 connections; requests queue for a connection and time out.")
    r.user("Roll it back.")
    r.call("rollback_release", {"release": "payments", "revision": 187}, "Rollback was a success! Happy Helming!")
    r.call("post_chat_message", {"channel": "#inc-commerce", "text": "INC-7731: rolled payments back to rev 187 (v4.11.3). Watching."},
           "posted")
    for i in range(6):
        r.call("query_prometheus", {"expr": f'histogram_quantile(0.99, sum by (le) (rate(http_server_duration_seconds_bucket{{service="payments"}}[{i + 1}m])))',
                                    "range": "15m"}, f"payments: p99 {max(120, 3000 - 520 * (i + 1))} ms")
    r.call("query_prometheus", {"expr": 'sum(rate(checkout_completed_total[5m]))', "range": "1h"},
           f"{rng.uniform(38, 44):.1f}/s (baseline 41.2/s)")
    for s in ("checkout", "cart", "edge-gateway"):
        r.call("query_prometheus", {"expr": f'sum(rate(http_server_requests_total{{service="{s}",code=~"5.."}}[5m]))', "range": "15m"},
               f"{s}: {rng.uniform(0, 0.3):.2f} errors/s")
    r.call("scale_deployment", {"namespace": "payments", "name": "payments-worker", "replicas": 6}, "deployment.apps/payments-worker scaled")
    r.call("kubectl_get", {"resource": "pods", "namespace": "payments", "selector": "app=payments-worker"},
           "\n".join(f"payments-worker-5f7b9-{rb62(rng, 5).lower()}  1/1  Running  0  {k}m" for k in (1, 1, 2, 9, 9, 9)))
    r.user("Good. Who approved the pool change? I need it for the postmortem.")
    r.call("tail_service_logs", {"service": "deploy-bot", "lines": 20, "since": at(-60)},
           f"{at(-19)}:51 deploy payments v4.12.0 approved by m.fischer (PR #5120: 'tune db pool for new replicas')")
    r.call("post_chat_message", {"channel": "#inc-commerce", "text": f"INC-7731 mitigated {clock.hm()}. Cause: DB pool 60→20 in v4.12.0 (PR #5120). Postmortem to follow."},
           "posted")
    for s in svcs[:8]:
        r.call("query_prometheus", {"expr": f'histogram_quantile(0.99, sum by (le) (rate(http_server_duration_seconds_bucket{{service="{s}"}}[5m])))',
                                    "range": "10m"}, f"{s}: p99 {rng.randint(40, 260)} ms")
    r.say("All services are back to baseline latency; conversion has recovered to 41 checkouts/s.")
    r.user("Draft the postmortem timeline for me.")
    r.call("tail_service_logs", {"service": "alertmanager", "lines": 30, "since": at(-30)},
           f"{at(-13)} FIRING PaymentsLatencyHigh\n{at(-11)} FIRING CheckoutErrorRate\n{at(30)} RESOLVED PaymentsLatencyHigh\n"
           f"{at(32)} RESOLVED CheckoutErrorRate")
    r.call("post_chat_message", {"channel": "#inc-commerce", "text": "Draft timeline posted in the incident doc."}, "posted")
    r.user("Thanks, close the incident as resolved.")
    sc.tags.append("near_miss")
    sc.description = ("An incident copilot with the current time in its instructions investigates a checkout drop "
                      "across ten services with parallel metric queries, finds a bad DB-pool change, rolls back and verifies.")


def marathon_analysis(sc: Scenario):
    rng = sc.rng
    qs = [("signups by week", "SELECT date_trunc('week', created_at) wk, count(*) FROM users WHERE created_at >= '2027-01-01' GROUP BY 1 ORDER BY 1"),
          ("activation rate by plan", "SELECT plan, avg((first_project_at IS NOT NULL)::int) FROM users GROUP BY plan"),
          ("median time to first project", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY first_project_at - created_at) FROM users WHERE first_project_at IS NOT NULL"),
          ("retention week 4 by cohort", "SELECT cohort_week, retained_w4::float / cohort_size FROM cohorts ORDER BY cohort_week"),
          ("revenue by country top 10", "SELECT country, sum(amount) FROM invoices GROUP BY 1 ORDER BY 2 DESC LIMIT 10"),
          ("churn by seat count", "SELECT width_bucket(seats, 0, 50, 5) b, avg(churned::int) FROM accounts GROUP BY 1 ORDER BY 1"),
          ("support tickets per account tier", "SELECT tier, count(*)::float / count(DISTINCT account_id) FROM tickets JOIN accounts USING (account_id) GROUP BY 1"),
          ("feature adoption: exports", "SELECT date_trunc('month', ts), count(DISTINCT account_id) FROM events WHERE name = 'export' GROUP BY 1"),
          ("trial conversion by source", "SELECT source, avg(converted::int) FROM trials GROUP BY 1 ORDER BY 2 DESC"),
          ("NPS by plan", "SELECT plan, avg(score) FROM nps JOIN users USING (user_id) GROUP BY 1"),
          ("expansion revenue by quarter", "SELECT date_trunc('quarter', changed_at), sum(delta_mrr) FROM mrr_changes WHERE delta_mrr > 0 GROUP BY 1"),
          ("seats vs. active users", "SELECT a.account_id, seats, count(DISTINCT u.user_id) FROM accounts a JOIN active_users u USING (account_id) GROUP BY 1, 2 LIMIT 20")]
    static = ("You are a data analyst agent for Tessellate, a B2B SaaS. Use the warehouse, chart findings and record "
              "every query you keep in the notebook.")
    conv = sc.conv(static, ["describe_dataset", "execute_query", "plot_series", "save_notebook_cell"], thinking=True,
                   redacted_p=0.1)
    r = Run(sc, conv)
    left = [rng.randint(400_000, 450_000)]

    def hook(run):
        left[0] -= rng.randint(1500, 5000)
        run.conv.system = (static, f"Remaining token budget for this analysis: {left[0]:,}")
    r.hook = hook
    r.user("I'm preparing the board deck. Walk through growth, activation, retention, revenue and churn and build "
           "the charts as you go.")
    for t in ("users", "accounts", "invoices", "cohorts"):
        r.call("describe_dataset", {"name": f"analytics.{t}"},
               f"analytics.{t}: {rng.randint(10_000, 3_000_000):,} rows; {rng.randint(6, 30)} columns; updated daily 04:00 UTC",
               think=f"Check the {t} table.")
    for i, (title, sql) in enumerate(qs):
        rows = "\n".join(f"{rng.choice(['a', 'b', 'c', 'd'])}{j} | {rng.uniform(0, 1000):.2f}" for j in range(rng.randint(3, 6)))
        r.call("execute_query", {"sql": f"SELECT count(*) FROM ({sql}) q"}, f"count\n-----\n{rng.randint(3, 400)}",
               think=f"Sanity-check the row count for {title}.")
        r.call("execute_query", {"sql": sql}, rows, think=f"Query {title}.")
        if i % 2 == 0:
            r.call("plot_series", {"title": title.capitalize(), "x": "bucket", "y": "value", "kind": rng.choice(["line", "bar"])},
                   f"chart saved: charts/{i:02d}-{title.replace(' ', '-').replace(':', '').replace('.', '')}.png",
                   think="Chart it.")
        r.call("save_notebook_cell", {"cell_id": f"q{i + 1:02d}", "source": sql}, f"saved cell q{i + 1:02d}",
               think="Record the query.")
        if i in (2, 5, 8):
            r.say(f"Done with {i + 1} of {len(qs)} analyses. Most notable so far: "
                  + ["activation is much higher on the Team plan.", "week-4 retention improved for the January cohorts.",
                     "trial conversion is best from partner referrals."][(i - 2) // 3], think="Give an update.")
            r.user(["Can you also break activation down by signup source later?", "Interesting. Keep going.",
                    "Good. Last few, then a summary."][(i - 2) // 3])
    r.call("execute_query", {"sql": "SELECT source, avg((first_project_at IS NOT NULL)::int) FROM users GROUP BY source"},
           "partner | 0.71\nads | 0.38\norganic | 0.52\nevents | 0.46", think="Activation by source, as asked.")
    r.call("plot_series", {"title": "Activation by signup source", "x": "source", "y": "activation", "kind": "bar"},
           "chart saved: charts/13-activation-by-source.png", think="Chart it.")
    r.say("Summary: growth steady (+6%/month signups), activation 52% overall (71% from partners), week-4 retention "
          "up 4 points, churn concentrated in 1-5 seat accounts.", think="Summarise.")
    r.user("Perfect, thanks.")
    sc.description = ("A data-analysis agent with extended thinking and a shrinking budget in its system prompt runs "
                      "twelve distinct warehouse analyses with charts and notebook cells over 50+ requests.")


def marathon_support_es(sc: Scenario):
    rng = sc.rng
    names = ["Lucía Romero", "Javier Ortega", "Marta Gil", "Andrés Navarro", "Sofía Castillo", "Pablo Ruiz",
             "Elena Vidal", "Diego Serrano", "Carmen Molina", "Raúl Herrera", "Irene Campos", "Hugo Delgado", "Nuria Prieto"]
    issues = ["no ha recibido su pedido", "recibió un producto dañado", "quiere cambiar la dirección de entrega",
              "pregunta por un cobro duplicado", "quiere devolver unas zapatillas", "no recibió la factura"]
    static = "Eres el agente de soporte de Tienda Verde. Atiendes tickets en español, con tono cercano y profesional."
    conv = sc.conv(static, ["lookup_customer_account", "find_order_by_email", "lookup_tracking", "issue_store_credit",
                            "reply_to_customer", "escalate_case"])
    r = Run(sc, conv)
    r.user("Hola, tenemos 13 tickets en cola esta mañana. Atiéndelos uno a uno y avísame si alguno necesita escalado.")
    for i, name in enumerate(names):
        email = name.lower().replace(" ", ".").replace("í", "i").replace("á", "a").replace("é", "e").replace("ú", "u") + "@correo.example"
        issue = issues[i % len(issues)]
        case = f"TV-{40210 + i * rng.randint(3, 17)}"
        acct = f"acc_{rb62(rng, 8)}"
        r.call("lookup_customer_account", {"email": email},
               jdump({"account_id": acct, "nombre": name, "cliente_desde": f"20{rng.randint(19, 26)}", "pedidos": rng.randint(1, 30)}))
        order = f"TV{rng.randint(100000, 999999)}"
        trk = f"ES{rdigits(rng, 11)}"
        r.call("find_order_by_email", {"email": email, "limit": 1},
               jdump([{"pedido": order, "fecha": f"2027-03-{rng.randint(1, 12):02d}", "total_eur": round(rng.uniform(19, 240), 2),
                       "seguimiento": trk}]))
        if "recibido" in issue or "dirección" in issue:
            r.call("lookup_tracking", {"carrier": "correos_express", "tracking_number": trk},
                   jdump({"estado": rng.choice(["en reparto", "en tránsito", "en oficina"]), "ultima_actualizacion": f"2027-03-{rng.randint(12, 15):02d}"}))
            reply = f"Hola {name.split()[0]}, tu pedido {order} está en camino; te llegará en 24-48 h."
        elif "dañado" in issue or "cobro" in issue:
            amt = round(rng.uniform(5, 40), 2)
            r.call("issue_store_credit", {"account_id": acct, "amount": amt, "currency": "EUR", "reason": issue},
                   jdump({"ok": True, "credito_id": f"cr_{rb62(rng, 10)}", "importe": amt}))
            reply = f"Hola {name.split()[0]}, sentimos lo ocurrido. Te hemos abonado {amt:.2f} € como saldo en tu cuenta."
        else:
            r.call("escalate_case", {"case_id": case, "team": "devoluciones", "note": f"{name}: {issue}, pedido {order}"},
                   jdump({"ok": True, "cola": "devoluciones", "posicion": rng.randint(1, 9)}))
            reply = f"Hola {name.split()[0]}, hemos pasado tu caso al equipo de devoluciones; te escribirán hoy."
        r.call("reply_to_customer", {"case_id": case, "body": reply}, jdump({"ok": True, "case": case, "estado": "respondido"}))
        if i in (3, 7, 10):
            r.say(f"Llevo {i + 1} tickets resueltos. Todo en orden por ahora.")
            j = [3, 7, 10].index(i)
            r.user(["Perfecto. Si ves cobros duplicados, abona el importe completo.",
                    "Bien. Te adjunto captura del panel: ¿alguno para escalar?",
                    "Genial, sigue con los que quedan."][j], [sc.image_ref("panel-soporte.png")] if j == 1 else [])
    r.say("He terminado los 13 tickets: 4 con seguimiento, 5 con abono y 4 escalados a devoluciones.")
    r.user("¡Gracias! Buen trabajo.")
    sc.description = ("A Spanish support agent works through thirteen tickets, looking up each customer, order and "
                      "shipment, issuing credit or escalating and replying, over 50+ requests.")


def marathon_catalog(sc: Scenario):
    rng = sc.rng
    static = "You are the catalog-quality agent for Fjord Supply. Fix titles and attributes to match the style guide."
    conv = sc.conv(static, ["catalog_search", "get_sku", "update_listing"], reasoning=True,
                   extra={"parallel_tool_calls": True}, user_items=True)
    r = Run(sc, conv)
    r.user("Here's our style guide page as an image. Go through every 'outerwear' product and fix titles that "
           "don't follow 'Brand Model, Color, Size'. Also fill in missing material.", [sc.image_ref("style-guide.png")])
    colors = ["Black", "Navy", "Olive", "Rust", "Slate", "Sand"]
    for page in range(1, 10):
        skus = [f"FS-OW-{rng.randint(1000, 9999)}" for _ in range(4)]
        r.call("catalog_search", {"q": "outerwear", "page": page, "page_size": 4},
               jdump({"page": page, "total_pages": 9, "items": [{"sku": s, "title": f"jacket {rng.choice(colors).lower()} {rng.choice('SML')}"} for s in skus]}),
               think=f"List page {page}.")
        r.calls([("get_sku", {"sku": s}, jdump({"sku": s, "brand": "Fjord", "model": rng.choice(["Storm", "Trail", "Harbor", "Summit"]),
                                                  "color": rng.choice(colors), "size": rng.choice(["S", "M", "L", "XL"]),
                                                  "material": rng.choice([None, "recycled nylon", "waxed cotton"])}))
                 for s in skus], think="Fetch details of this page's products.")
        for s in rng.sample(skus, rng.randint(3, 4)):
            fields = {"title": f"Fjord {rng.choice(['Storm', 'Trail', 'Harbor', 'Summit'])} Jacket, {rng.choice(colors)}, {rng.choice(['S', 'M', 'L', 'XL'])}"}
            if rng.random() < 0.4:
                fields["material"] = rng.choice(["recycled nylon", "waxed cotton"])
            r.call("update_listing", {"sku": s, "fields": fields}, jdump({"ok": True, "sku": s, "updated": sorted(fields)}),
                   think="Fix the title.")
        if page in (3, 6):
            r.say(f"Pages 1-{page} of 9 done.")
            r.user("Keep going. Use 'recycled nylon' when unsure about the shell material." if page == 3 else "Good, finish the rest.")
    r.say("All 36 outerwear products reviewed; titles follow the style guide and materials are filled in.")
    r.user("Thanks!")
    sc.description = ("A catalog agent given a style-guide image pages through nine catalog pages, fetches each "
                      "page's four SKUs in parallel and fixes their listings, over 50+ requests.")


def marathon_research(sc: Scenario):
    rng, clock = sc.rng, sc.clock
    topics = ["heat pump adoption in Nordic countries", "heat pump performance below -15 °C", "grid impact of heat pumps",
              "subsidy schemes in Germany", "installer shortages", "refrigerant regulation (F-gas)",
              "district heating vs. heat pumps", "retrofit costs in older buildings", "consumer satisfaction surveys",
              "hybrid heat pump systems"]
    static = ("You are a research agent writing a briefing on residential heat pumps in Europe. Cite every claim. "
              "The runtime rewrites your <scratchpad> after each step.")
    conv = sc.conv(static, ["search_papers", "browse_url", "cite_source", "kv_put", "kv_get"], thinking=True)
    r = Run(sc, conv)
    notes: list[str] = []

    def hook(run):
        clock.tick(15, 60)
        run.conv.system = (static, f"<scratchpad updated=\"{clock.iso_s()}\">\nsections done: {len(notes)}/10\n"
                                   + "\n".join(f"- {n}" for n in notes[-4:]) + "\n</scratchpad>")
    r.hook = hook
    r.user("Write a 2-page briefing on residential heat pumps in Europe for our policy team, with sources. "
           "Attached is the chart from last year's briefing for reference.", [sc.image_ref("briefing-2026-chart.png")])
    for i, t in enumerate(topics):
        found = [(f"{rng.choice(['Nilsen', 'Berg', 'Fischer', 'Rossi', 'Laurent', 'Kowalski'])} et al. ({rng.randint(2019, 2026)})",
                  f"https://doi.example.org/10.{rng.randint(1000, 9999)}/{rhex(rng, 8)}") for _ in range(3)]
        r.call("search_papers", {"query": t, "year_from": 2019},
               "\n".join(f"{a}: {t} — {u}" for a, u in found), think=f"Find sources on {t}.")
        for a, u in found[:2]:
            r.call("browse_url", {"url": u}, f"{a}. Abstract: We study {t} using data from {rng.randint(3, 40)} "
                                           f"countries; key finding: {rng.randint(5, 60)}% {rng.choice(['increase', 'reduction', 'share'])}.",
                   think="Read the abstract.")
        r.call("cite_source", {"url": found[0][1], "title": f"{found[0][0]} on {t}", "quote": f"key finding on {t}"},
               f"[{i + 1}] added", think="Cite the best source.")
        notes.append(f"{t}: sourced [{i + 1}]")
        r.call("kv_put", {"key": f"briefing/section-{i + 1:02d}", "value": f"{t}: 3 sources reviewed, cited [{i + 1}]"},
               "ok", think="Save the section notes.")
        if i in (3, 7):
            r.say(f"{i + 1} of 10 sections researched.", think="Update the user.")
            r.user("Please include something on installer training." if i == 3 else "Good. Keep the tone neutral.")
    r.call("kv_get", {"key": "briefing/section-01"}, "heat pump adoption in Nordic countries: 3 sources reviewed, cited [1]",
           think="Pull notes to draft.")
    r.say("Draft ready: ten sections, ten citations. Nordic adoption is highest; cold-climate performance is adequate "
          "down to about -20 °C; installer shortages are the main bottleneck.", think="Summarise the draft.")
    r.user("Looks great, thank you.")
    sc.description = ("A research agent whose scratchpad in the system prompt is rewritten every step searches, "
                      "reads, cites and notes ten sub-topics for a briefing over 50+ requests.")


# 7.2 numbers_only_progress -------------------------------------------------

def _edit_test_cycle(sc: Scenario, *, system, user, runner_args, render, total, failing, edits, conv_kw=None,
                     prelude=(), lang_say=None):
    """Alternate a test run with a *different* edit each time; the runner's
    output differs only in its counts (and timing) until everything passes."""
    conv = sc.conv(system, ["open_source_file", "edit_source", "edit_range", "exec_tests"], **(conv_kw or {}))
    r = Run(sc, conv)
    r.user(user)
    play(r, prelude)
    f = failing
    r.call("exec_tests", runner_args, render(f, total), think="Run the suite to see the failures.")
    for k, (path, old, new, fixed) in enumerate(edits):
        r.call("edit_source", {"path": path, "old": old, "new": new}, f"Applied 1 replacement in {path}.",
               think=f"Fix the next failure in {path}.")
        f -= fixed
        r.call("exec_tests", runner_args, render(f, total), think="Re-run the tests after the edit.")
    assert f == 0
    r.say(lang_say or "All tests pass now.")
    r.user("Thanks!")
    sc.tags.append("near_miss")
    return r


def prog_pytest(sc: Scenario):
    rng = sc.rng
    head = ("============================= test session starts ==============================\n"
            "platform linux -- Python 3.12.4, pytest-8.3.4, pluggy-1.5.0\nrootdir: /workspace/shipcalc\n"
            "configfile: pyproject.toml\ncollected 25 items\n\n")

    def render(f, total):
        t = f"{rng.uniform(0.95, 1.35):.2f}s"
        return head + _pytest_center(f"{f} failed, {total - f} passed in {t}" if f else f"{total} passed in {t}")
    edits = [("shipcalc/zones.py", "if weight > 30:", "if weight >= 30:", 1),
             ("shipcalc/zones.py", "ZONE_B = {'AT', 'CH'}", "ZONE_B = {'AT', 'CH', 'LI'}", 1),
             ("shipcalc/rates.py", "round(price, 1)", "round(price, 2)", 2),
             ("shipcalc/rates.py", "surcharge = 0.05", "surcharge = Decimal('0.05')", 1)]
    _edit_test_cycle(sc, system="You are a coding agent in /workspace/shipcalc. Fix failing tests with minimal edits.",
                     user="Five tests in shipcalc fail after the zone table refactor. Please fix them.",
                     runner_args={"cmd": "pytest -q --no-header -p no:warnings --tb=no"}, render=render, total=25,
                     failing=5, edits=edits)
    sc.description = ("A coding agent alternates four different edits with the same pytest command; the output "
                      "changes only in its counts (5 failed, 4, 3, 1, all passed) and duration.")


def prog_jest(sc: Scenario):
    rng = sc.rng

    def render(f, total):
        suites_f = (f + 1) // 2
        time = f"{rng.uniform(2.8, 3.6):.3f} s"
        if f:
            return (f"Test Suites: {suites_f} failed, {8 - suites_f} passed, 8 total\n"
                    f"Tests:       {f} failed, {total - f} passed, {total} total\nSnapshots:   0 total\n"
                    f"Time:        {time}\nRan all test suites.")
        return (f"Test Suites: 8 passed, 8 total\nTests:       {total} passed, {total} total\nSnapshots:   0 total\n"
                f"Time:        {time}\nRan all test suites.")
    edits = [("src/cart/total.ts", "return sum + tax;", "return roundCents(sum + tax);", 2),
             ("src/cart/coupon.ts", "if (coupon.expires < now)", "if (coupon.expires <= now)", 1),
             ("src/cart/shipping.ts", "freeShippingThreshold = 50", "freeShippingThreshold = 49.99", 1),
             ("src/cart/currency.ts", "Intl.NumberFormat('en-US'", "Intl.NumberFormat(locale", 2)]
    _edit_test_cycle(sc, system="You are a TypeScript coding agent. The repo uses jest.",
                     user="CI is red on the cart package, 6 tests failing. Fix please.",
                     runner_args={"cmd": "npx jest --silent packages/cart"}, render=render, total=35, failing=6,
                     edits=edits, conv_kw={"reasoning": True, "encrypted": True})
    sc.description = ("A TypeScript agent alternates four different edits with the same jest run; the summary "
                      "changes only in failed/passed counts and time until all 35 pass.")


CARGO_WARN = "\n".join(
    f"warning: unused import: `{imp}`\n --> src/{f}.rs:{ln}:5\n  |\n{ln} | use {imp};\n  |     {'^' * len(imp)}\n  |\n"
    "  = note: `#[warn(unused_imports)]` on by default\n"
    for imp, f, ln in [("std::collections::BTreeMap", "index", 3), ("crate::codec::Varint", "segment", 7),
                       ("std::io::Seek", "segment", 9), ("tracing::debug", "compaction", 4),
                       ("crate::util::crc32c", "wal", 12), ("std::sync::atomic::AtomicU64", "wal", 5),
                       ("bytes::BufMut", "codec", 2), ("std::fmt::Write", "manifest", 6),
                       ("crate::index::KeyRange", "compaction", 11), ("std::time::Instant", "bench_util", 1)])


def prog_cargo(sc: Scenario):
    rng = sc.rng

    def render(f, total):
        head = ("   Compiling tinylsm v0.4.0 (/workspace/tinylsm)\n" + CARGO_WARN +
                "warning: `tinylsm` (lib test) generated 10 warnings\n"
                f"    Finished `test` profile [unoptimized + debuginfo] target(s) in {rng.uniform(3, 5):.2f}s\n"
                "     Running unittests src/lib.rs (target/debug/deps/tinylsm-91c0d2f3a8b7e650)\n\n"
                f"running {total} tests\n")
        res = "FAILED" if f else "ok"
        return head + (f"\ntest result: {res}. {total - f} passed; {f} failed; 0 ignored; 0 measured; 0 filtered out; "
                       f"finished in {rng.uniform(0.2, 0.6):.2f}s\n")
    edits = [("src/segment.rs", "let end = start + len;", "let end = start + len as usize;", 1),
             ("src/wal.rs", "if crc != expected {", "if crc != expected && !self.lenient {", 1),
             ("src/compaction.rs", "levels[i].len() > MAX", "levels[i].len() >= MAX", 1),
             ("src/index.rs", "keys.binary_search(&k).unwrap()", "keys.binary_search(&k).unwrap_or_else(|i| i)", 0),
             ("src/index.rs", "range.end", "range.end.saturating_sub(1)", 1)]
    _edit_test_cycle(sc, system="You are a Rust coding agent in /workspace/tinylsm.",
                     user="cargo test has 4 failures after the segment format change. Fix them; ignore warnings for now.",
                     runner_args={"cmd": "cargo test --lib"}, render=render, total=21, failing=4, edits=edits,
                     conv_kw={"thinking": True, "redacted_p": 0.25})
    sc.description = ("A Rust agent alternates five different edits with the same cargo test; the 3 KB output "
                      "(ten identical warnings) changes only in pass/fail counts and timings, once not at all.")


def prog_gotest(sc: Scenario):
    rng = sc.rng

    def render(f, total):
        t = f"{rng.uniform(1.9, 2.4):.3f}s"
        head = "∅  internal/testutil\n✓  internal/money (12ms)\n✓  internal/fx (31ms)\n"
        return head + (f"\nDONE {total} tests, {f} failure{'s' if f != 1 else ''} in {t}" if f else f"\nDONE {total} tests in {t}")
    edits = [("internal/posting/posting.go", "if amt < 0 {", "if amt.IsNegative() {", 2),
             ("internal/posting/ledger.go", "balances[acct] = amt", "balances[acct] = balances[acct].Add(amt)", 1),
             ("internal/posting/period.go", "t.Before(closeAt)", "!t.After(closeAt)", 2)]
    _edit_test_cycle(sc, system="You are a Go coding agent. Tests run through gotestsum.",
                     user="The posting package has failing tests since the money type change. Please fix.",
                     runner_args={"cmd": "gotestsum --format pkgname-and-test-fails -- ./internal/..."}, render=render,
                     total=84, failing=5, edits=edits)
    sc.description = ("A Go agent alternates three different edits with the same gotestsum run; the output differs "
                      "only in the failure count and duration until all 84 tests pass.")


def prog_rspec_pt(sc: Scenario):
    rng = sc.rng

    def render(f, total):
        return (f"Randomized with seed 40417\n\nFinished in {rng.uniform(4.0, 4.6):.2f} seconds (files took "
                f"{rng.uniform(1.0, 1.2):.2f} seconds to load)\n{total} examples, {f} failure{'s' if f != 1 else ''}, 2 pending")
    edits = [("app/models/pedido.rb", "validates :cep, length: { is: 8 }", "validates :cep, format: { with: /\\A\\d{5}-?\\d{3}\\z/ }", 2),
             ("app/services/frete.rb", "peso * 1.1", "(peso * 1.1).round(2)", 1),
             ("app/models/cliente.rb", "cpf.gsub('.', '')", "cpf.gsub(/\\D/, '')", 1),
             ("app/services/nota_fiscal.rb", "Date.today", "Time.zone.today", 2)]
    _edit_test_cycle(sc, system="Você é um agente de programação Ruby on Rails. Responda em português.",
                     user="A suíte do rspec está com 6 falhas depois da atualização do Rails. Pode corrigir?",
                     runner_args={"cmd": "bundle exec rspec --seed 40417"}, render=render, total=87, failing=6,
                     edits=edits, conv_kw={"reasoning": True}, lang_say="Pronto, todos os testes passam agora.")
    sc.description = ("A Portuguese-speaking Rails agent alternates four different edits with the same rspec run; "
                      "the output differs only in the failure count and timings.")


def _repeat_progress(sc: Scenario, system, tools, user, name, args, outputs, thinks, conv_kw=None, final=None,
                     prelude=()):
    conv = sc.conv(system, tools, **(conv_kw or {}))
    r = Run(sc, conv)
    r.user(user)
    play(r, prelude)
    for k, o in enumerate(outputs):
        r.call(name, args, o, think=thinks[k % len(thinks)])
    if final:
        r.say(final)
        r.user("Thanks.")
    sc.tags.append("near_miss")
    return r


def prog_backfill(sc: Scenario):
    rng = sc.rng
    remaining = 56230
    outs = []
    while remaining > 0:
        done = min(5000, remaining)
        remaining -= done
        outs.append(f"batch ok: updated {done} rows in orders.tax_region; remaining {remaining}; elapsed {rng.uniform(2.5, 4.0):.1f}s")
    _repeat_progress(sc, "You are a database maintenance agent. Run backfills in batches so replicas keep up.",
                     ["backfill_batch", "execute_query"],
                     "Backfill orders.tax_region for all historical orders, in batches of 5000.",
                     "backfill_batch", {"table": "orders", "column": "tax_region", "batch_size": 5000}, outs,
                     ["Run the next batch.", "Continue the backfill.", "Next batch.", "Keep going; rows remain."],
                     final="Backfill complete: 56,230 rows updated.",
                     prelude=[("call", "execute_query", {"sql": "SELECT count(*) FROM orders WHERE tax_region IS NULL"},
                               "count\n-------\n56230", "Count the rows to backfill.")])
    sc.description = ("A maintenance agent calls the same backfill batch twelve times; each result differs only in "
                      "the rows-remaining count (and elapsed time) until it reaches zero.")


def prog_reindex(sc: Scenario):
    rng = sc.rng
    outs, docs = [], 0
    for c in range(1, 9):
        docs += rng.randint(140_000, 160_000)
        outs.append(f"reindexed chunk {c}/8 of products-v7 · progress {c * 12.5:.1f}% · documents indexed so far {docs:,}")
    _repeat_progress(sc, "You are a search-platform agent. Reindex indices chunk by chunk during low traffic.",
                     ["reindex_next_chunk", "query_prometheus"],
                     "Reindex products-v7 tonight; it has 8 chunks.",
                     "reindex_next_chunk", {"index": "products-v7"}, outs,
                     ["Reindex the next chunk.", "Continue with the next chunk.", "Next chunk."],
                     conv_kw={"thinking": True}, final="products-v7 is fully reindexed (8/8 chunks).")
    sc.description = ("A search agent calls the same reindex tool eight times; each result differs only in the "
                      "chunk number, the progress percentage and the document count.")


def prog_download(sc: Scenario):
    part = 268_435_456
    total = part * 6
    outs = [f"part written · /data/dumps/crm-2027-03-14.sql.gz is now {part * k:,} bytes (of {total:,}) · part {k} of 6"
            for k in range(1, 7)]
    _repeat_progress(sc, "You are a data-migration agent on the staging box.", ["download_next_part", "list_dir"],
                     "Fetch last night's CRM dump onto staging so we can restore it.",
                     "download_next_part", {"url": "https://backups.internal.example/crm/2027-03-14.sql.gz",
                                            "dest": "/data/dumps/crm-2027-03-14.sql.gz"}, outs,
                     ["Download the next part.", "Continue downloading.", "Next part."], conv_kw={"reasoning": True},
                     final="The 1.5 GiB dump is fully downloaded.")
    sc.description = ("A migration agent calls the same download tool six times; each result differs only in the "
                      "growing file size and part number.")


def prog_queue(sc: Scenario):
    left = 2140
    outs = []
    while left:
        n = min(200, left)
        left -= n
        outs.append(f"replayed {n} messages from dead-letter.payments · {left:,} left in queue · 0 failed")
    _repeat_progress(sc, "You are a payments operations agent. Replay dead-lettered messages after incidents.",
                     ["drain_queue_batch", "query_prometheus"],
                     "The ledger consumer is fixed. Replay everything in dead-letter.payments, 200 at a time.",
                     "drain_queue_batch", {"queue": "dead-letter.payments", "max": 200}, outs,
                     ["Replay the next batch.", "Keep draining.", "Next batch of messages."],
                     final="dead-letter.payments is empty; 2,140 messages replayed without failures.")
    sc.description = ("An operations agent drains a dead-letter queue with the same call eleven times; each result "
                      "differs only in the count of messages left.")


# 7.3 provider_error_retry --------------------------------------------------

def _sdk_client(sc: Scenario) -> Client:
    return sc.client(sdk=True)


def retry_429_chat(sc: Scenario):
    conv = sc.conv("You are a travel assistant for Northbound Trips.", ["find_hotels"], extra={"temperature": 0.3})
    r = Run(sc, conv, _sdk_client(sc))
    r.user("Any hotels in Ljubljana for 2 guests, 9-11 April 2027?")
    r.call("find_hotels", {"city": "Ljubljana", "check_in": "2027-04-09", "check_out": "2027-04-11", "guests": 2},
           jdump([{"name": "Hotel Tromostovje", "eur_night": 132}, {"name": "Vila Rožnik", "eur_night": 104}]), errors=[429])
    r.say("Two options: Hotel Tromostovje (€132/night) in the old town and Vila Rožnik (€104/night) near Tivoli Park.")
    r.user("Which one is closer to the train station?")
    r.say("Hotel Tromostovje: about 12 minutes on foot from the station; Vila Rožnik is a 25-minute walk.")
    r.user("Ok, I'll take Tromostovje. Thanks!")
    sc.description = ("The provider answers one request with 429, the SDK resends the identical body with "
                      "x-stainless-retry-count 1, gets a 200 and the trip chat continues for two more turns.")


def retry_500_first(sc: Scenario):
    conv = sc.conv("You are a writing assistant for a small bakery's social media.", [])
    r = Run(sc, conv, _sdk_client(sc))
    r.user("Write an Instagram caption for our new cardamom buns, launching Saturday.", errors=[500])
    r.say("Saturday just got softer: our cardamom buns land at 8 am. Warm, twisted, and gone by noon. #bakery #cardamom")
    r.user("Less salesy, more cosy.")
    r.say("Cardamom, butter, a slow Saturday morning. New buns from 8 am, come early and stay a while.")
    r.user("Perfect. Now a version for Facebook, a bit longer.")
    r.say("This Saturday we're adding something new to the counter: cardamom buns, twisted by hand and baked from 8 am. "
          "Bring a friend, grab a coffee, and stay a while.")
    r.user("Love it, thanks.")
    sc.description = ("The first request of a caption chat gets a 500, the SDK resends it once identically with "
                      "retry-count 1, and the chat continues normally for three more turns.")


def retry_529_midloop(sc: Scenario):
    conv = sc.conv("You are an SRE assistant.", ["kubectl_get", "tail_service_logs", "kubectl_describe"], thinking=True)
    r = Run(sc, conv, _sdk_client(sc))
    r.user("Why is the notifications worker lagging?")
    r.call("kubectl_get", {"resource": "pods", "namespace": "notify", "selector": "app=notify-worker"},
           "notify-worker-6c9d8-4hxzq  1/1  Running  0  2d\nnotify-worker-6c9d8-w7prk  1/1  Running  0  2d",
           think="Check the pods.")
    r.call("tail_service_logs", {"service": "notify-worker", "lines": 30},
           "WARN apns: 429 Too Many Requests, backing off 30s\nWARN apns: 429 Too Many Requests, backing off 60s",
           think="Read the worker logs.", errors=[529])
    r.call("kubectl_describe", {"kind": "configmap", "name": "notify-worker", "namespace": "notify"},
           "APNS_MAX_RPS: 500\nBATCH_SIZE: 1000", think="Check the throttling config.")
    r.say("The worker is being throttled by APNs (429s with back-off). Your config sends 500 req/s; Apple's limit for "
          "your key is lower. Reduce APNS_MAX_RPS to ~200.", think="Explain.")
    r.user("Thanks, will do.")
    sc.description = ("In the middle of a tool-using SRE session the provider answers 529 overloaded; the SDK resends "
                      "the identical body with retry-count 1 and the session continues.")


def retry_500_twice(sc: Scenario):
    conv = sc.conv("You are a spreadsheet assistant.", ["read_sheet_range", "write_sheet_range"])
    r = Run(sc, conv, _sdk_client(sc))
    r.user("Fill column F of the 'Budget' sheet with Actual minus Plan for rows 2-5.")
    r.call("read_sheet_range", {"sheet": "Budget", "range": "A1:E5"},
           jdump([["Item", "Q", "Owner", "Plan", "Actual"], ["Ads", "Q1", "Ana", 12000, 13150], ["Events", "Q1", "Ben", 8000, 6420],
                  ["Tools", "Q1", "Caro", 3000, 3010], ["Travel", "Q1", "Dev", 5000, 4380]]), errors=[500, 500])
    r.call("write_sheet_range", {"sheet": "Budget", "range": "F2:F5", "values": [{"F": 1150}, {"F": -1580}, {"F": 10}, {"F": -620}]},
           jdump({"updatedCells": 4}))
    r.say("Column F now holds Actual − Plan: Ads +1,150, Events −1,580, Tools +10, Travel −620.")
    r.user("Thanks! Can you bold the negative ones? Never mind, I'll do it.")
    sc.description = ("A request is answered 500 twice; the SDK resends it identically with retry-count 1 and then "
                      "2, the third attempt succeeds and the spreadsheet task completes.")


def retry_two_episodes(sc: Scenario):
    conv = sc.conv("You help customers of Parcelwise track shipments.", ["lookup_tracking"], reasoning=True)
    r = Run(sc, conv, _sdk_client(sc))
    r.user("Where's my parcel? PW-88231004", errors=[503])
    r.call("lookup_tracking", {"carrier": "parcelwise", "tracking_number": "PW-88231004"},
           jdump({"status": "out_for_delivery", "eta": "today 14:00-18:00"}), think="Look up the parcel.")
    r.say("Your parcel is out for delivery today between 14:00 and 18:00.")
    r.user("And PW-88231005? Same order, second box.")
    r.call("lookup_tracking", {"carrier": "parcelwise", "tracking_number": "PW-88231005"},
           jdump({"status": "at_depot", "eta": "tomorrow"}), think="Look up the second box.", errors=[429])
    r.say("The second box is still at the depot and should arrive tomorrow.")
    r.user("Ok thanks.")
    sc.description = ("A tracking chat hits a 503 on its first request and a 429 later; each time the SDK resends "
                      "the identical body once and the conversation carries on.")


def retry_500_de_stream(sc: Scenario):
    conv = sc.conv("Du bist ein hilfreicher Assistent für Steuerfragen von Freiberuflern. Antworte auf Deutsch.", [],
                   extra={"stream": True})
    r = Run(sc, conv, _sdk_client(sc))
    r.user("Kann ich mein Arbeitszimmer absetzen, wenn ich nur zwei Tage pro Woche zu Hause arbeite?", errors=[500])
    r.say("Ja, seit 2023 gibt es die Homeoffice-Pauschale: 6 € pro Tag, maximal 1.260 € im Jahr, auch ohne separates "
          "Arbeitszimmer. Bei zwei Tagen pro Woche wären das rund 600 € jährlich.")
    r.user("Und wenn das Zimmer nur beruflich genutzt wird?")
    r.say("Dann können Sie die Jahrespauschale von 1.260 € ansetzen oder die tatsächlichen Kosten, wenn das Zimmer "
          "den Mittelpunkt Ihrer Tätigkeit bildet.")
    r.user("Danke, das hilft!")
    sc.description = ("A German streaming tax chat gets a 500 on its first request, the SDK resends it identically "
                      "with retry-count 1, and two more turns follow.")


def retry_giveup_503(sc: Scenario):
    conv = sc.conv("You are a helpful assistant.", [])
    r = Run(sc, conv, _sdk_client(sc))
    r.user("What's a good name for a grey kitten?")
    r.say("Some ideas: Ash, Smokey, Pebble, Earl Grey, or Nimbus.")
    r.user("Something more unusual?")
    r.say("Try Tungsten, Mistral, Graphite, Haze or Flint.")
    try:
        r.user("Ha, Tungsten is great. What would be a nickname for it?", errors=[503, 503, 503])
    except Dead:
        pass
    sc.description = ("After two turns the provider answers 503 three times; the SDK resends the identical body "
                      "twice (retry-count 1, 2) and then gives up; the provider is down, not the client looping.")


def retry_429_twice_stream(sc: Scenario):
    conv = sc.conv("You summarise support tickets for the weekly report.", ["jira_search"],
                   extra={"stream": True})
    r = Run(sc, conv, _sdk_client(sc))
    r.user("Summarise this week's P1 support tickets.")
    r.call("jira_search", {"jql": "project = SUP AND priority = P1 AND created >= -7d", "startAt": 0, "maxResults": 20},
           jdump({"total": 3, "issues": [{"key": "SUP-901", "summary": "SSO login loop for EU tenants"},
                                          {"key": "SUP-905", "summary": "CSV export truncates at 10k rows"},
                                          {"key": "SUP-913", "summary": "Webhook signature mismatch after key rotation"}]}),
           errors=[429, 429])
    r.say("Three P1s this week: an SSO login loop for EU tenants (SUP-901), CSV exports truncated at 10k rows "
          "(SUP-905) and webhook signature mismatches after key rotation (SUP-913).")
    r.user("Which one is still open?")
    r.say("I only have the summaries; statuses weren't in the search result. Want me to check each one?")
    r.user("No need, thanks.")
    sc.description = ("A streaming summary request is rate-limited twice; the SDK resends it identically with "
                      "retry-count 1 and 2, the third attempt succeeds and the chat continues.")


def retry_giveup_529(sc: Scenario):
    conv = sc.conv("You are a code assistant.", ["open_source_file"], thinking=True)
    r = Run(sc, conv, _sdk_client(sc))
    r.user("What does parse_duration in utils/time.py accept?")
    try:
        r.call("open_source_file", {"path": "utils/time.py", "start": 1, "end": 40},
               "def parse_duration(s: str) -> timedelta:\n    \"\"\"Accepts '90s', '5m', '1h30m', '2d'.\"\"\"\n    ...",
               think="Open the file.", errors=[529, 529, 529])
    except Dead:
        pass
    sc.description = ("After one tool call the provider answers 529 overloaded three times; the SDK resends the "
                      "identical body twice and gives up.")


# 7.4 whole_text_revisions --------------------------------------------------

def _apply_edit(lines: list[str], op) -> list[str]:
    kind = op[0]
    out = list(lines)
    if kind == "replace":
        hits = [i for i, l in enumerate(out) if op[1] in l]
        assert len(hits) == 1, op
        out[hits[0]] = out[hits[0]].replace(op[1], op[2])
    elif kind == "insert_after":
        hits = [i for i, l in enumerate(out) if op[1] in l]
        assert len(hits) == 1, op
        out.insert(hits[0] + 1, op[2])
    elif kind == "drop":
        hits = [i for i, l in enumerate(out) if op[1] in l]
        assert len(hits) == 1, op
        del out[hits[0]]
    elif kind == "swap":
        a = [i for i, l in enumerate(out) if op[1] in l]
        b = [i for i, l in enumerate(out) if op[2] in l]
        assert len(a) == 1 and len(b) == 1, op
        out[a[0]], out[b[0]] = out[b[0]], out[a[0]]
    else:
        raise ValueError(kind)
    return out


REVISION_SPECS = [
    {"lang": "de", "system": "Du hilfst beim Formulieren von E-Mails. Gib immer die vollständige E-Mail aus.",
     "ask": "Kannst du mir eine E-Mail an meinen Vermieter schreiben? Die Heizung im Wohnzimmer ist seit dem 2. März kaputt.",
     "text": ["Betreff: Defekte Heizung in der Wohnung 3B", "", "Sehr geehrter Herr Becker,", "",
              "seit dem 2. März funktioniert die Heizung in meinem Wohnzimmer nicht mehr.",
              "Ich habe das Thermostat bereits überprüft und die Heizkörper entlüftet, leider ohne Erfolg.",
              "Bitte beauftragen Sie zeitnah einen Handwerker.", "Ich bin werktags ab 16 Uhr zu Hause.", "",
              "Mit freundlichen Grüßen", "Jana Albrecht"],
     "edits": [("Bitte 'Frau Becker' statt 'Herr Becker'.", ("replace", "Sehr geehrter Herr Becker", "Sehr geehrte Frau Becker")),
               ("Füg noch hinzu, dass es in der Wohnung nur noch 15 Grad hat.",
                ("insert_after", "funktioniert die Heizung", "In der Wohnung sind es inzwischen nur noch 15 Grad.")),
               ("Es war doch der 1. März, sorry.", ("replace", "2. März", "1. März")),
               ("Etwas bestimmter: statt 'zeitnah' bitte eine Frist bis Freitag, 12. März.",
                ("replace", "Bitte beauftragen Sie zeitnah", "Bitte beauftragen Sie bis Freitag, 12. März,")),
               ("Den Satz mit dem Entlüften bitte streichen.", ("drop", "entlüftet")),
               ("Unter den Namen noch meine Telefonnummer: 0176 2231 8890.", ("insert_after", "Jana Albrecht", "Tel. 0176 2231 8890")),
               ("Betreff kürzer: 'Heizungsausfall Wohnung 3B'.", ("replace", "Defekte Heizung in der Wohnung 3B", "Heizungsausfall Wohnung 3B"))],
     "prefaces": ["Hier ist ein Entwurf:", "Hier ist die überarbeitete E-Mail:", "Gern, angepasst:", "Hier die neue Version:",
                  "Erledigt:", "So sieht sie jetzt aus:", "Aktualisiert:", "Hier bitte:"]},
    {"lang": "es", "system": "Eres redactor de fichas de producto para una tostadora de café. Devuelve siempre la ficha completa.",
     "ask": "Escríbeme la ficha del café Finca La Esperanza (Huila, Colombia, lavado, Caturra, tueste medio).",
     "text": ["Café de especialidad Finca La Esperanza", "Tueste medio, notas de chocolate con leche, panela y naranja.",
              "Origen: Huila, Colombia. Altura: 1.750 m.", "Proceso lavado, variedad Caturra.", "Ideal para filtro y espresso.",
              "Bolsa de 250 g, molido o en grano."],
     "edits": [("Cambia la bolsa a 500 g.", ("replace", "250 g", "500 g")),
               ("Añade que lo tostamos en Valencia cada semana.", ("insert_after", "Proceso lavado", "Tostado en Valencia cada semana.")),
               ("En vez de naranja pon mandarina.", ("replace", "naranja", "mandarina")),
               ("Quita lo de filtro y espresso.", ("drop", "Ideal para")),
               ("Un tono más cercano en el título, tipo 'Nuestro café...'.",
                ("replace", "Café de especialidad Finca La Esperanza", "Nuestro café de especialidad Finca La Esperanza")),
               ("Pon el proceso antes que el origen.", ("swap", "Origen:", "Proceso lavado"))],
     "prefaces": ["Aquí tienes la ficha:", "Hecho:", "Listo, con el cambio:", "Aquí va la versión actualizada:",
                  "Perfecto, así queda:", "Actualizada:", "Aquí está:"]},
    {"lang": "pt", "system": "Você ajuda a escrever cartas de apresentação. Sempre devolva a carta inteira.",
     "ask": "Me ajuda com uma carta curta para a vaga de Analista de Dados Pleno na Lumina Tecnologia?",
     "text": ["Prezada equipe de recrutamento da Lumina Tecnologia,", "",
              "Escrevo para me candidatar à vaga de Analista de Dados Pleno.",
              "Nos últimos quatro anos, trabalhei na Ribeira Logística, onde automatizei relatórios em Python e SQL.",
              "Reduzi em 30% o tempo de fechamento mensal ao criar painéis no Power BI.",
              "Tenho interesse especial na área de varejo, foco da Lumina.", "", "Atenciosamente,", "Rafael Monteiro"],
     "edits": [("Na verdade são cinco anos.", ("replace", "quatro anos", "cinco anos")),
               ("Acrescenta que tenho a certificação AWS Data Analytics.",
                ("insert_after", "Power BI", "Também possuo a certificação AWS Certified Data Analytics.")),
               ("Muda 30% para 35%.", ("replace", "30%", "35%")),
               ("Tira a frase do varejo.", ("drop", "varejo")),
               ("Deixa o cumprimento menos formal: 'Olá, time da Lumina,'.",
                ("replace", "Prezada equipe de recrutamento da Lumina Tecnologia,", "Olá, time da Lumina,")),
               ("Troca 'Atenciosamente' por 'Cordialmente'.", ("replace", "Atenciosamente", "Cordialmente"))],
     "prefaces": ["Aqui está:", "Feito:", "Versão atualizada:", "Pronto:", "Aqui vai a carta revisada:", "Ajustado:", "Segue:"]},
    {"lang": "fr", "system": "Tu aides à rédiger des invitations. Renvoie toujours le texte complet.",
     "ask": "Rédige une invitation pour la soirée de lancement d'Atlas 3.0, jeudi 25 mars à 18 h 30, 12 rue des Arts à Lyon.",
     "text": ["Objet : Invitation – soirée de lancement Atlas 3.0", "", "Bonjour à toutes et à tous,", "",
              "Nous avons le plaisir de vous inviter à la soirée de lancement d'Atlas 3.0.",
              "Rendez-vous le jeudi 25 mars à 18 h 30, au 12 rue des Arts, Lyon.",
              "Au programme : démonstration, apéritif et échanges avec l'équipe produit.",
              "Merci de confirmer votre présence avant le 19 mars.", "", "À très bientôt,", "L'équipe Atlas"],
     "edits": [("Finalement ce sera à 19 h.", ("replace", "18 h 30", "19 h")),
               ("Ajoute qu'un vestiaire sera disponible.", ("insert_after", "Au programme", "Un vestiaire sera disponible sur place.")),
               ("Remplace 'apéritif' par 'cocktail dînatoire'.", ("replace", "apéritif", "cocktail dînatoire")),
               ("La date limite de réponse passe au 22 mars.", ("replace", "avant le 19 mars", "avant le 22 mars")),
               ("C'est pour des clients : 'Chères clientes, chers clients,'.",
                ("replace", "Bonjour à toutes et à tous,", "Chères clientes, chers clients,")),
               ("Mets le programme avant le rendez-vous.", ("swap", "Rendez-vous le", "Au programme"))],
     "prefaces": ["Voici une proposition :", "Voici la version modifiée :", "C'est fait :", "Mise à jour :",
                  "Voilà :", "Nouvelle version :", "Corrigé :"]},
    {"lang": "ja", "system": "あなたはECサイトのカスタマーサポート文面を作成するアシスタントです。毎回全文を出力してください。",
     "ask": "注文番号A-20731の発送遅延のお詫びメールを作ってください。お客様は山田花子様、発送予定は3月18日です。",
     "text": ["件名：商品発送遅延のお詫び", "", "山田 花子 様", "", "いつも当店をご利用いただき、誠にありがとうございます。",
              "このたびはご注文の商品（注文番号：A-20731）の発送が遅れており、大変申し訳ございません。",
              "現在、3月18日の発送を予定しております。", "ご不便をおかけしますことを、心よりお詫び申し上げます。", "",
              "ゆずリビング カスタマーサポート"],
     "edits": [("発送日は3月17日に早まりました。", ("replace", "3月18日", "3月17日")),
               ("お詫びとして次回使える送料無料クーポンをお送りする一文を入れてください。",
                ("insert_after", "発送を予定しております", "お詫びのしるしとして、次回ご利用いただける送料無料クーポンをお送りいたします。")),
               ("注文番号が間違っていました。A-20737です。", ("replace", "A-20731", "A-20737")),
               ("署名に「担当：佐藤」を追加してください。", ("insert_after", "カスタマーサポート", "担当：佐藤")),
               ("件名を「【ゆずリビング】発送遅延のお詫び」にしてください。", ("replace", "件名：商品発送遅延のお詫び", "件名：【ゆずリビング】発送遅延のお詫び")),
               ("最後のお詫びの文は削除してください。", ("drop", "心よりお詫び"))],
     "prefaces": ["以下の文面でいかがでしょうか。", "修正しました。", "こちらが修正版です。", "変更を反映しました。",
                  "更新しました。", "修正後の全文です。", "対応しました。"]},
    {"lang": "en", "system": "You help product managers write release notes. Always return the full notes.",
     "ask": "Draft release notes for Tessellate 4.2: PDF export of dashboards, Okta group mapping for SSO, 2x faster "
            "charts, fixes for timezone drift in scheduled reports and quoted newlines in CSV import.",
     "text": ["## Tessellate 4.2 — Release notes", "", "- New: bulk export of dashboards to PDF.",
              "- New: SSO with Okta group mapping.", "- Improved: chart rendering is up to 2x faster.",
              "- Fixed: timezone drift in scheduled reports.", "- Fixed: CSV import ignored quoted newlines.", "",
              "Upgrade from the admin console; no downtime required."],
     "edits": [("Benchmarks came back, say up to 3x.", ("replace", "up to 2x faster", "up to 3x faster")),
               ("Add a line that the v1 API is deprecated and will be removed in 4.4.",
                ("insert_after", "quoted newlines", "- Deprecated: the v1 REST API; it will be removed in 4.4.")),
               ("Drop the CSV fix, it slipped to 4.3.", ("drop", "CSV import")),
               ("Put SSO first.", ("swap", "bulk export", "SSO with Okta")),
               ("Self-hosted customers need a 10-minute maintenance window, mention that in the last line.",
                ("replace", "no downtime required.", "no downtime for cloud; self-hosted installs need a 10-minute maintenance window.")),
               ("Title: use 'What's new in Tessellate 4.2'.", ("replace", "Tessellate 4.2 — Release notes", "What's new in Tessellate 4.2"))],
     "prefaces": ["Here's a draft:", "Updated:", "Done:", "Here's the revised version:", "Sure, here you go:",
                  "Revised notes:", "Updated notes:"]},
]


def build_whole_text_revisions(sc: Scenario):
    spec = REVISION_SPECS[sc.index - 1]
    conv = sc.conv(spec["system"], [], **({"thinking": True} if sc.index % 2 else {}))
    r = Run(sc, conv)
    lines = list(spec["text"])
    pre = spec["prefaces"]
    r.user(spec["ask"])
    answers = []
    for k, (instr, op) in enumerate([(None, None)] + spec["edits"]):
        if op is not None:
            lines = _apply_edit(lines, op)
            r.user(instr)
        text = pre[k % len(pre)] + "\n\n" + "\n".join(lines)
        answers.append(text)
        r.say(text, think="Apply the requested change and return the full text.")
    r.user({"de": "Perfekt, danke!", "es": "¡Perfecto, gracias!", "pt": "Perfeito, obrigado!", "fr": "Parfait, merci !",
            "ja": "完璧です。ありがとうございます。", "en": "Perfect, thanks!"}[spec["lang"]])
    sc.tags.append("near_miss")
    what = {"de": "a German e-mail", "es": "a Spanish product description", "pt": "a Portuguese cover letter",
            "fr": "a French invitation", "ja": "a Japanese apology e-mail", "en": "English release notes"}[spec["lang"]]
    sc.description = (f"A user revises {what} over {len(spec['edits'])} turns; each answer is the whole text again "
                      f"with the one requested change.")


# 7.5 fleet_same_prompt -----------------------------------------------------

def run_fleet(sc: Scenario, n_users: int, make_script, profile: str | None = None):
    """Run one script per caller (own key, own session), interleaved in a
    seeded order that keeps each caller's turns in sequence."""
    gens = []
    prof = profile or sc.rng.choice(SDK_FOR[sc.format])
    for u in range(1, n_users + 1):
        client = sc.client(prof, tag=f"u{u:02d}")
        gens.append(make_script(u, client))
    active = list(range(n_users))
    while active:
        i = sc.rng.choice(active)
        try:
            next(gens[i])
        except StopIteration:
            active.remove(i)
    sc.tags.append("near_miss")


def fleet_recipes(sc: Scenario):
    system = "You are the recipe helper in the Pantry app. Suggest simple dinners."
    follow = set(sc.rng.sample(range(1, 13), 4))
    model = sc.model(choices=["gpt-4.1-nano", "gpt-5-mini"])
    answers = ["1. Chickpea and spinach curry\n2. Garlicky chickpea and spinach pasta\n3. Crispy chickpea and spinach flatbreads",
               "1. Spinach and chickpea stew with lemon\n2. Chickpea and spinach shakshuka\n3. Sheet-pan chickpeas with spinach and feta"]

    def script(u, client):
        conv = sc.conv(system, [], model=model, extra={"temperature": 0.7})
        r = Run(sc, conv, client)
        r.user("Give me three dinner ideas using chickpeas and spinach.")
        yield
        if u in follow:
            r.say(answers[u % 2])
            r.user("Make the second one vegan.")
            yield
    run_fleet(sc, 12, script)
    sc.description = ("Twelve users of a recipe app, each with their own key, send the identical prompt; four of "
                      "them ask the same follow-up.")


def fleet_helpcenter(sc: Scenario):
    system = "You are Orbit Bank's help assistant. Use the help center for policy questions."
    model = sc.model()
    result = jdump([{"title": "Card replacement", "text": "A replacement card arrives in 3-5 business days. Express delivery (1 day) costs €9."}])

    def script(u, client):
        conv = sc.conv(system, ["search_help_center"], model=model)
        r = Run(sc, conv, client)
        r.user("How long does it take to get a replacement card?")
        yield
        r.call("search_help_center", {"query": "replacement card delivery time", "locale": "en-IE"}, result)
        yield
    run_fleet(sc, 15, script)
    sc.description = ("Fifteen bank customers ask the same question; each conversation makes the same help-center "
                      "tool call with the same result (fresh call ids), one key per customer.")


def fleet_japanese(sc: Scenario):
    system = "あなたは家計簿アプリ「こつこつ」のサポートAIです。"
    model = sc.model()
    follow = set(sc.rng.sample(range(1, 11), 3))

    def script(u, client):
        conv = sc.conv(system, [], model=model, extra={"temperature": 0.5})
        r = Run(sc, conv, client)
        r.user("銀行口座の連携がうまくいきません。どうすればいいですか？")
        yield
        if u in follow:
            r.say("まずアプリを最新版に更新し、設定 > 口座連携 から一度連携を解除して、もう一度登録してください。")
            r.user("それでもだめでした。")
            yield
    run_fleet(sc, 10, script)
    sc.description = ("Ten users of a Japanese budgeting app send the identical support question with their own "
                      "keys; three of them send the same follow-up.")


def fleet_sample_image(sc: Scenario):
    system = "You are the onboarding guide of LeafLens, a plant identification app."
    model = sc.model()
    sample = sc.image("low")

    def script(u, client):
        conv = sc.conv(system, [], model=model)
        r = Run(sc, conv, client)
        r.user("What plant is this? (sample photo from the tutorial)", [sample])
        yield
    run_fleet(sc, 20, script)
    sc.description = ("Twenty new users run the app tutorial, each sending the identical question with the same "
                      "bundled sample image under their own key.")


def fleet_dated(sc: Scenario):
    day = sc.clock.t.strftime("%A %d %B %Y")
    system = f"You are the daily-briefing assistant of Meridian News. Today is {day}."
    model = sc.model()

    def script(u, client):
        conv = sc.conv(system, [], model=model, user_items=True)
        r = Run(sc, conv, client)
        r.user("Give me a 3-bullet briefing format I can fill in for today's top stories.")
        yield
    run_fleet(sc, 18, script)
    sc.description = ("Eighteen readers send the same single-turn request under the same dated instructions, one "
                      "key each.")


def fleet_returns_es(sc: Scenario):
    system = "Eres el asistente de Moda Brisa. Responde en español usando el centro de ayuda."
    model = sc.model()
    res = jdump([{"titulo": "Devoluciones", "texto": "Tienes 30 días desde la entrega para devolver artículos sin usar. La devolución es gratuita en tienda."}])
    follow = set(sc.rng.sample(range(1, 15), 5))

    def script(u, client):
        conv = sc.conv(system, ["search_help_center"], model=model)
        r = Run(sc, conv, client)
        r.user("¿Cuánto tiempo tengo para devolver un pedido?")
        yield
        r.call("search_help_center", {"query": "plazo devolución", "locale": "es-ES"}, res)
        yield
        if u in follow:
            r.say("Tienes 30 días desde la entrega para devolver artículos sin usar; en tienda es gratis.")
            r.user("¿Y si lo compré en rebajas?")
            yield
    run_fleet(sc, 14, script)
    sc.description = ("Fourteen shoppers ask the same returns question in Spanish; each conversation makes the same "
                      "help-center call, and five send the same follow-up.")


# 7.6 template_batch_jobs ---------------------------------------------------

def batch_run(sc: Scenario, system, items, render_user, conv_kw=None, tools=(), images=None):
    client = sc.client()
    model = sc.model()
    for i, it in enumerate(items):
        conv = sc.conv(system, list(tools), model=model, **(conv_kw or {}))
        r = Run(sc, conv, client)
        r.user(render_user(it), images(i) if images else ())
    sc.tags.append("near_miss")


def batch_tickets_pt(sc: Scenario):
    tickets = ["O app fecha sozinho quando abro o extrato.", "Adorei o novo recurso de metas, parabéns!",
               "Cobraram duas vezes a tarifa de março.", "Não consigo cadastrar minha chave Pix.",
               "Atendimento rápido, resolveram em 5 minutos.", "O cartão virtual não aparece mais.",
               "Quero aumentar meu limite.", "Transferência agendada não foi feita no dia 10.",
               "O app está ótimo depois da atualização.", "Recebi um SMS estranho pedindo minha senha.",
               "Demorou 3 dias para responderem.", "Como faço para encerrar a conta?", "Muito bom!",
               "O rendimento da poupança veio menor que o esperado."]
    schema = {"type": "json_schema", "json_schema": {"name": "ticket", "strict": True, "schema": {
        "type": "object", "additionalProperties": False, "required": ["sentimento", "categoria"],
        "properties": {"sentimento": {"type": "string", "enum": ["positivo", "neutro", "negativo"]},
                       "categoria": {"type": "string"}}}}}
    batch_run(sc, "Classifique o ticket de suporte. Responda apenas com o JSON pedido.", tickets,
              lambda t: f"Ticket:\n{t}", conv_kw={"extra": {"temperature": 0, "response_format": schema}})
    sc.description = ("A batch job sends fourteen Portuguese support tickets one per request through the same "
                      "classification template with a JSON schema.")


def batch_invoices(sc: Scenario):
    rng = sc.rng
    vendors = ["Kestrel Office Supply", "Norrland Freight AB", "Atelier Pivot SARL", "Brightwater Catering Ltd"]
    docs = []
    for _ in range(12):
        v = rng.choice(vendors)
        net = rng.randint(12000, 980000) / 100
        docs.append(f"INVOICE\n{v}\nInvoice no: {rng.choice(['INV', 'RE', 'F'])}-{rng.randint(10000, 99999)}\n"
                    f"Date: 2027-03-{rng.randint(1, 28):02d}\nNet: {net:,.2f} EUR\nVAT 19%: {net * 0.19:,.2f} EUR\n"
                    f"Total: {net * 1.19:,.2f} EUR\nIBAN: DE{rdigits(rng, 20)}")
    batch_run(sc, "Extract vendor, invoice number, date, net, VAT, total and IBAN from the OCR text as JSON.", docs,
              lambda d: f"<ocr>\n{d}\n</ocr>", conv_kw={"max_tokens": 1024})
    sc.description = ("A batch job sends twelve OCR'd invoices, differing only in vendors, numbers, dates and "
                      "IBANs, through one extraction template.")


def batch_translate_ja(sc: Scenario):
    titles = ["Stainless steel French press, 1 L", "Bamboo cutting board with juice groove", "Cast-iron skillet, 26 cm",
              "Ceramic pour-over dripper, white", "Glass food storage set, 5 pieces", "Silicone baking mat, set of 2",
              "Electric gooseneck kettle, 0.8 L", "Linen tea towels, set of 3", "Chef's knife, 20 cm, German steel",
              "Manual burr coffee grinder", "Enamel Dutch oven, 4.7 L", "Wooden spoon set, olive wood",
              "Insulated lunch box, 2 tiers", "Oil and vinegar cruet set", "Digital kitchen scale, 5 kg",
              "Herb keeper, stay-fresh"]
    batch_run(sc, "Translate the product title into natural Japanese for a Japanese e-commerce listing. Output only the title.",
              titles, lambda t: t, conv_kw={"extra": {"temperature": 0.2}})
    sc.description = "A batch job translates sixteen kitchenware product titles into Japanese, one request per title."


def _diff_for(rng, i):
    fn = rng.choice(["parse_header", "apply_discount", "resolve_alias", "encode_frame", "flush_pending"])
    file = rng.choice(["src/net/frame.rs", "app/pricing/discounts.py", "lib/resolver.ts", "internal/queue/flush.go"])
    body = "\n".join(f"{'+' if rng.random() < 0.5 else '-'}    {rng.choice(['let', 'const', 'val', 'var'])} v{j} = "
                     f"{rng.choice(['compute', 'lookup', 'decode'])}(input[{j}], {rng.randint(0, 99)});" for j in range(rng.randint(25, 45)))
    return (f"commit {rhex(rng, 40)}\nAuthor: {rng.choice(['Ana Silva', 'Tom Berg', 'Yuki Mori'])}\n\n    {fn}: handle edge case #{rng.randint(100, 999)}\n\n"
            f"diff --git a/{file} b/{file}\nindex {rhex(rng, 7)}..{rhex(rng, 7)} 100644\n--- a/{file}\n+++ b/{file}\n"
            f"@@ -{rng.randint(10, 300)},{rng.randint(20, 40)} +{rng.randint(10, 300)},{rng.randint(20, 40)} @@ fn {fn}\n{body}")


def batch_commit_summaries(sc: Scenario):
    diffs = [_diff_for(sc.rng, i) for i in range(8)]
    batch_run(sc, "Summarise the commit for the changelog in one line, imperative mood.", diffs,
              lambda d: f"```diff\n{d}\n```")
    sc.description = "A changelog job sends eight 2 KB commit diffs, one per request, through the same summary template."


def batch_captions(sc: Scenario):
    items = list(range(10))
    batch_run(sc, "Write a one-sentence alt text for the product photo.", items,
              lambda i: f"Product photo {i + 1} of 10 for SKU batch 'spring-linen'. Alt text:",
              images=lambda i: [sc.image("low")])
    sc.description = ("A batch job sends ten product photos as inline images, one per request, through the same "
                      "alt-text template.")


def batch_grading(sc: Scenario):
    rng = sc.rng
    answers = ["Photosynthesis turns light into chemical energy stored in glucose.",
               "Plants eat sunlight.", "Chlorophyll absorbs light; the plant makes glucose and releases oxygen.",
               "It's when plants breathe in oxygen.", "Light energy + CO2 + water → glucose + O2.",
               "The process where plants make food using light, water and carbon dioxide.", "idk",
               "Plants convert solar energy to sugar, oxygen is a by-product.", "Respiration in reverse, roughly.",
               "Leaves capture light to produce glucose from CO2 and H2O.", "It happens in the mitochondria.",
               "Making energy from the sun.", "Chloroplasts use light to fix carbon into sugars.",
               "Plants absorb water through roots.", "Sunlight + chlorophyll = food for the plant."]
    rng.shuffle(answers)
    rubric = "2 points: light→chemical energy AND inputs/outputs. 1 point: one of them. 0: wrong or empty."
    batch_run(sc, f"Grade the student's answer to 'What is photosynthesis?'. Rubric: {rubric} Reply as JSON {{\"score\": n, \"reason\": \"...\"}}.",
              answers, lambda a: f"Student answer: {a}", conv_kw={"extra": {"text": {"format": {"type": "json_object"}}}})
    sc.description = "A grading job scores fifteen short student answers, one request each, against the same rubric."


# 7.7 advancing_cursor ------------------------------------------------------

def paged(sc: Scenario, system, tools, user, pages, conv_kw=None, final="Done, all pages processed."):
    """pages: list of (name, args, output). Arguments advance every call."""
    conv = sc.conv(system, tools, **(conv_kw or {}))
    r = Run(sc, conv)
    r.user(user)
    for k, (name, args, out) in enumerate(pages):
        r.call(name, args, out, think=THINK_PAGE[k % len(THINK_PAGE)])
    r.say(final)
    r.user("Thanks.")
    sc.tags.append("near_miss")


def cur_crm(sc: Scenario):
    rng = sc.rng
    pages, cursor, start = [], None, 1
    for p in range(7):
        nxt = b64json({"after": f"ct_{start + 9:06d}", "seg": "enterprise"}) if p < 6 else None
        args = {"segment": "enterprise", "limit": 10} if cursor is None else {"segment": "enterprise", "cursor": cursor, "limit": 10}
        pages.append(("crm_list_contacts", args, jdump({"data": _contacts(rng, 10, start), "has_more": nxt is not None, "next_cursor": nxt})))
        cursor, start = nxt, start + 10
    paged(sc, "You build account lists from the CRM.", ["crm_list_contacts"],
          "Export every contact in the enterprise segment.", pages, final="70 enterprise contacts exported.")
    sc.description = "A CRM agent pages through seven pages with base64 cursors that advance every call."


def cur_github(sc: Scenario):
    rng = sc.rng
    pages = []
    for p in range(1, 7):
        prs = [{"number": 900 - (p - 1) * 10 - j, "title": rng.choice(["fix", "feat", "docs", "chore"]) + f": change {rhex(rng, 4)}",
                "merged": rng.random() < 0.8} for j in range(10)]
        pages.append(("gh_list_pull_requests", {"repo": "acme/edgeproxy", "state": "closed", "page": p, "per_page": 10}, jdump(prs)))
    paged(sc, "You are a repository analytics agent.", ["gh_list_pull_requests"],
          "Count merged PRs among the last 60 closed ones.", pages, conv_kw={"reasoning": True},
          final="48 of the last 60 closed PRs were merged.")
    sc.description = "A repository agent lists closed pull requests page 1 to 6, each page different."


def cur_stripe(sc: Scenario):
    rng = sc.rng
    pages, after = [], None
    for p in range(5):
        data = _charges(rng, 10)
        args = {"limit": 10} if after is None else {"limit": 10, "starting_after": after}
        pages.append(("stripe_list_charges", args, jdump({"object": "list", "has_more": p < 4, "data": data})))
        after = data[-1]["id"]
    paged(sc, "You are a finance operations agent.", ["stripe_list_charges"],
          "Total up this week's card charges by brand.", pages, conv_kw={"thinking": True},
          final="This week: Visa $8,412, Mastercard $5,190, Amex $2,877.")
    sc.description = ("A finance agent pages through five 4 KB pages of charges, each request starting after the "
                      "previous page's last id.")


def cur_jira(sc: Scenario):
    rng = sc.rng
    jql = "project = OPS AND status = Open ORDER BY created DESC"
    pages = []
    for p in range(7):
        issues = [{"key": f"OPS-{2000 - p * 10 - j}", "summary": rng.choice(["Rotate TLS cert", "Disk 85%", "Patch kernel",
                                                                              "Upgrade agent"]) + f" on host-{rng.randint(1, 90)}"}
                  for j in range(10)]
        pages.append(("jira_search", {"jql": jql, "startAt": p * 10, "maxResults": 10},
                      jdump({"startAt": p * 10, "maxResults": 10, "total": 70, "issues": issues})))
    paged(sc, "You triage operations backlogs.", ["jira_search"], "List all 70 open OPS issues grouped by type.", pages)
    sc.description = "A Jira agent pages startAt 0, 10, ... 60 through 70 open issues."


def cur_bucket(sc: Scenario):
    rng = sc.rng
    pages, token = [], None
    for p in range(6):
        nxt = rb64(rng, 48) if p < 5 else None
        args = {"bucket": "acme-logs", "prefix": "cdn/2027/03/"} | ({"continuation_token": token} if token else {})
        out = {"Contents": [{"Key": f"cdn/2027/03/{rng.randint(1, 28):02d}/edge-{rhex(rng, 8)}.log.gz", "Size": rng.randint(10**6, 10**8)}
                            for _ in range(8)], "IsTruncated": nxt is not None}
        if nxt:
            out["NextContinuationToken"] = nxt
        pages.append(("list_bucket_keys", args, jdump(out)))
        token = nxt
    paged(sc, "You are a storage cost assistant.", ["list_bucket_keys"], "How much CDN log data did we store in March?",
          pages, conv_kw={"reasoning": True, "encrypted": True})
    sc.description = "A storage agent lists a prefix over six pages, passing each page's new continuation token."


def cur_audit(sc: Scenario):
    rng, clock = sc.rng, sc.clock
    pages = []
    since = clock.iso()
    for p in range(7):
        evs = []
        for _ in range(6):
            clock.tick(30, 400)
            evs.append({"time": clock.iso(), "actor": rng.choice(["svc-deploy", "m.ortiz", "j.chen", "svc-backup"]),
                        "action": rng.choice(["role.grant", "key.create", "bucket.policy.update", "user.login"])})
        pages.append(("list_audit_events", {"since": since, "limit": 6}, jdump({"events": evs})))
        since = evs[-1]["time"]
    conv_tools = ["list_audit_events"]
    paged(sc, "You are a security analyst agent.", conv_tools, "Review all audit events since this morning for privilege changes.",
          pages, conv_kw={"thinking": True, "redacted_p": 0.3}, final="Two privilege grants found, both by svc-deploy during the release.")
    sc.description = "A security agent pages audit events with a 'since' timestamp that advances to the last event each call."


# 7.8 many_resources --------------------------------------------------------

def fan_out(sc: Scenario, system, tools, user, batches, conv_kw=None, final="Done."):
    """batches: list of lists of (name, args, output); a list of >1 is one parallel turn."""
    conv = sc.conv(system, tools, **(conv_kw or {}))
    r = Run(sc, conv)
    r.user(user)
    for b in batches:
        if len(b) == 1:
            r.call(*b[0], think="Check the next resource.")
        else:
            r.calls(b, think="Check these resources in parallel.")
    r.say(final)
    r.user("Thanks.")
    sc.tags.append("near_miss")


def res_objects(sc: Scenario):
    rng = sc.rng
    keys = [f"invoices/2027/03/INV-{20400 + i}.pdf" for i in rng.sample(range(100), 12)]
    items = [("head_object", {"bucket": "acme-finance", "key": k},
              jdump({"ContentLength": rng.randint(40_000, 400_000), "ETag": f"\"{rhex(rng, 32)}\"", "LastModified": f"2027-03-{rng.randint(1, 28):02d}"}))
             for k in keys]
    batches = [items[i:i + 3] for i in range(0, 12, 3)]
    fan_out(sc, "You audit the finance bucket.", ["head_object"], "Check that these 12 March invoices exist and aren't empty.",
            batches, conv_kw={"extra": {"parallel_tool_calls": True}}, final="All 12 invoices exist and are non-empty.")
    sc.description = "An audit agent checks twelve different invoice objects, three in parallel per turn."


def res_pods(sc: Scenario):
    rng = sc.rng
    pods = [f"search-indexer-7d4b9c{rhex(rng, 3)}-{rb62(rng, 5).lower()}" for _ in range(8)]
    items = [("kubectl_describe", {"kind": "pod", "name": p, "namespace": "search"},
              f"Name: {p}\nStatus: Running\nRestarts: {rng.randint(0, 3)}\nNode: ip-10-0-{rng.randint(1, 9)}-{rng.randint(10, 250)}\n"
              f"Last State: {rng.choice(['<none>', 'Terminated (OOMKilled)'])}") for p in pods]
    fan_out(sc, "You are a Kubernetes assistant.", ["kubectl_describe"], "Which search-indexer pods were OOMKilled recently?",
            [items[0:4], items[4:8]], conv_kw={"thinking": True}, final="Three pods show OOMKilled as last state.")
    sc.description = "A Kubernetes agent describes eight different pods in two parallel turns of four."


def res_charges(sc: Scenario):
    rng = sc.rng
    base = "ch_3QaZ81Lm2kXy7Vb0Qe4"
    ids = [base + f"{i:03d}" for i in range(10)]
    batches = [[("get_charge", {"charge_id": c}, jdump({"id": c, "amount": rng.randint(500, 9000), "disputed": rng.random() < 0.2}))] for c in ids]
    fan_out(sc, "You are a disputes assistant.", ["get_charge"], "Check these ten charges from the batch for disputes.",
            batches, conv_kw={"reasoning": True, "encrypted": True}, final="Two of the ten charges are disputed.")
    sc.description = "A disputes agent fetches ten charges whose ids differ only in their last three digits."


def res_tracking(sc: Scenario):
    rng = sc.rng
    nums = [f"1Z4F8W2{rdigits(rng, 3)}0{n:07d}" for n in range(4417001, 4417011)]
    batches = [[("lookup_tracking", {"carrier": "ups", "tracking_number": n},
                 jdump({"status": rng.choice(["delivered", "in_transit", "out_for_delivery"]), "updated": f"2027-03-{rng.randint(10, 15):02d}"}))]
               for n in nums]
    fan_out(sc, "You are a shipping assistant.", ["lookup_tracking"], "Status of the ten parcels from this morning's pickup?",
            batches, final="Four delivered, five in transit, one out for delivery.")
    sc.description = "A shipping agent looks up ten different tracking numbers one after another."


def res_probes(sc: Scenario):
    rng = sc.rng
    hosts = [f"https://{h}.edge.example/healthz" for h in ["ams1", "ams2", "fra1", "fra2", "lhr1", "lhr2", "mad1", "cdg1",
                                                            "waw1", "arn1", "mxp1", "vie1"]]
    items = [("http_probe", {"url": h}, f"200 OK in {rng.randint(8, 90)} ms") for h in hosts]
    fan_out(sc, "You monitor the edge fleet.", ["http_probe"], "Health-check all twelve EU edge nodes.",
            [items[i:i + 4] for i in range(0, 12, 4)], conv_kw={"reasoning": True, "extra": {"parallel_tool_calls": True}},
            final="All twelve EU edge nodes answer 200.")
    sc.description = "A monitoring agent probes twelve different edge hosts, four in parallel per turn."


def res_issues(sc: Scenario):
    rng = sc.rng
    batches = [[("jira_get_issue", {"key": f"PAY-{k}"}, jdump({"key": f"PAY-{k}", "status": rng.choice(["Done", "In Progress", "To Do"]),
                                                               "summary": rng.choice(["Refund rounding", "3DS timeout", "Payout retry", "Webhook order"])}))]
               for k in range(4101, 4111)]
    fan_out(sc, "You prepare sprint reviews.", ["jira_get_issue"], "Status of PAY-4101 to PAY-4110?", batches,
            conv_kw={"thinking": True, "redacted_p": 0.3}, final="Six done, three in progress, one to do.")
    sc.description = "A sprint-review agent fetches ten consecutive Jira issues PAY-4101 to PAY-4110."


# 7.9 exempt_polls ----------------------------------------------------------

def poll(sc: Scenario, system, tools, user, name, args, outputs, conv_kw=None, final="Done."):
    conv = sc.conv(system, tools, **(conv_kw or {}))
    r = Run(sc, conv)
    r.user(user)
    for k, o in enumerate(outputs):
        sc.clock.tick(20, 90)
        r.call(name, args, o, think=["Check the status.", "Not done yet; check again.", "Poll again.", "Check progress."][k % 4])
    r.say(final)
    r.user("Great.")
    sc.tags += ["exempt_tool", "near_miss"]
    return r


def poll_transcode(sc: Scenario):
    outs = ["state: queued"] * 3 + [f"state: running {p}%" for p in (12, 31, 58, 83)] + ["state: done · output s3://media/out/ep12-1080p.mp4"]
    poll(sc, "You publish episodes for the Longform podcast.", ["check_transcode_job"], "Let me know when episode 12's video is ready.",
         "check_transcode_job", {"job_id": "tj_8812"}, outs, final="Episode 12's 1080p file is ready.")
    sc.description = "An agent polls a transcode job with identical arguments: queued three times, then rising percentages, then done."


def poll_replica(sc: Scenario):
    outs = [f"initial sync: copying {p}% ({p * 29 / 1000:.2f} TB of 2.90 TB)" for p in (8, 21, 37, 52, 70, 88)] + ["initial sync: complete · streaming"]
    poll(sc, "You are a database operations agent.", ["get_replica_sync_state"], "Tell me when the new replica pg-eu-3 is streaming.",
         "get_replica_sync_state", {"replica": "pg-eu-3"}, outs, conv_kw={"reasoning": True}, final="pg-eu-3 finished its initial sync and is streaming.")
    sc.description = "An agent polls a replica's initial sync with identical arguments until it is streaming."


def poll_batch(sc: Scenario):
    outs = ["status: validating", "status: validating", "status: in_progress (0/5000)"] + \
           [f"status: in_progress ({n}/5000)" for n in (1200, 2650, 4100)] + ["status: completed (5000/5000) · output file-out-77"]
    poll(sc, "You run offline batch jobs.", ["fetch_batch_run"], "Wait for batch run br_51 to finish and tell me.",
         "fetch_batch_run", {"run_id": "br_51"}, outs, conv_kw={"thinking": True}, final="Batch br_51 completed all 5,000 requests.")
    sc.description = "An agent polls a batch inference run with identical arguments through validating, progress counts and completion."


def poll_upgrade(sc: Scenario):
    outs = ["control plane: upgrading", "control plane: upgrading", "control plane: 1.30.2 · node pools: 0/3",
            "node pools: 1/3 (default)", "node pools: 2/3 (gpu)", "node pools: 3/3 · upgrade complete"]
    poll(sc, "You are a platform agent.", ["get_cluster_upgrade_state"], "Watch the prod-eu upgrade to 1.30 and report.",
         "get_cluster_upgrade_state", {"cluster": "prod-eu"}, outs, final="prod-eu is fully on 1.30.2.")
    sc.description = "An agent polls a cluster upgrade with identical arguments until all node pools are upgraded."


def poll_payout(sc: Scenario):
    outs = ["pending"] * 4 + ["in_transit · expected 2027-03-18", "paid · 2027-03-18"]
    poll(sc, "You are a treasury assistant.", ["check_payout_settlement"], "Has payout po_1QX9 settled?",
         "check_payout_settlement", {"payout_id": "po_1QX9"}, outs, conv_kw={"reasoning": True}, final="Payout po_1QX9 was paid on 18 March.")
    sc.description = "An agent polls a payout with identical arguments: pending four times, then in transit, then paid."


def poll_index(sc: Scenario):
    outs = [f"building: {p}% of 4.2M vectors" for p in (5, 19, 40, 66, 91)] + ["ready"]
    poll(sc, "You maintain the semantic search index.", ["get_index_build"], "Let me know when the new embeddings index is ready.",
         "get_index_build", {"index": "docs-v5", "build_id": "b_2027_03_14"}, outs, conv_kw={"thinking": True},
         final="docs-v5 is built and ready.")
    sc.description = "An agent polls a vector index build with identical arguments until it is ready."


# ---------------------------------------------------------------------------
# 8. Kind table
# ---------------------------------------------------------------------------
# (label, kind, builders, format_offset).  Scenario i (1-based) of a kind uses
# FORMATS[(i - 1 + offset) % 3]; every kind has a multiple of three
# scenarios, so each label is balanced across formats.

KINDS = [
    ("loop", "failing_tool_fresh_ids",
     [fail_refund, fail_scale, fail_expense_ja, fail_erp_de, fail_java_trace, fail_py_trace, fail_geocode_parallel,
      fail_s3, fail_booking_fr], 0),
    ("loop", "timing_only_change",
     [time_pytest, time_docs_html, time_cargo, time_http_timeout, time_docker, time_systemctl, time_sql_timeout,
      time_carrier_es, time_caldav_zh], 0),
    ("loop", "same_answer_reworded", [build_same_answer_reworded] * 9, 0),
    ("loop", "tool_cycle", [cyc_sheet, cyc_pods_logs, cyc_browser, cyc_parallel_kv, cyc_code_three, cyc_ticket_three], 2),
    ("loop", "stalled_pagination",
     [page_crm_echo, page_jira_stuck, page_stripe_stuck, page_gh_ratelimit, page_bucket_stale, page_catalog_es], 2),
    ("loop", "subagent_bounce",
     [bounce_research, bounce_billing_reworded, bounce_sql_ambiguous, bounce_legal_fr, bounce_review_reworded,
      bounce_planner], 0),
    ("loop", "client_resend_storm",
     [storm_curl, storm_forged_constant, storm_forged_increment, storm_stream_sdk, storm_image_429,
      storm_thinking_forged], 0),
    ("loop", "loop_under_changing_context",
     [ctx_calendar, ctx_budget, ctx_memory_tracking, ctx_hotels_es, ctx_parallel_skus, ctx_context_meter,
      ctx_plan_text, ctx_email_resend, ctx_helpcenter_de], 0),
    ("healthy", "marathon_session",
     [marathon_httpx, marathon_incident, marathon_analysis, marathon_support_es, marathon_catalog,
      marathon_research], 0),
    ("healthy", "numbers_only_progress",
     [prog_pytest, prog_jest, prog_cargo, prog_gotest, prog_rspec_pt, prog_reindex, prog_backfill, prog_download,
      prog_queue], 0),
    ("healthy", "provider_error_retry",
     [retry_429_chat, retry_500_first, retry_529_midloop, retry_500_twice, retry_two_episodes, retry_500_de_stream,
      retry_giveup_503, retry_429_twice_stream, retry_giveup_529], 0),
    ("healthy", "whole_text_revisions", [build_whole_text_revisions] * 6, 0),
    ("healthy", "fleet_same_prompt",
     [fleet_recipes, fleet_helpcenter, fleet_japanese, fleet_sample_image, fleet_dated, fleet_returns_es], 0),
    ("healthy", "template_batch_jobs",
     [batch_tickets_pt, batch_translate_ja, batch_invoices, batch_commit_summaries, batch_grading, batch_captions], 0),
    ("healthy", "advancing_cursor", [cur_crm, cur_github, cur_stripe, cur_jira, cur_bucket, cur_audit], 0),
    ("healthy", "many_resources", [res_objects, res_charges, res_pods, res_tracking, res_probes, res_issues], 0),
    ("healthy", "exempt_polls", [poll_transcode, poll_replica, poll_batch, poll_upgrade, poll_payout, poll_index], 0),
]

# Kinds whose loop is one tool call (or parallel batch) repeated with the same arguments.
STRICT_TOOL_LOOP_KINDS = {"failing_tool_fresh_ids", "timing_only_change", "stalled_pagination",
                          "subagent_bounce", "loop_under_changing_context"}


def build_all() -> list[Scenario]:
    out = []
    for label, kind, builders, offset in KINDS:
        assert 4 <= len(builders) <= 10 and len(builders) % 3 == 0, kind
        for i, b in enumerate(builders, start=1):
            sc = Scenario(label, kind, i, FORMATS[(i - 1 + offset) % 3])
            b(sc)
            if label == "loop":
                sc.loop_turn = sc.occ_requests[2] if len(sc.occ_requests) >= 3 else None
            out.append(sc)
    return out


# ---------------------------------------------------------------------------
# 9. Self-checks
# ---------------------------------------------------------------------------

CHAT_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")
ANTH_ID = re.compile(r"^toolu_01[A-Za-z0-9]{22}$")
ERROR_STATUSES = {429, 500, 503, 529}


class CheckError(Exception):
    pass


def body_calls(fmt: str, body: dict) -> list[dict]:
    """All tool calls in a body, in order: {id, name, args (canonical), output, is_error}."""
    calls, by_id = [], {}
    if fmt == "openai_chat":
        for m in body["messages"]:
            for tc in m.get("tool_calls") or []:
                c = {"id": tc["id"], "name": tc["function"]["name"], "args": canon_args(tc["function"]["arguments"]),
                     "output": None, "is_error": False}
                calls.append(c)
                by_id[c["id"]] = c
            if m["role"] == "tool":
                by_id[m["tool_call_id"]]["output"] = m["content"]
    elif fmt == "openai_responses":
        for it in body["input"]:
            if it.get("type") == "function_call":
                c = {"id": it["call_id"], "name": it["name"], "args": canon_args(it["arguments"]), "output": None,
                     "is_error": False}
                calls.append(c)
                by_id[c["id"]] = c
            elif it.get("type") == "function_call_output":
                by_id[it["call_id"]]["output"] = it["output"]
    else:
        for m in body["messages"]:
            if isinstance(m["content"], str):
                continue
            for b in m["content"]:
                if b["type"] == "tool_use":
                    c = {"id": b["id"], "name": b["name"], "args": json.dumps(b["input"], sort_keys=True, separators=(",", ":"),
                                                                              ensure_ascii=False),
                         "output": None, "is_error": False}
                    calls.append(c)
                    by_id[c["id"]] = c
                elif b["type"] == "tool_result":
                    content = b["content"]
                    if isinstance(content, list):
                        content = "".join(x["text"] for x in content if x["type"] == "text")
                    by_id[b["tool_use_id"]]["output"] = content
                    by_id[b["tool_use_id"]]["is_error"] = bool(b.get("is_error"))
    return calls


def assistant_texts(fmt: str, body: dict) -> list[str]:
    out = []
    if fmt == "openai_chat":
        for m in body["messages"]:
            if m["role"] == "assistant" and isinstance(m.get("content"), str):
                out.append(m["content"])
    elif fmt == "openai_responses":
        for it in body["input"]:
            if it.get("type") == "message" and it.get("role") == "assistant":
                out.extend(p["text"] for p in it["content"] if p["type"] == "output_text")
    else:
        for m in body["messages"]:
            if m["role"] != "assistant":
                continue
            if isinstance(m["content"], str):
                out.append(m["content"])
            else:
                out.extend(b["text"] for b in m["content"] if b["type"] == "text")
    return out


def system_of(fmt: str, body: dict) -> str:
    if fmt == "openai_chat":
        m = body["messages"][0]
        return m["content"] if m["role"] in ("system", "developer") else ""
    if fmt == "openai_responses":
        return body.get("instructions", "")
    s = body.get("system", "")
    return s if isinstance(s, str) else "".join(b["text"] for b in s)


def offered_tools(fmt: str, body: dict) -> set[str]:
    tools = body.get("tools", [])
    if fmt == "openai_chat":
        return {t["function"]["name"] for t in tools}
    return {t["name"] for t in tools}


def check_body(fmt: str, body: dict):
    def fail(msg):
        raise CheckError(msg)
    offered = offered_tools(fmt, body)
    seen_ids = set()

    def new_call(cid, name, args_ok):
        if cid in seen_ids:
            fail(f"duplicate call id {cid}")
        seen_ids.add(cid)
        if name not in offered:
            fail(f"tool {name} called but not offered")
        if not args_ok:
            fail(f"arguments of {cid} are not valid JSON")

    def valid_json(s):
        try:
            json.loads(s)
            return True
        except (TypeError, ValueError):
            return False

    if fmt == "openai_chat":
        msgs = body["messages"]
        pending: set[str] = set()
        for i, m in enumerate(msgs):
            role = m["role"]
            if role in ("system", "developer"):
                if i != 0:
                    fail("system message not first")
                continue
            if role == "tool":
                if m["tool_call_id"] not in pending:
                    fail(f"tool message answers no pending call: {m['tool_call_id']}")
                pending.discard(m["tool_call_id"])
                if not isinstance(m["content"], str):
                    fail("tool content must be a string")
                continue
            if pending:
                fail(f"unanswered tool calls before a {role} message: {sorted(pending)}")
            if role == "assistant":
                for tc in m.get("tool_calls") or []:
                    if not CHAT_ID.match(tc["id"]) or tc["type"] != "function":
                        fail(f"bad tool call {tc['id']}")
                    new_call(tc["id"], tc["function"]["name"], valid_json(tc["function"]["arguments"]))
                    pending.add(tc["id"])
                if m.get("content") is None and not m.get("tool_calls"):
                    fail("empty assistant message")
            elif role != "user":
                fail(f"unknown role {role}")
        if pending:
            fail("unanswered tool calls at end")
        if msgs[-1]["role"] not in ("user", "tool"):
            fail("chat body must end with a user or tool message")
    elif fmt == "openai_responses":
        pending = set()
        items = body["input"]
        for i, it in enumerate(items):
            t = it.get("type")
            if t == "function_call":
                if not CHAT_ID.match(it["call_id"]):
                    fail(f"bad call_id {it['call_id']}")
                if "id" in it and (not it["id"].startswith("fc_") or it.get("status") != "completed"):
                    fail("function_call id/status malformed")
                new_call(it["call_id"], it["name"], valid_json(it["arguments"]))
                pending.add(it["call_id"])
            elif t == "function_call_output":
                if it["call_id"] not in pending:
                    fail(f"output answers no earlier call: {it['call_id']}")
                pending.discard(it["call_id"])
            elif t == "reasoning":
                if not it["id"].startswith("rs_"):
                    fail("reasoning id")
                nxt = items[i + 1] if i + 1 < len(items) else None
                if nxt is None or nxt.get("type") not in ("function_call", "message"):
                    fail("reasoning item not followed by output")
            else:
                if pending:
                    fail("unanswered function calls before a message")
                if it.get("role") not in ("user", "assistant"):
                    fail("bad input item")
        if pending:
            fail("unanswered function calls at end")
        last = items[-1]
        if not (last.get("role") == "user" or last.get("type") == "function_call_output"):
            fail("responses input must end with user input or a function_call_output")
    else:
        msgs = body["messages"]
        thinking_on = "thinking" in body
        if msgs[0]["role"] != "user" or msgs[-1]["role"] != "user":
            fail("anthropic messages must start and end with user")
        prev_uses: list[str] = []
        for i, m in enumerate(msgs):
            if i and m["role"] == msgs[i - 1]["role"]:
                fail("roles do not alternate")
            content = m["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            if m["role"] == "assistant":
                uses = [b for b in blocks if b["type"] == "tool_use"]
                for b in uses:
                    if not ANTH_ID.match(b["id"]) or not isinstance(b["input"], dict):
                        fail(f"bad tool_use {b['id']}")
                    new_call(b["id"], b["name"], True)
                for b in blocks:
                    if b["type"] == "thinking" and not b.get("signature"):
                        fail("thinking without signature")
                if thinking_on and blocks[0]["type"] not in ("thinking", "redacted_thinking"):
                    fail("thinking enabled but assistant turn does not start with thinking")
                kinds = [b["type"] for b in blocks]
                if "tool_use" in kinds and any(k in ("thinking", "redacted_thinking") for k in kinds[kinds.index("tool_use"):]):
                    fail("thinking after tool_use")
                prev_uses = [b["id"] for b in uses]
            else:
                results = [b for b in blocks if b["type"] == "tool_result"]
                n = len(results)
                if any(b["type"] == "tool_result" for b in blocks[n:]):
                    fail("tool_result blocks must come first in the user turn")
                if sorted(b["tool_use_id"] for b in results) != sorted(prev_uses):
                    fail("tool_results do not answer exactly the preceding tool_use ids")
                prev_uses = []
                for b in blocks:
                    if b["type"] == "image":
                        src = b["source"]
                        if src["type"] == "base64":
                            base64.b64decode(src["data"], validate=True)
                        elif not src.get("file_id", "").startswith("file_"):
                            fail("bad image source")


def check_scenario(sc: Scenario, all_keys: dict):
    def fail(msg):
        raise CheckError(f"{sc.id}: {msg}")
    if not re.match(rf"^{sc.label}-{sc.kind}-\d\d$", sc.id):
        fail("bad id")
    if not sc.description or "\n" in sc.description or not sc.description.endswith("."):
        fail("description must be one sentence")
    if not sc.requests:
        fail("no requests")
    keys = set()
    sessions_by_key: dict[str, set] = {}
    id_map: dict[str, tuple] = {}
    prev = None
    exempt_seen = set()
    for n, req in enumerate(sc.requests, start=1):
        h = req["headers"]
        if req["method"] != "POST" or req["path"] != PATHS[sc.format]:
            fail(f"request {n}: method/path")
        for must in ("content-type", "user-agent", "x-session-id"):
            if not h.get(must):
                fail(f"request {n}: missing {must}")
        if sc.format == "anthropic_messages":
            key = h.get("x-api-key")
            if h.get("anthropic-version") != "2023-06-01" or "authorization" in h:
                fail(f"request {n}: anthropic headers")
        else:
            auth = h.get("authorization", "")
            if not auth.startswith("Bearer ") or "x-api-key" in h:
                fail(f"request {n}: openai auth header")
            key = auth[7:]
        if not key or not key.startswith(f"sk-heldout-{sc.id}-"):
            fail(f"request {n}: key {key!r} not scoped to scenario")
        keys.add(key)
        sessions_by_key.setdefault(key, set()).add(h["x-session-id"])
        try:
            check_body(sc.format, req["body"])
        except CheckError as e:
            fail(f"request {n}: {e}")
        json.loads(json.dumps(req["body"]))
        st = req.get("response", {}).get("status")
        if st is not None and st not in ERROR_STATUSES:
            fail(f"request {n}: unexpected status {st}")
        for c in body_calls(sc.format, req["body"]):
            sig = (c["name"], c["args"], c["output"])
            if id_map.setdefault(c["id"], sig) != sig:
                fail(f"call id {c['id']} reused for a different call")
            if c["name"] in EXEMPT_TOOLS:
                exempt_seen.add(c["name"])
        # SDK retry rules
        rc = h.get("x-stainless-retry-count")
        if sc.label == "healthy":
            if rc not in (None, "0"):
                if prev is None or prev["body"] != req["body"] or "response" not in prev:
                    fail(f"request {n}: retry-count {rc} without an identical failed previous request")
                prc = prev["headers"].get("x-stainless-retry-count", "0")
                if int(rc) != int(prc) + 1 or int(rc) > 2:
                    fail(f"request {n}: retry count sequence")
                if prev["headers"]["x-session-id"] != h["x-session-id"]:
                    fail(f"request {n}: retry changed session")
            elif prev is not None and prev["body"] == req["body"] and prev["headers"]["x-session-id"] == h["x-session-id"]:
                fail(f"request {n}: identical resend in a healthy scenario without SDK retry header")
            if prev is not None and "response" in prev and rc in (None, "0"):
                fail(f"request {n}: a failed request was not retried")
        prev = req
    if "response" in sc.requests[-1] and sc.label == "healthy":
        if sc.requests[-1]["headers"].get("x-stainless-retry-count") != "2":
            fail("last request failed but the SDK did not exhaust its retries")
    # keys
    for k in keys:
        if k in all_keys:
            fail(f"key shared with {all_keys[k]}")
        all_keys[k] = sc.id
    if sc.kind == "fleet_same_prompt":
        if not 10 <= len(keys) <= 20:
            fail("fleet needs 10-20 keys")
        seen_sess = {}
        for k, ss in sessions_by_key.items():
            for s in ss:
                if seen_sess.setdefault(s, k) != k:
                    fail("session shared across callers")
    elif len(keys) != 1:
        fail("exactly one key expected")
    # statuses only where they belong
    if any("response" in r for r in sc.requests) and sc.kind not in ("provider_error_retry", "client_resend_storm"):
        fail("error statuses outside the retry/storm kinds")
    if sc.kind == "provider_error_retry" and not any("response" in r for r in sc.requests):
        fail("retry scenario without an error")
    # exempt tools
    if sc.kind == "exempt_polls":
        if not exempt_seen or "exempt_tool" not in sc.tags:
            fail("exempt poll without exempt tool/tag")
    elif exempt_seen:
        fail(f"exempt tools used outside exempt_polls: {exempt_seen}")
    if sc.kind == "marathon_session" and len(sc.requests) < 50:
        fail(f"marathon session has only {len(sc.requests)} requests")
    if sc.label == "healthy":
        if sc.loop_turn is not None:
            fail("healthy scenario with loop_turn")
        check_healthy_kind(sc, fail)
    else:
        check_loop(sc, fail)


def _mask_digits(s: str) -> str:
    """Every number (with its thousands separators and decimals) becomes '#'."""
    return re.sub(r"\d(?:[\d,.]*\d)?", "#", s)


_DURATION_RUN = re.compile(r"(?:\d+(?:\.\d+)?\s?(?:min|ms|h|d|s)\b\s?)+")


def _mask_timing(s: str) -> str:
    """Digits masked, and a run of duration parts ("1min 3s") counted as one."""
    return _mask_digits(_DURATION_RUN.sub("<dur> ", s))


def check_healthy_kind(sc: Scenario, fail):
    last = sc.requests[-1]["body"]
    if sc.kind == "numbers_only_progress":
        calls = body_calls(sc.format, last)
        groups: dict[tuple, list[str]] = {}
        for c in calls:
            groups.setdefault((c["name"], c["args"]), []).append(c["output"])
        rep = max(groups.values(), key=len)
        if len(rep) < 4 or len(set(rep)) < 3:
            fail("progress tool not repeated with changing output")
        for i in range(len(rep) - 1):
            if _mask_digits(rep[i]) != _mask_digits(rep[i + 1]) and i + 1 != len(rep) - 1:
                fail("progress outputs differ in more than numbers")
    if sc.kind == "whole_text_revisions":
        texts = assistant_texts(sc.format, last)
        if len(set(texts)) != len(texts):
            fail("revision answers repeat")
        for a, b in zip(texts, texts[1:]):
            if difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() < 0.75:
                fail("consecutive revisions are not near-identical")
    if sc.kind == "advancing_cursor":
        calls = body_calls(sc.format, last)
        if len({c["args"] for c in calls}) != len(calls) or len({c["output"] for c in calls}) != len(calls):
            fail("pagination does not advance")
    if sc.kind == "many_resources":
        calls = body_calls(sc.format, last)
        if len({c["args"] for c in calls}) != len(calls):
            fail("resources repeat")


def check_loop(sc: Scenario, fail):
    lt = sc.loop_turn
    if lt is None:
        fail("loop without loop_turn")
    if len(sc.requests) - lt < 3:
        fail("fewer than 3 requests after loop_turn")
    if lt != sc.occ_requests[2]:
        fail("loop_turn is not the request carrying the third occurrence")
    if len(sc.occ_requests) < 4:
        fail("loop does not continue after loop_turn")
    occ = set(sc.occ_requests)
    if sc.kind != "tool_cycle":
        for n in range(lt + 1, len(sc.requests) + 1):
            if n not in occ:
                fail(f"request {n} after loop_turn carries no new occurrence")
    fmt = sc.format
    if sc.loop_sig is not None:
        def count(n):
            return sum(1 for c in body_calls(fmt, sc.requests[n - 1]["body"])
                       if (c["name"], c["args"]) == sc.loop_sig and c["output"] is not None)
        if count(lt) != 3 or count(lt - 1) != 2:
            fail(f"loop_turn body carries {count(lt)} loop calls (previous {count(lt - 1)}), expected 3 and 2")
        outs = [c["output"] for c in body_calls(fmt, sc.requests[-1]["body"]) if (c["name"], c["args"]) == sc.loop_sig]
        if sc.kind == "timing_only_change":
            for a, b in zip(outs, outs[1:]):
                if a == b or _mask_timing(a) != _mask_timing(b):
                    fail("timing loop results must differ only in digits")
        if sc.kind == "failing_tool_fresh_ids" and len(set(outs)) != len(outs):
            fail("failing-tool errors must all carry fresh ids")
    elif sc.kind in STRICT_TOOL_LOOP_KINDS and sc.kind != "subagent_bounce" and sc.kind != "loop_under_changing_context":
        fail("strict tool loop without signature")
    if sc.kind == "client_resend_storm":
        first = sc.occ_requests[0]
        bodies = {json.dumps(sc.requests[n - 1]["body"], sort_keys=True) for n in sc.occ_requests}
        if len(bodies) != 1 or sc.occ_requests != list(range(first, len(sc.requests) + 1)):
            fail("storm sends must be byte-identical and consecutive")
        if lt != first + 2 or any("response" in sc.requests[n - 1] for n in range(first, lt + 1)):
            fail("storm loop_turn must be the third identical send, answered 200")
    if sc.kind == "same_answer_reworded" or sc.id == "loop-loop_under_changing_context-07":
        texts = assistant_texts(fmt, sc.requests[-1]["body"])
        if len(set(texts)) != len(texts):
            fail("reworded answers repeat byte-for-byte")
    if sc.kind == "loop_under_changing_context":
        systems = {system_of(fmt, r["body"]) for r in sc.requests}
        if len(systems) < 0.6 * len(sc.requests):
            fail("system prompt does not change between turns")
    if sc.kind == "tool_cycle":
        counts = [len(body_calls(fmt, sc.requests[n - 1]["body"])) for n in range(lt, len(sc.requests) + 1)]
        if any(b <= a for a, b in zip(counts, counts[1:])):
            fail("a request after loop_turn carries no further cycle call")
        calls = body_calls(fmt, sc.requests[-1]["body"])
        outs: dict[tuple, set] = {}
        for c in calls:
            outs.setdefault((c["name"], c["args"]), set()).add(c["output"])
        if any(len(v) != 1 for v in outs.values()):
            fail("cycle results must be unchanged")
        if len(outs) not in (2, 3, 4):
            fail("cycle of unexpected width")


def check_all(scs: list[Scenario]):
    ids = [sc.id for sc in scs]
    if len(set(ids)) != len(ids):
        raise CheckError("duplicate scenario ids")
    all_keys: dict[str, str] = {}
    for sc in scs:
        check_scenario(sc, all_keys)
    by = {}
    for sc in scs:
        by[(sc.label, sc.format)] = by.get((sc.label, sc.format), 0) + 1
    loops = sum(1 for sc in scs if sc.label == "loop")
    if loops * 2 != len(scs):
        raise CheckError("loops and healthy must be equal in number")
    for label in ("loop", "healthy"):
        counts = {by.get((label, f), 0) for f in FORMATS}
        if len(counts) != 1:
            raise CheckError(f"{label} not balanced across formats: {by}")


# ---------------------------------------------------------------------------
# 10. Writing, manifest and --check
# ---------------------------------------------------------------------------

def serialize(sc: Scenario) -> str:
    env = {"id": sc.id, "label": sc.label, "kind": sc.kind, "format": sc.format, "loop_turn": sc.loop_turn,
           "tags": sorted(set(sc.tags)), "description": sc.description}
    head = jdump(env)[:-1] + ',"requests":['
    lines = [jdump(r) for r in sc.requests]
    return head + "\n" + ",\n".join(lines) + "\n]}\n"


def manifest(scs: list[Scenario]) -> str:
    by_label, by_format, by_kind, by_lf = {}, {}, {}, {}
    for sc in scs:
        by_label[sc.label] = by_label.get(sc.label, 0) + 1
        by_format[sc.format] = by_format.get(sc.format, 0) + 1
        k = by_kind.setdefault(sc.kind, {"label": sc.label, "scenarios": 0, "requests": 0,
                                         "by_format": {f: 0 for f in FORMATS}})
        k["scenarios"] += 1
        k["requests"] += len(sc.requests)
        k["by_format"][sc.format] += 1
        lf = by_lf.setdefault(sc.label, {f: 0 for f in FORMATS})
        lf[sc.format] += 1
    m = {"seed": SEED, "exempt_tools": EXEMPT_TOOLS,
         "counts": {"scenarios": len(scs), "requests": sum(len(s.requests) for s in scs),
                    "by_label": by_label, "by_format": by_format, "by_label_format": by_lf, "by_kind": by_kind},
         "scenarios": [sc.id for sc in scs]}
    return json.dumps(m, ensure_ascii=False, indent=2) + "\n"


def generate() -> tuple[dict[str, str], str, list[Scenario]]:
    scs = build_all()
    check_all(scs)
    files = {f"{sc.id}.json": serialize(sc) for sc in scs}
    for name, text in files.items():
        json.loads(text)
    return files, manifest(scs), scs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="regenerate in memory and compare with the files on disk")
    args = ap.parse_args(argv)
    try:
        files, man, scs = generate()
    except CheckError as e:
        print(f"self-check failed, nothing written: {e}", file=sys.stderr)
        return 2
    if args.check:
        problems = []
        on_disk = {p.name for p in SCEN_DIR.glob("*.json")} if SCEN_DIR.exists() else set()
        for name in sorted(files):
            p = SCEN_DIR / name
            if name not in on_disk:
                problems.append(f"missing: scenarios/{name}")
            elif p.read_text(encoding="utf-8") != files[name]:
                problems.append(f"changed: scenarios/{name}")
        for name in sorted(on_disk - set(files)):
            problems.append(f"stale: scenarios/{name}")
        if not MANIFEST.exists():
            problems.append("missing: manifest.json")
        elif MANIFEST.read_text(encoding="utf-8") != man:
            problems.append("changed: manifest.json")
        for p in problems:
            print(p)
        if problems:
            print(f"{len(problems)} file(s) out of date; run python3 {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"ok: {len(files)} scenarios and manifest.json match the generator")
        return 0
    SCEN_DIR.mkdir(parents=True, exist_ok=True)
    for p in SCEN_DIR.glob("*.json"):
        if p.name not in files:
            p.unlink()
    for name, text in files.items():
        p = SCEN_DIR / name
        if not p.exists() or p.read_text(encoding="utf-8") != text:
            p.write_text(text, encoding="utf-8")
    MANIFEST.write_text(man, encoding="utf-8")
    size = sum(len(t.encode("utf-8")) for t in files.values())
    reqs = sum(len(s.requests) for s in scs)
    print(f"wrote {len(files)} scenarios, {reqs} requests, {size / 1e6:.2f} MB")
    kinds = {}
    for sc in scs:
        kinds.setdefault((sc.label, sc.kind), []).append(sc)
    for (label, kind), lst in kinds.items():
        fmts = {f: sum(1 for s in lst if s.format == f) for f in FORMATS}
        print(f"  {label:8s} {kind:30s} {len(lst):2d}  " + " ".join(f"{f.split('_')[-1]}={n}" for f, n in fmts.items())
              + f"  requests={sum(len(s.requests) for s in lst)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
