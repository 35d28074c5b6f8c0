"""Lessons in the store: the lessons with their evidence, who each turn was served for, which lessons shaped it, and
the users' explicit ratings of turns (see :mod:`openclaw_cli.learn.lessons` for what the statuses mean)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from openclaw_cli.store.base import StoreBase
from openclaw_cli.store.codec import dumps_json
from openclaw_cli.store.records import TURN_COLUMNS, TURN_FROM, TurnRecord, turn_from_row

LessonStatus = Literal["candidate", "active", "retired", "rejected", "forgotten"]
LESSON_STATUSES: tuple[LessonStatus, ...] = ("candidate", "active", "retired", "rejected", "forgotten")
_LESSON_COLUMNS = "id, owner, text, status, origin, source_turn_ids, evidence, created_at, updated_at"
FORGOTTEN_TEXT = "(forgotten)"


@dataclass
class LessonRecord:
    id: int
    owner: str
    text: str
    status: LessonStatus
    origin: str  # correction | feedback | user
    source_turn_ids: list[int]
    evidence: list[dict[str, Any]]
    created_at: float
    updated_at: float
    uses: int = 0  # turns it shaped (served with it)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "owner": self.owner,
            "text": self.text,
            "status": self.status,
            "origin": self.origin,
            "source_turn_ids": self.source_turn_ids,
            "uses": self.uses,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "evidence": self.evidence,
        }


def _lesson_from_row(row: Sequence[Any], uses: int = 0) -> LessonRecord:
    return LessonRecord(
        id=row[0],
        owner=row[1],
        text=row[2],
        status=row[3],
        origin=row[4],
        source_turn_ids=json.loads(row[5]),
        evidence=json.loads(row[6]),
        created_at=row[7],
        updated_at=row[8],
        uses=uses,
    )


class LessonLedger(StoreBase):
    """The ``lessons``, ``lesson_uses``, ``turn_owners`` and ``feedback`` tables."""

    def add_lesson(
        self,
        owner: str,
        text: str,
        *,
        status: LessonStatus,
        origin: str,
        source_turn_ids: Sequence[int] = (),
        why: str,
        data: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> int:
        now = time.time() if now is None else now
        evidence = [{"at": now, "status": status, "why": why, **(data or {})}]
        with self.transaction():
            cursor = self._conn.execute(
                "INSERT INTO lessons (owner, text, status, origin, source_turn_ids, evidence, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (owner, text, status, origin, dumps_json(list(source_turn_ids)), dumps_json(evidence), now, now),
            )
            return int(cursor.lastrowid or 0)

    def get_lesson(self, lesson_id: int) -> LessonRecord | None:
        found = self.lessons(ids=[lesson_id])
        return found[0] if found else None

    def lessons(
        self,
        *,
        owner: str | None = None,
        statuses: Sequence[str] | None = None,
        ids: Sequence[int] | None = None,
    ) -> list[LessonRecord]:
        """Lessons, oldest first, each with the number of turns it shaped."""
        where: list[str] = ["1 = 1"]
        params: list[Any] = []
        if owner is not None:
            where.append("owner = ?")
            params.append(owner)
        if statuses is not None:
            where.append(f"status IN ({','.join('?' * len(statuses))})")
            params.extend(statuses)
        if ids is not None:
            where.append(f"id IN ({','.join('?' * len(ids))})")
            params.extend(ids)
        rows = self._read(
            f"SELECT {_LESSON_COLUMNS}, (SELECT COUNT(*) FROM lesson_uses u WHERE u.lesson_id = lessons.id) "
            f"FROM lessons WHERE {' AND '.join(where)} ORDER BY id",
            params,
        )
        return [_lesson_from_row(row[:-1], uses=row[-1]) for row in rows]

    def adapters_since(self, turn_id: int) -> tuple[int, list[str]]:
        """(the newest turn id, the adapters that served a turn after ``turn_id``): how the trainer finds new
        owners without scanning every turn each time."""
        rows = self._read(
            "SELECT adapter, MAX(turn_id) FROM turn_owners WHERE turn_id > ? GROUP BY adapter", (turn_id,)
        )
        newest = max((int(row[1]) for row in rows), default=turn_id)
        return newest, sorted(row[0] for row in rows)

    def lesson_owners(self, statuses: Sequence[str]) -> list[str]:
        """Owners with a lesson in one of ``statuses``."""
        marks = ",".join("?" * len(statuses))
        rows = self._read(f"SELECT DISTINCT owner FROM lessons WHERE status IN ({marks}) ORDER BY owner", statuses)
        return [row[0] for row in rows]

    def lesson_counts(self) -> dict[str, int]:
        """How many lessons each status holds (statuses without lessons left out)."""
        return {status: int(n) for status, n in self._read("SELECT status, COUNT(*) FROM lessons GROUP BY status")}

    def set_lesson_status(
        self,
        lesson_id: int,
        status: LessonStatus,
        why: str,
        *,
        data: dict[str, Any] | None = None,
        expect: Sequence[str] | None = None,
        text: str | None = None,
        now: float | None = None,
    ) -> LessonRecord | None:
        """Move a lesson to ``status`` with the evidence for it (appended); None when it does not exist or is not in
        one of the ``expect`` statuses (someone changed it first). ``text`` replaces its text (forgetting)."""
        return self._append_evidence(lesson_id, why, data, status=status, expect=expect, text=text, now=now)

    def add_lesson_sources(self, lesson_id: int, turn_ids: Sequence[int]) -> None:
        """More turns whose correction asked for this lesson (each a prompt it is tried on first)."""
        with self.transaction():
            row = self._conn.execute("SELECT source_turn_ids FROM lessons WHERE id = ?", (lesson_id,)).fetchone()
            if row is None:
                return
            known = json.loads(row[0])
            merged = [*known, *(t for t in turn_ids if t not in known)]
            self._conn.execute("UPDATE lessons SET source_turn_ids = ? WHERE id = ?", (dumps_json(merged), lesson_id))

    def note_lesson(self, lesson_id: int, why: str, data: dict[str, Any] | None = None) -> LessonRecord | None:
        """Evidence that changed nothing (a check that found the lesson not learned yet)."""
        return self._append_evidence(lesson_id, why, data)

    def _append_evidence(
        self,
        lesson_id: int,
        why: str,
        data: dict[str, Any] | None,
        *,
        status: LessonStatus | None = None,
        expect: Sequence[str] | None = None,
        text: str | None = None,
        now: float | None = None,
        keep: int = 50,
    ) -> LessonRecord | None:
        now = time.time() if now is None else now
        with self.transaction():
            row = self._conn.execute(f"SELECT {_LESSON_COLUMNS} FROM lessons WHERE id = ?", (lesson_id,)).fetchone()
            if row is None:
                return None
            lesson = _lesson_from_row(row)
            if expect is not None and lesson.status not in expect:
                return None
            new_status = status or lesson.status
            entry = {"at": now, "status": new_status, "why": why, **(data or {})}
            # The first entry (how it was born) is always kept; then the newest ones.
            evidence = [*lesson.evidence[:1], *lesson.evidence[1:][-(keep - 2) :], entry]
            if text is not None:  # the text is replaced (forgotten): keep no word of it in the evidence either
                evidence = [{k: e[k] for k in ("at", "status", "why") if k in e} for e in evidence]
            self._conn.execute(
                "UPDATE lessons SET status = ?, evidence = ?, updated_at = ?, text = ? WHERE id = ?",
                (new_status, dumps_json(evidence), now, lesson.text if text is None else text, lesson_id),
            )
        lesson.status, lesson.evidence, lesson.updated_at = new_status, evidence, now
        if text is not None:
            lesson.text = text
        return lesson

    def lesson_turns(self, lesson_id: int, limit: int) -> list[TurnRecord]:
        """The newest ``limit`` turns served with the lesson, newest first."""
        rows = self._read(
            f"SELECT {TURN_COLUMNS} FROM {TURN_FROM} WHERE t.id IN (SELECT turn_id FROM lesson_uses "
            "WHERE lesson_id = ?) ORDER BY t.id DESC LIMIT ?",
            (lesson_id, limit),
        )
        return [turn_from_row(row) for row in rows]

    def owner_turns(self, owner: str, limit: int, *, not_done_by: str | None = None) -> list[TurnRecord]:
        """The owner's newest ``limit`` main-line turns, newest first; ``not_done_by``: only turns that consumer has
        not completed (e.g. not yet trained on)."""
        untrained = (
            "AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.consumer = ? AND c.turn_id = t.id "
            "AND c.done_at IS NOT NULL) "
            if not_done_by is not None
            else ""
        )
        params: list[Any] = [owner, *([not_done_by] if not_done_by is not None else []), limit]
        rows = self._read(
            f"SELECT {TURN_COLUMNS} FROM {TURN_FROM} WHERE t.turn_type = 'main' AND t.id IN "
            f"(SELECT turn_id FROM turn_owners WHERE owner = ?) {untrained}ORDER BY t.id DESC LIMIT ?",
            params,
        )
        return [turn_from_row(row) for row in rows]

    def turn_owner(self, turn_id: int) -> str | None:
        rows = self._read("SELECT owner FROM turn_owners WHERE turn_id = ?", (turn_id,))
        return rows[0][0] if rows else None

    # explicit feedback -------------------------------------------------------------------------------------------
    def add_feedback(self, turn_id: int, rating: int, text: str | None, *, now: float | None = None) -> int:
        with self.transaction():
            cursor = self._conn.execute(
                "INSERT INTO feedback (turn_id, rating, text, created_at) VALUES (?, ?, ?, ?)",
                (turn_id, rating, text, time.time() if now is None else now),
            )
            return int(cursor.lastrowid or 0)

    def feedback_for(self, turn_id: int) -> tuple[int, str | None] | None:
        """The newest rating of a turn and its text, or None."""
        rows = self._read(
            "SELECT rating, text FROM feedback WHERE turn_id = ? ORDER BY id DESC LIMIT 1",
            (turn_id,),
        )
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def main_turns_of_session(self, session_id: str) -> list[int]:
        rows = self._read("SELECT id FROM turns WHERE session_id = ? AND turn_type = 'main' ORDER BY id", (session_id,))
        return [row[0] for row in rows]

    def turn_by_request_id(self, request_id: str) -> int | None:
        """The newest turn whose reply had this id (chatcmpl-..., msg_..., resp_...): a scan of the payloads, for
        the rare feedback that names a reply rather than a turn."""
        rows = self._read(
            "SELECT turn_id FROM turn_data WHERE json_extract(metadata, '$.request_id') = ? ORDER BY turn_id DESC "
            "LIMIT 1",
            (request_id,),
        )
        return int(rows[0][0]) if rows else None
