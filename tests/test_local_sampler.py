"""The local backend's serving side: versioned LoRA layers, the decode loop, stop handling, streaming."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from backend_helpers import wait_until
from torch import nn

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local.lora_delta import LoraDelta, LoraWeights
from openclaw_cli.backends.local.sampler import (
    IncrementalText,
    TransformersSampler,
    choose_token,
    filter_top_k,
    filter_top_p,
    teacher_forced_logprobs,
)
from openclaw_cli.backends.local.serving import PolicyVersions, VersionedLoraLinear, install_versioned_lora
from openclaw_cli.settings import DEFAULT_LORA_TARGETS
from openclaw_cli.types import SampleResult, SamplingParams, TokenChunk

# ---------------------------------------------------------------------------------------------------------------
# Fixtures: one served tiny model per module (wrapping mutates the model, so it is not shared with other files)


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tiny_tokenizer) -> SimpleNamespace:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval().requires_grad_(False)
    versions = PolicyVersions(model, list(DEFAULT_LORA_TARGETS), keep=2)
    sampler = TransformersSampler(model, tiny_tokenizer, versions, max_concurrent=3, context_length=4096)
    prompt = tiny_tokenizer.render([{"role": "user", "content": "What is the capital of France?"}])
    yield SimpleNamespace(model=model, versions=versions, sampler=sampler, tok=tiny_tokenizer, prompt=prompt)
    sampler.close()


def random_lora(
    versions: PolicyVersions, model: nn.Module, seed: int, rank: int = 4, scale: float = 0.3
) -> LoraWeights:
    gen = torch.Generator().manual_seed(seed)
    weights: LoraWeights = {}
    for key in versions.layer_keys:
        base = model.get_submodule(key)
        a = torch.randn(rank, base.in_features, generator=gen) * scale
        b = torch.randn(base.out_features, rank, generator=gen) * scale
        weights[key] = LoraDelta(a=a, b=b, scaling=2.0)
    return weights


def scored(served: SimpleNamespace, version: int, tokens: list[int]) -> list[float]:
    """Teacher-forced log p(tokens[i] | prefix) for i >= 1 under a version."""
    with served.versions.activate(served.versions.acquire(version)):
        return teacher_forced_logprobs(served.model, tokens, torch.device("cpu"))


def completion_logprobs(served: SimpleNamespace, version: int, prompt: list[int], completion: list[int]) -> list[float]:
    return scored(served, version, prompt + completion)[len(prompt) - 1 :]


@contextmanager
def held_forward(model: nn.Module) -> Iterator[threading.Event]:
    """Every forward pass waits until the yielded event is set (at most 30 s): a request admitted meanwhile can
    neither finish (a sampled end-of-text token would end it at any step) nor free its slot."""
    gate = threading.Event()

    def hold(_module: nn.Module, _args: object) -> None:  # a pre-hook's return value would replace the inputs
        gate.wait(timeout=30)

    handle = model.register_forward_pre_hook(hold)
    try:
        yield gate
    finally:
        gate.set()
        handle.remove()


@contextmanager
def slow_forward(model: nn.Module, seconds: float) -> Iterator[list[float]]:
    """Make every forward pass take at least ``seconds``; yields the list of call start times."""
    calls: list[float] = []

    def hook(_module: nn.Module, _args: object) -> None:
        calls.append(time.monotonic())
        time.sleep(seconds)

    handle = model.register_forward_pre_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


# ---------------------------------------------------------------------------------------------------------------
# Versioned LoRA layers


def test_versioned_layer_adds_scaled_low_rank_delta_for_the_active_version_only() -> None:
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module("q_proj", nn.Linear(3, 2, bias=True))
    model.add_module("other", nn.Linear(2, 2))
    versions = PolicyVersions(model, ["q_proj"], keep=1)
    layer = model.get_submodule("q_proj")
    assert isinstance(layer, VersionedLoraLinear) and isinstance(model.get_submodule("other"), nn.Linear)

    a = torch.tensor([[1.0, 0.0, 2.0]])  # rank 1
    b = torch.tensor([[0.5], [-1.0]])
    info = versions.publish({"q_proj": LoraDelta(a=a, b=b, scaling=3.0)}, "hand")
    x = torch.tensor([[1.0, 2.0, 3.0]])
    base_out = layer.base_forward(x)
    # A x = 1 + 6 = 7; B (A x) = [3.5, -7]; times scaling 3 = [10.5, -21]
    expected = base_out + torch.tensor([[10.5, -21.0]])
    with versions.activate(versions.acquire(info.version)):
        assert torch.allclose(layer(x), expected)
    with versions.activate(versions.acquire(0)):
        assert torch.equal(layer(x), base_out)
    assert torch.equal(layer(x), base_out)  # nothing active on this thread: the base


def test_install_rejects_models_without_matching_linears() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(BackendError, match="no linear layer of the model matches"):
        install_versioned_lora(model, ["q_proj"], threading.local())


def test_publish_checks_keys_and_shapes(served: SimpleNamespace) -> None:
    key = served.versions.layer_keys[0]
    base = served.model.get_submodule(key)
    with pytest.raises(BackendError, match="does not adapt"):
        served.versions.publish({"model.nope": LoraDelta(torch.zeros(1, 2), torch.zeros(2, 1), 1.0)})
    wrong = LoraDelta(torch.zeros(2, base.in_features + 1), torch.zeros(base.out_features, 2), 1.0)
    with pytest.raises(BackendError, match="shapes"):
        served.versions.publish({key: wrong})


def test_expired_versions_are_refused_naming_the_servable_ones(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval().requires_grad_(False)
    versions = PolicyVersions(model, ["q_proj"], keep=2)
    numbers = [versions.publish(random_lora(versions, model, seed=i)).version for i in range(3)]
    assert numbers == [1, 2, 3]
    assert versions.current().version == 3
    assert versions.servable() == [0, 2, 3]
    with pytest.raises(BackendError, match="version 1 is not servable; servable versions: 0, 2, 3") as info:
        versions.acquire(1)
    assert info.value.status_code == 400
    # A requested number is honoured only above every number used so far.
    assert versions.publish(random_lora(versions, model, seed=9), version=7).version == 7
    assert versions.publish(random_lora(versions, model, seed=9), version=5).version == 8


# ---------------------------------------------------------------------------------------------------------------
# Choosing tokens (hand-computed distributions)


def test_top_k_and_top_p_filters_by_hand() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept_k = filter_top_k(logits, 2)
    assert torch.isinf(kept_k[2:]).all() and torch.equal(kept_k[:2], logits[:2])
    assert torch.equal(filter_top_k(logits, 0), logits)
    # Nucleus 0.8: 0.5 + 0.3 already reach it, so 0.15 and 0.05 go; 0.81 needs the third token too.
    assert torch.isinf(filter_top_p(logits, 0.8)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_top_p(logits, 0.81)).tolist() == [False, False, False, True]
    assert torch.isinf(filter_top_p(logits, 0.1)).tolist() == [False, True, True, True]  # the top one always stays
    shuffled = logits[[2, 0, 3, 1]]
    assert torch.isinf(filter_top_p(shuffled, 0.8)).tolist() == [True, False, True, False]


def test_choose_token_reports_raw_and_processed_logprobs() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = torch.log(probs) + 7.0  # a shift changes nothing
    gen = torch.Generator().manual_seed(0)

    greedy = choose_token(logits, SamplingParams(temperature=0), gen)
    assert (greedy.token, greedy.sampling_logprob) == (0, 0.0)
    assert greedy.logprob == pytest.approx(math.log(0.5), abs=1e-6)

    for _ in range(20):
        pick = choose_token(logits, SamplingParams(top_k=2), gen)
        assert pick.token in (0, 1)
        assert pick.logprob == pytest.approx(math.log(probs[pick.token]), abs=1e-6)
        assert pick.sampling_logprob == pytest.approx(math.log(probs[pick.token] / 0.8), abs=1e-6)

    # Temperature 2: p_i^(1/2) renormalised.
    roots = probs.sqrt()
    for _ in range(20):
        pick = choose_token(logits, SamplingParams(temperature=2.0), gen)
        assert pick.sampling_logprob == pytest.approx(math.log(roots[pick.token] / roots.sum()), abs=1e-6)
        assert pick.logprob == pytest.approx(math.log(probs[pick.token]), abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# Incremental text


def pieces_decoder(pieces: dict[int, str]):
    return lambda ids: "".join(pieces[i] for i in ids)


def test_stop_string_is_held_back_and_cut() -> None:
    text = IncrementalText(pieces_decoder({1: "Hel", 2: "lo ", 3: "wor", 4: "ld"}), stops=["o w"])
    assert text.push(1) == "Hel"
    assert text.push(2) == "l"  # "o " could start "o w": held back
    assert text.push(3) == ""  # "o w" found: everything from it on is dropped
    assert text.stop_sequence == "o w"
    assert text.text == "Hell"
    assert text.finish() == ""


def test_held_back_prefix_is_released_when_it_stops_matching_or_at_the_end() -> None:
    text = IncrementalText(pieces_decoder({1: "ab<", 2: "/x", 3: "<"}), stops=["</s>"])
    assert text.push(1) == "ab"
    assert text.push(2) == "</x"
    assert text.push(3) == ""
    assert text.finish() == "<"
    assert text.text == "ab</x<" and text.stop_sequence is None


def test_earliest_of_several_stop_strings_wins() -> None:
    text = IncrementalText(pieces_decoder({1: "one two three"}), stops=["three", "two"])
    assert text.push(1) == "one "
    assert (text.stop_sequence, text.text) == ("two", "one ")


def test_multibyte_characters_are_never_split(tiny_tokenizer) -> None:
    sentence = "Café — 東京 😀 ok"
    ids = tiny_tokenizer.encode(sentence)
    assert len(ids) > len(sentence.encode("utf-8")) // 2  # the tiny BPE splits these into byte tokens
    text = IncrementalText(tiny_tokenizer.decode)
    deltas = [text.push(t) for t in ids]
    deltas.append(text.finish())
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == sentence == text.text
    assert "" in deltas  # some tokens were incomplete characters and had to wait


# ---------------------------------------------------------------------------------------------------------------
# The decode loop


async def test_logprobs_equal_a_teacher_forced_pass_at_base_and_lora_versions(served: SimpleNamespace) -> None:
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=3)
    base = await served.sampler.sample(served.prompt, params, version=0)
    assert base.version == 0 and len(base.tokens) == len(base.logprobs) == 24
    expected = completion_logprobs(served, 0, served.prompt, base.tokens)
    assert base.logprobs == pytest.approx(expected, abs=1e-4)

    info = served.versions.publish(random_lora(served.versions, served.model, seed=1), "random")
    tuned = await served.sampler.sample(served.prompt, params)
    assert tuned.version == info.version
    assert tuned.logprobs == pytest.approx(
        completion_logprobs(served, info.version, served.prompt, tuned.tokens), abs=1e-4
    )
    # The delta matters: the base model scores the same tokens differently.
    base_scores = completion_logprobs(served, 0, served.prompt, tuned.tokens)
    assert max(abs(x - y) for x, y in zip(base_scores, tuned.logprobs, strict=True)) > 1e-2
    # Unfiltered temperature 1: the sampled distribution IS the policy.
    assert tuned.sampling_logprobs == pytest.approx(tuned.logprobs, abs=1e-5)


async def test_sampling_logprobs_follow_temperature_and_top_k(served: SimpleNamespace) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.7, top_k=5, seed=11)
    result = await served.sampler.sample(served.prompt, params, version=0)
    with torch.inference_mode():
        logits = served.model(input_ids=torch.tensor([served.prompt + result.tokens])).logits[0].float()
    start = len(served.prompt) - 1
    for i, token in enumerate(result.tokens):
        step = logits[start + i]
        processed = torch.log_softmax(filter_top_k(step / 0.7, 5), dim=-1)
        assert result.sampling_logprobs[i] == pytest.approx(float(processed[token]), abs=1e-4)
        assert result.logprobs[i] == pytest.approx(float(torch.log_softmax(step, -1)[token]), abs=1e-4)
    assert max(abs(s - r) for s, r in zip(result.sampling_logprobs, result.logprobs, strict=True)) > 0.05


async def test_greedy_is_argmax_and_deterministic(served: SimpleNamespace) -> None:
    params = SamplingParams(max_tokens=10, temperature=0)
    first = await served.sampler.sample(served.prompt, params, version=0)
    second = await served.sampler.sample(served.prompt, params, version=0)
    assert first.tokens == second.tokens
    assert first.sampling_logprobs == [0.0] * 10
    with torch.inference_mode():
        logits = served.model(input_ids=torch.tensor([served.prompt + first.tokens])).logits[0]
    argmax = logits[len(served.prompt) - 1 : -1].argmax(-1).tolist()
    assert first.tokens == argmax


async def test_same_seed_same_tokens_other_seed_other_tokens(served: SimpleNamespace) -> None:
    a = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=20, seed=5), version=0)
    b = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=20, seed=5), version=0)
    c = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=20, seed=6), version=0)
    assert a.tokens == b.tokens and a.logprobs == b.logprobs
    assert a.tokens != c.tokens


def first_ascii_pair(text: str) -> int:
    for i in range(len(text) - 1):
        if text[i : i + 2].isascii() and text[i : i + 2].isprintable() and text.find(text[i : i + 2]) == i and i > 0:
            return i
    raise AssertionError(f"no usable stop string in {text!r}")


async def test_stop_string_ends_generation_and_is_excluded(served: SimpleNamespace) -> None:
    # Seeded sampling repeats itself exactly, and unlike greedy decoding it does not loop on one token.
    free = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=40, seed=13), version=0)
    at = first_ascii_pair(free.text)
    stop = free.text[at : at + 2]
    result = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=40, seed=13, stop=(stop,)), version=0)
    assert result.finish_reason == "stop" and result.stop_sequence == stop
    assert result.text == free.text[:at]
    # Tokens run up to and including the one that completed the stop string, no further.
    n = len(result.tokens)
    assert result.tokens == free.tokens[:n]
    assert stop in served.tok.decode(result.tokens) and stop not in served.tok.decode(result.tokens[:-1])


async def test_max_tokens_is_length_and_stop_tokens_are_kept(served: SimpleNamespace) -> None:
    free = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=7, temperature=0), version=0)
    assert free.finish_reason == "length" and len(free.tokens) == 7 and free.stop_sequence is None

    stop_token = free.tokens[3]
    cut = free.tokens.index(stop_token)
    result = await served.sampler.sample(
        served.prompt, SamplingParams(max_tokens=7, temperature=0, stop_token_ids=(stop_token,)), version=0
    )
    assert result.finish_reason == "stop"
    assert result.tokens == free.tokens[: cut + 1]  # the stop token is part of the completion (training sees it)
    assert result.text == served.tok.decode(free.tokens[:cut])  # ...but not of the text


async def test_tokenizer_eos_ids_stop_generation(served: SimpleNamespace) -> None:
    free = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=6, temperature=0), version=0)
    eos = free.tokens[2]
    tok = SimpleNamespace(eos_token_ids=[eos], decode=served.tok.decode)
    sampler = TransformersSampler(served.model, tok, served.versions, max_concurrent=1, context_length=4096)
    try:
        result = await sampler.sample(served.prompt, SamplingParams(max_tokens=6, temperature=0), version=0)
    finally:
        sampler.close()
    cut = free.tokens.index(eos)
    assert (result.finish_reason, result.tokens) == ("stop", free.tokens[: cut + 1])


async def test_requests_that_cannot_run_are_clear_400s(served: SimpleNamespace) -> None:
    sampler = TransformersSampler(served.model, served.tok, served.versions, max_concurrent=1, context_length=40)
    try:
        with pytest.raises(BackendError, match=r"prompt \(30 tokens\) \+ max_tokens \(11\) exceeds .* 40 tokens") as e:
            await sampler.sample([5] * 30, SamplingParams(max_tokens=11))
        assert e.value.status_code == 400
        await sampler.sample([5] * 30, SamplingParams(max_tokens=10, temperature=0))  # exactly fits
        with pytest.raises(BackendError, match="empty"):
            await sampler.sample([], SamplingParams(max_tokens=1))
        with pytest.raises(BackendError, match="outside the vocabulary"):
            await sampler.sample([1, 10**6], SamplingParams(max_tokens=1))
        with pytest.raises(BackendError, match="version 99 is not servable"):
            await sampler.sample([1, 2], SamplingParams(max_tokens=1), version=99)
    finally:
        sampler.close()


async def test_compute_logprobs_is_none_then_teacher_forced(served: SimpleNamespace) -> None:
    tokens = served.prompt[:12]
    values = await served.sampler.compute_logprobs(tokens, version=0)
    assert values[0] is None and len(values) == 12
    assert values[1:] == pytest.approx(scored(served, 0, tokens), abs=1e-6)
    # From a start position (a reply after its prompt): the same values there, None before.
    tail = await served.sampler.compute_logprobs(tokens, version=0, start=9)
    assert tail[:9] == [None] * 9 and tail[9:] == pytest.approx(values[9:], abs=1e-5)
    assert await served.sampler.compute_logprobs(tokens, version=0, start=12) == [None] * 12


# ---------------------------------------------------------------------------------------------------------------
# Streaming, cancellation, versions under concurrency


async def test_stream_is_incremental_and_agrees_with_the_result(served: SimpleNamespace) -> None:
    chunks: list[TokenChunk] = []
    first_chunk_at = 0.0
    with slow_forward(served.model, 0.03):
        async for event in served.sampler.stream(served.prompt, SamplingParams(max_tokens=12, seed=2), version=0):
            if isinstance(event, TokenChunk):
                if not chunks:
                    first_chunk_at = time.time()
                chunks.append(event)
            else:
                result = event
    assert isinstance(result, SampleResult)
    # 12 forward passes of >= 30 ms: the first token arrived while at least ~10 more were still to be computed.
    assert result.finished_at - first_chunk_at > 0.2
    assert result.started_at <= result.first_token_at <= first_chunk_at <= result.finished_at
    assert [c.token_id for c in chunks] == result.tokens
    assert [c.logprob for c in chunks] == result.logprobs
    assert "".join(c.text for c in chunks) == result.text
    assert result.prompt_tokens == len(served.prompt)


async def test_closing_a_stream_stops_the_worker(served: SimpleNamespace) -> None:
    with slow_forward(served.model, 0.01) as calls:
        stream = served.sampler.stream(served.prompt, SamplingParams(max_tokens=2000), version=0)
        seen = 0
        async for event in stream:
            seen += isinstance(event, TokenChunk)
            if seen == 3:
                break
        await stream.aclose()
        deadline = time.monotonic() + 2
        while served.sampler.running_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert served.sampler.running_requests == 0
        stopped_at = len(calls)
        await asyncio.sleep(0.1)
        assert len(calls) == stopped_at < 20


async def test_cancelling_sample_stops_the_worker(served: SimpleNamespace) -> None:
    with held_forward(served.model) as gate:
        task = asyncio.create_task(served.sampler.sample(served.prompt, SamplingParams(max_tokens=2000), version=0))
        await wait_until(lambda: served.sampler.running_requests == 1, timeout_s=5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        await wait_until(lambda: served.sampler.running_requests == 0, timeout_s=2)


async def test_closing_the_sampler_fails_requests_still_waiting_for_a_worker(served: SimpleNamespace) -> None:
    sampler = TransformersSampler(served.model, served.tok, served.versions, max_concurrent=1, context_length=4096)
    # The running request holds the only slot inside its first forward pass until the gate opens: it cannot end
    # (a sampled end-of-text token would free the slot and let the waiting request run) before close().
    with held_forward(served.model) as gate:
        running = sampler.stream(served.prompt, SamplingParams(max_tokens=20), version=0)
        first = asyncio.create_task(anext(running))
        await wait_until(lambda: sampler.running_requests == 1, timeout_s=5)
        waiting = asyncio.create_task(sampler.sample(served.prompt, SamplingParams(max_tokens=5), version=0))
        await asyncio.sleep(0.05)
        assert sampler.running_requests == 1 and not waiting.done()
        sampler.close()
        gate.set()
        with pytest.raises(BackendError, match="closed before this request ran"):
            await asyncio.wait_for(waiting, timeout=5)
        assert isinstance(await asyncio.wait_for(first, timeout=5), TokenChunk | SampleResult)  # it goes on
        await running.aclose()
    with pytest.raises(BackendError, match="closed"):
        await sampler.sample(served.prompt, SamplingParams(max_tokens=1))


async def test_a_stream_keeps_its_version_through_publishes(served: SimpleNamespace) -> None:
    versions = served.versions
    old = versions.publish(random_lora(versions, served.model, seed=21), "old")
    old_weights = versions.acquire(old.version)  # the test's own pin, to score with the old weights afterwards
    chunks: list[TokenChunk] = []
    published = []
    with slow_forward(served.model, 0.02):
        async for event in served.sampler.stream(served.prompt, SamplingParams(max_tokens=10, seed=4)):
            if isinstance(event, TokenChunk):
                chunks.append(event)
                if len(chunks) == 2:
                    # Two publishes with keep=2: the stream's version even leaves the servable window.
                    published.append(versions.publish(random_lora(versions, served.model, seed=22), "new"))
                    published.append(versions.publish(random_lora(versions, served.model, seed=23), "newer"))
            else:
                result = event
    assert old.version not in versions.servable()
    assert {c.version for c in chunks} == {old.version} and result.version == old.version
    assert len(result.tokens) == 10
    # Every token, before and after the publishes, was computed with the old weights.
    with versions.activate(old_weights):
        by_old = teacher_forced_logprobs(served.model, served.prompt + result.tokens, torch.device("cpu"))
    assert result.logprobs == pytest.approx(by_old[len(served.prompt) - 1 :], abs=1e-4)
    newest = completion_logprobs(served, published[-1].version, served.prompt, result.tokens)
    assert max(abs(x - y) for x, y in zip(newest, result.logprobs, strict=True)) > 1e-2

    after = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=3, seed=4))
    assert after.version == published[-1].version == versions.current().version
    pinned = await served.sampler.sample(served.prompt, SamplingParams(max_tokens=5, seed=4), version=0)
    assert pinned.version == 0
    assert pinned.logprobs == pytest.approx(completion_logprobs(served, 0, served.prompt, pinned.tokens), abs=1e-4)


async def test_concurrent_requests_on_different_versions_do_not_mix(served: SimpleNamespace) -> None:
    versions = served.versions
    latest = versions.publish(random_lora(versions, served.model, seed=31), "concurrent")
    params = SamplingParams(max_tokens=16, seed=8)
    with slow_forward(served.model, 0.005):
        on_base, on_latest, on_base_again = await asyncio.gather(
            served.sampler.sample(served.prompt, params, version=0),
            served.sampler.sample(served.prompt, params, version=latest.version),
            served.sampler.sample(served.prompt, params, version=0),
        )
    assert on_base.tokens == on_base_again.tokens
    for result in (on_base, on_latest):
        expected = completion_logprobs(served, result.version, served.prompt, result.tokens)
        assert result.logprobs == pytest.approx(expected, abs=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Step-level batching


@contextmanager
def forward_shapes(model: nn.Module) -> Iterator[list[tuple[int, int]]]:
    """Record (batch, sequence length) of every forward pass's input ids."""
    shapes: list[tuple[int, int]] = []

    def hook(_module: nn.Module, _args: object, kwargs: dict) -> None:
        ids = kwargs.get("input_ids")
        if ids is not None:
            shapes.append((int(ids.shape[0]), int(ids.shape[1])))
        time.sleep(0.002)  # let requests submitted together meet in one batch

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield shapes
    finally:
        handle.remove()


