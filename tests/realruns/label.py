"""Labels of a recorded run, decided from the recording alone, before
loopguard ever sees it (the rules below were written down first and are
not tuned on what loopguard does).

**Outcome.** `resolved`: the benchmark's own harness scored the run a
success (SWE-bench resolved list, τ reward 1, MINT success, skill tests
passed). `end`: `own` when the agent ended the run itself (it submitted,
the conversation ended), `limit` when the harness stopped it at a step,
round, cost or time limit, `error` otherwise. **Successful** = resolved and
ended on its own: the runs no gateway may stop.

**Steps.** Step k is the model's reply to call k and what came back (in a
multi-agent run, what came back in that sub-agent's conversation):
its *action* and its *observation*.
- native tool calls (OpenAI `tool_calls`, Anthropic `tool_use`): the
  action is the list of (tool name, arguments as canonical JSON); the
  observation the tool results that answer it, joined;
- actions written as text: the command the reply carries (SWE-agent and
  CodeR: the last fenced block; MINT: the `<execute>` or `<solution>`
  body; AutoCodeRover: its search-API calls; SWE-agent 1.x writing its
  calls as text: the `<function=NAME>` blocks, name and parameters); the
  observation the user messages that follow, up to the next reply;
- a reply the harness left out of the history (an unusable answer it
  asked for again; see formats/common.py) is the action `dropped`; its
  observation what the harness sent instead, up to the next call;
- a reply with no action is the action `say: <its text>`; its observation
  the messages that follow.
Texts are compared with runs of whitespace collapsed; MINT's "You have N
steps left ..." countdown is dropped from observations (it changes every
turn by construction).

**Clearly stuck** (the issue's rule): at some step s
- (A) the same action with the same observation at steps s-2, s-1 and s, or
- (B) at most 2 distinct actions among steps s-9..s,
and the run never recovered: it is not resolved, and every step after s
repeats an action of the pattern (A: the repeated action; B: the at most
two), but for one last step (a final submit or exit). The *first request
that carries the pattern* is call s+1, the first call whose conversation
holds step s's observation; a run whose pattern appears only at its last
step has no such request and is not labelled stuck.
"""

from __future__ import annotations

import json
import re

from formats.common import thread_end

WS = re.compile(r"\s+")
FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.S)
MINT_ACTION = re.compile(r"<(execute|solution)>(.*?)</\1>", re.S)
MINT_COUNTDOWN = re.compile(r"You have \d+ steps? left.*$", re.S)
ACR_CALL = re.compile(r"\b(search_\w+\s*\([^()]*\))")
FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.S)
PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)


def norm(text: str) -> str:
    return WS.sub(" ", text or "").strip()


def text_of(content) -> str:
    """A message content's text: a string, or its text parts (tool results'
    contents included) joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, str):
                out.append(b)
            elif isinstance(b, dict):
                if b.get("type") == "text":
                    out.append(b.get("text") or "")
                elif b.get("type") == "tool_result":
                    out.append(text_of(b.get("content")))
                elif b.get("type") == "tool_use":
                    out.append(f"{b.get('name')} {canon(b.get('input'))}")
        return "\n".join(out)
    return json.dumps(content, sort_keys=True)


def canon(v) -> str:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return norm(v)
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def text_action(system: str, reply: str) -> str | None:
    if system.startswith("MINT"):
        found = MINT_ACTION.findall(reply)
        return "\n".join(f"{k}:{norm(b)}" for k, b in found) or None
    if system.startswith("AutoCodeRover"):
        found = ACR_CALL.findall(reply)
        return "\n".join(norm(c) for c in found) or None
    if system.startswith("SWE-agent 1"):
        found = [f"{name} {canon({k: norm(v) for k, v in PARAMETER.findall(body)})}" for name, body in FUNCTION.findall(reply)]
        return "\n".join(found) or None
    found = FENCE.findall(reply)
    return norm(found[-1]) if found else None


def steps(run: dict) -> list[tuple[str, str]]:
    """(action, observation) of each step, in call order."""
    msgs, shape, system = run["messages"], run["shape"], run["system"]
    out = []
    for start in run["calls"]:
        # The messages after the reply up to the next reply of its
        # conversation.
        last = thread_end(run, start - 1)
        end = min([c for c in run["calls"] if c > start] + [last])
        reply = msgs[start] if start < last else {}
        if reply.get("role") != "assistant":
            # The reply was left out of the history: what follows the cut
            # is the harness's answer to it.
            out.append(("dropped", norm("\n".join(text_of(m.get("content")) for m in msgs[start:end]))))
            continue
        after = msgs[start + 1 : end]
        action = None
        if shape == "chat-tools" and reply.get("tool_calls"):
            action = "calls:" + json.dumps(
                [[(c.get("function") or {}).get("name"), canon((c.get("function") or {}).get("arguments"))] for c in reply["tool_calls"]]
            )
        elif shape == "anthropic" and isinstance(reply.get("content"), list):
            uses = [b for b in reply["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
            if uses:
                action = "calls:" + json.dumps([[b.get("name"), canon(b.get("input"))] for b in uses])
        elif shape == "chat-text":
            action = text_action(system, text_of(reply.get("content")))
        if action is None:
            action = "say:" + norm(text_of(reply.get("content")))
        obs = norm("\n".join(text_of(m.get("content")) for m in after))
        if system.startswith("MINT"):
            obs = MINT_COUNTDOWN.sub("", obs).strip()
        out.append((action, obs))
    return out


def stuck(run: dict, resolved: bool) -> dict | None:
    """The clearly-stuck label: the pattern, the step where it is first
    complete and the first call that carries it; None when the run is not
    clearly stuck."""
    if resolved:
        return None
    st = steps(run)
    n = len(st)
    for s in range(n - 1):  # s = n-1: no request carries it
        pattern, actions = None, None
        if s >= 2 and st[s - 2] == st[s - 1] == st[s]:
            pattern, actions = "identical", {st[s][0]}
        elif s >= 9 and len({a for a, _ in st[s - 9 : s + 1]}) <= 2:
            pattern, actions = "two-actions", {a for a, _ in st[s - 9 : s + 1]}
        if pattern is None:
            continue
        later = [a for a, _ in st[s + 1 :]]
        outside = [i for i, a in enumerate(later) if a not in actions]
        recovered = bool(outside) and not (outside == [len(later) - 1])
        if recovered:
            continue
        return {"pattern": pattern, "step": s, "first_call": s + 1}
    return None


def labels(run: dict) -> dict:
    o = run["outcome"]
    successful = o["resolved"] and o["end"] == "own"
    return {
        "successful": successful,
        "stuck": stuck(run, o["resolved"]),
    }
