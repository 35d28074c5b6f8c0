"""Fireworks batch mode through the real fireworks-ai SDK against the local HTTP double: judged samples become an SFT
job whose LoRA really trains (tiny model), is loaded onto the deployment and then served — with no serving gap —
plus the trainer-loop integration, restarts, failures, caps, hot reload and the mode switch."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from openclaw_cli.backend import BackendError, NotYetAvailable
from openclaw_cli.backends.fireworks import FireworksBackend
from openclaw_cli.backends.fireworks.batch import FireworksBatchBackend, default_deployment_id, sft_row, split_datum
from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.trainer_loop import TrainerLoop
from openclaw_cli.settings import Settings, TrainSettings
from openclaw_cli.store import Store
from openclaw_cli.testing.fireworks_double import BASE_MODEL, FireworksDouble, double_settings
from openclaw_cli.testing.store_turns import captured_exchange
from openclaw_cli.types import AdamParams, Datum, ParsedAssistant, SamplingParams, ToolCall, datum_from_completion

pytestmark = pytest.mark.timeout(180)

LR = 0.05  # large enough that 3 epochs visibly move the tiny model


@pytest.fixture(scope="module")
def double(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with FireworksDouble(tiny_model_dir, work_dir=tmp_path_factory.mktemp("fw-double")) as fw:
        yield fw


async def started(settings: Settings) -> FireworksBackend:
    backend = FireworksBackend(settings)
    await backend.start()
    return backend


@contextlib.asynccontextmanager
async def deployed(
    double: FireworksDouble, model_dir: Path, tmp_path: Path, name: str, **overrides: Any
) -> AsyncIterator[FireworksBackend]:
    """A started backend on a new deployment ``name`` of the double, closed after."""
    double.add_deployment(name)
    backend = await started(double_settings(double, model_dir, tmp_path, deployment=name, **overrides))
    try:
        yield backend
    finally:
        await backend.close()


def batch_impl(backend: FireworksBackend) -> FireworksBatchBackend:
    assert isinstance(backend.impl, FireworksBatchBackend)
    return backend.impl


async def judged_datums(backend: FireworksBackend, questions: list[str], reward: float = 1.0) -> list[Datum]:
    """Serve one reply per question through the backend (as the proxy does) and score it ``reward``."""
    tokenizer = backend.tokenizer()
    datums = []
    for i, question in enumerate(questions):
        prompt = tokenizer.render([{"role": "user", "content": question}])
        reply = await backend.sample(prompt, SamplingParams(max_tokens=5, seed=100 + i))
        per_token = reward / len(reply.tokens)
        datums.append(datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=per_token))
    return datums


def mean_completion_logprob(scored: list[float | None], n_completion: int) -> float:
    tail = [v for v in scored[-n_completion:] if v is not None]
    return sum(tail) / len(tail)


# -- the headline ---------------------------------------------------------------------------------------------------


async def test_new_lora_reaches_serving_after_n_samples_without_a_serving_gap(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    settings = double_settings(
        double, tiny_model_dir, tmp_path, deployment="gapless", sft_learning_rate=LR, sft_epochs=3
    )
    double.add_deployment("gapless")
    backend = await started(settings)
    try:
        probe = backend.tokenizer().render([{"role": "user", "content": "Are you still there?"}])
        served: list[tuple[float, int]] = []  # (finish time, version) of every probe request
        stop = asyncio.Event()

        async def client() -> None:
            while not stop.is_set():  # any failed request raises here and fails the test
                reply = await backend.sample(probe, SamplingParams(max_tokens=3, seed=1))
                served.append((time.monotonic(), reply.version))

        task = asyncio.create_task(client())
        datums = await judged_datums(backend, ["Hello!", "What is 2 + 3?", "Name a capital city."])
        negative = await judged_datums(backend, ["Tell me a joke."], reward=-1.0)

        fb = await backend.forward_backward(datums[:2] + negative, "ppo", {"clip_low_threshold": 0.8})
        assert math.isnan(fb.loss) and fb.logprobs == [[], [], []]
        assert (fb.metrics["queued"], fb.metrics["skipped_not_positive"], fb.metrics["pending"]) == (2, 1, 2)
        step = await backend.optim_step(AdamParams(learning_rate=1e-4))
        assert step.step == 0 and step.metrics == {"job_ran": 0.0, "queued_samples": 2.0}  # fewer than N = 3
        assert (await backend.publish("step-00000001")).version == 0  # nothing new: serving stays

        await backend.forward_backward(datums[2:], "ppo")
        cycle_start = time.monotonic()
        step = await backend.optim_step(AdamParams(learning_rate=1e-4))
        cycle_end = time.monotonic()
        assert step.step == 1 and step.metrics["job_ran"] == 1.0 and step.metrics["job_samples"] == 3.0
        assert step.metrics["learning_rate"] == LR
        info = await backend.publish("step-00000002")
        assert (info.version, info.name) == (1, "step-00000002")
        published_at = time.monotonic()
        deadline = time.monotonic() + 30
        while sum(1 for t, _ in served if t > published_at) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await task

        versions = [v for _, v in served]
        during_cycle = [v for t, v in served if cycle_start < t < cycle_end]
        assert len(during_cycle) >= 3 and set(during_cycle) == {0}  # served by the old model the whole time
        assert versions == sorted(versions) and versions[-1] == 1  # once switched, never back
        assert sum(1 for v in versions if v == 1) >= 3

        # The job trained on the 3 positive replies (as Fireworks sees them: the chat re-rendered from messages);
        # each is now more likely under the served LoRA than under the base model.
        lora_model = batch_impl(backend).sampler.versions.current().lora_model
        assert double.served_version_of(f"{lora_model}#accounts/test-account/deployments/gapless") > 0
        rows = double.datasets[job_id_of(backend)].private["rows"]
        for prompt, reply in double.training_pairs(rows):
            before = mean_completion_logprob(await backend.compute_logprobs(prompt + reply, base=True), len(reply))
            after = mean_completion_logprob(await backend.compute_logprobs(prompt + reply), len(reply))
            assert after > before + 0.1, (before, after)

        # What went to Fireworks: one dataset of 3 chat rows, one SFT job from the base model, one LoRA load.
        job = double.jobs[job_id_of(backend)]
        assert job.body["baseModel"] == BASE_MODEL and "warmStartFrom" not in job.body
        assert (job.body["epochs"], job.body["learningRate"], job.body["loraRank"]) == (3, LR, 8)
        assert [row["messages"][0]["content"] for row in rows] == ["Hello!", "What is 2 + 3?", "Name a capital city."]
        assert all(row["messages"][-1]["weight"] == 1 and row["messages"][-1]["role"] == "assistant" for row in rows)
        assert batch_impl(backend).pending_samples == 0
    finally:
        await backend.close()


def job_id_of(backend: FireworksBackend) -> str:
    impl = batch_impl(backend)
    return impl.sampler.versions.current().lora_model.rsplit("/", 1)[-1]


# -- the trainer loop, restarts, checkpoints ------------------------------------------------------------------------


def exchange(session: str, messages: list[dict[str, Any]], prompt: list[int], reply: Any) -> CapturedExchange:
    return captured_exchange(
        session,
        messages,
        prompt_tokens=prompt,
        completion_tokens=reply.tokens,
        logprobs=reply.logprobs,
        version=reply.version,
        finish_reason=reply.finish_reason,
        reply=reply.text,
    )


async def test_trainer_loop_trains_in_batches_and_a_restart_resumes_the_chain(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    double.add_deployment("looped")
    settings = double_settings(
        double, tiny_model_dir, tmp_path, deployment="looped", sft_learning_rate=LR, keep_versions=1
    )
    settings = settings.model_copy(update={"train": TrainSettings(batch_size=2), "method": "rl"})
    store = Store(tmp_path / "store.sqlite3")
    capture = SessionCapture(store, settings)
    backend = await started(settings)
    loop = TrainerLoop(store, backend, settings)
    count = 0

    async def judged_turn(score: int) -> None:
        nonlocal count
        count += 1
        session, messages = f"s{count}", [{"role": "user", "content": f"question number {count}"}]
        prompt = backend.tokenizer().render(messages)
        reply = await backend.sample(prompt, SamplingParams(max_tokens=4, seed=count))
        turn = capture.record_sync(exchange(session, messages, prompt, reply))
        capture.end_session_sync(session)
        store.complete("judge", turn.turn_id, json.dumps({"score": score, "votes": [score]}), reward=score)

    try:
        for score in (1, 1):
            await judged_turn(score)
        first = await loop.run_once()
        assert first is not None and (first.step, first.version) == (1, 0)  # 2 queued < N = 3: no job yet
        assert first.metrics["backend_step"] == 0 and first.metrics["tokens"] > 0
        for score in (1, -1):
            await judged_turn(score)
        second = await loop.run_once()
        assert second is not None and (second.step, second.version) == (2, 1)  # 3 positives -> job -> served
        assert backend.current_version().version == 1
        first_lora = batch_impl(backend).sampler.versions.current().lora_model
        for score in (1, 1, 1, 1):
            await judged_turn(score)
        assert (await loop.run_once()).version == 1  # type: ignore[union-attr]  # 2 queued: no job yet
        fourth = await loop.run_once()
        assert fourth is not None and (fourth.step, fourth.version) == (4, 2)
        impl = batch_impl(backend)
        last_job = double.jobs[job_id_of(backend)].body
        assert last_job["warmStartFrom"] == first_lora and "baseModel" not in last_job  # the chain continues
        # keep_versions = 1: the first LoRA was unloaded from the deployment once the second was published.
        assert impl.sampler.versions.servable() == [0, 2]
        assert double.count_calls("DELETE", f"/deployedModels/{first_lora.rsplit('/', 1)[-1]}-") == 1
        checkpoint = await loop.checkpoint()
        assert checkpoint is not None and checkpoint.endswith("step-00000004")
        state = json.loads((Path(checkpoint) / "openclaw-state.json").read_text())
        assert (state["backend"], state["mode"], state["version"], state["jobs_done"]) == ("fireworks", "batch", 2, 2)
    finally:
        await backend.close()

    # A restart: the new process serves the newest LoRA again under the same version and keeps the warm-start chain.
    again = await started(settings)
    try:
        assert again.current_version().version == 2
        impl = batch_impl(again)
        assert impl.sampler.versions.current().lora_model == state["lora_model"]
        assert impl._last_model == state["last_model"]
        reply = await again.sample(again.tokenizer().render([{"role": "user", "content": "hi"}]), SamplingParams(2))
        assert reply.version == 2
        loop2 = TrainerLoop(store, again, settings)
        assert await loop2.resume() == 4 and again.current_version().version == 2  # the checkpoint is not older
    finally:
        await again.close()
        store.close()


# -- an adapter per owner -------------------------------------------------------------------------------------------


async def test_each_owner_gets_an_sft_chain_and_loras_of_their_own_on_one_multi_lora_deployment(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """lora.scope = owner in batch mode: alice's judged replies become alice's SFT jobs (her first from the base
    model, her next warm-started from her own LoRA), served to her alone by its model name on the shared deployment;
    bob's first job starts from the base model, never from hers; each keeps its own versions; her queue and state
    live in her adapter's directory; a restart serves her LoRA to her again from her checkpoint."""
    from pydantic import SecretStr

    from openclaw_cli.adapters import adapter_state_dir
    from openclaw_cli.launch import require_adapter_support
    from openclaw_cli.lesson_prompt import key_owner

    alice_key, bob_key = "sk-alice-0123456789", "sk-bob-0123456789"
    alice, bob = key_owner(alice_key), key_owner(bob_key)
    double.add_deployment("owners")
    settings = double_settings(double, tiny_model_dir, tmp_path, deployment="owners", sft_learning_rate=LR)
    settings = settings.model_copy(update={"api_key": SecretStr(alice_key), "api_keys": [SecretStr(bob_key)]})
    backend = await started(settings)
    try:
        require_adapter_support(backend, settings)  # a multi-LoRA deployment serves owners apart
        hers, his = backend.adapter(alice), backend.adapter(bob)

        async def one_job(view: Any, words: list[str]) -> Any:
            datums = await judged_datums(view, words)
            await view.forward_backward(datums, "ppo")
            assert (await view.optim_step(AdamParams(learning_rate=1e-4))).metrics["job_ran"] == 1.0
            return await view.publish()

        assert (await one_job(hers, ["Hello!", "What is 2 + 3?", "Name a capital city."])).version == 1
        first_job = double.jobs[job_id_of_view(hers)].body
        assert first_job["baseModel"] == BASE_MODEL and "warmStartFrom" not in first_job
        her_first = hers.sampler.versions.current().lora_model
        assert (his.current_version().version, backend.current_version().version) == (0, 0)
        prompt = backend.tokenizer().render([{"role": "user", "content": "hi"}])
        before = len(double.completion_bodies)
        assert (await hers.sample(prompt, SamplingParams(max_tokens=2))).version == 1
        assert (await his.sample(prompt, SamplingParams(max_tokens=2))).version == 0
        her_request, his_request = (b["model"] for b in double.completion_bodies[before:])
        assert her_request.startswith(her_first + "#") and his_request.startswith(BASE_MODEL + "#")

        assert (await one_job(his, ["Tell me a joke.", "What is 4 + 4?", "Name a river."])).version == 1
        his_job = double.jobs[job_id_of_view(his)].body
        assert his_job["baseModel"] == BASE_MODEL and "warmStartFrom" not in his_job  # never from alice's LoRA
        assert (await one_job(hers, ["Good morning!", "What is 1 + 1?", "Name a colour."])).version == 2
        assert double.jobs[job_id_of_view(hers)].body["warmStartFrom"] == her_first
        assert his.current_version().version == 1 and hers.servable_versions() == [0, 1, 2]
        files = adapter_state_dir(settings, alice) / "fireworks"
        assert (files / "batch-state.json").is_file() and (files / "pending.jsonl").is_file()
        checkpoint = await hers.save_state("step-00000002")
        assert Path(checkpoint).parent == adapter_state_dir(settings, alice)
        her_lora = hers.sampler.versions.current().lora_model
    finally:
        await backend.close()

    again = await started(settings)
    try:
        hers = again.adapter(alice)
        assert hers.current_version().version == 0  # served again once her loop resumes from her checkpoint
        assert (await hers.load_state(checkpoint)).version == 2
        assert hers.sampler.versions.current().lora_model == her_lora
        assert again.adapter(bob).current_version().version == 0 and again.current_version().version == 0
    finally:
        await again.close()

    hot = double_settings(double, tiny_model_dir, tmp_path, deployment="owners-hot", addon_mode="hot_reload")
    hot = hot.model_copy(update={"api_key": SecretStr(alice_key), "api_keys": [SecretStr(bob_key)]})
    with pytest.raises(
        BackendError, match=r"hot-reload Fireworks deployment holds one LoRA for everyone.*'multi_lora'"
    ):
        require_adapter_support(FireworksBackend(hot), hot)


