"""The SQLite store: sessions, turns (with exact token ids), the prefix index, judge/trainer hand-off, steps.

One file in WAL mode, created with mode 0600 (it holds conversations). All writes go through one connection guarded
by a lock, each in a single ``BEGIN IMMEDIATE`` transaction, so the store is safe to call from worker threads
(``asyncio.to_thread``) while the asyncio loops keep running. Readers use the same connection; WAL keeps other
processes (``openclaw export``) able to read while the server writes. A turn is two rows: ``turns`` (small, the
fields that change: status, next state, reward) and ``turn_data`` (the history, request/response JSON and token
arrays, written once); ``prefix_index`` maps canonical-history hashes to turns for session inference.

Durability: ``synchronous=NORMAL`` by default, so a committed transaction survives any crash of the process (the WAL
is written before commit returns) but the last transactions may be lost on power failure or an OS crash; pass
``synchronous="FULL"`` to make every commit reach the disk (several times slower on most disks).

Hand-off between loops is generic and at-least-once: :meth:`Store.claim_ready` leases ready main-line turns to a
named consumer in the order they became ready (an expired lease makes the turn claimable again) and
:meth:`Store.complete` records that consumer's result exactly once (a second completion is a no-op), so consumers
must be idempotent. Each turn gets a ``ready_seq`` when it becomes ready, and each consumer a floor below which
everything is done, so a claim only looks at the unfinished window however large the store grows.

Crash recovery: every claim names its owner (:attr:`Store.owner`, one per open store); at start-up a consumer calls
:meth:`Store.take_over_claims`, which takes the store's owner lock (released by the OS when a process dies, so
holding it proves the previous process is gone) and frees every claim another owner left, so nothing waits out a
lease after a ``kill -9``. :meth:`Store.release` gives a claim back early (with an error and a failure count, so a
consumer can give up on a turn and complete it with ``failed=True``). :meth:`Store.commit_step` writes a training
step's row and the completion of every turn it consumed in one transaction; :meth:`Store.discard_steps_after`
undoes steps whose weights never reached a checkpoint, reopening their turns (see ``openclaw_cli.trainer_loop``).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import secrets
import socket
import sqlite3
import struct
import sys
import threading
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from openclaw_cli.capture import SECRET_HEADERS

SynchronousMode = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

# "OCLW" in the database header: tells our files apart from any other SQLite database a path might point at.
APPLICATION_ID = 0x4F434C57


_DAMAGED_ADVICE = "move it (and any -wal/-shm file beside it) aside to start a new store, or restore it from a backup"


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message says which file and what to do."""


