"""Operations inside one write transaction (the session capture's unit of work)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.secrets_scrub import scrub_secrets
from openclaw_cli.store.codec import dumps_json
from openclaw_cli.store.records import (
    SESSION_COLUMNS,
    NewTurn,
    PrefixMatch,
    SessionRecord,
    new_turn_rows,
    session_from_row,
)
from openclaw_cli.store.schema import NEXT_READY_SEQ


class StoreTx:
    """Operations inside one open write transaction (see :meth:`Store.transaction`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    # sessions
    def get_session(self, session_id: str) -> SessionRecord | None:
        row = self._conn.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else session_from_row(row)

    def latest_session(self, scope: str, *, open_only: bool = False) -> SessionRecord | None:
        where = "scope = ? AND status = 'open'" if open_only else "scope = ?"
        row = self._conn.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE {where} ORDER BY last_seen_at DESC, rowid DESC LIMIT 1",
            (scope,),
        ).fetchone()
        return None if row is None else session_from_row(row)

    def count_sessions(self, scope: str) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM sessions WHERE scope = ?", (scope,)).fetchone()[0]

    def scope_system_hashes(self, scope: str) -> set[bytes | None]:
        """System-prompt hashes of the main lines already seen in a scope (empty when it has none)."""
        rows = self._conn.execute(
            "SELECT DISTINCT system_hash FROM sessions WHERE scope = ? AND main_turns > 0", (scope,)
        ).fetchall()
        return {row[0] for row in rows}

    def create_session(
        self,
        session_id: str,
        *,
        scope: str,
        id_source: str,
        now: float,
        parent_session_id: str | None = None,
        fork_turn_id: int | None = None,
    ) -> None:
        self._conn.execute(
            "INSERT INTO sessions (id, scope, id_source, parent_session_id, fork_turn_id, created_at, last_seen_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (session_id, scope, id_source, parent_session_id, fork_turn_id, now, now),
        )

    def touch_session(
        self, session_id: str, now: float, *, main_turn_id: int | None, system_hash: bytes | None = None
    ) -> None:
        """Count a new turn; a main turn becomes the session's tail, and the first one sets its system hash."""
        if main_turn_id is None:
            self._conn.execute(
                "UPDATE sessions SET side_turns = side_turns + 1, last_seen_at = MAX(last_seen_at, ?) WHERE id = ?",
                (now, session_id),
            )
        else:
            self._conn.execute(
                "UPDATE sessions SET main_turns = main_turns + 1, tail_turn_id = ?, "
                "system_hash = CASE WHEN main_turns = 0 THEN ? ELSE system_hash END, "
                "last_seen_at = MAX(last_seen_at, ?) WHERE id = ?",
                (main_turn_id, system_hash, now, session_id),
            )

    def close_session(self, session_id: str, status: str, now: float) -> bool:
        """End an open session; its pending tail becomes ready with no next state. False if not open."""
        row = self._conn.execute(
            "SELECT tail_turn_id FROM sessions WHERE id = ? AND status = 'open'", (session_id,)
        ).fetchone()
        if row is None:
            return False
        self._conn.execute("UPDATE sessions SET status = ?, ended_at = ? WHERE id = ?", (status, now, session_id))
        if row[0] is not None:
            self._conn.execute(
                "UPDATE turns SET status = 'ready', ready_at = ?, next_state = NULL, next_state_role = NULL, "
                f"ready_seq = {NEXT_READY_SEQ} WHERE id = ? AND status = 'pending'",
                (now, row[0]),
            )
        return True

    def open_sessions_idle_since(self, cutoff: float) -> list[str]:
        rows = self._conn.execute(
            "SELECT id FROM sessions WHERE status = 'open' AND last_seen_at < ? ORDER BY last_seen_at", (cutoff,)
        ).fetchall()
        return [row[0] for row in rows]

    def open_sessions_in_scope(self, scope: str) -> list[str]:
        rows = self._conn.execute("SELECT id FROM sessions WHERE scope = ? AND status = 'open'", (scope,)).fetchall()
        return [row[0] for row in rows]

    # turns
    def insert_turn(self, turn: NewTurn) -> int:
        request = scrub_secrets(turn.request)
        # An OpenAI request carries the very history stored in `messages`: keep one copy (restored on read).
        elided = request.get("messages") == turn.messages
        if elided:
            del request["messages"]
        row, data = new_turn_rows(
            turn,
            request=request,
            response=scrub_secrets(turn.response),
            headers=scrub_secrets(turn.headers),
            metadata=scrub_secrets(turn.metadata),
        )
        ready = turn.status == "ready"
        row["ready_at"] = turn.created_at if ready else None
        cursor = self._conn.execute(
            f"INSERT INTO turns ({', '.join(row)}, ready_seq) "
            f"VALUES ({', '.join('?' * len(row))}, CASE WHEN ? THEN {NEXT_READY_SEQ} END)",
            (*row.values(), ready),
        )
        turn_id = cursor.lastrowid
        assert turn_id is not None
        data.update(turn_id=turn_id, request_messages_elided=int(elided))
        self._conn.execute(
            f"INSERT INTO turn_data ({', '.join(data)}) VALUES ({', '.join('?' * len(data))})", tuple(data.values())
        )
        self._record_lesson_context(turn_id, turn)
        return turn_id

    def _record_lesson_context(self, turn_id: int, turn: NewTurn) -> None:
        """Who the turn was served for, by which adapter, and (main turns) which lessons shaped it: metadata
        ``owner``, ``adapter`` and ``lessons`` (``[{"id": ..., "text": ...}]``), as the proxy recorded them."""
        owner, adapter = turn.metadata.get("owner"), turn.metadata.get("adapter")
        if isinstance(owner, str) and owner:
            self._conn.execute(
                "INSERT INTO turn_owners (turn_id, owner, adapter) VALUES (?, ?, ?)",
                (turn_id, owner, adapter if isinstance(adapter, str) and adapter else SHARED_ADAPTER),
            )
        lessons = turn.metadata.get("lessons")
        if turn.turn_type == "main" and isinstance(lessons, list):
            ids = {item["id"] for item in lessons if isinstance(item, dict) and isinstance(item.get("id"), int)}
            # A lesson id this store does not know (it cannot come from here, but a capture must never fail on it).
            self._conn.executemany(
                "INSERT OR IGNORE INTO lesson_uses (lesson_id, turn_id) SELECT ?, ? "
                "WHERE EXISTS (SELECT 1 FROM lessons WHERE id = ?)",
                [(lesson_id, turn_id, lesson_id) for lesson_id in sorted(ids)],
            )

    def set_next_state(self, turn_id: int, next_state: list[dict[str, Any]], role: str | None, now: float) -> None:
        self._conn.execute(
            "UPDATE turns SET next_state = ?, next_state_role = ?, status = 'ready', ready_at = ?, "
            f"ready_seq = {NEXT_READY_SEQ} WHERE id = ? AND status = 'pending'",
            (dumps_json(next_state), role, now, turn_id),
        )

    # prefix index
    def add_prefix(self, scope: str, hash_: bytes, turn_id: int) -> None:
        self._conn.execute(
            "INSERT OR IGNORE INTO prefix_index (scope, hash, turn_id) VALUES (?, ?, ?)", (scope, hash_, turn_id)
        )

    def find_prefixes(self, scope: str, hashes: Sequence[bytes]) -> list[PrefixMatch]:
        """Every stored turn in ``scope`` whose history hash is one of ``hashes``."""
        matches: list[PrefixMatch] = []
        chunk = 500  # stay far below SQLite's bound-parameter limit
        for start in range(0, len(hashes), chunk):
            part = hashes[start : start + chunk]
            marks = ",".join("?" * len(part))
            rows = self._conn.execute(
                "SELECT p.hash, t.id, t.session_id, t.turn_type, t.turn_index, s.tail_turn_id = t.id, "
                "s.status = 'open' FROM prefix_index p JOIN turns t ON t.id = p.turn_id "
                f"JOIN sessions s ON s.id = t.session_id WHERE p.scope = ? AND p.hash IN ({marks})",
                (scope, *part),
            ).fetchall()
            matches.extend(
                PrefixMatch(
                    hash=row[0],
                    turn_id=row[1],
                    session_id=row[2],
                    turn_type=row[3],
                    turn_index=row[4],
                    is_tail=bool(row[5]),
                    session_open=bool(row[6]),
                )
                for row in rows
            )
        return matches
