"""Qwen3's chat format: `<think>` reasoning and Hermes-style JSON tool calls.

The model writes `<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>`
(several in a row are allowed). With enable_thinking=False the template has already written an
empty think block, so the output is plain content; by default the model opens `<think>` itself.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from openinfer.plugin_api import (JSON_DUMPS_LAYOUT, ChatFormat, ContentTrimmer, ParsedDelta, ThinkTagReasoningParser,
                                  ToolCallDelta, ToolCallParser, lark_json, lark_literal, new_call_id,
                                  partial_suffix_len)

# The genuine Qwen3 tokenizer vendored for the built-in demo model (see demo_tokenizer/NOTICE).
DEMO_TOKENIZER_DIR = Path(__file__).parent / "demo_tokenizer"

# The start of a call up to the arguments value: enough to stream the name before the call closes.
_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:')
# The name alone: all a call cut before its arguments has.
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


class Qwen3ReasoningParser(ThinkTagReasoningParser):
    """`<think>…</think>` (ids 151667/151668, special=false, so they survive detokenization)."""


def _load_call(body: str) -> tuple[str, str] | None:
    """(name, arguments JSON) of a well-formed call body, else None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


def _header_name(body: str, pattern: re.Pattern = _HEADER) -> tuple[str, int] | None:
    """(name, end of header) once the body has shown `{"name": "...", "arguments":` (`pattern` _NAME: `{"name": "..."`,
    the header of a call cut before its arguments)."""
    if (m := pattern.match(body)) is None:
        return None
    try:
        return json.loads(f'"{m.group(1)}"'), m.end()
    except ValueError:
        return None


def _args_text(raw: str) -> str:
    # Best effort for a call whose name was already streamed but whose JSON is broken: the text
    # after "arguments": without the outer brace, normalised when it parses.
    text = raw.strip()
    if text.endswith("}"):
        text = text[:-1].rstrip()
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return text


class Qwen3ToolCallParser(ToolCallParser):
    """Streams `<tool_call>{json}</tool_call>` blocks as ToolCallDeltas.

    The name is streamed as soon as `{"name": "...", "arguments":` is visible, which commits the
    call; its arguments follow when the call closes (normalised JSON, or the best-effort raw text
    if the JSON turns out broken). A block without that header that does not parse as a call is
    kept verbatim as content. Content is the text outside calls with the whitespace around calls
    and at both ends dropped.
    """
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def __init__(self, tools: list[dict]) -> None:
        super().__init__(tools)
        self._buf = ""
        self._in_call = False
        self._content = ContentTrimmer()
        self._index = 0
        self._id = ""
        self._header: tuple[str, int] | None = None  # (name, header end) once the name was streamed

    def _text(self, out: ParsedDelta, text: str, before_call: bool) -> None:
        self._content.emit(out, text, before_call)

    def _close(self, out: ParsedDelta, body: str, verbatim: str, cut: bool = False) -> None:
        header = self._header or _header_name(body)
        if header is None and cut and (named := _header_name(body, _NAME)) is not None:
            header = named[0], len(body)   # cut before its arguments: it has none yet
        call = _load_call(body)
        if header is None and call is None:
            self._text(out, verbatim, before_call=False)
            return
        if header is None:
            out.tool_calls.append(ToolCallDelta(self._index, self._id, call[0], call[1]))
        else:
            if self._header is None:
                out.tool_calls.append(ToolCallDelta(self._index, self._id, header[0]))
            args = call[1] if call else _args_text(body[header[1]:])
            out.tool_calls.append(ToolCallDelta(self._index, arguments=args))
        self._index += 1

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buf += text
        while True:
            if not self._in_call:
                i = self._buf.find(self.start_tag)
                if i < 0:
                    cut = len(self._buf) - partial_suffix_len(self._buf, [self.start_tag])
                    self._text(out, self._buf[:cut], before_call=False)
                    self._buf = self._buf[cut:]
                    return out
                self._text(out, self._buf[:i], before_call=True)
                self._buf = self._buf[i + len(self.start_tag):]
                self._in_call, self._id, self._header = True, new_call_id(), None
                continue
            j = self._buf.find(self.end_tag)
            if j < 0:
                if self._header is None and (header := _header_name(self._buf)) is not None:
                    self._header = header
                    out.tool_calls.append(ToolCallDelta(self._index, self._id, header[0]))
                return out
            body = self._buf[:j]
            self._close(out, body, self.start_tag + body + self.end_tag)
            self._buf, self._in_call = self._buf[j + len(self.end_tag):], False

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._in_call:  # unclosed call (truncated output): close it as far as it goes
            body = self._buf[:len(self._buf) - partial_suffix_len(self._buf, [self.end_tag])]
            self._close(out, body, self.start_tag + self._buf, cut=True)
        else:
            self._text(out, self._buf, before_call=False)
        self._buf, self._content.held, self._in_call = "", "", False
        return out


class Qwen3ChatFormat(ChatFormat):
    def tool_call_opener(self, name: str | None) -> str | None:
        """`<tool_call>\n{"name": "` (the model names the function), or with the name, up to its arguments' value."""
        return '<tool_call>\n{"name": ' + ('"' if name is None else f'{json.dumps(name, ensure_ascii=False)}, "arguments": ')

    def tool_call_grammar(self, tools: list[dict], name: str | None, parallel: bool = True) -> str | None:
        """After the opener: the named function's arguments and the call's end; or one of the functions' names
        with its arguments, and (`parallel`) as many further calls as the model writes (the template's newline
        between them)."""
        end = lark_literal("}\n</tool_call>")
        fns = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}
        if name is not None:
            return f"start: {lark_json(fns[name], JSON_DUMPS_LAYOUT)} {end}"
        # each name's JSON text after its opening quote, then its arguments: `get_weather", "arguments": {...}`
        heads = {n: lark_literal(json.dumps(n, ensure_ascii=False)[1:] + ', "arguments": ') for n in fns}
        calls = " | ".join(f"{heads[n]} {lark_json(schema, JSON_DUMPS_LAYOUT)} {end}" for n, schema in fns.items())
        again = lark_literal("\n" + self.tool_call_opener(None))
        return f"start: call{f' ({again} call)*' if parallel else ''}\ncall: {calls}"


QWEN3_CHAT_FORMAT = Qwen3ChatFormat(
    reasoning_parser=Qwen3ReasoningParser,
    tool_parser=Qwen3ToolCallParser,
    assistant_prefix="<|im_start|>assistant",
)
