"""Output parsing contract: split generated text into reasoning, content and tool calls.

A model line provides a ChatFormat naming its ReasoningParser and ToolCallParser classes. The
server makes one OutputParser per choice (ChatFormat.stream_parser) and feeds it text deltas
after stop-string handling; reasoning is split off first, and the tool parser only sees content.
Every parser is a streaming state machine that holds back partial tags, so the concatenated
deltas are the same whatever the split points; the non-streaming parse() runs the same machine
over the whole text.
"""
from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from openinfer.text.detokenize import partial_suffix_len


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it


@dataclass
class ToolCallDelta:
    """One streamed piece of a call. The first delta of a call has id and name (arguments may be
    empty); later deltas with the same index append argument text."""
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: ParsedDelta) -> ParsedDelta:
        """Append `other` in place (argument fragments of the same call coalesce); returns self."""
        self.reasoning += other.reasoning
        self.content += other.content
        for d in other.tool_calls:
            last = self.tool_calls[-1] if self.tool_calls else None
            if last is not None and last.index == d.index and d.id is None and d.name is None:
                last.arguments += d.arguments
            else:
                self.tool_calls.append(ToolCallDelta(d.index, d.id, d.name, d.arguments))
        return self


def collect_tool_calls(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """Assemble complete calls from a stream of deltas."""
    calls: dict[int, ToolCall] = {}
    for d in deltas:
        call = calls.setdefault(d.index, ToolCall(d.id or new_call_id(), d.name or "", ""))
        call.name = d.name or call.name
        call.arguments += d.arguments
    return [calls[i] for i in sorted(calls)]


class ReasoningParser(ABC):
    """Splits one choice's output into reasoning and content. starts_in_reasoning is True when
    the prompt already opened the reasoning block (ChatFormat.starts_in_reasoning)."""

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        self.starts_in_reasoning = starts_in_reasoning

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta: ...

    @abstractmethod
    def finish(self) -> ParsedDelta: ...

    def parse(self, text: str) -> tuple[str, str]:
        """Non-streaming: (reasoning, content) of a whole output."""
        p = type(self)(self.starts_in_reasoning)
        out = p.feed(text).extend(p.finish())
        return out.reasoning, out.content


class ContentTrimmer:
    """The content around tool calls, as streamed: leading whitespace dropped, trailing whitespace
    held back until it is known whether a call follows (then it is dropped too)."""

    def __init__(self) -> None:
        self.held = ""
        self.emitted = False

    def emit(self, out: ParsedDelta, text: str, before_call: bool) -> None:
        text = self.held + text
        body = text.rstrip()
        self.held = "" if before_call else text[len(body):]
        if not self.emitted:
            body = body.lstrip()
        if body:
            out.content += body
            self.emitted = True


class ToolCallParser(ABC):
    """Extracts tool calls from one choice's content stream. `tools` is the request's tool list
    (formats that write arguments as text, like XML, need the schemas to type the values).

    A call the output leaves unclosed (cut by max_tokens) is closed by finish() as far as it goes: its name
    and arguments so far. Where the format cannot read it yet (cut inside the name), finish() may give it back
    as content; OutputParser then turns content from `start_tag` on into a call without a name, so a call's
    markup never reaches the content."""
    start_tag: str = ""   # the markup that opens a call

    def __init__(self, tools: list[dict]) -> None:
        self.tools = tools

    @abstractmethod
    def feed(self, text: str) -> ParsedDelta: ...

    @abstractmethod
    def finish(self) -> ParsedDelta: ...

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """Non-streaming: (content outside calls, stripped; complete calls)."""
        p = type(self)(self.tools)
        out = p.feed(text).extend(p.finish())
        return out.content.strip(), collect_tool_calls(out.tool_calls)


class SteppedToolCallParser(ToolCallParser):
    """A tool parser written as steps over its buffered text (`self._buf`, which the subclass sets up):
    `_step(out)` consumes what it can, appending to `out`, and returns False once it needs more text."""

    @abstractmethod
    def _step(self, out: ParsedDelta) -> bool: ...

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        while self._step(out):
            pass
        return out


class ThinkTagReasoningParser(ReasoningParser):
    """`<think>…</think>` reasoning, shared by most lines (override the tags as class attributes).

    The block counts only at the start of the output (leading whitespace allowed), or from the
    first character when starts_in_reasoning; a later tag is ordinary content. Newlines right
    inside the tags and right after the closing tag are dropped, as chat templates write them.
    Output that never closes the block is all reasoning. `end_markers`: text that also ends the block but
    belongs to the content (a model that opens its tool calls without closing its reasoning first).
    """
    start_tag = "<think>"
    end_tag = "</think>"
    end_markers: tuple[str, ...] = ()

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        super().__init__(starts_in_reasoning)
        self._state = "reasoning" if starts_in_reasoning else "start"
        self._buf = ""
        self._lead = True  # at the start of the reasoning / content section: drop newlines

    def feed(self, text: str) -> ParsedDelta:
        self._buf += text
        out = ParsedDelta()
        if self._state == "start":
            head = self._buf.lstrip()
            if head.startswith(self.start_tag):
                self._state, self._buf = "reasoning", head[len(self.start_tag):]
            elif not self.start_tag.startswith(head):  # not (a prefix of) the tag: plain content
                self._state, self._lead = "content", False
            else:
                return out
        if self._state == "reasoning":
            if self._lead:
                self._buf = self._buf.lstrip("\n")
                self._lead = not self._buf
            i, skip = self._buf.find(self.end_tag), len(self.end_tag)
            for marker in self.end_markers:
                k = self._buf.find(marker)
                if k >= 0 and (i < 0 or k < i):
                    i, skip = k, 0
            if i < 0:
                keep = partial_suffix_len(self._buf, [self.end_tag, *self.end_markers])
                emit = self._buf[:len(self._buf) - keep].rstrip("\n")  # trailing newlines may precede the tag
                out.reasoning, self._buf = emit, self._buf[len(emit):]
                return out
            out.reasoning = self._buf[:i].rstrip("\n")
            self._state, self._buf, self._lead = "content", self._buf[i + skip:], skip > 0
        if self._lead:
            self._buf = self._buf.lstrip("\n")
            self._lead = not self._buf
        out.content, self._buf = self._buf, ""
        return out

    def finish(self) -> ParsedDelta:
        buf, self._buf = self._buf, ""
        if self._state == "reasoning":
            return ParsedDelta(reasoning=buf.rstrip("\n"))
        return ParsedDelta(content=buf)


@dataclass
class ChatOutput:
    reasoning: str
    content: str
    tool_calls: list[ToolCall]


class OutputParser:
    """One choice's reasoning parser and tool parser chained (either may be absent). `prefix`: text the output is
    known to start with though the model never wrote it (a forced tool call's opener, which ended the prompt): parsed
    ahead of the first output, never part of the output text. `max_calls`: calls past this many are dropped
    (parallel_tool_calls false: 1)."""

    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallParser | None, prefix: str = "",
                 max_calls: int | None = None) -> None:
        self.reasoning, self.tools = reasoning, tools
        self._prefix = prefix
        self.max_calls = max_calls
        self._calls = 0   # calls seen (the next call's index)

    def _tools(self, out: ParsedDelta, final: bool) -> ParsedDelta:
        if self.tools is None:
            return out
        parsed = self.tools.feed(out.content)
        if final:
            parsed.extend(self._unclosed(self.tools.finish()))
        self._calls = max([self._calls] + [d.index + 1 for d in parsed.tool_calls])
        if self.max_calls is not None:
            parsed.tool_calls = [d for d in parsed.tool_calls if d.index < self.max_calls]
        return ParsedDelta(reasoning=out.reasoning).extend(parsed)

    def _unclosed(self, out: ParsedDelta) -> ParsedDelta:
        """The tool parser's last output with a call it gave back as content (cut where the format could not read
        it yet) as a call without a name or arguments."""
        tag = self.tools.start_tag if self.tools is not None else ""
        if not tag or (i := out.content.find(tag)) < 0:
            return out
        index = max([self._calls] + [d.index + 1 for d in out.tool_calls])
        out.content = out.content[:i].rstrip()
        out.tool_calls.append(ToolCallDelta(index, new_call_id(), ""))
        return out

    def feed(self, text: str) -> ParsedDelta:
        text, self._prefix = self._prefix + text, ""
        return self._tools(self.reasoning.feed(text) if self.reasoning else ParsedDelta(content=text), False)

    def finish(self) -> ParsedDelta:
        out = self.feed("") if self._prefix else ParsedDelta()
        return out.extend(self._tools(self.reasoning.finish() if self.reasoning else ParsedDelta(), True))