def job_id_of_view(view: FireworksBatchBackend) -> str:
    return view.sampler.versions.current().lora_model.rsplit("/", 1)[-1]


# -- failures and caps ----------------------------------------------------------------------------------------------


async def test_failed_job_keeps_the_samples_queued_and_a_retry_does_not_duplicate_them(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with deployed(double, tiny_model_dir, tmp_path, "retry") as backend:
        datums = await judged_datums(backend, ["one", "two", "three"])
        await backend.forward_backward(datums, "ppo")
        double.fail_next_job = True
        with pytest.raises(BackendError, match="ended in JOB_STATE_FAILED"):
            await backend.optim_step(AdamParams())
        assert backend.current_version().version == 0
        again = await backend.forward_backward(datums, "ppo")  # the trainer loop resubmits the same batch
        assert again.metrics["queued"] == 0 and batch_impl(backend).pending_samples == 3
        queued_file = tmp_path / "fireworks" / "pending.jsonl"
        assert len(queued_file.read_text().splitlines()) == 3
        step = await backend.optim_step(AdamParams())
        assert step.metrics["job_samples"] == 3.0 and (await backend.publish()).version == 1
        assert queued_file.read_text() == ""


async def test_daily_cap_refuses_the_job_and_keeps_the_samples(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with deployed(double, tiny_model_dir, tmp_path, "capped", max_steps_per_day=0) as backend:
        await backend.forward_backward(await judged_datums(backend, ["a", "b", "c"]), "ppo")
        jobs_before = len(double.jobs)
        with pytest.raises(BackendError, match="cost cap: 0 Fireworks training job") as caught:
            await backend.optim_step(AdamParams())
        assert caught.value.retryable and len(double.jobs) == jobs_before
        assert batch_impl(backend).pending_samples == 3
    # Queued samples survive a restart (they are on disk).
    restarted = await started(
        double_settings(double, tiny_model_dir, tmp_path, deployment="capped", max_steps_per_day=0)
    )
    try:
        assert batch_impl(restarted).pending_samples == 3
    finally:
        await restarted.close()


async def test_deployment_cap_of_zero_refuses_to_create_one(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = FireworksBackend(
        double_settings(
            double, tiny_model_dir, tmp_path, base_model="accounts/fireworks/models/other", max_deployments=0
        )
    )
    with pytest.raises(BackendError, match=r"cost cap: openclaw already created 0 Fireworks deployment"):
        await backend.start()
    assert "openclaw-other" not in double.deployments


# -- hot reload -----------------------------------------------------------------------------------------------------


async def test_hot_reload_replaces_the_merged_addon_and_serves_it_under_the_base_name(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    double.add_deployment("hot", addons=False, hot_reload=True)
    settings = double_settings(
        double, tiny_model_dir, tmp_path, deployment="hot", addon_mode="hot_reload", sft_learning_rate=LR
    )
    backend = await started(settings)
    try:
        datums = await judged_datums(backend, ["x?", "y?", "z?"])
        await backend.forward_backward(datums, "ppo")
        await backend.optim_step(AdamParams())
        assert double.count_calls("POST", "/deployedModels?replaceMergedAddon=true") >= 1
        info = await backend.publish("step-1")
        base_name = f"{BASE_MODEL}#accounts/test-account/deployments/hot"
        assert batch_impl(backend).sampler.versions.current().request_model == base_name
        assert double.served_version_of(base_name) > 0  # the base name now carries the merged LoRA
        reply = await backend.sample(backend.tokenizer().render([{"role": "user", "content": "q"}]), SamplingParams(2))
        assert reply.version == info.version == 1
        with pytest.raises(BackendError, match="version 0 is not servable; servable versions: 1"):
            await backend.compute_logprobs([1, 2, 3], base=True)
    finally:
        await backend.close()


# -- units ----------------------------------------------------------------------------------------------------------


def test_split_datum_finds_the_prompt_where_the_weighted_targets_begin() -> None:
    datum = datum_from_completion([5, 6, 7], [8, 9], logprobs=[-1.0, -2.0], advantages=[0.5, 0.25])
    split = split_datum(datum)
    assert split is not None
    assert (split.prompt, split.completion, split.signal) == ([5, 6, 7], [8, 9], 0.75)
    assert split_datum(datum_from_completion([5, 6], [8], weights=0.0)) is None
    assert split_datum(datum_from_completion([5], [8, 9])).signal is None  # type: ignore[union-attr]


def test_sft_row_trains_only_the_judged_reply() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Add 2 and 3"},
        {"role": "assistant", "content": "Calling the tool."},
        {"role": "user", "content": "and now?"},
    ]
    reply = ParsedAssistant(content="", tool_calls=[ToolCall("call_1", "add", '{"a": 2, "b": 3}')], reasoning="sum")
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    assert sft_row(messages, tools, reply) == {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Add 2 and 3"},
            {"role": "assistant", "content": "Calling the tool.", "weight": 0},
            {"role": "user", "content": "and now?"},
            {
                "role": "assistant",
                "content": "",
                "weight": 1,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
                ],
                "reasoning_content": "sum",
            },
        ],
        "tools": tools,
    }


def test_default_deployment_id_is_a_valid_fireworks_id() -> None:
    assert default_deployment_id("accounts/fireworks/models/qwen3-8b") == "openclaw-qwen3-8b"
    assert default_deployment_id("accounts/me/models/Llama_3.1 8B") == "openclaw-llama-3-1-8b"
    assert len(default_deployment_id("accounts/a/models/" + "x" * 100)) == 63


async def test_unknown_prompts_and_cross_entropy_datums(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    async with deployed(double, tiny_model_dir, tmp_path, "units") as backend:
        stranger = datum_from_completion([1, 2, 3], [4, 5], advantages=1.0)  # never rendered by this process
        result = await backend.forward_backward([stranger], "ppo")
        assert result.metrics["skipped_unknown_prompt"] == 1 and result.metrics["queued"] == 0
        demo = (await judged_datums(backend, ["demo"], reward=-1.0))[0]
        ce = await backend.forward_backward([demo], "cross_entropy")  # demonstrations: trained whatever the sign
        assert ce.metrics["queued"] == 1


# -- the mode switch ------------------------------------------------------------------------------------------------


async def test_stepwise_mode_without_its_module_points_at_batch_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    import openclaw_cli.backends.fireworks as facade

    monkeypatch.setattr(facade, "STEPWISE_MODULE", "openclaw_cli.backends.fireworks.no_such_mode")
    backend = FireworksBackend(Settings(backend="fireworks"))
    with pytest.raises(NotYetAvailable, match=r"fireworks\.mode = 'batch'"):
        await backend.start()
    with pytest.raises(BackendError, match="not started"):
        backend.current_version()


async def test_the_facade_hands_discard_gradients_to_the_mode_so_the_trainer_may_retry_a_step() -> None:
    """The trainer retries a failed step only on a backend with discard_gradients (else a retry could count a datum
    twice); the facade has it, and it reaches the started mode."""

    class Mode:
        discarded = 0

        async def discard_gradients(self) -> None:
            self.discarded += 1

    backend = FireworksBackend(Settings(backend="fireworks"))
    with pytest.raises(BackendError, match="not started"):
        await backend.discard_gradients()
    mode = Mode()
    backend.impl = mode  # type: ignore[assignment]
    await backend.discard_gradients()
    assert mode.discarded == 1


def test_diagnose_reports_both_modes_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIREWORKS_API_KEY", "fw-diag-secret")
    monkeypatch.delenv("FIREWORKS_ACCOUNT_ID", raising=False)
    checks = {c.name: c for c in FireworksBackend.diagnose(Settings(backend="fireworks"))}
    assert checks["sdk installed"].ok and checks["sdk installed"].detail.startswith("fireworks-ai ")
    assert checks["api key"].ok and "fw-diag-secret" not in checks["api key"].detail
    assert not checks["account id"].ok and "FIREWORKS_ACCOUNT_ID" in checks["account id"].detail
    assert not checks["base model"].ok and not checks["tokenizer"].ok
    assert "private preview" in checks["mode"].detail and "training sdk" in checks
    batch = {c.name: c for c in FireworksBackend.diagnose(Settings(fireworks={"mode": "batch", "batch_samples": 8}))}
    assert batch["mode"].detail.startswith("batch: an SFT job per 8 positively judged samples")
    assert "training sdk" not in batch
