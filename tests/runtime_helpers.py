"""Helpers the tests that start servers share: a free loopback port and the tiny model's runtime settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openclaw_cli.settings import LocalSettings, LoraSettings, Settings, StoreSettings
from openclaw_cli.testing.local_servers import free_port

__all__ = ["free_port", "runtime_settings"]


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
