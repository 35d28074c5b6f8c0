"""`openclaw launch`'s runtime in-process on the tiny model: serves on a free loopback port, stops cleanly on Ctrl-C
with a checkpoint, and refuses what `serve` refuses before loading anything."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

import httpx
import openai
import pytest
from runtime_helpers import runtime_settings

from openclaw_cli import launch as runtime_module
from openclaw_cli.launch import Runtime, launch
from openclaw_cli.proxy import ProxyConfigError
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store

pytestmark = pytest.mark.timeout(120)


async def test_serves_a_request_and_ctrl_c_stops_cleanly_with_a_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = runtime_settings(tiny_model_dir, tmp_path)
    ready: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(launch(settings, ui=False, on_ready=ready.set_result))
    runtime = await asyncio.wait_for(asyncio.shield(ready), timeout=60)
    assert runtime.url == f"http://127.0.0.1:{settings.port}"

    client = openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Hello!"}], max_tokens=3, seed=1
    )
    assert reply.choices[0].message.role == "assistant" and reply.usage is not None
    async with httpx.AsyncClient(base_url=runtime.url) as http:
        status = (await http.get("/v1/openclaw/status")).json()
    assert (status["policy_version"], status["requests_total"], status["captured"]) == (0, 1, 1)
    snapshot = await asyncio.to_thread(runtime.snapshot)
    assert (snapshot.requests_total, snapshot.sessions_open, snapshot.turns_pending) == (1, 1, 1)
    assert snapshot.backend_ok and snapshot.steps == 0

    os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C sends; the runtime owns the handler while it runs
    await asyncio.wait_for(task, timeout=30)
    assert task.exception() is None

    # Shutdown wrote a checkpoint (no step yet: the base state, so a restart resumes from it).
    assert (tmp_path / "ckpt" / "step-00000000" / "openclaw-state.json").is_file()
    with Store(settings.store.path) as store:
        (turn,) = list(store.iter_turns())
        assert turn.messages == [{"role": "user", "content": "Hello!"}] and turn.version == 0
    with socket.socket() as sock:  # the listener is gone (a relaunch binds like this; TIME_WAIT is fine)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", settings.port))
    # The handler is gone again: Python's own SIGINT handling is back.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def forbid_backend(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """Fail the test if launch creates its backend (``why`` it must not have)."""

    def must_not_load(settings: Settings) -> None:
        raise AssertionError(f"the backend was created {why}")

    monkeypatch.setattr(runtime_module, "create_backend", must_not_load)


async def test_refuses_a_public_bind_without_api_key_before_loading(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_backend(monkeypatch, "before the bind check")
    settings = runtime_settings(tiny_model_dir, tmp_path, host="0.0.0.0")
    with pytest.raises(ProxyConfigError, match="needs an API key"):
        await launch(settings, ui=False)


async def test_a_busy_port_fails_fast_with_a_clear_message(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forbid_backend(monkeypatch, "although the port is taken")
    settings = runtime_settings(tiny_model_dir, tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", settings.port))
        holder.listen()
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{settings.port}"):
            await launch(settings, ui=False)


def test_dashboard_shows_the_numbers_that_say_whether_it_learns() -> None:
    from rich.console import Console

    from openclaw_cli.dashboard import Snapshot, log_line, render, sparkline

    assert sparkline([-1.0, 0.0, 1.0, 0.5, -5.0]) == "▁▅█▇▁"  # 8 levels over [-1, 1], clamped
    snapshot = Snapshot(
        url="http://127.0.0.1:8400",
        backend="local",
        backend_ok=True,
        policy_version=3,
        requests_total=12,
        sessions_open=2,
        sessions_total=5,
        turns_ready=4,
        judged=9,
        trained=8,
        steps=2,
        batch_size=4,
        rewards=[-0.5, 0.25],
        last_loss=0.125,
        lessons_active=["Too wordy. Just give me the key fact."],
        lessons_by_status={"active": 1, "retired": 2},
    )
    assert log_line(snapshot) == (
        "version 3 step 2 | requests 12 (in flight 0) | sessions 2 open | turns ready 4, judged 9, trained 8 | "
        "reward +0.25 | lessons 1 active | backend ok"
    )
    console = Console(record=True, width=120)
    console.print(render(snapshot))
    text = console.export_text()
    assert "version 3, 2 step(s), method rl" in text
    assert "4 ready, 9 judged, 8 trained (batch 4)" in text
    assert "+0.25 (last 5 mean -0.12) ▃▆" in text
    assert "1 active, 2 retired" in text and "• Too wordy. Just give me the key fact." in text
    unhealthy = Snapshot(url="u", backend="local", backend_ok=False, policy_version=-1, errors=["trainer: boom"])
    assert log_line(unhealthy).endswith("backend UNHEALTHY")
    console = Console(record=True, width=120)
    console.print(render(unhealthy))
    text = console.export_text()
    assert "unhealthy" in text and "trainer: boom" in text


def test_dashboard_shows_the_vllm_servers_it_serves_from_and_why_one_is_out() -> None:
    from rich.console import Console

    from openclaw_cli.dashboard import Snapshot, log_line, render

    servers = [
        {"url": "http://gpu1:8000", "healthy": True, "in_flight": 3, "last_error": None},
        {"url": "http://gpu2:8000", "healthy": False, "in_flight": 0, "last_error": "not answering: refused"},
    ]
    snapshot = Snapshot(url="u", backend="local", backend_ok=True, policy_version=1, servers=servers)
    assert "| vLLM servers 1/2 up, 3 requests in flight | backend ok" in log_line(snapshot)
    console = Console(record=True, width=120)
    console.print(render(snapshot))
    text = console.export_text()
    assert "1/2 up, 3 requests in flight" in text and "• http://gpu2:8000 out: not answering: refused" in text
    assert "vLLM servers" not in log_line(Snapshot(url="u", backend="local", backend_ok=True, policy_version=1))
