"""The store's SQLite schema (append-only migrations), its identity and tuning constants, and StoreError."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Literal

SynchronousMode = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

# "OCLW" in the database header: tells our files apart from any other SQLite database a path might point at.
APPLICATION_ID = 0x4F434C57


DAMAGED_ADVICE = "move it (and any -wal/-shm file beside it) aside to start a new store, or restore it from a backup"


class StoreError(RuntimeError):
    """The store cannot be opened or used; the message says which file and what to do."""


def _adapters_per_owner(conn: sqlite3.Connection) -> None:
    """Migration 5 -> 6 (a function so that a store whose version was set back migrates again: tests do)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(turn_owners)")}
    if "adapter" not in columns:
        conn.execute("ALTER TABLE turn_owners ADD COLUMN adapter TEXT NOT NULL DEFAULT 'shared'")
    conn.execute("CREATE INDEX IF NOT EXISTS turn_owners_adapter ON turn_owners(adapter, turn_id)")
    for table, columns_sql, copied in (
        ("steps", "version INTEGER, created_at REAL NOT NULL, metrics TEXT NOT NULL", "version, created_at, metrics"),
        ("checkpoints", "path TEXT NOT NULL, created_at REAL NOT NULL", "path, created_at"),
    ):
        if "adapter" in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            continue
        conn.execute(
            f"CREATE TABLE {table}_by_adapter (adapter TEXT NOT NULL, step INTEGER NOT NULL, {columns_sql}, "
            "PRIMARY KEY (adapter, step))"
        )
        conn.execute(
            f"INSERT INTO {table}_by_adapter (adapter, step, {copied}) SELECT 'shared', step, {copied} FROM {table}"
        )
        conn.execute(f"DROP TABLE {table}")
        conn.execute(f"ALTER TABLE {table}_by_adapter RENAME TO {table}")


Migration = str | Callable[[sqlite3.Connection], None]

# Each entry migrates from user_version == index to index + 1. Append only; never edit a released step.
MIGRATIONS: list[tuple[Migration, ...]] = [
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
    # 3 -> 4: lessons (see openclaw_cli.learn.lessons); IF NOT EXISTS, like 3, so a store whose version was set back
    # (tests of older migrations do) migrates again. Who each turn was served for, which lessons shaped it, the
    # lessons with the evidence for every change of status, and the users' explicit ratings of turns.
    (
        """CREATE TABLE IF NOT EXISTS turn_owners (
            turn_id INTEGER PRIMARY KEY REFERENCES turns(id),
            owner TEXT NOT NULL               -- key:<hash> | local | session:<scope>; never a key itself
        )""",
        "CREATE INDEX IF NOT EXISTS turn_owners_owner ON turn_owners(owner, turn_id)",
        """CREATE TABLE IF NOT EXISTS lessons (
            id INTEGER PRIMARY KEY,
            owner TEXT NOT NULL,
            text TEXT NOT NULL,               -- the standing instruction, redacted like everything stored
            status TEXT NOT NULL CHECK (status IN ('candidate', 'active', 'retired', 'rejected', 'forgotten')),
            origin TEXT NOT NULL,             -- correction | feedback | user
            source_turn_ids TEXT NOT NULL,    -- JSON list: the turns whose next state taught it
            evidence TEXT NOT NULL,           -- JSON list of {at, status, why, ...}, oldest first
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS lessons_owner ON lessons(owner, status)",
        """CREATE TABLE IF NOT EXISTS lesson_uses (
            lesson_id INTEGER NOT NULL REFERENCES lessons(id),
            turn_id INTEGER NOT NULL REFERENCES turns(id),
            PRIMARY KEY (lesson_id, turn_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX IF NOT EXISTS lesson_uses_turn ON lesson_uses(turn_id)",
        """CREATE TABLE IF NOT EXISTS feedback (
            id INTEGER PRIMARY KEY,
            turn_id INTEGER NOT NULL REFERENCES turns(id),
            rating INTEGER NOT NULL CHECK (rating IN (-1, 1)),
            text TEXT,                        -- redacted; a hint for the turn and a lesson candidate
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS feedback_turn ON feedback(turn_id)",
    ),
    # 4 -> 5: experiment trackers (openclaw_cli.tracking). `openclaw eval` results, so the process that owns the
    # tracker run reports them (a second process resuming the same W&B or MLflow run would race it), and what each
    # tracker was sent: the run's identity and per-tracker cursors, so a restart resumes the run and sends each row
    # once.
    (
        """CREATE TABLE IF NOT EXISTS evaluations (
            id INTEGER PRIMARY KEY,
            created_at REAL NOT NULL,
            report TEXT NOT NULL              -- JSON: EvalReport.to_json() without the replies
        )""",
        """CREATE TABLE IF NOT EXISTS tracker_state (
            key TEXT PRIMARY KEY,             -- run | sent:<tracker>
            value TEXT NOT NULL               -- JSON
        )""",
    ),
    # 5 -> 6: an adapter per owner (openclaw_cli.adapters). Which adapter served each turn (the one its tokens and
    # log-probabilities came from, so the one it trains), and steps and checkpoints numbered per adapter. Everything
    # already stored belongs to the shared adapter, as it did.
    (_adapters_per_owner,),
]

SCHEMA_VERSION = len(MIGRATIONS)
NEXT_READY_SEQ = "(SELECT IFNULL(MAX(ready_seq), 0) + 1 FROM turns)"  # O(log n) through turns_ready_seq
CACHE_KIB = 64 * 1024  # page cache ceiling; the default 2 MiB makes every index update a read syscall
# WAL checkpoints (and the fsync each one ends with) run on a background thread after commits, not inside a commit
# (they were about a third of the capture path's time). The writer still checkpoints itself past this many WAL
# pages (64 MiB), so the WAL stays bounded if the background thread cannot keep up.
WAL_BACKSTOP_PAGES = 16384
CHECKPOINT_DELAY_S = 0.2  # lets a burst of commits share one checkpoint
CHECKPOINTER_IDLE_EXIT_S = 30.0  # an idle checkpointer stops (and restarts on the next commit)
# The adapter that served turn ``t`` (rows captured before owners were recorded are the shared adapter's).
TURN_ADAPTER = "COALESCE((SELECT o.adapter FROM turn_owners o WHERE o.turn_id = t.id), 'shared')"
