"""The Fireworks step-wise backend driven through the real ``fireworks.training.sdk`` against its HTTP test double
(openclaw_cli/testing/fireworks_training_double.py), which trains and samples the tiny model with real math.

What matters here: the datums on the wire carry exactly the sampler's tokens, log-probabilities and advantages;
served log-probabilities are the policy's raw ones; publishing swaps serving without a gap while requests already
running finish on the old sampler; futures really go through the SDK's try_again poll loop; failures come back as
BackendErrors whose ``retryable`` flag and message say what to do.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
from backend_helpers import running

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.fireworks.stepwise import FireworksStepwiseBackend, training_base_url
from openclaw_cli.settings import FireworksSettings, LocalSettings, LoraSettings, Settings
from openclaw_cli.testing.fireworks_training_double import FireworksTrainingDouble
from openclaw_cli.types import AdamParams, Datum, SamplingParams, TokenChunk, datum_from_completion

pytestmark = pytest.mark.timeout(120)

BASE_MODEL = "accounts/fireworks/models/tiny-test"
PPO_CONFIG = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}


@pytest.fixture(scope="module")
def double(tiny_model_dir: Path) -> Iterator[FireworksTrainingDouble]:
    with FireworksTrainingDouble(tiny_model_dir, base_model=BASE_MODEL, try_again_polls=2) as running:
        yield running


def make_settings(model_dir: Path, double: FireworksTrainingDouble, tmp: Path, **fireworks: object) -> Settings:
    section = {"api_key": double.api_key, "base_url": double.url, "base_model": BASE_MODEL, **fireworks}
    return Settings(
        backend="fireworks",
        model=str(model_dir),
        lora=LoraSettings(rank=4, alpha=8),
        local=LocalSettings(state_dir=tmp / "ckpt", seed=0),
        fireworks=FireworksSettings(**section),
    )


@pytest.fixture
async def backend(
    tiny_model_dir: Path, double: FireworksTrainingDouble, tmp_path: Path
) -> AsyncIterator[FireworksStepwiseBackend]:
    async with running(FireworksStepwiseBackend(make_settings(tiny_model_dir, double, tmp_path))) as started:
        yield started


def prompt_for(backend: FireworksStepwiseBackend, text: str = "Say hello politely.") -> list[int]:
    return backend.tokenizer().render([{"role": "user", "content": text}])


async def sampled_datum(backend: FireworksStepwiseBackend) -> Datum:
    """A two-token reply of the policy as a datum with advantage 1."""
    prompt = prompt_for(backend)
    result = await backend.sample(prompt, SamplingParams(max_tokens=2, seed=1))
    return datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=1.0)


def f32(values: list[float]) -> list[float]:
    """What a float list becomes on the wire (the SDK sends float32 tensors)."""
    return [float(v) for v in np.asarray(values, dtype=np.float32)]


async def train_one_step(backend: FireworksStepwiseBackend, prompt: list[int], lr: float = 0.05) -> None:
    result = await backend.sample(prompt, SamplingParams(max_tokens=4, seed=3))
    datum = datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=1.0)
    await backend.forward_backward([datum], "ppo", PPO_CONFIG)
    await backend.optim_step(AdamParams(learning_rate=lr))


def test_training_endpoint_follows_the_base_url() -> None:
    def url(**fw: object) -> str:
        return training_base_url(Settings(fireworks=FireworksSettings(**fw)))

    assert url() == "https://api.fireworks.ai/training/v1/serverless"
    assert url(base_url="http://127.0.0.1:9/") == "http://127.0.0.1:9/training/v1/serverless"
    assert url(base_url="https://api.fireworks.ai/inference/v1") == "https://api.fireworks.ai/training/v1/serverless"
    assert url(base_url="http://x", training_base_url="http://y/t/") == "http://y/t"


async def test_datums_on_the_wire_carry_the_sampler_tokens_logprobs_and_advantages(
    backend: FireworksStepwiseBackend, double: FireworksTrainingDouble
) -> None:
    prompt = prompt_for(backend)
    result = await backend.sample(prompt, SamplingParams(max_tokens=5, temperature=0.7, seed=11))
    n = len(result.tokens)
    assert result.version == 0 and n == 5 and len(result.logprobs) == n

    # The served log-probabilities are the policy's raw ones (temperature 1), not the tempered sampling ones:
    # they equal the base model's teacher-forced scores of the same tokens.
    scored = await backend.compute_logprobs(prompt + result.tokens, base=True)
    assert scored[0] is None and len(scored) == len(prompt) + n
    assert result.logprobs == pytest.approx(scored[len(prompt) :], abs=1e-4)

    advantages = [1.0, -0.5, 2.0, 0.25, -1.5]
    datum = datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=advantages)
    out = await backend.forward_backward([datum], "ppo", PPO_CONFIG)

    body = double.bodies("/api/v1/forward_backward")[-1]
    spec = body["forward_backward_input"]
    assert spec["loss_fn"] == "ppo" and spec["loss_fn_config"] == PPO_CONFIG
    (wire,) = spec["data"]
    assert [chunk["tokens"] for chunk in wire["model_input"]["chunks"]] == [prompt + result.tokens[:-1]]
    inputs = wire["loss_fn_inputs"]
    pad = [0.0] * (len(prompt) - 1)
    assert inputs["target_tokens"]["data"] == [0] * (len(prompt) - 1) + result.tokens
    assert inputs["target_tokens"]["dtype"] == "int64"
    assert inputs["logprobs"]["data"] == f32(pad + result.logprobs)
    assert inputs["advantages"]["data"] == f32(pad + advantages)
    assert body["model_id"] == double.run().model_id

    # On-policy, every ratio is 1 and nothing is clipped: the summed PPO loss is -sum(A) (hand computation).
    assert out.loss == pytest.approx(-sum(advantages), abs=1e-3)
    assert len(out.logprobs) == 1 and out.logprobs[0][len(prompt) - 1 :] == pytest.approx(result.logprobs, abs=1e-4)


async def test_futures_are_polled_through_try_again(
    backend: FireworksStepwiseBackend, double: FireworksTrainingDouble
) -> None:
    await train_one_step(backend, prompt_for(backend))
    for path in ("/api/v1/forward_backward", "/api/v1/optim_step"):
        (record,) = [f for f in double.futures(path) if f.future.done()][-1:]
        # The double answered try_again to the first two polls; the SDK kept polling until the result came.
        assert record.try_again >= 2 and record.polls == record.try_again + 1
        polled = [b["request_id"] for b in double.bodies("/api/v1/retrieve_future")]
        assert polled.count(record.request_id) == record.polls


async def test_publish_swaps_serving_without_a_gap(
    backend: FireworksStepwiseBackend, double: FireworksTrainingDouble
) -> None:
    prompt = prompt_for(backend)
    await train_one_step(backend, prompt)
    before = len(double.bodies("/inference/v1/completions"))

    # A slow request starts on version 0 and is still running when the new version goes live.
    gate = double.hold_next_completion()
    slow = asyncio.create_task(backend.sample(prompt, SamplingParams(max_tokens=3, seed=5)))
    while len(double.bodies("/inference/v1/completions")) == before:
        await asyncio.sleep(0.01)

    # Meanwhile requests keep being answered while the new sampler is saved and opened.
    publish = asyncio.create_task(backend.publish("step-1"))
    served_during: list[int] = []
    while not publish.done():
        served_during.append((await backend.sample(prompt, SamplingParams(max_tokens=1, seed=1))).version)
    info = await publish
    assert info.version == 1 and backend.current_version().version == 1
    assert served_during and set(served_during) <= {0, 1}
    assert served_during == sorted(served_during)  # never back to the old version once the new one serves

    assert not slow.done()  # still generating on the old sampler
    after = await backend.sample(prompt, SamplingParams(max_tokens=2, seed=2))
    assert after.version == 1
    gate.set()
    old = await slow
    assert old.version == 0

    # The new version is the saved sampler checkpoint, served through its own model name.
    saved = double.futures("/api/v1/save_weights_for_sampler")[-1].future.result()["path"]
    assert double.served_version(saved) == 1
    models = [b["model"] for b in double.bodies("/inference/v1/completions")[before:]]
    assert models[0].endswith(f"/trainingSamplers/{BASE_MODEL}") and models[-1].endswith(f"/checkpoints/{saved}")


async def test_streaming_yields_the_sampled_tokens_then_the_result(backend: FireworksStepwiseBackend) -> None:
    prompt = prompt_for(backend)
    events = [e async for e in backend.stream(prompt, SamplingParams(max_tokens=4, seed=7))]
    *chunks, result = events
    assert all(isinstance(c, TokenChunk) for c in chunks)
    assert [c.token_id for c in chunks] == result.tokens and [c.logprob for c in chunks] == result.logprobs
    assert "".join(c.text for c in chunks) == result.text


async def test_checkpoint_round_trip_resumes_weights_and_version(
    tiny_model_dir: Path, double: FireworksTrainingDouble, tmp_path: Path
) -> None:
    settings = make_settings(tiny_model_dir, double, tmp_path)
    first = FireworksStepwiseBackend(settings)
    await first.start()
    prompt = prompt_for(first)
    await train_one_step(first, prompt, lr=0.2)
    await first.publish("step-1")
    probe = prompt + [int(t) for t in first.tokenizer().encode(" hello there")]
    trained = await first.compute_logprobs(probe)
    base = await first.compute_logprobs(probe, base=True)
    assert trained != pytest.approx(base, abs=1e-3)
    path = await first.save_state("step-00000001")
    await first.close()

    record = json.loads((Path(path) / "openclaw-state.json").read_text())
    assert record["backend"] == "fireworks" and record["version"] == 1 and record["weights_are_version"]
    assert record["service_path"].endswith("/step-00000001")

    second = FireworksStepwiseBackend(settings)
    await second.start()
    try:
        info = await second.load_state(path)
        assert info.version == 1 and second.current_version().version == 1
        assert await second.compute_logprobs(probe) == pytest.approx(trained, abs=1e-4)
    finally:
        await second.close()
    # The resumed run was created with our LoRA settings (rank AND alpha), then loaded with its optimizer.
    lora_configs = [b["lora_config"] for b in double.bodies("/api/v1/create_model")[-2:]]
    assert [(c["rank"], c["alpha"]) for c in lora_configs] == [(4, 8), (4, 8)]
    assert double.bodies("/api/v1/load_weights")[-1]["optimizer"] is True


# -- failures ------------------------------------------------------------------------------------------------------


async def test_a_rejected_key_is_a_permanent_error_naming_the_key(
    tiny_model_dir: Path, double: FireworksTrainingDouble, tmp_path: Path
) -> None:
    settings = make_settings(tiny_model_dir, double, tmp_path, api_key="fw-wrong-key")
    backend = FireworksStepwiseBackend(settings)
    with pytest.raises(BackendError) as caught:
        await backend.start()
    assert caught.value.status_code == 401 and not caught.value.retryable
    assert "FIREWORKS_API_KEY" in str(caught.value) and "fw-wrong-key" not in str(caught.value)


async def test_a_missing_key_or_base_model_is_a_clear_error(
    tiny_model_dir: Path, double: FireworksTrainingDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)
    no_key = make_settings(tiny_model_dir, double, tmp_path, api_key=None)
    with pytest.raises(BackendError, match="FIREWORKS_API_KEY"):
        await FireworksStepwiseBackend(no_key).start()
    no_base = make_settings(tiny_model_dir, double, tmp_path, base_model=None)
    with pytest.raises(BackendError, match=r"fireworks\.base_model"):
        await FireworksStepwiseBackend(no_base).start()


async def test_an_account_without_the_preview_is_pointed_at_batch_mode(
    tiny_model_dir: Path, double: FireworksTrainingDouble, tmp_path: Path
) -> None:
    double.fail("/api/v1/create_session", 403, "training sessions are not enabled for this account")
    backend = FireworksStepwiseBackend(make_settings(tiny_model_dir, double, tmp_path))
    with pytest.raises(BackendError) as caught:
        await backend.start()
    assert not caught.value.retryable and 'fireworks.mode = "batch"' in str(caught.value)


@pytest.mark.parametrize("refusal", ["http-404", "failed-future"])
async def test_a_refused_training_run_is_pointed_at_batch_mode(
    backend: FireworksStepwiseBackend, double: FireworksTrainingDouble, refusal: str
) -> None:
    datum = await sampled_datum(backend)
    # The run opens on first training use.
    if refusal == "http-404":
        double.fail("/api/v1/create_model", 404, "not found")
    else:
        double.fail_next_job("/api/v1/create_model", "LoRA training is not available for this account")
    with pytest.raises(BackendError) as caught:
        await backend.forward_backward([datum], "ppo", PPO_CONFIG)
    assert not caught.value.retryable and 'fireworks.mode = "batch"' in str(caught.value)
    await backend.forward_backward([datum], "ppo", PPO_CONFIG)  # opening is tried again on the next use


async def test_a_rejected_request_is_a_permanent_400(
    backend: FireworksStepwiseBackend, double: FireworksTrainingDouble
) -> None:
    datum = await sampled_datum(backend)
    await backend.forward_backward([datum], "ppo", PPO_CONFIG)  # the run exists

    # The service accepts the request but its future fails as the caller's fault (its message quoting the key,
    # which must not reach our logs).
    double.fail_next_job("/api/v1/forward_backward", f"ids outside the vocabulary (key {double.api_key})")
    with pytest.raises(BackendError) as caught:
        await backend.forward_backward([datum], "ppo", PPO_CONFIG)
    assert caught.value.status_code == 400 and not caught.value.retryable
    assert "outside the vocabulary" in str(caught.value) and double.api_key not in str(caught.value)
    await backend.forward_backward([datum], "ppo", PPO_CONFIG)  # a failed future leaves the run usable

    # An HTTP 400 on the request itself: permanent, and the SDK refuses further work on that run.
    double.fail("/api/v1/forward_backward", 400, "malformed request")
    with pytest.raises(BackendError) as caught:
        await backend.forward_backward([datum], "ppo", PPO_CONFIG)
    assert caught.value.status_code == 400 and not caught.value.retryable
    with pytest.raises(BackendError) as caught:
        await backend.optim_step(AdamParams())
    assert not caught.value.retryable and "restart openclaw" in str(caught.value)


async def test_a_server_side_failure_is_retryable(
    backend: FireworksStepwiseBackend, double: FireworksTrainingDouble
) -> None:
    datum = await sampled_datum(backend)
    double.fail_next_job("/api/v1/forward_backward", "trainer preempted", category="server")
    with pytest.raises(BackendError) as caught:
        await backend.forward_backward([datum], "ppo", PPO_CONFIG)
    assert caught.value.retryable and "trainer preempted" in str(caught.value)

    # A 503 while polling a future is the SDK's to retry: the call still succeeds.
    double.fail("/api/v1/retrieve_future", 503, "overloaded", times=2)
    out = await backend.forward_backward([datum], "ppo", PPO_CONFIG)
    assert out.loss == pytest.approx(-sum(datum.loss_fn_inputs["advantages"]), abs=1e-3)  # -1 per reply token


async def test_service_unavailable_at_start_is_retryable(
    tiny_model_dir: Path, double: FireworksTrainingDouble, tmp_path: Path
) -> None:
    from fireworks.training.sdk import FiretitanServiceClient

    def no_http_retries(api_key: str, base_url: str) -> FiretitanServiceClient:
        return FiretitanServiceClient(api_key=api_key, base_url=base_url, max_retries=0)

    settings = make_settings(tiny_model_dir, double, tmp_path)
    backend = FireworksStepwiseBackend(settings, service_client_factory=no_http_retries)
    backend.retry_delays_s = ()  # surface the first failure instead of retrying the open
    double.fail("/api/v1/create_session", 503, "service unavailable")
    with pytest.raises(BackendError) as caught:
        await backend.start()
    assert caught.value.retryable and "503" in str(caught.value)

    # The same start succeeds once the service is back.
    await backend.start()
    try:
        assert backend.current_version().version == 0
    finally:
        await backend.close()
    assert double.deleted_sessions  # close released the serverless session
