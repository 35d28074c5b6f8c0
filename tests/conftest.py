"""Shared fixtures. Everything is offline: the tiny model is built here, never downloaded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Belt and braces: no test may reach a model hub, even if a developer runs pytest outside `make test`.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Qwen3 + byte-level BPE with a tool-aware chat template, saved as an HF-style local path."""
    from openclaw_cli.testing.tiny_model import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-model") / "tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from openclaw_cli.tokenizer import HFChatTokenizer

    return HFChatTokenizer.from_pretrained(tiny_model_dir)
