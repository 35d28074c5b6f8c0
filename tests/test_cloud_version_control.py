"""Rollback and the promotion gate on the cloud backends: ``stage`` / ``activate`` / ``servable_versions`` on the
Tinker-shaped core (against the Tinker double and the Fireworks step-wise training double) and on Fireworks batch
mode (against the Fireworks HTTP double), plus the facade's delegation and the store's strict JSON for a NaN loss.

What matters: a rollback switches serving at once while requests already running finish on their version;
``train_from`` really puts the trainer back on that version's weights (re-publishing without training serves the
same log-probabilities as that version did); a version whose training state was not saved is refused with a 409
before anything switches; the serving version is never evicted; the gate promotes or holds a candidate by what a
scripted judge says about the replies of the two real versions.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from openclaw_cli.backend import BackendError, supports_version_control
from openclaw_cli.backends.fireworks import FireworksBackend
from openclaw_cli.backends.fireworks.batch import FireworksBatchBackend
from openclaw_cli.backends.fireworks.stepwise import FireworksStepwiseBackend
from openclaw_cli.backends.tinker import TinkerBackend
from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.promotion import PromotionGate
from openclaw_cli.settings import FireworksSettings, LocalSettings, LoraSettings, Settings
from openclaw_cli.store import Store
from openclaw_cli.testing.fireworks_double import FireworksDouble, double_settings
from openclaw_cli.testing.fireworks_training_double import FireworksTrainingDouble
from openclaw_cli.testing.store_turns import captured_exchange
from openclaw_cli.testing.tinker_double import TinkerDouble, status_error
from openclaw_cli.types import AdamParams, Datum, SamplingParams, datum_from_completion

pytestmark = pytest.mark.timeout(180)

KEY = "tml-test-key-0123456789"
PPO = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
QUESTION = "Say hello politely."
FW_BASE_MODEL = "accounts/fireworks/models/tiny-test"


# -- Tinker ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tinker(tiny_tinker_double: TinkerDouble) -> TinkerDouble:
    return tiny_tinker_double


@pytest.fixture(autouse=True)
def fresh_tinker(request: pytest.FixtureRequest) -> Iterator[None]:
    if "tinker" not in request.fixturenames:
        yield
        return
    double: TinkerDouble = request.getfixturevalue("tinker")
    double.reset()
    yield
    double.reset()


def tinker_settings(model_dir: Path, tmp_path: Path, *, keep: int = 3, **train: Any) -> Settings:
    return Settings(
        backend="tinker",
        model=str(model_dir),
        lora={"rank": 4},
        train={"gate_sessions": 2, "gate_max_tokens": 6, **train},
        tinker={"api_key": KEY, "keep_versions": keep},
        local={"state_dir": str(tmp_path / "ckpt")},
    )


@pytest.fixture
async def backend(tinker: TinkerDouble, tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[TinkerBackend]:
    built = TinkerBackend(tinker_settings(tiny_model_dir, tmp_path), service_client_factory=tinker.service_client)
    built.retry_delays_s = (0.0, 0.0)
    await built.start()
    yield built
    await built.close()


def prompt_of(backend: Any, text: str = QUESTION) -> list[int]:
    return backend.tokenizer().render([{"role": "user", "content": text}])


async def train_step(backend: Any, lr: float = 0.2, seed: int = 3) -> None:
    prompt = prompt_of(backend)
    result = await backend.sample(prompt, SamplingParams(max_tokens=4, seed=seed))
    datum = datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=1.0)
    await backend.forward_backward([datum], "ppo", PPO)
    await backend.optim_step(AdamParams(learning_rate=lr))


def probe_of(backend: Any) -> list[int]:
    return prompt_of(backend) + [int(t) for t in backend.tokenizer().encode(" hello there friend")]


async def test_tinker_stage_keeps_serving_and_activate_switches_at_once_while_requests_finish_on_theirs(
    backend: TinkerBackend, tinker: TinkerDouble
) -> None:
    assert supports_version_control(backend)
    prompt = prompt_of(backend)
    await train_step(backend)
    staged = await backend.stage("candidate")
    assert staged.version == 1 and backend.current_version().version == 0  # staged, not serving
    assert backend.servable_versions() == [0, 1]
    assert (await backend.sample(prompt, SamplingParams(max_tokens=2, seed=1), version=1)).version == 1
    assert (await backend.sample(prompt, SamplingParams(max_tokens=2, seed=1))).version == 0

    tinker.hold("sample")
    slow = asyncio.create_task(backend.sample(prompt, SamplingParams(max_tokens=3, seed=5)))
    while tinker.waiting("sample") == 0:
        await asyncio.sleep(0.01)
    info = await backend.activate(1)  # the promotion: no trainer involvement, no waiting
    assert info.version == 1 and backend.current_version().version == 1
    tinker.release("sample")
    assert (await slow).version == 0  # it started on version 0 and finished there
    assert (await backend.sample(prompt, SamplingParams(max_tokens=2, seed=1))).version == 1
    assert tinker.calls("load_state_with_optimizer") == []  # promoting restores nothing

    with pytest.raises(BackendError, match="version 7 is not servable; servable versions: 0, 1") as caught:
        await backend.activate(7, train_from=True)
    assert caught.value.status_code == 400


async def test_tinker_rollback_with_train_from_restores_that_versions_weights(
    backend: TinkerBackend, tinker: TinkerDouble
) -> None:
    probe = probe_of(backend)
    base = await backend.compute_logprobs(probe, base=True)
    await train_step(backend, seed=3)
    assert (await backend.publish("step-1")).version == 1
    v1 = await backend.compute_logprobs(probe)
    await train_step(backend, seed=4)
    await train_step(backend, seed=5)
    assert (await backend.publish("step-3")).version == 2
    v2 = await backend.compute_logprobs(probe)
    assert v1 != pytest.approx(base, abs=1e-3) and v2 != pytest.approx(v1, abs=1e-3)
    # Each publish saved the training state beside the sampler snapshot; the fresh run saved version 0's.
    names = [c.args["name"] for c in tinker.calls("save_state")]
    assert names == ["openclaw-v0-train", "openclaw-v1-train", "openclaw-v2-train"]

    info = await backend.activate(1, train_from=True)
    assert info.version == 1 and backend.current_version().version == 1
    assert await backend.compute_logprobs(probe) == pytest.approx(v1, abs=1e-5)  # serving: v1's sampler
    restored = tinker.calls("load_state_with_optimizer")  # loaded into the same training run, in place
    assert [c.args["path"].rsplit("/", 1)[-1] for c in restored] == ["openclaw-v1-train"]
    assert tinker.calls("create_training_client_from_state_with_optimizer") == []
    # The trainer holds v1's weights now: publishing without training serves v1's log-probabilities again.
    again = await backend.publish("after-rollback")
    assert again.version == 3
    assert await backend.compute_logprobs(probe) == pytest.approx(v1, abs=1e-4)
    # A checkpoint taken now records that its weights are exactly the serving version.
    record = json.loads((Path(await backend.save_state("ckpt-a")) / "openclaw-state.json").read_text())
    assert (record["version"], record["weights_are_version"]) == (3, True)

    # Back to the base model: training restarts from the fresh (no-op) adapter's saved state.
    assert (await backend.activate(0, train_from=True)).version == 0
    assert (await backend.publish("from-base")).version == 4
    assert await backend.compute_logprobs(probe) == pytest.approx(base, abs=1e-4)


async def test_tinker_a_version_without_its_training_state_is_refused_with_409_and_nothing_switches(
    backend: TinkerBackend, tinker: TinkerDouble
) -> None:
    await train_step(backend)
    tinker.fail_next("save_state", status_error(500, "disk full"))
    assert (await backend.publish("no-state")).version == 1  # serving the new version matters more
    await train_step(backend, seed=4)
    assert (await backend.publish("with-state")).version == 2
    with pytest.raises(BackendError, match="version 1 can serve but cannot be trained from") as caught:
        await backend.activate(1, train_from=True)
    assert caught.value.status_code == 409
    assert backend.current_version().version == 2  # refused before switching anything
    assert tinker.calls("load_state_with_optimizer") == []
    assert (await backend.activate(1)).version == 1  # serving alone can still switch (the promotion path)


async def test_tinker_the_serving_version_is_never_evicted(
    tinker: TinkerDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = TinkerBackend(
        tinker_settings(tiny_model_dir, tmp_path, keep=2), service_client_factory=tinker.service_client
    )
    await backend.start()
    try:
        for _ in range(2):
            await backend.publish()
        await backend.activate(1, train_from=True)
        assert backend.servable_versions() == [0, 1, 2]
        await backend.stage()  # v3: two published kept, never the serving v1 -> v2 goes
        assert backend.servable_versions() == [0, 1, 3] and backend.current_version().version == 1
        await backend.stage()  # v4: v3 goes
        assert backend.servable_versions() == [0, 1, 4] and backend.current_version().version == 1
        with pytest.raises(BackendError, match="servable versions: 0, 1, 4"):
            await backend.activate(2)
        await backend.activate(4, train_from=True)  # the trainer holds v4's weights already: nothing to restore
        assert len(tinker.calls("load_state_with_optimizer")) == 1
        assert backend.current_version().version == 4 and backend.servable_versions() == [0, 1, 4]
    finally:
        await backend.close()


# -- the promotion gate on a real (Tinker-shaped) backend ------------------------------------------------------------


def exchange(session: str) -> CapturedExchange:
    messages = [{"role": "user", "content": QUESTION}]
    return captured_exchange(session, messages, prompt_tokens=[11, 12, 13], completion_tokens=[5, 6, 7])


class ReplyJudge:
    """Scripted judge: knows the served version's greedy reply and prefers the other one (the candidate's) or it."""

    name = "reply-judge"

    def __init__(self, served_reply: str, *, prefer_candidate: bool) -> None:
        self.served_reply = served_reply
        self.prefer_candidate = prefer_candidate
        self.pairs = 0

    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        text = messages[-1]["content"]
        if "\nReply 1:\n" not in text:
            return "Fine. \\boxed{1}"
        self.pairs += 1
        first, second = text.split("\nReply 1:\n", 1)[1].split("\n\nReply 2:\n", 1)
        served_position = 1 if first == self.served_reply else 2 if second == self.served_reply else 0
        if served_position == 0 or first == second:
            return "\\boxed{0}"
        winner = 3 - served_position if self.prefer_candidate else served_position
        return f"\\boxed{{{winner}}}"


@pytest.mark.parametrize("prefer_candidate", [True, False])
async def test_tinker_promotion_gate_promotes_or_holds_by_the_judged_replies(
    tinker: TinkerDouble, tiny_model_dir: Path, tmp_path: Path, prefer_candidate: bool
) -> None:
    settings = tinker_settings(tiny_model_dir, tmp_path, promotion_gate=True)
    backend = TinkerBackend(settings, service_client_factory=tinker.service_client)
    await backend.start()
    store = Store(tmp_path / "store.sqlite3")
    try:
        capture = SessionCapture(store, settings)
        for n in range(3):
            capture.record_sync(exchange(f"s{n}"))
            capture.end_session_sync(f"s{n}")
        greedy = SamplingParams(max_tokens=settings.train.gate_max_tokens, temperature=0.0, seed=settings.local.seed)
        served_reply = (await backend.sample(prompt_of(backend), greedy)).text
        for seed in range(3):  # enough training that the greedy reply changes
            await train_step(backend, lr=0.5, seed=seed)
        judge = ReplyJudge(served_reply, prefer_candidate=prefer_candidate)
        gate = PromotionGate(store, backend, judge, settings)
        outcome = await gate.publish("step-00000001")
        decision = gate.decisions[-1]
        assert (decision.candidate, decision.served, decision.n, decision.pairs_judged) == (1, 0, 2, 2)
        assert judge.pairs == 2
        if prefer_candidate:
            assert decision.promoted and decision.win_rate == 1.0
            assert outcome.version == 1 and backend.current_version().version == 1
        else:
            assert not decision.promoted and decision.win_rate == 0.0
            assert outcome.version == 0 and backend.current_version().version == 0
            assert backend.servable_versions() == [0, 1]  # held back, still servable by pin
        assert tinker.calls("load_state_with_optimizer") == []  # the trainer is untouched
    finally:
        store.close()
        await backend.close()


# -- Fireworks step-wise (the same core over the real training SDK and its HTTP double) ------------------------------


@pytest.fixture(scope="module")
def fw_training(tiny_model_dir: Path) -> Iterator[FireworksTrainingDouble]:
    with FireworksTrainingDouble(tiny_model_dir, base_model=FW_BASE_MODEL, try_again_polls=1) as running:
        yield running


async def test_fireworks_stepwise_rollback_switches_at_once_and_restores_the_trainer(
    tiny_model_dir: Path, fw_training: FireworksTrainingDouble, tmp_path: Path
) -> None:
    section = {"api_key": fw_training.api_key, "base_url": fw_training.url, "base_model": FW_BASE_MODEL}
    settings = Settings(
        backend="fireworks",
        model=str(tiny_model_dir),
        lora=LoraSettings(rank=4, alpha=8),
        local=LocalSettings(state_dir=tmp_path / "ckpt", seed=0),
        fireworks=FireworksSettings(**section),
    )
    facade = FireworksBackend(settings)
    await facade.start()
    backend = facade.impl
    assert isinstance(backend, FireworksStepwiseBackend) and supports_version_control(facade)
    try:
        probe, prompt = probe_of(backend), prompt_of(backend)
        await train_step(backend)
        assert (await facade.publish("step-1")).version == 1
        v1 = await backend.compute_logprobs(probe)
        await train_step(backend, seed=4)
        assert (await facade.stage("step-2")).version == 2
        assert facade.current_version().version == 1 and facade.servable_versions() == [0, 1, 2]
        assert (await facade.activate(2)).version == 2

        gate = fw_training.hold_next_completion()
        before = len(fw_training.bodies("/inference/v1/completions"))
        slow = asyncio.create_task(backend.sample(prompt, SamplingParams(max_tokens=3, seed=5)))
        while len(fw_training.bodies("/inference/v1/completions")) == before:
            await asyncio.sleep(0.01)
        info = await facade.activate(1, train_from=True)
        assert info.version == 1 and facade.current_version().version == 1
        assert not slow.done()
        gate.set()
        assert (await slow).version == 2  # finished on the version it started with

        assert await backend.compute_logprobs(probe) == pytest.approx(v1, abs=1e-5)
        assert (await facade.publish("after-rollback")).version == 3
        assert await backend.compute_logprobs(probe) == pytest.approx(v1, abs=1e-4)
        assert fw_training.bodies("/api/v1/load_weights")[-1]["optimizer"] is True
    finally:
        await facade.close()


# -- Fireworks batch mode ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fw(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FireworksDouble]:
    with FireworksDouble(tiny_model_dir, work_dir=tmp_path_factory.mktemp("fw-vc")) as running:
        yield running


async def positive_datums(backend: FireworksBackend, tag: str) -> list[Datum]:
    datums = []
    for i in range(3):
        prompt = backend.tokenizer().render([{"role": "user", "content": f"{tag} question {i}?"}])
        reply = await backend.sample(prompt, SamplingParams(max_tokens=4, seed=10 + i))
        datums.append(datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0))
    return datums


async def one_job(backend: FireworksBackend, tag: str) -> None:
    await backend.forward_backward(await positive_datums(backend, tag), "ppo", PPO)
    step = await backend.optim_step(AdamParams())
    assert step.metrics["job_ran"] == 1.0


def job_bodies(double: FireworksDouble) -> list[dict[str, Any]]:
    with double.lock:
        return [job.body for job in double.jobs.values()]


async def test_fireworks_batch_multi_lora_stages_activates_and_warm_starts_from_the_rolled_back_version(
    fw: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    fw.add_deployment("vc-multi")
    settings = double_settings(fw, tiny_model_dir, tmp_path, deployment="vc-multi", sft_learning_rate=0.05)
    backend = FireworksBackend(settings)
    await backend.start()
    try:
        assert supports_version_control(backend)
        impl = backend.impl
        assert isinstance(impl, FireworksBatchBackend)
        await one_job(backend, "a")
        assert (await backend.publish("step-1")).version == 1
        v1_model = impl.sampler.versions.current().lora_model
        await one_job(backend, "b")
        staged = await backend.stage("step-2")
        assert staged.version == 2 and backend.current_version().version == 1
        assert backend.servable_versions() == [0, 1, 2]
        prompt = backend.tokenizer().render([{"role": "user", "content": "pinned?"}])
        assert (await backend.sample(prompt, SamplingParams(max_tokens=2), version=2)).version == 2
        assert (await backend.sample(prompt, SamplingParams(max_tokens=2))).version == 1
        assert (await backend.activate(2)).version == 2  # promoted
        v2_model = impl.sampler.versions.current().lora_model
        assert job_bodies(fw)[-1].get("warmStartFrom") == v1_model

        rolled = await backend.activate(1, train_from=True)
        assert rolled.version == 1 and backend.current_version().version == 1
        assert (await backend.sample(prompt, SamplingParams(max_tokens=2))).version == 1
        state = json.loads((Path(settings.fireworks.state_dir) / "batch-state.json").read_text())
        assert (state["version"], state["lora_model"], state["last_model"]) == (1, v1_model, v1_model)
        await one_job(backend, "c")
        assert job_bodies(fw)[-1].get("warmStartFrom") == v1_model  # not v2's model: the chain was rolled back
        assert v2_model != v1_model
        assert (await backend.publish("step-3")).version == 3

        await backend.activate(0, train_from=True)
        await one_job(backend, "d")
        last = job_bodies(fw)[-1]
        assert not last.get("warmStartFrom") and last.get("baseModel")  # back to the base model
    finally:
        await backend.close()


async def test_fireworks_batch_hot_reload_serves_only_its_current_version(
    fw: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    fw.add_deployment("vc-hot", addons=False, hot_reload=True)
    settings = double_settings(
        fw, tiny_model_dir, tmp_path, deployment="vc-hot", addon_mode="hot_reload", sft_learning_rate=0.05
    )
    backend = FireworksBackend(settings)
    await backend.start()
    try:
        await one_job(backend, "h")
        with pytest.raises(BackendError, match="cannot be staged") as staged:
            await backend.stage("step-1")
        assert staged.value.status_code == 409
        assert (await backend.publish("step-1")).version == 1
        assert backend.servable_versions() == [1]
        with pytest.raises(BackendError, match="hot-reload deployment holds only its current LoRA") as caught:
            await backend.activate(0, train_from=True)
        assert caught.value.status_code == 409 and backend.current_version().version == 1
        assert (await backend.activate(1)).version == 1
    finally:
        await backend.close()

    gated = settings.model_copy(update={"train": settings.train.model_copy(update={"promotion_gate": True})})
    with pytest.raises(BackendError, match=r"promotion_gate needs fireworks\.addon_mode = 'multi_lora'"):
        await FireworksBackend(gated).start()


def test_fireworks_facade_diagnose_includes_the_stepwise_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIREWORKS_API_KEY", "fw-diag-secret")
    settings = Settings(backend="fireworks", fireworks={"base_url": "https://fw.example", "base_model": FW_BASE_MODEL})
    checks = {c.name: c for c in FireworksBackend.diagnose(settings)}
    assert checks["stepwise base model"].ok and checks["stepwise base model"].detail == FW_BASE_MODEL
    assert checks["stepwise training endpoint"].detail.startswith("https://fw.example")
    batch = {c.name for c in FireworksBackend.diagnose(Settings(fireworks={"mode": "batch"}))}
    assert not any(name.startswith("stepwise ") for name in batch)
    gated = Settings(train={"promotion_gate": True}, fireworks={"mode": "batch", "addon_mode": "hot_reload"})
    assert not {c.name: c for c in FireworksBackend.diagnose(gated)}["promotion gate"].ok


# -- strict JSON in the store ---------------------------------------------------------------------------------------


def test_a_nan_loss_is_stored_as_null_in_strict_json(tmp_path: Path) -> None:
    store = Store(tmp_path / "store.sqlite3")
    try:
        store.commit_step(1, 0, {"loss": float("nan"), "grad_norm": 0.5, "series": [1.0, float("inf")]}, "t", {})
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "store.sqlite3") as db:
        (text,) = db.execute("SELECT metrics FROM steps WHERE step = 1").fetchone()

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    assert json.loads(text, parse_constant=refuse) == {"loss": None, "grad_norm": 0.5, "series": [1.0, None]}
