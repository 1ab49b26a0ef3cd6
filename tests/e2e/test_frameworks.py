"""Real agent frameworks driven into loops, end to end: the OpenAI Agents
SDK, a LangGraph ReAct agent and the Anthropic SDK's tool runner, each run
unmodified against a scripted model server (tests/e2e/scripted_model.py)
behind Envoy with the shipped examples/recommended/envoy.yaml.

Every loop must be stopped within 2 turns of the request a careful human
would call it a loop (`Scenario.label`, the request carrying the third
occurrence of the repeated step), and no earlier than one turn before it:
by a 429 the framework surfaces, or by a note loopguard appends that the
model reads and obeys. Healthy runs finish untouched: no 429, no loopguard
header, and every body reaches the model server byte for byte as the SDK
sent it. docs/detection.md (Agent frameworks) records what each framework's user sees.
"""

from __future__ import annotations

import json
import logging
import re

import anthropic
import openai
import pytest
from langchain_openai.chat_models.base import OpenAIRateLimitError

import framework_scripts as scripts
from agent_runs import FRAMEWORKS, RECOMMENDED, Run, drive, recommended_envoy
from harness import Envoy, load_yaml, plugin_config_of
from scripted_model import ScriptedModel, Say

FRAMEWORK_NAMES = list(FRAMEWORKS)


def shipped_policy() -> dict:
    """The loopguard policy of examples/recommended/envoy.yaml, as shipped."""
    hcm = load_yaml(RECOMMENDED)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    wasm = next(f for f in hcm["http_filters"] if f["name"] == "loopguard")
    return plugin_config_of(wasm)["policies"][0]


POLICY = shipped_policy()
LADDER = POLICY["spec"]["tool_loops"]["ladder"]
WINDOW = POLICY["spec"]["loop_detection"]["window_seconds"]
THRESHOLD = POLICY["spec"]["loop_detection"]["threshold_identical_requests"]

# The 429 bodies' messages, by code.
MESSAGES = {
    # A conversation resent as it is counts in the window; a growing one
    # whose turns repeat is judged by its own turns, whatever their pace.
    "recursive_loop_detected": re.compile(
        rf"Blocked: (near-)?identical request sent {THRESHOLD} times in {WINDOW} seconds\. This usually indicates an agent retry loop\."
        rf"|Blocked: the last {THRESHOLD} turns of this conversation are near-identical\. This usually indicates an agent stuck in a loop: "
        r"change course before sending it again\."),
    "tool_loop_detected": re.compile(
        r"Blocked: (the agent called the tool `\w+` \d+ times .*|the agent repeated the same sequence of tool calls .*"
        r"|the model gave essentially the same answer \d+ times in a row\. This usually indicates a loop; change the conversation instead of retrying\.)"),
}


@pytest.fixture(autouse=True)
def quiet_frameworks(caplog):
    # The frameworks log every failing tool with its traceback.
    caplog.set_level(logging.CRITICAL)


@pytest.fixture
def served(start_envoy):
    """served(script, fail=()) -> (scripted model, Envoy with the shipped
    recommended setup in front of it)."""
    models: list[ScriptedModel] = []

    def serve(script, fail=()):
        model = ScriptedModel(script, fail=set(fail))
        models.append(model)
        return model, start_envoy(recommended_envoy(model.port))

    yield serve
    for m in models:
        m.stop()


def play(served, fw: str, sc: scripts.Scenario, key: str, **kw) -> tuple[Run, ScriptedModel, Envoy]:
    model, envoy = served(sc.script, fail=kw.pop("fail", ()))
    return drive(fw, envoy.url, key, sc, **kw), model, envoy


# --- what the framework's user sees --------------------------------------------------


def first_touch(run: Run) -> tuple[int, str] | None:
    """The first request loopguard acted on (1-based, in the order the SDK
    sent them) and how: "429", or the ladder step its note took."""
    for n, (status, headers) in enumerate(zip(run.statuses, run.response_headers), 1):
        if status == 429:
            return n, "429"
        if "x-loopguard-tool-loop" in headers:
            level = int(headers["x-loopguard-tool-loop"].rsplit("level=", 1)[1])
            return n, LADDER[level - 1]
    return None


