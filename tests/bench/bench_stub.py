"""A stub OpenAI-compatible server with known behaviour, run by uvicorn on 127.0.0.1 in a background thread.

Per request it sleeps `ttft_s`, then streams one chunk per output token with `itl_s` between chunks, and
a usage chunk with exact counts. It simulates a prefix cache (cached = longest common prefix with any
earlier prompt, at most len-1), exports vLLM's prefix-cache counters on /metrics, and fails (HTTP 500)
the requests whose x-request-id, less its random `bench-xxxxxxxx-` prefix, is in `fail_keys`.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

MODEL = "stub-model"


@dataclass
class StubState:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    fail_keys: set[str] = field(default_factory=set)
    export_metrics: bool = True
    pool_blocks: int | None = None   # exported as vllm:cache_config_info (blocks of 16 tokens) when set
    seen: list[list[Any]] = field(default_factory=list)
    queries: int = 0
    hits: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)


def tokens_of(body: dict[str, Any]) -> list[Any]:
    """Prompt as a token list: ids as given, text split on spaces, chat messages concatenated."""
    if "messages" in body:
        return [w for m in body["messages"] for w in str(m["content"]).split()]
    prompt = body["prompt"]
    return list(prompt) if isinstance(prompt, list) else prompt.split()


def _lcp(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def make_app(state: StubState) -> Starlette:
    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(_: Request) -> PlainTextResponse:
        if not state.export_metrics:
            return PlainTextResponse("not found", status_code=404)
        text = ("# TYPE vllm:prefix_cache_queries counter\n"
                f'vllm:prefix_cache_queries_total{{model_name="{MODEL}"}} {state.queries}\n'
                f'vllm:prefix_cache_hits_total{{model_name="{MODEL}"}} {state.hits}\n')
        if state.pool_blocks is not None:
            text += f'vllm:cache_config_info{{block_size="16",model_name="{MODEL}",num_gpu_blocks="{state.pool_blocks}"}} 1\n'
        return PlainTextResponse(text)

    async def tokenize(request: Request) -> JSONResponse:
        body = await request.json()
        words = body["prompt"].split()
        return JSONResponse({"tokens": [int(w[1:]) + 500 for w in words], "count": len(words)})

    async def generate(request: Request) -> Any:
        body = await request.json()
        rid = request.headers.get("x-request-id", "")
        state.bodies.append(body)
        state.request_ids.append(rid)
        if re.sub(r"^bench-[0-9a-f]{8}-", "", rid) in state.fail_keys:
            err = {"message": "injected failure", "type": "InternalServerError", "param": None, "code": None}
            return JSONResponse({"error": err}, status_code=500)
        chat = "messages" in body
        prompt = tokens_of(body)
        cached = min(max((_lcp(prompt, s) for s in state.seen), default=0), max(len(prompt) - 1, 0))
        state.seen.append(prompt)
        state.queries += len(prompt)
        state.hits += cached
        n_out = body.get("max_completion_tokens" if chat else "max_tokens", 16)

        def chunk(i: int) -> dict[str, Any]:
            text = f"t{i} "
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": None} if chat else \
                {"index": 0, "text": text, "finish_reason": None}
            return {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
                    "choices": [choice], "usage": None}

        async def events() -> Any:
            await asyncio.sleep(state.ttft_s)
            for i in range(n_out):
                if i:
                    await asyncio.sleep(state.itl_s)
                yield f"data: {json.dumps(chunk(i))}\n\n"
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n_out, "total_tokens": len(prompt) + n_out,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[
        Route("/v1/models", models), Route("/metrics", metrics), Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/v1/chat/completions", generate, methods=["POST"]),
    ])


class StubServer:
    """Context manager: `with StubServer(state) as url:` serves until the block ends."""

    def __init__(self, state: StubState) -> None:
        self.state = state
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only when the listening
        # socket says TCP; with proto 0, Nagle + delayed ACK add ~40 ms to every keep-alive response.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))  # a free port chosen by the OS
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(make_app(state), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("stub server did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()
