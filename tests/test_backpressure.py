"""Backpressure: a slow or locked store never holds a reply beyond proxy.capture_timeout_s, late writes still land
(in order), a full capture backlog drops and counts instead of growing, status keeps answering while the store is
locked, and the loops' backlog (to judge, judged not trained, oldest ages) shows in /v1/openclaw/status and
`openclaw status`."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from runtime_helpers import free_port
from typer.testing import CliRunner

from openclaw_cli.capture import CapturedExchange, RecordedTurn
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.cli import app as cli_app
from openclaw_cli.launch import Runtime, launch
from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.settings import JudgeSettings, LocalSettings, Settings, StoreSettings, TrainSettings
from openclaw_cli.store import Store
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink
from openclaw_cli.testing.fake_training import FakeTrainingBackend

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"


def chat(url: str, text: str, **headers: str) -> httpx.Response:
    body = {"model": "openclaw", "messages": [{"role": "user", "content": text}]}
    return httpx.post(url + CHAT, json=body, headers=headers, timeout=30)


def status(url: str) -> dict[str, Any]:
    return httpx.get(url + "/v1/openclaw/status", timeout=30).json()


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


class GatedSink(MemorySink):
    """A sink whose writes wait until ``gate`` opens: a store that has stalled."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    async def record(self, exchange: CapturedExchange) -> RecordedTurn:
        await asyncio.to_thread(self.gate.wait)
        return await super().record(exchange)


def test_stalled_sink_defers_then_drops_but_every_reply_is_served_in_time(tiny_tokenizer: Any) -> None:
    sink = GatedSink()
    settings = Settings(proxy={"capture_timeout_s": 0.3, "capture_max_backlog": 2})
    backend = FakeBackend(tiny_tokenizer, ["first", "second", "third"])
    with BackgroundServer(create_app(backend, sink, settings)) as server:
        for text, expected in (("a", "first"), ("b", "second"), ("c", "third")):
            started = time.monotonic()
            reply = chat(server.base_url, text)
            assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == expected
            assert time.monotonic() - started < 2.0  # bounded by capture_timeout_s, not by the stalled store
        capture = status(server.base_url)["capture"]
        # Two writes wait (the backlog bound); the third was served but dropped, and says so.
        assert (capture["deferred"], capture["dropped"], capture["recorded"]) == (2, 1, 0)
        assert (capture["queue_depth"], capture["queue_max"], capture["queue_peak"]) == (2, 2, 2)
        assert capture["oldest_wait_s"] > 0.2
        sink.gate.set()  # the store comes back: the deferred writes land, in arrival order
        wait_for(lambda: status(server.base_url)["capture"]["recorded"] == 2)
        capture = status(server.base_url)["capture"]
        assert (capture["queue_depth"], capture["failed"], capture["oldest_wait_s"]) == (0, 0, 0.0)
    assert sorted(e.messages[0]["content"] for e in sink.exchanges) == ["a", "b"]


