"""Kimi-K2's chat format: the template's turns (tool declarations, tool results as system turns), tool-call ids of
the `functions.NAME:IDX` form kept consistent across turns, the section-token tool-call parser (streamed at any
split and token by token through the tokenizer), reasoning of the Thinking variants including calls opened without
closing `</think>`, and forced calls held to the schema."""
from __future__ import annotations

import json
import random

import pytest

from openinfer.plugin_api import collect_tool_calls
from openinfer.testing.chat import split_feed, stream_output, tool_call_grammar_run
from openinfer_kimi_k2.chat import KIMI_CHAT_FORMAT as FMT, KimiToolCallParser, call_name
from openinfer_kimi_k2.tokenizer import load_kimi_tokenizer

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
PROMPT = "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def call(idx: int, name: str, args: str) -> str:
    return f"<|tool_call_begin|>functions.{name}:{idx}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


PARIS = call(0, "get_weather", '{"city": "Paris"}')
TIME = call(1, "get_time", "{}")

CASES = [  # (output, reasoning, content, [(id, name, arguments)])
    ("Sunny in Paris.", "", "Sunny in Paris.", []),
    (SB + PARIS + SE, "", "", [("functions.get_weather:0", "get_weather", '{"city": "Paris"}')]),
    ("Let me check. " + SB + PARIS + TIME + SE, "", "Let me check.",
     [("functions.get_weather:0", "get_weather", '{"city": "Paris"}'), ("functions.get_time:1", "get_time", "{}")]),
    ("<think>The user wants weather.</think>" + SB + PARIS + SE, "The user wants weather.", "",
     [("functions.get_weather:0", "get_weather", '{"city": "Paris"}')]),
    # the known failure: the section opened without closing the reasoning
    ("<think>I should call the tool." + SB + PARIS + SE, "I should call the tool.", "",
     [("functions.get_weather:0", "get_weather", '{"city": "Paris"}')]),
    ("<think>hmm</think>\n\nIt is sunny.", "hmm", "It is sunny.", []),
    # the singular spelling of the section token, spaces inside the section, a truncated call
    ("<|tool_call_section_begin|> " + PARIS + " <|tool_call_section_end|>", "", "",
     [("functions.get_weather:0", "get_weather", '{"city": "Paris"}')]),
    (SB + '<|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>{"city": "Ly', "", "",
     [("functions.get_weather:3", "get_weather", '{"city": "Ly')]),
    (SB + "<|tool_call_begin|>functions.get_ti", "", "", [("functions.get_ti", "get_ti", "")]),
    ("no calls, just <|tool_calls_sec", "", "no calls, just <|tool_calls_sec", []),
    (SB + call(2, "a.b", '{"x": "<|tool_call_end"}') + SE, "", "",
     [("functions.a.b:2", "a.b", '{"x": "<|tool_call_end"}')]),
]


@pytest.mark.parametrize("text, reasoning, content, calls", CASES)
def test_parse_cases(text, reasoning, content, calls):
    out = FMT.parse(PROMPT, text, TOOLS)
    assert (out.reasoning, out.content) == (reasoning, content)
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == calls


def test_streaming_at_any_split_gives_the_whole_parse():
    rng = random.Random(3)
    pieces = [c[0] for c in CASES] + [SB, SE, PARIS, TIME, "<think>", "</think>", " ", "\n", "<|tool_", "é中"]
    for _ in range(800):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))
        whole = FMT.parse(PROMPT, text, TOOLS)
        p = FMT.stream_parser(PROMPT, TOOLS)
        out = split_feed(p, text, rng, 12)
        assert (out.reasoning, out.content) == (whole.reasoning, whole.content), repr(text)
        assert collect_tool_calls(out.tool_calls) == whole.tool_calls, repr(text)


def test_arguments_stream_as_they_arrive():
    p = KimiToolCallParser(TOOLS)
    out = p.feed(SB + '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": ')
    assert [(d.id, d.name, d.arguments) for d in out.tool_calls] == [("functions.get_weather:0", "get_weather", ""),
                                                                     (None, None, '{"city":')]
    out = p.feed('"Paris"}<|tool_call_')
    assert [d.arguments for d in out.tool_calls] == [' "Paris"}']
    assert not p.feed("end|>" + SE).tool_calls


def test_call_name():
    assert call_name("functions.get_weather:12") == "get_weather"
    assert call_name("functions.ns.tool:0") == "ns.tool"
    assert call_name("get_weather:0") == "get_weather"


