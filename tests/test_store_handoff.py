"""The store's crash-safe hand-off: claim owners and take-over after a restart, the owner lock, failures and giving
up, one-transaction step commits, undoing steps lost in a crash, the 1 -> 2 migration, and damaged files refused at
start (by the store and by `openclaw launch`, with one line and a non-zero exit)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import free_port

from openclaw_cli.store import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, Store, StoreError
from openclaw_cli.testing.store_turns import new_turn

REPO_ROOT = Path(__file__).resolve().parents[1]


def seed_ready(store: Store, n: int, session: str = "s") -> list[int]:
    """``n`` ready main turns in one session, in ready order."""
    with store.transaction() as tx:
        if tx.get_session(session) is None:
            tx.create_session(session, scope="", id_source="test", now=100.0)
        return [tx.insert_turn(new_turn(session, index=i, status="ready")) for i in range(n)]


def claim_row(store: Store, consumer: str, turn_id: int) -> dict[str, object]:
    rows = store._read(
        "SELECT owner, lease_until, attempts, failures, last_error, failed, step, done_at FROM claims "
        "WHERE consumer = ? AND turn_id = ?",
        (consumer, turn_id),
    )
    keys = ("owner", "lease_until", "attempts", "failures", "last_error", "failed", "step", "done_at")
    return dict(zip(keys, rows[0], strict=True))


# --- owners, take-over, the owner lock ------------------------------------------------------------------------------
def test_a_restart_takes_over_the_claims_a_dead_owner_left_without_waiting_for_the_lease(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    crashed = Store(path)
    ids = seed_ready(crashed, 3)
    assert [t.id for t in crashed.claim_ready("judge", 2, lease_s=600, now=1000.0)] == ids[:2]
    crashed.complete("judge", ids[0], "{}", now=1001.0)
    assert claim_row(crashed, "judge", ids[1])["owner"] == crashed.owner
    crashed.close()  # what the OS does for a killed process: the connection and the lock go away

    with Store(path) as restarted:
        assert restarted.owner != crashed.owner
        # Before the take-over the dead owner's lease still blocks the turn.
        assert [t.id for t in restarted.claim_ready("judge", 10, lease_s=600, now=1002.0)] == [ids[2]]
        assert restarted.take_over_claims("judge") == 1  # ids[1]; our own fresh claim of ids[2] is kept
        assert claim_row(restarted, "judge", ids[2])["owner"] == restarted.owner
        assert [t.id for t in restarted.claim_ready("judge", 10, lease_s=600, now=1003.0)] == [ids[1]]
        assert restarted.result_of("judge", ids[0]) == {}  # a completed turn stays completed


def test_the_owner_lock_admits_one_live_process_per_store(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    first = Store(path)
    first.take_over_claims("trainer")
    first.take_over_claims("judge")  # the same store object already holds it
    with Store(path) as second:
        with pytest.raises(StoreError) as info:
            second.take_over_claims("trainer")
        message = str(info.value)
        assert str(path) in message and first.owner in message and "\n" not in message
        first.close()  # released on close (and by the OS when a process dies)
        assert second.take_over_claims("trainer") == 0
    assert oct(os.stat(f"{path}.lock").st_mode & 0o777) == "0o600"


# --- failures -------------------------------------------------------------------------------------------------------
def test_release_counts_failures_delays_the_retry_and_a_failed_completion_is_counted(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        a, b = seed_ready(store, 2)
        store.claim_ready("judge", 2, lease_s=600, now=0.0)
        assert store.release("judge", a, retry_at=50.0, error="HTTP 400: too long", count_failure=True) == 1
        assert store.release("judge", b, retry_at=None, error="connection refused") == 0  # judge down: uncounted
        assert claim_row(store, "judge", a)["owner"] is None
        assert store.handoff_counts() == {"judge": {"failed": 0, "erroring": 2}}
        # b is claimable at once, a only from its retry time on.
        assert [t.id for t in store.claim_ready("judge", 5, lease_s=600, now=10.0)] == [b]
        assert [t.id for t in store.claim_ready("judge", 5, lease_s=600, now=50.0)] == [a]
        assert store.release("judge", a, retry_at=60.0, error="HTTP 400 again", count_failure=True) == 2
        assert store.complete("judge", a, json.dumps({"failed": True}), failed=True)
        assert store.complete("judge", b, json.dumps({"score": 1}), reward=1)
        assert store.handoff_counts() == {"judge": {"failed": 1, "erroring": 0}}
        assert store.release("judge", a, error="late") == 0  # done: nothing to give back
        assert claim_row(store, "judge", a)["failed"] == 1 and store.get_turn(a).reward is None


# --- steps: one transaction, undone when lost -----------------------------------------------------------------------
def test_commit_step_writes_the_step_and_its_turns_together_or_not_at_all(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        a, b, c = seed_ready(store, 3)
        with pytest.raises(KeyError):  # one unknown turn: the whole step is rolled back
            store.commit_step(1, 1, {"loss": 0.5}, "trainer", {a: {"trained": True}, 999: {"trained": True}})
        assert store.steps() == [] and store.result_of("trainer", a) is None

        assert store.commit_step(1, 1, {"loss": 0.5}, "trainer", {a: {"trained": True}, b: {"trained": False}}) == 2
        assert [(s, v, m) for s, v, _, m in store.steps()] == [(1, 1, {"loss": 0.5})]
        assert store.result_of("trainer", b) == {"trained": False}
        assert (claim_row(store, "trainer", a)["step"], claim_row(store, "trainer", b)["step"]) == (1, 1)
        # Only c is left for the trainer.
        assert [t.id for t in store.claim_ready("trainer", 5, lease_s=5, now=0.0)] == [c]


def test_discarding_steps_lost_in_a_crash_reopens_their_turns_in_ready_order(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        ids = seed_ready(store, 6)
        store.commit_step(1, 1, {}, "trainer", {ids[0]: {}, ids[1]: {}})
        store.record_checkpoint(1, "/ckpt/step-00000001")
        store.commit_step(2, 2, {}, "trainer", {ids[2]: {}, ids[3]: {}})
        store.complete("trainer", ids[4], json.dumps({"trained": False, "reason": "no usable signal"}))
        store.commit_step(3, 3, {}, "trainer", {ids[5]: {}})
        store.record_checkpoint(3, "/ckpt/step-00000003")
        assert store.claim_ready("trainer", 10, lease_s=5, now=0.0) == []  # the floor is past every turn

        assert store.discard_steps_after(1, "trainer") == [ids[2], ids[3], ids[5]]
        assert [s for s, *_ in store.steps()] == [1]
        assert store.checkpoints() == [(1, "/ckpt/step-00000001")]
        # Reopened in ready order; the no-step completion of ids[4] stands (it was never trained).
        assert [t.id for t in store.claim_ready("trainer", 10, lease_s=5, now=1.0)] == [ids[2], ids[3], ids[5]]
        assert store.result_of("trainer", ids[4]) == {"trained": False, "reason": "no usable signal"}
        assert store.discard_steps_after(1, "trainer") == []  # idempotent


def test_migration_from_schema_1_keeps_claims_and_lifts_the_step_out_of_trainer_results(tmp_path: Path) -> None:
    assert SCHEMA_VERSION >= 2
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    conn.execute("PRAGMA user_version=1")
    conn.close()
    with Store(path) as store:  # a v1 store needs turns to hold claims: write them through the migrated store
        ids = seed_ready(store, 2)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA user_version=1")  # pretend the claims below were written by the old code
    for statement in reversed(MIGRATIONS[1]):  # drop what migration 2 added, newest first
        if statement.startswith("CREATE INDEX"):
            conn.execute(f"DROP INDEX {statement.split()[2]}")
        elif statement.startswith("CREATE TABLE"):
            conn.execute(f"DROP TABLE {statement.split()[2]}")
        elif statement.startswith("ALTER TABLE"):
            conn.execute(f"ALTER TABLE claims DROP COLUMN {statement.split()[5]}")
    conn.executemany(
        "INSERT INTO claims (consumer, turn_id, attempts, done_at, result) VALUES (?, ?, 1, ?, ?)",
        [
            ("trainer", ids[0], 5.0, json.dumps({"trained": True, "step": 7, "version": 7})),
            ("judge", ids[0], 4.0, json.dumps({"score": 1})),
            ("trainer", ids[1], None, None),
        ],
    )
    conn.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert claim_row(store, "trainer", ids[0])["step"] == 7
        assert claim_row(store, "judge", ids[0])["step"] is None
        assert claim_row(store, "trainer", ids[1])["failures"] == 0
        assert store.discard_steps_after(6, "trainer") == [ids[0]]


# --- damaged files --------------------------------------------------------------------------------------------------
def test_a_truncated_store_is_refused_at_open_with_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Store(path) as store:
        for session in range(20):
            seed_ready(store, 10, session=f"s{session}")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the main file, as after a clean shutdown
    conn.close()
    data = path.read_bytes()
    for keep in (len(data) // 2, len(data) - 1000, 60):
        path.write_bytes(data[:keep])
        with pytest.raises(StoreError) as info:
            Store(path)
        message = str(info.value)
        assert str(path) in message and "\n" not in message
        assert "move it" in message and "restore it from a backup" in message


@pytest.mark.timeout(60)
def test_launch_refuses_a_garbage_store_with_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    path.write_bytes(b"definitely not SQLite\n" * 200)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "openclaw_cli", "launch", "--no-ui", "--port", str(free_port())),
            *("--set", f"store.path={path}", "--set", f"local.state_dir={tmp_path / 'ckpt'}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"error: store {path} is damaged or not an SQLite database")
    assert "move it" in errors[0] and "Traceback" not in result.stderr
    assert path.read_bytes() == b"definitely not SQLite\n" * 200  # never written to
