"""A slice of both labelled corpora (the tuning corpus and the held-out
one) through real Envoy with the recommended setup (the full measurement is
`make eval`): the first scenario of every kind, replayed as recorded (a
provider's recorded 5xx and 429 answers included). Every loop kind is caught
within the allowed turns of its label, never early, and no healthy
conversation is touched, in enforce mode or (as would-be actions) in shadow
mode."""

from __future__ import annotations

import sys

import pytest

from harness import ROOT

sys.path.insert(0, str(ROOT / "eval"))
import eval as corpus  # noqa: E402


CORPORA = ["tuning", "heldout"]


@pytest.fixture(scope="module", params=CORPORA)
def sliced(request):
    return request.param, corpus.load_scenarios(request.param, per_kind=1)


def test_the_slices_cover_every_kind():
    kinds = {c: {(s["label"], s["kind"]) for s in corpus.load_scenarios(c, per_kind=1)} for c in CORPORA}
    assert {k for label, k in kinds["tuning"] if label == "loop"} == {
        "identical_retry", "volatile_tool_error", "rephrased_text", "stuck_search", "alternating_tools", "resumed_loop"}
    assert len([k for label, k in kinds["tuning"] if label == "healthy"]) == 8
    assert {k for label, k in kinds["heldout"] if label == "loop"} == {
        "failing_tool_fresh_ids", "timing_only_change", "same_answer_reworded", "tool_cycle", "stalled_pagination",
        "subagent_bounce", "client_resend_storm", "loop_under_changing_context"}
    assert {k for label, k in kinds["heldout"] if label == "healthy"} == {
        "marathon_session", "numbers_only_progress", "provider_error_retry", "whole_text_revisions", "fleet_same_prompt",
        "template_batch_jobs", "advancing_cursor", "many_resources", "exempt_polls"}


def test_recommended_setup_catches_every_loop_kind_and_touches_nothing_healthy(sliced):
    name, scenarios = sliced
    replayed = corpus.replay(corpus.recommended_for(name), scenarios)
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


def test_shadow_mode_reports_the_same_loops_and_touches_nothing(sliced):
    name, scenarios = sliced
    replayed = corpus.replay(corpus.recommended_for(name), scenarios, shadow=True)
    for rep in replayed:
        sc = rep.scenario
        assert rep.touched() == [], f"shadow mode touched {sc['id']}"
        assert all(o.reached_upstream for o in rep.outcomes)
        if sc["label"] == "loop":
            assert rep.shadowed(), f"shadow mode did not report {sc['id']}"
            assert sc["loop_turn"] - 1 <= rep.shadowed()[0] <= sc["loop_turn"] + 2
        else:
            assert rep.shadowed() == [], f"shadow would have touched {sc['id']}"


@pytest.mark.parametrize("folder", ["corpus", "heldout"])
def test_the_committed_corpus_is_what_its_generator_makes(folder):
    import subprocess

    run = subprocess.run([sys.executable, str(ROOT / "tests" / folder / "generate.py"), "--check"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
