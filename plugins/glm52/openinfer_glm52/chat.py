"""GLM-5.x's chat format: `<think>` reasoning opened by the prompt, `<arg_key>` / `<arg_value>` tool calls.

The chat template (chat_template.jinja) ends the prompt with `<|assistant|><think>` (thinking on, the
default), so the output starts inside the reasoning block; with enable_thinking=False it ends with the
empty block `<think></think>` and the output is plain content. A tool call reads

    <tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>

(GLM-4.5 put newlines between the parts; both are read). String values are raw text, others JSON; the
request's schema of each parameter gives a value its JSON type. A model that starts a call without
closing its reasoning block still gets the call: `<tool_call>` ends the block.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openinfer.plugin_api import (JSON_DUMPS_LAYOUT, ChatFormat, ContentTrimmer, ParsedDelta, ReasoningParser,
                                  SteppedToolCallParser, ThinkTagReasoningParser, ToolCallDelta, ToolCallParser,
                                  convert_value, is_text, lark_json, lark_literal, new_call_id, param_types,
                                  partial_suffix_len, schema_types, with_object_arguments)

CHAT_TEMPLATE = Path(__file__).parent / "chat_template.jinja"

_CALL, _END = "<tool_call>", "</tool_call>"
_KEY, _KEY_END, _VALUE, _VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_NAME_END = re.compile(r"[<\n]")


class Glm52ReasoningParser(ThinkTagReasoningParser):
    """`<think>…</think>`; a tool call opened inside the block ends it (the call is content, then parsed)."""
    end_markers = (_CALL,)


def _untyped_value(text: str) -> Any:
    """A value whose parameter has no declared type: JSON where it parses as a non-string (the template
    writes non-strings with tojson), else the text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return text if isinstance(value, str) else value


class Glm52ToolCallParser(SteppedToolCallParser):
    """Streams `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>` as ToolCallDeltas.

    A call's id and name go out once the name is complete (at the first `<` or newline after it); each
    argument goes out when its value closes, typed by the tool's schema (`{"city": "Paris"`, `, "days": 3`),
    and `}` when the call closes, so the arguments read like json.dumps; a call without arguments gives `{}`.
    A block without a name is kept verbatim as content; a call cut off by the end of the output is closed as
    far as it goes. Content is the text outside calls without the whitespace around calls and at both ends.
    """

    def __init__(self, tools: list[dict]) -> None:
        super().__init__(tools)
        self._types = param_types(tools)
        self._buf = ""
        self._state = "text"       # text | name | args | key | value
        self._content = ContentTrimmer()
        self._index = 0
        self._fn_types: dict[str, list[str]] = {}
        self._params = 0
        self._key = ""

    def _emit_args(self, out: ParsedDelta, text: str) -> None:
        out.tool_calls.append(ToolCallDelta(self._index, arguments=text))

    def _close_call(self, out: ParsedDelta) -> None:
        self._emit_args(out, "}" if self._params else "{}")
        self._index, self._state = self._index + 1, "text"

    def _close_value(self, out: ParsedDelta, raw: str) -> None:
        types = self._fn_types.get(self._key, [])
        if not types:
            value = _untyped_value(raw)
        else:   # the template writes None as `null` whatever the other types are
            value = None if "null" in types and raw.strip() == "null" else convert_value(raw, types)
        head = ("{" if self._params == 0 else ", ") + json.dumps(self._key, ensure_ascii=False) + ": "
        self._emit_args(out, head + json.dumps(value, ensure_ascii=False))
        self._params += 1
        self._state = "args"

    def _step(self, out: ParsedDelta) -> bool:
        """Advance over the buffer once; False when more text is needed."""
        buf = self._buf
        if self._state == "text":
            i = buf.find(_CALL)
            if i < 0:
                cut = len(buf) - partial_suffix_len(buf, [_CALL])
                self._content.emit(out, buf[:cut], before_call=False)
                self._buf = buf[cut:]
                return False
            self._content.emit(out, buf[:i], before_call=True)
            self._buf, self._state = buf[i + len(_CALL):], "name"
            return True
        if self._state == "name":
            m = _NAME_END.search(buf.lstrip())
            if m is None:
                return False
            head = buf.lstrip()
            name = head[:m.start()].strip()
            if not name:   # no function name: the block is text after all, kept when it closes
                j = buf.find(_END)
                if j < 0:
                    return False
                self._content.emit(out, _CALL + buf[:j + len(_END)], before_call=False)
                self._buf, self._state = buf[j + len(_END):], "text"
                return True
            out.tool_calls.append(ToolCallDelta(self._index, new_call_id(), name))
            self._fn_types, self._params = self._types.get(name, {}), 0
            self._buf, self._state = head[m.start():], "args"
            return True
        if self._state == "args":
            head = buf.lstrip()
            for tag, state in ((_KEY, "key"), (_END, None), (_CALL, None)):
                if head.startswith(tag):
                    if state == "key":
                        self._buf, self._state = head[len(tag):], "key"
                    else:   # `</tool_call>`, or the next call began without closing this one
                        self._close_call(out)
                        self._buf = head[len(tag):] if tag == _END else head
                    return True
            if any(tag.startswith(head) for tag in (_KEY, _END, _CALL)):
                return False
            nxt = head.find("<", 1)   # stray text between arguments: skip it
            self._buf = head[nxt:] if nxt > 0 else ""
            return nxt > 0
        if self._state == "key":
            j = buf.find(_KEY_END)
            if j < 0:
                return False
            self._key, rest = buf[:j].strip(), buf[j + len(_KEY_END):].lstrip()
            if not rest.startswith(_VALUE):
                if _VALUE.startswith(rest):
                    return False
                self._buf, self._state = rest, "args"   # a key without a value: dropped
                return True
            self._buf, self._state = rest[len(_VALUE):], "value"
            return True
        # state "value": up to its closing tag, or leniently to where the call ends
        ends = [(j, tag) for tag in (_VALUE_END, _END) if (j := buf.find(tag)) >= 0]
        if not ends:
            return False
        j, tag = min(ends)
        self._close_value(out, buf[:j])
        self._buf = buf[j + len(tag):] if tag == _VALUE_END else buf[j:]
        return True

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        buf = self._buf
        if self._state == "text":
            self._content.emit(out, buf, before_call=False)
        elif self._state == "name":
            name = buf.strip()
            if name:   # cut off right after the name: a call without arguments
                out.tool_calls.append(ToolCallDelta(self._index, new_call_id(), name))
                self._params = 0
                self._close_call(out)
            else:
                self._content.emit(out, _CALL + buf, before_call=False)
        else:   # cut off inside the call: close it as far as it goes
            if self._state == "value":
                self._close_value(out, buf[:len(buf) - partial_suffix_len(buf, [_VALUE_END, _END])])
            self._close_call(out)
        self._buf, self._content.held, self._state = "", "", "text"
        return out


