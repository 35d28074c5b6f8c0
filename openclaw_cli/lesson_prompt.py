"""Serving lessons: whose lessons a request gets, the one block they form in the prompt, and the in-memory book of
active lessons the proxy reads on every request.

**Owner.** With API keys configured (``api_key``, ``api_keys``), a request's owner is its key, stored only as a
hash (``key:`` + 16 hex digits of its SHA-256, never the key). Without keys the server is one person's and every
request has the owner ``local``. ``lessons.scope = "session"`` scopes by the client's session id instead
(``session:`` + its scope, e.g. the ``X-Session-Id``), for a keyless server several people share. One owner's lessons
never reach another's prompts.

**The block.** An owner's active lessons, oldest first, one line each under the OPD hint's header, placed where the
model follows an instruction best (:func:`openclaw_cli.instructions.with_instruction`: in the system message of a
first reply, after the last user message later), so a lesson is served exactly as the OPD teacher reads a user's
correction. Only main-line requests get it: a request marked side (``X-Turn-Type: side``, model ``openclaw-side``) or
one that reads like an app's background task (a title or summary of the conversation) is served as sent.

**Switches.** ``x-openclaw-lessons: off`` on a request serves it without lessons (evaluation, A/B). Every generation
response carries ``x-openclaw-lessons``: the ids of the lessons that shaped it, comma-separated, or ``none``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_cli.instructions import INSTRUCTION_HEADER, with_instruction
from openclaw_cli.settings import Settings
from openclaw_cli.types import Message

log = logging.getLogger("openclaw.lessons")

LESSONS_HEADER = "x-openclaw-lessons"
LOCAL_OWNER = "local"
_OFF = frozenset({"off", "0", "false", "no", "none"})
REFRESH_S = 1.0  # how often the book re-reads the store (changes made in this process apply at once)


FORGET_NOTE = (
    "forgotten: it is no longer served and its text is erased; weights already trained keep what they learned from "
    "it until you roll back to a version from before it (openclaw rollback)"
)


class LessonError(ValueError):
    """A lesson request that cannot be done (the message says why): answered as a 4xx, nothing changed."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ActiveLesson:
    id: int
    text: str


def key_owner(key: str) -> str:
    """The owner id of an API key: a hash, so neither the store nor a listing ever holds the key."""
    return "key:" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def owner_of(settings: Settings, presented_key: str | None, session_scope: str) -> str:
    """Whose lessons a request gets (see the module docstring)."""
    if settings.lessons.scope == "session":
        return f"session:{session_scope}" if session_scope else LOCAL_OWNER
    if settings.accepted_api_keys() and presented_key:
        return key_owner(presented_key)
    return LOCAL_OWNER


def lessons_wanted(headers: Mapping[str, str]) -> bool:
    """False when the request says ``x-openclaw-lessons: off`` (``headers``: lower-cased names)."""
    return headers.get(LESSONS_HEADER, "").strip().lower() not in _OFF


def lesson_block(texts: Sequence[str]) -> str:
    return "\n".join(text.strip() for text in texts if text.strip())


def with_lessons(messages: list[Message], texts: Sequence[str]) -> list[Message]:
    """``messages`` with the lesson block placed (a copy); unchanged when there is nothing to place or nowhere to
    place it (no user message)."""
    block = lesson_block(texts)
    if not block:
        return messages
    try:
        return with_instruction(messages, block, INSTRUCTION_HEADER)
    except ValueError:
        return messages


def lessons_header_value(ids: Iterable[int]) -> str:
    listed = ",".join(str(i) for i in ids)
    return listed or "none"


class LessonBook:
    """Active lessons by owner, held in memory for the serving path and re-read from the store in a worker thread
    (every :data:`REFRESH_S` while :meth:`run` runs, and at once through :meth:`refresh` after a change made in this
    process), so a request never waits on SQLite."""

    def __init__(self, load: Callable[[], dict[str, list[ActiveLesson]]], *, enabled: bool = True) -> None:
        self._load = load
        self.enabled = enabled
        self._by_owner: dict[str, list[ActiveLesson]] = {}
        self.loaded_at: float | None = None
        self.last_error: str | None = None

    def for_owner(self, owner: str) -> list[ActiveLesson]:
        return list(self._by_owner.get(owner, ())) if self.enabled else []

    def owners(self) -> dict[str, int]:
        return {owner: len(lessons) for owner, lessons in self._by_owner.items()}

    def refresh_sync(self) -> None:
        try:
            self._by_owner = self._load()
            self.loaded_at = time.time()
            self.last_error = None
        except Exception as exc:  # serving goes on with the lessons last read
            if self.last_error is None:
                log.warning("cannot read the active lessons (%s); serving with the ones last read", exc)
            self.last_error = f"{type(exc).__name__}: {exc}"

    async def refresh(self) -> None:
        await asyncio.to_thread(self.refresh_sync)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=REFRESH_S)


def prompt_lessons(
    book: LessonBook | None,
    owner: str,
    *,
    wanted: bool,
    main_line: bool,
    fits: Callable[[list[str]], bool] | None = None,
) -> list[ActiveLesson]:
    """The lessons a request is served with: the owner's active ones, oldest first, as many as ``fits`` accepts (the
    token budget), none when the request asked for none or is not main-line."""
    if book is None or not wanted or not main_line:
        return []
    chosen: list[ActiveLesson] = []
    for lesson in book.for_owner(owner):
        trial = [*(c.text for c in chosen), lesson.text]
        if fits is None or fits(trial):
            chosen.append(lesson)
    return chosen


def describe(lessons: Sequence[ActiveLesson]) -> list[dict[str, Any]]:
    """What capture records of the lessons a turn was served with (turn metadata ``lessons``)."""
    return [{"id": lesson.id, "text": lesson.text} for lesson in lessons]


def served_lessons(turn: Any) -> list[tuple[int, str]]:
    """The (id, text) of the lessons a stored turn was served with (its metadata ``lessons``), in prompt order."""
    found = turn.metadata.get("lessons") if isinstance(turn.metadata, dict) else None
    if not isinstance(found, list):
        return []
    return [
        (item["id"], item["text"])
        for item in found
        if isinstance(item, dict) and isinstance(item.get("id"), int) and isinstance(item.get("text"), str)
    ]
