"""API keys: with `--api-key` (or OPENINFER_API_KEY) every route but the probes wants `Authorization: Bearer KEY`.

A pure ASGI wrapper around the app, not Starlette's BaseHTTPMiddleware, which gets in the way of long streams and of
seeing a client's disconnect. The probes (health, liveness, version, metrics) stay open, as vLLM leaves them, for
load balancers and scrapers. Keys are compared in constant time.
"""
from __future__ import annotations

import hmac
from typing import Any, Awaitable, Callable, Sequence

from .errors import APIError

OPEN_PATHS = frozenset({"/health", "/live", "/ping", "/version", "/metrics"})

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class APIKeyAuth:
    """Wraps an ASGI app: a request without one of `keys` as its bearer token gets a 401 in the OpenAI envelope."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        if not keys or not all(keys):
            raise ValueError("an API key must be a non-empty string")
        self.app = app
        self._keys = [k.encode() for k in keys]

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        err = APIError(401, "Missing or incorrect API key: send it as the header 'Authorization: Bearer KEY'.",
                       code="invalid_api_key", type="invalid_request_error", headers={"WWW-Authenticate": "Bearer"})
        await err.response()(scope, receive, send)

    def _authorized(self, scope: dict) -> bool:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")   # ASGI lower-cases names
        scheme, _, token = header.partition(b" ")
        token = token.strip()
        # every key is compared, so the time taken does not tell which one came close
        return scheme.lower() == b"bearer" and sum(hmac.compare_digest(token, k) for k in self._keys) > 0