async def test_concurrent_requests_decode_in_one_batch_each_as_it_would_alone(served: SimpleNamespace) -> None:
    versions = served.versions
    tuned = versions.publish(random_lora(versions, served.model, seed=41), "batched")
    tok = served.tok
    prompts = [
        served.prompt,
        tok.render([{"role": "user", "content": "Tell me a long story about a cat who learned to fly."}]),
        tok.render([{"role": "user", "content": "Hi"}]),
    ]
    requests = [
        (prompts[0], SamplingParams(max_tokens=12, seed=1), 0),
        (prompts[1], SamplingParams(max_tokens=20, seed=2, temperature=0.7), tuned.version),
        (prompts[2], SamplingParams(max_tokens=16, temperature=0.0), tuned.version),
    ]
    alone = [await served.sampler.sample(p, params, version=v) for p, params, v in requests]
    with forward_shapes(served.model) as shapes:
        together = await asyncio.gather(*(served.sampler.sample(p, params, version=v) for p, params, v in requests))
    assert max(batch for batch, _ in shapes) == 3  # the three decoded together, different prompts and versions
    decode_steps = sum(1 for _, length in shapes if length == 1)
    assert decode_steps < sum(len(r.tokens) for r in together) - 1  # fewer passes than tokens: batched
    for one, many, (prompt, _, version) in zip(alone, together, requests, strict=True):
        assert many.version == version and many.tokens == one.tokens
        assert many.logprobs == pytest.approx(one.logprobs, abs=1e-4)
        assert many.logprobs == pytest.approx(completion_logprobs(served, version, prompt, many.tokens), abs=1e-4)


