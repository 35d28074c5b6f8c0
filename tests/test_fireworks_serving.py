"""Fireworks serving through the real fireworks-ai SDK against the local HTTP double (tiny model behind it):
token-id prompts, exact tokens + log-probabilities, real streaming, version pinning, and the scale-from-zero 503."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from backend_helpers import running
from backend_helpers import user_prompt as prompt_for

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.fireworks import FireworksBackend
from openclaw_cli.backends.fireworks.control import error_detail
from openclaw_cli.backends.fireworks.serving import (
    ServedModel,
    ServedVersions,
    _Completion,
    completion_request,
    is_scaling_up,
)
from openclaw_cli.testing.fireworks_double import FireworksDouble, double_settings
from openclaw_cli.types import PolicyVersion, SampleResult, SamplingParams, TokenChunk

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def double(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with FireworksDouble(tiny_model_dir, work_dir=tmp_path_factory.mktemp("fw-double")) as fw:
        yield fw


@pytest.fixture
async def backend(double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[FireworksBackend]:
    async with running(FireworksBackend(double_settings(double, tiny_model_dir, tmp_path))) as started:
        yield started


async def test_sample_sends_token_ids_and_keeps_exact_tokens_and_logprobs(
    backend: FireworksBackend, double: FireworksDouble
) -> None:
    prompt = prompt_for(backend)
    result = await backend.sample(prompt, SamplingParams(max_tokens=6, temperature=1.0, seed=3))

    body = double.completion_bodies[-1]
    assert body == {
        "model": "accounts/fireworks/models/tiny-qwen3#accounts/test-account/deployments/openclaw-tiny-qwen3",
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": 1.0,
        "seed": 3,
        "logprobs": True,
        "return_token_ids": True,
        "raw_output": True,
        "context_length_exceeded_behavior": "error",
    }
    assert result.version == 0 and result.prompt_tokens == len(prompt)
    assert len(result.tokens) == len(result.logprobs) == len(result.sampling_logprobs) <= 6
    assert result.text == backend.tokenizer().decode(result.tokens)
    # The captured log-probabilities are the model's own: a teacher-forced pass over prompt + reply agrees.
    scored = await backend.compute_logprobs(prompt + result.tokens)
    assert scored[0] is None and len(scored) == len(prompt) + len(result.tokens)
    assert scored[len(prompt) :] == pytest.approx(result.logprobs, abs=1e-4)
    tail = await backend.compute_logprobs(prompt + result.tokens, start=len(prompt))  # the service echoes all
    assert tail[: len(prompt)] == [None] * len(prompt) and tail[len(prompt) :] == scored[len(prompt) :]


async def test_stream_yields_each_token_then_the_same_completion_as_sample(backend: FireworksBackend) -> None:
    prompt = prompt_for(backend, "Say hello")
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=11)
    whole = await backend.sample(prompt, params)

    events = [event async for event in backend.stream(prompt, params)]
    chunks, final = events[:-1], events[-1]
    assert all(isinstance(c, TokenChunk) for c in chunks) and isinstance(final, SampleResult)
    assert [c.token_id for c in chunks] == final.tokens == whole.tokens
    assert [c.logprob for c in chunks] == final.logprobs
    assert final.logprobs == pytest.approx(whole.logprobs, abs=1e-5)
    assert "".join(c.text for c in chunks) == final.text == whole.text
    assert final.finish_reason == whole.finish_reason and {c.version for c in chunks} == {0}


async def test_stop_token_ids_cut_the_reply_after_that_token(backend: FireworksBackend) -> None:
    prompt = prompt_for(backend, "Count to ten")
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    full = await backend.sample(prompt, params)
    assert len(full.tokens) >= 4
    stop_id = full.tokens[2]
    first = full.tokens.index(stop_id)
    cut_params = SamplingParams(max_tokens=8, temperature=1.0, seed=5, stop_token_ids=(stop_id,))

    cut = await backend.sample(prompt, cut_params)
    assert cut.tokens == full.tokens[: first + 1] and cut.finish_reason == "stop"
    assert cut.logprobs == pytest.approx(full.logprobs[: first + 1])
    events = [e async for e in backend.stream(prompt, cut_params)]
    assert events[-1].tokens == cut.tokens
    assert "".join(e.text for e in events[:-1]) == events[-1].text == backend.tokenizer().decode(cut.tokens)


async def test_unknown_version_is_a_400_naming_the_servable_ones(backend: FireworksBackend) -> None:
    with pytest.raises(BackendError, match=r"version 7 is not servable; servable versions: 0") as caught:
        await backend.sample(prompt_for(backend), SamplingParams(max_tokens=2), version=7)
    assert caught.value.status_code == 400


async def test_scaled_to_zero_deployment_is_retried_until_a_replica_is_up(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    double.add_deployment("scale-test")
    backend = FireworksBackend(double_settings(double, tiny_model_dir, tmp_path, deployment="scale-test", replicas=0))
    await backend.start()
    try:
        assert double.deployments["scale-test"].body["replicaCount"] == 0
        sampler = backend.impl.sampler  # type: ignore[union-attr]
        sampler.first_backoff_s = 0.01
        answers_before = double.scale_up_answers

        result = await backend.sample(prompt_for(backend), SamplingParams(max_tokens=3, seed=1))
        assert len(result.tokens) >= 1
        assert double.scale_up_answers - answers_before == 2 == sampler.scale_up_retries  # 2 x 503, then served
        assert sampler.status == "serving" and double.deployments["scale-test"].body["replicaCount"] == 1
    finally:
        await backend.close()


async def test_scale_up_that_outlasts_the_timeout_is_a_retryable_503(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    double.add_deployment("slow-scale")
    settings = double_settings(
        double, tiny_model_dir, tmp_path, deployment="slow-scale", replicas=0, scale_up_timeout_s=0.3
    )
    backend = FireworksBackend(settings)
    await backend.start()
    double.deployments["slow-scale"].private["scale_up_left"] = 10_000  # never comes up
    try:
        sampler = backend.impl.sampler  # type: ignore[union-attr]
        sampler.first_backoff_s = 0.02
        with pytest.raises(BackendError, match="still scaling up after 0 s; try again shortly") as caught:
            await backend.sample(prompt_for(backend), SamplingParams(max_tokens=2))
        assert caught.value.retryable and caught.value.status_code == 503
        assert sampler.scale_up_retries >= 3 and "is scaling up" in sampler.status
        with pytest.raises(BackendError, match="still scaling up"):  # streams get the same treatment
            async for _ in backend.stream(prompt_for(backend), SamplingParams(max_tokens=2)):
                pass
    finally:
        await backend.close()


async def test_wrong_api_key_fails_start_with_a_clear_non_retryable_error(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = FireworksBackend(double_settings(double, tiny_model_dir, tmp_path, api_key="fw-wrong"))
    with pytest.raises(BackendError, match=r"reading deployment openclaw-tiny-qwen3 failed \(401\)") as caught:
        await backend.start()
    assert not caught.value.retryable and "fw-wrong" not in str(caught.value)


# -- units ----------------------------------------------------------------------------------------------------------


def served(version: int, name: str) -> ServedModel:
    return ServedModel(PolicyVersion(version, name), f"{name}#dep", lora_model=name, deployed_model=f"dm-{name}")


def test_multi_lora_versions_keep_the_base_and_the_newest_published() -> None:
    versions = ServedVersions(ServedModel(PolicyVersion(0, "base"), "base#dep"), keep=2, exclusive=False)
    assert versions.publish("a#dep", lora_model="a", deployed_model="dm-a")[1] == []
    assert versions.publish("b#dep", lora_model="b", deployed_model="dm-b")[1] == []
    info, dropped = versions.publish("c#dep", lora_model="c", deployed_model="dm-c", name="step-3")
    assert (info.version, info.name) == (3, "step-3")
    assert [d.lora_model for d in dropped] == ["a"] and versions.servable() == [0, 2, 3]
    assert versions.resolve(None).request_model == "c#dep" and versions.resolve(0).request_model == "base#dep"
    with pytest.raises(BackendError, match="servable versions: 0, 2, 3"):
        versions.resolve(1)
    # Resuming asks for a number: honoured when above every number used, else the next one.
    assert versions.publish("d#dep", lora_model="d", deployed_model=None, version=9)[0].version == 9
    assert versions.publish("e#dep", lora_model="e", deployed_model=None, version=4)[0].version == 10


def test_hot_reload_versions_serve_only_the_current_one() -> None:
    versions = ServedVersions(ServedModel(PolicyVersion(0, "base"), "base#dep"), keep=3, exclusive=True)
    assert versions.servable() == [0]
    versions.publish("base#dep", lora_model="a", deployed_model="dm-a")
    _, dropped = versions.publish("base#dep", lora_model="b", deployed_model="dm-b")
    assert [d.lora_model for d in dropped] == ["a"] and versions.servable() == [2]
    for gone in (0, 1):
        with pytest.raises(BackendError, match="servable versions: 2"):
            versions.resolve(gone)


def test_completion_request_leaves_out_knobs_at_their_neutral_values() -> None:
    body: dict[str, Any] = completion_request("m", [1, 2], SamplingParams(max_tokens=4), stream=True)
    assert body == {
        "model": "m",
        "prompt": [1, 2],
        "max_tokens": 4,
        "temperature": 1.0,
        "logprobs": True,
        "return_token_ids": True,
        "context_length_exceeded_behavior": "error",
        "stream": True,
    }
    full = completion_request("m", [1], SamplingParams(max_tokens=1, top_p=0.9, top_k=20, stop=("\n",)), stream=False)
    assert (full["top_p"], full["top_k"], full["stop"], full["raw_output"]) == (0.9, 20, ["\n"], True)


def test_a_plain_json_constraint_goes_as_fireworks_json_mode_and_a_tool_frame_is_left_to_resampling(
    tiny_tokenizer: Any,
) -> None:
    from openclaw_cli.backends.fireworks.batch import FireworksBatchBackend
    from openclaw_cli.structured_output import json_form, tool_call_form
    from openclaw_cli.types import OutputConstraint

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = OutputConstraint((json_form(schema),))
    body = completion_request("m", [1], SamplingParams(max_tokens=8, constraint=constraint), stream=True)
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    accepts = FireworksBatchBackend.accepts_constraint
    assert accepts(cast(Any, None), constraint) is None
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    framed = OutputConstraint((tool_call_form(tiny_tokenizer, tools, None),))
    assert "JSON mode" in (accepts(cast(Any, None), framed) or "")


def test_a_reply_without_a_finish_reason_is_a_retryable_error(tiny_tokenizer: Any) -> None:
    completion = _Completion(())
    choice = {"text": "Hi", "token_ids": [7], "logprobs": {"content": [{"token_id": 7, "logprob": -0.5}]}}
    assert completion.add(choice) == [(7, -0.5)]
    with pytest.raises(BackendError, match="ended without a finish reason") as caught:
        completion.result(tiny_tokenizer, SamplingParams(max_tokens=4), 0, 3, 0.0, 0.0)
    assert caught.value.retryable
    mismatch = _Completion(())
    with pytest.raises(BackendError, match="2 completion tokens but 1 log-probabilities"):
        mismatch.add({"token_ids": [1, 2], "logprobs": {"content": [{"logprob": -1.0}]}, "finish_reason": "stop"})


def test_error_bodies_of_both_planes_are_read() -> None:
    assert error_detail({"code": 6, "message": "already exists", "details": []}) == ("", "already exists")
    inference = {"error": {"code": "DEPLOYMENT_SCALING_UP", "message": "scaling", "type": "x"}}
    assert error_detail(inference) == ("DEPLOYMENT_SCALING_UP", "scaling")
    assert error_detail("plain text") == ("", "plain text") and error_detail(None) == ("", "")

    class Status503(Exception):
        status_code = 503

        def __init__(self, body: object) -> None:
            super().__init__("503")
            self.body = body

    assert is_scaling_up(Status503(inference))
    assert not is_scaling_up(Status503({"error": {"code": "OVERLOADED", "message": "busy"}}))


async def test_the_proxy_serves_and_captures_through_the_fireworks_backend(backend: FireworksBackend) -> None:
    """The real openai SDK -> the proxy app (in-process ASGI) -> the Fireworks backend -> the double."""
    import asyncio

    import httpx
    import openai

    from openclaw_cli.proxy.app import create_app
    from openclaw_cli.testing.fake_backend import MemorySink

    sink = MemorySink()
    app = create_app(backend, sink, backend.settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
        client = openai.AsyncOpenAI(base_url="http://proxy/v1", api_key="unused", http_client=http)
        messages = [{"role": "user", "content": "Hello there"}]
        stream = await client.chat.completions.create(
            model="openclaw-policy", messages=messages, max_tokens=6, seed=2, stream=True
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        for _ in range(100):
            if sink.exchanges:
                break
            await asyncio.sleep(0.02)
    (captured,) = sink.exchanges
    assert captured.prompt_tokens == backend.tokenizer().render(messages)
    assert len(captured.completion_tokens) == len(captured.logprobs) >= 1 and captured.version == 0
    assert streamed == backend.tokenizer().decode(captured.completion_tokens)
