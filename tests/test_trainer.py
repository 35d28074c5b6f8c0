"""LoraTrainer on the tiny offline Qwen3: logprobs, learning direction, accumulation, hand-off, checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from openclaw_cli.backends.local.trainer import TRAINER_STATE_FILE, LoraTrainer
from openclaw_cli.settings import LoraSettings
from openclaw_cli.types import AdamParams, Datum, datum_from_completion

LORA = LoraSettings(rank=4, alpha=8, dropout=0.0)
ADAM = AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)
PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
PARTS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")

# PEFT 0.21 calls a transformers API that transformers 5 deprecates; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tiny model's matmuls are too small to split: on a shared 2-core box, torch's intra-op threads spin-wait
    on each other and a 20 ms step takes seconds. Restored afterwards, so no other test module is affected."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def base_model(tiny_model_dir: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.eval()
    return model


def _datums(n: int = 4, seed: int = 0, advantage: float | None = 1.0) -> list[Datum]:
    """Prompt/completion pairs of different lengths with sampler logprobs -1 and alternating-sign advantages."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(10, 400, (3 + i,), generator=gen).tolist()
        completion = torch.randint(10, 400, (2 + 2 * i,), generator=gen).tolist()
        adv = None if advantage is None else advantage * (1 if i % 2 == 0 else -1)
        out.append(datum_from_completion(prompt, completion, logprobs=[-1.0] * len(completion), advantages=adv))
    return out


def _base_logprobs(model: nn.Module, datum: Datum) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([datum.model_input])).logits[0].float()
    targets = torch.tensor(datum.loss_fn_inputs["target_tokens"], dtype=torch.long)
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


def _lora_grads(trainer: LoraTrainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.peft_model.named_parameters() if p.grad is not None}


def _completion_logprob(trainer: LoraTrainer, datum: Datum) -> float:
    """Sum of the learner's logprobs over the completion (weight > 0 positions)."""
    result = trainer.forward_backward([datum], "cross_entropy")
    weights = datum.loss_fn_inputs["weights"]
    return sum(lp for lp, w in zip(result.logprobs[0], weights, strict=True) if w > 0)


def test_untrained_trainer_matches_base_model_logprobs(base_model: nn.Module) -> None:
    trainer = LoraTrainer(base_model, LORA)
    datums = _datums(3)  # different lengths: exercises right padding + attention mask
    result = trainer.forward_backward(datums, "cross_entropy")
    expected_loss = 0.0
    for datum, got in zip(datums, result.logprobs, strict=True):
        want = _base_logprobs(base_model, datum)
        assert len(got) == len(datum.model_input)
        assert torch.allclose(torch.tensor(got), want, atol=1e-5)
        expected_loss -= float((want * torch.tensor(datum.loss_fn_inputs["weights"])).sum())
    assert result.loss == pytest.approx(expected_loss, rel=1e-5)
    completion_tokens = sum(int(w > 0) for d in datums for w in d.loss_fn_inputs["weights"])
    assert result.metrics["n_tokens"] == completion_tokens


