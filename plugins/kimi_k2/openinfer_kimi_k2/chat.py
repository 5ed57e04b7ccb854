"""Kimi-K2's chat format: its section-token tool calls and `<think>` reasoning (the Thinking variants).

The model writes calls as (one line here; the model writes no newlines between the tokens)

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_call_begin|>…<|tool_call_end|><|tool_calls_section_end|>

The id `functions.NAME:IDX` names the function and IDX counts the conversation's calls. It is the tool call's id in
the API, unchanged, because the chat template writes it back into later turns (`<|tool_call_begin|>{id}`, and a
tool result's `## Return of {id}`): the model must see its own ids there. Ids that clients made up are rewritten
into that form before rendering (KimiChatFormat.template_messages), consistently in the calls and their results.

The Thinking variants write `<think>…</think>` before the answer, and are known to open the tool-call section
without closing the reasoning first: the section token ends the reasoning, so those calls still come back as tool
calls. Both spellings of the section tokens that Kimi checkpoints have used are accepted.
"""
from __future__ import annotations

import re

from openinfer.plugin_api import (ChatFormat, ContentTrimmer, JSON_DUMPS_LAYOUT, ParsedDelta, SteppedToolCallParser,
                                  ThinkTagReasoningParser, ToolCallDelta, lark_json, lark_literal, partial_suffix_len)

SECTION_BEGINS = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
SECTION_ENDS = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
CALL_BEGIN, ARGS_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
ASSISTANT_PREFIX = "<|im_assistant|>assistant<|im_middle|>"
KIMI_ID = re.compile(r"functions\.[^:\s]+:\d+")


def call_name(call_id: str) -> str:
    """The function name inside a call id `functions.NAME:IDX`, as Kimi's own parser reads it."""
    head = call_id.strip().rsplit(":", 1)[0]
    return head[len("functions."):] if head.startswith("functions.") else head.split(".")[-1]


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    """(the first position of any of `tags` in text, that tag), or (-1, "")."""
    hits = [(i, t) for t in tags if (i := text.find(t)) >= 0]
    return min(hits) if hits else (-1, "")


class KimiReasoningParser(ThinkTagReasoningParser):
    """`<think>…</think>`; a tool-call section opened inside the reasoning ends it and goes on as content."""
    end_markers = SECTION_BEGINS


class KimiToolCallParser(SteppedToolCallParser):
    """Streams the calls of a tool-call section as ToolCallDeltas: a call's id and name once its id is complete,
    then its arguments as they arrive (raw JSON text, as the model writes it). Text outside the section is content
    (whitespace around the section dropped, as ContentTrimmer does)."""

    def __init__(self, tools: list[dict]) -> None:
        super().__init__(tools)
        self._buf = ""
        self._state = "text"          # text | section | id | args
        self._content = ContentTrimmer()
        self._index = 0
        self._args_started = False

    def _call_args(self, out: ParsedDelta, text: str) -> None:
        if not self._args_started:
            text = text.lstrip()
            self._args_started = bool(text)
        if text:
            out.tool_calls.append(ToolCallDelta(self._index, arguments=text))

    def _step(self, out: ParsedDelta) -> bool:
        buf = self._buf
        if self._state == "text":
            i, tag = _first(buf, SECTION_BEGINS)
            if i < 0:
                cut = len(buf) - partial_suffix_len(buf, list(SECTION_BEGINS))
                self._content.emit(out, buf[:cut], before_call=False)
                self._buf = buf[cut:]
                return False
            self._content.emit(out, buf[:i], before_call=True)
            self._buf, self._state = buf[i + len(tag):], "section"
            return True
        if self._state == "section":
            i, tag = _first(buf, (CALL_BEGIN, *SECTION_ENDS))
            if i < 0:   # whatever else the model writes inside the section is not content; keep a partial tag
                self._buf = buf[len(buf) - partial_suffix_len(buf, [CALL_BEGIN, *SECTION_ENDS]):]
                return False
            self._buf = buf[i + len(tag):]
            self._state = "id" if tag == CALL_BEGIN else "text"
            return True
        if self._state == "id":
            i = buf.find(ARGS_BEGIN)
            if i < 0:
                return False
            call_id = buf[:i].strip()
            out.tool_calls.append(ToolCallDelta(self._index, call_id, call_name(call_id)))
            self._buf, self._state, self._args_started = buf[i + len(ARGS_BEGIN):], "args", False
            return True
        # args: up to the call's end (or, leniently, the section's end)
        i, tag = _first(buf, (CALL_END, *SECTION_ENDS))
        if i < 0:   # stream what cannot be the end: not a partial tag, nor whitespace that may precede one
            body = buf[:len(buf) - partial_suffix_len(buf, [CALL_END, *SECTION_ENDS])].rstrip()
            self._call_args(out, body)
            self._buf = buf[len(body):]
            return False
        self._call_args(out, buf[:i].rstrip())
        self._index += 1
        self._buf = buf[i + len(CALL_END):] if tag == CALL_END else buf[i:]
        self._state = "section"
        return True

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._state == "text":
            self._content.emit(out, self._buf, before_call=False)
        elif self._state == "id" and self._buf.strip():   # cut off inside a call's id: the call as far as it goes
            call_id = self._buf.strip()
            out.tool_calls.append(ToolCallDelta(self._index, call_id, call_name(call_id)))
        elif self._state == "args":
            self._call_args(out, self._buf.rstrip())
        self._buf, self._content.held, self._state = "", "", "text"
        return out


