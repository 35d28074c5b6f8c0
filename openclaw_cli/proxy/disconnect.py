"""Stop work for a client that has gone away before a non-streamed reply was ready."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the reply was ready; nothing was recorded."""


async def _disconnected(request: Request) -> None:
    # The body has been read in full, so the only message left to receive is http.disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise :class:`ClientGone`.

    ``work`` runs in the caller's own task (no second task, no ``asyncio.wait``: this is on every request's path);
    a watcher task cancels the caller when the disconnect arrives, and that cancellation becomes ClientGone.
    """
    caller = asyncio.current_task()
    assert caller is not None, "unless_disconnected must run inside a task"
    gone = finished = False

    def on_watcher_done(watcher: asyncio.Task[None]) -> None:
        nonlocal gone
        # ``finished``: a callback already scheduled when the work ended must not cancel the caller afterwards.
        if not finished and not watcher.cancelled() and watcher.exception() is None:
            gone = True
            caller.cancel()

    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(on_watcher_done)
    try:
        return await work
    except asyncio.CancelledError:
        if gone and caller.uncancel() == 0:  # cancelled by the watcher alone, not also from outside
            raise ClientGone() from None
        raise
    finally:
        finished = True
        watcher.cancel()
