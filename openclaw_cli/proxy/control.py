"""Routes beside the chat APIs: which policy versions can serve, rolling back to one, handing callers their adapter,
and the blocking parts of ``/v1/openclaw/status``.

``GET /v1/openclaw/versions`` -> ``{"adapter": ..., "current": N, "current_name": ..., "servable": [0, ...]}``.

``POST /v1/openclaw/rollback`` with ``{"version": N}`` switches serving to version N at once (requests already
running finish on the version they started with) and, where the backend can, makes the trainer continue from that
version's weights (local: a fresh optimizer; Tinker/Fireworks: that version's saved optimizer state), so the next
training step builds on what is served rather than republishing the abandoned weights. Answers: 200 with the new
and previous version; 400 for a body without an integer ``version``; 404 naming the servable versions when N is
unknown or no longer kept (the base 0 and the last ``keep_versions`` published); 501 when the backend cannot switch
versions. Same API key as every other route.

``GET /v1/openclaw/adapter`` -> the caller's adapter at its current version as a PEFT LoRA adapter, gzipped tar
(``adapter_config.json``, ``adapter_model.safetensors``): an owner's weights are theirs to take; 404 before its first
training step, 501 where the backend cannot export.

All three act on the caller's own adapter (openclaw_cli.adapters): with ``lora.scope = owner`` a key's owner sees
and rolls back its adapter's versions only, numbered as its own (an owner can never name, see or switch another
owner's versions); with one adapter for everyone they act on that one.

Status sections (the store's counts, the runtime's loop backlog) read SQLite, which can wait on a busy writer: they
run in a worker thread with a time limit, one read per section at a time, so a slow store makes ``status`` answer
with an error for that section instead of blocking the event loop that serves replies.
"""

from __future__ import annotations

import asyncio
import io
import logging
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openclaw_cli.adapters import ADAPTER_HEADER, adapter_of
from openclaw_cli.backend import BackendError, supports_version_control
from openclaw_cli.proxy.errors import ProxyError, from_backend_error
from openclaw_cli.proxy.respond import request_owner
from openclaw_cli.proxy.state import ProxyState, proxy_state
from openclaw_cli.proxy.validation import read_json_body

log = logging.getLogger("openclaw.proxy.control")

VERSIONS_PATH = "/v1/openclaw/versions"
ROLLBACK_PATH = "/v1/openclaw/rollback"
ADAPTER_PATH = "/v1/openclaw/adapter"
SECTION_TIMEOUT_S = 2.0
MAX_CONTROL_BODY_BYTES = 4096
KEEP_ROLLBACKS = 20
TRAINER_NOTE = (
    "the trainer continues from this version's weights (local backend: optimizer state reset; "
    "Tinker/Fireworks: that version's saved optimizer state)"
)


def _require_version_control(state: ProxyState, adapter: str) -> Any:
    """The backend as the caller's ``adapter`` sees it (``lora.scope = owner``: the adapter of the caller's key or
    session, never another's; else the one shared adapter), for its versions."""
    backend = state.serving(adapter)
    if not supports_version_control(backend):
        raise ProxyError(
            501,
            f"backend {backend.name!r} cannot switch the served policy version (it has no stage/activate/"
            "servable_versions); rollback and the promotion gate need a backend that can, e.g. local",
            kind="unsupported",
        )
    return backend


def caller_adapter(request: Request, state: ProxyState) -> str:
    """The adapter that serves the caller (its API key's owner, or its session's with ``lessons.scope = session``)."""
    return adapter_of(state.settings, request_owner(request, state.settings, {}))


def _version_from(body: dict[str, Any]) -> int:
    version = body.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ProxyError(400, "'version' must be a policy version number (an integer >= 0)", param="version")
    return version


