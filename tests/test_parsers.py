"""Generic output-parsing contract: ParsedDelta, the <think> parser, ChatFormat, OutputParser."""
import random

import pytest

from openinfer.text.parsers import (ChatFormat, ParsedDelta, ThinkTagReasoningParser, ToolCall, ToolCallDelta,
                                    ToolCallParser, collect_tool_calls)
from openinfer.testing.chat import split_feed


def test_parsed_delta_extend_coalesces():
    d = ParsedDelta(content="a", tool_calls=[ToolCallDelta(0, "call_x", "f")])
    d.extend(ParsedDelta(reasoning="r", content="b", tool_calls=[ToolCallDelta(0, arguments='{"a"'),
                                                                  ToolCallDelta(0, arguments=": 1}"),
                                                                  ToolCallDelta(1, "call_y", "g", "{}")]))
    assert (d.reasoning, d.content) == ("r", "ab")
    assert d.tool_calls == [ToolCallDelta(0, "call_x", "f", '{"a": 1}'), ToolCallDelta(1, "call_y", "g", "{}")]
    assert not ParsedDelta() and ParsedDelta(content="x")
    assert collect_tool_calls(d.tool_calls) == [ToolCall("call_x", "f", '{"a": 1}'), ToolCall("call_y", "g", "{}")]


