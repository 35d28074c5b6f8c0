"""TrainerLoop against a real store and a recording backend double: batching, exact datums, OPD teacher scoring,
at-most-once training, skipped batches, retries, checkpoints and resume."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from openclaw_cli.backend import none_before
from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.algorithms import teacher_messages
from openclaw_cli.learn.trainer_loop import MAX_STEP_ATTEMPTS, ResumeError, TrainerLoop, list_checkpoints
from openclaw_cli.settings import LocalSettings, Settings, TrainSettings
from openclaw_cli.store import Store
from openclaw_cli.testing.store_turns import captured_exchange
from openclaw_cli.types import AdamParams, Datum, FwdBwdResult, PolicyVersion, SampleResult, SamplingParams, StepResult

PROMPT = [11, 12, 13]


class RecordingBackend:
    """Just enough of the Backend protocol for the trainer, recording every call."""

    name = "recording"

    def __init__(self, tokenizer: Any, state_dir: Path) -> None:
        self._tokenizer = tokenizer
        self.state_dir = state_dir
        self.version = 0
        self.step = 0
        self.fail_forward_backward = 0
        self.fail_optim_step = 0
        self.calls: list[tuple[str, Any]] = []
        self.datums: list[list[Datum]] = []
        self.accumulated: list[Datum] = []  # what a real trainer would hold as gradients
        self.stepped_on: list[int] = []  # datums accumulated at each successful optim_step
        self.demo_text = "Paris."  # what the base model answers when it reads a hint (hindsight demonstrations)
        self.base_logprob: float | None = None  # when set, the base model's log-probability of every token

    def tokenizer(self) -> Any:
        return self._tokenizer

    def current_version(self) -> PolicyVersion:
        return PolicyVersion(self.version, f"v{self.version}")

    async def sample(self, prompt: list[int], params: SamplingParams, version: int | None = None) -> SampleResult:
        self.calls.append(("sample", (list(prompt), params.temperature, version)))
        return SampleResult(
            tokens=[31, 32], logprobs=[-0.5, -0.5], finish_reason="stop", version=0, text=self.demo_text
        )

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        self.calls.append(("compute_logprobs", (list(tokens), base)))
        if base and self.base_logprob is not None:
            return none_before([None] + [self.base_logprob] * (len(tokens) - 1), start)
        return none_before([None] + [-0.1 * i for i in range(1, len(tokens))], start)

    async def forward_backward(
        self, datums: list[Datum], loss: str, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        self.calls.append(("forward_backward", (loss, loss_config)))
        if self.fail_forward_backward > 0:
            self.fail_forward_backward -= 1
            raise RuntimeError("device lost")
        self.datums.append(datums)
        self.accumulated.extend(datums)
        n_tokens = sum(sum(1 for w in d.loss_fn_inputs["weights"] if w > 0) for d in datums)
        return FwdBwdResult(
            loss=0.75, metrics={"n_tokens": float(n_tokens), "clip_fraction": 0.25, "kl_sampler": 0.01}, logprobs=[]
        )

    async def discard_gradients(self) -> None:
        self.accumulated.clear()

    async def optim_step(self, adam: AdamParams) -> StepResult:
        self.calls.append(("optim_step", adam))
        if self.fail_optim_step > 0:
            self.fail_optim_step -= 1
            raise RuntimeError("optimizer state on a lost device")
        self.stepped_on.append(len(self.accumulated))
        self.accumulated.clear()
        self.step += 1
        return StepResult(self.step, {"grad_norm": 0.5})

    async def publish(self, name: str | None = None) -> PolicyVersion:
        self.version += 1
        self.calls.append(("publish", name))
        return self.current_version()

    async def save_state(self, name: str) -> str:
        path = self.state_dir / name
        path.mkdir(parents=True, exist_ok=True)
        (path / "openclaw-state.json").write_text(json.dumps({"version": self.version, "step": self.step}))
        self.calls.append(("save_state", name))
        return str(path)

    async def load_state(self, path: str) -> PolicyVersion:
        state = json.loads((Path(path) / "openclaw-state.json").read_text())
        self.version, self.step = state["version"], state["step"]
        self.calls.append(("load_state", Path(path).name))
        return self.current_version()

    def called(self, name: str) -> list[Any]:
        return [args for call, args in self.calls if call == name]


def exchange(session: str, messages: list[dict[str, Any]], completion: list[int], version: int) -> CapturedExchange:
    return captured_exchange(session, messages, prompt_tokens=PROMPT, completion_tokens=completion, version=version)


class World:
    def __init__(self, tmp_path: Path, tokenizer: Any, method: str = "rl", **train: Any) -> None:
        train.setdefault("batch_size", 2)
        # These tests check the RL advantages by hand; the KL anchor has its own tests (test_algorithms.py).
        train.setdefault("kl_coef", 0.0)
        train.setdefault("collapse_guard", False)
        train.setdefault("loop_probes", 0)  # the double's greedy replies never loop; the probe has its own test
        self.settings = Settings(
            train=TrainSettings(**train), local=LocalSettings(state_dir=tmp_path / "ckpt"), method=method
        )
        self.tmp_path = tmp_path
        self.tokenizer = tokenizer
        self.store = Store(tmp_path / "store.sqlite3")
        self.capture = SessionCapture(self.store, self.settings)
        self.backend = RecordingBackend(tokenizer, tmp_path / "ckpt")
        self.sessions = 0

    def loop(self) -> TrainerLoop:
        return TrainerLoop(self.store, self.backend, self.settings)  # type: ignore[arg-type]

    def crash_and_restart(self) -> None:
        """What a kill -9 leaves: the store file and the checkpoints; no in-memory state, no shutdown checkpoint."""
        self.store.close()
        self.store = Store(self.tmp_path / "store.sqlite3")
        self.capture = SessionCapture(self.store, self.settings)
        self.backend = RecordingBackend(self.tokenizer, self.tmp_path / "ckpt")

    def ready_turn(
        self, completion: list[int], *, version: int = 0, score: int | None = None, hint: str | None = None
    ) -> int:
        """A one-turn session, ended (so the turn is ready) and, if ``score`` is given, judged."""
        self.sessions += 1
        session = f"s{self.sessions}"
        messages = [{"role": "user", "content": f"question {self.sessions}"}]
        turn = self.capture.record_sync(exchange(session, messages, completion, version))
        self.capture.end_session_sync(session)
        if score is not None:
            verdict = {"score": score, "hint": hint, "votes": [score]}
            self.store.complete("judge", turn.turn_id, json.dumps(verdict), reward=score)
        return turn.turn_id


@pytest.fixture
def world(tmp_path: Path, tiny_tokenizer: Any):
    built = World(tmp_path, tiny_tokenizer)
    yield built
    built.store.close()


def completion_part(datum: Datum, key: str) -> list[float]:
    return datum.loss_fn_inputs[key][len(PROMPT) - 1 :]


def assert_plain_demo(datum: Datum, *, advantage: float) -> None:
    """The double's demonstration "Paris." (tokens 31 32) after the plain prompt (no hint), its logprobs the current
    policy's (the double's -0.1 per position), a constant advantage."""
    assert datum.model_input[len(PROMPT) :] == [31]
    assert completion_part(datum, "logprobs") == pytest.approx([-0.1 * 3, -0.1 * 4])
    assert completion_part(datum, "advantages") == pytest.approx([advantage, advantage])


async def test_waits_for_a_full_judged_batch_then_trains_once_with_exact_datums(world: World) -> None:
    loop = world.loop()
    first = world.ready_turn([21, 22], score=1)
    world.ready_turn([31, 32, 33], score=None)  # ready but not judged: the trainer must not see it
    assert await loop.run_once() is None
    assert world.backend.called("forward_backward") == []

    second = world.ready_turn([41, 42, 43, 44], score=-1)
    report = await loop.run_once()
    assert report is not None
    assert (report.step, report.version) == (1, 1)
    assert report.trained_turn_ids == [first, second] == report.batch_turn_ids

    (datums,) = world.backend.datums
    # Per-sample token mean (train.loss_norm = "sample"), averaged over the 2 samples: +1 / (2 * 2), -1 / (4 * 2).
    assert completion_part(datums[0], "advantages") == [0.25, 0.25]
    assert completion_part(datums[1], "advantages") == [-0.125] * 4
    assert completion_part(datums[0], "logprobs") == [-0.5, -0.5]
    assert datums[1].model_input == [*PROMPT, 41, 42, 43]
    assert world.backend.called("forward_backward") == [
        ("ppo", {"clip_low_threshold": pytest.approx(0.8), "clip_high_threshold": pytest.approx(1.28)})
    ]
    train = world.settings.train
    assert world.backend.called("optim_step") == [
        AdamParams(train.lr, train.adam_beta1, train.adam_beta2, weight_decay=0.0, grad_clip_norm=1.0)
    ]
    assert world.backend.called("publish") == ["step-00000001"]

    ((step, version, _, metrics),) = world.store.steps()
    assert (step, version) == (1, 1)
    assert metrics["mean_reward"] == 0.0 and metrics["n_samples"] == 2 and metrics["tokens"] == 6
    assert metrics["clip_fraction"] == 0.25 and metrics["kl_sampler"] == 0.01 and metrics["dropped_stale"] == 0
    assert world.store.result_of("trainer", first) == {"trained": True, "step": 1, "version": 1}

    # Completed for "trainer": never trained again, even after a restart.
    assert await world.loop().run_once() is None
    assert len(world.backend.datums) == 1


async def test_a_batch_without_signal_is_completed_without_a_step(world: World) -> None:
    ids = [world.ready_turn([21], score=0), world.ready_turn([22], score=0)]
    assert await world.loop().run_once() is None
    assert world.backend.called("forward_backward") == [] and world.store.steps() == []
    for turn_id in ids:
        assert world.store.result_of("trainer", turn_id)["trained"] is False


async def test_stale_turns_are_completed_before_scoring_and_counted(tmp_path: Path, tiny_tokenizer: Any) -> None:
    world = World(tmp_path, tiny_tokenizer, max_staleness=1)
    world.backend.version = 3
    stale = world.ready_turn([21, 22], version=1, score=1)
    fresh = world.ready_turn([23, 24], version=2, score=1)
    loop = world.loop()
    assert await loop.run_once() is None  # the stale turn does not fill the batch
    assert world.store.result_of("trainer", stale) == {"trained": False, "reason": "stale"}
    assert loop.stats.stale_turns == 1 and world.backend.called("compute_logprobs") == []
    newer = world.ready_turn([25, 26], version=3, score=1)
    report = await loop.run_once()
    assert report is not None and sorted(report.trained_turn_ids) == [fresh, newer]
    assert report.metrics["dropped_stale"] == 0
    world.store.close()


async def test_waiting_counts_the_judged_turns_the_trainer_will_still_train(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    """What the judge paces itself on: judged, not yet trained, not too stale; unjudged turns do not count."""
    world = World(tmp_path, tiny_tokenizer, max_staleness=1)
    world.backend.version = 3
    world.ready_turn([21], version=1, score=1)  # stale: 2 versions behind
    fresh = world.ready_turn([22], version=2, score=1)
    world.ready_turn([23], version=3, score=None)  # not judged yet
    world.ready_turn([24], version=3, score=-1)
    loop = world.loop()
    assert await loop.waiting() == 2
    world.store.complete("trainer", fresh, "{}")
    assert await loop.waiting() == 1
    world.store.close()


async def test_the_trainer_takes_the_newest_judged_turns_first(tmp_path: Path, tiny_tokenizer: Any) -> None:
    world = World(tmp_path, tiny_tokenizer, batch_size=2)
    ids = [world.ready_turn([21 + i], score=1) for i in range(4)]
    report = await world.loop().run_once()
    assert report is not None and sorted(report.trained_turn_ids) == ids[2:]
    world.store.close()


async def test_opd_scores_the_completion_with_the_base_model_in_the_hinted_context(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    world = World(tmp_path, tiny_tokenizer, "opd", batch_size=1, demo_weight=0.0)  # the teacher's scoring alone
    world.ready_turn([21, 22], score=1, hint="Answer in one word.")
    report = await world.loop().run_once()
    assert report is not None and report.metrics["teacher_hints"] == 1

    messages = teacher_messages([{"role": "user", "content": "question 1"}], "Answer in one word.")
    teacher_prompt = tiny_tokenizer.render(messages, None)
    assert world.backend.called("compute_logprobs") == [([*teacher_prompt, 21, 22], True)]
    # Teacher logprob at position i is -0.1 i (the double); A = clip(teacher - old, +-1) / 2 tokens.
    n = len(teacher_prompt)
    expected = [max(-1.0, min(1.0, -0.1 * (n + j) + 0.5)) / 2 for j in range(2)]
    assert completion_part(world.backend.datums[0][0], "advantages") == pytest.approx(expected)
    world.store.close()


async def test_a_hinted_turn_the_judge_did_not_approve_also_trains_the_base_models_hinted_reply(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    world = World(tmp_path, tiny_tokenizer, "opd", batch_size=1, demo_weight=0.5)
    world.ready_turn([21, 22], score=-1, hint="Answer in one word.")
    report = await world.loop().run_once()
    assert report is not None and report.metrics["demos"] == 1 and report.metrics["n_samples"] == 2

    teacher_prompt = tiny_tokenizer.render(
        teacher_messages([{"role": "user", "content": "question 1"}], "Answer in one word.")
    )
    assert world.backend.called("sample") == [(teacher_prompt, 0.0, 0)]  # the base model, greedy, with the hint
    # Scored by the current policy in the plain context: those are the demo's "sampler" logprobs (ratio 1 at first).
    assert ([*PROMPT, 31, 32], False) in world.backend.called("compute_logprobs")
    assert ([*PROMPT, 31, 32], True) in world.backend.called("compute_logprobs")  # the base vouches for it
    # Constant advantage 0.5, no KL anchor, the sample-mean normalisation over 2 samples of 2 tokens: 0.5 / 2 / 2.
    assert_plain_demo(world.backend.datums[0][1], advantage=0.125)
    assert report.trained_turn_ids == [report.batch_turn_ids[0]]  # the turn and its demonstration: one turn
    world.store.close()


async def test_a_demonstration_is_replayed_rescored_in_later_steps_without_training_its_turn_again(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    # Only unapproved turns write demonstrations here, so each step's fresh and replayed ones can be told apart.
    world = World(tmp_path, tiny_tokenizer, "opd", batch_size=1, demo_replay=1, demo_for="unapproved")
    loop = world.loop()
    corrected = world.ready_turn([21, 22], score=-1, hint="Answer in one word.")
    first = await loop.run_once()
    assert first is not None and first.metrics["demos"] == 1 and first.metrics["replayed_demos"] == 0

    world.ready_turn([23], score=0)  # no hint: no signal of its own, so no step, and the replay waits
    world.backend.calls.clear()
    assert await loop.run_once() is None and not world.backend.called("compute_logprobs")

    approved = world.ready_turn([24], score=1, hint="Thanks.")
    second = await loop.run_once()
    assert second is not None and second.metrics["demos"] == 0 and second.metrics["replayed_demos"] == 1
    assert second.trained_turn_ids == [approved] and corrected not in second.trained_turn_ids
    # Rescored by the current policy (version 1) in the plain context: the ratio starts at 1 again.
    assert ([*PROMPT, 31, 32], False) in world.backend.called("compute_logprobs")
    assert_plain_demo(world.backend.datums[-1][1], advantage=1.0 / 2 / 2)
    assert [m["trained_turn_ids"] for *_, m in world.store.steps()] == [[corrected], [approved]]  # the ledger, too

    world.ready_turn([25], score=1, hint="Thanks.")
    third = await loop.run_once()  # demo_replay=1: used up
    assert third is not None and third.metrics["replayed_demos"] == 0 and len(world.backend.datums[-1]) == 1
    world.store.close()


async def test_a_step_trains_the_first_repetition_of_a_looping_greedy_reply_beside_its_batch(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    world = World(tmp_path, tiny_tokenizer, "rl", batch_size=1, loop_probes=2, loop_probe_tokens=16)
    loop = world.loop()
    looping = [41, 42, 43, 44] * 4  # runs to the 16-token budget repeating one 4-token span

    async def greedy(prompt: list[int], params: SamplingParams, version: int | None = None) -> SampleResult:
        world.backend.calls.append(("sample", (list(prompt), params.temperature, version)))
        return SampleResult(tokens=looping, logprobs=[-0.2] * 16, finish_reason="length", version=0)

    world.backend.sample = greedy  # type: ignore[method-assign]
    turn = world.ready_turn([21, 22], score=1)
    report = await loop.run_once()
    assert report is not None and report.metrics["loops"] == 1 and report.trained_turn_ids == [turn]
    assert world.backend.called("sample") == [(PROMPT, 0.0, 0)]  # the turn's own prompt, greedy, current version
    fresh, probe = world.backend.datums[-1]
    assert probe.model_input == [*PROMPT, 41, 42, 43, 44, 41, 42, 43]  # the first repetition follows the first span
    assert completion_part(fresh, "advantages") == pytest.approx([1.0 / 2 / 2] * 2)  # reward 1, per-sample mean
    assert probe.loss_fn_inputs["advantages"][-4:] == pytest.approx([-1.0 / 4 / 2] * 4)
    assert probe.loss_fn_inputs["logprobs"][-4:] == pytest.approx([-0.2] * 4)

    # A batch without signal stays no step: the probe does not even run.
    world.backend.calls.clear()
    world.ready_turn([23], score=0)
    assert await loop.run_once() is None and not world.backend.called("sample")
    world.store.close()


async def test_a_held_back_version_takes_its_demonstrations_out_of_the_replay(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    world = World(tmp_path, tiny_tokenizer, "opd", batch_size=1, demo_replay=2)
    loop = world.loop()

    async def held_back(name: str) -> PolicyVersion:
        return world.backend.current_version()  # what the collapse guard or the gate answers

    loop.publisher = held_back
    world.ready_turn([21, 22], score=-1, hint="Answer in one word.")
    assert (await loop.run_once()) is not None
    world.ready_turn([24], score=1, hint="Thanks.")
    report = await loop.run_once()
    assert report is not None and report.metrics["replayed_demos"] == 0
    world.store.close()


@pytest.mark.parametrize(
    ("score", "demo_for", "demo_text", "base_logprob", "why"),
    [
        (1, "unapproved", "Paris.", None, "approved"),
        (-1, "every", "No, answer in one word.", None, "echoes the hint"),
        (-1, "every", "The answer to this question is Paris.", None, "talks about the question"),
        (-1, "every", "Paris.", -3.0, "implausible under the base model"),
    ],
)
async def test_no_demonstration_for_an_approved_turn_or_an_unusable_one(
    tmp_path: Path,
    tiny_tokenizer: Any,
    score: int,
    demo_for: str,
    demo_text: str,
    base_logprob: float | None,
    why: str,
) -> None:
    world = World(tmp_path, tiny_tokenizer, "opd", batch_size=1, demo_for=demo_for)
    world.backend.demo_text = demo_text
    world.backend.base_logprob = base_logprob
    world.ready_turn([21, 22], score=score, hint="No, answer in one word.")
    report = await world.loop().run_once()
    assert report is not None and report.metrics["demos"] == 0 and report.metrics["n_samples"] == 1, why
    world.store.close()


async def test_an_approved_hinted_turn_gets_a_demonstration_by_default(tmp_path: Path, tiny_tokenizer: Any) -> None:
    # demo_for = every: the judge's approval does not withhold the demonstration (SmolLM2 approves some corrections).
    world = World(tmp_path, tiny_tokenizer, "opd", batch_size=1)
    world.ready_turn([21, 22], score=1, hint="Thanks. Next question: what is the capital of Spain?")
    report = await world.loop().run_once()
    assert report is not None and report.metrics["demos"] == 1 and report.metrics["n_samples"] == 2
    world.store.close()


async def test_a_failing_step_is_retried_then_skipped_and_serving_keeps_its_version(world: World) -> None:
    world.backend.fail_forward_backward = 1
    ids = [world.ready_turn([21], score=1), world.ready_turn([22], score=-1)]
    loop = world.loop()
    assert await loop.run_once() is None  # failed: kept for a retry
    assert world.store.result_of("trainer", ids[0]) is None
    report = await loop.run_once()
    assert report is not None and report.batch_turn_ids == ids  # the same batch, trained once

    world.backend.fail_forward_backward = MAX_STEP_ATTEMPTS
    more = [world.ready_turn([23], score=1), world.ready_turn([24], score=1)]
    for _ in range(MAX_STEP_ATTEMPTS):
        assert await loop.run_once() is None
    assert world.backend.version == 1  # nothing published for the failed batch
    assert world.store.result_of("trainer", more[0]) == {"trained": False, "error": "RuntimeError: device lost"}
    assert loop.stats.failures == MAX_STEP_ATTEMPTS + 1


async def test_checkpoints_every_n_steps_on_shutdown_and_resumes(tmp_path: Path, tiny_tokenizer: Any) -> None:
    world = World(tmp_path, tiny_tokenizer, batch_size=1, checkpoint_every=2)
    for _ in range(3):
        world.ready_turn([21], score=1)
    loop = world.loop()
    stop = asyncio.Event()
    runner = asyncio.create_task(loop.run(stop))
    while loop.stats.steps < 3:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(runner, timeout=5)
    assert world.backend.called("save_state") == ["step-00000002", "step-00000003"]  # every 2, then on shutdown
    assert [n for n, _ in list_checkpoints(tmp_path / "ckpt")] == [2, 3]

    restarted = RecordingBackend(tiny_tokenizer, tmp_path / "ckpt")
    world.backend = restarted
    resumed = world.loop()
    assert await resumed.resume() == 3
    assert restarted.called("load_state") == ["step-00000003"] and restarted.version == 3
    world.ready_turn([22], score=1)
    report = await resumed.run_once()
    assert report is not None and report.step == 4
    assert [s for s, *_ in world.store.steps()] == [1, 2, 3, 4]
    world.store.close()


# --- faults and crashes ---------------------------------------------------------------------------------------------
async def test_an_optim_step_failure_is_retried_from_discarded_gradients(world: World) -> None:
    world.backend.fail_optim_step = 1
    ids = [world.ready_turn([21], score=1), world.ready_turn([22], score=-1)]
    loop = world.loop()
    assert await loop.run_once() is None  # forward_backward ran, optim_step failed: 2 datums left accumulated
    assert world.backend.accumulated and world.backend.version == 0
    report = await loop.run_once()
    assert report is not None and report.batch_turn_ids == ids
    # The retry started from zero: the step saw this batch's 2 datums once, not 4.
    assert world.backend.stepped_on == [2]
    assert len(world.backend.called("forward_backward")) == 2 and world.backend.version == 1


async def test_an_optimizer_that_always_fails_skips_the_batch_and_serving_keeps_its_version(world: World) -> None:
    world.backend.fail_optim_step = MAX_STEP_ATTEMPTS
    ids = [world.ready_turn([21], score=1), world.ready_turn([22], score=1)]
    loop = world.loop()
    for _ in range(MAX_STEP_ATTEMPTS):
        assert await loop.run_once() is None
    assert world.backend.version == 0 and world.backend.called("publish") == []
    assert world.store.steps() == []
    error = "RuntimeError: optimizer state on a lost device"
    assert [world.store.result_of("trainer", i) for i in ids] == [{"trained": False, "error": error}] * 2
    # Training goes on with the next batch.
    world.ready_turn([23], score=1), world.ready_turn([24], score=1)
    report = await loop.run_once()
    assert report is not None and report.step == 1 and world.backend.stepped_on == [2]


async def test_a_failed_commit_is_retried_without_training_the_batch_again(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [world.ready_turn([21], score=1), world.ready_turn([22], score=1)]
    real_commit = world.store.commit_step
    refusals = [sqlite3.OperationalError("database is locked")]

    def flaky_commit(*args: Any, **kwargs: Any) -> int:
        if refusals:
            raise refusals.pop()
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(world.store, "commit_step", flaky_commit)
    loop = world.loop()
    assert await loop.run_once() is None
    assert world.store.steps() == [] and loop.step == 0 and world.backend.step == 1
    assert await loop.checkpoint() is None  # never a checkpoint holding an update the store does not know
    report = await loop.run_once()
    assert report is not None and report.step == 1 and report.batch_turn_ids == ids
    assert len(world.backend.called("forward_backward")) == 1  # committed, not retrained
    assert [s for s, *_ in world.store.steps()] == [1]


async def test_a_crash_before_the_checkpoint_undoes_the_lost_steps_and_trains_their_turns_once(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    world = World(tmp_path, tiny_tokenizer, batch_size=1, checkpoint_every=2)
    ids = [world.ready_turn([21 + i], score=1) for i in range(3)][::-1]  # in training order: the newest first
    loop = world.loop()
    for _ in range(3):
        assert await loop.run_once() is not None
    # Step 2 was checkpointed; step 3 is committed in the store but its weights exist only in memory.
    assert [s for s, *_ in world.store.steps()] == [1, 2, 3]
    assert world.store.checkpoints() == [(2, str(tmp_path / "ckpt" / "step-00000002"))]

    world.crash_and_restart()
    resumed = world.loop()
    assert await resumed.resume() == 2
    assert world.backend.called("load_state") == ["step-00000002"] and resumed.step == 2
    assert [s for s, *_ in world.store.steps()] == [1, 2]
    assert world.store.result_of("trainer", ids[2]) is None and resumed.stats.reopened_turns == 1
    report = await resumed.run_once()
    assert report is not None and (report.step, report.trained_turn_ids) == (3, [ids[2]])
    trained = [i for *_, metrics in world.store.steps() for i in metrics["trained_turn_ids"]]
    assert sorted(trained) == sorted(ids)  # every turn in exactly one surviving step
    world.store.close()


async def test_a_half_filled_batch_held_by_a_crashed_process_is_claimed_again_at_once(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    world = World(tmp_path, tiny_tokenizer, batch_size=2)
    first = world.ready_turn([21], score=1)
    assert await world.loop().run_once() is None  # holds `first`, waiting for a second turn
    world.crash_and_restart()
    loop = world.loop()
    assert await loop.resume() is None  # no checkpoint: from the base
    second = world.ready_turn([22], score=1)
    report = await loop.run_once()
    assert report is not None and report.batch_turn_ids == [first, second]
    world.store.close()


async def test_turns_the_judge_gave_up_on_are_completed_untrained_and_take_no_batch_slot(world: World) -> None:
    ids = [world.ready_turn([22], score=1), world.ready_turn([23], score=-1)]
    given_up = world.ready_turn([21])  # the newest: claimed first, with ids[1]
    world.store.complete("judge", given_up, json.dumps({"score": None, "failed": True}), failed=True)
    report = await world.loop().run_once()
    assert report is not None and report.batch_turn_ids == ids
    assert world.store.result_of("trainer", given_up) == {"trained": False, "reason": "judge_failed"}


async def test_resume_refuses_when_checkpoints_exist_but_none_loads(tmp_path: Path, tiny_tokenizer: Any) -> None:
    world = World(tmp_path, tiny_tokenizer, batch_size=1, checkpoint_every=1)
    world.ready_turn([21], score=1)
    assert await world.loop().run_once() is not None
    (tmp_path / "ckpt" / "step-00000001" / "openclaw-state.json").write_text("{not json")
    world.crash_and_restart()
    with pytest.raises(ResumeError, match="no checkpoint could be loaded"):
        await world.loop().resume()
    assert [s for s, *_ in world.store.steps()] == [1]  # nothing was undone
    world.store.close()


async def test_resume_removes_checkpoint_directories_a_kill_left_half_written(world: World) -> None:
    leftover = world.tmp_path / "ckpt" / ".step-00000004.tmp-abc123"
    leftover.mkdir(parents=True)
    keep = world.tmp_path / "ckpt" / "notes"
    keep.mkdir()
    await world.loop().resume()
    assert not leftover.exists() and keep.exists()
