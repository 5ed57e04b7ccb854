"""Qwen3.5 chat format: the chat template's behaviour, XML tool calls (typed by the tools' schemas,
streamed), `<think>` reasoning opened by the prompt, and the whole path from token ids."""
import json
import random

import pytest

from openinfer.plugin_api import ChatTemplateError, ParsedDelta, Tokenizer, collect_tool_calls
from openinfer.testing.chat import split_feed, stream_output, tool_call_grammar_run
from openinfer_qwen35.chat import (TOKENIZER_DIR, Qwen35ChatFormat, Qwen35ReasoningParser, Qwen35ToolCallParser,
                                   convert_value)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later", "parameters": {
    "type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
        "lat": {"type": "number"}, "tags": {"type": "array"}, "opts": {"type": "object"},
        "note": {"type": ["string", "null"]}, "when": {"anyOf": [{"type": "integer"}, {"type": "string"}]}}}}}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]
FORMAT = Qwen35ChatFormat()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(TOKENIZER_DIR)


# ---- the chat template ----

def test_generation_prompt_opens_thinking_by_default(tok):
    msgs = [{"role": "user", "content": "hi"}]
    on = tok.apply_chat_template(msgs)
    off = tok.apply_chat_template(msgs, enable_thinking=False)
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert tok.apply_chat_template(msgs, enable_thinking=True) == on
    assert off == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert FORMAT.starts_in_reasoning(on) and not FORMAT.starts_in_reasoning(off)
    # a <think> inside user text is not an open reasoning block
    assert not FORMAT.starts_in_reasoning(tok.apply_chat_template([{"role": "user", "content": "<think>"}],
                                                                  enable_thinking=False))


def test_tools_system_turn(tok):
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                                   tools=TOOLS)
    head, rest = text.split("<|im_end|>\n", 1)
    assert head.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
                           + json.dumps(WEATHER, ensure_ascii=False) + "\n" + json.dumps(TOOLS[1]) + "\n</tools>\n\n"
                           "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
                           "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n")
    assert head.endswith("</IMPORTANT>\n\nBe brief.")
    assert rest == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    with pytest.raises(ChatTemplateError, match="System message must be at the beginning"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}])


