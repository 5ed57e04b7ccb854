"""The kimi_k2 line behind the real server app, driven by the openai client: forced tool calls (a named function,
streamed; tool_choice "required") come back as OpenAI tool calls with Kimi's `functions.NAME:IDX` ids and
arguments held to the function's schema, from a tiny random INT4 checkpoint (so only the grammar makes them
calls)."""
from __future__ import annotations

import asyncio
import json
import re

import pytest

from openinfer.testing import EngineArgs, build_engine

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")   # the server app's framework
from openinfer.testing import ModelHost, create_app  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}, "required": ["city"],
    "additionalProperties": False}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}}]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def app(kimi_int4):
    engine = build_engine(str(kimi_int4[0]), EngineArgs(max_model_len=512)).start()
    yield create_app(ModelHost({"kimi": engine}), (), ("*",))
    engine.shutdown()


def _ask(app, **kw):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://kimi") as http:
            client = openai.AsyncOpenAI(base_url="http://kimi/v1", api_key="none", http_client=http, max_retries=0)
            out = await client.chat.completions.create(model="kimi", messages=USER, tools=TOOLS, max_tokens=48,
                                                       temperature=0, **kw)
            return [c async for c in out] if kw.get("stream") else out
    return asyncio.run(go())


def test_named_forced_call_streams_as_a_tool_call(app):
    chunks = _ask(app, stream=True, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert calls[0].id == "functions.get_weather:0" and calls[0].function.name == "get_weather"
    assert json.loads("".join(t.function.arguments or "" for t in calls))["city"] in ("Paris", "Lyon")
    assert not "".join(d.content or "" for d in deltas)
    # "stop", as OpenAI ends a call it was told to make by name
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_required_call_picks_a_declared_function(app):
    r = _ask(app, tool_choice="required")
    [call] = r.choices[0].message.tool_calls
    assert re.fullmatch(r"functions\.(get_weather|get_time):\d+", call.id)
    assert call.function.name == call.id.split(".", 1)[1].rsplit(":", 1)[0]
    args = json.loads(call.function.arguments)
    assert args == {} if call.function.name == "get_time" else args["city"] in ("Paris", "Lyon")
    assert r.choices[0].finish_reason == "tool_calls"
