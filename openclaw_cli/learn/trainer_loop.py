"""The training loop: judged turns from the store -> one optimizer step -> a published policy version.

Each step takes ``settings.train.batch_size`` turns the judge has completed (``claim_ready("trainer", ...,
after="judge")``), turns them into :class:`~openclaw_cli.learn.algorithms.TrainSample` s (the exact stored prompt and
completion ids and the policy's raw log-probabilities at serving time; for ``opd`` / ``combined`` the teacher's
log-probabilities of the same completion in the hint-extended context, scored by the frozen base model), builds
datums for ``settings.method``, runs ``forward_backward(..., "ppo")`` + ``optim_step``, publishes the new weights and
records the step. A batch with no usable signal (all scores 0, no hints, or all too stale) is completed without a
step; a turn the judge gave up on (``"failed"`` verdict) is completed as untrained and takes no place in a batch.

**One step, in this order** (the order is what makes a crash at any moment safe):

1. claim judged turns; a half-filled batch is held in memory only (its claims name this process);
2. ``discard_gradients`` (whatever an earlier failed attempt accumulated), ``forward_backward``, ``optim_step``:
   the update now exists in this process's memory and nowhere else;
3. ``publish``: serving moves to the new version (replies served from it are stored like any other);
4. :meth:`~openclaw_cli.store.Store.commit_step`: ONE transaction holding the step's metrics (with the ids of the
   turns it trained) and the completion of every batch turn for ``"trainer"``, each naming this step;
5. every ``train.checkpoint_every`` steps and at shutdown: ``save_state("step-NNNNNNNN")`` (the local backend writes
   a temp dir and renames it, so a checkpoint is whole or absent), then its path is recorded in the store.

**Resume** (:meth:`TrainerLoop.resume`, before serving): take over the trainer's claims (a dead process's claims are
released at once, so its half-filled batch is claimed again), load the newest checkpoint that loads (recorded in the
store, or found in ``local.state_dir``), say step ``c``, and :meth:`~openclaw_cli.store.Store.discard_steps_after`
``c``: steps after ``c`` were committed but their weights died with the process, so their rows are deleted and their
turns reopened, to be trained again on top of ``c``. A crash

- before 4 leaves nothing of the step in the store: its turns are released and trained again;
- between 4 and the next checkpoint: the store has the step, no checkpoint does: undone on resume, trained again;
- inside 5: the checkpoint is whole or absent; a whole one that was not recorded yet is found by the directory scan
  (it was written after its step committed, so it agrees with the store).

So a turn is never marked trained unless the weights that survive include it, and its update is in those weights at
most once. The price is redoing up to ``checkpoint_every`` steps after a crash; versions published after the newest
checkpoint are gone too (their numbers may be handed out again). A commit that fails (a store error) is retried
before anything else is trained, and no checkpoint is written while the weights hold an update the store has not
recorded (a failed commit, or a step cut short by a forced shutdown).

**Failures.** A failed ``forward_backward`` / ``optim_step`` is logged and the same batch is retried on the next
round, up to :data:`MAX_STEP_ATTEMPTS` times, each attempt starting from discarded gradients (a backend without
``discard_gradients`` is not retried: a retry could count a datum twice); then its turns are completed as skipped
with the error. Serving is untouched either way: the last published version keeps answering. A failed publish after
a successful step is logged; the update stays in the trainer and goes out with the next successful publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from openclaw_cli.adapters import SHARED_ADAPTER, TRAINER, adapter_state_dir, trainer_consumer
from openclaw_cli.backend import Backend, adapter_backend, completion_logprobs
from openclaw_cli.capture.redaction import withhold_from_training
from openclaw_cli.learn.algorithms import (
    RunningBaseline,
    TrainSample,
    adam_params_from,
    build_datums,
    ppo_loss_config,
    teacher_messages,
)
from openclaw_cli.learn.hindsight_demos import DemoReplay, hindsight_demo
from openclaw_cli.learn.loop_probe import probe_loops
from openclaw_cli.learn.step_metrics import advantage_stats, spread, store_counts, verdict_counts
from openclaw_cli.lesson_prompt import lesson_block, served_lessons, with_lessons
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store, TurnRecord
from openclaw_cli.types import Datum, FwdBwdResult, PolicyVersion, StepResult

log = logging.getLogger("openclaw.trainer")

CONSUMER = TRAINER  # the shared adapter's trainer; an owner's adapter has its own (adapters.trainer_consumer)
JUDGE_CONSUMER = "judge"
# Claims are held until this process completes them or dies: a restart's Store.take_over_claims frees a dead
# process's claims at once, and the store's owner lock rules out a second live trainer, so the lease never needs to
# run out while we live (one that did would hand our half-filled batch back to us).
LEASE_S = 365 * 24 * 3600.0
MAX_STEP_ATTEMPTS = 3
KEEP_CHECKPOINTS = 3
CHECKPOINT_PREFIX = "step-"
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")
# Left behind by a write_dir_atomically that was killed half-way (see backends/local/model_loading.py).
_PARTIAL_CHECKPOINT = re.compile(rf"^\.{CHECKPOINT_PREFIX}\d+\.(tmp|old)-")
_STATE_FILE = "openclaw-state.json"  # written by the local backend's save_state; marks a finished checkpoint


class ResumeError(RuntimeError):
    """No checkpoint could be loaded although some exist; the message names the newest and what to do."""


@dataclass
class StepReport:
    """One optimizer step: its number, the policy version it published, its metrics and the turns it trained."""

    step: int
    version: int
    metrics: dict[str, Any]
    trained_turn_ids: list[int]
    batch_turn_ids: list[int]


@dataclass
class TrainerStats:
    """Counters for status displays."""

    steps: int = 0
    trained_samples: int = 0
    skipped_batches: int = 0
    stale_turns: int = 0  # judged turns completed untrained: too many versions old when the trainer reached them
    failures: int = 0
    reopened_turns: int = 0  # turns of steps lost in a crash, trained again after resume
    last_error: str | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)  # mean reward per step, newest last (bounded)


@dataclass
class _StepCommit:
    """A trained step waiting for its store transaction (kept when the store refused it, and retried)."""

    report: StepReport
    results: dict[int, dict[str, Any]]
    mean_reward: float | None


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def list_checkpoints(state_dir: Path) -> list[tuple[int, Path]]:
    """Finished checkpoints (those with a state file) in ``state_dir``, oldest first."""
    if not state_dir.is_dir():
        return []
    found = []
    for path in state_dir.iterdir():
        match = _CHECKPOINT_NAME.match(path.name)
        if match and (path / _STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


async def _nothing() -> list[TrainSample]:
    return []


class TrainerLoop:
    def __init__(
        self,
        store: Store,
        backend: Backend,
        settings: Settings,
        *,
        poll_s: float = 0.5,
        adapter: str = SHARED_ADAPTER,
    ) -> None:
        self.store = store
        # One adapter's loop (openclaw_cli.adapters): it claims that adapter's turns only, trains and publishes
        # through the backend as that adapter sees it, and keeps that adapter's steps and checkpoints.
        self.adapter = adapter
        self.consumer = trainer_consumer(adapter)
        self.backend = adapter_backend(backend, adapter)
        self.settings = settings
        self.poll_s = poll_s
        self.stats = TrainerStats()
        self.step = 0  # the last step committed to the store
        self._last_checkpoint_step: int | None = None
        self._pending: dict[int, TurnRecord] = {}  # claimed, waiting for a full batch (insertion = ready order)
        self._verdicts: dict[int, dict[str, Any]] = {}  # the judge's result for each pending turn
        self._uncommitted: _StepCommit | None = None
        # True from the moment optim_step may change the weights until the store records that step: a checkpoint
        # taken then (e.g. at a forced shutdown) would hold an update whose turns the store still calls untrained.
        self._weights_ahead = False
        self._attempts = 0
        self._baseline = RunningBaseline(decay=settings.train.baseline_decay)
        self._replay = DemoReplay(settings.train.demo_replay)
        self._can_discard = callable(getattr(self.backend, "discard_gradients", None))
        # How a trained step reaches serving: the backend's publish, or a promotion gate's (see openclaw launch).
        self.publisher: Callable[[str], Awaitable[PolicyVersion]] = self.backend.publish
        # What that publish decided (the promotion gate's summary), recorded in the step's row; None for a plain one.
        self.publish_decision: Callable[[], dict[str, Any] | None] = lambda: None

    @property
    def pending_turns(self) -> int:
        """Claimed turns waiting for a full batch."""
        return len(self._pending)

    @property
    def state_dir(self) -> Path:
        return adapter_state_dir(self.settings, self.adapter)

    async def waiting(self) -> int:
        """Judged turns this trainer has not finished and will still train: written by a policy version within
        ``train.max_staleness`` of the current one (the judge paces itself on this, see ``judge.max_ahead``)."""
        oldest_usable = self.backend.current_version().version - self.settings.train.max_staleness
        count, _ = await asyncio.to_thread(
            self.store.backlog, self.consumer, after=JUDGE_CONSUMER, min_version=max(0, oldest_usable)
        )
        return count

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def resume(self) -> int | None:
        """Take over the trainer's claims, load the newest loadable checkpoint and undo the steps it lacks (see the
        module docstring). Returns the step it resumed from (None: no checkpoint, training starts from the base)."""
        released = await asyncio.to_thread(self.store.take_over_claims, self.consumer)
        if released:
            log.info("released %d turn(s) a previous process had claimed for training", released)
        await asyncio.to_thread(self._remove_partial_checkpoints)
        store_steps = await asyncio.to_thread(partial(self.store.steps, adapter=self.adapter))
        last_recorded = store_steps[-1][0] if store_steps else 0
        resumed = await self._load_newest_checkpoint()
        base = resumed or 0
        if resumed is not None and resumed > last_recorded:
            log.warning(
                "checkpoint step %d is newer than the store's last step %d (a store restored from an older copy?); "
                "continuing from the checkpoint",
                resumed,
                last_recorded,
            )
        reopened = await asyncio.to_thread(self.store.discard_steps_after, base, self.consumer, self.adapter)
        if last_recorded > base:
            log.warning(
                "steps %d-%d never reached a checkpoint (the last run stopped without one); %d turn(s) they "
                "trained will be trained again on top of step %d",
                base + 1,
                last_recorded,
                len(reopened),
                base,
            )
        self.stats.reopened_turns += len(reopened)
        self._last_checkpoint_step = resumed
        self.step = base
        self.stats.steps = self.step
        return resumed

    async def _load_newest_checkpoint(self) -> int | None:
        """Load the newest checkpoint that loads; None when there is none. Raises ResumeError when some exist but
        none loads (refusing is safer than silently dropping the record of every step since the base)."""
        recorded = await asyncio.to_thread(self.store.checkpoints, self.adapter)
        candidates: dict[int, str] = {step: path for step, path in recorded}
        for step, directory in list_checkpoints(self.state_dir):
            candidates.setdefault(step, str(directory))
        errors: list[str] = []
        for step, path in sorted(candidates.items(), reverse=True):
            local = Path(path).expanduser()
            if local.is_absolute() and not local.exists():
                continue  # a recorded local checkpoint pruned since; a URI (another backend's) is simply tried
            try:
                info = await self.backend.load_state(path)
            except Exception as exc:
                errors.append(f"{path}: {type(exc).__name__}: {exc}")
                log.warning("cannot load checkpoint %s (%s); trying an older one", path, exc)
                continue
            log.info("resumed from checkpoint %s (serving version %d)", path, info.version)
            return step
        if errors:
            raise ResumeError(
                f"no checkpoint could be loaded ({errors[0]}); fix or move aside {self.state_dir} to start training "
                "from the base model (turns trained since are then trained again)"
            )
        return None

    def _remove_partial_checkpoints(self) -> None:
        if not self.state_dir.is_dir():
            return
        for path in self.state_dir.iterdir():
            if _PARTIAL_CHECKPOINT.match(path.name):
                shutil.rmtree(path, ignore_errors=True)

    async def checkpoint(self) -> str | None:
        """Save state as ``step-NNNNNNNN`` unless the newest checkpoint already is this step (or a trained step is
        still waiting for its commit: a checkpoint must never hold an update the store does not know)."""
        if self._weights_ahead:
            log.warning("the step after %d is not committed to the store yet; no checkpoint", self.step)
            return None
        if self._last_checkpoint_step == self.step:
            return None
        step = self.step
        path = await self.backend.save_state(checkpoint_name(step))
        await asyncio.to_thread(partial(self.store.record_checkpoint, step, path, adapter=self.adapter))
        self._last_checkpoint_step = step
        await asyncio.to_thread(self._prune_checkpoints)
        log.info("checkpoint saved: %s", path)
        return path

    def _prune_checkpoints(self) -> None:
        for step, path in list_checkpoints(self.state_dir)[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(path, ignore_errors=True)
            self.store.forget_checkpoint(step, self.adapter)

    async def run(self, stop: asyncio.Event) -> None:
        """Train whenever a batch is ready until ``stop`` is set; the step in progress finishes, then a checkpoint."""
        try:
            while not stop.is_set():
                skipped_before = self.stats.skipped_batches
                try:
                    report = await self.run_once()
                except Exception as exc:  # never let one bad batch end training for the whole process
                    log.exception("trainer round failed")
                    self.stats.failures += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    report = None
                # A batch dropped for having no signal (e.g. all stale) says nothing about what is queued behind
                # it; pausing there would let a backlog of stale turns drain at one batch per poll.
                if self.stats.skipped_batches > skipped_before:
                    continue
                if report is None:  # nothing to train yet, or a failed step: pause before the next try
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=self.poll_s)
        finally:
            try:
                await self.checkpoint()
            except Exception:
                log.exception("checkpoint on shutdown failed")

    # -- one step -------------------------------------------------------------------------------------------------

    async def run_once(self) -> StepReport | None:
        """Claim judged turns; once a full batch is held, train on it. None when no step was taken."""
        if self._uncommitted is not None:  # the weights are a step ahead of the store: settle that first
            return await self._commit(self._uncommitted)
        batch_size = self.settings.train.batch_size
        while len(self._pending) < batch_size and await self._claim(batch_size - len(self._pending)):
            pass  # claim again when some of what came back was not trainable (the judge gave up on it)
        if len(self._pending) < batch_size:
            return None
        batch = sorted(self._pending.values(), key=lambda turn: turn.id)[:batch_size]  # in the order they were written
        try:
            report = await self._train(batch)
        except Exception as exc:
            self._attempts += 1
            self.stats.failures += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            if self._attempts < MAX_STEP_ATTEMPTS and self._can_discard:
                log.warning("training step failed (attempt %d, will retry): %s", self._attempts, exc)
                return None
            log.error("training step failed %d times; skipping its %d turns: %s", self._attempts, len(batch), exc)
            await self._complete(batch, {"trained": False, "error": self.stats.last_error})
            self._release(batch)
            return None
        self._release(batch)
        return report

    async def _claim(self, want: int) -> int:
        """Claim up to ``want`` more turns into the pending batch; returns how many new turns it got."""

        def claim() -> list[tuple[TurnRecord, Any]]:
            # Newest first: users who talk faster than the trainer steps leave a backlog, and training it in order
            # would only ever reach turns too many versions old to train on (dropped as stale after scoring).
            turns = self.store.claim_ready(self.consumer, want, LEASE_S, after=JUDGE_CONSUMER, newest_first=True)
            return [(turn, self.store.result_of(JUDGE_CONSUMER, turn.id)) for turn in turns]

        gave_up: list[TurnRecord] = []
        stale: list[TurnRecord] = []
        current = self.backend.current_version().version
        new = 0
        for turn, verdict in await asyncio.to_thread(claim):
            if turn.id in self._pending:
                continue  # a re-delivered claim must not count twice
            new += 1
            if isinstance(verdict, dict) and verdict.get("failed"):
                gave_up.append(turn)
                continue
            if current - turn.version > self.settings.train.max_staleness:
                stale.append(turn)  # completed now, before any teacher scoring is spent on it
                continue
            self._pending[turn.id] = turn
            self._verdicts[turn.id] = verdict if isinstance(verdict, dict) else {}
        if gave_up:
            await self._complete(gave_up, {"trained": False, "reason": "judge_failed"})
        if stale:
            self.stats.stale_turns += len(stale)
            await self._complete(stale, {"trained": False, "reason": "stale"})
        return new

    def _release(self, batch: list[TurnRecord]) -> None:
        for turn in batch:
            self._pending.pop(turn.id, None)
            self._verdicts.pop(turn.id, None)
        self._attempts = 0

    async def _train(self, batch: list[TurnRecord]) -> StepReport | None:
        train = self.settings.train
        method = self.settings.method
        current_version = self.backend.current_version().version
        started = time.monotonic()
        samples, rewards, unusable = await self._samples(batch)
        stale = [s.turn_id for s in samples if current_version - s.version > train.max_staleness]
        # The baseline for this batch is the running mean *before* it (a batch never centres on itself); it is
        # folded in only once the step has happened, so a retried step sees the same baseline.
        baseline = self._baseline.value
        datums, trained_ids = build_datums(samples, method, train, current_version=current_version, baseline=baseline)
        if not datums:
            self.stats.skipped_batches += 1
            log.info("batch of %d turns has no usable signal (%s); no step", len(batch), method)
            await self._complete(batch, {"trained": False, "reason": "no usable signal", "stale": stale})
            return None
        # Replays and loop probes only ride along a step the batch earns itself: a batch without signal stays no step.
        replays, loops = await self._riding_along(samples, current_version)
        if replays or loops:
            samples += replays + loops
            datums, trained_ids = build_datums(
                samples, method, train, current_version=current_version, baseline=baseline
            )
        scored = time.monotonic()

        fb, optim = await self._update(datums)
        self._baseline.update([r for r in rewards if r != 0])
        self._replay.after_step(samples)
        trained_at = time.monotonic()
        # The update is in the trainer from here on: the turns count as trained even if publishing fails.
        step = self.step + 1
        version, publish_error = await self._publish(step, current_version)

        mean_reward = sum(rewards) / len(rewards) if rewards else None
        metrics: dict[str, Any] = {
            "loss": fb.loss,
            "mean_reward": mean_reward,
            "clip_fraction": fb.metrics.get("clip_fraction"),
            "kl_sampler": fb.metrics.get("kl_sampler"),
            "ratio_mean": fb.metrics.get("ratio_mean"),
            "tokens": int(fb.metrics.get("n_tokens", 0)),
            "n_samples": len(datums),
            "n_batch": len(batch),
            "dropped_stale": len(stale),
            "unusable": unusable,
            "teacher_hints": sum(1 for s in samples if s.teacher_logprobs is not None),
            "demos": sum(1 for s in samples if s.demo_weight is not None and not s.replayed),
            "replayed_demos": len(replays),
            "loops": len(loops),
            "lesson_demos": sum(1 for s in samples if s.consolidates and not s.replayed),
            "grad_norm": optim.metrics.get("grad_norm"),
            "lr": train.lr,
            "method": method,
            "backend_step": optim.step,
            "trained_turn_ids": list(trained_ids),
            # Where a step's time goes (teacher/base scoring, the update, publishing with the collapse guard), so
            # a slow loop can be told apart from a starved one.
            "seconds": {
                "score": round(scored - started, 2),
                "train": round(trained_at - scored, 2),
                "publish": round(time.monotonic() - trained_at, 2),
            },
        }
        if publish_error is not None:
            metrics["publish_error"] = publish_error
        metrics["reward_std"] = spread(rewards)
        metrics["advantage"] = advantage_stats(datums)
        metrics["judge"] = verdict_counts(self._verdicts.get(turn.id, {}) for turn in batch)
        metrics["publish"] = self.publish_decision() if publish_error is None else None
        try:
            metrics.update(await asyncio.to_thread(store_counts, self.store))
        except Exception as exc:  # counts are for display; a failed read must not lose the step
            log.warning("could not count capture and lessons for step %d: %s", step, exc)
        trained = set(trained_ids)
        results = {turn.id: {"trained": turn.id in trained, "step": step, "version": version} for turn in batch}
        report = StepReport(step, version, metrics, list(trained_ids), [t.id for t in batch])
        return await self._commit(_StepCommit(report, results, mean_reward))

    async def _riding_along(
        self, samples: list[TrainSample], current_version: int
    ) -> tuple[list[TrainSample], list[TrainSample]]:
        """The demonstrations due for replay, rescored by the current policy, and the loop probes' samples (run
        together: both are passes of the current version)."""
        train = self.settings.train
        replays, loops = await asyncio.gather(
            self._replay.due(self.backend, current_version) if len(self._replay) else _nothing(),
            probe_loops(
                self.backend,
                samples,
                probes=train.loop_probes,
                max_tokens=train.loop_probe_tokens,
                version=current_version,
            )
            if train.loop_probes
            else _nothing(),
        )
        return replays, loops

    async def _update(self, datums: list[Datum]) -> tuple[FwdBwdResult, StepResult]:
        """One optimizer step on ``datums`` (gradients a failed earlier attempt left behind dropped first)."""
        train = self.settings.train
        if self._can_discard:
            await self.backend.discard_gradients()
        fb = await self.backend.forward_backward(datums, "ppo", ppo_loss_config(train))
        self._weights_ahead = True  # a cancelled optim_step still finishes in its worker thread
        try:
            optim = await self.backend.optim_step(adam_params_from(train))
        except Exception:
            self._weights_ahead = False  # it failed: no update (what retrying the step relies on, too)
            raise
        return fb, optim

    async def _publish(self, step: int, current_version: int) -> tuple[int, str | None]:
        """Publish the step's weights: (the version serving after it, the publish error if it failed). A version
        held back (collapse guard or gate) takes its demonstrations out of the replay."""
        try:
            version = (await self.publisher(checkpoint_name(step))).version
        except Exception as exc:
            log.exception("publishing step %d failed; serving stays on the previous version", step)
            return self.backend.current_version().version, f"{type(exc).__name__}: {exc}"
        if version == current_version:
            self._replay.clear()
        return version, None

    async def _commit(self, pending: _StepCommit) -> StepReport | None:
        """Write the step and its turns in one transaction; on failure keep it for the next round (the weights
        already hold the update, so the batch must not be trained again)."""
        report = pending.report
        try:
            commit = partial(
                self.store.commit_step,
                report.step,
                report.version,
                report.metrics,
                self.consumer,
                pending.results,
                adapter=self.adapter,
            )
            await asyncio.to_thread(commit)
        except Exception as exc:
            self._uncommitted = pending
            self.stats.failures += 1
            self.stats.last_error = f"committing step {report.step}: {type(exc).__name__}: {exc}"
            log.error("cannot commit step %d to the store (%s); retrying before training more", report.step, exc)
            return None
        self._uncommitted = None
        self._weights_ahead = False
        self.step = report.step
        self.stats.steps = report.step
        self.stats.trained_samples += len(report.trained_turn_ids)
        self.stats.last_metrics = report.metrics
        if pending.mean_reward is not None:
            self.stats.rewards = [*self.stats.rewards[-199:], pending.mean_reward]
        log.info(
            "step %d -> version %d: loss %.4f, reward %s, %d samples, %d tokens",
            report.step,
            report.version,
            report.metrics["loss"],
            "n/a" if pending.mean_reward is None else f"{pending.mean_reward:+.2f}",
            report.metrics["n_samples"],
            report.metrics["tokens"],
        )
        if report.step % self.settings.train.checkpoint_every == 0:
            try:
                await self.checkpoint()
            except Exception:
                log.exception("checkpoint at step %d failed; training continues", report.step)
        return report

    async def _complete(self, batch: list[TurnRecord], outcome: dict[str, Any]) -> None:
        text = json.dumps(outcome)
        for turn in batch:
            await asyncio.to_thread(self.store.complete, self.consumer, turn.id, text)

    # -- samples --------------------------------------------------------------------------------------------------

    async def _samples(self, batch: list[TurnRecord]) -> tuple[list[TrainSample], list[float], int]:
        """TrainSamples for the usable turns, the judge scores of the batch, and how many turns were unusable."""
        samples: list[TrainSample] = []
        demos: list[Awaitable[TrainSample | None]] = []
        rewards: list[float] = []
        unusable = 0
        train = self.settings.train
        for turn in batch:
            verdict = self._verdicts.get(turn.id)
            if verdict is None:
                verdict = await asyncio.to_thread(self.store.result_of, JUDGE_CONSUMER, turn.id)
            verdict = verdict if isinstance(verdict, dict) else {}
            # The user's own rating (POST /v1/openclaw/feedback) overrides the judge; its text is the hint.
            rated = await asyncio.to_thread(self.store.feedback_for, turn.id)
            if rated is not None:
                verdict = {**verdict, "score": float(rated[0]), "source": "feedback"}
                if rated[1]:
                    verdict["hint"] = rated[1]
            score = verdict.get("score", turn.reward)
            reward = float(score) if isinstance(score, int | float) else None
            if reward is not None:
                rewards.append(reward)
            # The ratio needs the policy's raw log-probabilities of exactly these tokens; without them (or with a
            # mismatch) the turn cannot be trained without re-scoring under a version that may be gone.
            # (A stream the client aborted is a side turn and never gets here; its finish_reason is checked too.)
            if (
                not turn.completion_tokens
                or len(turn.logprobs) != len(turn.completion_tokens)
                or turn.finish_reason == "aborted"
            ):
                unusable += 1
                continue
            # store.redact: token ids cannot be redacted, so a turn carrying a secret never goes to a cloud trainer.
            if await asyncio.to_thread(withhold_from_training, turn, self.settings, self.backend.name):
                unusable += 1
                continue
            teacher = None
            hint = verdict.get("hint")
            if self.settings.method != "rl" and isinstance(hint, str) and hint.strip():
                hinted = self._hinted_prompt(turn, hint)
                if hinted is not None:  # scoring may still fail, e.g. the hint pushes it past the context limit
                    teacher = await self._base_completion_logprobs(turn, hinted, "the OPD teacher (reward only)")
                wanted = train.demo_for == "every" or reward is None or reward <= 0
                if hinted is not None and teacher is not None and train.demo_weight > 0 and wanted:
                    demos.append(
                        hindsight_demo(
                            self.backend,
                            turn,
                            hint,
                            hinted,
                            weight=train.demo_weight,
                            max_tokens=train.demo_max_tokens,
                            version=self.backend.current_version().version,
                        )
                    )
            consolidation = self._consolidation(turn)
            if consolidation is not None:
                demos.append(consolidation)
            base = None
            if self.settings.train.kl_coef > 0 and turn.version != 0:  # version 0 is the base: the penalty is 0
                base = await self._base_logprobs(turn)
            samples.append(
                TrainSample(
                    turn_id=turn.id,
                    session_id=turn.session_id,
                    prompt_tokens=list(turn.prompt_tokens),
                    completion_tokens=list(turn.completion_tokens),
                    sampler_logprobs=list(turn.logprobs),
                    version=turn.version,
                    reward=reward,
                    teacher_logprobs=teacher,
                    has_next_state=turn.next_state is not None,
                    base_logprobs=base,
                    forced_tokens=tuple(int(i) for i in turn.metadata.get("forced_tokens") or ()),
                )
            )
        # Written together: the sampler decodes concurrent requests in one batch.
        samples += [demo for demo in await asyncio.gather(*demos) if demo is not None]
        return samples, rewards, unusable

    def _consolidation(self, turn: TurnRecord) -> Awaitable[TrainSample | None] | None:
        """For a turn served with lessons (``lessons.consolidate``): the base model's reply to the prompt as served,
        as a demonstration for the same conversation without the lessons (context distillation); None otherwise."""
        served = served_lessons(turn)
        train = self.settings.train
        if not served or not self.settings.lessons.consolidate or train.demo_weight <= 0:
            return None
        try:
            plain = self.backend.tokenizer().render(turn.messages, turn.tools)
        except Exception as exc:
            log.warning("turn %d: cannot render its plain prompt for the lessons' demonstration: %s", turn.id, exc)
            return None
        return hindsight_demo(
            self.backend,
            turn,
            lesson_block([text for _, text in served]),
            list(turn.prompt_tokens),
            weight=train.demo_weight,
            max_tokens=train.demo_max_tokens,
            version=self.backend.current_version().version,
            plain_prompt=plain,
            consolidates=tuple(lesson_id for lesson_id, _ in served),
        )

    def _hinted_prompt(self, turn: TurnRecord, hint: str) -> list[int] | None:
        """The OPD teacher's prompt (the conversation as served, lessons included, with the hint), rendered; None
        (logged) when it cannot be."""
        try:
            messages = with_lessons(turn.messages, [text for _, text in served_lessons(turn)])
            return self.backend.tokenizer().render(teacher_messages(messages, hint), turn.tools)
        except Exception as exc:
            log.warning("turn %d: cannot render the OPD teacher's prompt (%s); using its reward only", turn.id, exc)
            return None

    async def _base_logprobs(self, turn: TurnRecord) -> list[float] | None:
        """log pi_base(a_t | prompt) for the completion tokens (the KL anchor), or None when it cannot be scored."""
        return await self._base_completion_logprobs(turn, list(turn.prompt_tokens), "the base model for the KL anchor")

    async def _base_completion_logprobs(self, turn: TurnRecord, prompt: list[int], what: str) -> list[float] | None:
        """The frozen base model's log-probabilities of the turn's completion tokens after ``prompt``; None (logged)
        when the backend cannot score them."""
        try:
            return await completion_logprobs(self.backend, prompt, list(turn.completion_tokens), base=True)
        except Exception as exc:
            log.warning("turn %d: cannot score %s: %s", turn.id, what, exc)
            return None