@pytest.mark.parametrize("text, starts, expected", [
    ("<think>\nhmm\n</think>\n\nHello!", False, ("hmm", "Hello!")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("Hello <think>x</think>", False, ("", "Hello <think>x</think>")),  # a late tag is content
    ("plain answer", False, ("", "plain answer")),
    ("\n\nplain", False, ("", "\n\nplain")),
    ("still thinking\n", False, ("", "still thinking\n")),
    ("<think>\nnever closed\n\n", False, ("never closed", "")),
    ("reasoning first\n</think>\n\nanswer", True, ("reasoning first", "answer")),
    ("no close at all", True, ("no close at all", "")),
    ("<thi", False, ("", "<thi")),
    ("<think>a</thi", False, ("a</thi", "")),
    ("<think>a\n\nb\n</think>c</think>", False, ("a\n\nb", "c</think>")),
])
def test_think_parser_cases(text, starts, expected):
    assert ThinkTagReasoningParser(starts).parse(text) == expected
    rng = random.Random(0)
    for _ in range(50):
        out = split_feed(ThinkTagReasoningParser(starts), text, rng, 8)
        assert (out.reasoning, out.content) == expected


def test_think_parser_random_splits():
    rng = random.Random(3)
    pieces = ["<think>", "</think>", "\n", "\n\n", "abc", " ", "<thi", "</th", "x<", "nk>", "é"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        starts = rng.random() < 0.3
        expected = ThinkTagReasoningParser(starts).parse(text)
        out = split_feed(ThinkTagReasoningParser(starts), text, rng, 8)
        assert (out.reasoning, out.content) == expected, (text, starts)


class _CallEndsThinking(ThinkTagReasoningParser):
    end_markers = ("<call>",)


def test_an_end_marker_closes_the_block_and_stays_content():
    assert _CallEndsThinking(True).parse("plan\n<call>x</call>") == ("plan", "<call>x</call>")
    assert _CallEndsThinking(True).parse("plan</think>\n<call>x") == ("plan", "<call>x")
    assert _CallEndsThinking().parse("text <call>x") == ("", "text <call>x")   # outside a block: content as is
    rng = random.Random(4)
    pieces = ["<think>", "</think>", "<call>", "<ca", "ll>", "\n", "abc"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        starts = rng.random() < 0.5
        out = split_feed(_CallEndsThinking(starts), text, rng, 8)
        assert (out.reasoning, out.content) == _CallEndsThinking(starts).parse(text), (text, starts)


def test_think_parser_streams_early():
    p = ThinkTagReasoningParser()
    assert p.feed("<th") == ParsedDelta()
    assert p.feed("ink>\nab") == ParsedDelta(reasoning="ab")
    assert p.feed("c\n</thi") == ParsedDelta(reasoning="c")
    assert p.feed("nk>\n\nHel") == ParsedDelta(content="Hel")
    assert p.feed("lo") == ParsedDelta(content="lo")
    assert p.finish() == ParsedDelta()


def test_chat_format_starts_in_reasoning():
    fmt = ChatFormat(ThinkTagReasoningParser, None, assistant_prefix="<|im_start|>assistant")
    assert fmt.starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not fmt.starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not fmt.starts_in_reasoning("<|im_start|>assistant\n")
    # a tag typed by the user does not open the assistant's reasoning
    assert not fmt.starts_in_reasoning("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n")
    assert not ChatFormat(None, None).starts_in_reasoning("<think>")


class BracketCalls(ToolCallParser):
    """A toy format for the contract test: [[name]] is a call without arguments."""
    start_tag = "[["

    def __init__(self, tools):
        super().__init__(tools)
        self.buf, self.index = "", 0

    def feed(self, text):
        self.buf += text
        out = ParsedDelta()
        while (i := self.buf.find("[[")) >= 0 and (j := self.buf.find("]]", i)) >= 0:
            out.content += self.buf[:i]
            out.tool_calls.append(ToolCallDelta(self.index, f"call_{self.index}", self.buf[i + 2:j], "{}"))
            self.index, self.buf = self.index + 1, self.buf[j + 2:]
        if "[" not in self.buf:
            out.content, self.buf = out.content + self.buf, ""
        return out

    def finish(self):
        out, self.buf = ParsedDelta(content=self.buf), ""
        return out


def test_output_parser_chains_reasoning_then_tools():
    fmt = ChatFormat(ThinkTagReasoningParser, BracketCalls)
    text = "<think>\nuse [[not_a_call]]\n</think>\n\nok [[f]] then [[g]] "
    got = fmt.parse("prompt", text, tools=[{"type": "function"}])
    assert got.reasoning == "use [[not_a_call]]"  # tool syntax inside reasoning is left alone
    assert got.content == "ok  then"
    assert [(c.name, c.arguments) for c in got.tool_calls] == [("f", "{}"), ("g", "{}")]
    no_tools = fmt.parse("prompt", text)  # no tools in the request: no tool parsing
    assert no_tools.content == "ok [[f]] then [[g]] " and no_tools.tool_calls == []
    assert BracketCalls([]).parse(" a [[h]] ") == ("a", [ToolCall("call_0", "h", "{}")])
    rng = random.Random(4)
    for _ in range(200):
        p = fmt.stream_parser("prompt", tools=[{}])
        out = split_feed(p, text, rng, 8)
        assert (out.reasoning, out.content.strip()) == (got.reasoning, got.content)
        assert [(c.name, c.arguments) for c in collect_tool_calls(out.tool_calls)] == [("f", "{}"), ("g", "{}")]


def test_output_parser_reads_a_prefix_ahead_of_the_output():
    """A forced call's opener ends the prompt: the parser reads it first, with the first output or, where there is
    none, at finish; it never becomes content."""
    fmt = ChatFormat(ThinkTagReasoningParser, BracketCalls)
    p = fmt.stream_parser("prompt", tools=[{}], prefix="[[f")
    assert p.feed("]] done") == ParsedDelta(content="", tool_calls=[ToolCallDelta(0, "call_0", "f", "{}")]).extend(
        ParsedDelta(content=" done"))
    assert fmt.parse("prompt", "]]", tools=[{}], prefix="[[g").tool_calls == [ToolCall("call_0", "g", "{}")]
    empty = fmt.stream_parser("prompt", tools=[{}], prefix="[[h]]")
    assert [c.name for c in empty.finish().tool_calls] == ["h"]


def test_output_parser_turns_an_unclosed_call_into_a_call_and_keeps_max_calls():
    """A call the output leaves open (cut by max_tokens) that the format gives back as content becomes a call without
    a name, never markup in the content, streamed or not; max_calls drops the calls after the first ones."""
    fmt = ChatFormat(ThinkTagReasoningParser, BracketCalls)
    got = fmt.parse("prompt", "ok [[f]] then [[g", tools=[{}])
    assert got.content == "ok  then" and [(c.name, c.arguments) for c in got.tool_calls] == [("f", "{}"), ("", "")]
    rng = random.Random(5)
    for _ in range(50):
        out = split_feed(fmt.stream_parser("prompt", tools=[{}]), "ok [[f]] then [[g", rng, 6)
        assert "[[" not in out.content and [d.index for d in out.tool_calls if d.id] == [0, 1]
    first = split_feed(fmt.stream_parser("prompt", tools=[{}], max_calls=1), "[[f]] [[g]] [[h", rng, 6)
    assert [(c.name, c.arguments) for c in collect_tool_calls(first.tool_calls)] == [("f", "{}")]
    assert fmt.parse("prompt", "a [b] c", tools=[{}]).content == "a [b] c"


def test_forced_tool_call_closes_reasoning_as_templates_do():
    class Opener(ChatFormat):
        def tool_call_opener(self, name):
            return "[[" + (name or "")

    fmt = Opener(ThinkTagReasoningParser, BracketCalls, assistant_prefix="<|im_start|>assistant")
    assert fmt.forced_tool_call("<|im_start|>assistant\n<think>\n", "f") == ("\n</think>\n\n", "[[f")
    assert fmt.forced_tool_call("<|im_start|>assistant\n", None) == ("<think>\n\n</think>\n\n", "[[")
    assert fmt.forced_tool_call("<|im_start|>assistant\n<think>\n\n</think>\n\n", "f") == ("", "[[f")
    # a </think> in an earlier turn does not count as this turn's
    assert fmt.forced_tool_call("<think>x</think>y<|im_start|>assistant\n", "f")[0] == "<think>\n\n</think>\n\n"
    assert Opener(None, BracketCalls).forced_tool_call("anything", "f") == ("", "[[f")
    assert ChatFormat(ThinkTagReasoningParser, BracketCalls).forced_tool_call("p", "f") is None   # no opener
