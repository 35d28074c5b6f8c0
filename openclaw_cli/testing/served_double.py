"""What every HTTP service double shares: its Starlette app served on 127.0.0.1 (a free port) from a background
thread while it runs; ``with Double(...) as double:`` starts and stops it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from openclaw_cli.proxy.server import BackgroundServer


class ServedDouble:
    app: Any  # the double's ASGI app, built by the subclass
    _server: BackgroundServer | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not running; use it as a context manager")
        return self._server.base_url

    def start(self) -> Self:
        from openclaw_cli.proxy.server import BackgroundServer

        self._server = BackgroundServer(self.app).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.release()

    def release(self) -> None:
        """What the double frees once its server has stopped (models, threads, files)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
