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
import subprocess
import sys

import pytest

from harness import CLI, ROOT
from replaying import assert_agree, corpus_steps, replayed, through_envoy

sys.path.insert(0, str(ROOT / "eval"))
import eval as corpus  # noqa: E402


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


def test_replay_agrees_with_envoy_on_spend_caps(tmp_path):
    """Budgets (issue 29): dollars per session (from a header or the body),
    tokens per caller, calls per conversation, a cap in shadow mode, and a
    cap beside loop detection. The responses' usage is recorded as JSON
    Lines' `response.usage` (a failed answer with its body), replay feeds it
    through the response path as Envoy read the provider's answer, and for
    every request the decision, loopguard's 429 and the x-loopguard-budget
    header the client got (the spend in it to the cent) are Envoy's."""
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

    traffic, seen = through_envoy(plugin, steps, tmp_path)
    report: dict = {}
    verdicts = replayed(plugin, traffic, tmp_path, report)
    assert_agree(steps, seen, verdicts)
    for s, v in zip(steps, verdicts):
        e = seen[s["id"]]
        assert (v["budget"] or {}).get("header") == e["budget"], f"{s['id']}: envoy {e} / replay {v}"
    # The plan did what it says, so the agreement is about something.
    refused = [v["budget"]["rejected"] for v in verdicts if v["status"] == 429 and v["budget"]]
    assert refused == ["session-usd", "caller-tokens", "turns", "calls"], refused
    headers = [e["budget"] for e in seen.values() if e["budget"]]
    assert "session-usd; spent=0.80; cap=1.00; unit=usd; window=600" in headers, headers
    assert "caller-tokens; spent=5000; cap=5000; unit=tokens; window=600" in headers, headers
    loops = [v for v in verdicts if v["status"] == 429 and v["decision"].get("fingerprint")]
    assert len(loops) == 2, loops
    # A cap's 429 names its budget in the decision record.
    assert sorted(v["decision"]["budget"] for v in verdicts
                  if v["status"] == 429 and "budget" in v["decision"]) == sorted(refused), verdicts
    shadowed = [v for v in verdicts if v["policy"] == "shadowed"]
    assert [(v["status"], (v["budget"] or {}).get("rejected")) for v in shadowed] == \
        [(None, None), (None, None), (None, "calls"), (None, "calls")]
    caps = {p["id"]: {c["name"]: c for c in p["budgets"]["caps"]} for p in report["runs"][0]["policies"]}
    assert [caps["capped"][n]["rejected"] for n in ("session-usd", "caller-tokens", "turns")] == [1, 1, 1]
    assert caps["capped"]["turns"]["warned"] == 2
    assert caps["shadowed"]["calls"]["rejected"] == 2
    assert caps["both"]["calls"]["rejected"] == 1


def test_replay_reports_and_sweeps_the_budget_example(tmp_path):
    """The shipped budget example on the recorded fixture (a wandering
    agent whose context grows, 40 turns, never a repeat): the $5 session cap
    refuses its last 10 turns; a sweep of the cap by its name."""
    traffic = ROOT / "crates" / "cli" / "testdata" / "budget.jsonl"
    config = ROOT / "examples" / "budget" / "envoy.yaml"
    run = subprocess.run([CLI, "replay", "--config", str(config), str(traffic)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "0 loops found" in run.stdout, run.stdout
    assert ("budget session-hour: $5.00 per session in 3600 s (reject): 10 requests rejected "
            "(the first at 2026-11-24T09:10:00.000Z), 4 warned; 1 key touched, 1 at the cap; $5.18 spent") in run.stdout, run.stdout
    page = tmp_path / "r.html"
    run = subprocess.run([CLI, "replay", "--config", str(config), "--json", "--html", str(page),
                          "--set", "policies.agents.budget.limits.session-hour.usd=2,5,10", str(traffic)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)["sweep"]["rows"]
    assert [(r["value"], r["budget_rejected"]) for r in rows] == [(2, 24), (5, 10), (10, 0)]
    assert "<th>Budget rejections</th>" in page.read_text()
