"""store.retention_days: old turns (and sessions left empty) are deleted, turns under a live claim are kept, links
to purged turns are cut, and purged text is gone from the database files themselves."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from openclaw_cli.capture.retention import DAY_S, purge_expired, retention_cutoff, retention_loop
from openclaw_cli.launch import Runtime, launch
from openclaw_cli.settings import Settings
from openclaw_cli.store import MIGRATIONS, Store
from openclaw_cli.testing.fake_backend import FakeBackend
from openclaw_cli.testing.store_turns import new_turn

NOW = 1_000_000.0
CUTOFF = NOW - 10 * DAY_S
OLD, NEW = CUTOFF - 3600, CUTOFF + 3600


def _rows(store: Store, sql: str) -> list[tuple]:
    return store._read(sql)


def _session(store: Store, session_id: str, last_seen: float) -> None:
    with store.transaction() as tx:
        tx.create_session(session_id, scope=session_id, id_source="test", now=last_seen)


def _turn(store: Store, session_id: str, created_at: float, text: str, *, parent: int | None = None) -> int:
    with store.transaction() as tx:
        turn_id = tx.insert_turn(new_turn(session_id, user_text=text, created_at=created_at, parent_turn_id=parent))
        tx.add_prefix(session_id, f"h{turn_id}".encode(), turn_id)
        tx.touch_session(session_id, created_at, main_turn_id=turn_id)
    return turn_id


def _db_bytes(path: Path) -> bytes:
    return b"".join(Path(f"{path}{s}").read_bytes() for s in ("", "-wal") if Path(f"{path}{s}").exists())


def test_the_migration_indexes_every_foreign_key_to_a_turn(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        assert store.schema_version == len(MIGRATIONS)
        names = {row[0] for row in _rows(store, "SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"turns_parent", "claims_turn", "prefix_index_turn"} <= names
        plan = " ".join(str(r) for r in _rows(store, "EXPLAIN QUERY PLAN SELECT 1 FROM claims WHERE turn_id = 1"))
        assert "claims_turn" in plan


def test_purge_deletes_old_turns_and_keeps_claimed_and_recent_ones(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = Store(path)
    _session(store, "gone", OLD)
    gone_a = _turn(store, "gone", OLD - 100, "PURGED-MARKER-first")
    gone_b = _turn(store, "gone", OLD, "PURGED-MARKER-second")
    _session(store, "mixed", OLD)
    mixed_old = _turn(store, "mixed", OLD, "PURGED-MARKER-third")
    mixed_new = _turn(store, "mixed", NEW, "KEPT-MARKER-recent", parent=mixed_old)
    _session(store, "claimed", OLD)
    leased = _turn(store, "claimed", OLD, "KEPT-MARKER-leased")
    expired = _turn(store, "claimed", OLD, "PURGED-MARKER-expired-lease")
    done = _turn(store, "claimed", OLD, "PURGED-MARKER-judged")
    with store.transaction():
        store._conn.executemany(
            "INSERT INTO claims (consumer, turn_id, lease_until, attempts, done_at, result) VALUES (?, ?, ?, 1, ?, ?)",
            [
                ("trainer", leased, NOW + 60, None, None),  # a trainer is working on it right now
                ("judge", expired, NOW - 60, None, None),  # its claimer died; the lease ran out
                ("judge", done, None, NOW - 100, '{"score": 1}'),
            ],
        )
    store.complete("judge", leased, '{"score": 1}', now=NOW - 50)  # judged, now held by the trainer

    result = store.purge_older_than(CUTOFF, now=NOW)

    assert (result.turns, result.sessions) == (5, 1)
    kept = {row[0] for row in _rows(store, "SELECT id FROM turns")}
    assert kept == {mixed_new, leased}
    assert {row[0] for row in _rows(store, "SELECT turn_id FROM turn_data")} == kept
    assert {row[0] for row in _rows(store, "SELECT turn_id FROM prefix_index")} == kept
    assert _rows(store, "SELECT consumer, turn_id FROM claims ORDER BY consumer") == [
        ("judge", leased),
        ("trainer", leased),
    ]
    assert {s.id for s in store.sessions()} == {"mixed", "claimed"}
    recent = store.get_turn(mixed_new)
    assert (
        recent is not None and recent.parent_turn_id is None and recent.messages[0]["content"] == "KEPT-MARKER-recent"
    )
    claimed = store.get_session("claimed")
    assert claimed is not None and claimed.tail_turn_id is None  # its tail (the judged turn) was purged
    assert store.get_turn(gone_a) is None and store.get_turn(gone_b) is None

    # A second purge with nothing left to do changes nothing.
    again = store.purge_older_than(CUTOFF, now=NOW)
    assert (again.turns, again.sessions) == (0, 0)
    store.close()
    raw = _db_bytes(path)
    assert b"PURGED-MARKER" not in raw  # overwritten (secure_delete), and the WAL was truncated
    assert b"KEPT-MARKER-recent" in raw and b"KEPT-MARKER-leased" in raw


def test_a_claim_whose_lease_ran_out_does_not_protect_its_turn(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    _session(store, "s", OLD)
    turn_id = _turn(store, "s", OLD, "x")
    claimed = store.claim_ready("judge", 5, lease_s=30, now=NOW)
    assert [t.id for t in claimed] == [turn_id]
    assert store.purge_older_than(CUTOFF, now=NOW + 10).turns == 0  # lease still live
    assert store.purge_older_than(CUTOFF, now=NOW + 31).turns == 1
    store.close()


def test_large_purges_run_in_batches(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    _session(store, "s", OLD)
    with store.transaction() as tx:
        for i in range(1203):
            tx.insert_turn(new_turn("s", user_text=f"t{i}", created_at=OLD - i))
        tx.insert_turn(new_turn("s", user_text="recent", created_at=NEW))
    transactions = 0
    real = store.transaction

    def counting():
        nonlocal transactions
        transactions += 1
        return real()

    store.transaction = counting  # type: ignore[method-assign]
    result = store.purge_older_than(CUTOFF, now=NOW, batch=500)
    assert (result.turns, result.sessions) == (1203, 0)
    assert transactions == 3 + 1  # three batches of turns (500 + 500 + 203), then the sessions
    assert [t.messages[0]["content"] for t in store.iter_turns()] == ["recent"]
    store.close()


def test_purge_expired_follows_the_setting(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    _session(store, "s", NOW)
    _turn(store, "s", NOW - 2 * DAY_S, "two days old")
    _turn(store, "s", NOW - 3600, "an hour old")
    assert purge_expired(store, Settings(), now=NOW) is None
    assert retention_cutoff(Settings(), NOW) is None
    settings = Settings(store={"retention_days": 1})
    assert retention_cutoff(settings, NOW) == NOW - DAY_S
    result = purge_expired(store, settings, now=NOW)
    assert result is not None and result.turns == 1
    assert [t.messages[0]["content"] for t in store.iter_turns()] == ["an hour old"]
    store.close()


async def test_the_loop_purges_at_start_and_stops_when_told(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite3")
    _session(store, "s", 100.0)
    _turn(store, "s", 100.0, "ancient")  # 1970: far older than any retention
    stop = asyncio.Event()
    task = asyncio.create_task(retention_loop(store, Settings(store={"retention_days": 30}), stop, every_s=3600))
    for _ in range(200):
        if not list(store.iter_turns()):
            break
        await asyncio.sleep(0.01)
    assert list(store.iter_turns()) == []
    assert not task.done()  # waiting for the next round
    stop.set()
    await asyncio.wait_for(task, 5)
    await asyncio.wait_for(retention_loop(store, Settings(), asyncio.Event()), 1)  # off: returns at once
    store.close()


@pytest.mark.parametrize("days", [0, -1])
def test_retention_days_must_be_positive(days: int) -> None:
    with pytest.raises(ValueError):
        Settings(store={"retention_days": days})


async def test_launch_purges_at_start_while_it_serves(tmp_path: Path, tiny_tokenizer) -> None:
    """`openclaw launch` wiring: an expired turn in the store is gone soon after start-up, without a request."""
    path = tmp_path / "store.sqlite3"
    with Store(path) as seed:
        _session(seed, "s", 100.0)
        _turn(seed, "s", 100.0, "ancient")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(port=port, store={"path": path, "retention_days": 30}, local={"state_dir": tmp_path / "ckpt"})
    stop = asyncio.Event()
    remaining: list[int] = []

    async def on_ready(runtime: Runtime) -> None:
        for _ in range(500):
            remaining[:] = [t.id for t in runtime.store.iter_turns()]
            if not remaining:
                break
            await asyncio.sleep(0.01)
        stop.set()

    class NoJudge:
        name = "unused"

        async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
            raise AssertionError("nothing should be judged")

    backend = FakeBackend(tiny_tokenizer)
    await asyncio.wait_for(
        launch(settings, ui=False, stop=stop, judge_client=NoJudge(), on_ready=on_ready, backend=backend), 60
    )
    assert remaining == []
