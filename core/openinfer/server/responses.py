"""POST /v1/responses, GET and DELETE /v1/responses/{id} and GET /v1/responses/{id}/input_items: OpenAI's Responses
API (a subset, response_request.py) over the
chat endpoint's path: the conversation's items become chat messages, chat.chat_prompt renders them and plans
the one choice, and its parsed output (reasoning, content, tool calls) becomes output items (response_items.py).

Status "incomplete" (incomplete_details.reason "max_output_tokens") when the output was cut by the token limit.
usage.output_tokens_details.reasoning_tokens counts the reasoning text's tokens (the think tags not included).
A stream is `event: <type>` / `data: <json>` pairs with increasing sequence_number: response.created,
response.in_progress, each item's events, then response.completed (or response.incomplete) with the whole
response; an error after the first byte is an `error` event. No `[DONE]`: OpenAI sends none here. A stored
response (`store`, default true) is kept in the ResponseStore once it ended: the last `capacity` (1000) in
memory, each with its response object and its conversation (every input item, those of the responses before it
included, then its output items), which a follow-up continues; instructions are not carried over, as OpenAI
documents. A process restart forgets them. An input item without an id gets one when its response is created, so
that input_items lists every item of the conversation before the response with an id (its pagination cursor),
messages with their text as input_text / output_text parts, as OpenAI lists them.
"""
from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.datastructures import QueryParams
from starlette.responses import JSONResponse, Response

from .chat import ChatOutputs, ChatPrompt, chat_prompt
from .errors import APIError, bad_request
from .generate import submit
from .host import ModelHost, ServedModel
from .response_items import Event, OutputItems
from .response_request import ResponsesRequest, conversation_messages, parse_responses
from .sse import SSEResponse, guarded, typed_event
from .submission import Submission


ITEM_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


@dataclass
class StoredResponse:
    body: dict[str, Any]                  # the response object as returned
    conversation: list[dict[str, Any]]    # input items, then output items
    inputs: int = 0                       # how many of them are its input (the previous responses' included)


class ResponseStore:
    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, body: dict[str, Any], conversation: list[dict[str, Any]], inputs: int = 0) -> None:
        self._responses[body["id"]] = StoredResponse(body, conversation, inputs)
        while len(self._responses) > self.capacity:
            self._responses.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response; a 404 naming `param` when it is unknown (never stored, or dropped)."""
        stored = self._responses.get(response_id)
        if stored is None:
            raise APIError(404, f"Response with id '{response_id}' not found.", param, "not_found")
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self._responses[response_id]


class ResponseRun:
    """One response being generated: its object, its output items and its stream's sequence numbers."""

    def __init__(self, model: ServedModel, req: ResponsesRequest, prompt: ChatPrompt,
                 conversation: list[dict[str, Any]], store: ResponseStore) -> None:
        self.model, self.req, self.prompt, self.store = model, req, prompt, store
        self.conversation = conversation   # the input items, the previous responses' included
        params = prompt.plan[0][2]         # the sampling values used, the model's defaults included
        self.body: dict[str, Any] = {
            "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "error": None, "incomplete_details": None, "instructions": req.instructions,
            "model": model.name, "output": [], "usage": None, "temperature": params.temperature,
            "top_p": params.top_p, "previous_response_id": req.previous_response_id, "store": req.store, **req.echo}
        self.items = OutputItems(None if req.echo["parallel_tool_calls"] else 1)
        self._seq = 0

    def sse(self, payload: Event) -> str:
        text = typed_event({**payload, "sequence_number": self._seq})
        self._seq += 1
        return text

    def error_event(self, e: APIError) -> str:
        return self.sse({"type": "error", "code": e.code, "message": e.message, "param": e.param})

    async def collect(self, sub: Submission) -> dict[str, Any]:
        async for _, piece in sub.pieces():
            self.items.feed(piece.parsed)
        self.finish(sub)
        return self.body

    async def stream(self, sub: Submission) -> AsyncIterator[str]:
        for kind in ("response.created", "response.in_progress"):
            yield self.sse({"type": kind, "response": self.body})
        async for _, piece in sub.pieces():
            for ev in self.items.feed(piece.parsed):
                yield self.sse(ev)
        for ev in self.finish(sub):
            yield self.sse(ev)

    def finish(self, sub: Submission) -> list[Event]:
        """Close the output, complete the response object (stored when asked) and return the closing events."""
        reason = sub.choices[0].out.finish_reason
        status = "incomplete" if reason in ("length", "abort") else "completed"
        events = self.items.finish(status)
        output = self.items.items
        u = sub.usage([len(self.prompt.ids)])
        encode = self.model.engine.tokenizer.encode
        reasoning = sum(len(encode(part["text"])) for item in output if item["type"] == "reasoning"
                        for part in item["content"])
        self.body.update(status=status, output=output, usage={
            "input_tokens": u["prompt_tokens"], "input_tokens_details": u["prompt_tokens_details"],
            "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": u["total_tokens"]})
        if reason == "length":
            self.body["incomplete_details"] = {"reason": "max_output_tokens"}
        if self.req.store:
            self.store.put(self.body, self.conversation + output, len(self.conversation))
        return [*events, {"type": f"response.{status}", "response": self.body}]


