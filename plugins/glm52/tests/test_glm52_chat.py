"""GLM-5.x chat format: the template's rendering, `<arg_key>` tool calls (typed by the tools' schemas,
streamed), `<think>` reasoning opened by the prompt, calls that start inside an unclosed think block,
forced calls and their grammar, and the whole path from token ids."""
from __future__ import annotations

import random

import pytest

from openinfer.plugin_api import ParsedDelta, Tokenizer, collect_tool_calls
from openinfer.testing.chat import split_feed, stream_output, tool_call_grammar_run
from openinfer_glm52.chat import GLM52_CHAT_FORMAT, Glm52ReasoningParser, Glm52ToolCallParser

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later",
           "parameters": {"type": "object", "required": ["city"], "properties": {
               "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
               "tags": {"type": "array"}, "note": {"type": ["string", "null"]}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]
FMT = GLM52_CHAT_FORMAT


@pytest.fixture(scope="module")
def tok(glm_tokenizer_dir) -> Tokenizer:
    return Tokenizer.from_dir(glm_tokenizer_dir)


def render(tok, messages, **kw):
    return tok.apply_chat_template(FMT.template_messages(messages), **kw)


def test_template_turns_and_thinking(tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning_content": "greet"},
            {"role": "user", "content": "Bye"}]
    assert render(tok, msgs) == ("[gMASK]<sop><|system|>Be brief.<|user|>Hi<|assistant|><think></think>Hello!"
                                 "<|user|>Bye<|assistant|><think>")
    assert render(tok, msgs, enable_thinking=False).endswith("<|user|>Bye<|assistant|><think></think>")
    # reasoning is kept only after the last user turn; `<think>` in the content counts as reasoning
    turn = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>hmm</think>Hello!"}]
    assert render(tok, turn, add_generation_prompt=False) == \
        "[gMASK]<sop><|user|>Hi<|assistant|><think>hmm</think>Hello!"


def test_template_tools_calls_and_results(tok):
    msgs = [{"role": "user", "content": "Weather in Paris and the time?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Paris", "days": 2}'}},
                {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "content": "noon"}]
    text = render(tok, msgs, tools=TOOLS)
    head = "[gMASK]<sop><|system|>\n# Tools\n\nYou may call one or more functions"
    assert text.startswith(head)
    assert '\n<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & ' \
           'later"' in text
    assert text.endswith(
        "</arg_value>...</tool_call><|user|>Weather in Paris and the time?<|assistant|><think></think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
        "<arg_value>2</arg_value></tool_call><tool_call>get_time</tool_call>"
        "<|observation|><tool_response>sunny</tool_response><tool_response>noon</tool_response><|assistant|><think>")


def call(name, **args):
    return f"<tool_call>{name}" + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>"
                                          for k, v in args.items()) + "</tool_call>"


