"""What the experiment trackers need from the store: `openclaw eval` results and the trackers' own state."""

from __future__ import annotations

import json
import time
from typing import Any

from openclaw_cli.store.base import StoreBase
from openclaw_cli.store.codec import dumps_json


class TrackingLedger(StoreBase):
    """The ``evaluations`` and ``tracker_state`` tables (see openclaw_cli.tracking)."""

    def record_evaluation(self, report: dict[str, Any], *, now: float | None = None) -> int:
        with self.transaction():
            cursor = self._conn.execute(
                "INSERT INTO evaluations (created_at, report) VALUES (?, ?)",
                (time.time() if now is None else now, dumps_json(report)),
            )
            return int(cursor.lastrowid or 0)

    def evaluations(self, *, after: int = 0) -> list[tuple[int, float, dict[str, Any]]]:
        """(id, created_at, report) of every evaluation with an id above ``after``, oldest first."""
        rows = self._read("SELECT id, created_at, report FROM evaluations WHERE id > ? ORDER BY id", (after,))
        return [(i, t, json.loads(r)) for i, t, r in rows]

    def tracker_state(self, key: str) -> dict[str, Any] | None:
        rows = self._read("SELECT value FROM tracker_state WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def set_tracker_state(self, key: str, value: dict[str, Any]) -> None:
        with self.transaction():
            self._conn.execute(
                "INSERT OR REPLACE INTO tracker_state (key, value) VALUES (?, ?)", (key, dumps_json(value))
            )

    def tracker_run(self, make: dict[str, Any]) -> dict[str, Any]:
        """The store's tracker run (``make`` is recorded as it the first time): one run per store, kept across
        restarts and shared by every tracker."""
        with self.transaction():
            row = self._conn.execute("SELECT value FROM tracker_state WHERE key = 'run'").fetchone()
            if row is not None:
                found: dict[str, Any] = json.loads(row[0])
                return found
            self._conn.execute("INSERT INTO tracker_state (key, value) VALUES ('run', ?)", (dumps_json(make),))
            return make
