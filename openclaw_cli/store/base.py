"""The store's connection: opening (0600 file, integrity check, migrations, WAL), closing, transactions."""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Self

from openclaw_cli.store.checkpointer import Checkpointer
from openclaw_cli.store.schema import (
    APPLICATION_ID,
    CACHE_KIB,
    DAMAGED_ADVICE,
    MIGRATIONS,
    SCHEMA_VERSION,
    WAL_BACKSTOP_PAGES,
    StoreError,
    SynchronousMode,
)
from openclaw_cli.store.tx import StoreTx


class StoreBase:
    """One SQLite file behind one connection and lock (see :class:`openclaw_cli.store.Store`)."""

    def __init__(self, path: Path | str, *, synchronous: SynchronousMode = "NORMAL", create: bool = True) -> None:
        self.path = Path(path)
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, got {synchronous!r}")
        self._lock = threading.RLock()
        # Names this process's claims; a restart releases every claim another owner left (see take_over_claims).
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._owner_lock_fd: int | None = None
        self._conn = self._open(synchronous, create)
        self._checkpointer = Checkpointer(self.path)

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
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
        except sqlite3.OperationalError as exc:  # busy/locked, I/O, permissions: the file itself may be fine
            conn.close()
            raise StoreError(f"cannot open store {path}: {exc}") from None
        except sqlite3.DatabaseError as exc:  # not a database, or corrupt
            conn.close()
            raise StoreError(f"store {path} is damaged or not an SQLite database ({exc}); {DAMAGED_ADVICE}") from None
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
            raise StoreError(f"store {path} is corrupt ({shown}); {DAMAGED_ADVICE}")
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
                        if isinstance(statement, str):
                            conn.execute(statement)
                        else:
                            statement(conn)
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

    def __enter__(self) -> Self:
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


def _tighten_mode(path: Path) -> None:
    """Conversations are private: make an existing store file owner-only, as a new one is."""
    try:
        if path.stat().st_mode & 0o077:
            os.chmod(path, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot set permissions of {path}: {exc}") from None
