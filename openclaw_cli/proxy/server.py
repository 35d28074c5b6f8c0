"""Running the proxy: :func:`run_server` for ``openclaw serve`` and :class:`BackgroundServer` for tests, examples
and benchmarks that need a real HTTP server in-process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from openclaw_cli import eventloop
from openclaw_cli.backend import create_backend
from openclaw_cli.capture.retention import retention_loop
from openclaw_cli.loopback import is_loopback
from openclaw_cli.proxy.app import create_app
from openclaw_cli.proxy.auth import ProxyConfigError, check_bind
from openclaw_cli.settings import Settings

__all__ = ["BackgroundServer", "ProxyConfigError", "check_bind", "is_loopback", "run_server", "serve"]

log = logging.getLogger("openclaw.proxy")


async def _expire_idle_loop(sink: Any, every_s: float) -> None:
    """Close sessions that went quiet, so their last turn becomes trainable; a failure is logged and retried."""
    while True:
        await asyncio.sleep(every_s)
        try:
            expired = await sink.expire_idle()
            if expired:
                log.info("expired %d idle session(s)", expired)
        except Exception:
            log.exception("expiring idle sessions failed; will retry")


async def serve(settings: Settings, *, lesson_keeper: Callable[..., Any] | None = None) -> None:
    """Start the backend and store, serve until interrupted, then close everything in reverse order.

    ``lesson_keeper(store, backend, settings)`` builds the lessons' keeper (the learning wing's
    :func:`openclaw_cli.learn.lessons.lesson_keeper`, which ``openclaw serve`` passes in: the proxy never imports
    learning); without it requests are served without lessons."""
    check_bind(settings)
    try:  # the store ships alongside the proxy; import late so the proxy package imports without it
        from openclaw_cli.capture.sessions import SessionCapture
        from openclaw_cli.store import Store
    except ImportError as exc:
        raise ProxyConfigError(f"the capture store is not available ({exc}); cannot serve") from exc

    backend = create_backend(settings)
    await backend.start()
    store = Store(settings.store.path)
    expirer: asyncio.Task[None] | None = None
    retention: asyncio.Task[None] | None = None
    stop_retention = asyncio.Event()
    lesson_tasks: list[asyncio.Task[None]] = []
    try:
        sink = SessionCapture(store, settings)
        keeper = lesson_keeper(store, backend, settings) if lesson_keeper is not None else None
        app = create_app(
            backend,
            sink,
            settings,
            lessons=keeper.book if keeper is not None else None,
            lesson_desk=keeper,
        )
        expirer = asyncio.create_task(_expire_idle_loop(sink, settings.proxy.expire_every_s))
        # Lessons act under `serve` too: found in the users' corrections, verified, served (never retired: nothing
        # trains here).
        if keeper is not None:
            app.state.proxy.status_sections["lessons"] = keeper.status
            lesson_tasks += keeper.start(stop_retention).values()
        # store.retention_days: purge at start, then hourly (returns at once when retention is off)
        retention = asyncio.create_task(retention_loop(store, settings, stop_retention))
        config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info", access_log=False)
        await uvicorn.Server(config).serve()
        # Replies already served whose capture the store has not written yet (a slow store): let them land.
        left = await app.state.proxy.recorder.drain(30.0)
        if left:
            log.error("%d replies were served but their capture did not finish before shutdown", left)
    finally:
        if expirer is not None:
            expirer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await expirer
        stop_retention.set()
        for task in lesson_tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=30)
        if retention is not None:  # a purge in progress finishes its current batch first
            with contextlib.suppress(Exception):
                await asyncio.wait_for(retention, timeout=30)
        try:
            await backend.close()
        finally:
            store.close()


def run_server(settings: Settings, *, lesson_keeper: Callable[..., Any] | None = None) -> None:
    """Blocking entry point of ``openclaw serve`` (on uvloop when installed, see :mod:`openclaw_cli.eventloop`)."""
    eventloop.run(serve(settings, lesson_keeper=lesson_keeper))


class BackgroundServer:
    """Serve an ASGI app on 127.0.0.1 (a free port) from a daemon thread with its own event loop.

    ``with BackgroundServer(app) as server: ... server.base_url ...``; leaving the block stops the server. The
    socket is bound before the thread starts, so the port is known and free of races.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", start_timeout_s: float = 15.0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self.host, self.port = self._sock.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"proxy-{self.port}", daemon=True)
        self._start_timeout_s = start_timeout_s

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self) -> None:
        self._server.run(sockets=[self._sock])

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("background server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
