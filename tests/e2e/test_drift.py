"""Loops that drift, caught in real Envoy through the real SDKs: one loop of
each kind of the labelled corpus (tests/corpus) replayed turn by turn with
the openai and anthropic clients in front of the recommended setup (near
mode with masking, and tool loops with results, cycles and answers), on the
local table and through Redis; a LangGraph agent whose failing tool answers
with fresh timestamps and request ids; and the answers SDKs raise."""

from __future__ import annotations

import sys
import warnings

import anthropic
import openai
import pytest

from harness import ROOT, Upstream, bootstrap, plugin
from recommended import recommended_config
from shared_store import STORE, with_store_cluster

sys.path.insert(0, str(ROOT / "eval"))
import eval as corpus  # noqa: E402

# The corpus names models the SDKs warn about (deprecated ones included).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LOOP_KINDS = ["identical_retry", "volatile_tool_error", "rephrased_text", "stuck_search", "alternating_tools", "resumed_loop"]


def scenario(kind: str) -> dict:
    """The first loop of `kind` in the corpus."""
    return next(s for s in corpus.load_scenarios(per_kind=1) if s["label"] == "loop" and s["kind"] == kind)


class Clients:
    """The SDK clients of one scenario, by API key (no retries: a loop's
    429 says not to, and the test counts every request)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.by_key: dict[tuple[str, str], object] = {}

    def send(self, fmt: str, req: dict):
        """Send one corpus request through its SDK: ("ok", headers) or
        ("rejected", the SDK's error)."""
        h = req["headers"]
        key = h.get("x-api-key") or h["authorization"].removeprefix("Bearer ")
        body = {k: v for k, v in req["body"].items() if k != "stream"}
        extra = {"x-session-id": h["x-session-id"]}
        sdk = "anthropic" if fmt == "anthropic_messages" else "openai"
        client = self.by_key.get((sdk, key))
        if client is None:
            if sdk == "anthropic":
                client = anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0)
            else:
                client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)
            self.by_key[(sdk, key)] = client
        try:
            if fmt == "openai_chat":
                raw = client.chat.completions.with_raw_response.create(**body, extra_headers=extra)
            elif fmt == "openai_responses":
                raw = client.responses.with_raw_response.create(**body, extra_headers=extra)
            else:
                raw = client.messages.with_raw_response.create(**body, extra_headers=extra)
        except (openai.RateLimitError, anthropic.RateLimitError) as err:
            return "rejected", err
        return "ok", raw.headers


def replay(url: str, sc: dict) -> list[tuple[str, object]]:
    clients = Clients(url)
    return [clients.send(sc["format"], req) for req in sc["requests"]]


def first_touch(outcomes) -> tuple[int, str, object] | None:
    """The first turn a client saw loopguard act on, how, and the evidence."""
    for i, (what, detail) in enumerate(outcomes, 1):
        if what == "rejected":
            return i, "rejected", detail
        if detail.get("x-loopguard-tool-loop"):
            return i, "tool-loop", detail["x-loopguard-tool-loop"]
    return None


@pytest.mark.parametrize("store", ["local", "redis"])
@pytest.mark.parametrize("kind", LOOP_KINDS)
def test_each_loop_kind_is_caught_through_the_sdks(kind, store, start_envoy, request):
    sc = scenario(kind)
    up = Upstream()
    try:
        if store == "redis":
            redis, webdis = request.getfixturevalue("shared")
            cfg = with_store_cluster(bootstrap(recommended_config(STORE), up.port, hold=True, buffer_limit=8 << 20), webdis.port)
        else:
            cfg = bootstrap(recommended_config(None), up.port, hold=True, buffer_limit=8 << 20)
        e = start_envoy(cfg)
        outcomes = replay(e.url, sc)
    finally:
        up.stop()
    touch = first_touch(outcomes)
    assert touch is not None, f"{sc['id']} ({sc['format']}) was never caught"
    turn, how, detail = touch
    label = sc["loop_turn"]
    assert label - 1 <= turn <= label + 2, f"{sc['id']}: caught at turn {turn}, labelled {label}"
    if how == "rejected":
        # The SDK raised its own rate-limit error with loopguard's code.
        assert detail.status_code == 429
        body = detail.response.json()
        # OpenAI's shape carries the code in the error, Anthropic's in
        # loopguard's details beside it.
        code = body["error"].get("code") or body.get("loopguard", {}).get("code")
        assert code in ("recursive_loop_detected", "tool_loop_detected"), body
    else:
        tier = detail.split(";")[0]
        assert tier in ("identical", "pattern", "cycle", "answer", "turn"), detail
    # Every request before the touch reached the upstream untouched.
    assert all(what == "ok" for what, _ in outcomes[: turn - 1])
    if store == "redis":
        keys = redis.keys("lg:*")
        assert keys, "counts went to Redis"
        assert e.counter("loopguard.store_fallback_total") == 0