async def test_a_request_joining_a_running_batch_and_rows_leaving_keep_everyone_exact(served: SimpleNamespace) -> None:
    tok = served.tok
    long_prompt = tok.render([{"role": "user", "content": "Explain, step by step and in detail, how bread is baked."}])
    short = SamplingParams(max_tokens=3, seed=5)  # leaves early: its row goes, the padding it forced is trimmed
    long = SamplingParams(max_tokens=24, seed=6)
    late = SamplingParams(max_tokens=10, seed=7)
    expected = [
        await served.sampler.sample(long_prompt, long, version=0),
        await served.sampler.sample(served.prompt, short, version=0),
        await served.sampler.sample(tok.render([{"role": "user", "content": "Yo"}]), late, version=0),
    ]
    with slow_forward(served.model, 0.003):
        first = asyncio.create_task(served.sampler.sample(long_prompt, long, version=0))
        second = asyncio.create_task(served.sampler.sample(served.prompt, short, version=0))
        await asyncio.sleep(0.05)  # both running; then one more joins mid-decode
        third = asyncio.create_task(
            served.sampler.sample(tok.render([{"role": "user", "content": "Yo"}]), late, version=0)
        )
        results = await asyncio.gather(first, second, third)
    for got, want in zip(results, expected, strict=True):
        assert got.tokens == want.tokens
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)