@dataclass(frozen=True)
class Glm52ChatFormat(ChatFormat):
    reasoning_parser: type[ReasoningParser] | None = Glm52ReasoningParser
    tool_parser: type[ToolCallParser] | None = Glm52ToolCallParser
    assistant_prefix: str | None = "<|assistant|>"

    def template_messages(self, messages: list[dict]) -> list[dict]:
        """Assistant tool calls with their JSON-text arguments parsed into objects (the template iterates them)."""
        return [with_object_arguments(m) for m in messages]

    def forced_tool_call(self, prompt_text: str, name: str | None) -> tuple[str, str] | None:
        """As ChatFormat's, in GLM's layout: no newlines around the think tags (`</think>`, `<think></think>`)."""
        opener = self.tool_call_opener(name)
        if self.starts_in_reasoning(prompt_text):
            return self.think_end, opener
        return (self.think_start + self.think_end if self.reasoning_ahead(prompt_text) else ""), opener

    def tool_call_opener(self, name: str | None) -> str | None:
        """`<tool_call>` (the model names the function), or with the name, up to its first argument."""
        return _CALL + ("" if name is None else name)

    def tool_call_grammar(self, tools: list[dict], name: str | None, parallel: bool = True) -> str | None:
        """After the opener, a call as the template writes one: the declared arguments in the schema's order (the
        required ones present), each `<arg_key>K</arg_key><arg_value>V</arg_value>`, then `</tool_call>`; for
        "required" the function's name first and (`parallel`) further calls after. A text argument (string or
        untyped) is free text up to its closing tag; a typed one is JSON valid against its schema. A function that
        declares no properties takes any arguments as text."""
        fns = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
        rules = [f"text[suffix={lark_literal(_VALUE_END)}]: /(.|\\n)*/",
                 f"any_arg: {lark_literal(_KEY)} /[^<]+/ {lark_literal(_KEY_END + _VALUE)} text"]
        for i, fn in enumerate(fns):
            params = fn.get("parameters") or {}
            props, required = params.get("properties") or {}, set(params.get("required") or [])
            items = []
            for j, (p, schema) in enumerate(props.items()):
                value = "text" if is_text(schema_types(schema)) else \
                    f"{lark_json(schema, JSON_DUMPS_LAYOUT)} {lark_literal(_VALUE_END)}"
                rules.append(f"a{i}_{j}: {lark_literal(_KEY + p + _KEY_END + _VALUE)} {value}")
                items.append(f"a{i}_{j}" if p in required else f"a{i}_{j}?")
            head = "" if name is not None else lark_literal(fn["name"]) + " "
            rules.append(f"call{i}: {head}{' '.join(items) if props else 'any_arg*'} {lark_literal(_END)}")
        if name is not None:
            return "\n".join(["start: call0", *rules])
        calls = " | ".join(f"call{i}" for i in range(len(fns)))
        again = f" ({lark_literal(_CALL)} call)*" if parallel else ""
        return "\n".join([f"start: call{again}", f"call: {calls}", *rules])


GLM52_CHAT_FORMAT = Glm52ChatFormat()