def test_near_history_lives_in_redis_with_expiry(shared, start_envoy):
    """A near-mode loop's record is a sorted set of signatures (112 hex
    digits each) under the caller's key, expiring with the window."""
    redis, webdis = shared
    sc = scenario("volatile_tool_error")
    up = Upstream()
    try:
        cfg = with_store_cluster(bootstrap(recommended_config(STORE), up.port, hold=True, buffer_limit=8 << 20), webdis.port)
        e = start_envoy(cfg)
        replay(e.url, sc)
    finally:
        up.stop()
    near = [k for k in redis.keys("lg:*") if k.endswith(":n")]
    assert near, redis.keys("lg:*")
    members = redis.admin("ZRANGE", near[0], "0", "-1").split()
    assert members and all(len(m.split(":")[-1]) == 112 for m in members), members
    ttl = int(redis.admin("PTTL", near[0]))
    assert 0 < ttl <= corpus.WINDOW * 1000
    # What a hit costs Redis: the memory the history's members add (a
    # sorted set of a time stamp, a nonce and 112 hex digits each), read
    # off a copy with some of them taken out.
    used = int(redis.admin("MEMORY", "USAGE", near[0], "SAMPLES", "0"))
    assert int(redis.admin("COPY", near[0], "lg-test-copy")) == 1
    removed = len(members) // 2 + 1
    redis.admin("ZPOPMIN", "lg-test-copy", str(removed))
    fewer = int(redis.admin("MEMORY", "USAGE", "lg-test-copy", "SAMPLES", "0"))
    redis.admin("DEL", "lg-test-copy")
    per_hit = (used - fewer) / removed
    encoding = redis.admin("OBJECT", "ENCODING", near[0]).strip()
    print(f"near history in Redis: {used} bytes for {len(members)} hits, {per_hit:.0f} bytes a hit, "
          f"members of {len(members[0])} bytes, encoded as {encoding}")
    # Members are longer than Redis's zset-max-listpack-value (64), so the
    # set is a skip list: the member, a node and a dictionary entry a hit.
    assert encoding == "skiplist", encoding
    assert 112 < per_hit < 400, per_hit