def assert_rejected(fw: str, run: Run, model: ScriptedModel, envoy: Envoy) -> tuple[str, str]:
    """The run ended with the framework raising its SDK's rate-limit error
    for loopguard's 429, which the SDK did not retry. Returns the code and
    the message."""
    err = run.error
    assert err is not None, f"no error: the run ended with {run.output!r}"
    if fw == "anthropic-tool-runner":
        assert type(err) is anthropic.RateLimitError, repr(err)
        body = err.body
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
        code, message = body["loopguard"]["code"], body["error"]["message"]
        assert body["loopguard"]["policy"] == POLICY["id"]
    else:
        if fw == "langgraph":
            # langchain-openai re-raises the SDK's error as its own subclass
            # of it (and of langchain-core's ModelRateLimitError).
            assert type(err) is OpenAIRateLimitError, repr(err)
            assert type(err.__cause__) is openai.RateLimitError
        else:
            # The Agents SDK lets the SDK's error through as it is.
            assert type(err) is openai.RateLimitError, repr(err)
        assert isinstance(err, openai.RateLimitError)
        code, message = err.code, err.body["message"]
        assert err.body["policy"] == POLICY["id"]
        assert err.body["type"] == "loop_detected", err.body
    assert err.status_code == 429
    assert str(err).startswith("Error code: 429 - ")
    assert err.response.headers["x-should-retry"] == "false"
    assert code in MESSAGES, code
    assert MESSAGES[code].fullmatch(message), message
    # Not retried: one 429, the last request the SDK sent, and every other
    # request reached the model server.
    assert run.statuses.count(429) == 1 and run.statuses[-1] == 429, run.statuses
    assert len(run.sent) == model.count + 1
    assert envoy.counter("loopguard.requests_total") == len(run.sent)
    return code, message


def assert_stopped(fw: str, sc: scripts.Scenario, run: Run, model: ScriptedModel, envoy: Envoy, *, by: set[str] | None = None) -> tuple[int, str]:
    """The loop was stopped: the run ended with loopguard's 429, or on a
    request carrying loopguard's note, which the model read and answered in
    text (the framework then ends the run). First touched no earlier than
    one request before the label, stopped no later than two after it.
    Returns the request that stopped it and how."""
    first = first_touch(run)
    ended = run.output if run.error is None else repr(run.error)
    assert first is not None, f"{sc.name} was never touched: {len(run.sent)} requests, ended with {ended}"
    assert first[0] >= sc.label - 1, f"{sc.name}: touched at request {first[0]} ({first[1]}), a loop only from request {sc.label}"
    turn = len(run.sent)
    if run.statuses[-1] == 429:
        how = "429"
        assert_rejected(fw, run, model, envoy)
    else:
        header = run.response_headers[-1].get("x-loopguard-tool-loop")
        assert header, f"{sc.name} ran on and ended untouched at request {turn} with {ended}"
        how = LADDER[int(header.rsplit("level=", 1)[1]) - 1]
        # The model read the note and answered in text: the framework's
        # user gets that answer.
        conv, reply = model.conversations[turn - 1], model.replies[turn - 1]
        assert conv.loopguard_note, f"request {turn} reached the model without loopguard's note"
        assert conv.tool_choice_none == (how == "directive")
        assert isinstance(reply, Say) and run.error is None and run.output == reply.text, ended
        assert model.count == envoy.counter("loopguard.requests_total") == turn
    assert turn <= sc.label + 2, f"{sc.name}: stopped at request {turn} ({how}), a loop from request {sc.label}"
    assert run.statuses[: turn - 1] == [200] * (turn - 1)
    if by is not None:
        assert how in by, f"{sc.name}: stopped by {how}, expected {by}"
    return turn, how


def assert_obeyed_or_rejected(fw: str, sc: scripts.Scenario, run: Run, model: ScriptedModel, envoy: Envoy) -> None:
    """An obedient model's loop: stopped by a 429, or by a note the model
    answered with its scripted stop."""
    _, how = assert_stopped(fw, sc, run, model, envoy)
    if how != "429":
        assert run.output == scripts.STOP


