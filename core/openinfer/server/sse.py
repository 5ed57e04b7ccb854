"""Server-sent events as OpenAI clients and the vLLM / SGLang bench parsers read them.

`data: {json}\\n\\n` (with the space: SGLang's parser strips exactly "data: "), the stream ends
with `data: [DONE]\\n\\n`, and an error after the first byte is `data: {"error": {...}}` (which
openai-python raises as APIError). SSEResponse is a plain ASGI response, not a middleware
(BaseHTTPMiddleware breaks long streams), that watches for `http.disconnect` itself: with ASGI
spec 2.4 Starlette's StreamingResponse only notices a gone client on its next write, and a
request still queued in the engine writes nothing.

A stream writes one body message per token and stream, so what each costs is the server's CPU per token: the
response's start goes through the middlewares' `send` wrappers (CORS adds its headers there, Starlette notes that a
response started), its body straight to the server's own `send` (RawSend keeps it in the scope), past wrappers that
only pass body messages on; a chunk's JSON is written from its head serialized once (ChunkEvents).
"""
from __future__ import annotations

import json
import logging
from contextlib import aclosing
from typing import Any, AsyncIterator, Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError, internal_error
from .submission import ClientDisconnected, until_disconnect

log = logging.getLogger("openinfer.server")
DONE = "data: [DONE]\n\n"
RAW_SEND = "openinfer.raw_send"   # the scope's key for the server's own `send` (RawSend)
_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no")]


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode   # one encoder, not one a call
_string = json.encoder.encode_basestring   # a str as _encode writes it (ensure_ascii off)


def event(payload: dict[str, Any]) -> str:
    return f"data: {_encode(payload)}\n\n"


def to_json(value: Any) -> str:
    """`value` as _encode writes it. Strings, ints, None and dicts of them with string keys (a chunk's choice) are
    written here: for such small objects the encoder's per-call setup costs more than the text."""
    kind = type(value)
    if kind is str:
        return _string(value)
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    if kind is dict:
        return "{" + ",".join([f"{_string(k)}:{_string(v) if type(v) is str else to_json(v)}"
                               for k, v in value.items()]) + "}"
    return _encode(value)


class ChunkEvents:
    """One stream's chunk events: `{**head, "choices": [choice], "usage": usage, **fields}` as event() writes it,
    the head (the same in every chunk) serialized once."""

    def __init__(self, head: dict[str, Any]) -> None:
        self._prefix = f'data: {_encode(head)[:-1]},"choices":['

    def event(self, choice: dict[str, Any] | None, usage: dict[str, Any] | None, fields: dict[str, Any]) -> str:
        """The chunk of `choice` (None: no choice, the usage chunk)."""
        text = f'{self._prefix}{"" if choice is None else to_json(choice)}],"usage":{to_json(usage)}'
        for k, v in fields.items():
            text += f",{_string(k)}:{to_json(v)}"
        return text + "}\n\n"


def typed_event(payload: dict[str, Any]) -> str:
    """An event named by its payload's `type` (the Responses API's stream: `event: <type>` before the data)."""
    return f"event: {payload['type']}\n{event(payload)}"


def error_event(err: APIError) -> str:
    return event(err.body())


class RawSend:
    """The app's outermost layer: keeps the server's `send` in the scope, for SSEResponse's body messages."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND] = send
        await self.app(scope, receive, send)


class SSEResponse:
    """Streams `events`, then `done` (chat and completions end with DONE); if they fail, one error event
    (`on_error`'s) comes before `done`: after the first byte an error can only be an event. `on_close` runs
    however the stream ends (done, error or disconnect)."""

    def __init__(self, events: AsyncIterator[str], stream_id: str, on_error: Callable[[APIError], str],
                 on_close: Callable[[], None], done: str = "") -> None:
        self.events = events
        self.stream_id = stream_id
        self.on_error = on_error
        self.on_close = on_close
        self.done = done

    async def _stream(self, send: Send, send_body: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        async with aclosing(self.events) as events:
            while True:
                try:
                    text = await anext(events)
                except StopAsyncIteration:
                    text = self.done
                    break
                except APIError as e:
                    text = self.on_error(e) + self.done
                    break
                except Exception as e:
                    log.exception("stream %s failed", self.stream_id)
                    text = self.on_error(internal_error(e)) + self.done
                    break
                await send_body({"type": "http.response.body", "body": text.encode(), "more_body": True})
        await send_body({"type": "http.response.body", "body": text.encode(), "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(receive, self._stream(send, scope.get(RAW_SEND, send)))
        except (ClientDisconnected, OSError):
            pass  # the client is gone; on_close aborts what it left running
        finally:
            self.on_close()
