"""The hand-off between loops: ready main-line turns leased to named consumers (judge, trainer), completed exactly
once, released on failure, taken over after a crash (see :mod:`openclaw_cli.store`)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from openclaw_cli.adapters import consumer_adapter
from openclaw_cli.store.base import StoreBase
from openclaw_cli.store.records import (
    TURN_COLUMNS,
    TURN_FROM,
    TurnRecord,
    turn_from_row,
)
from openclaw_cli.store.schema import (
    TURN_ADAPTER,
    StoreError,
)


class HandoffQueue(StoreBase):
    """Claims, completions and the per-consumer floor, on the ``claims`` table."""

    # hand-off (judge / trainer loops) -------------------------------------------------------------------------------
    def claim_ready(
        self,
        consumer: str,
        limit: int,
        lease_s: float,
        *,
        after: str | None = None,
        now: float | None = None,
        newest_first: bool = False,
    ) -> list[TurnRecord]:
        """Lease up to ``limit`` ready main-line turns that ``consumer`` has not completed, in the order they
        became ready (``newest_first``: the most recently ready first, for a consumer that wants fresh turns while
        a backlog waits).

        A turn under an unexpired lease of this consumer is skipped; an expired lease makes it claimable again
        (at-least-once delivery). ``after`` chains loops: only turns already completed by that consumer.
        """
        if limit < 1:
            return []
        if lease_s <= 0:
            raise ValueError("lease_s must be > 0")
        now = time.time() if now is None else now
        chain = (
            "AND EXISTS (SELECT 1 FROM claims p WHERE p.consumer = ? AND p.turn_id = t.id AND p.done_at IS NOT NULL)"
            if after is not None
            else ""
        )
        adapter = consumer_adapter(consumer)
        with self.transaction():
            params: list[Any] = [self._floor(consumer), consumer, now]
            if after is not None:
                params.append(after)
            if adapter is not None:
                chain += f" AND {TURN_ADAPTER} = ?"
                params.append(adapter)
            params.append(limit)
            rows = self._conn.execute(
                f"SELECT {TURN_COLUMNS} FROM {TURN_FROM} "
                "WHERE t.ready_seq > ? AND t.turn_type = 'main' AND NOT EXISTS ("
                "SELECT 1 FROM claims c WHERE c.consumer = ? AND c.turn_id = t.id "
                f"AND (c.done_at IS NOT NULL OR c.lease_until > ?)) {chain} "
                f"ORDER BY t.ready_seq {'DESC' if newest_first else 'ASC'} LIMIT ?",
                params,
            ).fetchall()
            self._conn.executemany(
                "INSERT INTO claims (consumer, turn_id, lease_until, attempts, owner) VALUES (?, ?, ?, 1, ?) "
                "ON CONFLICT (consumer, turn_id) DO UPDATE SET lease_until = excluded.lease_until, "
                "attempts = attempts + 1, owner = excluded.owner",
                [(consumer, row[0], now + lease_s, self.owner) for row in rows],
            )
        return [turn_from_row(row) for row in rows]

    def complete(
        self,
        consumer: str,
        turn_id: int,
        result_json: str,
        *,
        reward: float | None = None,
        now: float | None = None,
        failed: bool = False,
    ) -> bool:
        """Record ``consumer``'s result for a turn. True if this call completed it; False if it was already done
        (the earlier result is kept). ``reward``, when given, is stored on the turn by the first completion.
        ``failed`` marks a consumer that gave up on the turn (counted apart in :meth:`handoff_counts`)."""
        _require_json(result_json)
        now = time.time() if now is None else now
        with self.transaction():
            first = self._complete_in_tx(consumer, turn_id, result_json, now, reward=reward, failed=failed)
            if first:
                self._advance_floor(consumer)
        return first

    def _complete_in_tx(
        self,
        consumer: str,
        turn_id: int,
        result_json: str,
        now: float,
        *,
        reward: float | None = None,
        failed: bool = False,
        step: int | None = None,
    ) -> bool:
        exists = self._conn.execute("SELECT 1 FROM turns WHERE id = ?", (turn_id,)).fetchone()
        if exists is None:
            raise KeyError(f"no turn {turn_id}")
        cursor = self._conn.execute(
            "INSERT INTO claims (consumer, turn_id, lease_until, attempts, done_at, result, failed, step) "
            "VALUES (?, ?, NULL, 1, ?, ?, ?, ?) ON CONFLICT (consumer, turn_id) DO UPDATE SET "
            "done_at = excluded.done_at, result = excluded.result, lease_until = NULL, failed = excluded.failed, "
            "step = excluded.step WHERE claims.done_at IS NULL",
            (consumer, turn_id, now, result_json, int(failed), step),
        )
        first = cursor.rowcount == 1
        if first and reward is not None:
            self._conn.execute("UPDATE turns SET reward = ? WHERE id = ?", (float(reward), turn_id))
        return first

    def _floor(self, consumer: str) -> int:
        row = self._conn.execute("SELECT floor FROM consumer_floors WHERE consumer = ?", (consumer,)).fetchone()
        return 0 if row is None else row[0]

    def _advance_floor(self, consumer: str, window: int = 256) -> None:
        """Move the consumer's floor over the run of done turns just above it (completions arrive out of order;
        the floor only passes a turn once it and everything before it are done)."""
        floor = start = self._floor(consumer)
        adapter = consumer_adapter(consumer)
        # A trainer of one adapter passes over the other adapters' turns: they are never its to complete.
        theirs = "0" if adapter is None else f"{TURN_ADAPTER} != ?"
        while True:
            rows = self._conn.execute(
                f"SELECT t.ready_seq, c.done_at, {theirs} FROM turns t "
                "LEFT JOIN claims c ON c.consumer = ? AND c.turn_id = t.id "
                "WHERE t.ready_seq > ? ORDER BY t.ready_seq LIMIT ?",
                ((adapter,) if adapter is not None else ()) + (consumer, floor, window),
            ).fetchall()
            blocked = False
            for seq, done_at, not_ours in rows:
                if done_at is None and not not_ours:
                    blocked = True
                    break
                floor = seq
            if blocked or len(rows) < window:
                break
        if floor != start:
            self._conn.execute(
                "INSERT INTO consumer_floors (consumer, floor) VALUES (?, ?) "
                "ON CONFLICT (consumer) DO UPDATE SET floor = excluded.floor",
                (consumer, floor),
            )

    def result_of(self, consumer: str, turn_id: int) -> Any | None:
        """The JSON result ``consumer`` completed ``turn_id`` with, parsed; None if not completed."""
        rows = self._read(
            "SELECT result FROM claims WHERE consumer = ? AND turn_id = ? AND done_at IS NOT NULL", (consumer, turn_id)
        )
        return json.loads(rows[0][0]) if rows else None

    # failures and restarts ------------------------------------------------------------------------------------------
    def release(
        self,
        consumer: str,
        turn_id: int,
        *,
        retry_at: float | None = None,
        error: str | None = None,
        count_failure: bool = False,
    ) -> int:
        """Give back an unfinished claim: the turn is claimable again at ``retry_at`` (at once when None).

        ``error`` is kept as the claim's last error (status displays count such turns); ``count_failure`` adds one
        to its failure count, which a consumer uses to give up after a few tries. Returns the failure count (0 when
        the turn has no unfinished claim)."""
        with self.transaction():
            self._conn.execute(
                "UPDATE claims SET lease_until = ?, owner = NULL, last_error = COALESCE(?, last_error), "
                "failures = failures + ? WHERE consumer = ? AND turn_id = ? AND done_at IS NULL",
                (retry_at, error, int(count_failure), consumer, turn_id),
            )
            row = self._conn.execute(
                "SELECT failures FROM claims WHERE consumer = ? AND turn_id = ? AND done_at IS NULL",
                (consumer, turn_id),
            ).fetchone()
        return 0 if row is None else int(row[0])

    def take_over_claims(self, consumer: str) -> int:
        """Become the live ``consumer`` of this store (call once at start-up, before claiming).

        Takes the store's owner lock, an advisory ``flock`` on ``<store>.lock`` that the OS drops when the process
        dies however it dies, so a StoreError naming the holder means another live process runs the loops on this
        store. Holding it proves every other owner is gone, so their unfinished claims are released now instead of
        when their leases run out. Returns how many claims were released."""
        self._take_owner_lock()
        with self.transaction():
            cursor = self._conn.execute(
                "UPDATE claims SET lease_until = NULL, owner = NULL WHERE consumer = ? AND done_at IS NULL "
                "AND lease_until IS NOT NULL AND (owner IS NULL OR owner != ?)",
                (consumer, self.owner),
            )
        return cursor.rowcount

    def _take_owner_lock(self) -> None:
        with self._lock:
            if self._owner_lock_fd is not None:
                return
            try:
                import fcntl
            except ImportError:  # pragma: no cover - Windows: no flock; one launch per store is up to the user
                return
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                os.close(fd)
                raise StoreError(
                    f"store {self.path} is in use by {holder} (another openclaw launch); stop that process or "
                    "point store.path at another file"
                ) from None
            except OSError:  # a filesystem without flock (some network mounts): run unguarded rather than not at all
                os.close(fd)
                return
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.owner}\n".encode(), 0)
            self._owner_lock_fd = fd

    def handoff_counts(self) -> dict[str, dict[str, int]]:
        """Per consumer: ``failed`` (turns it gave up on) and ``erroring`` (unfinished turns whose last attempt
        failed, waiting for a retry). Consumers with neither are left out."""
        counts: dict[str, dict[str, int]] = {}
        for consumer, n in self._read("SELECT consumer, COUNT(*) FROM claims WHERE failed = 1 GROUP BY consumer"):
            counts.setdefault(consumer, {"failed": 0, "erroring": 0})["failed"] = n
        for consumer, n in self._read(
            "SELECT consumer, COUNT(*) FROM claims WHERE done_at IS NULL AND last_error IS NOT NULL GROUP BY consumer"
        ):
            counts.setdefault(consumer, {"failed": 0, "erroring": 0})["erroring"] = n
        return counts

    def backlog(
        self, consumer: str, *, after: str | None = None, min_version: int | None = None
    ) -> tuple[int, float | None]:
        """(how many, oldest ready_at) of the ready main-line turns ``consumer`` has not completed yet; with
        ``after``, only those that consumer has completed (e.g. judged but not yet trained); with ``min_version``,
        only turns that policy version or a later one wrote. Scans only above the consumer's floor, so it costs what
        the backlog holds, not what the store holds."""
        chain = (
            "AND EXISTS (SELECT 1 FROM claims p WHERE p.consumer = ? AND p.turn_id = t.id AND p.done_at IS NOT NULL)"
            if after is not None
            else ""
        )
        with self._lock:
            params: list[Any] = [self._floor(consumer), consumer]
            if after is not None:
                params.append(after)
            if min_version is not None:
                chain += " AND t.version >= ?"
                params.append(min_version)
            adapter = consumer_adapter(consumer)
            if adapter is not None:
                chain += f" AND {TURN_ADAPTER} = ?"
                params.append(adapter)
            count, oldest = self._conn.execute(
                "SELECT COUNT(*), MIN(t.ready_at) FROM turns t WHERE t.ready_seq > ? AND t.turn_type = 'main' "
                "AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.consumer = ? AND c.turn_id = t.id "
                f"AND c.done_at IS NOT NULL) {chain}",
                params,
            ).fetchone()
        return int(count), oldest


def _require_json(text: str) -> None:
    try:
        json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"result_json must be JSON text: {exc}") from None
