"""create_app(host): the Starlette application and its routes.

Every route answers errors with the OpenAI envelope (errors.py), including unknown paths and
unexpected exceptions (a 500 that names no internals beyond the exception's message). Request bodies are read
within limits.ServerLimits (size, time). The generation routes (POST /v1/responses too, over one ResponseStore per
app) run raced against the client's disconnect (submission.until_disconnect), as their caller (auth.Caller: the
API key's tenant, which owns its stored responses and its part of the prefix cache).
Probes: /health (readiness: 503 once an engine died), /live (liveness: the process answers),
/ping (SageMaker's name for /health), /version. With API keys the app is wrapped in auth.APIKeyAuth; outside
that, CORS (Starlette's pure ASGI middleware) answers browsers' preflights, which carry no key, for the
allowed origins (every origin by default, without credentials, as vLLM does). Outermost, sse.RawSend hands streams
the server's own `send` for their body messages.
"""
from __future__ import annotations

import asyncio
import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Awaitable, Callable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from openinfer.text.tokenizer import ChatTemplateError

from . import metrics
from .auth import TENANT, APIKeyAuth, ASGIApp, Caller
from .chat import create_chat_completion
from .completions import create_completion
from .errors import APIError, bad_request, internal_error, model_not_found
from .fields import parse_json_object
from .host import ModelHost
from .limits import TRIM_AFTER_BYTES, ServerLimits, read_body, release_memory
from .protocol import parse_detokenize, parse_tokenize
from .responses import (ResponseStore, cancel_response, create_response, delete_response, list_input_items,
                        retrieve_response)
from .sse import RawSend
from .submission import ClientDisconnected, until_disconnect

log = logging.getLogger("openinfer.server")
CLIENT_GONE = 499  # nginx's code for "client closed request"; nobody reads it

Handler = Callable[[Request], Awaitable[Response]]


def endpoint(fn: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except APIError as e:
            return e.response()
        except (ClientDisconnect, ClientDisconnected):
            return Response(status_code=CLIENT_GONE)
        except Exception as e:
            log.exception("unexpected error on %s", request.url.path)
            return internal_error(e).response()
        finally:
            if getattr(request.state, "body_bytes", 0) >= TRIM_AFTER_BYTES:
                await release_memory()
    return wrapped


def package_version() -> str:
    try:
        return version("openinfer")
    except PackageNotFoundError:   # run from a source tree that was never installed
        return "unknown"


def create_app(host: ModelHost, api_keys: Sequence[str] = (), allowed_origins: Sequence[str] = ("*",),
               limits: ServerLimits = ServerLimits()) -> ASGIApp:
    """The server's ASGI app over `host`; with api_keys, every route but the probes wants one of them; browsers
    may call it from allowed_origins (none: no CORS headers, so browsers refuse cross-origin calls)."""
    async def read_json(request: Request) -> dict[str, Any]:
        return parse_json_object(await read_body(request, limits))

    def caller(request: Request) -> Caller:
        tenant = request.scope.get(TENANT, "")
        return Caller(tenant, "" if limits.shared_prefix_cache else tenant)

    def generation(handler: Callable[[ModelHost, dict[str, Any], Caller], Awaitable[Response]]) -> Handler:
        @endpoint
        async def route(request: Request) -> Response:
            body = await read_json(request)
            return await until_disconnect(request.receive, handler(host, body, caller(request)))
        return route

    store = ResponseStore(max_bytes=limits.max_stored_response_bytes)

    async def create_stored_response(host: ModelHost, body: dict[str, Any], caller: Caller) -> Response:
        return await create_response(host, body, store, caller)

    @endpoint
    async def response_by_id(request: Request) -> Response:
        response_id, tenant = request.path_params["response_id"], caller(request).tenant
        if request.method == "DELETE":
            return delete_response(store, response_id, tenant)
        return retrieve_response(store, response_id, tenant, dict(request.query_params))

    @endpoint
    async def response_input_items(request: Request) -> Response:
        return list_input_items(store, request.path_params["response_id"], caller(request).tenant,
                                request.query_params)

    @endpoint
    async def response_cancel(request: Request) -> Response:
        return cancel_response(store, request.path_params["response_id"], caller(request).tenant)

    @endpoint
    async def list_models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [m.card() for m in host]})

    @endpoint
    async def get_model(request: Request) -> Response:
        name = request.path_params["model"]
        for m in host:
            if m.name == name:
                return JSONResponse(m.card())
        raise model_not_found(name)

    @endpoint
    async def tokenize(request: Request) -> Response:
        req = parse_tokenize(await read_json(request))
        model = host.get(req.model)
        tokenizer = model.engine.tokenizer

        def encode() -> list[int]:
            text = req.prompt
            if req.messages is not None:
                try:
                    messages = model.engine.chat_format.template_messages(req.messages)
                    text = tokenizer.apply_chat_template(messages, tools=req.tools,
                                                         add_generation_prompt=req.add_generation_prompt,
                                                         continue_final_message=req.continue_final_message,
                                                         **req.template_kwargs)
                except (ChatTemplateError, TypeError) as e:
                    raise bad_request(f"The chat template rejected the messages: {e}", "messages") from None
            return tokenizer.encode(text, add_special_tokens=req.add_special_tokens)

        tokens = await asyncio.to_thread(encode)
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": model.engine.max_model_len})

    @endpoint
    async def detokenize(request: Request) -> Response:
        name, tokens = parse_detokenize(await read_json(request))
        model = host.get(name)
        if bad := [t for t in tokens if not 0 <= t < model.engine.vocab_size]:
            raise bad_request(f"Token id {bad[0]} is outside the vocabulary.", "tokens")
        text = await asyncio.to_thread(model.engine.tokenizer.decode, tokens)
        return JSONResponse({"prompt": text})

    @endpoint
    async def health(_: Request) -> Response:
        dead = [f"'{m.name}': {m.engine.dead_reason}" for m in host if not m.engine.is_alive()]
        if dead:
            return APIError(503, "Engine dead: " + "; ".join(dead), code="engine_dead").response()
        return Response(status_code=200)

    async def live(_: Request) -> Response:
        return Response(status_code=200)

    async def version_info(_: Request) -> Response:
        return JSONResponse({"version": package_version()})

    @endpoint
    async def metrics_text(_: Request) -> Response:
        text = metrics.render([(m.name, m.metrics, m.engine.stats()) for m in host])
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return APIError(exc.status_code, exc.detail, code="not_found" if exc.status_code == 404 else None).response()

    routes = [
        Route("/v1/models", list_models),
        Route("/v1/models/{model:path}", get_model),
        Route("/v1/completions", generation(create_completion), methods=["POST"]),
        Route("/v1/chat/completions", generation(create_chat_completion), methods=["POST"]),
        Route("/v1/responses", generation(create_stored_response), methods=["POST"]),
        Route("/v1/responses/{response_id}", response_by_id, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/input_items", response_input_items),
        Route("/v1/responses/{response_id}/cancel", response_cancel, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/health", health),
        Route("/ping", health, methods=["GET", "POST"]),
        Route("/live", live),
        Route("/version", version_info),
        Route("/metrics", metrics_text),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.host = host
    guarded: ASGIApp = APIKeyAuth(app, api_keys, limits.public_metrics) if api_keys else app
    if allowed_origins:
        guarded = CORSMiddleware(guarded, allow_origins=list(allowed_origins), allow_methods=["*"], allow_headers=["*"])
    return RawSend(guarded)