def test_langgraph_agent_with_a_drifting_tool_error_is_stopped(start_envoy):
    """A ReAct agent whose tool fails with a fresh timestamp, request id and
    latency every call: the tail never repeats byte for byte, yet the loop
    ends with loopguard's error, not the recursion limit."""
    import itertools

    from langchain_core.tools import ToolException, tool
    from langchain_openai import ChatOpenAI
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    from harness import stuck_model

    counter = itertools.count(1)

    @tool
    def get_build_status(branch: str) -> str:
        """The CI status of a branch."""
        n = next(counter)
        raise ToolException(f"Error 503 at 2026-11-23T13:{n:02d}:{(7 * n) % 60:02d}.{(137 * n) % 1000:03d}Z (request id req_{n:04d}xK29dLm0{n % 10}) after {1800 + 37 * n} ms")

    get_build_status.handle_tool_error = True
    up = Upstream(responder=stuck_model)
    try:
        cfg = plugin([{"id": "agents", "spec": {"selector": {}, "loop_detection": {
            "enabled": True, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "near"}}}])
        e = start_envoy(bootstrap(cfg, up.port))
        llm = ChatOpenAI(model="gpt-4o-mini", base_url=f"{e.url}/v1", api_key="sk-langgraph-drift", max_retries=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            agent = create_react_agent(llm, [get_build_status])
        try:
            agent.invoke({"messages": [("user", "Is the build green?")]}, {"recursion_limit": 40})
            raise AssertionError("the agent finished although its model is stuck")
        except GraphRecursionError as ex:
            raise AssertionError("ran into the recursion limit instead of the loop error") from ex
        except openai.RateLimitError as ex:
            assert ex.code == "recursive_loop_detected"
        bodies = [r["body"] for r in up.requests]
        assert len(set(bodies)) == len(bodies), "every request differed"
        # The tail [result, call, result] first repeats (masked) at the
        # third request; the third repeat is rejected: 4 reached upstream.
        assert up.count == 4
    finally:
        up.stop()


# --- rephrasing, near mode alone at its defaults ---------------------------

APOLOGIES = [
    "I apologize for the confusion. Let me try again to fix the failing unit test in parser.rs: the tokenizer must skip the trailing comma before it reads the closing bracket, so the loop now peeks at the next byte first.",
    "Sorry about that confusion. Let me try again: to fix the failing unit test in parser.rs, the tokenizer has to skip the trailing comma before reading the closing bracket, so I changed the loop to peek at the next byte first.",
    "My apologies, let me try once more. The failing unit test in parser.rs needs the tokenizer to skip a trailing comma before the closing bracket; the loop peeks at the next byte first now.",
    "Apologies again. Let me try again to fix the failing test in parser.rs: skip the trailing comma before reading the closing bracket, by peeking at the next byte first in the tokenizer loop.",
    "I'm sorry for the trouble. Trying again: in parser.rs the tokenizer must skip the trailing comma before the closing bracket, so the loop peeks at the next byte first. This should fix the failing unit test.",
    "Sorry, let me try again. The failing unit test in parser.rs is fixed by making the tokenizer skip the trailing comma before it reads the closing bracket: the loop now peeks at the next byte first.",
]
PUSHBACK = ["Still failing.", "Same test fails.", "No, it still fails.", "Test still red.", "Nope.", "Still broken."]


def test_near_alone_stops_a_model_apologising_in_other_words(upstream, start_envoy):
    """The model proposes the same fix in other words each turn: near mode
    alone, at its defaults, rejects the third such request (the tails share
    far more than 35% of their words), where the SimHash it replaced let all
    six through."""
    cfg = plugin([{"id": "p", "spec": {"selector": {}, "loop_detection": {
        "enabled": True, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "near"}}}])
    e = start_envoy(bootstrap(cfg, upstream.port, hold=True))
    client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="sk-apology", max_retries=0)
    messages = [{"role": "user", "content": "The unit test test_parse_trailing_comma in parser.rs fails. Fix it."}]
    statuses = []
    for answer, pushback in zip(APOLOGIES, PUSHBACK):
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": pushback}]
        try:
            client.chat.completions.create(model="gpt-4o", messages=messages)
            statuses.append(200)
        except openai.RateLimitError as err:
            assert err.code == "recursive_loop_detected"
            statuses.append(429)
    # The third request carries the third rephrasing.
    assert statuses == [200, 200, 429, 429, 429, 429], statuses


def test_the_simhash_distance_is_refused_with_its_replacement_named(upstream, start_envoy):
    cfg = plugin([{"id": "agents", "spec": {"selector": {}, "loop_detection": {
        "enabled": True, "window_seconds": 60, "threshold_identical_requests": 3, "similarity": "near", "near_distance": 4}}}])
    log = start_envoy.make(bootstrap(cfg, upstream.port)).expect_startup_failure()
    assert 'policy "agents": loop_detection.near_distance was replaced by "near_similarity"' in log, log