async def test_a_long_prefill_is_chunked_between_decode_steps_of_running_streams(served: SimpleNamespace) -> None:
    sampler = TransformersSampler(served.model, served.tok, served.versions, max_concurrent=4, context_length=4096)
    sampler.PREFILL_CHUNK = 16
    long_prompt = served.tok.render([{"role": "user", "content": " ".join(["word"] * 150)}])
    assert len(long_prompt) > 8 * sampler.PREFILL_CHUNK
    try:
        with forward_shapes(served.model) as shapes:
            stream = sampler.stream(served.prompt, SamplingParams(max_tokens=60, seed=3), version=0)
            assert isinstance(await anext(stream), TokenChunk)
            mark = len(shapes)
            other = await sampler.sample(long_prompt, SamplingParams(max_tokens=2, seed=3), version=0)
            await stream.aclose()
        during = shapes[mark:]
        chunks = [i for i, (batch, length) in enumerate(during) if length == sampler.PREFILL_CHUNK]
        assert len(chunks) >= 8
        # Between consecutive prefill chunks the running stream got a decode step: it never waited for the prompt.
        assert all(during[i + 1] == (1, 1) for i in chunks[:-1])
        assert other.logprobs == pytest.approx(completion_logprobs(served, 0, long_prompt, other.tokens), abs=1e-4)
    finally:
        sampler.close()


