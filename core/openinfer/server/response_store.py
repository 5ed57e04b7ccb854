"""The responses kept for `previous_response_id` and GET /v1/responses/{id}: the most recent ones, in memory.

Each holds its response object and its conversation (every input item, those of the responses before it
included, then its output items), which a follow-up continues; instructions are not carried over, as OpenAI
documents. Bounded: the oldest is dropped once `capacity` are held (a process restart forgets them all).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .errors import APIError


@dataclass
class StoredResponse:
    body: dict[str, Any]                  # the response object as returned
    conversation: list[dict[str, Any]]    # input items, then output items


class ResponseStore:
    def __init__(self, capacity: int = 1000) -> None:
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, body: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._responses[body["id"]] = StoredResponse(body, conversation)
        while len(self._responses) > self.capacity:
            self._responses.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response; a 404 naming `param` when it is unknown (never stored, or dropped)."""
        stored = self._responses.get(response_id)
        if stored is None:
            raise APIError(404, f"Response with id '{response_id}' not found.", param, "not_found")
        return stored
