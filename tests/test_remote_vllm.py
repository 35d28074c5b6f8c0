"""The remote vLLM sampler (``local.vllm_servers``) against loopback doubles of vLLM's HTTP API
(openclaw_cli/testing/vllm_server_double.py): every version loaded onto every server under a name never used
before, requests to the least busy healthy server, a failure before the first token retried on another server,
one mid-stream ended with an error, all down a retryable error, a restarted server given the current versions
before it serves again, and each start-up check failing with its fix. The same sampler against real ``vllm serve``
processes: tests/test_vllm_remote.py (``make test-vllm``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local import remote_vllm
from openclaw_cli.backends.local.lora_delta import LoraDelta
from openclaw_cli.backends.local.remote_vllm import RemoteVLLMSampler
from openclaw_cli.settings import Settings
from openclaw_cli.testing.vllm_server_double import VllmServerDouble
from openclaw_cli.types import SampleResult, SamplingParams, TokenChunk

pytestmark = pytest.mark.timeout(60)

MODEL = "/models/tiny"


def _weights(rank: int = 4, scale: float = 0.0) -> dict[str, LoraDelta]:
    return {
        f"model.layers.0.self_attn.{name}": LoraDelta(torch.full((rank, 8), scale), torch.zeros(8, rank), 2.0)
        for name in ("q_proj", "v_proj")
    }


@pytest.fixture
def doubles(tiny_tokenizer: Any) -> Iterator[list[VllmServerDouble]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(VllmServerDouble(MODEL, tiny_tokenizer.render)) for _ in range(2)]


@contextlib.asynccontextmanager
async def started(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path, **local: Any
) -> AsyncIterator[RemoteVLLMSampler]:
    settings = Settings(lora={"rank": 4}, local={"vllm_servers": [d.url for d in doubles], "keep_versions": 1, **local})
    sampler = RemoteVLLMSampler(
        Path(MODEL), tiny_tokenizer, settings, adapter_dir=tmp_path / "adapters", probe_weights=_weights()
    )
    await sampler.start()
    try:
        yield sampler
    finally:
        await sampler.close()


def _prompt(tokenizer: Any) -> list[int]:
    return tokenizer.render([{"role": "user", "content": "Hello!"}])


async def test_each_version_is_loaded_onto_every_server_and_requests_spread_over_them(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        prompt = _prompt(tiny_tokenizer)
        base = await sampler.sample(prompt, SamplingParams(max_tokens=4, seed=1))
        assert base.version == 0 and len(base.tokens) == 4 and base.logprobs == [-0.5] * 4
        first = await sampler.publish(_weights(scale=0.1))
        name = sampler.versions.find(None).handle
        assert first.version == 1 and all(name in d.loras for d in doubles)
        assert all(sampler.versions.base.handle in d.loras for d in doubles)  # the base's zero adapter too
        events = [e async for e in sampler.stream(prompt, SamplingParams(max_tokens=3, seed=2))]
        chunks, result = events[:-1], events[-1]
        assert isinstance(result, SampleResult) and result.version == 1
        assert [c.token_id for c in chunks if isinstance(c, TokenChunk)] == result.tokens
        # The request named the version's adapter and asked for the sampled token ids and their log-probabilities.
        body = next(d for d in doubles if d.completions and d.completions[-1]["model"] == name).completions[-1]
        assert body["return_token_ids"] is True and body["logprobs"] == 0 and body["prompt"] == prompt
        await asyncio.gather(*(sampler.sample(prompt, SamplingParams(max_tokens=2, seed=s)) for s in range(6)))
        assert all(len(d.completions) >= 3 for d in doubles)  # both servers took requests
        # keep_versions = 1: the next version retires the first, unloaded from both servers and deleted.
        await sampler.publish(_weights(scale=0.2))
        assert all(name not in d.loras for d in doubles) and not (tmp_path / "adapters" / name).exists()
        # Names are never reused: a second sampler (a restart) publishes under new ones.
        assert sampler.versions.find(None).handle.startswith(f"openclaw-{sampler.versions.run}-shared-v2")


async def test_a_failure_before_the_first_token_goes_to_another_server_and_all_down_is_retryable(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        prompt = _prompt(tiny_tokenizer)
        for double in doubles:
            double.fail_next = 1
        # The first server tried answers 503; the request goes to the other, which fails too: both leave the rotation.
        with pytest.raises(BackendError, match="no vLLM server can take the request") as caught:
            await sampler.sample(prompt, SamplingParams(max_tokens=2))
        assert caught.value.retryable and not any(r.healthy for r in sampler.replicas)
        await asyncio.gather(*(sampler._check_replica(r) for r in sampler.replicas))  # the watcher's next round
        assert all(r.healthy for r in sampler.replicas)
        doubles[0].fail_next = 1
        served = [await sampler.sample(prompt, SamplingParams(max_tokens=2, seed=s)) for s in range(2)]
        assert all(len(r.tokens) == 2 for r in served) and not sampler.replicas[0].healthy

        doubles[1].die_after = 2  # the only healthy server dies mid-stream: that stream ends with an error
        stream = sampler.stream(prompt, SamplingParams(max_tokens=5))
        got = []
        with pytest.raises(BackendError, match="stopped mid-reply"):
            async for event in stream:
                got.append(event)
        assert len(got) == 2


async def test_a_restarted_server_is_given_the_current_versions_before_it_serves_again(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote_vllm, "PROBE_EVERY_S", 0.05)
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        await sampler.publish(_weights(scale=0.1))
        name = sampler.versions.find(None).handle
        doubles[0].restart()
        assert name not in doubles[0].loras
        for _ in range(100):
            if name in doubles[0].loras:
                break
            await asyncio.sleep(0.05)
        assert name in doubles[0].loras and sampler.versions.base.handle in doubles[0].loras
        assert sampler.replicas[0].healthy


async def test_a_version_published_while_a_server_is_down_reaches_it_when_it_is_back(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        doubles[0].stop()
        info = await sampler.publish(_weights(scale=0.1))  # loaded onto the other one; the first leaves the rotation
        name = sampler.versions.find(None).handle
        assert info.version == 1 and name in doubles[1].loras and not sampler.replicas[0].healthy
        doubles[0].restart()
        await sampler._check_replica(sampler.replicas[0])
        assert sampler.replicas[0].healthy and name in doubles[0].loras


@pytest.mark.parametrize(
    ("knob", "message"),
    [
        ("runtime_lora", "runtime LoRA loading is off .* VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"),
        ("version", r"vLLM 0\.9\.1 at .* is too old to return token ids"),
        ("rank", r"cannot load a LoRA of rank 32: start it with --max-lora-rank at least 32"),
        ("template", r"chat template renders a probe conversation differently"),
        ("down", r"is unreachable .* start it, or fix local\.vllm_servers"),
    ],
)
async def test_each_start_up_check_names_the_fix(tiny_tokenizer: Any, tmp_path: Path, knob: str, message: str) -> None:
    def other_template(messages: list[dict[str, Any]]) -> list[int]:
        return [1, *tiny_tokenizer.render(messages)]

    double = VllmServerDouble(MODEL, other_template if knob == "template" else tiny_tokenizer.render)
    double.runtime_lora = knob != "runtime_lora"
    double.version = "0.9.1" if knob == "version" else double.version
    rank = 32 if knob == "rank" else 4
    with double:
        if knob == "down":
            double.stop()
        settings = Settings(lora={"rank": rank}, local={"vllm_servers": [double.url]})
        sampler = RemoteVLLMSampler(
            Path(MODEL), tiny_tokenizer, settings, adapter_dir=tmp_path, probe_weights=_weights(rank)
        )
        with pytest.raises(BackendError, match=message):
            await sampler.start()
        await sampler.close()


async def test_log_probabilities_other_than_the_trainers_are_refused_at_start(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """The double reports -0.5 for every token; a trainer that scores them otherwise (processed log-probabilities,
    or another model) is told how to start the server."""
    settings = Settings(lora={"rank": 4}, local={"vllm_servers": [doubles[0].url]})

    async def scorer(tokens: list[int], start: int) -> list[float | None]:
        return [None] * start + [-2.0] * (len(tokens) - start)

    sampler = RemoteVLLMSampler(Path(MODEL), tiny_tokenizer, settings, adapter_dir=tmp_path, scorer=scorer)
    # 1.5 nats on the sampled tokens, 2.0 on the runner-up (reported -4.0): the larger is named.
    with pytest.raises(BackendError, match=r"2\.00 nats per token .* --logprobs-mode raw_logprobs"):
        await sampler.start()
    await sampler.close()


@pytest.mark.parametrize(("runner_up", "refused"), [(-4.0, False), (-2.0, True)])
async def test_a_runner_up_scored_otherwise_is_refused_when_the_sampled_tokens_agree(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path, runner_up: float, refused: bool
) -> None:
    """A peaked model's sampled tokens have log-probabilities near 0 raw or processed; the runner-up's show processed
    ones (about double the raw). The double reports -0.5 per sampled token and -4.0 for the runner-up; the trainer
    agrees on the sampled tokens and scores the runner-up at ``runner_up``."""
    from openclaw_cli.backends.local.remote_checks import PROBE
    from openclaw_cli.testing.vllm_server_double import RUNNER_UP_LOGPROB

    settings = Settings(lora={"rank": 4}, local={"vllm_servers": [doubles[0].url]})
    prompt_length = len(tiny_tokenizer.render(PROBE))

    async def scorer(tokens: list[int], start: int) -> list[float | None]:
        if len(tokens) == prompt_length + 1:  # the runner-up alone after the prompt
            return [None] * start + [runner_up]
        return [None] * start + [-0.5] * (len(tokens) - start)

    assert RUNNER_UP_LOGPROB == -4.0
    sampler = RemoteVLLMSampler(Path(MODEL), tiny_tokenizer, settings, adapter_dir=tmp_path, scorer=scorer)
    try:
        if refused:
            with pytest.raises(BackendError, match=r"2\.00 nats per token .* --logprobs-mode raw_logprobs"):
                await sampler.start()
        else:
            await sampler.start()
    finally:
        await sampler.close()


def test_doctor_checks_each_server_without_loading_the_model(tiny_tokenizer: Any) -> None:
    from openclaw_cli.backends.local import LocalBackend

    with VllmServerDouble(MODEL, tiny_tokenizer.render) as good, VllmServerDouble(MODEL, tiny_tokenizer.render) as off:
        off.runtime_lora = False
        checks = LocalBackend.diagnose(Settings(local={"vllm_servers": [good.url, off.url]}))
    found = {c.name: c for c in checks if c.name.startswith("vLLM server")}
    assert found[f"vLLM server {good.url}"].ok and MODEL in found[f"vLLM server {good.url}"].detail
    assert not found[f"vLLM server {off.url}"].ok
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in found[f"vLLM server {off.url}"].detail


async def test_servers_that_refuse_our_grammars_leave_constrained_replies_to_check_and_resample(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """Start-up probes whether the servers decode under our Lark grammar; where they do, a constrained request
    carries it as vLLM's structured output; where one refuses (a server pinned to xgrammar), the sampler says it
    cannot constrain, naming the fix, so the proxy checks and resamples instead of sending requests that fail."""
    from openclaw_cli.structured_output import json_form
    from openclaw_cli.types import OutputConstraint

    constraint = OutputConstraint((json_form({"type": "object"}),))
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        assert sampler.accepts_constraint(constraint) is None
        params = SamplingParams(max_tokens=2, seed=1, constraint=constraint)
        await sampler.sample(_prompt(tiny_tokenizer), params)
        body = next(b for d in doubles for b in d.completions if b.get("stream"))
        grammar = body["structured_outputs"]["grammar"]  # ours, marked for vLLM's guidance backend only
        assert grammar.startswith("%llguidance {}\n") and "%json" in grammar
    doubles[1].grammars = False
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        refusal = sampler.accepts_constraint(constraint)
        assert refusal is not None and doubles[1].url in refusal
        assert "--structured-outputs-config.backend guidance" in refusal


async def test_one_url_mode_writes_each_version_for_the_servers_resolver_and_never_loads_it(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """local.vllm_publish = resolver: a version is only written (naming the server's --model as its base) into the
    directory the servers' filesystem resolver reads; a one-token request names it before it serves; a server whose
    resolver does not read that directory is refused at start with the fix."""
    shared = tmp_path / "adapters"
    for double in doubles:
        double.resolver_dir = shared
    async with started(doubles, tiny_tokenizer, tmp_path, vllm_publish="resolver") as sampler:
        info = await sampler.publish(_weights(scale=0.1))
        name = sampler.versions.find(None).handle
        config = (shared / name / "adapter_config.json").read_text()
        assert f'"base_model_name_or_path": "{MODEL}"' in config
        assert any(name in d.loras for d in doubles)  # resolved by the server that took the one-token request
        prompt = _prompt(tiny_tokenizer)
        replies = await asyncio.gather(
            *(sampler.sample(prompt, SamplingParams(max_tokens=2, seed=s)) for s in range(6))
        )
        assert {r.version for r in replies} == {info.version} and all(name in d.loras for d in doubles)
    blind = VllmServerDouble(MODEL, tiny_tokenizer.render)  # runtime LoRA on, no resolver
    with blind:
        settings = Settings(lora={"rank": 4}, local={"vllm_servers": [blind.url], "vllm_publish": "resolver"})
        sampler = RemoteVLLMSampler(Path(MODEL), tiny_tokenizer, settings, adapter_dir=shared, probe_weights=_weights())
        with pytest.raises(
            BackendError, match="VLLM_PLUGINS=lora_filesystem_resolver and VLLM_LORA_RESOLVER_CACHE_DIR"
        ):
            await sampler.start()
        await sampler.close()


async def test_closing_takes_every_version_off_the_servers_and_the_shared_directory(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        await sampler.publish(_weights(scale=0.1))
        assert all(len(d.loras) == 2 for d in doubles)  # the base's zero adapter and version 1
    assert all(d.loras == {} for d in doubles) and list((tmp_path / "adapters").iterdir()) == []


async def test_owners_adapters_are_served_by_their_own_names_on_the_servers(
    doubles: list[VllmServerDouble], tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """An adapter per owner through the servers: each owner's versions are numbered on their own and loaded under
    names of their own; a request of an owner names that owner's adapter only."""
    async with started(doubles, tiny_tokenizer, tmp_path) as sampler:
        alice, bob = "key:0123456789abcdef", "key:fedcba9876543210"
        assert (await sampler.publish(_weights(scale=0.1), adapter=alice)).version == 1
        assert (await sampler.publish(_weights(scale=0.2), adapter=bob)).version == 1
        hers, his = sampler.versions.find(None, alice).handle, sampler.versions.find(None, bob).handle
        assert hers != his and "key-0123456789abcdef-v1" in hers and all({hers, his} <= set(d.loras) for d in doubles)
        prompt = _prompt(tiny_tokenizer)
        await sampler.sample(prompt, SamplingParams(max_tokens=2), adapter=bob)
        served = [b["model"] for d in doubles for b in d.completions if "structured_outputs" not in b]
        assert served == [his]  # (the start-up grammar probe named the base)
        assert sampler.current_version().version == 0  # the shared adapter never published
