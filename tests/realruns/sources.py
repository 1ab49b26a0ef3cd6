"""Where every run of the corpus comes from: public repositories at pinned
commits, each read by a format reader. The reserved collections of the
independent check (multi-swe-bench/experiments, gruckion/mini-swe-agent,
gsmoon97/swe-agent-eval) and copies of their runs are not used.

`cap` bounds how many runs of a source are kept (see convert.py's
selection), so the compressed corpus stays within its size budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from formats import acr, claude_code, mini_swe, mint, nebius, openhands_sdk, swe_agent, swe_agent1, tau, trae
from formats.common import Repo

AGPL_NC = "AGPL-3.0 for non-commercial use (repository-wide dual licence; commercial use by agreement)"
MIT = "MIT"
APACHE = "Apache-2.0"
NONE_STATED = "none stated (no licence file in the repository)"
CC_BY = "CC-BY-4.0 (the dataset's; the repository holding the copy states none)"


@dataclass
class Source:
    name: str
    repo: str  # owner/name
    commit: str
    licence: str
    cap: int
    read: Callable[[Repo, str], object]
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _swe_agent(repo: Repo, name: str):
    for i in (1, 2, 3):
        d = f"results/swe-agent-results/cost_2_{i}"
        resolved = set(repo.json(f"{d}/final_report.json").get("resolved") or [])
        yield from swe_agent.read(repo, name, "SWE-agent 0.x", "gpt-4-0125-preview", d, resolved, f"run{i}/")


def _coder(repo: Repo, name: str):
    import json
    import re

    raw = repo.show("results.json").decode()
    report = json.loads(re.sub(r",\s*([\]}])", r"\1", raw))
    yield from swe_agent.read(repo, name, "CodeR (multi-agent SWE-agent)", "gpt-4-1106-preview", "trajs", set(report.get("resolved") or []))


def _acr(repo: Repo, name: str):
    for r in ("acr-run-1", "acr-run-2"):
        yield from acr.read(repo, name, "gpt-4-0125-preview", f"results/{r}", f"{r}/")


MINI_RUNS = ["deepseek_chat_dev", "deepseek_chat_dev_rerun", "deepseek_chat_test_1-100", "deepseek_lite_dev_noparallel"]


def _mini(repo: Repo, name: str):
    for r in MINI_RUNS:
        yield from mini_swe.read(repo, name, "deepseek-chat", f"output/{r}", f"deepseek__deepseek-chat.{r}.json", f"{r}/")


MINT_MODELS = [
    "gpt-4-0613",
    "gpt-3.5-turbo-0613",
    "claude-2",
    "Meta-Llama-3-70B-Instruct",
    "Mixtral-8x7B-Instruct-v0.1",
    "deepseek-coder-33b-instruct",
    "Llama-2-70b-chat-hf",
]


def _mint(repo: Repo, name: str):
    for m in MINT_MODELS:
        for ds in ("humaneval", "mbpp"):
            yield from mint.read(repo, name, m, f"data/outputs/{m}/F=None/max5_p2+tool+cd/code_generation/{ds}/results.jsonl", ds)


def _tau1(repo: Repo, name: str):
    yield from tau.read_tau1(repo, name, "gpt-4o", "historical_trajectories/gpt-4o-airline.json")


def _tau2_grok(repo: Repo, name: str):
    seen: set = set()
    for p in repo.ls("data/simulations"):
        if p.endswith(".json"):
            try:
                yield from tau.read_tau2(repo, name, p, seen=seen)
            except Exception:  # noqa: BLE001 (a file over the snapshot's size limit)
                continue


def _tau2_gpt41(repo: Repo, name: str):
    seen: set = set()
    for p in repo.ls("src/experiments/model_training/results"):
        if p.endswith(".json"):
            yield from tau.read_tau2(repo, name, p, seen=seen)


def _nebius(repo: Repo, name: str):
    yield from nebius.read(repo, name, "SWE-agent 0.x (Nebius)", "swe_trajectories/trajectories")


OPENHANDS_RUN = (
    "benchmarks/openagentsafety/outputs/mgulavani__openagentsafety_full_updated-train/"
    "litellm_proxy/neulab/gpt-4o-2024-08-06_maxiter_100_N_initial"
)


def _openhands(repo: Repo, name: str):
    yield from openhands_sdk.read(repo, name, OPENHANDS_RUN)


def _trae(repo: Repo, name: str):
    yield from trae.read(repo, name, "ISO-Bench/state/runs")


SWE_AGENT1_RUNS = [
    ("20250511_sweagent_lm_32b", "SWE-agent-LM-32B"),
    ("20250522_sweagent_claude-4-sonnet-20250514", "claude-sonnet-4-20250514"),
]


def _swe_agent1(repo: Repo, name: str):
    for run_dir, model in SWE_AGENT1_RUNS:
        yield from swe_agent1.read(repo, name, run_dir, model)


def _claude(repo: Repo, name: str):
    # Files read one by one, kept verbatim beside where a fetched
    # repository would be (formats/claude_code.py says why).
    from pathlib import Path

    yield from claude_code.read(Path(repo.git_dir).parent / "files", name)


SOURCES = [
    Source("swe-agent", "nus-apr/auto-code-rover", "3536ac292e3062ffb3f6e98457958e2b803228d6", AGPL_NC, 260, _swe_agent,
           "SWE-agent 0.x runs of SWE-bench Lite, three repeats (results/swe-agent-results/cost_2_*)"),
    Source("coder", "NL2Code/CodeR", "d63468344bc215bbabb8f0c1ba4af24897a946df", NONE_STATED, 140, _coder,
           "CodeR on SWE-bench Lite (trajs/)"),
    Source("acr", "nus-apr/auto-code-rover", "3536ac292e3062ffb3f6e98457958e2b803228d6", AGPL_NC, 160, _acr,
           "AutoCodeRover v0 on SWE-bench Lite, runs 1 and 2: the context-retrieval conversation"),
    Source("mini-swe-agent", "SWE-agent/mini-swe-agent", "e5e0fbca1c60561bde25fa473b78717aa4b3f9ec", MIT, 170, _mini,
           "mini-swe-agent 2.2 (tool calls) with deepseek-chat on SWE-bench Lite/dev, contributed in pull request 816 (refs/pull/816/head)"),
    Source("mint", "xingyaoww/mint-bench", "3f7f12c10bf763be1e6dbdeb42feb57624121f61", APACHE, 210, _mint,
           "MINT code generation (HumanEval, MBPP), 5 turns at most, seven models"),
    Source("tau-bench", "sierra-research/tau-bench", "59a200c6d575d595120f1cb70fea53cef0632f6b", MIT, 200, _tau1,
           "τ-bench airline, gpt-4o tool-calling agent (historical_trajectories/gpt-4o-airline.json)"),
    Source("tau2-grok", "blakeelias/tau2-bench", "cf95bf5acba69b67e31b79fc7a7255307cb446bc", MIT, 240, _tau2_grok,
           "τ²-bench simulations with Grok models (branch addendum; some runs use the author's variants of the airline policy)"),
    Source("tau2-gpt41", "sierra-research/tau2-bench", "29510b1d0d47dbe502ada30079c642bd0d172ed9", MIT, 200, _tau2_gpt41,
           "τ²-bench results of gpt-4.1 and a fine-tuned gpt-4.1 (branch feature/gym)"),
    Source("nebius", "wzh4464/ContextGraph", "1319787c5abf54f591ca3fbf408e4b0ac601b51b", CC_BY, 900, _nebius,
           "Nebius's SWE-agent runs with its fine-tuned Llama models (swe-agent-llama-8b, -70b, -405b) on SWE-bench-extra tasks (dataset "
           "nebius/SWE-agent-trajectories), one run per task, as a public copy keeps them (swe_trajectories/trajectories/)"),
    Source("openhands-sdk", "OpenHands/benchmarks", "424d20d30f2d2ebdc8482f096b24546ce8a8c281", MIT, 50, _openhands,
           "OpenHands agent SDK (gpt-4o) on OpenAgentSafety, contributed in pull request 90 (refs/pull/90/head): the JSON "
           "event logs of one run; a safety benchmark, so no run is scored resolved"),
    Source("trae", "ISO-Bench/ISO-Bench", "9cc08ddd1011a34c49b43c22671ae639f16a21d3", APACHE, 80, _trae,
           "Trae Agent (gpt-4o, gpt-5, claude-sonnet-4-5) on ISO-Bench's vLLM and SGLang performance tasks "
           "(ISO-Bench/state/runs/*/trae/); no per-run score, so no run is scored resolved"),
    Source("swe-agent1", "lgetter/swe-agent-trajectory-analysis", "9ecabb67ca553a1c86a7e504c4556772b9443e99", NONE_STATED,
           200, _swe_agent1,
           "SWE-agent 1.x on SWE-bench Verified (SWE-agent-LM-32B writing its calls as text; claude-sonnet-4 with tool "
           "calls), a course repository's copies of two SWE-bench experiments submissions; only the .traj files under "
           "4 MiB are in the snapshot"),
    Source("claude-code", "benchflow-ai/skillsbench-trajectories", "", "", 60, _claude,
           "Claude Code runs of SkillsBench tasks (agent/claude-code.txt stream with result.json)"),
]