def version_control_routes(app: Starlette) -> list[Route]:
    """``GET /v1/openclaw/versions`` and ``POST /v1/openclaw/rollback`` for ``app`` (they keep its rollback log)."""
    app.state.rollbacks = []  # the latest rollbacks, newest last (for status)
    lock = asyncio.Lock()  # one switch at a time: two rollbacks racing would leave either version serving

    async def versions(request: Request) -> JSONResponse:
        state = proxy_state(request)
        adapter = caller_adapter(request, state)
        backend = _require_version_control(state, adapter)
        current = backend.current_version()
        return JSONResponse(
            {
                "adapter": adapter,
                "current": current.version,
                "current_name": current.name,
                "servable": backend.servable_versions(),
            }
        )

    async def rollback(request: Request) -> JSONResponse:
        state = proxy_state(request)
        adapter = caller_adapter(request, state)
        backend = _require_version_control(state, adapter)
        version = _version_from(await read_json_body(request, MAX_CONTROL_BODY_BYTES))
        async with lock:
            servable = backend.servable_versions()
            previous = backend.current_version()
            if version not in servable:
                known = ", ".join(str(v) for v in servable)
                raise ProxyError(
                    404,
                    f"policy version {version} is not available to roll back to; servable versions: {known} "
                    "(the base model 0 and the most recent published versions its keep_versions setting keeps)",
                    kind="not_found",
                    param="version",
                )
            try:
                info = await backend.activate(version, train_from=True)
            except BackendError as exc:
                raise from_backend_error(exc, retry_after_s=state.settings.proxy.retry_after_s) from None
        event = {
            "at": time.time(),
            "adapter": adapter,
            "policy_version": info.version,
            "policy_name": info.name,
            "previous_version": previous.version,
        }
        app.state.rollbacks[:] = [*app.state.rollbacks[-(KEEP_ROLLBACKS - 1) :], event]
        log.warning(
            "rolled back adapter %s: serving version %d (was %d); %s",
            adapter,
            info.version,
            previous.version,
            TRAINER_NOTE,
        )
        return JSONResponse({**event, "servable_versions": backend.servable_versions(), "trainer": TRAINER_NOTE})

    return [
        Route(VERSIONS_PATH, versions, methods=["GET"]),
        Route(ROLLBACK_PATH, rollback, methods=["POST"]),
        Route(ADAPTER_PATH, _export_adapter, methods=["GET"]),
    ]


async def _export_adapter(request: Request) -> Response:
    """``GET /v1/openclaw/adapter``: the caller's own adapter at its current version, a PEFT adapter as tar.gz."""
    state = proxy_state(request)
    name = caller_adapter(request, state)
    backend = state.serving(name)
    export = getattr(backend, "export_adapter", None)
    if export is None:
        raise ProxyError(501, f"backend {backend.name!r} cannot export adapter weights", kind="unsupported")
    with tempfile.TemporaryDirectory(prefix="openclaw-adapter-") as tmp:
        try:
            info = await export(Path(tmp) / "adapter")
        except BackendError as exc:
            raise from_backend_error(exc, retry_after_s=state.settings.proxy.retry_after_s) from None
        body = await asyncio.to_thread(_tar_gz, Path(tmp) / "adapter")
    headers = {
        "content-disposition": f'attachment; filename="adapter-v{info.version}.tar.gz"',
        ADAPTER_HEADER: name,
        "x-openclaw-policy-version": str(info.version),
    }
    return Response(body, media_type="application/gzip", headers=headers)


def _tar_gz(directory: Path) -> bytes:
    """``directory``'s files in a gzipped tar, under their own names."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(directory.iterdir()):
            tar.add(path, arcname=path.name)
    return buffer.getvalue()


def version_status(app: Starlette) -> dict[str, Any] | None:
    """Servable versions and recent rollbacks for status; None when the backend cannot switch versions."""
    backend = app.state.proxy.backend
    if not supports_version_control(backend):
        return None
    try:
        servable = backend.servable_versions()
    except Exception as exc:  # status must answer even when the backend is unhappy
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"servable": servable, "rollbacks": list(getattr(app.state, "rollbacks", []))}


async def read_section(state: ProxyState, name: str, read: Callable[[], Any]) -> Any:
    """Run one blocking status read in a worker thread (at most one per section at a time), bounded in time."""
    pending: asyncio.Future[Any] | None = state.status_reads.get(name)
    if pending is None or pending.done():
        pending = asyncio.ensure_future(asyncio.to_thread(read))
        state.status_reads[name] = pending
    try:
        # shield: a timed-out read keeps its thread until it returns; the next status call waits on the same one.
        return await asyncio.wait_for(asyncio.shield(pending), timeout=SECTION_TIMEOUT_S)
    except TimeoutError:
        return {"error": f"no answer within {SECTION_TIMEOUT_S:.0f}s (is the store busy?)"}
    except Exception as exc:  # status must answer even when the store is unhappy
        return {"error": f"{type(exc).__name__}: {exc}"}
