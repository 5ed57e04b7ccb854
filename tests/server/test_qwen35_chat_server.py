"""Qwen3.5's chat format behind the real server (a fake engine with the genuine Qwen3.5 tokenizer), driven by
the openai client: thinking opened by the prompt, XML tool calls streamed as OpenAI deltas, and a
multi-turn conversation whose tool-call arguments come back as JSON text."""
from __future__ import annotations

import json
from typing import Iterator

import openai
import pytest

from fake_engine import FakeEngine
from openinfer.server import ModelHost
from openinfer.text.tokenizer import Tokenizer
from server_harness import LiveServer

q35 = pytest.importorskip("openinfer_qwen35.chat")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
USER = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
OUTPUT = ("The user wants a forecast.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n"
          "<parameter=city>\nParis, Île-de-France\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
          "</tool_call>")


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    e = FakeEngine("qwen35")
    e.tokenizer = Tokenizer.from_dir(q35.TOKENIZER_DIR)
    e.chat_format = q35.Qwen35ChatFormat()
    e.vocab_size, e.eos_token_ids = e.tokenizer.vocab_size, e.tokenizer.eos_token_ids
    e.eos, e.filler = min(e.eos_token_ids), e.tokenizer.encode(" x")[0]
    e.start()
    yield e
    e.shutdown()


@pytest.fixture(scope="module")
def client(engine: FakeEngine) -> Iterator[openai.OpenAI]:
    with LiveServer(ModelHost({"qwen35": engine})) as url, \
            openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as c:
        yield c


def test_streamed_reasoning_and_tool_call(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.say(OUTPUT)
    chunks = list(client.chat.completions.create(model="qwen35", messages=USER, tools=TOOLS, stream=True))
    assert engine.tokenizer.decode(engine.submitted[-1][1], False).endswith("<|im_start|>assistant\n<think>\n")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == "The user wants a forecast."
    assert "".join(d.content or "" for d in deltas) == "Checking."
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert calls[0].id and calls[0].type == "function" and calls[0].function.name == "get_weather"
    assert all(t.index == 0 and t.id is None and t.function.name is None for t in calls[1:])
    assert len(calls) > 5  # the city streams as it is generated, not in one piece at the end
    assert json.loads("".join(t.function.arguments for t in calls)) == {"city": "Paris, Île-de-France", "days": 3}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_conversation_round_trip(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.say(OUTPUT)
    r = client.chat.completions.create(model="qwen35", messages=USER, tools=TOOLS)
    m = r.choices[0].message
    assert (m.content, m.model_extra["reasoning_content"]) == ("Checking.", "The user wants a forecast.")
    assert json.loads(m.tool_calls[0].function.arguments) == {"city": "Paris, Île-de-France", "days": 3}
    engine.say("Sunny all week.")
    turn = [*USER, m.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "sunny"}]
    r = client.chat.completions.create(model="qwen35", messages=turn, tools=TOOLS,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "Sunny all week."
    prompt = engine.tokenizer.decode(engine.submitted[-1][1], False)
    assert ("<|im_start|>assistant\n<think>\nThe user wants a forecast.\n</think>\n\nChecking.\n\n<tool_call>\n"
            "<function=get_weather>\n<parameter=city>\nParis, Île-de-France\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n") in prompt


def test_named_tool_choice_streams_the_forced_call(client: openai.OpenAI, engine: FakeEngine) -> None:
    """The prompt's open think block is closed and `<tool_call>\\n<function=get_weather>\\n` appended; the model
    writes only the parameters, and the stream's first delta names the call."""
    engine.say("<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
    chunks = list(client.chat.completions.create(model="qwen35", messages=USER, tools=TOOLS, stream=True,
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    assert engine.tokenizer.decode(engine.submitted[-1][1], False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=get_weather>\n")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert calls[0].function.name == "get_weather" and not any(d.content for d in deltas)
    assert not any(d.model_extra.get("reasoning_content") for d in deltas)
    assert json.loads("".join(t.function.arguments for t in calls)) == {"city": "Oslo", "days": 2}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