def test_tool_conversation_renders_exactly(tok):
    """Arguments sent back as JSON text (as OpenAI clients do) render like objects; consecutive tool
    results share one user turn; reasoning is kept only after the last real user query."""
    msgs = [
        {"role": "user", "content": "Weather in Paris and Lyon?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Two cities.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": '{"city": "Paris", "days": 2, "metric": true}'}},
            {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Lyon",
                                                                                               "tags": ["x", 1]}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "b", "content": "rain"},
        {"role": "assistant", "content": "<think>\nDone.\n</think>\n\nParis sunny, Lyon rain."},
        {"role": "user", "content": "Thanks"},
    ]
    text = tok.apply_chat_template(FORMAT.template_messages(msgs), enable_thinking=False)
    assert text == (
        "<|im_start|>user\nWeather in Paris and Lyon?<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n<parameter=tags>\n[\"x\", 1]\n"
        "</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nParis sunny, Lyon rain.<|im_end|>\n"
        "<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # before the next user query, the turns after the last query keep their reasoning
    tail = tok.apply_chat_template(FORMAT.template_messages(msgs[:4]))
    assert "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\nChecking.\n\n<tool_call>" in tail
    assert tail.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_template_messages(tok):
    msgs = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x": [1]}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}}]}]
    out = FORMAT.template_messages(msgs)
    assert [c["function"]["arguments"] for c in out[0]["tool_calls"]] == [{"x": [1]}, {}]
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == '{"x": [1]}'  # the request is not modified
    plain = [{"role": "user", "content": "hi"}]
    assert FORMAT.template_messages(plain) == plain
    for bad in ("[1, 2]", "{not json"):
        with pytest.raises(ChatTemplateError, match="JSON object"):
            FORMAT.template_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": bad}}]}])


# ---- tool calls ----

def call(name, *params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


PARIS = call("get_weather", ("city", "Paris"), ("days", "3"))
CASES = [  # (content text, expected content, expected [(name, arguments)])
    (PARIS, "", [("get_weather", '{"city": "Paris", "days": 3}')]),
    ("Let me check.\n\n" + PARIS + "\n" + call("noop"), "Let me check.",
     [("get_weather", '{"city": "Paris", "days": 3}'), ("noop", "{}")]),
    (call("get_weather", ("city", "New\nYork \"NY\" \\ é 日本"), ("metric", "False"), ("lat", "-12.5e1"),
          ("tags", '["a", 2]'), ("opts", "{'k': True, 'n': None}"), ("note", "null"), ("when", "7")), "",
     [("get_weather", '{"city": "New\\nYork \\"NY\\" \\\\ é 日本", "metric": false, "lat": -125.0, "tags": ["a", 2], '
                      '"opts": {"k": true, "n": null}, "note": "null", "when": 7}')]),
    (call("get_weather", ("days", "three"), ("lat", "nan"), ("opts", "[1]"), ("metric", "yes"), ("when", "soon")), "",
     [("get_weather", '{"days": "three", "lat": "nan", "opts": "[1]", "metric": "yes", "when": "soon"}')]),
    (call("unknown_fn", ("a", "1"), ("b", "")), "", [("unknown_fn", '{"a": "1", "b": ""}')]),
    (call("get_weather", ("city", "\nPadded\n")), "", [("get_weather", '{"city": "\\nPadded\\n"}')]),
    ("no calls, just <b>text</b> and <tool_c", "no calls, just <b>text</b> and <tool_c", []),
    ("<tool_call>\nnot a function\n</tool_call> after", "<tool_call>\nnot a function\n</tool_call> after", []),
    ("<tool_call><function=>x</tool_call>", "<tool_call><function=>x</tool_call>", []),
    # lenient: values closed by the next tag, missing </function>, stray text between parameters
    ("<tool_call><function=get_weather><parameter=city>Rome<parameter=days>4</function></tool_call>", "",
     [("get_weather", '{"city": "Rome", "days": 4}')]),
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\nok\n</tool_call>", "",
     [("get_weather", '{"city": "Oslo"}')]),
    # two functions in one block
    ("<tool_call>\n<function=noop>\n</function>\n<function=noop>\n</function>\n</tool_call>", "",
     [("noop", "{}"), ("noop", "{}")]),
    # cut off by the end of the output: closed as far as it goes
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nBer", "", [("get_weather", '{"city": "Ber"}')]),
    ("<tool_call>\n<function=get_weather>\n<parameter=days>\n12\n</param", "", [("get_weather", '{"days": 12}')]),
    ("<tool_call>\n<function=get_weather>\n", "", [("get_weather", "{}")]),
    ("<tool_call>\n<function=get_wea", "<tool_call>\n<function=get_wea", []),
    ("A\n" + PARIS + "\nB\n\n", "A\nB", [("get_weather", '{"city": "Paris", "days": 3}')]),
]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_tool_parser_cases(text, content, calls):
    got_content, got_calls = Qwen35ToolCallParser(TOOLS).parse(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    for c in got_calls:
        json.loads(c.arguments)
    assert len({c.id for c in got_calls}) == len(got_calls) and all(c.id.startswith("call_") for c in got_calls)


@pytest.mark.parametrize("value, types, expected", [
    ("3", ["integer"], 3), ("-3", ["number"], -3), ("2.5", ["number"], 2.5), ("1e400", ["number"], "1e400"),
    (" true ", ["boolean"], True), ("FALSE", ["boolean"], False), ("null", ["integer", "null"], None),
    ("None", ["null"], None), ("[1, {\"a\": 2}]", ["array"], [1, {"a": 2}]), ("(1, 2)", ["array"], [1, 2]),
    ("{'a': (1,)}", ["object"], {"a": [1]}), ("{1, 2}", ["array"], "{1, 2}"), ("[1]", ["object"], "[1]"), ("x", ["integer", "string"], "x"), ("7", ["string", "integer"], "7"),
    ("1_000", ["integer"], "1_000"), ("{}", [], "{}"),
])
def test_convert_value(value, types, expected):
    got = convert_value(value, types)
    assert got == expected and type(got) is type(expected)


def test_tool_parser_random_splits():
    rng = random.Random(7)
    pieces = [PARIS, call("noop"), "\n", " ", "hi", "<tool_call>", "</tool_call>", "<function=get_weather>",
              "</function>", "<parameter=city>", "<parameter=days>", "</parameter>", "\n\n", "4", "<tool_", "</par",
              "é"] + [c[0] for c in CASES]
    for _ in range(1500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 7)))
        content, calls = Qwen35ToolCallParser(TOOLS).parse(text)
        out = split_feed(Qwen35ToolCallParser(TOOLS), text, rng, 12)
        assert out.content == content, text
        assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == \
            [(c.name, c.arguments) for c in calls], text


