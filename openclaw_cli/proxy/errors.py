"""Errors the proxy returns, each rendered in the caller's own API format.

A handler raises :class:`ProxyError` with an API-neutral ``kind``; the app renders it as OpenAI
``{"error": {"message", "type", "param", "code"}}`` or Anthropic ``{"type": "error", "error": {"type", "message"}}``
depending on which API the request came in on, so an SDK on either side raises its own typed exception.
"""

from __future__ import annotations

from typing import Any, Literal

from starlette.responses import JSONResponse

from openclaw_cli.backend import BackendError
from openclaw_cli.capture import ApiKind

ErrorKind = Literal[
    "invalid_request",
    "authentication",
    "not_found",
    "too_large",
    "overloaded",
    "busy",
    "backend",
    "internal",
    "unsupported",
    "unmet_constraint",
]

# kind -> (OpenAI type, OpenAI default code, Anthropic type)
_FORMATS: dict[str, tuple[str, str | None, str]] = {
    "invalid_request": ("invalid_request_error", None, "invalid_request_error"),
    "authentication": ("invalid_request_error", "invalid_api_key", "authentication_error"),
    "not_found": ("invalid_request_error", "not_found", "not_found_error"),
    "too_large": ("invalid_request_error", "request_too_large", "request_too_large"),
    "overloaded": ("server_error", "overloaded", "overloaded_error"),
    # The proxy's own concurrency cap (proxy.max_in_flight): a rate limit to OpenAI clients, an overload to
    # Anthropic's; both retry after Retry-After.
    "busy": ("rate_limit_error", "rate_limit_exceeded", "overloaded_error"),
    "backend": ("server_error", "backend_error", "api_error"),
    "internal": ("server_error", None, "api_error"),
    "unsupported": ("invalid_request_error", "unsupported", "invalid_request_error"),
    # The model never produced what tool_choice / response_format demand (see proxy/constraints.py).
    "unmet_constraint": ("server_error", "constraint_not_met", "api_error"),
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
        if self.kind in ("overloaded", "busy") and api == "anthropic":
            return ANTHROPIC_OVERLOADED_STATUS
        return self.status


def error_body(err: ProxyError, api: ApiKind) -> dict[str, Any]:
    openai_type, default_code, anthropic_type = _FORMATS[err.kind]
    message = _encodable(err.message)
    if api == "anthropic":
        return {"type": "error", "error": {"type": anthropic_type, "message": message}}
    param = None if err.param is None else _encodable(err.param)
    return {"error": {"message": message, "type": openai_type, "param": param, "code": err.code or default_code}}


def _encodable(text: str) -> str:
    """``text`` made UTF-8 encodable: a message may quote client input holding a lone surrogate (valid JSON
    ``"\\ud800"``, invalid UTF-8), and the error must still render rather than turn into a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def error_response(err: ProxyError, api: ApiKind) -> JSONResponse:
    headers = {"retry-after": str(err.retry_after_s)} if err.retry_after_s is not None else {}
    if err.kind in ("authentication", "unmet_constraint"):
        # Claude Code retries a 401 (in case its credentials were refreshed meanwhile) for minutes, silently,
        # unless told not to; both SDKs and Claude Code honour this header, so a wrong key fails at once. An unmet
        # constraint was already resampled proxy.tool_choice_retries times: an SDK retry would multiply that.
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


# Exceptions (other than BackendError) that mean the backend cannot be reached right now rather than a bug: a remote
# sampler's connection refused or reset, a timeout. Reported like a retryable BackendError, so clients back off and
# retry (503 / Anthropic 529 with Retry-After) and serving resumes by itself once the backend answers again.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, OSError)


def from_backend_exception(exc: BaseException, *, retry_after_s: int) -> ProxyError:
    """Any exception raised by the backend while sampling, mapped: BackendError as :func:`from_backend_error`;
    connection failures and timeouts -> 503/529 "unavailable" with Retry-After; anything else -> 500 (a bug)."""
    if isinstance(exc, BackendError):
        return from_backend_error(exc, retry_after_s=retry_after_s)
    if isinstance(exc, UNAVAILABLE_ERRORS):
        detail = str(exc) or type(exc).__name__
        return ProxyError(
            503,
            f"the policy backend is unavailable ({type(exc).__name__}: {detail}); retry shortly",
            kind="overloaded",
            retry_after_s=retry_after_s,
        )
    return from_unexpected(exc)


def from_unexpected(exc: BaseException) -> ProxyError:
    return ProxyError(500, f"internal error: {type(exc).__name__}: {exc}", kind="internal")


def from_stream_failure(exc: Exception, *, retry_after_s: int) -> ProxyError:
    """What a stream that failed mid-way tells its client: a backend failure as :func:`from_backend_error` maps
    it, anything else as an internal error."""
    if isinstance(exc, BackendError):
        return from_backend_error(exc, retry_after_s=retry_after_s)
    return from_unexpected(exc)
