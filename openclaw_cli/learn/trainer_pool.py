"""Training an adapter per owner: one :class:`~openclaw_cli.learn.trainer_loop.TrainerLoop` per adapter, in turn.

With ``lora.scope = "owner"`` (openclaw_cli.adapters) each owner's turns train that owner's adapter only: its own
loop claims them (store consumer ``trainer@<adapter>``), builds its batches, steps, publishes and checkpoints that
adapter (under ``local.state_dir/adapters/<name>``), with its own baseline, its own publisher (collapse guard and
promotion gate, ``gate_for``) and crash-safe ledger, exactly as the one loop of a shared adapter does. The shared
adapter's loop is always there.

**Fairness.** The backend trains one adapter at a time (one model, the adapters' states swapped in and out), so the
loops take turns: each round goes through the adapters in order of their last step, the one that stepped longest ago
first, and the first whose batch is full takes one step; then the round starts over. An owner with a long backlog
therefore steps once and goes to the back of the line behind every other owner with a full batch: nobody starves,
and an owner alone on the server trains as fast as the shared loop would. When there are many adapters, one with
nothing to train is asked less and less often (every :data:`MAX_IDLE_S` seconds at most, so a judged turn of theirs
waits that long at worst); a few are asked every round, as one shared loop always was. An owner the server has never
seen costs nothing: a loop is made for an adapter the first time a turn it served shows up in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any, Protocol

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backend import Backend
from openclaw_cli.learn.trainer_loop import JUDGE_CONSUMER, StepReport, TrainerLoop, TrainerStats
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.types import PolicyVersion

log = logging.getLogger("openclaw.trainer")
MAX_IDLE_S = 8.0  # the longest an idle adapter waits before its loop looks for judged turns again


class Gate(Protocol):
    """What a loop publishes through (learn.promotion.PromotionGate)."""

    async def publish(self, name: str) -> PolicyVersion: ...

    def last_publish(self) -> dict[str, Any] | None: ...


class TrainerPool:
    """Every adapter's training loop, stepped in turn (see the module docstring). ``stats``, ``waiting``,
    ``resume``, ``run`` and ``checkpoint`` answer for all of them together, as one TrainerLoop does for itself."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        settings: Settings,
        *,
        poll_s: float = 0.5,
        gate_for: Callable[[Backend, str], Gate | None] | None = None,
    ) -> None:
        """``gate_for``: the publisher (collapse guard, promotion gate: learn.promotion.make_publisher) each
        adapter's loop publishes through, made for the backend as that adapter sees it and the adapter's name;
        None: plain publish."""
        self.store = store
        self.backend = backend
        self.settings = settings
        self.poll_s = poll_s
        self._gate_for = gate_for
        self.gates: dict[str, Gate | None] = {}
        self.shared = self._with_gate(TrainerLoop(store, backend, settings, poll_s=poll_s))
        self.loops: dict[str, TrainerLoop] = {SHARED_ADAPTER: self.shared}
        self._last_step_at: dict[str, float] = {SHARED_ADAPTER: 0.0}
        self._seen_turn = 0  # turn ids up to this one were looked at for new adapters
        self._idle_s: dict[str, float] = {}  # how long an adapter that found nothing waits before it is asked again
        self._idle_until: dict[str, float] = {}

    # -- each adapter publishes through its own gate -----------------------------------------------------------------

    def _with_gate(self, loop: TrainerLoop) -> TrainerLoop:
        gate = self._gate_for(loop.backend, loop.adapter) if self._gate_for is not None else None
        self.gates[loop.adapter] = gate
        if gate is not None:
            loop.publisher = gate.publish
            loop.publish_decision = gate.last_publish
        return loop

    @property
    def publisher(self) -> Callable[[str], Awaitable[PolicyVersion]]:
        """The shared adapter's publish (its gate's, when there is one)."""
        return self.shared.publisher

    # -- status ----------------------------------------------------------------------------------------------------

    @property
    def stats(self) -> TrainerStats:
        """Every loop's counters added up; the last error and metrics of the loop that stepped last."""
        total = TrainerStats()
        counters = [f.name for f in fields(TrainerStats) if f.type in ("int", int)]
        for loop in self.loops.values():
            for name in counters:
                setattr(total, name, getattr(total, name) + getattr(loop.stats, name))
        latest = self.loops[max(self._last_step_at, key=lambda a: self._last_step_at[a])]
        total.last_metrics = dict(latest.stats.last_metrics)
        total.rewards = list(latest.stats.rewards)
        errors = [loop.stats.last_error for loop in self.loops.values() if loop.stats.last_error]
        total.last_error = errors[-1] if errors else None
        return total

    @property
    def step(self) -> int:
        return sum(loop.step for loop in self.loops.values())

    def adapters(self) -> list[dict[str, Any]]:
        """Each adapter's serving version and steps (for status; names are owner ids or group names, never keys)."""
        return [
            {"adapter": name, "version": loop.backend.current_version().version, "steps": loop.step}
            for name, loop in sorted(self.loops.items())
        ]

    async def waiting(self) -> int:
        """Judged turns the trainer can still take (what the judge paces itself on, ``judge.max_ahead``): every
        adapter's full batches, plus the largest part-filled batch. One adapter: its own count, as TrainerLoop.waiting.
        The part-filled batches of the other adapters are left out: counted, three owners each a turn short of a
        batch could hold the judge back for good, and no batch would ever fill."""
        batch = self.settings.train.batch_size
        counts = [await loop.waiting() for loop in list(self.loops.values())]
        return sum(n - n % batch for n in counts) + max((n % batch for n in counts), default=0)

    def backlog(self) -> tuple[int, float | None]:
        """(judged turns not trained, the oldest one's ready time) over every adapter (blocking: a store read)."""
        count, oldest = 0, None
        for loop in list(self.loops.values()):
            n, at = self.store.backlog(loop.consumer, after=JUDGE_CONSUMER)
            count += n
            if at is not None and (oldest is None or at < oldest):
                oldest = at
        return count, oldest

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def resume(self) -> int | None:
        """Resume the shared loop and every adapter that ever took a step (see TrainerLoop.resume). Returns the
        shared loop's checkpoint step."""
        resumed = await self.shared.resume()
        for adapter in await asyncio.to_thread(self.store.trained_adapters):
            if adapter != SHARED_ADAPTER:
                await self._loop_for(adapter)
        return resumed

    async def run(self, stop: asyncio.Event) -> None:
        """Step the adapters in turn until ``stop`` is set; then every loop checkpoints."""
        try:
            while not stop.is_set():
                try:
                    await self._discover()
                    stepped = await self.run_once()
                except Exception as exc:  # never let one bad round end training for the whole process
                    log.exception("trainer round failed")
                    self.shared.stats.failures += 1
                    self.shared.stats.last_error = f"{type(exc).__name__}: {exc}"
                    stepped = False
                if not stepped:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=self.poll_s)
        finally:
            await self.checkpoint()

    async def run_once(self) -> bool:
        """One step of the adapter that stepped longest ago among those with a full batch (or a batch dropped for
        no signal, which lets the next one go at once). Returns whether any loop did something."""
        now = time.monotonic()
        for adapter in sorted(self.loops, key=lambda a: self._last_step_at[a]):
            if self._idle_until.get(adapter, 0.0) > now:
                continue
            loop = self.loops[adapter]
            skipped_before = loop.stats.skipped_batches
            report: StepReport | None = await loop.run_once()
            if report is not None or loop.stats.skipped_batches > skipped_before:
                self._last_step_at[adapter] = time.monotonic()
                self._idle_s.pop(adapter, None)
                self._idle_until.pop(adapter, None)
                return True
            self._back_off(adapter, loop)
        return False

    def _back_off(self, adapter: str, loop: TrainerLoop) -> None:
        """An adapter that found nothing to claim is asked again later and later (up to :data:`MAX_IDLE_S`): a
        claim is a write transaction, and a thousand idle owners asked every round would crowd the store. One that
        holds a part-filled batch is asked every round."""
        if loop.pending_turns:
            self._idle_s.pop(adapter, None)
            self._idle_until.pop(adapter, None)
            return
        # The cap grows with the number of adapters: a few are asked every round (as one shared loop always was),
        # a thousand about a hundred a second.
        cap = min(MAX_IDLE_S, self.poll_s * len(self.loops) / 4)
        wait = min(cap, 2 * self._idle_s.get(adapter, self.poll_s / 2))
        self._idle_s[adapter] = wait
        self._idle_until[adapter] = time.monotonic() + wait

    async def checkpoint(self) -> None:
        for adapter, loop in list(self.loops.items()):
            try:
                await loop.checkpoint()
            except Exception:
                log.exception("checkpoint of adapter %s on shutdown failed", adapter)

    async def _discover(self) -> None:
        """Make a loop for every adapter that served a turn the pool has not looked at yet."""
        seen, adapters = await asyncio.to_thread(self.store.adapters_since, self._seen_turn)
        self._seen_turn = seen
        for adapter in adapters:
            if adapter not in self.loops:
                await self._loop_for(adapter)

    async def _loop_for(self, adapter: str) -> TrainerLoop:
        loop = self.loops.get(adapter)
        if loop is None:
            loop = TrainerLoop(self.store, self.backend, self.settings, poll_s=self.poll_s, adapter=adapter)
            self._with_gate(loop)
            await loop.resume()
            self.loops[adapter] = loop
            self._last_step_at[adapter] = 0.0
            log.info("training adapter %s (its own turns only)", adapter)
        return loop