def test_the_per_thread_setter_changes_only_the_calling_threads_count() -> None:
    from openclaw_cli.backends.local.cpu_threads import per_thread_setter

    setter = per_thread_setter()
    if setter is None:
        pytest.skip("torch here does not run on the libgomp it ships")
    before = torch.get_num_threads()
    seen: list[int] = []

    def worker() -> None:
        setter(1)
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [1] and torch.get_num_threads() == before


async def test_decode_steps_use_every_core_alone_and_decode_threads_beside_other_work(served: SimpleNamespace) -> None:
    sampler = TransformersSampler(
        served.model, served.tok, served.versions, max_concurrent=2, context_length=4096, decode_threads=1
    )
    calls: list[int] = []
    sampler._set_threads = calls.append  # record what the scheduler asks for, in order
    every = torch.get_num_threads()
    try:
        alone = await sampler.sample(served.prompt, SamplingParams(max_tokens=4, seed=1), version=0)
        # Nothing else runs: the prefill and every decode step on every core (serve, or launch between steps).
        assert calls == [every] * len(alone.tokens)
        calls.clear()
        with sampler.other_work.running():  # a training step or a scoring pass runs beside the decode
            beside = await sampler.sample(served.prompt, SamplingParams(max_tokens=4, seed=1), version=0)
    finally:
        sampler.close()
    # One prefill on every core, then a decode step per further token on ``decode_threads``.
    assert calls == [every] + [1] * (len(beside.tokens) - 1)
    assert not sampler.other_work.busy
