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
from replaying import assert_agree, corpus_steps, replayed, spend_caps_mix, through_envoy, windows_mix

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
    plugin, steps = windows_mix()
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
    plugin, steps = spend_caps_mix()
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
