"""Loop and healthy scenarios for the framework tests: what the scripted
model answers turn by turn (a plain function of the conversation it is
sent) and the real tools the framework runs, whose outputs make the loop
or the progress.

`label` is the request (1-based, in the order the framework sends them) a
careful human would call a loop: the one carrying the third occurrence of
the repeated step. A scenario is built fresh for every run (its tools keep
counters: fresh ids, a latency that changes, tests that advance).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Callable

from scripted_model import Call, Conversation, Say, obeys_loopguard

# What an obedient scripted model answers once it has read loopguard's note.
STOP = "I keep repeating myself, so I will stop here and ask you how to proceed."


@dataclass
class Scenario:
    name: str
    prompt: str
    script: Callable[[Conversation], object]
    tools: list[Callable] = field(default_factory=list)
    system: str = "You are a helpful agent."
    label: int | None = None  # None: healthy
    # For conversations an application drives turn after turn: the user's
    # next message after the model's answer, or None to stop.
    follow_up: Callable[[str], str | None] | None = None


# --- loops --------------------------------------------------------------------------


def failing_tool() -> Scenario:
    """The model calls a failing CI tool again and again; every error has a
    fresh timestamp, request id and latency. A stubborn model: it ignores
    loopguard's notes. The third failure is carried by request 4."""
    n = itertools.count(1)

    def get_build_status(branch: str) -> str:
        """The CI status of a branch."""
        i = next(n)
        raise RuntimeError(f"CI API error 503 at 2026-11-23T13:{i:02d}:{(7 * i) % 60:02d}.{(137 * i) % 1000:03d}Z "
                           f"(request id req_{i:04d}xK29dLm0{i % 10}) after {1800 + 37 * i} ms")

    return Scenario("failing tool", "Is the build on main green?", lambda conv: [Call("get_build_status", {"branch": "main"})],
                    [get_build_status], system="You are a release assistant.", label=4)


# The same answer in other words (the corpus's UK-postcode regex loop): the
# same apology, the same wrong regex, reworded every time.
REPHRASED = [
    "You're right, I apologize for the mistake. The district part needs to accept an optional trailing letter. "
    "Here is the corrected version: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`. This should now match EC1A 1BB.",
    "Sorry about that, you're correct. The pattern should allow a letter after the district digit. "
    "Corrected pattern: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`. It will now correctly match EC1A 1BB.",
    "My apologies, you're absolutely right. The issue is that the district section must permit a letter after the digit. "
    "Use this instead: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`. Now EC1A 1BB will be matched as expected.",
    "You're correct, and I'm sorry for the confusion. The district part has to take an optional letter after its digit. "
    "Here is the fixed version: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`. This one matches EC1A 1BB.",
    "Apologies, you're right. The district section should accept a trailing letter after the digit. "
    "Try this: `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`. EC1A 1BB is matched now.",
    "I'm sorry for the trouble. A letter must be allowed after the district digit. "
    "The corrected regex is `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`, which matches EC1A 1BB.",
    "Right, my mistake. The district needs room for an optional letter following the digit. "
    "Please use `^[A-Z]{1,2}\\d ?\\d[A-Z]{2}$`; it should match EC1A 1BB now.",
]


def rephrasing_model() -> Scenario:
    """No tools: the user keeps reporting the same failure and the model
    answers the same wrong regex in other words. It ignores loopguard's
    notes, and a note cannot take its tools away: only a 429 stops it. The
    third rephrased answer is carried by request 4."""

    def script(conv: Conversation):
        return Say(REPHRASED[len(conv.answers) % len(REPHRASED)])

    complaints = itertools.cycle(["That doesn't match EC1A 1BB.", "Still doesn't match EC1A 1BB. Try again.",
                                  "It still fails on EC1A 1BB."])
    return Scenario("rephrasing model", "Write a regex that matches UK postcodes like EC1A 1BB and M1 1AE.", script,
                    system="You are a helpful programming assistant.", label=4,
                    follow_up=lambda answer: next(complaints))


def alternating_tools() -> Scenario:
    """Linter, formatter, linter, formatter... and neither result ever
    changes. The third linter-formatter round ends with call 6, carried by
    request 7."""

    def run_linter(path: str) -> str:
        """Lint a file."""
        return f"{path}:41:1: E302 expected 2 blank lines, found 1\nFound 1 error."

    def apply_formatter(path: str) -> str:
        """Format a file in place."""
        return "1 file left unchanged."

    def script(conv: Conversation):
        calls = conv.calls
        name = "apply_formatter" if calls and calls[-1].name == "run_linter" else "run_linter"
        return [Call(name, {"path": "src/app.py"})]

    return Scenario("A-B alternation", "Make src/app.py pass the linter.", obeys_loopguard(script, STOP),
                    [run_linter, apply_formatter], system="You are a coding agent.", label=7)


