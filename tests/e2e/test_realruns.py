"""Real recorded agent runs (tests/realruns) as a regression test.

- The held-out split through `loopguard replay` with the shipped
  recommended setup: what `make eval` reports for it (successful runs
  touched and rejected, clearly stuck runs stopped within 3 calls) may not
  get worse, and it is the same at every pace (repetition is judged by a
  conversation's turns, not the clock).
- A slice of real runs through a real Envoy: the filter does to every
  request what replay says it does (so the table `make eval` prints is
  what Envoy would have done).
"""

from __future__ import annotations

import hashlib
import sys

import pytest

from harness import HOST, ROOT
from replaying import assert_agree, real_runs_slice, replayed, through_envoy

sys.path.insert(0, str(ROOT / "eval"))
import realruns  # noqa: E402

# The held-out split's measurement at the time of writing (make eval,
# README "Detection on real agent runs"); a change that does worse fails.
HELDOUT_MAX_REJECTED = 9
HELDOUT_MAX_TOUCHED = 18
HELDOUT_MIN_STUCK_WITHIN_3 = 206
HELDOUT_MAX_STUCK_UNTOUCHED = 6


# `loopguard replay` runs the core natively whatever the host: the
# measurement is the host's business only through the Envoy slice below.
replay_only = pytest.mark.skipif(HOST != "wasm", reason="host-independent (loopguard replay); run once, with the Wasm host's suite")


@pytest.fixture(scope="module")
def heldout():
    return realruns.load_runs("heldout")


@replay_only
def test_the_corpus_is_what_the_readme_says(heldout):
    everything = realruns.load_runs(None)
    assert len(everything) >= 300
    assert len({r["system"] for r in everything}) >= 4
    assert len({r["model"] for r in everything}) >= 6
    shapes = {r["shape"] for r in everything}
    assert {"chat-text", "chat-tools", "anthropic"} <= shapes, shapes
    # The split is the id's hash, as the corpus README says.
    for r in everything:
        split = "heldout" if hashlib.sha256(r["id"].encode()).digest()[0] >= 128 else "tune"
        assert r["labels"]["split"] == split, r["id"]
    # Provenance for every run.
    for r in everything:
        p = r["provenance"]
        assert p["repo"] and p["path"] and p["licence"], r["id"]
    # Enough clearly stuck runs to measure recall, from several agent
    # systems, text actions and native tool calls both.
    stuck = [r for r in everything if r["labels"]["stuck"]]
    assert len(stuck) >= 150 and sum(r["labels"]["split"] == "heldout" for r in stuck) >= 75
    assert len({r["system"] for r in stuck}) >= 4
    assert {"chat-text", "chat-tools"} <= {r["shape"] for r in stuck}


@replay_only
def test_heldout_runs_no_worse_than_measured_and_the_same_at_every_pace(heldout):
    rows = {}
    for pace in (2, 15, 60):
        rows[pace] = realruns.tally(realruns.replay([str(realruns.RECOMMENDED)], heldout, pace)[0])[("all",)]
    row = rows[15]
    assert row.successful >= 400, row.successful
    assert row.rejected <= HELDOUT_MAX_REJECTED, row.rejected_ids
    assert row.touched <= HELDOUT_MAX_TOUCHED, row.touched_ids
    assert row.stuck >= 75
    assert row.within3 >= HELDOUT_MIN_STUCK_WITHIN_3, row.missed_ids
    assert row.untouched <= HELDOUT_MAX_STUCK_UNTOUCHED, row.missed_ids
    # A harness asking again is counted apart from the stuck runs, and
    # passes.
    assert row.harness >= 1 and row.harness_touched == 0, row.harness_ids
    # Not a vacuous slice: stopping saved calls.
    assert row.calls_saved > 0
    for pace in (2, 60):
        other = rows[pace]
        assert (other.touched_ids, other.rejected_ids, other.missed_ids) == (
            row.touched_ids,
            row.rejected_ids,
            row.missed_ids,
        ), pace


def test_replay_agrees_with_envoy_on_real_runs(tmp_path):
    plugin, steps = real_runs_slice()
    traffic, seen = through_envoy(plugin, steps, tmp_path)
    acted = assert_agree(steps, seen, replayed(plugin, traffic, tmp_path))
    # The stuck runs were acted on: the agreement is about something.
    assert acted >= 2, acted
