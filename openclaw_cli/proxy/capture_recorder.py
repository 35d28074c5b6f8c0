"""The capture sink's front door for the proxy: every reply handed over is written by its own task, waited for up to
``capture_timeout_s``, bounded by ``max_backlog`` writes in flight, and counted (see
:mod:`openclaw_cli.proxy.capture_handoff` for when a reply is handed over and what it holds).

Backpressure: when the store is slow, the reply stops waiting after ``capture_timeout_s`` but the write goes on
(*deferred*: the exchange is still stored, in arrival order, once the store catches up). At most ``max_backlog``
writes wait at once; beyond that an exchange is *dropped* (served, not stored), so a stalled store costs bounded
memory. A request with ``X-OpenClaw-Opt-Out`` is never handed to the sink. Every outcome is counted for
``/v1/openclaw/status``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from openclaw_cli.capture import CapturedExchange, CaptureSink, RecordedTurn

log = logging.getLogger("openclaw.proxy.capture")

OPT_OUT_HEADER = "x-openclaw-opt-out"
_TRUE = frozenset({"1", "true", "yes", "on"})


def opted_out(headers: dict[str, str]) -> bool:
    """Whether the client asked for this exchange not to be stored (``headers``: lower-cased names)."""
    return headers.get(OPT_OUT_HEADER, "").strip().lower() in _TRUE


class CaptureRecorder:
    def __init__(self, sink: CaptureSink | None, *, timeout_s: float, max_backlog: int = 256) -> None:
        if max_backlog < 1:
            raise ValueError(f"max_backlog must be >= 1, got {max_backlog}")
        self.sink = sink
        self.timeout_s = timeout_s
        self.max_backlog = max_backlog
        self.recorded = 0  # written to the sink
        self.failed = 0  # the sink raised (or the write was cancelled at shutdown): not stored
        self.dropped = 0  # not even attempted: the backlog was full
        self.deferred = 0  # the reply stopped waiting; the write went on (and counts as recorded/failed when done)
        self.peak_backlog = 0
        self.opted_out = 0  # served with X-OpenClaw-Opt-Out: never handed to the sink
        self.aborted = 0  # streams the client left mid-reply, recorded as partial side turns (never trained)
        self._writes: dict[asyncio.Task[RecordedTurn], float] = {}  # write -> when it was handed over (monotonic)

    @property
    def backlog(self) -> int:
        """Exchanges handed over and not yet written."""
        return len(self._writes)

    def oldest_wait_s(self) -> float:
        """How long the oldest unwritten exchange has waited (0 when none waits)."""
        if not self._writes:
            return 0.0
        return time.monotonic() - min(self._writes.values())

    def stats(self) -> dict[str, Any]:
        return {
            "recorded": self.recorded,
            "failed": self.failed,
            "aborted": self.aborted,
            "dropped": self.dropped,
            "deferred": self.deferred,
            "queue_depth": self.backlog,
            "queue_max": self.max_backlog,
            "queue_peak": self.peak_backlog,
            "oldest_wait_s": round(self.oldest_wait_s(), 3),
        }

    async def record(self, exchange: CapturedExchange) -> RecordedTurn | None:
        """Record one exchange; never raises (the client's reply matters more than its capture).

        Returns the stored turn, or None when the sink failed, the backlog was full, or the store did not answer
        within ``timeout_s`` (then the write is still in progress and will be counted when it ends). Cancelling the
        caller (the client went away) does not cancel a write already handed over.
        """
        if self.sink is None:
            return None
        if opted_out(exchange.headers):
            self.opted_out += 1
            return None
        if len(self._writes) >= self.max_backlog:
            self.dropped += 1
            log.error(
                "capture backlog full (%d replies waiting for the store); this reply was served but not recorded",
                len(self._writes),
            )
            return None
        task = asyncio.ensure_future(self.sink.record(exchange))
        self._writes[task] = time.monotonic()
        self.peak_backlog = max(self.peak_backlog, len(self._writes))
        task.add_done_callback(self._finished)  # registered first: counts are current when the reply goes out
        done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
        if task not in done:
            self.deferred += 1
            log.warning(
                "the store has not recorded a reply after %.1fs; serving it now, the write continues in the background",
                self.timeout_s,
            )
            return None
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def record_aborted(self, exchange: CapturedExchange) -> None:
        """Hand over the partial reply of a stream the client left (from a stream's cleanup, so nothing is awaited);
        counted in ``aborted`` whether or not the store keeps it."""
        self.aborted += 1
        if self.sink is None or opted_out(exchange.headers) or len(self._writes) >= self.max_backlog:
            return
        task = asyncio.ensure_future(self.sink.record(exchange))
        self._writes[task] = time.monotonic()
        self.peak_backlog = max(self.peak_backlog, len(self._writes))
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[RecordedTurn]) -> None:
        self._writes.pop(task, None)
        if task.cancelled():
            self.failed += 1
            log.error("capture cancelled before the store recorded it (shutdown?); the reply was not recorded")
            return
        exc = task.exception()
        if exc is not None:
            self.failed += 1
            log.error("capture failed; the reply was served but not recorded", exc_info=exc)
            return
        self.recorded += 1

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the writes still in progress (shutdown); returns how many did not finish."""
        pending = set(self._writes)
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        return len(self._writes)