async def create_response(host: ModelHost, body: dict[str, Any], store: ResponseStore) -> Response:
    arrival = time.perf_counter()
    req = parse_responses(body)
    model = host.get(req.chat.gen.model)
    previous = [] if req.previous_response_id is None else \
        store.get(req.previous_response_id, "previous_response_id").conversation
    conversation = previous + [item if item.get("id") else {"id": f"{ITEM_ID_PREFIX[item['type']]}_{uuid.uuid4().hex}",
                                                             **item} for item in req.items]
    req.chat.messages = conversation_messages(req.instructions, conversation)
    prompt = await chat_prompt(model, req.chat, "input")
    run = ResponseRun(model, req, prompt, conversation, store)
    sub = await submit(model, req.chat.gen, ChatOutputs(model, req.chat, prompt, "resp"), arrival, prompt.plan)
    if req.chat.gen.stream:
        return SSEResponse(guarded(run.stream(sub), sub.id, run.error_event), sub.close)
    try:
        return JSONResponse(await run.collect(sub))
    finally:
        sub.close()   # a no-op once finished; aborts the engine request on a disconnect or error


def retrieve_response(store: ResponseStore, response_id: str, query: dict[str, str]) -> Response:
    """GET /v1/responses/{id}: a stored response object (its query options, e.g. stream, are not supported)."""
    if query:
        key = next(iter(query))
        raise bad_request(f"Unsupported parameter: '{key}'.", key, "unsupported_parameter")
    return JSONResponse(store.get(response_id).body)


def delete_response(store: ResponseStore, response_id: str) -> Response:
    store.delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


def list_input_items(store: ResponseStore, response_id: str, query: QueryParams) -> Response:
    """GET /v1/responses/{id}/input_items: the items the response was generated from, `order` desc (OpenAI's
    default) or asc, `limit` 1-100 (default 20) a page, from after the item id `after`."""
    stored = store.get(response_id)
    params = dict(query)
    if unknown := [k for k in params if k not in ("limit", "order", "after")]:
        # include asks for fields (search results, image urls, encrypted reasoning...) these items never have
        raise bad_request(f"Unsupported parameter: '{unknown[0]}'.", unknown[0], "unsupported_parameter")
    limit = params.get("limit", "20")
    if not (limit.isdigit() and 1 <= int(limit) <= 100):
        raise bad_request(f"'limit' must be an integer between 1 and 100, got {limit!r}.", "limit")
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request(f"'order' must be \"asc\" or \"desc\", got {order!r}.", "order")
    items = [_listed(item) for item in stored.conversation[:stored.inputs]]
    if order == "desc":
        items.reverse()
    if (after := params.get("after")) is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad_request(f"No input item with id '{after}' in response '{response_id}'.", "after")
        items = items[ids.index(after) + 1:]
    page = items[:int(limit)]
    return JSONResponse({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                         "last_id": page[-1]["id"] if page else None, "has_more": len(items) > len(page)})


def _listed(item: dict[str, Any]) -> dict[str, Any]:
    """An item as input_items lists it: a message's text as one part (input_text, or output_text for the
    assistant), with a status."""
    if item["type"] != "message":
        return item
    content = item["content"]
    if isinstance(content, str):
        part = "output_text" if item["role"] == "assistant" else "input_text"
        content = [{"type": part, "text": content, **({"annotations": []} if part == "output_text" else {})}]
    return {**item, "content": content, "status": item.get("status", "completed")}
