"""API keys: with `--api-key` (or OPENINFER_API_KEY) every route but the probes wants `Authorization: Bearer KEY`.

A pure ASGI wrapper around the app, not Starlette's BaseHTTPMiddleware, which gets in the way of long streams and of
seeing a client's disconnect. The probes (health, liveness, version) stay open for load balancers; /metrics, which
tells each model's traffic, wants a key too unless `--public-metrics` opens it for a scraper. Keys are compared in constant time.
Each key is a tenant: the request's scope carries a digest of its key (TENANT), which owns the stored responses it
creates and partitions the prefix cache (Caller).
"""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

from .errors import APIError

PROBES = frozenset({"/health", "/live", "/ping", "/version"})
TENANT = "openinfer.tenant"   # the scope key of the caller's tenant id

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


@dataclass(frozen=True)
class Caller:
    """Who sent a request: `tenant` owns what it stores ("" without API keys); `cache_scope` is the prefix-cache
    partition its prompts hit ("" when the cache is shared across keys)."""
    tenant: str = ""
    cache_scope: str = ""

    def cache_salt(self, salt: str) -> str:
        """The engine's salt for a request's cache_salt: within the caller's partition (a fixed-length digest and a
        separator, so no salt of one tenant spells another's)."""
        return f"{self.cache_scope}:{salt}" if self.cache_scope else salt


def tenant_id(key: str) -> str:
    """A key's tenant id: a digest, so the key itself is kept nowhere but in the auth check."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class APIKeyAuth:
    """Wraps an ASGI app: a request without one of `keys` as its bearer token gets a 401 in the OpenAI envelope;
    one with a key gets its tenant id in scope[TENANT]."""

    def __init__(self, app: ASGIApp, keys: Sequence[str], public_metrics: bool = False) -> None:
        if not keys or not all(keys):
            raise ValueError("an API key must be a non-empty string")
        self.app = app
        self._keys = [(k.encode(), tenant_id(k)) for k in keys]
        self._open = PROBES | {"/metrics"} if public_metrics else PROBES

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self._open:
            await self.app(scope, receive, send)
            return
        tenant = self._tenant(scope)
        if tenant is not None:
            await self.app({**scope, TENANT: tenant}, receive, send)
            return
        err = APIError(401, "Missing or incorrect API key: send it as the header 'Authorization: Bearer KEY'.",
                       code="invalid_api_key", type="invalid_request_error", headers={"WWW-Authenticate": "Bearer"})
        await err.response()(scope, receive, send)

    def _tenant(self, scope: dict) -> str | None:
        """The tenant of the request's key; None without a valid one."""
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")   # ASGI lower-cases names
        scheme, _, token = header.partition(b" ")
        token = token.strip()
        # every key is compared, so the time taken does not tell which one came close
        matches = [hmac.compare_digest(token, k) for k, _ in self._keys]
        if scheme.lower() != b"bearer" or not any(matches):
            return None
        return self._keys[matches.index(True)][1]
