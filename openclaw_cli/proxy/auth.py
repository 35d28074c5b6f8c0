"""API-key check for every endpoint but the liveness probes (``/healthz`` and the root), and the bind rule.

The liveness probes stay open on purpose (load balancers and Claude Code's start-up ``HEAD /`` send no key); they
answer a fixed ``{"status": "ok"}`` and reveal nothing else: no model, version, counts or settings. Everything else
(both chat APIs, count_tokens, model listing, status, session control, unknown paths) needs the key once one is set.

**Bind rule** (:func:`check_bind`): listening anywhere but loopback without a key is refused, by ``openclaw serve``,
``openclaw launch``, :func:`openclaw_cli.launch.launch`, :func:`openclaw_cli.proxy.run_server` and
:func:`openclaw_cli.proxy.create_app` alike.

Clients send the key the way their SDK does: OpenAI's and Claude Code's ``ANTHROPIC_AUTH_TOKEN`` as
``Authorization: Bearer <key>``, Anthropic's SDK as ``x-api-key: <key>``; either is accepted. Keys are compared with
:func:`hmac.compare_digest` so the comparison time does not reveal how much of a guess was right.

Written as plain ASGI middleware (not Starlette's BaseHTTPMiddleware) so streamed responses pass through untouched.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Receive, Scope, Send

from openclaw_cli.loopback import is_loopback
from openclaw_cli.proxy.errors import ProxyError, api_for_path, error_response

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings

OPEN_PATHS = frozenset({"/", "/healthz"})  # liveness probes only: they reveal nothing and run nothing


class ProxyConfigError(ValueError):
    """The proxy cannot start with these settings (the message says what to change)."""


def check_bind(settings: Settings) -> None:
    """Refuse to expose the proxy beyond this machine without an API key."""
    if not is_loopback(settings.host) and not settings.accepted_api_keys():
        raise ProxyConfigError(
            f"refusing to listen on {settings.host}: any bind other than 127.0.0.1 / localhost / ::1 needs an API "
            "key (set api_key in openclaw.toml or OPENCLAW_API_KEY); clients then send it as a Bearer token or "
            "x-api-key"
        )


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


def key_matches(presented: str | None, expected: str | Sequence[str]) -> bool:
    """Whether ``presented`` is one of the expected keys; every key is compared (no early exit) in constant time."""
    if presented is None:
        return False
    keys = [expected] if isinstance(expected, str) else list(expected)
    given = presented.encode("utf-8")
    found = False
    for key in keys:
        found |= hmac.compare_digest(given, key.encode("utf-8"))
    return found


class ApiKeyMiddleware:
    """``api_key``: one key or several (``api_key`` + ``api_keys``, one per person); None or empty = no check."""

    def __init__(
        self, app: ASGIApp, api_key: str | Sequence[str] | None, open_paths: frozenset[str] = OPEN_PATHS
    ) -> None:
        self.app = app
        keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
        self.api_keys = [key for key in keys if key]
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.api_keys:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        presented = presented_key(scope.get("headers", []))
        if key_matches(presented, self.api_keys):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # no websocket route exists; refuse before any router sees one
            await send({"type": "websocket.close", "code": 1008})
            return
        message = (
            "missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
            if presented is None
            else "invalid API key"
        )
        err = ProxyError(401, message, kind="authentication")
        await error_response(err, api_for_path(scope["path"]))(scope, receive, send)
