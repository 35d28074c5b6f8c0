"""Merge several backend streams into one ordered feed, with keep-alive ticks while nothing arrives.

Each stream is read by its own task, so one slow choice (n > 1) never blocks another, and a quiet spell (a long
prefill on CPU) yields ``None`` every ``keepalive_s`` seconds so the caller can send an SSE keep-alive. Closing the
merged iterator (client gone) cancels the reader tasks and closes every backend stream, which is how a backend
learns to stop generating.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from openclaw_cli.types import StreamEvent

_END = object()


async def merged_events(
    streams: list[AsyncIterator[StreamEvent]], *, keepalive_s: float
) -> AsyncGenerator[tuple[int, StreamEvent] | None, None]:
    """Yield ``(stream index, event)`` in arrival order, or ``None`` after ``keepalive_s`` of silence.

    The first exception raised by any stream is re-raised here (after the others are stopped).
    """
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def read(index: int, stream: AsyncIterator[StreamEvent]) -> None:
        try:
            async for event in stream:
                queue.put_nowait((index, event))
        except Exception as exc:  # handed to the consumer, which decides how to report it
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, _END))

    readers = [asyncio.create_task(read(i, s)) for i, s in enumerate(streams)]
    getter: asyncio.Task[tuple[int, Any]] | None = None
    open_streams = len(streams)
    try:
        while open_streams:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                # A getter task survives timeouts, so an item can never be lost to a cancelled get().
                getter = getter or asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter}, timeout=keepalive_s)
                if not done:
                    yield None
                    continue
                item, getter = getter.result(), None
            index, event = item
            if event is _END:
                open_streams -= 1
            elif isinstance(event, Exception):
                raise event
            else:
                yield index, event
    finally:
        if getter is not None:
            getter.cancel()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for stream in streams:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
