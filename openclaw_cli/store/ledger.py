"""The training ledger: one row per step (written with the completion of its batch in one transaction), the
checkpoints recorded for it, and undoing steps whose weights never reached a checkpoint."""

from __future__ import annotations

import json
import time
from typing import Any

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.store.claims import HandoffQueue
from openclaw_cli.store.codec import dumps_json


class StepLedger(HandoffQueue):
    """Steps and checkpoints, on the ``steps`` and ``checkpoints`` tables."""

    # training steps: one transaction per step, checkpoints, undoing steps lost in a crash ---------------------------
    def commit_step(
        self,
        step: int,
        version: int | None,
        metrics: dict[str, Any],
        consumer: str,
        results: dict[int, Any],
        *,
        adapter: str = SHARED_ADAPTER,
        now: float | None = None,
    ) -> int:
        """In ONE transaction: the step's metrics row, and ``consumer``'s completion of every turn of its batch
        (``results``: turn id -> JSON-able result), each recording ``step`` as the step that consumed it. A crash
        leaves all of it or none. Returns how many turns this call completed (a turn already done keeps its
        earlier result)."""
        now = time.time() if now is None else now
        with self.transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO steps (adapter, step, version, created_at, metrics) VALUES (?, ?, ?, ?, ?)",
                (adapter, step, version, now, dumps_json(metrics)),
            )
            completed = 0
            for turn_id, result in results.items():
                completed += self._complete_in_tx(consumer, turn_id, dumps_json(result), now, step=step)
            if completed:
                self._advance_floor(consumer)
        return completed

    def record_checkpoint(
        self, step: int, path: str, *, adapter: str = SHARED_ADAPTER, now: float | None = None
    ) -> None:
        """Note that the state of ``adapter`` after its ``step`` was saved at ``path`` (what save_state returned)."""
        with self.transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO checkpoints (adapter, step, path, created_at) VALUES (?, ?, ?, ?)",
                (adapter, step, path, time.time() if now is None else now),
            )

    def checkpoints(self, adapter: str = SHARED_ADAPTER) -> list[tuple[int, str]]:
        """Recorded checkpoints of ``adapter`` as (step, path), oldest first."""
        rows = self._read("SELECT step, path FROM checkpoints WHERE adapter = ? ORDER BY step", (adapter,))
        return [(s, p) for s, p in rows]

    def forget_checkpoint(self, step: int, adapter: str = SHARED_ADAPTER) -> None:
        with self.transaction():
            self._conn.execute("DELETE FROM checkpoints WHERE adapter = ? AND step = ?", (adapter, step))

    def discard_steps_after(self, step: int, consumer: str, adapter: str = SHARED_ADAPTER) -> list[int]:
        """Undo the record of every step after ``step``, whose weights are gone (a crash before they reached a
        checkpoint; resume loaded the checkpoint of ``step``): their rows and checkpoint records are deleted and
        every turn ``consumer`` completed as part of them is reopened, so it is trained again, once, in the
        lineage that survived. Returns the reopened turn ids, in ready order."""
        with self.transaction():
            rows = self._conn.execute(
                "SELECT c.turn_id, t.ready_seq FROM claims c JOIN turns t ON t.id = c.turn_id "
                "WHERE c.consumer = ? AND c.step > ? ORDER BY t.ready_seq",
                (consumer, step),
            ).fetchall()
            self._conn.execute("DELETE FROM claims WHERE consumer = ? AND step > ?", (consumer, step))
            self._conn.execute("DELETE FROM steps WHERE adapter = ? AND step > ?", (adapter, step))
            self._conn.execute("DELETE FROM checkpoints WHERE adapter = ? AND step > ?", (adapter, step))
            seqs = [seq for _, seq in rows if seq is not None]
            if seqs and min(seqs) <= self._floor(consumer):
                # The floor promised everything up to it is done; the reopened turns break that promise.
                self._conn.execute("UPDATE consumer_floors SET floor = ? WHERE consumer = ?", (min(seqs) - 1, consumer))
        return [turn_id for turn_id, _ in rows]

    # trainer metrics (placeholder for the training loop) ------------------------------------------------------------
    def record_step(
        self,
        step: int,
        version: int | None,
        metrics: dict[str, Any],
        *,
        adapter: str = SHARED_ADAPTER,
        now: float | None = None,
    ) -> None:
        with self.transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO steps (adapter, step, version, created_at, metrics) VALUES (?, ?, ?, ?, ?)",
                (adapter, step, version, time.time() if now is None else now, dumps_json(metrics)),
            )

    def step_times(self) -> list[float]:
        """When each step of every adapter was recorded, in order (the trackers' step axis counts them)."""
        return [float(row[0]) for row in self._read("SELECT created_at FROM steps ORDER BY created_at")]

    def steps(
        self, *, after: int | None = None, adapter: str = SHARED_ADAPTER
    ) -> list[tuple[int, int | None, float, dict[str, Any]]]:
        """(step, version, created_at, metrics) rows of ``adapter`` in step order; only those past ``after``."""
        rows = self._read(
            "SELECT step, version, created_at, metrics FROM steps WHERE adapter = ? AND step > ? ORDER BY step",
            (adapter, -1 if after is None else after),
        )
        return [(s, v, t, json.loads(m)) for s, v, t, m in rows]

    def trained_adapters(self) -> list[str]:
        """Every adapter that has taken a step (the ones a restart resumes)."""
        return [row[0] for row in self._read("SELECT DISTINCT adapter FROM steps ORDER BY adapter")]
