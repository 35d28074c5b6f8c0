"""LocalBackend end to end on the tiny model: on-policy logprobs, publish, streaming, checkpoints, diagnose."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from backend_helpers import running
from backend_helpers import user_prompt as prompt_of

from openclaw_cli.backend import Backend, BackendError, load_backend_class
from openclaw_cli.backends.local import LocalBackend, choose_sampler
from openclaw_cli.settings import LocalSettings, LoraSettings, Settings
from openclaw_cli.types import AdamParams, SampleResult, SamplingParams, TokenChunk, datum_from_completion

ADAM = AdamParams(learning_rate=0.05, beta2=0.99)


def make_settings(model_dir: Path, state_dir: Path, **local_overrides: object) -> Settings:
    return Settings(
        model=str(model_dir),
        lora=LoraSettings(rank=4, alpha=8),
        local=LocalSettings(state_dir=state_dir, keep_versions=2, max_concurrent_requests=2, **local_overrides),
    )


@pytest.fixture
async def backend(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[LocalBackend]:
    async with running(LocalBackend(make_settings(tiny_model_dir, tmp_path / "ckpt"))) as started:
        yield started


async def train_one_step(
    backend: LocalBackend, prompt: list[int], result: SampleResult, advantage: float
) -> list[float]:
    """One importance-sampling step on a sampled completion; returns the learner's completion logprobs."""
    datum = datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=advantage)
    out = await backend.forward_backward([datum], "importance_sampling")
    await backend.optim_step(ADAM)
    return out.logprobs[0][len(prompt) - 1 :]


def max_abs_diff(xs: list[float], ys: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(xs, ys, strict=True))


def test_registered_under_the_entry_point_and_satisfies_the_protocol(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert load_backend_class("local") is LocalBackend
    assert isinstance(LocalBackend(make_settings(tiny_model_dir, tmp_path)), Backend)


async def test_unstarted_backend_says_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    backend = LocalBackend(make_settings(tiny_model_dir, tmp_path))
    with pytest.raises(BackendError, match=r"not started; call start\(\) first"):
        await backend.sample([1, 2], SamplingParams(max_tokens=1))
    with pytest.raises(BackendError, match="not started"):
        backend.current_version()


async def test_sampler_logprobs_are_the_trainers_before_and_after_a_publish(backend: LocalBackend) -> None:
    prompt = prompt_of(backend)
    assert backend.sampler_kind == "transformers"
    assert backend.current_version().version == 0

    first = await backend.sample(prompt, SamplingParams(max_tokens=16, seed=1))
    learner = await train_one_step(backend, prompt, first, advantage=1.0)
    # The untrained learner is the base policy: importance ratios are exactly on-policy.
    assert first.version == 0 and max_abs_diff(learner, first.logprobs) < 1e-4

    info = await backend.publish("after-one-step")
    assert (info.version, info.name) == (1, "after-one-step")
    assert backend.current_version() == info

    second = await backend.sample(prompt, SamplingParams(max_tokens=16, seed=2))
    assert second.version == 1
    datum = datum_from_completion(prompt, second.tokens, logprobs=second.logprobs, advantages=1.0)
    out = await backend.forward_backward([datum], "importance_sampling")
    assert max_abs_diff(out.logprobs[0][len(prompt) - 1 :], second.logprobs) < 1e-4
    assert out.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)

    # Teacher scores: the policy's match the sampler, the frozen base's differ after training.
    policy = await backend.compute_logprobs(prompt + second.tokens)
    base = await backend.compute_logprobs(prompt + second.tokens, base=True)
    assert policy[0] is None and base[0] is None
    assert max_abs_diff(policy[len(prompt) :], second.logprobs) < 1e-4
    assert max_abs_diff(base[len(prompt) :], policy[len(prompt) :]) > 1e-3

    # The base stays servable by pinning version 0.
    pinned = await backend.sample(prompt, SamplingParams(max_tokens=8, seed=3), version=0)
    assert pinned.version == 0
    base_scores = await backend.compute_logprobs(prompt + pinned.tokens, base=True)
    assert max_abs_diff(base_scores[len(prompt) :], pinned.logprobs) < 1e-4


async def test_a_stream_finishes_on_its_version_while_training_publishes(backend: LocalBackend) -> None:
    prompt = prompt_of(backend)
    warmup = await backend.sample(prompt, SamplingParams(max_tokens=8, seed=4))
    await train_one_step(backend, prompt, warmup, advantage=1.0)
    v1 = await backend.publish()

    chunks: list[TokenChunk] = []
    result: SampleResult | None = None
    # Slow the served model down (the trainer's copy of the module tree is unaffected) so the publish lands
    # while tokens are still being computed.
    hook = backend._loaded.model.register_forward_pre_hook(lambda *_: time.sleep(0.02))
    try:
        async for event in backend.stream(prompt, SamplingParams(max_tokens=40, seed=5)):
            if isinstance(event, TokenChunk):
                chunks.append(event)
                if len(chunks) == 1:
                    await train_one_step(backend, prompt, warmup, advantage=-1.0)
                    v2 = await backend.publish()
            else:
                result = event
    finally:
        hook.remove()
    assert result is not None and result.version == v1.version
    assert v2.created_at < result.finished_at and len(result.tokens) == 40
    assert {c.version for c in chunks} == {v1.version}
    assert "".join(c.text for c in chunks) == result.text
    assert v2.version == v1.version + 1 == backend.current_version().version
    after = await backend.sample(prompt, SamplingParams(max_tokens=2, seed=5))
    assert after.version == v2.version


