"""WAL checkpoints on a background thread, off the commit path."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import suppress
from pathlib import Path

from openclaw_cli.store.schema import CHECKPOINT_DELAY_S, CHECKPOINTER_IDLE_EXIT_S


class Checkpointer:
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
            while self._dirty.wait(CHECKPOINTER_IDLE_EXIT_S):
                # Stopping: the store's own connection checkpoints as it closes, so there is nothing left to do.
                if self._stopping.wait(CHECKPOINT_DELAY_S):
                    break
                self._dirty.clear()
                with suppress(sqlite3.Error):  # e.g. the file went away; the backstop still applies
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        finally:
            conn.close()
