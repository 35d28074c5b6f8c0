"""Errors the proxy returns, each rendered in the caller's own API format.

A handler raises :class:`ProxyError` with an API-neutral ``kind``; the app renders it as OpenAI
``{"error": {"message", "type", "param", "code"}}`` or Anthropic ``{"type": "error", "error": {"type", "message"}}``
depending on which API the request came in on, so an SDK on either side raises its own typed exception.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import JSONResponse

from openclaw_cli.backend import BackendError
from openclaw_cli.capture import ApiKind

ErrorKind = Literal[
    "invalid_request", "authentication", "not_found", "too_large", "overloaded", "backend", "internal", "unsupported"
]

# kind -> (OpenAI type, OpenAI default code, Anthropic type)
_FORMATS: dict[str, tuple[str, str | None, str]] = {
    "invalid_request": ("invalid_request_error", None, "invalid_request_error"),
    "authentication": ("invalid_request_error", "invalid_api_key", "authentication_error"),
    "not_found": ("invalid_request_error", "not_found", "not_found_error"),
    "too_large": ("invalid_request_error", "request_too_large", "request_too_large"),
    "overloaded": ("server_error", "overloaded", "overloaded_error"),
    "backend": ("server_error", "backend_error", "api_error"),
    "internal": ("server_error", None, "api_error"),
    "unsupported": ("invalid_request_error", "unsupported", "invalid_request_error"),
}

ANTHROPIC_OVERLOADED_STATUS = 529


class ProxyError(Exception):
    """A failure to report to the client: HTTP status, one clear message, and the offending parameter if any."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: ErrorKind = "invalid_request",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def status_for(self, api: ApiKind) -> int:
        # Anthropic clients (Claude Code among them) back off and retry on 529, OpenAI clients on 503.
        if self.kind == "overloaded" and api == "anthropic":
            return ANTHROPIC_OVERLOADED_STATUS
        return self.status


def error_body(err: ProxyError, api: ApiKind) -> dict[str, Any]:
    openai_type, default_code, anthropic_type = _FORMATS[err.kind]
    if api == "anthropic":
        return {"type": "error", "error": {"type": anthropic_type, "message": err.message}}
    return {
        "error": {"message": err.message, "type": openai_type, "param": err.param, "code": err.code or default_code}
    }


def error_response(err: ProxyError, api: ApiKind) -> JSONResponse:
    headers = {"retry-after": str(err.retry_after_s)} if err.retry_after_s is not None else {}
    if err.kind == "authentication":
        # Claude Code retries a 401 (in case its credentials were refreshed meanwhile) for minutes, silently,
        # unless told not to; both SDKs and Claude Code honour this header, so a wrong key fails at once.
        headers["x-should-retry"] = "false"
    return JSONResponse(error_body(err, api), status_code=err.status_for(api), headers=headers or None)


def api_for_path(path: str) -> ApiKind:
    """Which API's error format a request path expects (everything outside /v1/messages speaks OpenAI's)."""
    return "anthropic" if path.rstrip("/").startswith("/v1/messages") else "openai"


def from_backend_error(exc: BackendError, *, retry_after_s: int) -> ProxyError:
    """Map a backend failure: retryable -> 503/529 with Retry-After; a 4xx the backend names (context too long)
    -> that 4xx; anything else -> 502, since the backend is the proxy's upstream."""
    message = str(exc) or type(exc).__name__
    if exc.retryable:
        return ProxyError(503, message, kind="overloaded", retry_after_s=retry_after_s)
    if exc.status_code is not None and 400 <= exc.status_code < 500:
        return ProxyError(exc.status_code, message, kind="invalid_request")
    return ProxyError(502, f"backend failed: {message}", kind="backend")


def from_unexpected(exc: BaseException) -> ProxyError:
    return ProxyError(500, f"internal error: {type(exc).__name__}: {exc}", kind="internal")