def test_streaming_deltas():
    """The name goes out with the function header, string values as they arrive, typed values when
    complete; every call's argument pieces concatenate to its JSON."""
    p = Qwen35ToolCallParser(TOOLS)
    assert p.feed("Sure.\n<tool_") == ParsedDelta(content="Sure.")
    assert p.feed("call>\n<function=get_wea") == ParsedDelta()
    first = p.feed("ther>\n<parameter=city>\nNew")
    assert [(d.index, d.name, d.arguments) for d in first.tool_calls] == \
        [(0, "get_weather", ""), (0, None, '{"city": "'), (0, None, "New")]
    assert first.tool_calls[0].id.startswith("call_") and first.tool_calls[1].id is None
    assert [d.arguments for d in p.feed(" York\n").tool_calls] == [" York"]  # the newline may be framing
    assert [d.arguments for d in p.feed("</parameter>\n<parameter=days>\n1").tool_calls] == ['"']
    assert p.feed("0\n</parame") == ParsedDelta()  # an integer waits for its end
    assert [d.arguments for d in p.feed("ter>\n</function>\n</tool_call>").tool_calls] == [', "days": 10', "}"]
    assert p.finish() == ParsedDelta()


def test_reasoning_parser():
    assert Qwen35ReasoningParser(True).parse("The user greets.\n</think>\n\nHello!") == ("The user greets.", "Hello!")
    assert Qwen35ReasoningParser(True).parse("cut off mid-thought") == ("cut off mid-thought", "")
    assert Qwen35ReasoningParser().parse("Hello!") == ("", "Hello!")
    assert Qwen35ReasoningParser().parse("<think>\nx\n</think>\n\ny") == ("x", "y")


@pytest.mark.parametrize("thinking", [True, False])
def test_end_to_end_streaming(tok, thinking):
    """Output ids → detokenizer → stop strings → chat format, token by token, equals one-shot parse."""
    prompt = tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                     enable_thinking=thinking)
    think = "The user wants the weather — 天气 🌤.\n</think>\n\n" if thinking else ""
    output = think + "Checking.\n\n" + call("get_weather", ("city", "Paris 🌧"), ("days", "2")) + "<|im_end|>"
    ids = tok.encode(output)
    assert (248069 in ids) is thinking and 248058 in ids

    out = stream_output(FORMAT, tok, prompt, ids, TOOLS, stop=["Observation:"])

    full = FORMAT.parse(prompt, tok.decode(ids), TOOLS)
    assert full.reasoning == ("The user wants the weather — 天气 🌤." if thinking else "")
    assert full.content == "Checking."
    assert [(c.name, c.arguments) for c in full.tool_calls] == [("get_weather", '{"city": "Paris 🌧", "days": 2}')]
    assert (out.reasoning, out.content) == (full.reasoning, full.content)
    assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == \
        [(c.name, c.arguments) for c in full.tool_calls]