def test_making_the_trainer_prints_no_library_deprecation_warning(base_model: nn.Module) -> None:
    """PEFT's FutureWarning about transformers' own `is_gradient_checkpointing` stays out of the launch log."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LoraTrainer(base_model, LORA)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


def test_base_model_tree_is_untouched_and_weights_are_shared(base_model: nn.Module) -> None:
    rng_before = torch.get_rng_state()
    trainer = LoraTrainer(base_model, LoraSettings(rank=4, alpha=8, dropout=0.2))
    trainer.forward_backward(_datums(2), "ppo")
    assert torch.equal(torch.get_rng_state(), rng_before)  # init and dropout use private generators

    assert type(base_model.get_submodule("model.layers.0.self_attn.q_proj")) is nn.Linear
    assert not any("lora" in name for name, _ in base_model.named_modules())
    assert not any(p.requires_grad for p in base_model.parameters())
    base_ptrs = {p.data_ptr() for p in base_model.parameters()}
    trainable = [p for p in trainer.peft_model.parameters() if p.requires_grad]
    frozen = [p for p in trainer.peft_model.parameters() if not p.requires_grad]
    assert {p.data_ptr() for p in frozen} == base_ptrs  # no second copy of the base weights
    base_buffers = {b.data_ptr() for b in base_model.buffers()}
    assert base_buffers and base_buffers == {b.data_ptr() for b in trainer.peft_model.buffers()}
    assert len(trainable) == 2 * len(PARTS) * 2  # A and B for 7 projections x 2 layers
    assert sorted(trainer.target_modules) == sorted(LoraSettings().targets)


def test_targets_are_intersected_with_linear_layers(base_model: nn.Module) -> None:
    trainer = LoraTrainer(base_model, LoraSettings(rank=2, alpha=2, targets=["q_proj", "not_a_layer"]))
    assert trainer.target_modules == ["q_proj"]
    assert sorted(trainer.lora_weights()) == ["model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj"]
    with pytest.raises(ValueError, match=r"none of the LoRA targets.*q_proj"):
        LoraTrainer(base_model, LoraSettings(targets=["attn_c", "nope"]))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ppo_steps_move_completion_logprob_with_advantage_sign(base_model: nn.Module, sign: float) -> None:
    trainer = LoraTrainer(base_model, LORA)
    prompt, completion = [12, 40, 77, 150], [201, 33, 90, 305, 18]
    probe = datum_from_completion(prompt, completion)
    before = _completion_logprob(trainer, probe)
    sampler = trainer.forward_backward([probe], "cross_entropy").logprobs[0][len(prompt) - 1 :]
    for _ in range(4):
        datum = datum_from_completion(prompt, completion, logprobs=sampler, advantages=sign)
        result = trainer.forward_backward([datum], "ppo", {"eps_low": 0.2, "eps_high": 0.28})
        trainer.optim_step(ADAM)
        sampler = result.logprobs[0][len(prompt) - 1 :]  # next step's "old policy": one step stale
    after = _completion_logprob(trainer, probe)
    assert trainer.step == 4
    assert sign * (after - before) > 0.5, (before, after)


def test_gradients_accumulate_across_calls_and_micro_batches(base_model: nn.Module) -> None:
    datums = _datums(4)
    whole, halves, one_by_one = (LoraTrainer(base_model, LORA, seed=3) for _ in range(3))
    one_by_one.max_batch_tokens = 1  # every datum in its own forward pass
    for trainer in (whole, halves, one_by_one):  # one shared step first, so both A and B get gradients
        trainer.forward_backward(datums, "importance_sampling")
        trainer.optim_step(ADAM)

    full = whole.forward_backward(datums, "ppo")
    first = halves.forward_backward(datums[:2], "ppo")
    second = halves.forward_backward(datums[2:], "ppo")
    split = one_by_one.forward_backward(datums, "ppo")
    assert full.loss == pytest.approx(first.loss + second.loss, rel=1e-5)
    assert full.loss == pytest.approx(split.loss, rel=1e-5)
    assert full.metrics["n_tokens"] == first.metrics["n_tokens"] + second.metrics["n_tokens"]
    for a, b in zip(full.logprobs, split.logprobs, strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)

    reference = _lora_grads(whole)
    assert len(reference) == len([p for p in whole.peft_model.parameters() if p.requires_grad])
    assert any(g.abs().sum() > 0 for n, g in reference.items() if "lora_A" in n)
    for other in (halves, one_by_one):
        grads = _lora_grads(other)
        for name, grad in reference.items():
            assert torch.allclose(grads[name], grad, rtol=1e-4, atol=1e-7), name


def test_scoring_only_weighted_positions_trains_identically(base_model: nn.Module) -> None:
    """The local backend's trainer skips the output layer before the first weighted position: same loss, same
    gradients, same log-probabilities where the loss reads them, NaN (not a made-up value) before."""
    datums = _datums(4)
    every = LoraTrainer(base_model, LORA, seed=3)
    weighted_only = LoraTrainer(base_model, LORA, seed=3, every_position=False)
    for trainer in (every, weighted_only):  # one shared step first, so both A and B get gradients
        trainer.forward_backward(datums, "importance_sampling")
        trainer.optim_step(ADAM)

    full, trimmed = every.forward_backward(datums, "ppo"), weighted_only.forward_backward(datums, "ppo")
    assert trimmed.loss == pytest.approx(full.loss, rel=1e-5)
    assert trimmed.metrics == pytest.approx(full.metrics, rel=1e-5)
    first = min(d.loss_fn_inputs["weights"].index(1.0) for d in datums)  # the shortest prompt's last position
    assert first > 0
    for datum, a, b in zip(datums, full.logprobs, trimmed.logprobs, strict=True):
        assert len(b) == len(a) == len(datum.model_input)
        assert all(math.isnan(v) for v in b[:first])
        assert torch.allclose(torch.tensor(a[first:]), torch.tensor(b[first:]), atol=1e-5)
    reference = _lora_grads(every)
    for name, grad in _lora_grads(weighted_only).items():
        assert torch.allclose(grad, reference[name], rtol=1e-4, atol=1e-7), name

    probe = [datum_from_completion([12, 40, 77], [201, 33], weights=0.0)]  # weights nothing: the caller reads it
    assert weighted_only.forward_backward(probe, "cross_entropy").logprobs[0] == pytest.approx(
        every.forward_backward(probe, "cross_entropy").logprobs[0], abs=1e-5
    )


def test_optim_step_reports_pre_clip_norm_and_clears_gradients(base_model: nn.Module) -> None:
    trainer = LoraTrainer(base_model, LORA)
    with pytest.raises(RuntimeError, match="forward_backward first"):
        trainer.optim_step(ADAM)
    trainer.forward_backward(_datums(2), "cross_entropy")
    grads = _lora_grads(trainer)
    norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])))
    result = trainer.optim_step(AdamParams(learning_rate=3e-3, grad_clip_norm=1e-3))
    assert result.step == trainer.step == 1
    assert result.metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert result.metrics["lr"] == 3e-3
    assert _lora_grads(trainer) == {}
    with pytest.raises(RuntimeError, match="forward_backward first"):
        trainer.optim_step(ADAM)


def test_lora_weights_reproduce_the_peft_layer_by_hand(base_model: nn.Module) -> None:
    trainer = LoraTrainer(base_model, LORA)
    trainer.forward_backward(_datums(2), "importance_sampling")
    trainer.optim_step(ADAM)  # B is no longer 0
    weights = trainer.lora_weights()
    assert sorted(weights) == sorted(f"model.layers.{i}.{part}" for i in range(2) for part in PARTS)

    key = "model.layers.1.mlp.down_proj"
    delta = weights[key]
    assert delta.scaling == pytest.approx(8 / 4)
    assert delta.b.abs().sum() > 0
    base_linear = base_model.get_submodule(key)
    assert delta.a.shape == (4, base_linear.in_features) and delta.b.shape == (base_linear.out_features, 4)
    x = torch.randn(3, base_linear.in_features, generator=torch.Generator().manual_seed(1))
    peft_layer = trainer.peft_model.base_model.model.get_submodule(key)
    with torch.no_grad():
        by_hand = base_linear(x) + delta.scaling * (x @ delta.a.T) @ delta.b.T
        assert torch.allclose(peft_layer(x), by_hand, atol=1e-6)

    # Clones: later training and edits by the receiver do not alias the trainer's parameters.
    snapshot = delta.b.clone()
    delta.a.zero_()
    assert trainer.lora_weights()[key].a.abs().sum() > 0
    trainer.forward_backward(_datums(2), "importance_sampling")
    trainer.optim_step(ADAM)
    assert torch.equal(delta.b, snapshot)
    assert not torch.equal(trainer.lora_weights()[key].b, snapshot)


def test_save_load_round_trip_restores_weights_optimizer_and_rng(base_model: nn.Module, tmp_path: Path) -> None:
    lora = LoraSettings(rank=4, alpha=8, dropout=0.1)  # dropout makes the next step depend on the saved RNG
    original = LoraTrainer(base_model, lora, seed=0)
    for _ in range(2):
        original.forward_backward(_datums(3), "ppo")
        original.optim_step(ADAM)
    original.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / TRAINER_STATE_FILE).is_file()

    restored = LoraTrainer(base_model, lora, seed=99)  # a different init, overwritten by load
    restored.load(tmp_path / "ckpt")
    assert restored.step == 2
    for key, delta in original.lora_weights().items():
        assert torch.equal(restored.lora_weights()[key].a, delta.a)
        assert torch.equal(restored.lora_weights()[key].b, delta.b)

    datums = _datums(3, seed=5)
    results = []
    for trainer in (original, restored):
        fwd = trainer.forward_backward(datums, "ppo")
        step = trainer.optim_step(ADAM)
        results.append((fwd.loss, fwd.logprobs, step.metrics["grad_norm"]))
    assert results[0] == results[1]
    for key, delta in original.lora_weights().items():
        assert torch.equal(restored.lora_weights()[key].b, delta.b), key


def test_saved_adapter_loads_in_peft_and_serves_the_trained_policy(
    base_model: nn.Module, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = LoraTrainer(base_model, LORA)
    trainer.forward_backward(_datums(2), "importance_sampling")
    trainer.optim_step(ADAM)
    trainer.save(tmp_path / "adapter")

    fresh = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter")
    loaded.eval()
    datum = _datums(1, seed=7)[0]
    trained = trainer.forward_backward([datum], "cross_entropy").logprobs[0]
    assert torch.allclose(_base_logprobs(loaded, datum), torch.tensor(trained), atol=1e-5)
    assert not torch.allclose(_base_logprobs(base_model, datum), torch.tensor(trained), atol=1e-4)


def test_load_rejects_a_mismatched_adapter(base_model: nn.Module, tmp_path: Path) -> None:
    LoraTrainer(base_model, LORA).save(tmp_path / "r4")
    with pytest.raises(ValueError, match="was trained with"):
        LoraTrainer(base_model, LoraSettings(rank=8, alpha=8)).load(tmp_path / "r4")
    with pytest.raises(FileNotFoundError, match=TRAINER_STATE_FILE):
        LoraTrainer(base_model, LORA).load(tmp_path / "missing")


def _datum(model_input: list[int], **inputs: list[float]) -> Datum:
    return Datum(model_input=model_input, loss_fn_inputs=inputs)


@pytest.mark.parametrize(
    ("datum", "loss", "message"),
    [
        (_datum([1, 2], target_tokens=[2, 10_000]), "cross_entropy", r"target_tokens.*\[0, 491\)"),
        (_datum([-1, 2], target_tokens=[2, 3]), "cross_entropy", r"model_input.*\[0, 491\)"),
        (_datum([1, 2], target_tokens=[2, 3.5]), "cross_entropy", "whole numbers"),
        (_datum([1, 2], target_tokens=[2, 3], logprobs=[-1.0, -1.0]), "ppo", "advantages"),
        (_datum([1, 2], target_tokens=[2, 3], advantages=[1.0, 1.0]), "importance_sampling", "logprobs"),
        (_datum([1, 2], target_tokens=[2, 3], mask=[1.0, 1.0]), "cross_entropy", "unknown loss_fn_inputs"),
        (_datum([1, 2], target_tokens=[2, 3], weights=[1.0, float("nan")]), "cross_entropy", "non-finite"),
        (_datum([1, 2], target_tokens=[2, 3]), "dpo", "unknown loss"),
    ],
)
def test_invalid_inputs_raise_clear_errors(base_model: nn.Module, datum: Datum, loss: str, message: str) -> None:
    trainer = LoraTrainer(base_model, LORA)
    with pytest.raises(ValueError, match=message):
        trainer.forward_backward([datum], loss)
    assert _lora_grads(trainer) == {}  # validation happens before any forward pass


def test_empty_batch_and_unknown_config_are_rejected(base_model: nn.Module) -> None:
    trainer = LoraTrainer(base_model, LORA)
    with pytest.raises(ValueError, match="at least one datum"):
        trainer.forward_backward([], "cross_entropy")
    with pytest.raises(ValueError, match="unknown key"):
        trainer.forward_backward(_datums(1), "ppo", {"epsilon": 0.2})