def stuck_page() -> Scenario:
    """Paging through tickets, but the API keeps answering page 2 with the
    same next cursor (fresh fetch time and request id). The first page
    does not count; the third request for the stuck cursor is call 4,
    carried by request 5."""
    n = itertools.count(1)

    def list_tickets(cursor: str) -> str:
        """List open support tickets; pass the previous page's next_cursor, or "" for the first page."""
        i = next(n)
        if not cursor:
            page = {"page": 1, "tickets": [{"id": 30401, "subject": "Refund not received"},
                                           {"id": 30407, "subject": "Wrong size delivered"}]}
        else:
            page = {"page": 2, "tickets": [{"id": 30418, "subject": "Cannot reset password"},
                                           {"id": 30422, "subject": "Invoice shows wrong VAT"}]}
        page.update(next_cursor="cur_8fJ2kLm3nQ7x", has_more=True, total_pages=5,
                    fetched_at=f"2026-11-23T14:{i:02d}:{(13 * i) % 60:02d}Z", request_id=f"req_{i:03d}Qz81kLm{i % 10}")
        return json.dumps(page)

    def script(conv: Conversation):
        calls = conv.calls_of("list_tickets")
        if not calls:
            return [Call("list_tickets", {"cursor": ""})]
        last = json.loads(conv.result_of(calls[-1]))
        return [Call("list_tickets", {"cursor": last["next_cursor"]})]

    return Scenario("page never advances", "List all open support tickets.", obeys_loopguard(script, STOP),
                    [list_tickets], system="You are a support agent.", label=5)


def task_handed_back() -> Scenario:
    """The agent delegates to a research sub-agent, which hands the same
    task back with the same question every time. The third delegation is
    carried by request 4."""

    def ask_researcher(task: str) -> str:
        """Delegate a research task to the researcher sub-agent."""
        return ("Researcher: I can't start on this yet. Which service's deploy failed, and in which environment? "
                "Please find out and send me the task again.")

    script = obeys_loopguard(lambda conv: [Call("ask_researcher", {"task": "Find out why last night's deploy failed."})], STOP)
    return Scenario("sub-agent hands the task back", "Why did last night's deploy fail?", script, [ask_researcher],
                    system="You are a lead agent. Delegate research to the researcher.", label=4)


def handoffs_back_and_forth() -> Scenario:
    """OpenAI Agents SDK handoffs: the assistant hands the task to the
    researcher, who hands it straight back, round after round. The third
    round trip ends with call 6, carried by request 7."""

    def script(conv: Conversation):
        handoff = next(t for t in conv.tools if t.startswith("transfer_to_"))
        return [Call(handoff, {})]

    return Scenario("handoff ping-pong", "Why did last night's deploy fail?", obeys_loopguard(script, STOP),
                    system="You are the assistant. Hand research to the researcher.", label=7)


# --- healthy runs -----------------------------------------------------------------------

STEPS = [("list_dir", {"path": "src/billing"})] + [
    ("read_file", {"path": f"src/billing/{name}.py"})
    for name in ["invoice", "ledger", "tax", "currency", "refund", "discount", "dunning", "export", "webhook", "audit"]
] + [("grep", {"pattern": p}) for p in ["round(", "Decimal(", "float(", "TODO", "FIXME"]] + [
    ("read_file", {"path": f"tests/billing/test_{name}.py"}) for name in ["invoice", "tax", "currency", "refund"]
] + [("run_tests", {"path": "tests/billing"}), ("write_file", {"path": "REVIEW.md"})]


def long_productive_run() -> Scenario:
    """A 23-turn code review: every step another call with another result."""
    findings = iter(itertools.cycle(["uses Decimal throughout", "rounds half-even", "no rounding", "formats with 2 places",
                                     "converts at the daily rate", "casts to float before export", "rounds per line item"]))
    seen: dict[str, str] = {}

    def look(what: str) -> str:
        # A new finding for each new thing looked at, the same one if looked at again.
        if what not in seen:
            seen[what] = f"{what}: {next(findings)} (finding {len(seen) + 1})"
        return seen[what]

    def list_dir(path: str) -> str:
        """List a directory."""
        return look(f"listing of {path}")

    def read_file(path: str) -> str:
        """Read a file."""
        return look(f"contents of {path}")

    def grep(pattern: str) -> str:
        """Search the code."""
        return look(f"matches for {pattern!r}")

    def run_tests(path: str) -> str:
        """Run the tests under a path."""
        return "collected 48 items\n\n48 passed in 3.12s"

    def write_file(path: str) -> str:
        """Write the review."""
        return f"wrote {path}"

    def script(conv: Conversation):
        done = len(conv.calls)
        if done < len(STEPS):
            name, args = STEPS[done]
            return [Call(name, args)]
        return Say(LONG_RUN_ANSWER)

    return Scenario("long productive run", "Review the billing module for rounding bugs.", script,
                    [list_dir, read_file, grep, run_tests, write_file], system="You are a code reviewer.")


