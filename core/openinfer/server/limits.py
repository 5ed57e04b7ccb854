"""Bounds on the work one request may ask of the server, and reading a request body within them.

A body larger than `max_body_bytes` is a 413 before it is read (by its Content-Length) or as soon as it grows past
the limit; a body not received within `read_timeout_s` of its start is a 408 (a client that never finishes one
would hold its connection and its buffer forever). Either ends the connection, its rest unread. A large body's
memory goes back to the system once its request is done: glibc keeps freed heap memory for reuse, and a few tens
of MB per refused request added up to gigabytes that the idle server kept.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from dataclasses import dataclass

from starlette.requests import Request

from .errors import APIError

MIB = 1 << 20
TRIM_AFTER_BYTES = 4 * MIB   # a body this large gives its memory back once its request is done


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 32 * MIB            # --max-request-body-mib
    read_timeout_s: float = 30.0              # --request-read-timeout
    max_stored_response_bytes: int = 256 * MIB   # --max-stored-response-mib: the Responses store's JSON size
    public_metrics: bool = False              # --public-metrics: /metrics answers without an API key
    shared_prefix_cache: bool = False         # --shared-prefix-cache: every API key's requests share one cache

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.read_timeout_s <= 0 or self.max_stored_response_bytes < 0:
            raise ValueError("the request body limit and read timeout must be positive, the stored-response limit "
                             "not negative")


def _closing(status: int, message: str, code: str) -> APIError:
    """An error after which the connection cannot go on (the body's rest was never read)."""
    return APIError(status, message, code=code, headers={"Connection": "close"})


async def read_body(request: Request, limits: ServerLimits) -> bytes:
    """The whole body, or a 413 past max_body_bytes, or a 408 when it takes longer than read_timeout_s."""
    too_large = _closing(413, f"The request body is larger than this server's limit of {limits.max_body_bytes} "
                              "bytes (--max-request-body-mib).", "request_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limits.max_body_bytes:
        raise too_large
    chunks: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            request.state.body_bytes = size   # (the endpoint gives a large body's memory back)
            if size > limits.max_body_bytes:
                raise too_large
            chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), limits.read_timeout_s)
    except TimeoutError:
        raise _closing(408, f"The request body did not arrive within {limits.read_timeout_s:g} s "
                            "(--request-read-timeout).", "request_timeout") from None
    return b"".join(chunks)


def _malloc_trim() -> None:
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:   # glibc; elsewhere the allocator decides
        trim(0)


async def release_memory() -> None:
    """Hand the heap's free memory back to the system (off the event loop: it walks the heap)."""
    await asyncio.to_thread(_malloc_trim)