def assert_untouched(run: Run, model: ScriptedModel, envoy: Envoy, *, requests: int, output: str, statuses: list[int] | None = None) -> None:
    ended = run.output if run.error is None else repr(run.error)
    assert run.error is None and run.output == output, ended
    assert run.statuses == (statuses or [200] * requests), run.statuses
    assert model.count == len(run.sent) == requests
    # loopguard judged every request, and let each through as it came.
    assert envoy.counter("loopguard.requests_total") == requests
    assert envoy.counter("loopguard.rejected_total") == 0
    assert not [h for h in run.response_headers if any(k.startswith("x-loopguard") for k in h)]
    assert not [r for r in model.requests if any(k.startswith("x-loopguard") for k in r["headers"])]
    assert [r["body"] for r in model.requests] == [s.body for s in run.sent], "a body was changed on its way"
    assert not any(c.loopguard_note for c in model.conversations)


# --- loops ------------------------------------------------------------------------------


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_failing_tool_with_fresh_ids_is_rejected(fw, served):
    """A stubborn model calling a tool that fails with a fresh timestamp,
    request id and latency: near mode rejects the request whose history
    shows 3 turns with masked tails alike, and the framework raises its
    SDK's RateLimitError."""
    sc = scripts.failing_tool()
    run, model, envoy = play(served, fw, sc, f"sk-failing-{fw}")
    assert_stopped(fw, sc, run, model, envoy, by={"429"})
    code, message = assert_rejected(fw, run, model, envoy)
    assert code == "recursive_loop_detected"
    # A framework that sends the conversation is judged by its turns; one
    # that sends only the newest messages (the Anthropic tool runner over a
    # server-side thread) by its record in the window.
    turns = f"Blocked: the last {THRESHOLD} turns of this conversation are near-identical"
    window = f"Blocked: near-identical request sent {THRESHOLD} times"
    assert message.startswith(window if fw == "anthropic-tool-runner" else turns), message
    bodies = [r["body"] for r in model.requests]
    assert len(set(bodies)) == len(bodies), "every request differed"


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_model_rephrasing_the_same_answer_is_rejected(fw, served):
    """An application keeps telling the model its regex fails; the model
    gives the same wrong regex in other words every time and ignores
    loopguard's notes. Only a 429 can stop it."""
    sc = scripts.rephrasing_model()
    run, model, envoy = play(served, fw, sc, f"sk-rephrase-{fw}")
    assert_stopped(fw, sc, run, model, envoy, by={"429"})
    texts = [r.text for r in model.replies]
    assert len(set(texts)) == len(texts), "an answer repeated word for word"


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_alternating_tools_with_unchanged_results_are_stopped(fw, served):
    sc = scripts.alternating_tools()
    run, model, envoy = play(served, fw, sc, f"sk-alternate-{fw}")
    assert_obeyed_or_rejected(fw, sc, run, model, envoy)


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_page_that_never_advances_is_stopped(fw, served):
    sc = scripts.stuck_page()
    run, model, envoy = play(served, fw, sc, f"sk-pages-{fw}")
    assert_obeyed_or_rejected(fw, sc, run, model, envoy)


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_sub_agent_handing_the_task_back_is_stopped(fw, served):
    """The Agents SDK's own handoffs (assistant -> researcher -> assistant
    ...); elsewhere an ask_researcher tool whose sub-agent returns the same
    question."""
    if fw == "openai-agents":
        sc = scripts.handoffs_back_and_forth()
        run, model, envoy = play(served, fw, sc, "sk-handoffs", handoffs=True)
        handoffs = [c.name for c in model.conversations[-1].calls]
        assert handoffs[:4] == ["transfer_to_researcher", "transfer_to_assistant"] * 2, handoffs
    else:
        sc = scripts.task_handed_back()
        run, model, envoy = play(served, fw, sc, f"sk-handback-{fw}")
    assert_obeyed_or_rejected(fw, sc, run, model, envoy)


def test_anthropic_tool_runner_is_nudged_when_it_sends_the_whole_history(served):
    """Over its default message thread the tool runner sends only each
    turn's new messages, so only near mode's count can stop its loops (the
    tests above: a 429). With thread=False it sends the whole history and
    tool_loops reads it: the model gets the nudge, as a text block after
    the tool results in the last user turn, and obeys it."""
    sc = scripts.stuck_page()
    run, model, envoy = play(served, "anthropic-tool-runner", sc, "sk-pages-unthreaded", threads=False)
    assert not any(b"\"thread\"" in s.body for s in run.sent)
    assert_stopped("anthropic-tool-runner", sc, run, model, envoy, by={"nudge"})
    last = json.loads(model.requests[-1]["body"])["messages"][-1]
    assert last["role"] == "user"
    assert [b["type"] for b in last["content"]] == ["tool_result", "text"]
    assert last["content"][1]["text"].startswith("Note from the API gateway: you have called the tool `list_tickets` 3 times")


