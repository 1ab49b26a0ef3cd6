"""Fake LLM provider fixtures (the servers are in llm_provider.py and
harness.stuck_model).

- `provider`: OpenAI Chat Completions, the Responses API and Anthropic
  Messages, plain or streamed, with the usage each test plans.
- `stuck`: a model stuck in a loop, calling the same tool again whatever
  the conversation says.
- `streams`: streams the text deltas the test sets (degenerate output)."""

from __future__ import annotations

import pytest

from harness import Upstream, stuck_model
from llm_provider import DeltaStreams, Provider


@pytest.fixture
def provider():
    p = Provider()
    yield p
    p.stop()


@pytest.fixture
def stuck():
    u = Upstream(responder=stuck_model)
    yield u
    u.stop()


@pytest.fixture
def streams():
    s = DeltaStreams()
    yield s
    s.stop()