def test_format_facts():
    assert FORMAT.reasoning_parser is Qwen35ReasoningParser and FORMAT.tool_parser is Qwen35ToolCallParser
    assert FORMAT.parse("<|im_start|>assistant\n<think>\n", PARIS, None).tool_calls == []  # tools not requested
    assert FORMAT.parse("<|im_start|>assistant\n<think>\n", PARIS, None).reasoning == PARIS  # never closed


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("name", ["get_weather", None])
def test_forced_tool_call(tok, thinking, name):
    """tool_choice "required" / named: the prompt's reasoning is closed as the template does with thinking off
    (`<think>\\n\\n</think>\\n\\n` either way) and ends with `<tool_call>\\n<function=` (+ the name); the model's
    continuation parses to the call, streamed or whole, with the opener read ahead of the output."""
    prompt = tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                     enable_thinking=thinking)
    close, opener = FORMAT.forced_tool_call(prompt, name)
    assert (prompt + close).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert opener == "<tool_call>\n<function=" + ("get_weather>\n" if name else "")
    whole = call("get_weather", ("city", "Paris"), ("days", "2")) + "<|im_end|>"
    ids = tok.encode(whole[len(opener):])
    full = FORMAT.parse(prompt + close, tok.decode(ids), TOOLS, opener)
    assert (full.reasoning, full.content) == ("", "")
    assert [(c.name, c.arguments) for c in full.tool_calls] == [("get_weather", '{"city": "Paris", "days": 2}')]
    out = stream_output(FORMAT, tok, prompt + close, ids, TOOLS, prefix=opener)
    assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == \
        [(c.name, c.arguments) for c in full.tool_calls]


@pytest.mark.parametrize("name", ["get_weather", None])
def test_tool_call_grammar_takes_the_template_s_calls_and_refuses_others(tok, name):
    """The grammar of a forced call's rest accepts the calls exactly as the chat template renders an assistant turn
    with them (for "required", two calls: one with text and typed parameters, one to a function that declares no
    properties); a missing required parameter, an undeclared one, a value off its type or a broken tag is refused."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "note"}}]
    calls = [{"type": "function", "function": {"name": "get_weather", "arguments": {
        "city": "New <York>\nNY", "days": 3, "opts": {"units": "C", "hourly": [1, 2]}}}}]
    if name is None:
        calls.append({"type": "function", "function": {"name": "note", "arguments": {"text": "hi"}}})
    turn = tok.apply_chat_template([{"role": "user", "content": "?"}, {"role": "assistant", "content": "",
                                    "tool_calls": calls}], tools=tools, enable_thinking=False,
                                  add_generation_prompt=False)
    text = turn[turn.index("<tool_call>", turn.rindex("<|im_start|>assistant")):]   # past the system prompt's example
    text = text[:text.rindex("</tool_call>") + len("</tool_call>")]
    opener = FORMAT.tool_call_opener(name)
    assert text.startswith(opener)
    rest = text[len(opener):]

    def run(output: str) -> tuple[int, bool]:
        return tool_call_grammar_run(FORMAT, tok, tools, name, output)

    assert run(rest) == (len(tok.encode(rest)), True)
    assert not run(rest[:-1])[1]
    bad = [rest.replace("<parameter=city>\nNew <York>\nNY\n</parameter>\n", ""),
           rest.replace("<parameter=days>\n3", "<parameter=days>\nthree"),
           rest.replace("<parameter=days>", "<parameter=weeks>"),
           rest.replace("</function>", "</func>")]
    for b in bad:
        taken, ends = run(b)
        assert not ends and taken < len(tok.encode(b)), b
    if name is None:   # parallel_tool_calls false: the first call ends the output
        first = rest[:rest.index("</tool_call>") + len("</tool_call>")]
        assert tool_call_grammar_run(FORMAT, tok, tools, name, first, parallel=False)[1]
        assert not tool_call_grammar_run(FORMAT, tok, tools, name, rest, parallel=False)[1]
