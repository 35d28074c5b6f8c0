"""Starting a streamed reply: open the backend stream(s) and wait for the first event before the HTTP answer.

Waiting (at most one keep-alive interval) means a failure at the very start — a busy backend, a prompt the backend
rejects — still gets a proper HTTP status and error body instead of a 200 with an error inside the stream. A
prefill longer than that starts the stream anyway, with keep-alives until tokens flow.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from openclaw_cli.backend import BackendError
from openclaw_cli.proxy.completion import PreparedPrompt, open_streams
from openclaw_cli.proxy.errors import UNAVAILABLE_ERRORS, from_backend_exception
from openclaw_cli.proxy.event_merge import merged_events
from openclaw_cli.proxy.state import InFlightLease, ProxyState


@dataclass
class OpenStream:
    events: AsyncGenerator[tuple[int, Any] | None, None]  # see event_merge.merged_events
    first: tuple[int, Any] | None  # the first item, already taken from ``events``
    lease: InFlightLease
    version: int  # policy version of the first event (or the current one while nothing has arrived)

    async def close(self) -> None:
        """Idempotent: stops the backend stream(s) and releases the in-flight count."""
        try:
            await self.events.aclose()
        finally:
            self.lease.release()


async def open_stream(state: ProxyState, prepared: PreparedPrompt, n: int = 1) -> OpenStream:
    lease = state.lease()
    backend = state.serving(prepared.adapter)
    events = merged_events(open_streams(backend, prepared, n), keepalive_s=state.settings.proxy.keepalive_s)
    try:
        first = await events.__anext__()
    except BaseException as exc:
        lease.release()
        await events.aclose()
        if isinstance(exc, (BackendError, *UNAVAILABLE_ERRORS)):
            state.health.failed(exc)
            raise from_backend_exception(exc, retry_after_s=state.settings.proxy.retry_after_s) from None
        raise
    if first is not None:
        state.health.succeeded()
    version = first[1].version if first is not None else backend.current_version().version
    return OpenStream(events, first, lease, version)
