"""The training ledger: one row per step (written with the completion of its batch in one transaction), the
checkpoints recorded for it, and undoing steps whose weights never reached a checkpoint."""

from __future__ import annotations

import json
import time
from typing import Any

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
        now: float | None = None,
    ) -> int:
        """In ONE transaction: the step's metrics row, and ``consumer``'s completion of every turn of its batch
        (``results``: turn id -> JSON-able result), each recording ``step`` as the step that consumed it. A crash
        leaves all of it or none. Returns how many turns this call completed (a turn already done keeps its
        earlier result)."""
        now = time.time() if now is None else now
        with self.transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO steps (step, version, created_at, metrics) VALUES (?, ?, ?, ?)",
                (step, version, now, dumps_json(metrics)),
            )
            completed = 0
            for turn_id, result in results.items():
                completed += self._complete_in_tx(consumer, turn_id, dumps_json(result), now, step=step)
            if completed:
                self._advance_floor(consumer)
        return completed

    def record_checkpoint(self, step: int, path: str, *, now: float | None = None) -> None:
        """Note that the state after ``step`` was saved at ``path`` (whatever the backend's save_state returned)."""
        with self.transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO checkpoints (step, path, created_at) VALUES (?, ?, ?)",
                (step, path, time.time() if now is None else now),
            )

    def checkpoints(self) -> list[tuple[int, str]]:
        """Recorded checkpoints as (step, path), oldest first."""
        return [(s, p) for s, p in self._read("SELECT step, path FROM checkpoints ORDER BY step")]

    def forget_checkpoint(self, step: int) -> None:
        with self.transaction():
            self._conn.execute("DELETE FROM checkpoints WHERE step = ?", (step,))

    def discard_steps_after(self, step: int, consumer: str) -> list[int]:
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
            self._conn.execute("DELETE FROM steps WHERE step > ?", (step,))
            self._conn.execute("DELETE FROM checkpoints WHERE step > ?", (step,))
            seqs = [seq for _, seq in rows if seq is not None]
            if seqs and min(seqs) <= self._floor(consumer):
                # The floor promised everything up to it is done; the reopened turns break that promise.
                self._conn.execute("UPDATE consumer_floors SET floor = ? WHERE consumer = ?", (min(seqs) - 1, consumer))
        return [turn_id for turn_id, _ in rows]

    # trainer metrics (placeholder for the training loop) ------------------------------------------------------------
    def record_step(self, step: int, version: int | None, metrics: dict[str, Any], *, now: float | None = None) -> None:
        with self.transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO steps (step, version, created_at, metrics) VALUES (?, ?, ?, ?)",
                (step, version, time.time() if now is None else now, dumps_json(metrics)),
            )

    def last_step_at(self, when: float) -> int:
        """The last step recorded at or before ``when`` (0 when none was)."""
        return int(self._read("SELECT IFNULL(MAX(step), 0) FROM steps WHERE created_at <= ?", (when,))[0][0])

    def steps(self, *, after: int | None = None) -> list[tuple[int, int | None, float, dict[str, Any]]]:
        """(step, version, created_at, metrics) rows in step order; only those past ``after`` when given."""
        rows = self._read(
            "SELECT step, version, created_at, metrics FROM steps WHERE step > ? ORDER BY step",
            (-1 if after is None else after,),
        )
        return [(s, v, t, json.loads(m)) for s, v, t, m in rows]
