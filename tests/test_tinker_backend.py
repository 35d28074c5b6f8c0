"""The Tinker backend against the Tinker test double (real ``tinker.types``, local tiny-model math): the datums the
service receives, sampling and stop strings, publishing without a serving gap, version pinning, error mapping,
checkpoints, dropping pending gradients, back-to-back submission and the readiness checks. No network."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
from backend_helpers import wait_until
from tinker.types import RequestErrorCategory

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.tinker import SUPPORTED_MODELS, TinkerBackend, model_check
from openclaw_cli.backends.tinker_shaped import TinkerShapedSdk
from openclaw_cli.backends.tinker_wire import sdk_datum
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.trainer_loop import TrainerLoop
from openclaw_cli.proxy.errors import from_backend_error
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.testing.store_turns import captured_exchange
from openclaw_cli.testing.tinker_double import TinkerDouble, status_error, timeout_error
from openclaw_cli.types import AdamParams, SamplingParams, TokenChunk, datum_from_completion

pytestmark = pytest.mark.timeout(120)

KEY = "tml-test-key-0123456789"
ADAM = AdamParams(learning_rate=5e-2)
PPO = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}


@pytest.fixture(scope="module")
def double(tiny_tinker_double: TinkerDouble) -> TinkerDouble:
    return tiny_tinker_double


@pytest.fixture(autouse=True)
def fresh_double(double: TinkerDouble) -> Iterator[None]:
    double.reset()
    yield
    double.reset()


def tinker_settings(model_dir: Path, tmp_path: Path, **train: Any) -> Settings:
    return Settings(
        backend="tinker",
        model=str(model_dir),
        method="rl",
        lora={"rank": 4},
        train={"batch_size": 2, **train},
        tinker={"api_key": KEY, "keep_versions": 2},
        local={"state_dir": str(tmp_path / "ckpt")},
        store={"path": str(tmp_path / "store.sqlite3")},
    )


async def started(double: TinkerDouble, settings: Settings) -> TinkerBackend:
    backend = TinkerBackend(settings, service_client_factory=double.service_client)
    backend.retry_delays_s = (0.0, 0.0)
    await backend.start()
    return backend


@pytest.fixture
async def backend(double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path) -> Any:
    built = await started(double, tinker_settings(tiny_model_dir, tmp_path))
    yield built
    await built.close()


def prompt_of(backend: TinkerBackend, text: str) -> list[int]:
    return backend.tokenizer().render([{"role": "user", "content": text}])


async def train_one_step(backend: TinkerBackend, prompt: list[int], seed: int = 0) -> None:
    reply = await backend.sample(prompt, SamplingParams(max_tokens=4, seed=seed))
    datum = datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0)
    await backend.forward_backward([datum], "ppo", PPO)
    await backend.optim_step(ADAM)


# ---------------------------------------------------------------------------------------------------------------
# what the service receives


async def test_trainer_datums_carry_the_stored_tokens_logprobs_and_advantages(
    double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # No loop probe: the tiny model's greedy replies loop, and the probe's samples would join the judged two.
    settings = tinker_settings(tiny_model_dir, tmp_path, loop_probes=0)
    backend = await started(double, settings)
    store = Store(settings.store.path)
    try:
        capture = SessionCapture(store, settings)
        turn_ids, scores = [], [1, -1]
        for i, score in enumerate(scores):
            messages = [{"role": "user", "content": f"question {i}"}]
            prompt = backend.tokenizer().render(messages)
            reply = await backend.sample(prompt, SamplingParams(max_tokens=3 + i, seed=i))
            turn = capture.record_sync(exchange(f"s{i}", messages, prompt, reply.tokens, reply.logprobs))
            capture.end_session_sync(f"s{i}")
            store.complete("judge", turn.turn_id, json.dumps({"score": score, "votes": [score]}), reward=score)
            turn_ids.append(turn.turn_id)
            stored = store.get_turn(turn.turn_id)
            assert stored is not None and (stored.completion_tokens, stored.logprobs) == (reply.tokens, reply.logprobs)

        report = await TrainerLoop(store, backend, settings).run_once()
        assert report is not None and report.trained_turn_ids == turn_ids and report.version == 1

        (call,) = double.calls("forward_backward")
        assert call.args["loss_fn"] == "ppo"
        assert call.args["loss_fn_config"] == pytest.approx(PPO)
        for sent, turn_id, score in zip(call.args["data"], turn_ids, scores, strict=True):
            stored = store.get_turn(turn_id)
            assert stored is not None
            p, c, lp = stored.prompt_tokens, stored.completion_tokens, stored.logprobs
            pad = len(p) - 1
            advantage = score / (len(c) * 2)  # the token mean per sample, averaged over the 2 samples
            expected = tinker.Datum(
                model_input=tinker.ModelInput.from_ints(p + c[:-1]),
                loss_fn_inputs={
                    "target_tokens": [0] * pad + c,
                    "logprobs": [0.0] * pad + lp,
                    "advantages": [0.0] * pad + [advantage] * len(c),
                },
            )
            assert isinstance(sent, tinker.Datum)
            assert sent.model_input.to_ints() == expected.model_input.to_ints()
            assert set(sent.loss_fn_inputs) == set(expected.loss_fn_inputs)
            for key, want in expected.loss_fn_inputs.items():
                got = sent.loss_fn_inputs[key]
                assert got.dtype == want.dtype and got.shape == [len(p) + len(c) - 1]
                assert np.array_equal(got.to_numpy(), want.to_numpy()), key
        assert [c.args["adam_params"].learning_rate for c in double.calls("optim_step")] == [settings.train.lr]
        assert backend.current_version().version == 1
    finally:
        store.close()
        await backend.close()


def exchange(session: str, messages: list[dict[str, Any]], prompt: list[int], tokens: list[int], logprobs: list[float]):
    return captured_exchange(session, messages, prompt_tokens=prompt, completion_tokens=tokens, logprobs=logprobs)


async def test_weights_are_folded_into_advantages_and_cross_entropy_sends_weights(
    double: TinkerDouble, backend: TinkerBackend
) -> None:
    datum = datum_from_completion([5, 6], [7, 8, 9], logprobs=[-1.0, -2.0, -3.0], advantages=2.0, weights=[1, 0, 0.5])
    await backend.forward_backward([datum], "importance_sampling")
    await backend.forward_backward([datum], "cross_entropy")
    rl, ce = (c.args["data"][0].loss_fn_inputs for c in double.calls("forward_backward"))
    assert set(rl) == {"target_tokens", "logprobs", "advantages"}
    assert rl["advantages"].tolist() == [0.0, 2.0, 0.0, 1.0]  # w * A: the same loss, without a weights input
    assert set(ce) == {"target_tokens", "weights"} and ce["weights"].tolist() == [0.0, 1.0, 0.0, 0.5]
    assert [c.args["loss_fn_config"] for c in double.calls("forward_backward")] == [None, None]
    with pytest.raises(BackendError, match="unknown key"):
        await backend.forward_backward([datum], "ppo", {"clip": 0.2})


async def test_sampling_returns_the_services_tokens_and_sends_eos_stops(
    double: TinkerDouble, backend: TinkerBackend
) -> None:
    prompt = prompt_of(backend, "Hello there")
    result = await backend.sample(prompt, SamplingParams(max_tokens=6, temperature=0.7, seed=3))
    (call,) = double.calls("sample")
    params = call.args["sampling_params"]
    assert isinstance(params, tinker.SamplingParams)
    assert (params.max_tokens, params.seed, params.temperature) == (6, 3, 0.7)
    assert list(params.stop) == sorted(backend.tokenizer().eos_token_ids)
    assert call.args["prompt"] == prompt
    assert result.version == 0 and result.prompt_tokens == len(prompt) and 1 <= len(result.tokens) <= 6
    assert len(result.logprobs) == len(result.tokens) and all(v < 0 for v in result.logprobs)
    # The logprobs are the policy's own: teacher-forced scoring of the same tokens gives the same numbers.
    scored = await backend.compute_logprobs(prompt + result.tokens)
    assert scored[len(prompt) :] == pytest.approx(result.logprobs, abs=1e-5)
    tail = await backend.compute_logprobs(prompt + result.tokens, start=len(prompt))  # the service scores all
    assert tail[: len(prompt)] == [None] * len(prompt) and tail[len(prompt) :] == scored[len(prompt) :]


async def test_a_stop_string_cuts_tokens_logprobs_and_text_after_sampling(backend: TinkerBackend) -> None:
    prompt = prompt_of(backend, "Tell me something about Tokyo.")
    params = SamplingParams(max_tokens=12, seed=7)
    full = await backend.sample(prompt, params)
    decode = backend.tokenizer().decode
    assert len(full.text) >= 4, full
    stop = full.text[2:4]
    cut = await backend.sample(prompt, SamplingParams(**{**params.__dict__, "stop": (stop,)}))
    keep = next(k for k in range(1, len(full.tokens) + 1) if stop in decode(full.tokens[:k]))  # linear scan
    assert cut.tokens == full.tokens[:keep] and cut.logprobs == full.logprobs[:keep]
    assert cut.text == full.text[: full.text.index(stop)]
    assert (cut.finish_reason, cut.stop_sequence) == ("stop", stop)


async def test_stream_yields_the_whole_completion_after_sampling(backend: TinkerBackend) -> None:
    prompt = prompt_of(backend, "Say hello politely.")
    events = [e async for e in backend.stream(prompt, SamplingParams(max_tokens=6, seed=1))]
    *chunks, result = events
    assert all(isinstance(c, TokenChunk) for c in chunks)
    assert [c.token_id for c in chunks] == result.tokens and [c.logprob for c in chunks] == result.logprobs
    assert [c.text for c in chunks[:-1]] == [""] * (len(chunks) - 1) and chunks[-1].text == result.text
    again = await backend.sample(prompt, SamplingParams(max_tokens=6, seed=1))
    assert (again.tokens, again.text, again.finish_reason) == (result.tokens, result.text, result.finish_reason)


# ---------------------------------------------------------------------------------------------------------------
# publishing and versions


async def test_publish_never_pauses_serving_and_requests_finish_on_their_version(
    double: TinkerDouble, backend: TinkerBackend
) -> None:
    prompt = prompt_of(backend, "What is the capital of France?")
    params = SamplingParams(max_tokens=5, seed=11)
    base = await backend.sample(prompt, params)
    await train_one_step(backend, prompt)

    # While the snapshot is being made, requests are served by the old version without waiting.
    double.hold("save_weights_and_get_sampling_client")
    publishing = asyncio.create_task(backend.publish("first"))
    await wait_until(lambda: double.waiting("save_weights_and_get_sampling_client") == 1)
    during = await asyncio.wait_for(backend.sample(prompt, params), timeout=20)
    assert during.version == 0 and during.logprobs == base.logprobs and not publishing.done()
    double.release("save_weights_and_get_sampling_client")
    assert (await publishing).version == 1 and backend.current_version().version == 1
    v1 = await backend.sample(prompt, params)
    assert v1.version == 1 and v1.logprobs != base.logprobs

    # A request that started on version 1 finishes on it although version 2 became current meanwhile.
    await train_one_step(backend, prompt, seed=1)
    double.hold("sample")
    in_flight = asyncio.create_task(backend.sample(prompt, params))
    await wait_until(lambda: double.waiting("sample") == 1)
    assert (await backend.publish()).version == 2
    double.release("sample")
    finished = await in_flight
    assert finished.version == 1 and finished.logprobs == v1.logprobs
    v2 = await backend.sample(prompt, params)
    assert v2.version == 2 and v2.logprobs != v1.logprobs

    # keep_versions = 2: pinned sampling of recent versions works; an evicted one is a clear 400.
    assert (await backend.sample(prompt, params, version=1)).logprobs == v1.logprobs
    assert (await backend.sample(prompt, params, version=0)).logprobs == base.logprobs
    await backend.publish()
    assert backend.servable_versions() == [0, 2, 3]
    with pytest.raises(BackendError, match="servable versions: 0, 2, 3") as info:
        await backend.sample(prompt, params, version=1)
    assert info.value.status_code == 400


async def test_teacher_logprobs_come_from_the_frozen_base_model(backend: TinkerBackend) -> None:
    prompt = prompt_of(backend, "How do I add two numbers in Python?")
    tokens = prompt + (await backend.sample(prompt, SamplingParams(max_tokens=4, seed=2))).tokens
    before = await backend.compute_logprobs(tokens)
    assert before[0] is None and len(before) == len(tokens)
    await train_one_step(backend, prompt)
    await backend.publish()
    assert await backend.compute_logprobs(tokens, base=True) == before
    assert await backend.compute_logprobs(tokens) != before


# ---------------------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("error", "retryable", "status_code", "words"),
    [
        (status_error(401), False, None, "rejected the API key while sampling (401); check TINKER_API_KEY"),
        (status_error(402, "billing not set up"), False, None, "billing/quota"),
        (status_error(429, "too many requests"), True, None, "rate-limiting or at capacity (429)"),
        (status_error(503, "no capacity"), True, None, "(503)"),
        (timeout_error(), True, None, "did not answer in time"),
        (status_error(400, "prompt is too long"), False, 400, "prompt is too long"),
        (tinker.RequestFailedError("bad input", "req-1", RequestErrorCategory.User), False, 400, "bad input"),
        (tinker.RequestFailedError("oom", "req-2", RequestErrorCategory.Server), True, None, "oom"),
    ],
)
async def test_service_errors_become_one_line_backend_errors(
    double: TinkerDouble, backend: TinkerBackend, error: Exception, retryable: bool, status_code: int | None, words: str
) -> None:
    double.fail_next("sample", error)
    with pytest.raises(BackendError) as info:
        await backend.sample(prompt_of(backend, "hi"), SamplingParams(max_tokens=2))
    assert words in str(info.value) and "\n" not in str(info.value)
    assert (info.value.retryable, info.value.status_code) == (retryable, status_code)
    proxied = from_backend_error(info.value, retry_after_s=2)
    if retryable:
        assert (proxied.status, proxied.retry_after_s) == (503, 2)
    # The next request is served normally: one failure does not break the client.
    assert (await backend.sample(prompt_of(backend, "hi"), SamplingParams(max_tokens=2))).tokens


async def test_the_api_key_never_appears_in_an_error(double: TinkerDouble, backend: TinkerBackend) -> None:
    double.fail_next("compute_logprobs", status_error(403, f"key {KEY} has no access to this project"))
    with pytest.raises(BackendError) as info:
        await backend.compute_logprobs(prompt_of(backend, "hi"))
    assert KEY not in str(info.value) and "****" in str(info.value) and "check TINKER_API_KEY" in str(info.value)
    assert double.api_keys == [KEY]  # the key reached the service client, and only there


async def test_start_retries_capacity_errors_and_fails_clearly_on_auth(
    double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = tinker_settings(tiny_model_dir, tmp_path)
    double.fail_next("create_sampling_client", status_error(503, "warming up"), times=2)
    backend = await started(double, settings)
    assert len(double.calls("create_sampling_client")) == 3 and backend.current_version().version == 0
    await backend.close()

    double.fail_next("create_sampling_client", status_error(401), times=5)
    with pytest.raises(BackendError, match="check TINKER_API_KEY") as info:
        await started(double, settings)
    assert not info.value.retryable
    assert len(double.calls("create_sampling_client")) == 4  # 3 before + 1: an auth error is not retried

    other = Settings(backend="tinker", model="Qwen/Qwen3-8B", local={"state_dir": str(tmp_path)})
    with pytest.raises(BackendError, match="cannot load the tokenizer of Qwen/Qwen3-8B"):
        await TinkerBackend(other, service_client_factory=double.service_client).start()  # offline in tests


# ---------------------------------------------------------------------------------------------------------------
# training: checkpoints, pending gradients, back-to-back submission


async def test_save_state_and_load_state_round_trip_weights_optimizer_and_version(
    double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = tinker_settings(tiny_model_dir, tmp_path)
    original = await started(double, settings)
    prompt = prompt_of(original, "Please answer briefly.")
    params = SamplingParams(max_tokens=4, seed=5)
    await train_one_step(original, prompt)
    await original.publish("step-00000001")
    served = await original.sample(prompt, params)
    path = await original.save_state("step-00000001")
    record = json.loads((Path(path) / "openclaw-state.json").read_text())
    assert Path(path) == tmp_path / "ckpt" / "step-00000001"
    assert record["backend"] == "tinker" and record["service_path"].endswith("/weights/step-00000001")
    assert (record["version"], record["version_name"], record["trainer_step"]) == (1, "step-00000001", 1)

    resumed = await started(double, settings)
    info = await resumed.load_state(path)
    assert (info.version, info.name) == (1, "step-00000001") and resumed.current_version().version == 1
    assert [c.args["path"] for c in double.calls("create_training_client_from_state_with_optimizer")] == [
        record["service_path"]
    ]
    assert (await resumed.sample(prompt, params)).logprobs == served.logprobs

    # The optimizer state came back too: one more identical step lands on identical weights in both.
    datum = datum_from_completion(prompt, served.tokens, logprobs=served.logprobs, advantages=-1.0)
    for backend in (original, resumed):
        await backend.forward_backward([datum], "ppo", PPO)
        assert (await backend.optim_step(ADAM)).step == 2
        await backend.publish()
    a, b = (await original.sample(prompt, params)), (await resumed.sample(prompt, params))
    assert a.logprobs == b.logprobs and a.version == b.version == 2
    await original.close()
    await resumed.close()


async def test_load_state_refuses_another_backends_checkpoint(backend: TinkerBackend, tmp_path: Path) -> None:
    local = tmp_path / "ckpt" / "step-00000003"
    local.mkdir(parents=True)
    (local / "openclaw-state.json").write_text(json.dumps({"version": 3, "trainer_step": 3}))
    with pytest.raises(BackendError, match="written by the local backend, not tinker"):
        await backend.load_state(str(local))


async def test_a_checkpoint_before_any_training_creates_no_training_run(
    double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = tinker_settings(tiny_model_dir, tmp_path)
    backend = await started(double, settings)
    path = await backend.save_state("step-00000000")
    assert double.calls("create_lora_training_client") == [] and double.calls("save_state") == []
    resumed = await started(double, settings)
    assert (await resumed.load_state(path)).version == 0
    assert double.calls("create_lora_training_client") == []
    await backend.close()
    await resumed.close()


async def test_discard_gradients_drops_what_a_failed_step_left_behind(
    double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = tinker_settings(tiny_model_dir, tmp_path)
    failing, control = await started(double, settings), await started(double, settings)
    prompt = prompt_of(failing, "What is 2 + 3 * 4?")
    reply = await failing.sample(prompt, SamplingParams(max_tokens=4, seed=9))
    datum = datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0)

    await failing.discard_gradients()  # nothing pending: nothing happens on the service
    assert double.calls("save_state") == []
    await failing.forward_backward([datum], "ppo", PPO)
    double.fail_next("optim_step", status_error(503, "node lost"))
    with pytest.raises(BackendError) as info:
        await failing.optim_step(ADAM)
    assert info.value.retryable
    await failing.discard_gradients()
    assert [c.args["name"] for c in double.calls("save_state")] == ["openclaw-v0-train", "openclaw-discard-0-1"]
    assert len(double.calls("create_training_client_from_state_with_optimizer")) == 1

    for backend in (failing, control):  # the retried step equals a step that never failed
        await backend.forward_backward([datum], "ppo", PPO)
        await backend.optim_step(ADAM)
        await backend.publish()
    params = SamplingParams(max_tokens=4, seed=9)
    assert (await failing.sample(prompt, params)).logprobs == (await control.sample(prompt, params)).logprobs
    await failing.close()
    await control.close()


async def test_forward_backward_and_step_are_submitted_back_to_back(
    double: TinkerDouble, backend: TinkerBackend
) -> None:
    prompt = prompt_of(backend, "Hello")
    reply = await backend.sample(prompt, SamplingParams(max_tokens=3, seed=4))
    datum = datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0)
    double.hold("forward_backward")
    both = asyncio.create_task(backend.forward_backward_and_step([datum], "ppo", PPO, ADAM))
    await wait_until(lambda: double.waiting("forward_backward") == 1)
    assert len(double.calls("optim_step")) == 1  # submitted while forward_backward is still running
    double.release("forward_backward")
    fb, step = await both
    assert step.step == 1 and "grad_norm" in step.metrics
    assert fb.metrics["n_tokens"] == len(reply.tokens) and fb.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert fb.loss == pytest.approx(-len(reply.tokens), abs=1e-3)  # -sum(r * A) with r = 1, A = 1 on-policy
    assert len(fb.logprobs) == 1 and len(fb.logprobs[0]) == len(datum.model_input)


# ---------------------------------------------------------------------------------------------------------------
# readiness checks


def test_diagnose_reports_sdk_key_and_model_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    monkeypatch.delenv("TINKER_BASE_URL", raising=False)

    def no_network(**_: Any) -> Any:
        raise AssertionError("diagnose went online without being asked")

    checks = {c.name: c for c in TinkerBackend.diagnose(Settings(backend="tinker"), rest_client_factory=no_network)}
    assert checks["sdk installed"].ok and checks["sdk installed"].detail.startswith("tinker 0.")
    assert not checks["api key"].ok and checks["api key"].detail == "set TINKER_API_KEY or tinker.api_key"
    assert not checks["model"].ok and "Qwen/Qwen3-4B-Instruct-2507" in checks["model"].detail

    monkeypatch.setenv("TINKER_API_KEY", KEY)
    settings = Settings(backend="tinker", model="Qwen/Qwen3-4B-Instruct-2507")
    checks = {c.name: c for c in TinkerBackend.diagnose(settings, rest_client_factory=no_network)}
    assert checks["api key"].ok and checks["api key"].detail == "from TINKER_API_KEY"
    assert checks["model"].ok and "service" not in checks
    assert all(KEY not in c.detail for c in checks.values())

    assert "Qwen/Qwen3-4B-Instruct-2507" in SUPPORTED_MODELS
    assert model_check("Qwen/Qwen3.5-27B").ok and "Qwen3.5 family" in model_check("Qwen/Qwen3.5-27B").detail
    assert not model_check("mistralai/Mistral-7B-Instruct-v0.3").ok


def test_diagnose_online_asks_the_service(double: TinkerDouble, tiny_model_dir: Path) -> None:
    offered = Settings(backend="tinker", model=double.model_name, tinker={"api_key": KEY})
    checks = {c.name: c for c in TinkerBackend.diagnose(offered, online=True, rest_client_factory=double.rest_client)}
    assert checks["service"].ok and checks["service"].detail.startswith(f"the service offers {double.model_name}")
    assert double.api_keys == [KEY]

    missing = Settings(backend="tinker", model="Qwen/Qwen3-8B", tinker={"api_key": KEY})
    checks = {c.name: c for c in TinkerBackend.diagnose(missing, online=True, rest_client_factory=double.rest_client)}
    assert not checks["service"].ok and "does not offer Qwen/Qwen3-8B" in checks["service"].detail

    double.fail_next("get_server_capabilities", status_error(401))
    checks = {c.name: c for c in TinkerBackend.diagnose(offered, online=True, rest_client_factory=double.rest_client)}
    assert not checks["service"].ok and "check TINKER_API_KEY" in checks["service"].detail


# ---------------------------------------------------------------------------------------------------------------
# reuse by other Tinker-shaped SDKs


class NamedSnapshotBackend(TinkerBackend):
    """The Tinker binding publishing the way SDKs without save_weights_and_get_sampling_client must (Fireworks)."""

    def make_sdk(self) -> TinkerShapedSdk:
        return dataclasses.replace(super().make_sdk(), publish_mode="save_weights_for_sampler")


async def test_publish_by_named_sampler_weights(double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path) -> None:
    backend = NamedSnapshotBackend(
        tinker_settings(tiny_model_dir, tmp_path), service_client_factory=double.service_client
    )
    await backend.start()
    prompt = prompt_of(backend, "Hello")
    await train_one_step(backend, prompt)
    assert (await backend.publish()).version == 1
    (saved,) = double.calls("save_weights_for_sampler")
    assert saved.args == {"name": "openclaw-v1"} and double.calls("save_weights_and_get_sampling_client") == []
    opened = [c.args["model_path"] for c in double.calls("create_sampling_client")]
    assert opened[-1].endswith("/sampler_weights/openclaw-v1")
    assert (await backend.sample(prompt, SamplingParams(max_tokens=3, seed=0))).version == 1
    await backend.close()


def test_datum_conversion_builds_fireworks_sdk_types_too() -> None:
    fireworks_types = pytest.importorskip("fireworks.training.sdk").types
    datum = datum_from_completion([5, 6, 7], [8, 9], logprobs=[-0.5, -0.25], advantages=[0.5, -1.0])
    sent = sdk_datum(fireworks_types, datum, "ppo")
    assert isinstance(sent, fireworks_types.Datum)
    assert sent.model_input.to_ints() == [5, 6, 7, 8]
    assert sent.loss_fn_inputs["target_tokens"].tolist() == [0, 0, 8, 9]
    assert sent.loss_fn_inputs["logprobs"].tolist() == [0.0, 0.0, -0.5, -0.25]
    assert sent.loss_fn_inputs["advantages"].tolist() == [0.0, 0.0, 0.5, -1.0]


async def test_each_owner_gets_a_training_run_of_their_own(
    double: TinkerDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """lora.scope = owner on Tinker: a LoRA training run per owner on the same base; each numbers its own versions,
    serves the base until its first publish, and checkpoints under its own directory."""
    from openclaw_cli.adapters import adapter_state_dir
    from openclaw_cli.backend import BackendError
    from openclaw_cli.types import AdamParams, SamplingParams, datum_from_completion

    alice, bob = "key:00000000000000aa", "key:00000000000000bb"
    backend = await started(double, tinker_settings(tiny_model_dir, tmp_path))
    try:
        a, b = backend.adapter(alice), backend.adapter(bob)
        assert backend.adapter(alice) is a and backend.adapter("shared") is backend
        prompt = prompt_of(backend, "What is the capital of France?")
        greedy = SamplingParams(max_tokens=6, temperature=0.0)
        base_reply = (await b.sample(prompt, greedy)).tokens
        reply = await a.sample(prompt, SamplingParams(max_tokens=6, temperature=1.0, seed=1))
        datum = datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0)
        await a.forward_backward([datum], "importance_sampling")
        await a.optim_step(AdamParams(learning_rate=0.5))
        assert (await a.publish()).version == 1
        assert b.current_version().version == backend.current_version().version == 0
        assert b.servable_versions() == [0] and a.servable_versions() == [0, 1]
        assert (await b.sample(prompt, greedy)).tokens == base_reply
        with pytest.raises(BackendError, match="version 1 is not servable"):
            await b.sample(prompt, greedy, version=1)
        path = await a.save_state("step-00000001")
        assert Path(path).parent == adapter_state_dir(backend.settings, alice)
        with pytest.raises(BackendError, match=f"adapter {alice}'s checkpoint, not shared's"):
            await backend.load_state(path)
        assert len(double.calls("create_lora_training_client")) == 1  # bob never trained: no run of his yet
    finally:
        await backend.close()