@dataclass(frozen=True)
class ChatFormat:
    """What a model line declares about its output text. assistant_prefix marks where the final
    assistant turn of a rendered prompt starts, so tags inside user text are not mistaken for an
    open reasoning block."""
    reasoning_parser: type[ReasoningParser] | None = None
    tool_parser: type[ToolCallParser] | None = None
    think_start: str = "<think>"
    think_end: str = "</think>"
    assistant_prefix: str | None = None

    def template_messages(self, messages: list[dict]) -> list[dict]:
        """The request's messages as this line's chat template expects them (a hook for template
        quirks, e.g. tool-call arguments the template wants as objects, not JSON text); raise
        ChatTemplateError for messages it cannot take."""
        return messages

    def _assistant_turn(self, prompt_text: str) -> str:
        """The rendered prompt from its final assistant turn on (all of it where the line marks none)."""
        if self.assistant_prefix is not None and (i := prompt_text.rfind(self.assistant_prefix)) >= 0:
            return prompt_text[i:]
        return prompt_text

    def starts_in_reasoning(self, prompt_text: str) -> bool:
        """True if the rendered prompt ends inside an open reasoning block."""
        if self.reasoning_parser is None:
            return False
        turn = self._assistant_turn(prompt_text)
        return turn.rfind(self.think_start) > turn.rfind(self.think_end)

    def reasoning_ahead(self, prompt_text: str) -> bool:
        """True if the output may still hold reasoning: the prompt ends inside an open block, or the line
        reasons and the final assistant turn has not closed a block (the model opens one itself)."""
        if self.reasoning_parser is None:
            return False
        turn = self._assistant_turn(prompt_text)
        return turn.rfind(self.think_start) >= turn.rfind(self.think_end)   # both absent: -1 >= -1

    def tool_call_opener(self, name: str | None) -> str | None:
        """The text that starts a tool call in this line's output, up to where the model writes the function's name
        (`name` None) or, given `name`, its arguments: what tool_choice "required" or a named function appends to
        the prompt. None where the line cannot force a call."""
        return None

    def tool_call_grammar(self, tools: list[dict], name: str | None, parallel: bool = True) -> str | None:
        """What the output may be after tool_call_opener(name), as a grammar in llguidance's Lark syntax
        (structured.lark_literal, lark_json): the rest of the call, its arguments valid against the function's
        `parameters` schema, and (`name` None and `parallel`, parallel_tool_calls) further calls. None leaves a forced
        call's arguments to the model."""
        return None

    def forced_tool_call(self, prompt_text: str, name: str | None) -> tuple[str, str] | None:
        """(text that first closes the prompt's reasoning, the call's opener) to append to a rendered prompt so that
        the output is a tool call (of `name`, or of a function the model picks); None where tool_call_opener is.
        An open reasoning block is closed, and where the model would open one it gets an empty one, as the chat
        templates write it with thinking off."""
        opener = self.tool_call_opener(name)
        if opener is None or self.reasoning_parser is None:
            return None if opener is None else ("", opener)
        if self.starts_in_reasoning(prompt_text):
            return f"\n{self.think_end}\n\n", opener
        ahead = self.reasoning_ahead(prompt_text)   # not open, so: the model would open one itself
        return (f"{self.think_start}\n\n{self.think_end}\n\n" if ahead else ""), opener

    def stream_parser(self, prompt_text: str, tools: list[dict] | None = None, prefix: str = "",
                      max_calls: int | None = None) -> OutputParser:
        """A fresh parser for one choice; pass tools only when the request allows tool calls, the forced call's
        opener (which ends prompt_text) as `prefix`, and 1 as `max_calls` to keep the first call only."""
        reasoning = self.reasoning_parser(self.starts_in_reasoning(prompt_text)) if self.reasoning_parser else None
        calls = self.tool_parser(tools) if self.tool_parser and tools else None
        return OutputParser(reasoning, calls, prefix, max_calls)

    def parse(self, prompt_text: str, text: str, tools: list[dict] | None = None, prefix: str = "") -> ChatOutput:
        """Non-streaming: the whole output of one choice."""
        p = self.stream_parser(prompt_text, tools, prefix)
        out = p.feed(text).extend(p.finish())
        return ChatOutput(out.reasoning, out.content.strip() if p.tools else out.content,
                          collect_tool_calls(out.tool_calls))