def _opener(name: str | None, idx: int) -> str:
    head = SECTION_BEGINS[0] + CALL_BEGIN + "functions."
    return head if name is None else f"{head}{name}:{idx}{ARGS_BEGIN}"


class KimiChatFormat(ChatFormat):
    def template_messages(self, messages: list[dict]) -> list[dict]:
        """Tool-call ids that are not `functions.NAME:IDX` (made up by a client) rewritten into that form, IDX
        counting the conversation's calls, and the tool results that answer them renamed alike."""
        renamed: dict[str, str] = {}
        out, count = [], 0
        for m in messages:
            calls = m.get("tool_calls") if m.get("role") == "assistant" else None
            if calls:
                fixed = []
                for call in calls:
                    cid = call.get("id") or ""
                    name = (call.get("function") or {}).get("name") or ""
                    if not KIMI_ID.fullmatch(cid):
                        new = f"functions.{name}:{count}"
                        renamed[cid] = new
                        call = {**call, "id": new}
                    fixed.append(call)
                    count += 1
                m = {**m, "tool_calls": fixed}
            elif m.get("role") == "tool" and m.get("tool_call_id") in renamed:
                m = {**m, "tool_call_id": renamed[m["tool_call_id"]]}
            out.append(m)
        return out

    def tool_call_opener(self, name: str | None) -> str | None:
        """The section and call tokens, then `functions.` (the model names the function) or, given the name, the
        whole id (IDX 0; forced_tool_call numbers it after the conversation's calls) and the arguments' token."""
        return _opener(name, 0)

    def forced_tool_call(self, prompt_text: str, name: str | None) -> tuple[str, str] | None:
        """The opener, its call numbered after the conversation's earlier calls; an open reasoning block is closed
        first (no empty block is added: a forced call comes before any reasoning)."""
        before = self.think_end if self.starts_in_reasoning(prompt_text) else ""
        return before, _opener(name, prompt_text.count(CALL_BEGIN))

    def tool_call_grammar(self, tools: list[dict], name: str | None, parallel: bool = True) -> str | None:
        """After the opener: the named function's arguments, the call's and the section's end; or one of the
        functions' `NAME:IDX` ids with its arguments, then the ends. One call whatever `parallel` says: llguidance
        (1.x) refused the section's end after a call wherever a further call could also start there (the two tokens
        share their first bytes, `<|tool_call`), so a forced section holds exactly one call."""
        fns = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}
        end = f"{lark_literal(CALL_END)} {lark_literal(SECTION_ENDS[0])}"
        if name is not None:
            return f"start: {lark_json(fns[name], JSON_DUMPS_LAYOUT)} {end}"
        calls = " | ".join(f"{lark_literal(n + ':')} IDX {lark_literal(ARGS_BEGIN)} {lark_json(schema, JSON_DUMPS_LAYOUT)}"
                           for n, schema in fns.items())
        return f"start: call {end}\ncall: {calls}\nIDX: /[0-9]{{1,6}}/"


KIMI_CHAT_FORMAT = KimiChatFormat(
    reasoning_parser=KimiReasoningParser,
    tool_parser=KimiToolCallParser,
    assistant_prefix=ASSISTANT_PREFIX,
)