LONG_RUN_ANSWER = "Review done: billing rounds money with Decimal everywhere except export; details in REVIEW.md."
PARALLEL_ANSWER = "Lisbon: 17 C and sunny at 08:12; 250 EUR is 2905.00 NOK, 34850.00 KES or 995.00 PEN."
ORDER_ANSWER = "Your order ord_5521 is out for delivery with DHL and should arrive today between 14:00 and 18:00."
CODING_ANSWER = "All 25 tests pass: the parser fixes are in src/parser.py."


def parallel_calls() -> Scenario:
    """Three turns of parallel calls (four, three, three at once), then the answer."""

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return {"Oslo": "-3 C, snow", "Lisbon": "17 C, sunny", "Nairobi": "24 C, clouds", "Lima": "19 C, fog"}[city]

    def get_local_time(city: str) -> str:
        """Local time in a city."""
        return {"Oslo": "09:12", "Lisbon": "08:12", "Nairobi": "11:12"}[city]

    def convert(amount: float, currency: str) -> str:
        """Convert an amount of euros."""
        rates = {"NOK": 11.62, "KES": 139.4, "PEN": 3.98}
        return f"{amount} EUR = {amount * rates[currency]:.2f} {currency}"

    def script(conv: Conversation):
        turn = conv.turn
        if turn == 1:
            return [Call("get_weather", {"city": c}) for c in ["Oslo", "Lisbon", "Nairobi", "Lima"]]
        if turn == 2:
            return [Call("get_local_time", {"city": c}) for c in ["Oslo", "Lisbon", "Nairobi"]]
        if turn == 3:
            return [Call("convert", {"amount": 250, "currency": c}) for c in ["NOK", "KES", "PEN"]]
        return Say(PARALLEL_ANSWER)

    return Scenario("parallel tool calls", "Plan my trip: weather, local times and 250 EUR in local money.", script,
                    [get_weather, get_local_time, convert], system="You are a travel assistant.")


def order_lookup() -> Scenario:
    """A short support task every user runs the same way."""

    def get_order(order_id: str) -> str:
        """Look up an order."""
        return json.dumps({"id": order_id, "status": "shipped", "carrier": "DHL", "tracking": "JD014600003828"})

    def get_tracking(tracking: str) -> str:
        """Where a parcel is."""
        return json.dumps({"tracking": tracking, "status": "out for delivery", "eta": "today 14:00-18:00"})

    def script(conv: Conversation):
        if not conv.calls:
            return [Call("get_order", {"order_id": "ord_5521"})]
        if len(conv.calls) == 1:
            return [Call("get_tracking", {"tracking": "JD014600003828"})]
        return Say(ORDER_ANSWER)

    return Scenario("same task, many users", "Where is my order ord_5521?", script, [get_order, get_tracking],
                    system="You are Acme's support assistant.")


def coding_agent() -> Scenario:
    """Edit, run the tests, edit, run the tests... Progress shows only in
    the numbers: 5 failed, then 4, 3, 2, 1, then all 25 pass."""
    runs = itertools.count(0)
    times = ["1.02", "1.10", "0.98", "1.07", "1.01", "1.04"]
    patches = ["parse_date: accept two-digit years", "parse_amount: strip thousands separators",
               "parse_iban: uppercase before checksum", "parse_phone: keep the leading plus",
               "parse_email: lowercase the domain only"]

    def run_tests(path: str) -> str:
        """Run the test suite."""
        i = next(runs)
        failed = 5 - i
        if failed:
            return f"FAILED tests/test_parser.py - {failed} failed, {20 + i} passed in {times[i]}s"
        return f"{25} passed in {times[i]}s"

    def edit_file(path: str, change: str) -> str:
        """Apply a change to a file."""
        return f"edited {path}: {change}"

    def script(conv: Conversation):
        tests, edits = conv.calls_of("run_tests"), conv.calls_of("edit_file")
        if tests and "failed" not in conv.result_of(tests[-1]):
            return Say(CODING_ANSWER)
        if len(tests) == len(edits):
            return [Call("run_tests", {"path": "tests/"})]
        return [Call("edit_file", {"path": "src/parser.py", "change": patches[len(edits)]})]

    return Scenario("coding agent, numbers-only progress", "Make the parser tests pass.", script,
                    [run_tests, edit_file], system="You are a coding agent.")


def transient_provider_errors() -> Scenario:
    """The order lookup, while the provider answers 500 twice on the second
    turn: the SDK retries the same request (its default max_retries 2)."""
    return order_lookup()
