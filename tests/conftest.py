"""Shared fixtures. Everything is offline: the tiny model is built here, never downloaded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported where used: the vLLM venv has no tinker SDK
    from openclaw_cli.testing.tinker_double import TinkerDouble

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


@pytest.fixture(scope="session")
def learnable_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its (tied) embeddings scaled up, so LoRA can change what it says (see
    tests/e2e_scenario.py); shared by the e2e learning tests of every backend."""
    from e2e_scenario import make_learnable_model

    return make_learnable_model(tiny_model_dir, tmp_path_factory.mktemp("learnable-tiny") / "model")


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 with head_dim 64 (vLLM's attention kernels want a common head size; the CPU ones >= 32)."""
    from openclaw_cli.testing.tiny_model import build_tiny_model, build_tiny_tokenizer

    directory = tmp_path_factory.mktemp("vllm-tiny")
    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), hidden=256)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    tok.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory


@pytest.fixture
def make_proxy(tiny_tokenizer):
    """``make_proxy(*replies, settings=, backend=, sink=, token_delay_s=)``: the proxy over a FakeBackend that
    answers with ``replies`` in order, on a loopback port, capturing into a MemorySink unless given a sink; every
    server started is stopped after the test."""
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.settings import Settings
    from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink
    from openclaw_cli.testing.loopback_proxy import LoopbackProxy

    servers = []

    def make(*replies, settings=None, backend=None, sink=None, token_delay_s: float = 0.0) -> LoopbackProxy:
        backend = backend or FakeBackend(tiny_tokenizer, replies, token_delay_s=token_delay_s)
        sink = MemorySink() if sink is None else sink
        server = BackgroundServer(create_app(backend, sink, settings or Settings())).start()
        servers.append(server)
        return LoopbackProxy(backend, sink, server)

    yield make
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def tiny_tinker_double(tiny_model_dir: Path) -> Iterator[TinkerDouble]:
    """A Tinker service double on the tiny model, one per test module (a module resets what it needs between tests)."""
    from openclaw_cli.testing.tinker_double import TinkerDouble

    built = TinkerDouble(tiny_model_dir, lora_alpha=8)
    yield built
    built.close()
