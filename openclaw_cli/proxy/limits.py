"""The proxy's cap on chat requests served at once (``proxy.max_in_flight``).

A request past the cap is answered at once, before its body is read, with 429 ``rate_limit_exceeded`` to OpenAI
clients and 529 ``overloaded_error`` to Anthropic clients, both with ``Retry-After``: the status each SDK (and Claude
Code) backs off and retries on. A streamed reply counts until its last byte is sent. Only the generation endpoints
count; status, model listing and health answer however busy the proxy is.

Plain ASGI middleware (streams pass through untouched); it runs inside the API-key check, so requests without a
valid key never take a slot. All requests of one app run on one event loop, so the counter needs no lock.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from openclaw_cli.proxy.errors import ProxyError, api_for_path, error_response

LIMITED_PATHS = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"})


class InFlightLimitMiddleware:
    def __init__(
        self, app: ASGIApp, *, max_in_flight: int, retry_after_s: int, paths: frozenset[str] = LIMITED_PATHS
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.app = app
        self.max_in_flight = max_in_flight
        self.retry_after_s = max(1, retry_after_s)  # "Retry-After: 0" makes clients hammer the proxy
        self.paths = paths
        self.active = 0
        self.rejected = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or (path.rstrip("/") or "/") not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.active >= self.max_in_flight:
            self.rejected += 1
            err = ProxyError(
                429,
                f"the proxy is already serving {self.active} requests, its limit (proxy.max_in_flight); "
                f"retry after {self.retry_after_s}s",
                kind="busy",
                retry_after_s=self.retry_after_s,
            )
            await error_response(err, api_for_path(path))(scope, receive, send)
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
