"""Helpers the tests that start servers share: a free loopback port, the tiny model's runtime settings and a poll
for what a server does after it answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.settings import LocalSettings, LoraSettings, Settings, StoreSettings
from openclaw_cli.testing.fake_backend import MemorySink
from openclaw_cli.testing.local_servers import free_port

__all__ = ["became_true", "free_port", "launched", "local_proxy_server", "runtime_settings"]


def runtime_settings(model_dir: Path, tmp_path: Path, **overrides: Any) -> Settings:
    """`openclaw launch`'s settings for the tiny model: a small LoRA, the store and checkpoints under ``tmp_path``,
    two concurrent requests, any model name accepted; ``overrides`` are further Settings fields."""
    return Settings(
        model=str(model_dir),
        port=free_port(),
        lora=LoraSettings(rank=4, alpha=8),
        store=StoreSettings(path=tmp_path / "store.sqlite3"),
        local=LocalSettings(state_dir=tmp_path / "ckpt", max_concurrent_requests=2),
        proxy={"accept_any_model": True},
        **overrides,
    )


@asynccontextmanager
async def launched(settings: Settings, **options: Any) -> AsyncIterator[Any]:
    """`openclaw launch`'s runtime on ``settings`` (``options``: launch's keywords, e.g. ``judge_client``,
    ``backend``), once it serves; stopped, and awaited, when the block ends."""
    from openclaw_cli.launch import launch

    stop = asyncio.Event()
    ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(launch(settings, ui=False, stop=stop, on_ready=ready.set_result, **options))
    try:
        yield await asyncio.wait_for(asyncio.shield(ready), timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)


def became_true(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Whether ``condition`` holds within ``timeout_s`` (polled; for what a server thread does after answering)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@contextmanager
def local_proxy_server(settings: Settings) -> Iterator[tuple[Any, MemorySink, BackgroundServer]]:
    """The local backend on ``settings`` behind the proxy on 127.0.0.1, capturing into memory: (backend, sink,
    server); both stop when the block ends."""
    from openclaw_cli.backends.local import LocalBackend

    backend = LocalBackend(settings)
    asyncio.run(backend.start())
    sink = MemorySink()
    server = BackgroundServer(create_app(backend, sink, settings)).start()
    try:
        yield backend, sink, server
    finally:
        server.stop()
        asyncio.run(backend.close())
