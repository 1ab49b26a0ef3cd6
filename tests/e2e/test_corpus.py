"""A slice of the labelled loop corpus through real Envoy with the
recommended setup (the full measurement is `make eval`): the first scenario
of every kind, replayed as recorded. Every loop kind is caught within the
allowed turns of its label, never early, and no healthy conversation is
touched, in enforce mode or (as would-be actions) in shadow mode."""

from __future__ import annotations

import sys

import pytest

from harness import ROOT

sys.path.insert(0, str(ROOT / "eval"))
import eval as corpus  # noqa: E402


@pytest.fixture(scope="module")
def scenarios():
    return corpus.load_scenarios(per_kind=1)


def test_the_slice_covers_every_kind(scenarios):
    kinds = {(s["label"], s["kind"]) for s in scenarios}
    assert {k for label, k in kinds if label == "loop"} == {
        "identical_retry", "volatile_tool_error", "rephrased_text", "stuck_search", "alternating_tools", "resumed_loop"}
    assert len([k for label, k in kinds if label == "healthy"]) == 8


def test_recommended_setup_catches_every_loop_kind_and_touches_nothing_healthy(scenarios):
    replayed = corpus.replay(corpus.RECOMMENDED, scenarios)
    for rep in replayed:
        sc, touched = rep.scenario, rep.touched()
        if sc["label"] == "loop":
            label = sc["loop_turn"]
            assert touched, f"{sc['id']} was not caught"
            assert touched[0] >= label - 1, f"{sc['id']}: touched at {touched[0]}, before its label {label}"
            assert touched[0] <= label + 2, f"{sc['id']}: caught at {touched[0]}, labelled {label}"
            # Every request before the catch reached the provider untouched.
            assert all(o.reached_upstream and not o.effects for o in rep.outcomes[: touched[0] - 1]), sc["id"]
        else:
            assert touched == [], f"healthy {sc['id']} touched at {touched}"
            assert all(o.reached_upstream for o in rep.outcomes), sc["id"]
    s = corpus.score(replayed)
    assert (s.within_two, s.early, s.healthy_touched) == (s.loops, 0, 0)


def test_shadow_mode_reports_the_same_loops_and_touches_nothing(scenarios):
    replayed = corpus.replay(corpus.RECOMMENDED, scenarios, shadow=True)
    for rep in replayed:
        sc = rep.scenario
        assert rep.touched() == [], f"shadow mode touched {sc['id']}"
        assert all(o.reached_upstream for o in rep.outcomes)
        if sc["label"] == "loop":
            assert rep.shadowed(), f"shadow mode did not report {sc['id']}"
            assert sc["loop_turn"] - 1 <= rep.shadowed()[0] <= sc["loop_turn"] + 2
        else:
            assert rep.shadowed() == [], f"shadow would have touched {sc['id']}"


def test_the_committed_corpus_is_what_its_generator_makes():
    import subprocess

    run = subprocess.run([sys.executable, str(ROOT / "tests" / "corpus" / "generate.py"), "--check"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
