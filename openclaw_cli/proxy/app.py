"""The proxy's ASGI application (Starlette): the three chat APIs, model listing, health, status and session control.

Every error leaves in the caller's API format (see :mod:`openclaw_cli.proxy.errors`), including 404/405 for
unknown routes and unexpected exceptions, so an SDK always raises its own typed error rather than failing to parse.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openclaw_cli.backend import Backend, BackendError
from openclaw_cli.capture import CaptureSink
from openclaw_cli.lesson_prompt import LessonBook
from openclaw_cli.proxy import anthropic_api, lesson_routes, openai_api, responses_api
from openclaw_cli.proxy.auth import ApiKeyMiddleware, check_bind
from openclaw_cli.proxy.capture_recorder import CaptureRecorder
from openclaw_cli.proxy.completion import output_cap, template_drops_tools
from openclaw_cli.proxy.control import read_section, version_control_routes, version_status
from openclaw_cli.proxy.errors import (
    ErrorKind,
    ProxyError,
    api_for_path,
    error_response,
    from_backend_error,
    from_unexpected,
)
from openclaw_cli.proxy.limits import InFlightLimitMiddleware
from openclaw_cli.proxy.models import ModelCatalog
from openclaw_cli.proxy.state import ProxyState, proxy_state
from openclaw_cli.settings import Settings

log = logging.getLogger("openclaw.proxy")


class _UnexpectedErrorMiddleware:
    """Turns an exception that escaped a handler into a 500 in the caller's format (when no response has started)
    instead of Starlette's plain-text page."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("unhandled error on %s", scope.get("path"))
            if started:
                raise
            await error_response(from_unexpected(exc), api_for_path(scope["path"]))(scope, receive, send)


def create_app(
    backend: Backend,
    sink: CaptureSink | None,
    settings: Settings,
    *,
    lessons: LessonBook | None = None,
    lesson_desk: Any = None,
) -> Starlette:
    """The ASGI app serving ``backend`` (already started) and handing each completed reply to ``sink``.

    ``lessons`` (the book of active lessons) and ``lesson_desk`` (what the lesson and feedback routes call) come from
    whoever runs the learning loops; without them requests are served as sent and those routes answer 501.

    Raises :class:`~openclaw_cli.proxy.auth.ProxyConfigError` when ``settings.host`` is not loopback and no API key
    is set: an app meant for such a bind must carry a key whoever runs it.

    A plain Starlette app: the handlers read and check their bodies themselves (see validation.py), so FastAPI's
    dependency injection and response models would only add per-request work on the hot path.
    """
    check_bind(settings)
    app = Starlette(
        # Listed outermost first. The key check runs before the in-flight cap, so only requests that passed it
        # take an in-flight slot.
        middleware=[
            Middleware(_UnexpectedErrorMiddleware),
            Middleware(ApiKeyMiddleware, api_key=settings.accepted_api_keys()),
            Middleware(
                InFlightLimitMiddleware,
                max_in_flight=settings.proxy.max_in_flight,
                retry_after_s=settings.proxy.retry_after_s,
            ),
        ],
        exception_handlers=_error_handlers(),
    )
    context = int(backend.tokenizer().context_length)  # the backend is started (see the docstring)
    app.state.proxy = ProxyState(
        backend=backend,
        sink=sink,
        settings=settings,
        catalog=ModelCatalog.from_settings(
            settings,
            context_window=context,
            max_output_tokens=output_cap(settings.proxy.max_output_tokens, context),
        ),
        recorder=CaptureRecorder(
            sink, timeout_s=settings.proxy.capture_timeout_s, max_backlog=settings.proxy.capture_max_backlog
        ),
        lessons=lessons,
        lesson_desk=lesson_desk,
    )
    # The generation endpoints first: the router tries routes in order.
    app.router.routes.extend(
        [
            *openai_api.routes,
            *responses_api.routes,
            *anthropic_api.routes,
            *_control_routes(),
            *lesson_routes.routes,
            *version_control_routes(app),
        ]
    )
    return app


def _error_handlers() -> dict[Any, Any]:
    async def on_proxy_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProxyError)
        return error_response(exc, api_for_path(request.url.path))

    async def on_backend_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, BackendError)
        retry_after = proxy_state(request).settings.proxy.retry_after_s
        return error_response(from_backend_error(exc, retry_after_s=retry_after), api_for_path(request.url.path))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind: ErrorKind = "not_found" if exc.status_code == 404 else "invalid_request"
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(ProxyError(exc.status_code, message, kind=kind), api_for_path(request.url.path))

    return {ProxyError: on_proxy_error, BackendError: on_backend_error, StarletteHTTPException: on_http_error}


def _control_routes() -> list[Route]:
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    # Claude Code warms its connection with an unauthenticated ``HEAD <ANTHROPIC_BASE_URL>`` at start-up; answering
    # it (rather than 404/401) keeps that probe, and any browser or load-balancer check of the root, clean.
    async def root(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "service": "openclaw proxy"})

    async def status(request: Request) -> JSONResponse:
        state = proxy_state(request)
        version = state.backend.current_version()
        body: dict[str, Any] = {
            "backend": state.backend.name,
            "served_model": state.catalog.served_name,
            "model_names": state.catalog.names,
            "policy_version": version.version,
            "policy_name": version.name,
            "in_flight": state.in_flight,
            "requests_total": state.requests_total,
            "captured": state.recorder.recorded,
            "capture_failures": state.recorder.failed,
            "opted_out": state.recorder.opted_out,
            "uptime_s": round(time.time() - state.started_at, 3),
            "capture": state.recorder.stats(),
            "backend_health": state.health.to_json(),
        }
        if template_drops_tools(state.backend.tokenizer()):
            body["warnings"] = [
                "this model's chat template drops tool definitions: agents' tools never reach the model (they still "
                "count against the context); use a model whose template renders tools for agent work"
            ]
        versions = version_status(request.app)
        if versions is not None:
            body["versions"] = versions
        serving = getattr(state.backend, "serving_status", None)  # e.g. the vLLM servers a local backend serves from
        if callable(serving):
            body["serving"] = serving()
        # Store reads run off the event loop, time-limited: a busy store must not stall the replies being served.
        stats = getattr(state.sink, "stats", None)
        if stats is not None:
            body["sink"] = await read_section(state, "sink", stats)
        for name, read in list(state.status_sections.items()):
            body[name] = await read_section(state, name, read)
        return JSONResponse(body)

    async def end_session(request: Request) -> JSONResponse:
        state = proxy_state(request)
        session_id = request.path_params["session_id"]
        end = getattr(state.sink, "end_session", None)
        if end is None:
            raise ProxyError(501, "this capture sink cannot end sessions", kind="unsupported")
        ended = bool(await end(session_id))
        return JSONResponse({"session_id": session_id, "ended": ended})

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/v1/openclaw/status", status, methods=["GET"]),
        Route("/v1/openclaw/sessions/{session_id}/end", end_session, methods=["POST"]),
    ]
