"""An agent loop that handles loopguard's 429 the way it should.

When the gateway says the agent is looping (`recursive_loop_detected`),
resending the same conversation is exactly the wrong move: it is one more
hit of the loop. This agent backs off for the time the gateway asks for,
changes the conversation (tells the model to stop calling the failing tool),
and gives up cleanly if the loop comes back.

    OPENAI_BASE_URL=http://127.0.0.1:10000/v1 OPENAI_API_KEY=sk-... python agent.py

Environment: MAX_RECOVERIES (default 1), BACKOFF_CAP_SECONDS (default 10).
"""

from __future__ import annotations

import json
import os
import sys
import time

from openai import OpenAI, RateLimitError

MAX_STEPS = 30
MAX_RECOVERIES = int(os.environ.get("MAX_RECOVERIES", "1"))
BACKOFF_CAP = float(os.environ.get("BACKOFF_CAP_SECONDS", "10"))

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_build_status",
            "description": "The CI status of a branch.",
            "parameters": {"type": "object", "properties": {"branch": {"type": "string"}}, "required": ["branch"]},
        },
    }
]


def get_build_status(branch: str) -> str:
    # A flaky dependency: the classic trigger of an agent loop.
    return f"ERROR: CI API timed out while reading {branch}"


def run(client: OpenAI, question: str) -> str | None:
    messages: list[dict] = [
        {"role": "system", "content": "You are a release assistant."},
        {"role": "user", "content": question},
    ]
    recoveries = 0
    for _ in range(MAX_STEPS):
        try:
            response = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
        except RateLimitError as e:
            if e.code != "recursive_loop_detected":
                raise  # an ordinary rate limit: leave it to your usual backoff
            details = e.body if isinstance(e.body, dict) else {}
            wait = int(e.response.headers.get("retry-after-ms", "1000")) / 1000
            print(
                f"loop detected by the gateway: policy {details.get('policy')}, "
                f"{details.get('hit_count')} identical requests; retry after {wait:.1f}s"
            )
            if recoveries >= MAX_RECOVERIES:
                print("giving up: the agent is stuck in a loop")
                return None
            recoveries += 1
            time.sleep(min(wait, BACKOFF_CAP))
            # Change the conversation instead of resending it.
            messages.append(
                {"role": "user", "content": "The tool keeps failing. Do not call it again; answer with what you know."}
            )
            continue
        message = response.choices[0].message
        if not message.tool_calls:
            return message.content
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = get_build_status(**json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print("giving up: too many steps")
    return None


if __name__ == "__main__":
    answer = run(OpenAI(), "Is the build on main green?")
    print(f"answer: {answer}" if answer is not None else "no answer")
    sys.exit(0)
