"""Real agent frameworks, run unmodified against a URL: the OpenAI Agents
SDK (Responses API), a LangGraph ReAct agent (langchain-openai, Chat
Completions) and the Anthropic SDK's tool runner (Messages, over message
threads as it runs by default). Each run takes plain Python functions as
its tools, records every HTTP request its SDK sends (retries included), and
returns what the framework's user got: the final answer or the exception.

The tests build Envoy from the shipped examples/recommended/envoy.yaml: the
plugin configuration, its routes and listener limits as they ship, pointed
at the scripted model server.
"""

from __future__ import annotations

import inspect
import os
import warnings
from dataclasses import dataclass, field
from typing import Callable

from harness import ROOT, localize, load_yaml

# No framework phones home: Agents SDK tracing (also switched off in each
# run), LangSmith tracing, OpenTelemetry exporters.
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ["OTEL_SDK_DISABLED"] = "true"

RECOMMENDED = ROOT / "examples" / "recommended" / "envoy.yaml"


def recommended_envoy(model_port: int) -> dict:
    """The shipped recommended setup, both its clusters (openai, anthropic)
    pointed at the scripted model on loopback."""
    return localize(load_yaml(RECOMMENDED), {"openai": model_port, "anthropic": model_port})


@dataclass
class Sent:
    path: str
    body: bytes


@dataclass
class Run:
    """What one agent run did: the HTTP requests its SDK sent and the
    responses it got (status, headers), its final text or the exception
    that ended it."""

    sent: list[Sent] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    response_headers: list[dict] = field(default_factory=list)
    output: str | None = None
    error: BaseException | None = None
    items: list | None = None  # the framework's final history, when it finished

    def on_request(self, request) -> None:
        self.sent.append(Sent(request.url.path, bytes(request.content)))

    def on_response(self, response) -> None:
        self.statuses.append(response.status_code)
        self.response_headers.append({k.lower(): v for k, v in response.headers.items()})

    async def aon_request(self, request) -> None:
        self.on_request(request)

    async def aon_response(self, response) -> None:
        self.on_response(response)

    def hooks(self) -> dict:
        return {"request": [self.on_request], "response": [self.on_response]}

    def ahooks(self) -> dict:
        return {"request": [self.aon_request], "response": [self.aon_response]}


def _doc(fn: Callable) -> str:
    return inspect.getdoc(fn) or fn.__name__


# --- OpenAI Agents SDK ---------------------------------------------------------------


def openai_agents(url: str, key: str, given: str | list, tools: list[Callable], *, system: str, run: Run,
                  handoffs: bool = False) -> None:
    """Runner.run_sync over an Agent with `tools` as function tools (a
    raised exception goes back to the model as the tool's output, the SDK's
    default). With `handoffs`, a second agent, the researcher, and each can
    hand the task to the other."""
    import openai
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_provider import OpenAIProvider

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, http_client=openai.DefaultAsyncHttpxClient(event_hooks=run.ahooks()))
    agent = Agent(name="Assistant", instructions=system, model="gpt-4.1", tools=[function_tool(t) for t in tools])
    if handoffs:
        researcher = Agent(name="Researcher", instructions="You are the researcher. Investigate what you are handed.",
                           model="gpt-4.1", handoffs=[agent])
        agent.handoffs = [researcher]
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=True), tracing_disabled=True)
    try:
        result = Runner.run_sync(agent, given, run_config=config, max_turns=40)
        run.output = result.final_output
        run.items = result.to_input_list()
    except Exception as err:  # what the framework's user sees
        run.error = err


# --- LangGraph ------------------------------------------------------------------------


def langgraph(url: str, key: str, given: str | list, tools: list[Callable], *, system: str, run: Run) -> None:
    """LangGraph's prebuilt ReAct agent over ChatOpenAI; a tool's exception
    goes back to the model (ToolNode's handle_tool_errors), as agents are
    set up."""
    import openai
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import ToolNode, create_react_agent

    llm = ChatOpenAI(model="gpt-4o-mini", base_url=f"{url}/v1", api_key=key,
                     http_client=openai.DefaultHttpxClient(event_hooks=run.hooks()))
    node = ToolNode([StructuredTool.from_function(fn, description=_doc(fn)) for fn in tools], handle_tool_errors=True)
    with warnings.catch_warnings():
        # create_react_agent is deprecated for langchain's create_agent, but
        # it is what most LangGraph agents still run.
        warnings.simplefilter("ignore")
        agent = create_react_agent(llm, node, prompt=system)
    messages = [("user", given)] if isinstance(given, str) else given
    try:
        state = agent.invoke({"messages": messages}, {"recursion_limit": 80})
        run.output = state["messages"][-1].content
        run.items = state["messages"]
    except Exception as err:
        run.error = err


# --- Anthropic SDK tool runner -----------------------------------------------------------


def anthropic_tool_runner(url: str, key: str, given: str | list, tools: list[Callable], *, system: str, run: Run,
                          threads: bool = True) -> None:
    """client.beta.messages.tool_runner(...).until_done() with @beta_tool
    functions (a raised exception becomes an is_error tool result). By
    default it runs over a message thread: each turn after the first sends
    only the new messages. threads=False is its `thread=False`: the whole
    history every turn."""
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key=key, http_client=anthropic.DefaultHttpxClient(event_hooks=run.hooks()))
    messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
    runner = client.beta.messages.tool_runner(model="claude-sonnet-5-5", max_tokens=1024, system=system, messages=messages,
                                              tools=[anthropic.beta_tool(t) for t in tools], max_iterations=40,
                                              **({} if threads else {"thread": False}))
    try:
        final = runner.until_done()
        run.output = "".join(b.text for b in final.content if b.type == "text")
        # The history for a next turn (a conversation without tool calls:
        # the runner keeps its own thread's history private).
        run.items = messages + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}]
    except Exception as err:
        run.error = err


FRAMEWORKS = {"openai-agents": openai_agents, "langgraph": langgraph, "anthropic-tool-runner": anthropic_tool_runner}


def next_input(framework: str, history: list, text: str) -> list:
    """The framework's history with the user's next message appended."""
    if framework == "langgraph":
        return history + [("user", text)]
    return history + [{"role": "user", "content": text}]


def drive(framework: str, url: str, key: str, scenario, *, rounds: int = 10, **kw) -> Run:
    """Run a scenario (framework_scripts.Scenario) on one framework. When
    the scenario has a follow_up, an application drives the conversation:
    the framework answers, the application replies follow_up(answer),
    until it says None, the framework fails, or `rounds` answers."""
    run, given = Run(), scenario.prompt
    for _ in range(rounds):
        FRAMEWORKS[framework](url, key, given, scenario.tools, system=scenario.system, run=run, **kw)
        if scenario.follow_up is None or run.error is not None:
            break
        text = scenario.follow_up(run.output)
        if text is None:
            break
        given = next_input(framework, run.items, text)
    return run
