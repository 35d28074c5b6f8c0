"""Retention: with ``store.retention_days = N``, turns captured more than N days ago are deleted.

The purge runs once when ``openclaw serve`` / ``openclaw launch`` start and then every :data:`PURGE_EVERY_S` while
they run. What it deletes and keeps is :meth:`openclaw_cli.store.Store.purge_older_than`'s rule: every turn older
than the cutoff (payload, token ids, prefix-index entries, judge/trainer results), except turns a judge or trainer
holds a live claim on, then the sessions left empty. Age is the turn's capture time, so a conversation that goes on
for weeks keeps its recent turns, and those carry the earlier messages as their own prompt until they, too, age
out. Training metrics (``steps``) hold no conversation text and are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings
    from openclaw_cli.store import PurgeResult, Store

log = logging.getLogger("openclaw.retention")

PURGE_EVERY_S = 3600.0
DAY_S = 86400.0


def retention_cutoff(settings: Settings, now: float | None = None) -> float | None:
    """Turns captured before this time (Unix seconds) are due for deletion; None when retention is off."""
    days = settings.store.retention_days
    if days is None:
        return None
    return (time.time() if now is None else now) - days * DAY_S


def purge_expired(store: Store, settings: Settings, *, now: float | None = None) -> PurgeResult | None:
    """Delete what ``store.retention_days`` no longer keeps; None when retention is off. Blocking (run it in a
    worker thread from asyncio)."""
    now = time.time() if now is None else now
    cutoff = retention_cutoff(settings, now)
    if cutoff is None:
        return None
    result = store.purge_older_than(cutoff, now=now)
    if result.turns or result.sessions:
        log.info(
            "retention (%d days): deleted %d turns and %d sessions",
            settings.store.retention_days,
            result.turns,
            result.sessions,
        )
    return result


async def retention_loop(
    store: Store, settings: Settings, stop: asyncio.Event, *, every_s: float = PURGE_EVERY_S, run_first: bool = True
) -> None:
    """Purge now (``run_first``) and then every ``every_s`` seconds until ``stop`` is set; a failure is logged and
    retried next round. Returns at once when retention is off."""
    if settings.store.retention_days is None:
        return
    first = run_first
    while not stop.is_set():
        if not first:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every_s)
                return
        first = False
        try:
            await asyncio.to_thread(purge_expired, store, settings)
        except Exception:
            log.exception("retention purge failed; will retry in %.0fs", every_s)