def test_a_locked_store_delays_neither_replies_nor_status_and_loses_nothing(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    store = Store(tmp_path / "store.sqlite3")
    settings = Settings(proxy={"capture_timeout_s": 0.3})
    sink = SessionCapture(store, settings)
    backend = FakeBackend(tiny_tokenizer, ["stored late", "second"])
    # Another process (an export, a backup) holds the write lock: our writer waits on SQLite's busy timeout.
    blocker = sqlite3.connect(tmp_path / "store.sqlite3", isolation_level=None)
    try:
        with BackgroundServer(create_app(backend, sink, settings)) as server:
            blocker.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            reply = chat(server.base_url, "hello", **{"x-session-id": "locked"})
            assert reply.status_code == 200 and time.monotonic() - started < 2.0
            # The conversation goes on while its first turn is still unwritten: the second turn must land after it
            # (pairing needs the first turn stored when the second is placed).
            history = [
                {"role": "user", "content": "hello"},
                reply.json()["choices"][0]["message"],
                {"role": "user", "content": "and then?"},
            ]
            body = {"model": "openclaw", "messages": history}
            second = httpx.post(server.base_url + CHAT, json=body, headers={"x-session-id": "locked"}, timeout=30)
            assert second.status_code == 200
            started = time.monotonic()
            body = status(server.base_url)
            assert time.monotonic() - started < 4.0  # the store read gives up after 2 s instead of blocking serving
            assert "error" in body["sink"] and body["capture"]["deferred"] == 2
            assert httpx.get(server.base_url + "/healthz", timeout=5).status_code == 200
            blocker.execute("ROLLBACK")  # the lock goes away well within the 10 s busy timeout
            wait_for(lambda: status(server.base_url)["capture"]["recorded"] == 2)
            assert status(server.base_url)["sink"]["turns"]["total"] == 2
        first, then = store.iter_turns()
        assert first.session_id == then.session_id == "locked" and first.assistant_message["content"] == "stored late"
        assert (first.turn_index, then.turn_index, then.parent_turn_id) == (0, 1, first.id)
        assert first.status == "ready" and first.next_state == [{"role": "user", "content": "and then?"}]
    finally:
        blocker.close()
        store.close()


class BlockedJudge:
    """A JudgeClient that answers only once ``gate`` is set (a slow judge), then votes +1."""

    name = "blocked-judge"

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        await self.gate.wait()
        return "\\boxed{1}"


async def test_loop_backlog_shows_in_status_and_the_cli_while_the_judge_lags(
    tiny_tokenizer: Any, tmp_path: Path
) -> None:
    settings = Settings(
        port=free_port(),
        method="rl",  # the blocked judge's votes are the signal
        judge=JudgeSettings(votes=1),
        train=TrainSettings(batch_size=3, checkpoint_every=1000),
        store=StoreSettings(path=tmp_path / "store.sqlite3"),
        local=LocalSettings(state_dir=tmp_path / "ckpt"),
        proxy={"accept_any_model": True, "expire_every_s": 3600},
    )
    backend = FakeTrainingBackend(tiny_tokenizer, state_dir=tmp_path / "ckpt", default_reply="fine")
    judge = BlockedJudge()
    stop = asyncio.Event()
    ready: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        launch(settings, ui=False, stop=stop, judge_client=judge, backend=backend, on_ready=ready.set_result)
    )
    runtime = await asyncio.wait_for(asyncio.shield(ready), timeout=30)
    try:
        async with httpx.AsyncClient(base_url=runtime.url, timeout=30) as http:
            for i in range(4):  # four two-turn sessions: each first turn is ready (with a next state to judge)
                messages = [{"role": "user", "content": f"question {i}"}]
                for follow_up in ("thanks", None):
                    body = {"model": "m", "messages": messages}
                    reply = await http.post(CHAT, json=body, headers={"x-session-id": f"s{i}"})
                    assert reply.status_code == 200
                    if follow_up:
                        messages = [*messages, reply.json()["choices"][0]["message"], {"role": "user", "content": "ok"}]
            await asyncio.sleep(0.3)
            loops = (await http.get("/v1/openclaw/status")).json()["loops"]
            backlog = loops["backlog"]
            assert (backlog["to_judge"], backlog["judged_not_trained"], backlog["batch_size"]) == (4, 0, 3)
            assert backlog["oldest_to_judge_age_s"] >= 0.25 and backlog["oldest_pending_age_s"] >= 0.25
            assert backlog["oldest_judged_not_trained_age_s"] is None
            assert loops["trainer"]["steps"] == 0 and loops["promotion"]["enabled"] is False

            # The human `openclaw status` shows the same numbers (flattened keys).
            result = await asyncio.to_thread(
                CliRunner().invoke, cli_app, ["status", "--port", str(settings.port), "--set", "store.path=unused"]
            )
            assert result.exit_code == 0, result.output
            assert "loops.backlog.to_judge" in result.output and "capture.queue_depth" in result.output

            judge.gate.set()  # the judge catches up: three turns make a batch, one stays judged-not-trained
            deadline = time.monotonic() + 20
            while runtime.trainer.stats.steps < 1:
                assert time.monotonic() < deadline, (runtime.trainer.stats, runtime.judge.stats)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)
            backlog = (await http.get("/v1/openclaw/status")).json()["loops"]["backlog"]
            assert (backlog["to_judge"], backlog["judged_not_trained"]) == (0, 1)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
    assert json.loads(json.dumps(backlog))  # JSON-clean
