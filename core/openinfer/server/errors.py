"""The OpenAI error envelope: `{"error": {"message", "type", "param", "code"}}`.

Client mistakes are 400 (openai-python retries >= 500, so a 500 for bad input would triple the
load); an unknown model is 404 `model_not_found`. Every error the server returns, before or
after the first byte of a stream, goes through this module.
"""
from __future__ import annotations

import json
from typing import Any


from starlette.responses import Response

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          500: "server_error", 503: "service_unavailable"}


class APIError(Exception):
    """An error that becomes one HTTP response (or one mid-stream error event)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        # an error may quote what the client sent: text that is not valid Unicode must not fail its own reply
        content = json.dumps(self.body(), ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
        return Response(content, status_code=self.status, headers=self.headers, media_type="application/json")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code or "invalid_value")


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", "model", "model_not_found",
                    type="invalid_request_error")


def internal_error(e: Exception) -> APIError:
    """An unexpected exception as a 500 that names no internals beyond the exception's message."""
    return APIError(500, f"Internal server error: {type(e).__name__}: {e}", code="internal_error")


def engine_error(message: str) -> APIError:
    return APIError(500, message, code="engine_error")
