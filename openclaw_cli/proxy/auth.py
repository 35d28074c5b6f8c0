"""API-key check for every endpoint but the liveness probes (``/healthz`` and the root).

Clients send the key the way their SDK does: OpenAI's and Claude Code's ``ANTHROPIC_AUTH_TOKEN`` as
``Authorization: Bearer <key>``, Anthropic's SDK as ``x-api-key: <key>``; either is accepted. Keys are compared with
:func:`hmac.compare_digest` so the comparison time does not reveal how much of a guess was right.

Written as plain ASGI middleware (not Starlette's BaseHTTPMiddleware) so streamed responses pass through untouched.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from openclaw_cli.proxy.errors import ProxyError, api_for_path, error_response

OPEN_PATHS = frozenset({"/", "/healthz"})  # liveness probes only: they reveal nothing and run nothing


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The key a request carries: ``x-api-key`` wins over ``Authorization: Bearer``; None when neither is set."""
    bearer: str | None = None
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1").strip()
        if name == "x-api-key" and value:
            return value
        if name == "authorization":
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                bearer = token.strip()
    return bearer


def key_matches(presented: str | None, expected: str) -> bool:
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8"), expected.encode("utf-8"))


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str | None, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.api_key = api_key or None
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.api_key is None or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        presented = presented_key(scope.get("headers", []))
        if key_matches(presented, self.api_key):
            await self.app(scope, receive, send)
            return
        message = (
            "missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
            if presented is None
            else "invalid API key"
        )
        err = ProxyError(401, message, kind="authentication")
        await error_response(err, api_for_path(scope["path"]))(scope, receive, send)
