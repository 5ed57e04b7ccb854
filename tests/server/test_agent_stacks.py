"""Agent stacks as their users run them, unchanged, against the demo model behind a real server on loopback: the
OpenAI Agents SDK (an agent with a function tool and a structured final output, on the chat-completions and the
Responses model) and langchain-openai (bind_tools with a forced call, with_structured_output in its function-calling
and json-schema modes). The demo model's output is noise, so every answer these stacks read is held by what real
clients ask for anyway: a forced tool call and a strict output schema, constrained while decoding."""
from __future__ import annotations

from typing import Literal

import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, RunConfig, Runner,
                    ToolCallItem, function_tool)
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from openai.types.shared import Reasoning
from pydantic import BaseModel, ConfigDict, Field

CITIES = ("Paris", "Oslo")


def weather(city: Literal["Paris", "Oslo"]) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


class Report(BaseModel):
    city: Literal["Paris", "Oslo"]
    sunny: bool


class Point(BaseModel):
    """A point on a small grid."""
    model_config = ConfigDict(extra="forbid")
    x: int = Field(ge=-9, le=9)
    label: Literal["a", "b"]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_agents_sdk_agent_calls_its_tool_and_reports(url: str, api: str) -> None:
    """Turn one is the forced call (parallel_tool_calls false), the SDK runs the tool and sends its result back;
    turn two (tool_choice reset to auto) is the final output, held to the output type's schema. Reasoning effort
    "none" turns the demo model's thinking off."""
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return weather(city)

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    model = (OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel)("demo", client)
    agent = Agent(name="weather", instructions="Look the weather up, then report it.", tools=[get_weather],
                  model=model, output_type=Report,
                  model_settings=ModelSettings(tool_choice="get_weather", parallel_tool_calls=False, max_tokens=64,
                                               reasoning=Reasoning(effort="none")))
    result = Runner.run_sync(agent, "What is the weather in Paris?", run_config=RunConfig(tracing_disabled=True))
    assert len(calls) == 1 and calls[0] in CITIES
    assert [type(i).__name__ for i in result.new_items] == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert isinstance(result.new_items[0], ToolCallItem) and result.new_items[1].output == weather(calls[0])
    assert isinstance(result.final_output, Report) and result.final_output.city in CITIES


@pytest.fixture
def llm(url: str) -> ChatOpenAI:
    return ChatOpenAI(base_url=url + "/v1", api_key="none", model="demo", max_tokens=64, temperature=0,
                      max_retries=0)


def test_langchain_bind_tools_with_a_forced_call(llm: ChatOpenAI) -> None:
    get_weather = tool(weather, parse_docstring=False)
    msg = llm.bind_tools([get_weather], tool_choice="weather", strict=True).invoke("Weather in Paris?")
    assert [(c["name"], c["args"]["city"] in CITIES) for c in msg.tool_calls] == [("weather", True)]
    assert msg.response_metadata["finish_reason"] == "stop" and not msg.invalid_tool_calls
    # "any" (required) lets the model pick; one call, as a noise model would chain them until max_tokens
    chunks = list(llm.bind_tools([get_weather], tool_choice="any", strict=True, parallel_tool_calls=False)
                  .stream("Weather in Oslo?"))
    merged = chunks[0]
    for c in chunks[1:]:
        merged += c
    assert [(c["name"], c["args"]["city"] in CITIES) for c in merged.tool_calls] == [("weather", True)]
    assert merged.response_metadata["finish_reason"] == "tool_calls"
    assert get_weather.invoke(merged.tool_calls[0]["args"]) == weather(merged.tool_calls[0]["args"]["city"])


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_with_structured_output(llm: ChatOpenAI, method: str) -> None:
    point = llm.with_structured_output(Point, method=method).invoke("A point, please.")
    assert isinstance(point, Point) and -9 <= point.x <= 9
    raw = llm.with_structured_output(Point, method=method, include_raw=True).invoke("Another point.")
    assert raw["parsing_error"] is None and isinstance(raw["parsed"], Point)
