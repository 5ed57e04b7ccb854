"""Async streaming OpenAI client with vLLM `bench serve` timing semantics (TTFT, ITL, E2E per request)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import httpx

from openinfer.bench.datasets import BenchRequest

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


@dataclass
class RequestOutput:
    """What one request measured. Times are seconds from time.perf_counter(); itl lists chunk gaps."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int | None = None  # usage.completion_tokens, None when the server sent no usage
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    generated_text: str = ""
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    usage_prompt_tokens: int | None = None


class SSEParser:
    """Incremental SSE `data:` extraction: splits on blank lines, accepts `data:` with or without a space,
    skips `:` comments, and treats a trailing buffer as complete if it is `[DONE]` or parses as JSON."""

    def __init__(self) -> None:
        self._buf = ""

    def feed(self, chunk: str) -> list[str]:
        self._buf += chunk.replace("\r\n", "\n")
        *events, self._buf = self._buf.split("\n\n")
        return [d for e in events if (d := _data_of(e)) is not None]

    def flush(self) -> list[str]:
        rest, self._buf = self._buf, ""
        data = _data_of(rest)
        if data is None:
            return []
        if data == "[DONE]":
            return [data]
        try:
            json.loads(data)
        except ValueError:
            return []
        return [data]


def _data_of(event: str) -> str | None:
    lines = [ln[5:].lstrip(" ") for ln in event.split("\n") if ln.startswith("data:")]
    return "\n".join(lines) if lines else None


def auth_headers() -> dict[str, str]:
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def build_payload(endpoint: str, model: str, req: BenchRequest, sampling: dict[str, Any]) -> dict[str, Any]:
    """vLLM's payload shape; `sampling` carries temperature, ignore_eos and any --extra-body keys."""
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if endpoint == CHAT:
        body["messages"] = req.messages
        body["max_completion_tokens"] = req.output_len
    else:
        body["prompt"] = req.prompt
        body["max_tokens"] = req.output_len
    body.update(sampling)
    return body


def error_message(status: int, body: bytes) -> str:
    try:
        return f"HTTP {status}: {json.loads(body)['error']['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {body[:200].decode(errors='replace')}"


async def send_request(
    client: httpx.AsyncClient,
    endpoint: str,
    model: str,
    req: BenchRequest,
    sampling: dict[str, Any],
    request_id: str = "",
) -> RequestOutput:
    """POST one streaming request and time it; never raises (a failure is recorded in the output)."""
    out = RequestOutput(prompt_len=req.prompt_len)
    headers = {"x-request-id": request_id} if request_id else {}
    chat = endpoint == CHAT
    parser = SSEParser()
    t0 = out.start_time = time.perf_counter()
    last = t0
    try:
        async with client.stream("POST", endpoint, json=build_payload(endpoint, model, req, sampling), headers=headers) as resp:
            if resp.status_code != 200:
                out.error = error_message(resp.status_code, await resp.aread())
                return out
            async for text in resp.aiter_text():
                now = time.perf_counter()  # one stamp per network read, as vLLM's client does
                for data in parser.feed(text):
                    last = _on_event(out, data, chat, t0, now, last)
            for data in parser.flush():
                last = _on_event(out, data, chat, t0, time.perf_counter(), last)
    except _StreamError as e:
        out.error = str(e)
        return out
    except (httpx.HTTPError, OSError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    if out.ttft == 0.0:
        out.error = "never received a chunk with choices (no TTFT)"
        return out
    out.latency = last - t0
    out.success = True
    return out


class _StreamError(Exception):
    pass


def _on_event(out: RequestOutput, data: str, chat: bool, t0: float, now: float, last: float) -> float:
    """Fold one SSE event into `out`; returns the new "most recent chunk" time."""
    if data == "[DONE]":
        return last
    obj = json.loads(data)
    if "error" in obj:
        err = obj["error"]
        raise _StreamError(f"stream error: {err.get('message', err) if isinstance(err, dict) else err}")
    usage = obj.get("usage")
    if usage:
        out.output_tokens = usage.get("completion_tokens")
        out.usage_prompt_tokens = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            out.cached_tokens = int(details["cached_tokens"])
    choices = obj.get("choices")
    if choices:
        c = choices[0]
        piece = (c.get("delta") or {}).get("content") if chat else c.get("text")
        if out.ttft == 0.0:
            out.ttft = now - t0  # the first chunk with choices counts, even with empty text
        else:
            out.itl.append(now - last)
        out.generated_text += piece or ""
        return now
    # vLLM's chat path lets the usage-only chunk advance E2E latency; its completions path does not.
    return now if chat else last


# Idle connections are dropped before servers commonly close them (uvicorn's default and vLLM's keep-alive: 5 s), so a
# request never goes out on a connection the server is closing (a reset: httpx ReadError, a failed request).
KEEPALIVE_EXPIRY_S = 4.0


def make_client(base_url: str, max_connections: int | None = None) -> httpx.AsyncClient:
    most = max_connections or 10_000
    limits = httpx.Limits(max_connections=most, max_keepalive_connections=most, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    # No read timeout: a long prefill under load is a measurement, not an error.
    timeout = httpx.Timeout(None, connect=30.0)
    return httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=auth_headers(), limits=limits, timeout=timeout)


# Streams per client. httpcore's pool looks at every connection for each idle one whenever a request starts or
# ends, quadratic in its connections: 256 streams in one pool spent a quarter of the client's CPU time there.
POOL_STREAMS = 32


@contextlib.asynccontextmanager
async def client_group(base_url: str, concurrency: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Enough clients for `concurrency` streams at POOL_STREAMS each; request i goes through client i % len."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(make_client(base_url))
               for _ in range(max(1, -(-concurrency // POOL_STREAMS)))]
