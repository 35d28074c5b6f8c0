"""The training loop: judged turns from the store -> one optimizer step -> a published policy version.

Each step takes ``settings.train.batch_size`` turns the judge has completed (``claim_ready("trainer", ...,
after="judge")``), turns them into :class:`~openclaw_cli.algorithms.TrainSample` s (the exact stored prompt and
completion ids and the policy's raw log-probabilities at serving time; for ``opd`` / ``combined`` the teacher's
log-probabilities of the same completion in the hint-extended context, scored by the frozen base model), builds
datums for ``settings.method``, runs ``forward_backward(..., "ppo")`` + ``optim_step``, publishes the new weights and
records the step. Every claimed turn is then completed for consumer ``"trainer"`` with what happened to it, so a
sample is trained at most once; a batch with no usable signal (all scores 0, no hints, or all too stale) is
completed without a step.

**Failures.** A failed ``forward_backward`` / ``optim_step`` is logged and the same batch is retried on the next
round, up to :data:`MAX_STEP_ATTEMPTS` times; then its turns are completed as skipped with the error. Serving is
untouched either way: the last published version keeps answering. A failed publish after a successful step is
logged; the update stays in the trainer and goes out with the next successful publish.

**Checkpoints and resume.** Every ``train.checkpoint_every`` steps and on shutdown the backend saves its state as
``step-NNNNNNNN`` under ``local.state_dir`` (the newest :data:`KEEP_CHECKPOINTS` are kept). :meth:`TrainerLoop.resume`
loads the newest one and continues the step count from the larger of its number and the last step in the store.
Turns are leased for :data:`LEASE_S`; after a crash, turns claimed but not completed become claimable again when
their lease runs out, and anything already completed for "trainer" is never trained again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openclaw_cli.algorithms import RunningBaseline, TrainSample, build_datums, ppo_loss_config, teacher_messages
from openclaw_cli.backend import Backend
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store, TurnRecord
from openclaw_cli.types import AdamParams

log = logging.getLogger("openclaw.trainer")

CONSUMER = "trainer"
JUDGE_CONSUMER = "judge"
LEASE_S = 600.0  # long enough for a slow step on a big model; a crashed process's claims free up after it
MAX_STEP_ATTEMPTS = 3
KEEP_CHECKPOINTS = 3
CHECKPOINT_PREFIX = "step-"
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")
_STATE_FILE = "openclaw-state.json"  # written by the local backend's save_state; marks a finished checkpoint


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
    failures: int = 0
    last_error: str | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)  # mean reward per step, newest last (bounded)


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


class TrainerLoop:
    def __init__(self, store: Store, backend: Backend, settings: Settings, *, poll_s: float = 0.5) -> None:
        self.store = store
        self.backend = backend
        self.settings = settings
        self.poll_s = poll_s
        self.stats = TrainerStats()
        self.step = 0
        self._last_checkpoint_step: int | None = None
        self._pending: dict[int, TurnRecord] = {}  # claimed, waiting for a full batch (insertion = ready order)
        self._attempts = 0
        self._baseline = RunningBaseline(decay=settings.train.baseline_decay)

    @property
    def state_dir(self) -> Path:
        return Path(self.settings.local.state_dir).expanduser().resolve()

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def resume(self) -> int | None:
        """Load the newest checkpoint (if any) and continue the step count; returns the step it resumed from."""
        store_steps = await asyncio.to_thread(self.store.steps)
        last_recorded = store_steps[-1][0] if store_steps else 0
        checkpoints = list_checkpoints(self.state_dir)
        resumed: int | None = None
        if checkpoints:
            number, path = checkpoints[-1]
            info = await self.backend.load_state(str(path))
            resumed = number
            self._last_checkpoint_step = number
            log.info("resumed from checkpoint %s (serving version %d)", path, info.version)
        self.step = max(last_recorded, resumed or 0)
        self.stats.steps = self.step
        return resumed

    async def checkpoint(self) -> str | None:
        """Save state as ``step-NNNNNNNN`` unless the newest checkpoint already is this step."""
        if self._last_checkpoint_step == self.step:
            return None
        path = await self.backend.save_state(checkpoint_name(self.step))
        self._last_checkpoint_step = self.step
        self._prune_checkpoints()
        log.info("checkpoint saved: %s", path)
        return path

    def _prune_checkpoints(self) -> None:
        for _, path in list_checkpoints(self.state_dir)[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(path, ignore_errors=True)

    async def run(self, stop: asyncio.Event) -> None:
        """Train whenever a batch is ready until ``stop`` is set; the step in progress finishes, then a checkpoint."""
        try:
            while not stop.is_set():
                try:
                    report = await self.run_once()
                except Exception as exc:  # never let one bad batch end training for the whole process
                    log.exception("trainer round failed")
                    self.stats.failures += 1
                    self.stats.last_error = f"{type(exc).__name__}: {exc}"
                    report = None
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
        batch_size = self.settings.train.batch_size
        want = batch_size - len(self._pending)
        if want > 0:
            claimed = await asyncio.to_thread(self.store.claim_ready, CONSUMER, want, LEASE_S, after=JUDGE_CONSUMER)
            for turn in claimed:
                self._pending.setdefault(turn.id, turn)  # a re-delivered lease must not count twice
        if len(self._pending) < batch_size:
            return None
        batch = list(self._pending.values())[:batch_size]
        try:
            report = await self._train(batch)
        except Exception as exc:
            self._attempts += 1
            self.stats.failures += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            if self._attempts < MAX_STEP_ATTEMPTS:
                log.warning("training step failed (attempt %d, will retry): %s", self._attempts, exc)
                return None
            log.error("training step failed %d times; skipping its %d turns: %s", self._attempts, len(batch), exc)
            await self._complete(batch, {"trained": False, "error": self.stats.last_error})
            self._release(batch)
            return None
        self._release(batch)
        return report

    def _release(self, batch: list[TurnRecord]) -> None:
        for turn in batch:
            self._pending.pop(turn.id, None)
        self._attempts = 0

    async def _train(self, batch: list[TurnRecord]) -> StepReport | None:
        train = self.settings.train
        method = self.settings.method
        current_version = self.backend.current_version().version
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

        fb = await self.backend.forward_backward(datums, "ppo", ppo_loss_config(train))
        adam = AdamParams(
            learning_rate=train.lr,
            beta1=train.adam_beta1,
            beta2=train.adam_beta2,
            weight_decay=train.weight_decay,
            grad_clip_norm=train.grad_clip_norm,
        )
        optim = await self.backend.optim_step(adam)
        self._baseline.update([r for r in rewards if r != 0])
        # The update is in the trainer from here on: the turns count as trained even if publishing fails.
        step = self.step + 1
        self.step = step
        try:
            version = (await self.backend.publish(checkpoint_name(step))).version
            publish_error = None
        except Exception as exc:
            log.exception("publishing step %d failed; serving stays on the previous version", step)
            version = self.backend.current_version().version
            publish_error = f"{type(exc).__name__}: {exc}"

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
            "grad_norm": optim.metrics.get("grad_norm"),
            "lr": train.lr,
            "method": method,
            "backend_step": optim.step,
        }
        if publish_error is not None:
            metrics["publish_error"] = publish_error
        await asyncio.to_thread(self.store.record_step, step, version, metrics)
        trained = set(trained_ids)
        for turn in batch:
            outcome = {"trained": turn.id in trained, "step": step, "version": version}
            await asyncio.to_thread(self.store.complete, CONSUMER, turn.id, json.dumps(outcome))

        self.stats.steps = step
        self.stats.trained_samples += len(trained_ids)
        self.stats.last_metrics = metrics
        if mean_reward is not None:
            self.stats.rewards = [*self.stats.rewards[-199:], mean_reward]
        log.info(
            "step %d -> version %d: loss %.4f, reward %s, %d samples, %d tokens",
            step,
            version,
            fb.loss,
            "n/a" if mean_reward is None else f"{mean_reward:+.2f}",
            len(datums),
            metrics["tokens"],
        )
        if step % train.checkpoint_every == 0:
            try:
                await self.checkpoint()
            except Exception:
                log.exception("checkpoint at step %d failed; training continues", step)
        return StepReport(step, version, metrics, list(trained_ids), [t.id for t in batch])

    async def _complete(self, batch: list[TurnRecord], outcome: dict[str, Any]) -> None:
        text = json.dumps(outcome)
        for turn in batch:
            await asyncio.to_thread(self.store.complete, CONSUMER, turn.id, text)

    # -- samples --------------------------------------------------------------------------------------------------

    async def _samples(self, batch: list[TurnRecord]) -> tuple[list[TrainSample], list[float], int]:
        """TrainSamples for the usable turns, the judge scores of the batch, and how many turns were unusable."""
        samples: list[TrainSample] = []
        rewards: list[float] = []
        unusable = 0
        for turn in batch:
            verdict = await asyncio.to_thread(self.store.result_of, JUDGE_CONSUMER, turn.id)
            verdict = verdict if isinstance(verdict, dict) else {}
            score = verdict.get("score", turn.reward)
            reward = float(score) if isinstance(score, int | float) else None
            if reward is not None:
                rewards.append(reward)
            # The ratio needs the policy's raw log-probabilities of exactly these tokens; without them (or with a
            # mismatch) the turn cannot be trained without re-scoring under a version that may be gone.
            if not turn.completion_tokens or len(turn.logprobs) != len(turn.completion_tokens):
                unusable += 1
                continue
            teacher = None
            hint = verdict.get("hint")
            if self.settings.method != "rl" and isinstance(hint, str) and hint.strip():
                teacher = await self._teacher_logprobs(turn, hint)
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
                )
            )
        return samples, rewards, unusable

    async def _teacher_logprobs(self, turn: TurnRecord, hint: str) -> list[float] | None:
        """log pi_base(a_t | prompt + hint) for the completion tokens, or None when it cannot be scored."""
        try:
            prompt = self.backend.tokenizer().render(teacher_messages(turn.messages, hint), turn.tools)
            scored = await self.backend.compute_logprobs(prompt + list(turn.completion_tokens), base=True)
        except Exception as exc:  # e.g. the hint pushes the context past the model's limit
            log.warning("turn %d: cannot score the OPD teacher (%s); using its reward only", turn.id, exc)
            return None
        tail = scored[len(prompt) :]
        if len(tail) != len(turn.completion_tokens) or any(v is None for v in tail):
            return None
        return [float(v) for v in tail if v is not None]