PARIS = call("get_weather", city="Paris", days=3)
CASES = [  # (content text, expected content, expected [(name, arguments)])
    (PARIS, "", [("get_weather", '{"city": "Paris", "days": 3}')]),
    ("Checking.\n" + PARIS + "\n" + call("get_time"), "Checking.",
     [("get_weather", '{"city": "Paris", "days": 3}'), ("get_time", "{}")]),
    ("<tool_call>get_time</tool_call>", "", [("get_time", "{}")]),                        # zero arguments
    ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lyon</arg_value>\n</tool_call>", "",
     [("get_weather", '{"city": "Lyon"}')]),                                              # GLM-4.5 layout
    (call("get_weather", city=" 12 ", metric="true", tags='["a", 1]', note="null"), "",
     [("get_weather", '{"city": " 12 ", "metric": true, "tags": ["a", 1], "note": null}')]),
    (call("get_weather", days="many"), "", [("get_weather", '{"days": "many"}')]),          # off-schema: text
    (call("other", n="5", s="x", o='{"a": [1]}'), "", [("other", '{"n": 5, "s": "x", "o": {"a": [1]}}')]),
    (call("get_weather", city="Q&A <b>é\"日本\"</b>"), "",
     [("get_weather", '{"city": "Q&A <b>é\\"日本\\"</b>"}')]),
    ("no calls, just <b>text</b> and <tool_c", "no calls, just <b>text</b> and <tool_c", []),
    ("<tool_call></tool_call> after", "<tool_call></tool_call> after", []),
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", "", [("get_weather", '{"city": "Par"}')]),
    ("<tool_call>get_time", "", [("get_time", "{}")]),                                      # cut off after the name
    ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Nice</tool_call>", "",
     [("get_weather", '{"city": "Nice"}')]),                                               # unclosed value
    ("A\n" + PARIS + "\nB\n\n", "A\nB", [("get_weather", '{"city": "Paris", "days": 3}')]),
]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_tool_parser_cases(text, content, calls):
    got_content, got_calls = Glm52ToolCallParser(TOOLS).parse(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert all(c.id.startswith("call_") for c in got_calls) and len({c.id for c in got_calls}) == len(got_calls)


def test_tool_parser_random_splits():
    rng = random.Random(7)
    pieces = [PARIS, call("get_time"), "\n", " ", "hi", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_value>",
              "get_weather", "<tool_", "é"] + [c[0] for c in CASES]
    for _ in range(1500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        content, calls = Glm52ToolCallParser(TOOLS).parse(text)
        out = split_feed(Glm52ToolCallParser(TOOLS), text, rng, 10)
        assert out.content.strip() == content, text
        assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == \
            [(c.name, c.arguments) for c in calls], text


def test_name_streams_before_the_call_closes():
    p = Glm52ToolCallParser(TOOLS)
    assert p.feed("Sure.\n<tool_") == ParsedDelta(content="Sure.")
    assert p.feed("call>get_wea") == ParsedDelta()
    first = p.feed("ther<arg_")
    [d] = first.tool_calls
    assert (d.index, d.name, d.arguments) == (0, "get_weather", "") and d.id.startswith("call_")
    mid = p.feed("key>city</arg_key><arg_value>Paris</arg_value><arg")
    assert [(t.index, t.arguments) for t in mid.tool_calls] == [(0, '{"city": "Paris"')]
    last = p.feed("_key>days</arg_key><arg_value>2</arg_value></tool_call>")
    assert "".join(t.arguments for t in last.tool_calls) == ', "days": 2}'
    assert p.finish() == ParsedDelta()


def test_reasoning_parser():
    assert Glm52ReasoningParser(True).parse("I should greet.</think>Hello!") == ("I should greet.", "Hello!")
    assert Glm52ReasoningParser().parse("Hello!") == ("", "Hello!")
    # a call opened inside the unclosed block ends it
    assert Glm52ReasoningParser(True).parse("Let me look." + PARIS) == ("Let me look.", PARIS)


@pytest.mark.parametrize("output", ["Let me check.</think>" + PARIS, "Let me check." + PARIS,
                                    "Let me check.\n" + call("get_time")])
def test_call_inside_an_unclosed_think_comes_back_as_a_tool_call(tok, output):
    prompt = render(tok, [{"role": "user", "content": "Weather?"}], tools=TOOLS)
    assert FMT.starts_in_reasoning(prompt)
    full = FMT.parse(prompt, output, TOOLS)
    assert (full.reasoning, full.content) == ("Let me check.", "")
    assert [c.name for c in full.tool_calls] == ["get_weather" if "Paris" in output else "get_time"]


@pytest.mark.parametrize("thinking", [True, False])
def test_end_to_end_streaming(tok, thinking):
    """Output ids → detokenizer → stop strings → chat format, token by token, equals one-shot parse."""
    prompt = render(tok, [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, enable_thinking=thinking)
    assert FMT.starts_in_reasoning(prompt) is thinking
    think = "The user wants the weather — 天气 🌤.</think>" if thinking else ""
    output = think + "Checking.\n" + PARIS + call("get_time") + "<|user|>"
    ids = tok.encode(output)
    assert tok.token_to_id("<tool_call>") in ids
    out = stream_output(FMT, tok, prompt, ids, TOOLS, stop=["Observation:"])
    full = FMT.parse(prompt, tok.decode(ids), TOOLS)
    assert full.reasoning == ("The user wants the weather — 天气 🌤." if thinking else "")
    assert full.content == "Checking."
    want = [("get_weather", '{"city": "Paris", "days": 3}'), ("get_time", "{}")]
    assert [(c.name, c.arguments) for c in full.tool_calls] == want
    assert (out.reasoning, out.content.strip()) == (full.reasoning, full.content)
    assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == want


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("name", ["get_weather", None])
def test_forced_tool_call(tok, thinking, name):
    prompt = render(tok, [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, enable_thinking=thinking)
    close, opener = FMT.forced_tool_call(prompt, name)
    assert (prompt + close).endswith("<|assistant|><think></think>")
    whole = call("get_weather", city="Paris") + "<|user|>"
    assert whole.startswith(opener)
    ids = tok.encode(whole[len(opener):])
    full = FMT.parse(prompt + close, tok.decode(ids), TOOLS, opener)
    assert (full.reasoning, full.content) == ("", "")
    assert [(c.name, c.arguments) for c in full.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    out = stream_output(FMT, tok, prompt + close, ids, TOOLS, prefix=opener)
    assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == [("get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize("name", ["get_weather", None])
def test_tool_call_grammar_takes_the_template_s_calls_and_refuses_others(tok, name):
    opener = FMT.tool_call_opener(name)
    text = call("get_weather", city="Paris <b>", days=2)[len(opener):]
    if name is None:
        text += call("get_time")
    run = lambda out: tool_call_grammar_run(FMT, tok, TOOLS, name, out)   # noqa: E731
    assert run(text) == (len(tok.encode(text)), True)
    assert not run(text[:-1])[1]
    bad = [text.replace("<arg_value>2<", "<arg_value>two<"), text.replace("<arg_key>city</arg_key><arg_value>Paris "
                                                                          "<b></arg_value>", "")]
    for b in bad + ([text.replace("get_weather", "get_wetter")] if name is None else []):
        taken, ends = run(b)
        assert not ends and taken < len(tok.encode(b)), b
