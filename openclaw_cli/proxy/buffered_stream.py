"""A streamed request whose reply must be complete before any of it is sent (tool_choice required, one tool call at
most, response_format: see constraints.py), without leaving the client in silence meanwhile.

Checking a constraint and resampling can take a while (several whole generations on a CPU). A reply ready within
``proxy.keepalive_s`` is answered as before: a failure is a plain HTTP error (e.g. 502 ``constraint_not_met``), a
success the replayed stream. Past that, the stream starts at once and carries keep-alives (an SSE comment, which
every SSE parser skips) every ``keepalive_s`` until the reply is known; then the reply follows, or an error event in
the API's streaming error format, as a stream failing mid-way reports it. A client that leaves cancels the sampling
either way. The in-flight lease is held until the sampling ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from openclaw_cli.backend import BackendError
from openclaw_cli.proxy.disconnect import ClientGone, unless_disconnected
from openclaw_cli.proxy.errors import ProxyError, from_backend_error, from_unexpected
from openclaw_cli.proxy.sse import SSE_HEADERS, SSE_MEDIA_TYPE
from openclaw_cli.proxy.state import InFlightLease

log = logging.getLogger("openclaw.proxy")

T = TypeVar("T")
Frames = AsyncIterator[bytes]


async def buffered_stream_response(
    request: Request,
    work: Awaitable[T],
    *,
    lease: InFlightLease,
    keepalive_s: float,
    keepalive_frame: bytes,
    replay: Callable[[T], Awaitable[tuple[Frames, dict[str, str]]]],
    error_frame: Callable[[ProxyError], bytes],
    early_headers: dict[str, str],
    retry_after_s: int,
) -> Response:
    """Run ``work`` (the sampling) and answer with the stream ``replay(result)`` gives (it records the exchange and
    returns the frames and headers); keep-alives first when ``work`` outlasts ``keepalive_s``. ``early_headers`` are
    sent when the stream has to start before the reply is known."""
    task = asyncio.ensure_future(work)
    try:
        await unless_disconnected(request, asyncio.wait({task}, timeout=keepalive_s))
    except ClientGone:
        task.cancel()
        lease.release()
        return Response(status_code=499)
    except BaseException:
        task.cancel()
        lease.release()
        raise
    if task.done():
        lease.release()
        frames, headers = await replay(task.result())  # a failed sampling raises here: a plain HTTP error
        return StreamingResponse(frames, media_type=SSE_MEDIA_TYPE, headers={**SSE_HEADERS, **headers})
    return StreamingResponse(
        _keepalives_then_reply(task, lease, keepalive_s, keepalive_frame, replay, error_frame, retry_after_s),
        media_type=SSE_MEDIA_TYPE,
        headers={**SSE_HEADERS, **early_headers},
    )


async def _keepalives_then_reply(
    task: asyncio.Future[T],
    lease: InFlightLease,
    keepalive_s: float,
    keepalive_frame: bytes,
    replay: Callable[[T], Awaitable[tuple[Frames, dict[str, str]]]],
    error_frame: Callable[[ProxyError], bytes],
    retry_after_s: int,
) -> Frames:
    try:
        while not task.done():
            yield keepalive_frame
            await asyncio.wait({task}, timeout=keepalive_s)
        lease.release()
        try:
            frames, _ = await replay(task.result())
        except Exception as exc:
            if isinstance(exc, ProxyError):
                err = exc
            elif isinstance(exc, BackendError):
                err = from_backend_error(exc, retry_after_s=retry_after_s)
            else:
                err = from_unexpected(exc)
            log.error("buffered stream failed after it started: %s", err.message)
            yield error_frame(err)
            return
        async for frame in frames:
            yield frame
    finally:
        task.cancel()  # a no-op once it is done; the client left otherwise
        lease.release()