async def test_save_and_load_state_restore_version_and_samples(
    backend: LocalBackend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prompt = prompt_of(backend, "Hello!")
    sampled = await backend.sample(prompt, SamplingParams(max_tokens=10, seed=6))
    await train_one_step(backend, prompt, sampled, advantage=1.0)
    await backend.publish()
    await train_one_step(backend, prompt, sampled, advantage=1.0)
    published = await backend.publish("two-steps")

    path = await backend.save_state("step-2")
    assert Path(path) == (tmp_path / "ckpt" / "step-2").resolve()
    state = json.loads((Path(path) / "openclaw-state.json").read_text())
    assert (state["version"], state["weights_are_version"], state["trainer_step"]) == (2, True, 2)

    params = SamplingParams(max_tokens=12, temperature=0)
    before = await backend.sample(prompt, params)

    restored = LocalBackend(make_settings(tiny_model_dir, tmp_path / "other"))
    await restored.start()
    try:
        info = await restored.load_state(path)
        assert (info.version, info.name) == (published.version, "two-steps")
        assert restored.current_version().version == published.version
        after = await restored.sample(prompt, params)
        assert after.version == published.version
        assert after.tokens == before.tokens
        assert after.logprobs == pytest.approx(before.logprobs, abs=1e-5)
        # The optimizer state came back too: the same next step gives the same next policy on both.
        await train_one_step(backend, prompt, sampled, advantage=1.0)
        await train_one_step(restored, prompt, sampled, advantage=1.0)
        nxt_a, nxt_b = await backend.publish(), await restored.publish()
        assert nxt_a.version == nxt_b.version == published.version + 1
        scores_a = await backend.compute_logprobs(prompt + sampled.tokens)
        scores_b = await restored.compute_logprobs(prompt + sampled.tokens)
        assert max_abs_diff(scores_a[1:], scores_b[1:]) < 1e-5
    finally:
        await restored.close()


async def test_unpublished_training_is_restored_under_a_new_version(backend: LocalBackend) -> None:
    prompt = prompt_of(backend)
    sampled = await backend.sample(prompt, SamplingParams(max_tokens=6, seed=7))
    await train_one_step(backend, prompt, sampled, advantage=1.0)
    await backend.publish()
    await train_one_step(backend, prompt, sampled, advantage=1.0)  # not published: weights differ from v1
    path = await backend.save_state("dirty")
    info = await backend.load_state(path)
    assert info.version == 2 and backend.current_version().version == 2


async def test_checkpoint_names_and_paths_are_checked(backend: LocalBackend, tmp_path: Path) -> None:
    for bad in ("../escape", "a/b", "", ".hidden"):
        with pytest.raises(BackendError, match="checkpoint name"):
            await backend.save_state(bad)
    with pytest.raises(BackendError, match="not a local-backend checkpoint"):
        await backend.load_state(str(tmp_path))


def test_sampler_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    import openclaw_cli.backends.local.vllm_sampler as vllm_sampler

    monkeypatch.setattr(vllm_sampler, "vllm_available", lambda: (False, "vllm is not installed"))
    assert choose_sampler("auto") == "transformers"
    assert choose_sampler("transformers") == "transformers"
    with pytest.raises(BackendError, match=r"local\.sampler is 'vllm' but vllm is not installed"):
        choose_sampler("vllm")
    monkeypatch.setattr(vllm_sampler, "vllm_available", lambda: (True, "ok"))
    assert choose_sampler("auto") == "vllm"
    assert choose_sampler("transformers") == "transformers"


def test_diagnose_reports_without_loading_the_model(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openclaw_cli.backends.local.model_loading as model_loading

    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("diagnose must not load the model")

    monkeypatch.setattr(model_loading, "load_model", forbidden)
    checks = {c.name: c for c in LocalBackend.diagnose(make_settings(tiny_model_dir, tmp_path))}
    import peft
    import torch
    import transformers

    assert checks["torch importable"].ok and checks["torch importable"].detail == torch.__version__
    assert checks["transformers importable"].detail == transformers.__version__
    assert checks["peft importable"].detail == peft.__version__
    assert checks["device"].ok and checks["device"].detail.split()[0] in ("cpu", "cuda")
    assert checks["model"].ok and str(tiny_model_dir) in checks["model"].detail
    assert checks["sampler"].ok

    missing = {c.name: c for c in LocalBackend.diagnose(Settings(model=str(tmp_path / "nope")))}
    assert not missing["model"].ok and "not found" in missing["model"].detail


async def test_training_passes_tell_decoding_to_leave_them_cores(backend: LocalBackend) -> None:
    """Decode steps take every core unless a training or scoring pass runs (cpu_threads.OtherWork)."""
    sampler = backend._require_sampler()
    trainer = backend._require_trainer()
    seen: list[bool] = []
    real_forward_backward, real_optim_step = trainer.forward_backward, trainer.optim_step

    def forward_backward(*args: object) -> object:
        seen.append(sampler.other_work.busy)
        return real_forward_backward(*args)

    def optim_step(*args: object) -> object:
        seen.append(sampler.other_work.busy)
        return real_optim_step(*args)

    trainer.forward_backward, trainer.optim_step = forward_backward, optim_step  # type: ignore[method-assign]
    assert not sampler.other_work.busy
    prompt = backend.tokenizer().render([{"role": "user", "content": "hi"}])
    result = await backend.sample(prompt, SamplingParams(max_tokens=4, seed=0))
    await train_one_step(backend, prompt, result, 1.0)
    assert seen == [True, True] and not sampler.other_work.busy
    # A scoring pass marks itself too, and unmarks when done.
    await backend.compute_logprobs(prompt + result.tokens, start=len(prompt))
    assert not sampler.other_work.busy
