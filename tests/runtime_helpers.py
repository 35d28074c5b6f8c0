"""Helpers the tests that start servers share: a free loopback port, the tiny model's runtime settings and a poll
for what a server does after it answered."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from openclaw_cli.settings import LocalSettings, LoraSettings, Settings, StoreSettings
from openclaw_cli.testing.local_servers import free_port

__all__ = ["became_true", "free_port", "runtime_settings"]


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


def became_true(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Whether ``condition`` holds within ``timeout_s`` (polled; for what a server thread does after answering)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()
