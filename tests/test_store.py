"""The SQLite store: file safety, schema migration, corruption, crash safety, and the at-least-once hand-off."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from openclaw_cli.store import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    NewTurn,
    Store,
    StoreError,
    pack_floats,
    pack_ints,
    scrub_secrets,
    unpack_floats,
    unpack_ints,
)
from openclaw_cli.testing.store_turns import new_turn

REPO_ROOT = Path(__file__).resolve().parents[1]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _turn(session_id: str, *, turn_type: str = "main", status: str = "ready", index: int = 0) -> NewTurn:
    return new_turn(session_id, turn_type=turn_type, status=status, index=index)


def _seed(store: Store, specs: list[tuple[str, str]]) -> list[int]:
    """Insert turns given as (turn_type, status) into one session; returns their ids."""
    ids = []
    with store.transaction() as tx:
        if tx.get_session("s") is None:
            tx.create_session("s", scope="", id_source="inferred", now=100.0)
        for i, (turn_type, status) in enumerate(specs):
            ids.append(tx.insert_turn(_turn("s", turn_type=turn_type, status=status, index=i)))
    return ids


# --- file, schema, corruption --------------------------------------------------------------------------------------
def test_new_store_is_private_wal_and_migrated(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "store.sqlite3"
    with Store(path) as store:
        _seed(store, [("main", "ready")])
        assert store.journal_mode() == "wal"
        assert store.schema_version == SCHEMA_VERSION
        assert _mode(path) == 0o600
        for suffix in ("-wal", "-shm"):
            assert _mode(Path(f"{path}{suffix}")) == 0o600
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.close()


def test_existing_loose_file_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Store(path).close()
    os.chmod(path, 0o644)
    Store(path).close()
    assert _mode(path) == 0o600


def test_migrates_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.sqlite3"
    path.touch()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert _seed(store, [("main", "ready")]) == [1]


def test_reopen_keeps_data_and_does_not_remigrate(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Store(path) as store:
        _seed(store, [("main", "ready"), ("side", "skipped")])
    with Store(path) as store:
        assert [t.turn_type for t in store.iter_turns()] == ["main", "side"]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this openclaw-cli"):
        Store(path)


def test_garbage_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    path.write_bytes(b"this is not a database\n" * 100)
    with pytest.raises(StoreError, match="damaged or not an SQLite database"):
        Store(path)


def test_damaged_pages_fail_quick_check_at_open(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    with Store(path) as store:
        _seed(store, [("main", "ready")] * 200)
    conn = sqlite3.connect(path)  # fold the WAL into the main file so the damage below hits real pages
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    data = bytearray(path.read_bytes())
    assert len(data) > 6 * page_size
    last = len(data) // page_size - 1
    # Only the last page (turn rows / index entries, not the schema): quick_check must still catch it at open.
    data[last * page_size : last * page_size + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError) as info:
        Store(path)
    assert str(path) in str(info.value)
    assert "corrupt" in str(info.value) or "damaged" in str(info.value)


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(StoreError, match="not an openclaw store"):
        Store(path)


def test_missing_store_with_create_false(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store at"):
        Store(tmp_path / "absent.sqlite3", create=False)
    assert not (tmp_path / "absent.sqlite3").exists()


def test_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        with pytest.raises(RuntimeError), store.transaction() as tx:
            tx.create_session("s", scope="", id_source="inferred", now=1.0)
            tx.insert_turn(_turn("s"))
            raise RuntimeError("boom")
        assert store.sessions() == [] and list(store.iter_turns()) == []


# --- encodings and secrets -----------------------------------------------------------------------------------------
def test_compact_arrays_round_trip_exactly() -> None:
    ints = [0, 1, 151_643, 2**31 - 1, -1]
    floats = [0.0, -1e-12, -0.6931471805599453, -123.456789, float("-inf")]
    assert unpack_ints(pack_ints(ints)) == ints
    assert unpack_floats(pack_floats(floats)) == floats
    assert pack_ints([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00"  # little-endian int32, whatever the host
    assert len(pack_floats([1.0, 2.0])) == 16


def test_scrub_secrets_drops_key_like_fields_only() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "api_key": "k",
        "nested": [{"Authorization": "Bearer k", "openai_api_key": "k", "prompt_tokens": 3}],
        "x-api-key": "k",
        "password": "p",
        "metadata": {"user_id": "u"},
    }
    assert scrub_secrets(body) == {
        "model": "m",
        "max_tokens": 10,
        "nested": [{"prompt_tokens": 3}],
        "metadata": {"user_id": "u"},
    }


# --- hand-off ------------------------------------------------------------------------------------------------------
def test_claim_ready_leases_and_expired_leases_are_reclaimed(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        ids = _seed(
            store,
            [("main", "ready"), ("main", "pending"), ("side", "skipped"), ("main", "ready"), ("main", "ready")],
        )
        ready = [ids[0], ids[3], ids[4]]
        first = store.claim_ready("judge", 2, lease_s=30, now=1000.0)
        assert [t.id for t in first] == ready[:2]
        assert first[0].prompt_tokens == [1, 2] and first[0].assistant_message["content"] == "yo"
        # Leased turns are skipped by the same consumer until the lease runs out; other consumers are independent.
        assert [t.id for t in store.claim_ready("judge", 10, lease_s=30, now=1010.0)] == [ready[2]]
        assert [t.id for t in store.claim_ready("audit", 10, lease_s=30, now=1010.0)] == ready
        assert store.claim_ready("judge", 10, lease_s=30, now=1029.0) == []
        assert store.complete("judge", ready[0], json.dumps({"score": 1}), reward=1.0, now=1020.0) is True
        # At 1031 the first two leases have expired; only the uncompleted one comes back.
        assert [t.id for t in store.claim_ready("judge", 10, lease_s=30, now=1031.0)] == [ready[1]]
        attempts = store._read("SELECT attempts FROM claims WHERE consumer='judge' AND turn_id=?", (ready[1],))
        assert attempts == [(2,)]


def test_complete_is_idempotent_and_first_result_wins(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        (turn_id,) = _seed(store, [("main", "ready")])
        store.claim_ready("judge", 1, lease_s=5, now=0.0)
        assert store.complete("judge", turn_id, '{"score": -1}', reward=-1.0) is True
        assert store.complete("judge", turn_id, '{"score": 1}', reward=1.0) is False
        assert store.result_of("judge", turn_id) == {"score": -1}
        assert store.get_turn(turn_id).reward == -1.0  # type: ignore[union-attr]
        assert store.claim_ready("judge", 5, lease_s=5, now=100.0) == []  # done turns are never handed out again
        assert store.result_of("trainer", turn_id) is None
        # Completing without a claim works (a consumer that crashed after its lease was taken over).
        assert store.complete("other", turn_id, "null") is True
        with pytest.raises(ValueError, match="JSON"):
            store.complete("judge", turn_id, "not json")
        with pytest.raises(KeyError):
            store.complete("judge", 999, "{}")


def test_claim_after_chains_consumers(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        a, b = _seed(store, [("main", "ready"), ("main", "ready")])
        assert store.claim_ready("trainer", 10, lease_s=5, after="judge", now=0.0) == []
        store.complete("judge", b, '{"score": 1}')
        assert [t.id for t in store.claim_ready("trainer", 10, lease_s=5, after="judge", now=0.0)] == [b]
        assert a != b


def test_hand_off_order_and_floor_with_late_and_out_of_order_turns(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        late, early = _seed(store, [("main", "pending"), ("main", "ready")])
        assert [t.id for t in store.claim_ready("judge", 10, lease_s=5, now=0.0)] == [early]
        store.complete("judge", early, "1", now=1.0)
        # The lower-id turn becomes ready only now (its session went on later): it must still be handed out.
        with store.transaction() as tx:
            tx.set_next_state(late, [{"role": "user", "content": "next"}], "user", now=2.0)
        assert [t.id for t in store.claim_ready("judge", 10, lease_s=5, now=3.0)] == [late]
        store.complete("judge", late, "1", now=4.0)
        c, d, e = _seed(store, [("main", "ready")] * 3)
        assert [t.id for t in store.claim_ready("judge", 10, lease_s=5, now=10.0)] == [c, d, e]
        store.complete("judge", e, "1", now=11.0)
        store.complete("judge", d, "1", now=11.0)

        def floor() -> int:
            return store._read("SELECT floor FROM consumer_floors WHERE consumer = 'judge'")[0][0]

        assert floor() == 2  # c (ready_seq 3) is still open, so the floor stays below it
        assert [t.id for t in store.claim_ready("judge", 10, lease_s=5, now=20.0)] == [c]  # lease expired
        store.complete("judge", c, "1", now=21.0)
        assert floor() == 5
        assert store.claim_ready("judge", 10, lease_s=5, now=100.0) == []


def test_steps_placeholder(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        store.record_step(1, 1, {"loss": 0.5}, now=5.0)
        assert store.steps() == [(1, 1, 5.0, {"loss": 0.5})]


def test_lesson_counts_by_status_feed_the_step_row(tmp_path: Path) -> None:
    from openclaw_cli.learn.step_metrics import store_counts

    with Store(tmp_path / "s.sqlite3") as store:
        assert store.lesson_counts() == {}
        assert store_counts(store)["lessons"] == {"active": 0, "candidate": 0, "retired": 0}
        for text, status in [("a", "active"), ("b", "active"), ("c", "candidate"), ("d", "rejected")]:
            store.add_lesson("local", text, status=status, origin="user", why="test")
        assert store.lesson_counts() == {"active": 2, "candidate": 1, "rejected": 1}
        assert store_counts(store)["lessons"] == {"active": 2, "candidate": 1, "retired": 0}


# --- crash safety --------------------------------------------------------------------------------------------------
_CHILD = textwrap.dedent(
    """
    import sys, time
    from openclaw_cli.capture import CapturedExchange
    from openclaw_cli.capture.sessions import SessionCapture
    from openclaw_cli.settings import Settings
    from openclaw_cli.store import Store

    store = Store(sys.argv[1])
    capture = SessionCapture(store, Settings())
    exchange = CapturedExchange(
        api="openai", headers={"x-session-id": "crash"}, request={"model": "m"},
        messages=[{"role": "user", "content": "hi"}], tools=None, model="m",
        prompt_tokens=[5, 6, 7], completion_tokens=[8, 9], logprobs=[-0.1, -0.2], sampling_logprobs=[],
        version=2, finish_reason="stop", assistant_message={"role": "assistant", "content": "yo"},
        response={}, started_at=0.0, first_token_at=0.0, finished_at=0.0,
    )
    turn = capture.record_sync(exchange)
    print(turn.turn_id, flush=True)
    time.sleep(60)  # killed here: no close, no checkpoint
    """
)


def test_a_returned_record_survives_a_killed_process(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        assert child.stdout is not None
        turn_id = int(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    with Store(path) as store:
        record = store.get_turn(turn_id)
        assert record is not None
        assert (record.session_id, record.prompt_tokens, record.completion_tokens) == ("crash", [5, 6, 7], [8, 9])
        assert record.logprobs == [-0.1, -0.2] and record.version == 2


def test_commits_are_checkpointed_in_the_background_and_close_stops_the_checkpointer(tmp_path: Path) -> None:
    import time

    path = tmp_path / "store.sqlite3"
    store = Store(path)
    with store.transaction() as tx:
        tx.create_session("s-1", scope="", id_source="inferred", now=1.0)
    # The main file alone (no -wal) holds the commit once the background checkpoint ran; the writer's own
    # autocheckpoint is far away for one small transaction.
    deadline = time.monotonic() + 10
    while True:
        copy = tmp_path / "main-file-only.sqlite3"
        copy.write_bytes(path.read_bytes())
        conn = sqlite3.connect(copy)
        try:
            stored = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
        finally:
            conn.close()
        if stored == 1:
            break
        assert time.monotonic() < deadline, "the commit never reached the main file"
        time.sleep(0.1)
    started = time.monotonic()
    store.close()
    assert time.monotonic() - started < 2
    checkpointer = store._checkpointer._thread
    assert checkpointer is not None and not checkpointer.is_alive()
