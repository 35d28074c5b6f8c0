"""The store's facade: turn and session reads, counts, held-out reads and retention on top of the connection
(:mod:`.base`), the hand-off queue (:mod:`.claims`) and the training ledger (:mod:`.ledger`)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from openclaw_cli.adapters import trainer_consumer
from openclaw_cli.store.ledger import StepLedger
from openclaw_cli.store.lessons import LessonLedger
from openclaw_cli.store.records import (
    SESSION_COLUMNS,
    TURN_COLUMNS,
    TURN_FROM,
    PurgeResult,
    SessionRecord,
    TurnRecord,
    session_from_row,
    turn_from_row,
)
from openclaw_cli.store.schema import TURN_ADAPTER
from openclaw_cli.store.tracking import TrackingLedger


class Store(LessonLedger, TrackingLedger, StepLedger):
    """The SQLite store. ``create=False`` refuses to create a missing file (readers such as export)."""

    # reads ----------------------------------------------------------------------------------------------------------
    def get_turn(self, turn_id: int) -> TurnRecord | None:
        rows = self._read(f"SELECT {TURN_COLUMNS} FROM {TURN_FROM} WHERE t.id = ?", (turn_id,))
        return turn_from_row(rows[0]) if rows else None

    def get_session(self, session_id: str) -> SessionRecord | None:
        rows = self._read(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,))
        return session_from_row(rows[0]) if rows else None

    def sessions(self) -> list[SessionRecord]:
        return [session_from_row(r) for r in self._read(f"SELECT {SESSION_COLUMNS} FROM sessions ORDER BY rowid")]

    def iter_turns(
        self,
        *,
        session_ids: Sequence[str] | None = None,
        turn_type: str | None = None,
        status: str | None = None,
        since: float | None = None,
        owner: str | None = None,
        batch: int = 256,
    ) -> Iterator[TurnRecord]:
        """Turns in id order matching every given filter; fetched in batches so memory stays bounded."""
        where: list[str] = []
        params: list[Any] = []
        if session_ids is not None:
            where.append(f"t.session_id IN ({','.join('?' * len(session_ids))})")
            params.extend(session_ids)
        if turn_type is not None:
            where.append("t.turn_type = ?")
            params.append(turn_type)
        if status is not None:
            where.append("t.status = ?")
            params.append(status)
        if since is not None:
            where.append("t.created_at >= ?")
            params.append(since)
        if owner is not None:
            where.append("t.id IN (SELECT turn_id FROM turn_owners WHERE owner = ?)")
            params.append(owner)
        last_id = 0
        while True:
            clause = " AND ".join([*where, "t.id > ?"])
            rows = self._read(
                f"SELECT {TURN_COLUMNS} FROM {TURN_FROM} WHERE {clause} ORDER BY t.id LIMIT ?",
                (*params, last_id, batch),
            )
            for row in rows:
                yield turn_from_row(row)
            if len(rows) < batch:
                return
            last_id = rows[-1][0]

    def counts(self) -> dict[str, Any]:
        """Counts for status displays: sessions by status, turns by (type, status), time of the latest turn."""
        sessions = dict(self._read("SELECT status, COUNT(*) FROM sessions GROUP BY status"))
        turns: dict[str, dict[str, int]] = {"main": {}, "side": {}}
        for turn_type, status, n in self._read(
            "SELECT turn_type, status, COUNT(*) FROM turns GROUP BY turn_type, status"
        ):
            turns.setdefault(turn_type, {})[status] = n
        last = self._read("SELECT MAX(created_at) FROM turns")[0][0]
        return {"sessions": sessions, "turns": turns, "last_turn_at": last}

    # held-out reads (status displays, promotion gate) -------------------------------------------------------------
    def oldest_turn_at(self, status: str, turn_type: str = "main") -> float | None:
        """created_at of the oldest turn with this status (e.g. the longest-waiting ``pending`` turn)."""
        rows = self._read("SELECT MIN(created_at) FROM turns WHERE status = ? AND turn_type = ?", (status, turn_type))
        return rows[0][0]

    def latest_turns(
        self, limit: int, *, turn_type: str = "main", not_done_by: str | None = None, adapter: str | None = None
    ) -> list[TurnRecord]:
        """The newest ``limit`` turns of a type, newest first; ``not_done_by`` skips turns that consumer completed
        (e.g. the promotion gate's held-out set: turns the trainer has not trained on); ``adapter`` keeps the turns
        that adapter served only."""
        if limit < 1:
            return []
        where = "t.turn_type = ?"
        params: list[Any] = [turn_type]
        if adapter is not None:
            where += f" AND {TURN_ADAPTER} = ?"
            params.append(adapter)
        if not_done_by is not None:
            where += (
                " AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.consumer = ? AND c.turn_id = t.id "
                "AND c.done_at IS NOT NULL)"
            )
            params.append(not_done_by)
        rows = self._read(
            f"SELECT {TURN_COLUMNS} FROM {TURN_FROM} WHERE {where} ORDER BY t.id DESC LIMIT ?", (*params, limit)
        )
        return [turn_from_row(row) for row in rows]

    # retention (store.retention_days; see openclaw_cli.capture.retention) ---------------------------------------
    def purge_older_than(self, cutoff: float, *, now: float | None = None, batch: int = 500) -> PurgeResult:
        """Delete every turn captured before ``cutoff`` (Unix seconds), with its payload, prefix-index entries and
        hand-off rows; then every session left without turns whose last activity is before ``cutoff``.

        A turn under a live claim (unfinished, lease or retry time still ahead) is kept: a judge or trainer is on
        it. A newer turn that extended a purged one keeps its own copy of the conversation (that is its prompt) and
        loses only the link (``parent_turn_id`` becomes NULL). Deletes run in transactions of ``batch`` turns, so
        capture waits at most one batch. Deleted content is overwritten (``secure_delete``) and the WAL is truncated
        afterwards when no reader holds it, so purged text does not linger in the files.
        """
        now = time.time() if now is None else now
        purged_turns = purged_sessions = 0
        with self._securely_deleting():
            while True:
                with self.transaction():
                    ids = [
                        row[0]
                        for row in self._conn.execute(
                            "SELECT t.id FROM turns t WHERE t.created_at < ? AND NOT EXISTS (SELECT 1 FROM claims c "
                            "WHERE c.turn_id = t.id AND c.done_at IS NULL AND c.lease_until > ?) ORDER BY t.id LIMIT ?",
                            (cutoff, now, batch),
                        ).fetchall()
                    ]
                    if ids:
                        self._delete_turns(ids)
                purged_turns += len(ids)
                if len(ids) < batch:
                    break
            with self.transaction():
                purged_sessions = self._conn.execute(
                    "DELETE FROM sessions WHERE last_seen_at < ? "
                    "AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id = sessions.id)",
                    (cutoff,),
                ).rowcount
        if purged_turns or purged_sessions:
            with self._lock, suppress(sqlite3.OperationalError):
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # busy readers: the next purge retries
        return PurgeResult(turns=purged_turns, sessions=purged_sessions)

    # forgetting an owner (openclaw forget-owner) ---------------------------------------------------------------------
    def forget_owner(self, owner: str, adapter: str | None, *, batch: int = 500) -> dict[str, int]:
        """Delete everything stored of ``owner``: its turns (with their payloads, hand-off rows, feedback), the
        sessions left without turns, its lessons; and with ``adapter`` (the owner's own adapter, not a group's or the
        shared one) that adapter's steps, checkpoint records and trainer floor. Deleted content is overwritten
        (``secure_delete``). Returns how many of each were deleted."""
        counts = {"turns": 0, "sessions": 0, "lessons": 0, "steps": 0, "checkpoints": 0}
        with self._securely_deleting():
            while True:
                with self.transaction():
                    rows = self._conn.execute(
                        "SELECT o.turn_id, t.session_id FROM turn_owners o JOIN turns t ON t.id = o.turn_id "
                        "WHERE o.owner = ? LIMIT ?",
                        (owner, batch),
                    ).fetchall()
                    if rows:
                        self._delete_turns([turn_id for turn_id, _ in rows])
                        sessions = sorted({session for _, session in rows})
                        marks = ",".join("?" * len(sessions))
                        counts["sessions"] += self._conn.execute(
                            f"DELETE FROM sessions WHERE id IN ({marks}) "
                            "AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id = sessions.id)",
                            sessions,
                        ).rowcount
                counts["turns"] += len(rows)
                if len(rows) < batch:
                    break
            with self.transaction():
                self._conn.execute(
                    "DELETE FROM lesson_uses WHERE lesson_id IN (SELECT id FROM lessons WHERE owner = ?)", (owner,)
                )
                counts["lessons"] = self._conn.execute("DELETE FROM lessons WHERE owner = ?", (owner,)).rowcount
                if adapter is not None:
                    counts["steps"] = self._conn.execute("DELETE FROM steps WHERE adapter = ?", (adapter,)).rowcount
                    counts["checkpoints"] = self._conn.execute(
                        "DELETE FROM checkpoints WHERE adapter = ?", (adapter,)
                    ).rowcount
                    self._conn.execute("DELETE FROM claims WHERE consumer = ?", (trainer_consumer(adapter),))
                    self._conn.execute("DELETE FROM consumer_floors WHERE consumer = ?", (trainer_consumer(adapter),))
        with self._lock, suppress(sqlite3.OperationalError):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return counts

    def hold_for_maintenance(self) -> None:
        """Take the store's owner lock (see ``take_over_claims``): a StoreError says a launch is using the store."""
        self._take_owner_lock()

    @contextmanager
    def _securely_deleting(self) -> Iterator[None]:
        """Inside the block, deleted content is overwritten in the file (``secure_delete``), not just unlinked."""
        with self._lock:
            previous = self._conn.execute("PRAGMA secure_delete").fetchone()[0]
            self._conn.execute("PRAGMA secure_delete=ON")
        try:
            yield
        finally:
            with self._lock:
                self._conn.execute(f"PRAGMA secure_delete={int(previous)}")

    def _delete_turns(self, ids: Sequence[int]) -> None:
        marks = ",".join("?" * len(ids))
        for statement in (
            f"DELETE FROM prefix_index WHERE turn_id IN ({marks})",
            f"DELETE FROM turn_owners WHERE turn_id IN ({marks})",
            f"DELETE FROM lesson_uses WHERE turn_id IN ({marks})",
            f"DELETE FROM feedback WHERE turn_id IN ({marks})",
            f"DELETE FROM claims WHERE turn_id IN ({marks})",
            f"UPDATE turns SET parent_turn_id = NULL WHERE parent_turn_id IN ({marks})",
            f"UPDATE sessions SET tail_turn_id = NULL WHERE tail_turn_id IN ({marks})",
            f"UPDATE sessions SET fork_turn_id = NULL WHERE fork_turn_id IN ({marks})",
            f"DELETE FROM turn_data WHERE turn_id IN ({marks})",
            f"DELETE FROM turns WHERE id IN ({marks})",
        ):
            self._conn.execute(statement, ids)