# --- healthy runs -------------------------------------------------------------------------


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_long_productive_run_is_untouched(fw, served):
    sc = scripts.long_productive_run()
    run, model, envoy = play(served, fw, sc, f"sk-long-{fw}")
    assert len(scripts.STEPS) + 1 >= 20
    assert_untouched(run, model, envoy, requests=len(scripts.STEPS) + 1, output=scripts.LONG_RUN_ANSWER)
    calls = [(c.name, json.dumps(c.args, sort_keys=True)) for c in model.conversations[-1].calls]
    assert len(set(calls)) == len(calls) == len(scripts.STEPS), "every call was another"


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_parallel_tool_calls_are_untouched(fw, served):
    sc = scripts.parallel_calls()
    run, model, envoy = play(served, fw, sc, f"sk-parallel-{fw}")
    assert_untouched(run, model, envoy, requests=4, output=scripts.PARALLEL_ANSWER)
    # Each request after the first answered every call of the turn before.
    assert [len(c.calls) for c in model.conversations] == [0, 4, 7, 10]
    assert all(c.result_of(call) for c in model.conversations for call in c.calls)


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_same_task_for_ten_users_is_untouched(fw, served):
    sc = scripts.order_lookup()
    model, envoy = served(sc.script)
    for user in range(10):
        run = drive(fw, envoy.url, f"sk-user-{user}-{fw}", scripts.order_lookup())
        assert run.error is None, f"user {user}: {run.error!r}"
        assert run.output == scripts.ORDER_ANSWER
        assert run.statuses == [200, 200, 200]
        assert not [h for h in run.response_headers if any(k.startswith("x-loopguard") for k in h)]
    assert model.count == envoy.counter("loopguard.requests_total") == 30
    assert envoy.counter("loopguard.rejected_total") == 0
    assert not [r for r in model.requests if any(k.startswith("x-loopguard") for k in r["headers"])]
    assert not any(c.loopguard_note for c in model.conversations)
    # The ten users ran the same conversation, turn for turn (call ids aside).
    runs: dict[str, list] = {}
    for c in model.conversations:
        runs.setdefault(c.api_key, []).append([(i.kind, i.text, i.name, json.dumps(i.args, sort_keys=True)) for i in c.items])
    assert len(runs) == 10 and len({json.dumps(turns) for turns in runs.values()}) == 1


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_coding_agent_whose_progress_shows_only_in_numbers_is_untouched(fw, served):
    """edit, run the tests: 5 failed, 20 passed; edit, 4 failed, 21 passed;
    ... until all 25 pass. The test runs look alike but for their numbers."""
    sc = scripts.coding_agent()
    run, model, envoy = play(served, fw, sc, f"sk-coding-{fw}")
    assert_untouched(run, model, envoy, requests=12, output=scripts.CODING_ANSWER)
    last = model.conversations[-1]
    results = [last.result_of(call) for call in last.calls_of("run_tests")]
    assert [re.search(r"(\d+) failed", r).group(1) if "failed" in r else "0" for r in results] == ["5", "4", "3", "2", "1", "0"]


@pytest.mark.parametrize("fw", FRAMEWORK_NAMES)
def test_sdk_retries_after_provider_errors_are_untouched(fw, served):
    """The provider answers 500 to the first two attempts of the second turn;
    the SDK retries the same request (default retries) and the run goes on.
    Retries of a failed request are not a loop of the agent's."""
    sc = scripts.transient_provider_errors()
    run, model, envoy = play(served, fw, sc, f"sk-blips-{fw}", fail={2, 3})
    assert_untouched(run, model, envoy, requests=5, statuses=[200, 500, 500, 200, 200], output=scripts.ORDER_ANSWER)
    # The retries were the same request, byte for byte.
    assert model.requests[1]["body"] == model.requests[2]["body"] == model.requests[3]["body"]
