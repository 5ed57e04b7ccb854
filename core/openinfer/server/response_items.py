"""A response's output items, built from one choice's parsed output deltas (reasoning, content, tool calls)
together with the stream events that build them, so a streamed response ends with exactly the items a
non-streamed one has (the endpoint feeds both the same deltas; the latter drops the events).

An item opens when its kind of output starts (output_item.added, then content_part.added for text) and is
done (…done events, output_item.done) when another kind starts or the output ends. Shapes follow OpenAI's:
reasoning {id rs_…, summary [], content [reasoning_text]}, message {id msg_…, content [output_text]},
function_call {id fc_…, call_id, name, arguments}.
"""
from __future__ import annotations

import copy
import uuid
from typing import Any

from openinfer.text.parsers import ParsedDelta, ToolCallDelta

Event = dict[str, Any]   # one stream event, before its sequence_number
# per text kind: the item's id prefix, its part type and the delta / done event names
_TEXT = {"reasoning": ("rs", "reasoning_text", "response.reasoning_text"),
         "message": ("msg", "output_text", "response.output_text")}


class OutputItems:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}   # the parser's call index -> its item

    def feed(self, d: ParsedDelta) -> list[Event]:
        events = []
        if d.reasoning:
            events += self._text("reasoning", d.reasoning)
        if d.content:
            events += self._text("message", d.content)
        for call in d.tool_calls:
            events += self._call(call)
        return events

    def finish(self, status: str) -> list[Event]:
        """Close the output: the open item ends with `status` ("incomplete" when cut short); an output with no
        items gets an empty message, as chat answers content ""."""
        if not self.items:
            return self._add(self._text_item("message")) + self._close(status)
        return self._close(status)

    def _at(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.items.index(item)}

    def _add(self, item: dict[str, Any]) -> list[Event]:
        events = self._close("completed")
        self.items.append(item)
        self._open = item
        added = copy.deepcopy(item)
        if "content" in added:
            added["content"] = []   # its part comes with content_part.added
        events.append({"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": added})
        if "content" in item:
            events.append({"type": "response.content_part.added", **self._at(item), "content_index": 0,
                           "part": copy.deepcopy(item["content"][0])})
        return events

    def _text_item(self, kind: str) -> dict[str, Any]:
        prefix, part, _ = _TEXT[kind]
        if kind == "reasoning":
            return {"type": "reasoning", "id": f"{prefix}_{uuid.uuid4().hex}", "summary": [],
                    "content": [{"type": part, "text": ""}]}
        return {"type": "message", "id": f"{prefix}_{uuid.uuid4().hex}", "status": "in_progress",
                "role": "assistant", "content": [{"type": part, "text": "", "annotations": []}]}

    def _text(self, kind: str, text: str) -> list[Event]:
        item = self._open
        events = []
        if item is None or item["type"] != kind:
            item = self._text_item(kind)
            events = self._add(item)
        item["content"][0]["text"] += text
        delta: Event = {"type": _TEXT[kind][2] + ".delta", **self._at(item), "content_index": 0, "delta": text}
        if kind == "message":
            delta["logprobs"] = []
        return [*events, delta]

    def _call(self, d: ToolCallDelta) -> list[Event]:
        events = []
        if d.id is not None:   # a call's first delta
            item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": d.id, "name": d.name or "",
                    "arguments": "", "status": "in_progress"}
            self._calls[d.index] = item
            events = self._add(item)
        item = self._calls.get(d.index)
        if item is not None and d.arguments:
            item["arguments"] += d.arguments
            events.append({"type": "response.function_call_arguments.delta", **self._at(item), "delta": d.arguments})
        return events

    def _close(self, status: str) -> list[Event]:
        item, self._open = self._open, None
        if item is None:
            return []
        at = self._at(item)
        if item["type"] == "function_call":
            events = [{"type": "response.function_call_arguments.done", **at, "name": item["name"],
                       "arguments": item["arguments"]}]
        else:
            part = item["content"][0]
            done: Event = {"type": _TEXT[item["type"]][2] + ".done", **at, "content_index": 0, "text": part["text"]}
            if item["type"] == "message":
                done["logprobs"] = []
            events = [done, {"type": "response.content_part.done", **at, "content_index": 0,
                             "part": copy.deepcopy(part)}]
        if "status" in item:   # reasoning items carry none, as OpenAI writes them
            item["status"] = status
        return [*events, {"type": "response.output_item.done", "output_index": at["output_index"],
                          "item": copy.deepcopy(item)}]
