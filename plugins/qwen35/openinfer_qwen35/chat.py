"""Qwen3.5's chat format: `<think>` reasoning opened by the prompt, Qwen3-Coder XML tool calls.

The chat template ends the prompt with `<|im_start|>assistant\\n<think>\\n` (thinking on, the default),
so the output starts inside the reasoning block; with enable_thinking=False it ends with an empty
closed block and the output is plain content. Tool calls look like

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are text; the request's JSON schema of each parameter gives them their JSON type.
The template renders an assistant turn's tool-call arguments with `|items`, so it needs them as an
object, while OpenAI clients send them back as JSON text (Qwen35ChatFormat.template_messages).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from openinfer.plugin_api import (JSON_DUMPS_LAYOUT, ChatFormat, ContentTrimmer, ParsedDelta,
                                  ReasoningParser, ThinkTagReasoningParser, SteppedToolCallParser, ToolCallDelta,
                                  ToolCallParser, convert_value,
                                  is_text, lark_json, lark_literal, new_call_id, param_types, partial_suffix_len,
                                  schema_types, with_object_arguments)

# The genuine Qwen3.5 tokenizer (built by tokenizer_build.py) and chat template; see tokenizer/NOTICE.
TOKENIZER_DIR = Path(__file__).parent / "tokenizer"

_FUNCTION = re.compile(r"<function=([^>\n]*)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>")
# A value ends at its closing tag or, leniently, where the next parameter or the call begins/ends.
_VALUE_ENDS = ("</parameter>", "<parameter=", "</function>", "</tool_call>")
_VALUE_END, _CALL_END = "\n</parameter>\n", "</function>\n</tool_call>"   # as the template closes them


class Qwen35ReasoningParser(ThinkTagReasoningParser):
    """`<think>…</think>` (ids 248068/248069, special=false, so they survive detokenization)."""


def _escape(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]  # per character, so chunks concatenate


class Qwen35ToolCallParser(SteppedToolCallParser):
    """Streams `<tool_call><function=…><parameter=…>…</parameter></function></tool_call>` blocks.

    A call's id and name go out when `<function=NAME>` is complete; its arguments are streamed as
    JSON text: string (and untyped) parameters character by character as they arrive, typed ones
    (integer, number, boolean, object, array, per the tool's schema) when the value is complete,
    `}` when the function closes. Output arguments read like json.dumps: `{"city": "Paris", "days": 3}`.
    One value newline on each side is the template's framing and is dropped. A block without a
    function is kept verbatim as content; a call cut off by the end of output is closed as far as
    it goes. Content is the text outside calls without the whitespace around calls and at both ends.
    """
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def __init__(self, tools: list[dict]) -> None:
        super().__init__(tools)
        self._types = param_types(tools)
        self._buf = ""
        self._state = "text"   # text | block (awaiting a function) | params | value
        self._content = ContentTrimmer()
        self._index = 0
        self._block_calls = 0  # functions seen in the current <tool_call> block
        self._fn_types: dict[str, list[str]] = {}
        self._params = 0       # parameters written in the current call
        self._param_types: list[str] = []
        self._key = ""         # `{"name": ` or `, "name": ` of the current parameter
        self._text_value = False
        self._value_started = False

    # ---- content outside calls (as Qwen3ToolCallParser) ----
    def _text(self, out: ParsedDelta, text: str, before_call: bool) -> None:
        self._content.emit(out, text, before_call)

    # ---- calls ----
    def _args(self, out: ParsedDelta, text: str) -> None:
        out.tool_calls.append(ToolCallDelta(self._index, arguments=text))

    def _open_call(self, out: ParsedDelta, name: str) -> None:
        out.tool_calls.append(ToolCallDelta(self._index, new_call_id(), name))
        self._fn_types = self._types.get(name, {})
        self._params, self._block_calls, self._state = 0, self._block_calls + 1, "params"

    def _close_call(self, out: ParsedDelta) -> None:
        self._args(out, "}" if self._params else "{}")
        self._index += 1

    def _open_param(self, out: ParsedDelta, name: str) -> None:
        self._param_types = self._fn_types.get(name, [])
        self._text_value = is_text(self._param_types)
        self._value_started = False
        self._key = ("{" if self._params == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": "
        self._params += 1
        if self._text_value:
            self._args(out, self._key + '"')
        self._state = "value"

    def _stream_value(self, out: ParsedDelta, text: str, final: bool) -> str:
        """Emit what can be emitted of a string value; returns the text still held back."""
        if not self._value_started and text:
            self._value_started = True
            if text.startswith("\n"):
                text = text[1:]
        hold = text.endswith("\n") and not final  # may be the framing newline before the close tag
        emit = text[:-1] if text.endswith("\n") else text
        if emit:
            self._args(out, _escape(emit))
        if final:
            self._args(out, '"')
            return ""
        return "\n" if hold else ""

    def _close_value(self, out: ParsedDelta, raw: str) -> None:
        if self._text_value:
            self._stream_value(out, raw, final=True)
        else:
            raw = raw[1:] if raw.startswith("\n") else raw
            raw = raw[:-1] if raw.endswith("\n") else raw
            self._args(out, self._key + json.dumps(convert_value(raw, self._param_types), ensure_ascii=False))
        self._state = "params"

    def _step(self, out: ParsedDelta) -> bool:
        """Advance the state machine over the buffer once; False when it needs more text."""
        buf = self._buf
        if self._state == "text":
            i = buf.find(self.start_tag)
            if i < 0:
                cut = len(buf) - partial_suffix_len(buf, [self.start_tag])
                self._text(out, buf[:cut], before_call=False)
                self._buf = buf[cut:]
                return False
            self._text(out, buf[:i], before_call=True)
            self._buf, self._state, self._block_calls = buf[i + len(self.start_tag):], "block", 0
            return True
        if self._state == "value":
            ends = [(j, tag) for tag in _VALUE_ENDS if (j := buf.find(tag)) >= 0]
            if ends:
                j, tag = min(ends)
                self._close_value(out, buf[:j])
                self._buf = buf[j + len(tag):] if tag == "</parameter>" else buf[j:]
                return True
            if self._text_value:
                cut = len(buf) - partial_suffix_len(buf, list(_VALUE_ENDS))
                self._buf = self._stream_value(out, buf[:cut], final=False) + buf[cut:]
            return False
        head = buf.lstrip()
        skipped = buf[:len(buf) - len(head)]
        if head.startswith(self.end_tag):
            if self._state == "params":
                self._close_call(out)
            elif self._block_calls == 0:  # no function in the block: it was text after all
                self._text(out, self.start_tag + buf[:len(skipped) + len(self.end_tag)], before_call=False)
            self._buf, self._state = head[len(self.end_tag):], "text"
            return True
        if self._state == "params":
            if head.startswith("</function>"):
                self._close_call(out)
                self._buf, self._state = head[len("</function>"):], "block"
                return True
            if head.startswith(("<function=", self.start_tag)):  # the next call began without closing this one
                self._close_call(out)
                self._buf, self._state = head, "block"
                return True
            if m := _PARAMETER.match(head):
                self._open_param(out, m.group(1).strip())
                self._buf = head[m.end():]
                return True
            if _partial(head, ("<parameter=", "</function>", self.end_tag, "<function=", self.start_tag)):
                return False
            nxt = head.find("<", 1)  # stray text between parameters: skip it
            self._buf = head[nxt:] if nxt > 0 else ""
            return nxt > 0
        # state "block": a function must come next
        if head.startswith(self.start_tag):  # a new block although this one was not closed
            self._buf, self._block_calls = head[len(self.start_tag):], 0
            return True
        if (m := _FUNCTION.match(head)) and m.group(1).strip():
            self._open_call(out, m.group(1).strip())
            self._buf = head[m.end():]
            return True
        if _partial(head, ("<function=", self.end_tag, self.start_tag)):
            return False
        if self._block_calls:  # junk after a call inside the block: skip to the next tag
            nxt = head.find("<", 1)
            self._buf = head[nxt:] if nxt > 0 else ""
            return nxt > 0
        j = buf.find(self.end_tag)  # not a call: held until the block ends, then kept verbatim
        if j < 0:
            return False
        self._text(out, self.start_tag + buf[:j + len(self.end_tag)], before_call=False)
        self._buf, self._state = buf[j + len(self.end_tag):], "text"
        return True

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._state == "text":
            self._text(out, self._buf, before_call=False)
        elif self._state == "block" and self._block_calls == 0:
            self._text(out, self.start_tag + self._buf, before_call=False)
        elif self._state in ("params", "value"):  # cut off mid-call: close it as far as it goes
            if self._state == "value":
                self._close_value(out, self._buf[:len(self._buf) - partial_suffix_len(self._buf, list(_VALUE_ENDS))])
            self._close_call(out)
        self._buf, self._content.held, self._state = "", "", "text"
        return out


def _partial(head: str, tags: tuple[str, ...]) -> bool:
    """True while `head` may still become one of `tags` (a prefix of one, or an unfinished
    `<function=…` / `<parameter=…` header)."""
    for tag in tags:
        if tag.startswith(head):
            return True
        if tag.endswith("=") and head.startswith(tag) and ">" not in head and "\n" not in head:
            return True
    return False


@dataclass(frozen=True)
class Qwen35ChatFormat(ChatFormat):
    reasoning_parser: type[ReasoningParser] | None = Qwen35ReasoningParser
    tool_parser: type[ToolCallParser] | None = Qwen35ToolCallParser
    assistant_prefix: str | None = "<|im_start|>assistant"

    def template_messages(self, messages: list[dict]) -> list[dict]:
        """Assistant tool calls with their JSON-text arguments parsed into objects, which the
        template iterates over (`arguments|items`)."""
        return [with_object_arguments(m) for m in messages]

    def tool_call_opener(self, name: str | None) -> str | None:
        """`<tool_call>\n<function=` (the model names the function), or with the name, up to its first parameter."""
        return "<tool_call>\n<function=" + ("" if name is None else f"{name}>\n")

    def tool_call_grammar(self, tools: list[dict], name: str | None, parallel: bool = True) -> str | None:
        """After the opener, a call as the template writes one: the declared parameters in the schema's order
        (the required ones present), each `<parameter=P>\\n` value `\\n</parameter>\\n`, then `</function>\\n
        </tool_call>`; for "required" the function's name first and (`parallel`) further calls after. A text
        parameter's value (string or untyped) is free text up to its closing tag; a typed one is JSON valid against
        its schema, as the template's tojson writes it. A function that declares no properties takes any parameters
        as text."""
        fns = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
        rules = [f'text[suffix={lark_literal(_VALUE_END)}]: /(.|\\n)*/',   # up to (and with) the closing tag
                 'any_param: "<parameter=" /[^>\\n]+/ ">\\n" text']
        for i, fn in enumerate(fns):
            params = fn.get("parameters") or {}
            props, required = params.get("properties") or {}, set(params.get("required") or [])
            items = []
            for j, (p, schema) in enumerate(props.items()):
                value = "text" if is_text(schema_types(schema)) else \
                    f"{lark_json(schema, JSON_DUMPS_LAYOUT)} {lark_literal(_VALUE_END)}"
                tag = lark_literal(f"<parameter={p}>\n")
                rules.append(f"p{i}_{j}: {tag} {value}")
                items.append(f"p{i}_{j}" if p in required else f"p{i}_{j}?")
            head = "" if name is not None else lark_literal(fn["name"] + ">\n") + " "
            rules.append(f"call{i}: {head}{' '.join(items) if props else 'any_param*'} {lark_literal(_CALL_END)}")
        if name is not None:   # the named function's call alone (the opener wrote its name)
            return "\n".join(["start: call0", *rules])
        again = lark_literal("\n" + self.tool_call_opener(None))
        calls = " | ".join(f"call{i}" for i in range(len(fns)))
        return "\n".join([f"start: call{f' ({again} call)*' if parallel else ''}", f"call: {calls}", *rules])