@pytest.fixture(scope="module")
def tok(kimi_tokenizer_dir):
    return load_kimi_tokenizer(kimi_tokenizer_dir)


def test_token_by_token_through_the_tokenizer(tok):
    """The model's output ids -> detokenizer (special tokens skipped, as the server does) -> parsers: the section
    tokens survive decoding, so the calls come back as tool calls."""
    text = "<think>Check the weather." + SB + PARIS + TIME + SE
    ids = tok.encode(text)
    assert tok.token_to_id(SB) in ids and tok.token_to_id("<think>") in ids
    out = stream_output(FMT, tok, PROMPT, ids + [tok.token_to_id("<|im_end|>")], TOOLS)
    assert out.reasoning == "Check the weather." and out.content == ""
    assert [(c.id, c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == [
        ("functions.get_weather:0", "get_weather", '{"city": "Paris"}'), ("functions.get_time:1", "get_time", "{}")]
    # without tools in the request the section is plain content, never parsed
    plain = stream_output(FMT, tok, PROMPT, tok.encode(SB + PARIS + SE), [])
    assert plain.content == SB + PARIS + SE and not plain.tool_calls


def test_template_turns_and_consistent_ids(tok):
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_def", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_abc", "content": '{"weather": "Sunny"}'},
        {"role": "tool", "tool_call_id": "call_def", "content": "12:00"},
        {"role": "assistant", "content": "Sunny.", "tool_calls": [
            {"id": "functions.get_weather:2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "functions.get_weather:2", "content": "Rain"},
    ]
    text = tok.apply_chat_template(FMT.template_messages(messages), tools=TOOLS, add_generation_prompt=True)
    declared = json.dumps(TOOLS, separators=(",", ":"))
    assert text == (
        f"<|im_system|>tool_declare<|im_middle|>{declared}<|im_end|>"
        "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>" + SB + PARIS + TIME + SE + "<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n{\"weather\": \"Sunny\"}<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_time:1\n12:00<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>Sunny." + SB + call(2, "get_weather", '{"city": "Lyon"}') + SE +
        "<|im_end|><|im_system|>tool<|im_middle|>## Return of functions.get_weather:2\nRain<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>")
    # a forced call is numbered after the conversation's three calls
    assert FMT.forced_tool_call(text, "get_time") == ("", SB + call(3, "get_time", "")[:-len("<|tool_call_end|>")])


def test_forced_call_closes_open_reasoning():
    before, opener = FMT.forced_tool_call(PROMPT + "<think>", None)
    assert before == "</think>" and opener == SB + "<|tool_call_begin|>functions."
    assert FMT.forced_tool_call(PROMPT, None)[0] == ""


@pytest.mark.parametrize("name, output, ok", [
    ("get_weather", '{"city": "Paris"}<|tool_call_end|>' + SE, True),
    ("get_weather", '{"town": "Paris"}<|tool_call_end|>' + SE, False),      # not the schema
    (None, 'get_weather:0<|tool_call_argument_begin|>{"city": "Paris", "days": 2}<|tool_call_end|>' + SE, True),
    (None, 'get_time:12<|tool_call_argument_begin|>{}<|tool_call_end|>' + SE, True),
    (None, 'get_wether:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>' + SE, False),
    (None, 'get_weather:x<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>' + SE, False),
])
def test_forced_call_grammar(tok, name, output, ok):
    allowed, accepting = tool_call_grammar_run(FMT, tok, TOOLS, name, output)
    assert (allowed == len(tok.encode(output)) and accepting) == ok


@pytest.mark.parametrize("name, output", [
    ("get_weather", '{"city": "Paris"}<|tool_call_end|>' + SE),
    (None, 'get_time:4<|tool_call_argument_begin|>{}<|tool_call_end|>' + SE),
])
def test_forced_call_comes_back_as_a_tool_call(tok, name, output):
    """As the server runs a forced call: the prompt closed (an open reasoning block too), the opener appended, the
    output parsed with the opener ahead of it, streamed token by token."""
    prompt = PROMPT + "<think>"
    before, opener = FMT.forced_tool_call(prompt, name)
    out = stream_output(FMT, tok, prompt + before, tok.encode(output), TOOLS, prefix=opener)
    [got] = collect_tool_calls(out.tool_calls)
    want = ("functions.get_weather:0", "get_weather", '{"city": "Paris"}') if name else \
        ("functions.get_time:4", "get_time", "{}")
    assert (got.id, got.name, got.arguments) == want
    assert out.content == "" and out.reasoning == ""