# --- schema --------------------------------------------------------------------------------------------------------
# Each entry migrates from user_version == index to index + 1. Append only; never edit a released step.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE sessions (
            id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,              -- the client's own id ('' when inferred); forks share it
            id_source TEXT NOT NULL,          -- header:x-session-id, openai:user, inferred, ...
            status TEXT NOT NULL DEFAULT 'open',   -- open | ended | expired
            parent_session_id TEXT,           -- a fork/continuation: the session it branched from
            fork_turn_id INTEGER,             -- ... and the turn it extends
            system_hash BLOB,                 -- canonical hash of the main line's system prompt
            main_turns INTEGER NOT NULL DEFAULT 0,
            side_turns INTEGER NOT NULL DEFAULT 0,
            tail_turn_id INTEGER,             -- latest main turn (the one still waiting for its next state)
            created_at REAL NOT NULL,
            last_seen_at REAL NOT NULL,
            ended_at REAL
        )""",
        # No index holds last_seen_at: it changes on every turn, and open sessions are few (idle ones expire).
        "CREATE INDEX sessions_scope ON sessions(scope, status)",
        "CREATE INDEX sessions_status ON sessions(status)",
        # Turns are split in two: the narrow row that changes (status, next state, reward) and the wide payload
        # written once. An UPDATE rewrites the whole record, so keeping kilobytes of history out of the mutable row
        # keeps pairing and judging cheap.
        """CREATE TABLE turns (
            id INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            parent_turn_id INTEGER REFERENCES turns(id),
            turn_index INTEGER NOT NULL,      -- position on its main line; -1 for side turns
            turn_type TEXT NOT NULL CHECK (turn_type IN ('main', 'side')),
            type_reason TEXT NOT NULL,        -- why this type (header, model, choice, continuation, ...)
            api TEXT NOT NULL,
            model TEXT NOT NULL,
            stream INTEGER NOT NULL,
            choice_index INTEGER NOT NULL,
            n_prompt_tokens INTEGER NOT NULL,
            n_completion_tokens INTEGER NOT NULL,
            version INTEGER NOT NULL,
            finish_reason TEXT NOT NULL,
            started_at REAL NOT NULL,
            first_token_at REAL NOT NULL,
            finished_at REAL NOT NULL,
            next_state TEXT,                  -- JSON list of messages after this turn, NULL = none
            next_state_role TEXT,             -- role of the last next-state message (user / tool)
            status TEXT NOT NULL,             -- pending | ready (main), skipped (side)
            reward REAL,
            created_at REAL NOT NULL,
            ready_at REAL,
            ready_seq INTEGER                 -- order in which main turns became ready (hand-off order)
        )""",
        """CREATE TABLE turn_data (
            turn_id INTEGER PRIMARY KEY REFERENCES turns(id),
            messages TEXT NOT NULL,           -- JSON, OpenAI chat format
            tools TEXT,                       -- JSON or NULL
            request TEXT NOT NULL,            -- JSON as the client sent it, secrets dropped
            request_messages_elided INTEGER NOT NULL,  -- 1: request.messages == messages, stored once
            response TEXT NOT NULL,           -- JSON as the client received it
            assistant_message TEXT NOT NULL,  -- JSON
            headers TEXT NOT NULL,            -- JSON, credentials dropped
            metadata TEXT NOT NULL,           -- JSON
            prompt_tokens BLOB NOT NULL,      -- int32 little-endian
            completion_tokens BLOB NOT NULL,  -- int32 little-endian
            logprobs BLOB NOT NULL,           -- float64 little-endian (lossless)
            sampling_logprobs BLOB NOT NULL   -- float64 little-endian, empty when the backend has none
        )""",
        "CREATE INDEX turns_session ON turns(session_id, id)",
        "CREATE INDEX turns_status ON turns(status, turn_type)",
        "CREATE UNIQUE INDEX turns_ready_seq ON turns(ready_seq)",
        "CREATE INDEX turns_created ON turns(created_at)",
        # Canonical-history hashes of every turn (messages + reply), for session inference by prefix.
        """CREATE TABLE prefix_index (
            scope TEXT NOT NULL,
            hash BLOB NOT NULL,
            turn_id INTEGER NOT NULL REFERENCES turns(id),
            PRIMARY KEY (scope, hash, turn_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE claims (
            consumer TEXT NOT NULL,
            turn_id INTEGER NOT NULL REFERENCES turns(id),
            lease_until REAL,
            attempts INTEGER NOT NULL DEFAULT 0,
            done_at REAL,
            result TEXT,
            PRIMARY KEY (consumer, turn_id)
        ) WITHOUT ROWID""",
        # Per consumer, every ready turn with ready_seq <= floor is done: claims scan only what lies above it.
        """CREATE TABLE consumer_floors (
            consumer TEXT PRIMARY KEY,
            floor INTEGER NOT NULL
        ) WITHOUT ROWID""",
        """CREATE TABLE steps (
            step INTEGER PRIMARY KEY,
            version INTEGER,
            created_at REAL NOT NULL,
            metrics TEXT NOT NULL
        )""",
    ),
    # 1 -> 2: crash-safe hand-off. Who holds a claim (a restart releases a dead process's claims at once instead of
    # waiting out the lease), per-turn failures and a terminal "failed" outcome (a judge that keeps rejecting a
    # turn gives up on it), the step that consumed a turn (undone when that step is lost in a crash), and the
    # checkpoints each step was saved to (resume loads what the store recorded, for any backend).
    (
        "ALTER TABLE claims ADD COLUMN owner TEXT",
        "ALTER TABLE claims ADD COLUMN failures INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE claims ADD COLUMN last_error TEXT",
        "ALTER TABLE claims ADD COLUMN failed INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE claims ADD COLUMN step INTEGER",
        # Partial indexes keep the status counts cheap however many turns were completed normally.
        "CREATE INDEX claims_failed ON claims(consumer) WHERE failed = 1",
        "CREATE INDEX claims_erroring ON claims(consumer) WHERE done_at IS NULL AND last_error IS NOT NULL",
        # Results written before this migration name their step in the JSON (the trainer's); lift it out.
        "UPDATE claims SET step = json_extract(result, '$.step') WHERE done_at IS NOT NULL AND json_valid(result) "
        "AND json_type(result, '$.step') = 'integer'",
        "CREATE INDEX claims_step ON claims(consumer, step) WHERE step IS NOT NULL",
        """CREATE TABLE checkpoints (
            step INTEGER PRIMARY KEY,
            path TEXT NOT NULL,               -- what the backend's save_state returned (a directory or a URI)
            created_at REAL NOT NULL
        )""",
    ),
    # 2 -> 3: retention (store.retention_days) deletes old turns. Every foreign key that points at a turn needs an
    # index on its column, or SQLite checks each deleted turn by scanning the whole referencing table.
    (
        "CREATE INDEX IF NOT EXISTS turns_parent ON turns(parent_turn_id)",
        "CREATE INDEX IF NOT EXISTS claims_turn ON claims(turn_id)",
        "CREATE INDEX IF NOT EXISTS prefix_index_turn ON prefix_index(turn_id)",
    ),
]

SCHEMA_VERSION = len(MIGRATIONS)
_NEXT_READY_SEQ = "(SELECT IFNULL(MAX(ready_seq), 0) + 1 FROM turns)"  # O(log n) through turns_ready_seq
_CACHE_KIB = 64 * 1024  # page cache ceiling; the default 2 MiB makes every index update a read syscall
# WAL checkpoints (and the fsync each one ends with) run on a background thread after commits, not inside a commit
# (they were about a third of the capture path's time). The writer still checkpoints itself past this many WAL
# pages (64 MiB), so the WAL stays bounded if the background thread cannot keep up.
_WAL_BACKSTOP_PAGES = 16384
_CHECKPOINT_DELAY_S = 0.2  # lets a burst of commits share one checkpoint
_CHECKPOINTER_IDLE_EXIT_S = 30.0  # an idle checkpointer stops (and restarts on the next commit)

# --- compact arrays ------------------------------------------------------------------------------------------------
_LITTLE = sys.byteorder == "little"
if array("i").itemsize != 4:  # pragma: no cover - every platform we support has 4-byte C ints
    raise ImportError("openclaw_cli.store needs a platform with 4-byte C int")


def pack_ints(values: Sequence[int]) -> bytes:
    """int32 little-endian (struct packs a list about three times faster than array does)."""
    return struct.pack(f"<{len(values)}i", *values)


def unpack_ints(blob: bytes) -> list[int]:
    data = array("i")
    data.frombytes(blob)
    if not _LITTLE:  # pragma: no cover
        data.byteswap()
    return data.tolist()


def pack_floats(values: Sequence[float]) -> bytes:
    """float64 little-endian: lossless, so stored log-probs are exactly what the sampler reported."""
    return struct.pack(f"<{len(values)}d", *values)


def unpack_floats(blob: bytes) -> list[float]:
    data = array("d")
    data.frombytes(blob)
    if not _LITTLE:  # pragma: no cover
        data.byteswap()
    return data.tolist()


# --- secrets -------------------------------------------------------------------------------------------------------
_SECRET_KEY = re.compile(
    r"^(x-)?api[-_]?key$|[-_]api[-_]?key$|^(proxy-)?authorization$|^(client[-_])?secret$|^password$"
    r"|^(access|refresh|id)[-_]token$|^cookie$|^set-cookie$",
    re.IGNORECASE,
)


# Conversation and tool payloads are data, not configuration: a tool whose schema has an "api_key" parameter, or a
# tool call carrying one, must be stored as it was. (Walking them would also cost a full pass over every history.)
_CONTENT_KEYS = frozenset({"messages", "system", "tools", "content", "choices", "input", "prompt"})


@functools.lru_cache(maxsize=4096)  # the same few field names come back in every request
def _is_secret_key(key: str) -> bool:
    return key.lower() in SECRET_HEADERS or _SECRET_KEY.search(key) is not None


def scrub_secrets(value: Any) -> Any:
    """A copy of a JSON value without any api_key/authorization/secret-like field, at any depth outside the
    conversation payload (messages, system, tools, content, choices, input, prompt are kept verbatim)."""
    if isinstance(value, dict):
        return {
            k: v if k in _CONTENT_KEYS else scrub_secrets(v)
            for k, v in value.items()
            if not (isinstance(k, str) and _is_secret_key(k))
        }
    if isinstance(value, list):
        return [scrub_secrets(v) for v in value]
    return value


def _dumps(value: Any) -> str:
    """Strict JSON: a non-finite float (e.g. a loss the backend did not compute, NaN) is stored as null, since
    ``NaN`` / ``Infinity`` are not JSON and other readers of the store would reject them."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        if "Out of range float" not in str(exc):  # e.g. a circular value: not ours to repair
            raise
        return json.dumps(_finite_or_null(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


# --- records -------------------------------------------------------------------------------------------------------
@dataclass
class NewTurn:
    """Everything one turn row needs; the session logic fills it, the store encodes it."""

    session_id: str
    parent_turn_id: int | None
    turn_index: int
    turn_type: str
    type_reason: str
    status: str
    api: str
    model: str
    stream: bool
    choice_index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    request: dict[str, Any]
    response: dict[str, Any]
    assistant_message: dict[str, Any]
    headers: dict[str, str]
    metadata: dict[str, Any]
    prompt_tokens: Sequence[int]
    completion_tokens: Sequence[int]
    logprobs: Sequence[float]
    sampling_logprobs: Sequence[float]
    version: int
    finish_reason: str
    started_at: float
    first_token_at: float
    finished_at: float
    created_at: float


@dataclass
class TurnRecord:
    id: int
    session_id: str
    parent_turn_id: int | None
    turn_index: int
    turn_type: str
    type_reason: str
    status: str
    api: str
    model: str
    stream: bool
    choice_index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    request: dict[str, Any]
    response: dict[str, Any]
    assistant_message: dict[str, Any]
    headers: dict[str, str]
    metadata: dict[str, Any]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    sampling_logprobs: list[float]
    version: int
    finish_reason: str
    started_at: float
    first_token_at: float
    finished_at: float
    next_state: list[dict[str, Any]] | None
    next_state_role: str | None
    reward: float | None
    created_at: float
    ready_at: float | None


@dataclass
class SessionRecord:
    id: str
    scope: str
    id_source: str
    status: str
    parent_session_id: str | None
    fork_turn_id: int | None
    system_hash: bytes | None
    main_turns: int
    side_turns: int
    tail_turn_id: int | None
    created_at: float
    last_seen_at: float
    ended_at: float | None


@dataclass
class PrefixMatch:
    """A stored turn whose canonical history (messages + reply) equals a prefix of a new request."""

    hash: bytes
    turn_id: int
    session_id: str
    turn_type: str
    turn_index: int
    is_tail: bool  # the latest main turn of its session
    session_open: bool


_TURN_COLUMNS = (
    "t.id, t.session_id, t.parent_turn_id, t.turn_index, t.turn_type, t.type_reason, t.status, t.api, t.model, "
    "t.stream, t.choice_index, d.messages, d.tools, d.request, d.request_messages_elided, d.response, "
    "d.assistant_message, d.headers, d.metadata, d.prompt_tokens, d.completion_tokens, d.logprobs, "
    "d.sampling_logprobs, t.version, t.finish_reason, t.started_at, t.first_token_at, t.finished_at, t.next_state, "
    "t.next_state_role, t.reward, t.created_at, t.ready_at"
)
_TURN_FROM = "turns t JOIN turn_data d ON d.turn_id = t.id"
_SESSION_COLUMNS = (
    "id, scope, id_source, status, parent_session_id, fork_turn_id, system_hash, main_turns, side_turns, "
    "tail_turn_id, created_at, last_seen_at, ended_at"
)


def _turn_from_row(row: sqlite3.Row | tuple[Any, ...]) -> TurnRecord:
    (
        id_,
        session_id,
        parent_turn_id,
        turn_index,
        turn_type,
        type_reason,
        status,
        api,
        model,
        stream,
        choice_index,
        messages,
        tools,
        request,
        request_messages_elided,
        response,
        assistant_message,
        headers,
        metadata,
        prompt_tokens,
        completion_tokens,
        logprobs,
        sampling_logprobs,
        version,
        finish_reason,
        started_at,
        first_token_at,
        finished_at,
        next_state,
        next_state_role,
        reward,
        created_at,
        ready_at,
    ) = row
    messages_list = json.loads(messages)
    request_dict = json.loads(request)
    if request_messages_elided:
        request_dict["messages"] = json.loads(messages)  # a separate copy: callers may edit either
    return TurnRecord(
        id=id_,
        session_id=session_id,
        parent_turn_id=parent_turn_id,
        turn_index=turn_index,
        turn_type=turn_type,
        type_reason=type_reason,
        status=status,
        api=api,
        model=model,
        stream=bool(stream),
        choice_index=choice_index,
        messages=messages_list,
        tools=_loads(tools),
        request=request_dict,
        response=json.loads(response),
        assistant_message=json.loads(assistant_message),
        headers=json.loads(headers),
        metadata=json.loads(metadata),
        prompt_tokens=unpack_ints(prompt_tokens),
        completion_tokens=unpack_ints(completion_tokens),
        logprobs=unpack_floats(logprobs),
        sampling_logprobs=unpack_floats(sampling_logprobs),
        version=version,
        finish_reason=finish_reason,
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=finished_at,
        next_state=_loads(next_state),
        next_state_role=next_state_role,
        reward=reward,
        created_at=created_at,
        ready_at=ready_at,
    )


def _session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    return SessionRecord(*row)


# --- transaction-scoped operations ---------------------------------------------------------------------------------
class StoreTx:
    """Operations inside one open write transaction (see :meth:`Store.transaction`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    # sessions
    def get_session(self, session_id: str) -> SessionRecord | None:
        row = self._conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else _session_from_row(row)

    def latest_session(self, scope: str, *, open_only: bool = False) -> SessionRecord | None:
        where = "scope = ? AND status = 'open'" if open_only else "scope = ?"
        row = self._conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE {where} ORDER BY last_seen_at DESC, rowid DESC LIMIT 1",
            (scope,),
        ).fetchone()
        return None if row is None else _session_from_row(row)

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
                f"ready_seq = {_NEXT_READY_SEQ} WHERE id = ? AND status = 'pending'",
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
        cursor = self._conn.execute(
            "INSERT INTO turns (session_id, parent_turn_id, turn_index, turn_type, type_reason, status, api, model, "
            "stream, choice_index, n_prompt_tokens, n_completion_tokens, version, finish_reason, started_at, "
            "first_token_at, finished_at, created_at, ready_at, ready_seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            f"CASE WHEN ? THEN {_NEXT_READY_SEQ} END)",
            (
                turn.session_id,
                turn.parent_turn_id,
                turn.turn_index,
                turn.turn_type,
                turn.type_reason,
                turn.status,
                turn.api,
                turn.model,
                int(turn.stream),
                turn.choice_index,
                len(turn.prompt_tokens),
                len(turn.completion_tokens),
                turn.version,
                turn.finish_reason,
                turn.started_at,
                turn.first_token_at,
                turn.finished_at,
                turn.created_at,
                turn.created_at if turn.status == "ready" else None,
                turn.status == "ready",
            ),
        )
        turn_id = cursor.lastrowid
        assert turn_id is not None
        self._conn.execute(
            "INSERT INTO turn_data (turn_id, messages, tools, request, request_messages_elided, response, "
            "assistant_message, headers, metadata, prompt_tokens, completion_tokens, logprobs, sampling_logprobs) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                turn_id,
                _dumps(turn.messages),
                None if turn.tools is None else _dumps(turn.tools),
                _dumps(request),
                int(elided),
                _dumps(scrub_secrets(turn.response)),
                _dumps(turn.assistant_message),
                _dumps(scrub_secrets(turn.headers)),
                _dumps(scrub_secrets(turn.metadata)),
                pack_ints(turn.prompt_tokens),
                pack_ints(turn.completion_tokens),
                pack_floats(turn.logprobs),
                pack_floats(turn.sampling_logprobs),
            ),
        )
        return turn_id

    def set_next_state(self, turn_id: int, next_state: list[dict[str, Any]], role: str | None, now: float) -> None:
        self._conn.execute(
            "UPDATE turns SET next_state = ?, next_state_role = ?, status = 'ready', ready_at = ?, "
            f"ready_seq = {_NEXT_READY_SEQ} WHERE id = ? AND status = 'pending'",
            (_dumps(next_state), role, now, turn_id),
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


# --- background checkpoints --------------------------------------------------------------------------------------
class _Checkpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection shortly after commits. PASSIVE never waits for
    a lock, so it cannot stall the writer or readers; what it cannot copy now it copies next time. Durability is
    unchanged: a commit is in the WAL file when COMMIT returns, checkpointed or not."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def poke(self) -> None:
        """Note that a commit happened (cheap: sets an event; starts the thread when none runs)."""
        self._dirty.set()
        if self._thread is None or not self._thread.is_alive():
            with self._guard:
                if self._stopping.is_set():
                    return
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="openclaw-store-checkpoint", daemon=True)
                    self._thread.start()

    def stop(self) -> None:
        with self._guard:
            self._stopping.set()
            thread = self._thread
        self._dirty.set()
        if thread is not None:
            thread.join(timeout=10)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=0)
        except sqlite3.Error:
            return  # the writer's own autocheckpoint (the backstop) still bounds the WAL
        try:
            while self._dirty.wait(_CHECKPOINTER_IDLE_EXIT_S):
                # Stopping: the store's own connection checkpoints as it closes, so there is nothing left to do.
                if self._stopping.wait(_CHECKPOINT_DELAY_S):
                    break
                self._dirty.clear()
                with suppress(sqlite3.Error):  # e.g. the file went away; the backstop still applies
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            conn.close()


# --- the store -----------------------------------------------------------------------------------------------------
class Store:
    """The SQLite store. ``create=False`` refuses to create a missing file (readers such as export)."""

    def __init__(self, path: Path | str, *, synchronous: SynchronousMode = "NORMAL", create: bool = True) -> None:
        self.path = Path(path)
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {synchronous!r}")
        self._lock = threading.RLock()
        # Names this process's claims; a restart releases every claim another owner left (see take_over_claims).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._owner_lock_fd: int | None = None
        self._conn = self._open(synchronous, create)
        self._checkpointer = _Checkpointer(self.path)

    # opening --------------------------------------------------------------------------------------------------------
    def _open(self, synchronous: str, create: bool) -> sqlite3.Connection:
        path = self.path
        if not path.exists():
            if not create:
                raise StoreError(f"no store at {path} (nothing has been captured yet, or store.path points elsewhere)")
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # Create the file ourselves so it is 0600 from the first byte; SQLite gives -wal/-shm the same mode.
            with suppress(FileExistsError):  # another process created it a moment ago
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        elif path.is_dir():
            raise StoreError(f"store path {path} is a directory; point store.path at a file")
        else:
            _tighten_mode(path)
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open store {path}: {exc}") from None
        try:
            self._check_and_migrate(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_BACKSTOP_PAGES}")
        except sqlite3.OperationalError as exc:  # busy/locked, I/O, permissions: the file itself may be fine
            conn.close()
            raise StoreError(f"cannot open store {path}: {exc}") from None
        except sqlite3.DatabaseError as exc:  # not a database, or corrupt
            conn.close()
            raise StoreError(f"store {path} is damaged or not an SQLite database ({exc}); {_DAMAGED_ADVICE}") from None
        except StoreError:
            conn.close()
            raise
        for suffix in ("-wal", "-shm"):
            side_file = Path(f"{path}{suffix}")
            if side_file.exists():
                _tighten_mode(side_file)
        return conn

    def _check_and_migrate(self, conn: sqlite3.Connection) -> None:
        path = self.path
        # quick_check reads every page (about a second per GB): a damaged or foreign file fails here, at open,
        # not in the middle of serving a request.
        problems = [row[0] for row in conn.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            # quick_check reports one problem per row, some spanning lines: the error must stay one line.
            shown = "; ".join(" ".join(problem.split()) for problem in problems[:3])[:300]
            raise StoreError(f"store {path} is corrupt ({shown}); {_DAMAGED_ADVICE}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {path} has schema version {version}, newer than this openclaw-cli understands "
                f"({SCHEMA_VERSION}); upgrade openclaw-cli or point store.path at another file"
            )
        if version == 0:
            has_tables = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] > 0
            if has_tables:
                raise StoreError(f"{path} is an SQLite database but not an openclaw store; choose another store.path")
        elif app_id != APPLICATION_ID:
            raise StoreError(f"{path} is an SQLite database but not an openclaw store; choose another store.path")
        for step in range(version, SCHEMA_VERSION):
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Re-read under the write lock: another process opening the same file may have migrated meanwhile.
                if conn.execute("PRAGMA user_version").fetchone()[0] == step:
                    for statement in MIGRATIONS[step]:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                    conn.execute(f"PRAGMA user_version={step + 1}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        self._checkpointer.stop()  # first: the last connection to close checkpoints and removes the WAL
        with self._lock:
            self._conn.close()
            if self._owner_lock_fd is not None:
                os.close(self._owner_lock_fd)  # closing the descriptor drops the flock
                self._owner_lock_fd = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self._lock:
            return self._conn.execute("PRAGMA user_version").fetchone()[0]

    def journal_mode(self) -> str:
        with self._lock:
            return self._conn.execute("PRAGMA journal_mode").fetchone()[0]

    # transactions ---------------------------------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[StoreTx]:
        """One write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``); rolled back if the block raises."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield StoreTx(self._conn)
                self._conn.execute("COMMIT")
                self._checkpointer.poke()
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    # reads ----------------------------------------------------------------------------------------------------------
    def get_turn(self, turn_id: int) -> TurnRecord | None:
        rows = self._read(f"SELECT {_TURN_COLUMNS} FROM {_TURN_FROM} WHERE t.id = ?", (turn_id,))
        return _turn_from_row(rows[0]) if rows else None

    def get_session(self, session_id: str) -> SessionRecord | None:
        rows = self._read(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,))
        return _session_from_row(rows[0]) if rows else None

    def sessions(self) -> list[SessionRecord]:
        return [_session_from_row(r) for r in self._read(f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY rowid")]

    def iter_turns(
        self,
        *,
        session_ids: Sequence[str] | None = None,
        turn_type: str | None = None,
        status: str | None = None,
        since: float | None = None,
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
        last_id = 0
        while True:
            clause = " AND ".join([*where, "t.id > ?"])
            rows = self._read(
                f"SELECT {_TURN_COLUMNS} FROM {_TURN_FROM} WHERE {clause} ORDER BY t.id LIMIT ?",
                (*params, last_id, batch),
            )
            for row in rows:
                yield _turn_from_row(row)
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

    # hand-off (judge / trainer loops) -------------------------------------------------------------------------------
    def claim_ready(
        self,
        consumer: str,
        limit: int,
        lease_s: float,
        *,
        after: str | None = None,
        now: float | None = None,
    ) -> list[TurnRecord]:
        """Lease up to ``limit`` ready main-line turns that ``consumer`` has not completed, in the order they
        became ready.

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
        with self.transaction():
            params: list[Any] = [self._floor(consumer), consumer, now]
            if after is not None:
                params.append(after)
            params.append(limit)
            rows = self._conn.execute(
                f"SELECT {_TURN_COLUMNS} FROM {_TURN_FROM} "
                "WHERE t.ready_seq > ? AND t.turn_type = 'main' AND NOT EXISTS ("
                "SELECT 1 FROM claims c WHERE c.consumer = ? AND c.turn_id = t.id "
                f"AND (c.done_at IS NOT NULL OR c.lease_until > ?)) {chain} ORDER BY t.ready_seq LIMIT ?",
                params,
            ).fetchall()
            self._conn.executemany(
                "INSERT INTO claims (consumer, turn_id, lease_until, attempts, owner) VALUES (?, ?, ?, 1, ?) "
                "ON CONFLICT (consumer, turn_id) DO UPDATE SET lease_until = excluded.lease_until, "
                "attempts = attempts + 1, owner = excluded.owner",
                [(consumer, row[0], now + lease_s, self.owner) for row in rows],
            )
        return [_turn_from_row(row) for row in rows]

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
        while True:
            rows = self._conn.execute(
                "SELECT t.ready_seq, c.done_at FROM turns t LEFT JOIN claims c ON c.consumer = ? AND c.turn_id = t.id "
                "WHERE t.ready_seq > ? ORDER BY t.ready_seq LIMIT ?",
                (consumer, floor, window),
            ).fetchall()
            blocked = False
            for seq, done_at in rows:
                if done_at is None:
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
                (step, version, now, _dumps(metrics)),
            )
            completed = 0
            for turn_id, result in results.items():
                completed += self._complete_in_tx(consumer, turn_id, _dumps(result), now, step=step)
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
                (step, version, time.time() if now is None else now, _dumps(metrics)),
            )

    def steps(self) -> list[tuple[int, int | None, float, dict[str, Any]]]:
        rows = self._read("SELECT step, version, created_at, metrics FROM steps ORDER BY step")
        return [(s, v, t, json.loads(m)) for s, v, t, m in rows]

    # backlog and held-out reads (status displays, promotion gate) ---------------------------------------------------
    def backlog(self, consumer: str, *, after: str | None = None) -> tuple[int, float | None]:
        """(how many, oldest ready_at) of the ready main-line turns ``consumer`` has not completed yet; with
        ``after``, only those that consumer has completed (e.g. judged but not yet trained). Scans only above the
        consumer's floor, so it costs what the backlog holds, not what the store holds."""
        chain = (
            "AND EXISTS (SELECT 1 FROM claims p WHERE p.consumer = ? AND p.turn_id = t.id AND p.done_at IS NOT NULL)"
            if after is not None
            else ""
        )
        with self._lock:
            params: list[Any] = [self._floor(consumer), consumer]
            if after is not None:
                params.append(after)
            count, oldest = self._conn.execute(
                "SELECT COUNT(*), MIN(t.ready_at) FROM turns t WHERE t.ready_seq > ? AND t.turn_type = 'main' "
                "AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.consumer = ? AND c.turn_id = t.id "
                f"AND c.done_at IS NOT NULL) {chain}",
                params,
            ).fetchone()
        return int(count), oldest

    def oldest_turn_at(self, status: str, turn_type: str = "main") -> float | None:
        """created_at of the oldest turn with this status (e.g. the longest-waiting ``pending`` turn)."""
        rows = self._read("SELECT MIN(created_at) FROM turns WHERE status = ? AND turn_type = ?", (status, turn_type))
        return rows[0][0]

    def latest_turns(self, limit: int, *, turn_type: str = "main", not_done_by: str | None = None) -> list[TurnRecord]:
        """The newest ``limit`` turns of a type, newest first; ``not_done_by`` skips turns that consumer completed
        (e.g. the promotion gate's held-out set: turns the trainer has not trained on)."""
        if limit < 1:
            return []
        where = "t.turn_type = ?"
        params: list[Any] = [turn_type]
        if not_done_by is not None:
            where += (
                " AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.consumer = ? AND c.turn_id = t.id "
                "AND c.done_at IS NOT NULL)"
            )
            params.append(not_done_by)
        rows = self._read(
            f"SELECT {_TURN_COLUMNS} FROM {_TURN_FROM} WHERE {where} ORDER BY t.id DESC LIMIT ?", (*params, limit)
        )
        return [_turn_from_row(row) for row in rows]

    # retention (store.retention_days; see openclaw_cli.retention) ---------------------------------------------------
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
        with self._lock:
            previous = self._conn.execute("PRAGMA secure_delete").fetchone()[0]
            self._conn.execute("PRAGMA secure_delete=ON")
        try:
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
        finally:
            with self._lock:
                self._conn.execute(f"PRAGMA secure_delete={int(previous)}")
        if purged_turns or purged_sessions:
            with self._lock, suppress(sqlite3.OperationalError):
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # busy readers: the next purge retries
        return PurgeResult(turns=purged_turns, sessions=purged_sessions)

    def _delete_turns(self, ids: Sequence[int]) -> None:
        marks = ",".join("?" * len(ids))
        for statement in (
            f"DELETE FROM prefix_index WHERE turn_id IN ({marks})",
            f"DELETE FROM claims WHERE turn_id IN ({marks})",
            f"UPDATE turns SET parent_turn_id = NULL WHERE parent_turn_id IN ({marks})",
            f"UPDATE sessions SET tail_turn_id = NULL WHERE tail_turn_id IN ({marks})",
            f"UPDATE sessions SET fork_turn_id = NULL WHERE fork_turn_id IN ({marks})",
            f"DELETE FROM turn_data WHERE turn_id IN ({marks})",
            f"DELETE FROM turns WHERE id IN ({marks})",
        ):
            self._conn.execute(statement, ids)


@dataclass(frozen=True)
class PurgeResult:
    turns: int
    sessions: int


def _require_json(text: str) -> None:
    try:
        json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"result_json must be JSON text: {exc}") from None


def _tighten_mode(path: Path) -> None:
    """Conversations are private: make an existing store file owner-only, as a new one is."""
    try:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot set permissions of {path}: {exc}") from None
