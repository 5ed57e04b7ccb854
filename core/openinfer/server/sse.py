"""Server-sent events as OpenAI clients and the vLLM / SGLang bench parsers read them.

`data: {json}\\n\\n` (with the space: SGLang's parser strips exactly "data: "), the stream ends
with `data: [DONE]\\n\\n`, and an error after the first byte is `data: {"error": {...}}` (which
openai-python raises as APIError). SSEResponse is a plain ASGI response, not a middleware
(BaseHTTPMiddleware breaks long streams), that watches for `http.disconnect` itself: with ASGI
spec 2.4 Starlette's StreamingResponse only notices a gone client on its next write, and a
request still queued in the engine writes nothing.
"""
from __future__ import annotations

import json
import logging
from contextlib import aclosing
from typing import Any, AsyncIterator, Callable

from starlette.types import Receive, Scope, Send

from .errors import APIError, internal_error
from .submission import ClientDisconnected, until_disconnect

log = logging.getLogger("openinfer.server")
DONE = "data: [DONE]\n\n"
_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]


def event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def typed_event(payload: dict[str, Any]) -> str:
    """An event named by its payload's `type` (the Responses API's stream: `event: <type>` before the data)."""
    return f"event: {payload['type']}\n{event(payload)}"


def error_event(err: APIError) -> str:
    return event(err.body())


async def guarded(events: AsyncIterator[str], stream_id: str, on_error: Callable[[APIError], str]
                  ) -> AsyncIterator[str]:
    """`events`, ended by one error event (`on_error`'s) if they fail: after the first byte an error can only
    be an event."""
    try:
        async with aclosing(events) as inner:   # closed with this one: its finally blocks cancel the choices' tasks
            async for text in inner:
                yield text
    except APIError as e:
        yield on_error(e)
    except Exception as e:
        log.exception("stream %s failed", stream_id)
        yield on_error(internal_error(e))


class SSEResponse:
    """Streams `events`; `on_close` runs however the stream ends (done, error or disconnect)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        self.events = events
        self.on_close = on_close

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        async with aclosing(self.events) as events:
            async for text in events:
                await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(receive, self._stream(send))
        except (ClientDisconnected, OSError):
            pass  # the client is gone; on_close aborts what it left running
        finally:
            self.on_close()
