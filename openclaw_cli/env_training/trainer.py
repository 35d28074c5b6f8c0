"""Batch RL on an environment (GRPO): rollouts -> group advantages -> one optimizer step -> publish, per step.

Each step:

1. fixes the policy version (the one serving now) and runs ``prompts_per_step`` groups of ``group_size`` rollouts,
   ``concurrency`` at a time; the members of a group share a task RNG (same prompt), their samples differ;
2. scores every trajectory (the ``--reward`` hook when given, else the trajectory's own rewards) and turns each
   group's returns into advantages (:mod:`openclaw_cli.env_training.advantages`); groups with all-equal returns are
   skipped;
3. builds Tinker-aligned datums (:mod:`openclaw_cli.env_training.batch`) and calls ``forward_backward`` with ``ppo``
   (clip from ``train.eps_low`` / ``train.eps_high``), ``importance_sampling``, or a custom loss
   (:mod:`openclaw_cli.env_training.custom_loss`), then ``optim_step`` with the ``train.*`` Adam settings, then
   ``publish``. A step whose groups are all skipped trains nothing and publishes nothing.

Only the :class:`~openclaw_cli.backend.Backend` protocol is used, so it runs on any backend.

Failures: a rollout (or reward hook) that raises is logged with its step, group and member, and its whole group is
dropped from the step (GRPO advantages of a group missing a member are biased); the step's ``failed_rollouts`` and
``failed_groups`` count them. When more than ``train_env.max_failed_fraction`` of a step's rollouts fail, the run
stops with :class:`RolloutError` naming the first failure: training on a mostly broken environment would only teach
the policy noise.

Checkpoints: with a run name, every ``train_env.checkpoint_every`` steps the backend state is saved and a manifest
written (:mod:`openclaw_cli.env_training.checkpoints`; the newest ``train_env.keep_checkpoints`` are kept);
:meth:`EnvTrainer.resume` loads one and the run continues at the next step with the same seeded tasks (seeds derive
from ``(seed, step, group[, member])``, never from history).
With a store, every step's metrics are recorded in its ``steps`` table (tagged ``"source": "env"``) for
``openclaw eval --plot``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from openclaw_cli.backend import Backend, BackendError
from openclaw_cli.env_training.batch import ScoredGroup, TrainTurn, score_group, to_datums, train_turns
from openclaw_cli.env_training.checkpoints import (
    ResumeError,
    RunManifest,
    check_run_name,
    checkpoint_state_name,
    manifest_mismatches,
    prune_run,
    write_manifest,
)
from openclaw_cli.env_training.custom_loss import CustomLoss, forward_backward_custom
from openclaw_cli.env_training.hooks import BUILTIN_LOSSES, Env, maybe_await
from openclaw_cli.env_training.rollout import BackendPolicy, RewardFn, RolloutContext, Trajectory, derive_seed
from openclaw_cli.learn.algorithms import adam_params_from, ppo_loss_config
from openclaw_cli.settings import Settings, SettingsError
from openclaw_cli.store import Store
from openclaw_cli.types import FwdBwdResult, LossName

log = logging.getLogger("openclaw.envrl")

SOLVED_THRESHOLD = 1.0  # a trajectory that does not say whether it solved its task counts as solved at this return


class RolloutError(RuntimeError):
    """A rollout or reward hook failed; the message says which one and why."""


@dataclass
class StepStats:
    """One training step: what was collected, what was trained, and the backend's numbers."""

    step: int
    version: int  # the policy version the rollouts sampled from
    published_version: int | None  # None when nothing was trained
    mean_reward: float
    solved_fraction: float
    rollouts: int
    groups: int
    groups_skipped: int
    sampled_tokens: int
    trained_turns: int
    loss: float | None
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    failed_rollouts: int = 0
    failed_groups: int = 0  # dropped from the step (not counted in ``groups``)

    def line(self) -> str:
        """The per-step metrics line the CLI prints."""
        loss = "-" if self.loss is None else f"{self.loss:.3g}"
        trained = f"v{self.published_version}" if self.published_version is not None else "no signal, not trained"
        failed = (
            f", {self.failed_rollouts} rollouts failed ({self.failed_groups} groups dropped)"
            if self.failed_rollouts
            else ""
        )
        return (
            f"step {self.step}: reward {_fmt(self.mean_reward, '.3f')}, solved {_fmt(self.solved_fraction, '.0%')}, "
            f"{self.sampled_tokens} tokens, {self.groups - self.groups_skipped}/{self.groups} groups trained{failed}, "
            f"loss {loss}, {trained} ({self.seconds:.1f}s)"
        )

    def to_json(self) -> dict[str, Any]:
        """JSON-able (a NaN mean of a step whose groups all failed becomes null)."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepStats:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("mean_reward", "solved_fraction"):
            if known.get(key) is None:
                known[key] = math.nan
        return cls(**known)


def _fmt(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else "-"


@dataclass
class RolloutFailure:
    group: int
    member: int
    error: RolloutError


class EnvTrainer:
    """Runs ``settings.train_env.steps`` GRPO steps of ``env`` on a started backend (module docstring).

    ``run_name`` turns on mid-run checkpoints (every ``train_env.checkpoint_every`` steps); ``store`` records each
    step's metrics in that store's ``steps`` table."""

    def __init__(
        self,
        backend: Backend,
        settings: Settings,
        env: Env,
        *,
        reward_fn: RewardFn | None = None,
        loss: str | CustomLoss = "ppo",
        on_rollout: Callable[[], None] | None = None,
        on_step: Callable[[StepStats], None] | None = None,
        run_name: str | None = None,
        store: Store | None = None,
    ) -> None:
        if isinstance(loss, str) and loss not in BUILTIN_LOSSES:
            raise ValueError(f"loss must be one of {', '.join(BUILTIN_LOSSES)} or a custom loss function, got {loss!r}")
        self.backend = backend
        self.settings = settings
        self.config = settings.train_env
        self.env = env
        self.reward_fn = reward_fn
        self.loss = loss
        self.on_rollout = on_rollout
        self.on_step = on_step
        self.run_name = check_run_name(run_name) if run_name is not None else None
        self.store = store
        self.history: list[StepStats] = []  # every step of the run so far, resumed ones included
        self.next_step = 1
        self.checkpoints: list[tuple[int, str, Path]] = []  # (step, saved state, manifest) written by this trainer
        self.checkpoint_errors: list[tuple[int, str]] = []

    async def resume(self, manifest: RunManifest) -> None:
        """Load the manifest's saved state and continue after its step, with its metrics as the history so far.

        Refuses a manifest of another env, seed or backend: the run would not be the one it continues."""
        mismatches = manifest_mismatches(
            manifest, env=self.config.env, seed=self.config.seed, backend=self.settings.backend
        )
        if mismatches:
            raise ResumeError(f"run {manifest.run!r} step {manifest.step} was saved with " + ", ".join(mismatches))
        await self.backend.load_state(manifest.checkpoint)
        self.run_name = self.run_name or manifest.run
        self.history = [StepStats.from_json(h) for h in manifest.history]
        self.next_step = manifest.step + 1
        log.info("resumed run %s from step %d (%s)", manifest.run, manifest.step, manifest.checkpoint)

    async def run(self) -> list[StepStats]:
        """Steps ``next_step .. train_env.steps``; returns the whole history (resumed steps first)."""
        for step in range(self.next_step, self.config.steps + 1):
            stats = await self.run_step(step)
            self.history.append(stats)
            self.next_step = step + 1
            if self.store is not None:
                row = self.store_metrics(stats)
                await asyncio.to_thread(self.store.record_step, step, stats.published_version, row)
            every = self.config.checkpoint_every
            if self.run_name is not None and every and step % every == 0:
                try:
                    await self.checkpoint(step)
                except BackendError as exc:  # losing a checkpoint must not lose the run that is still going
                    log.warning("checkpoint after step %d failed, training goes on without it: %s", step, exc)
                    self.checkpoint_errors.append((step, str(exc)))
            if self.on_step is not None:
                self.on_step(stats)
        return list(self.history)

    def store_metrics(self, stats: StepStats) -> dict[str, Any]:
        """A step's row in the store: its stats (``mean_reward`` is what ``openclaw eval --plot`` draws), tagged so
        env steps are told apart from the online trainer's."""
        return {**stats.to_json(), "source": "env", "env": self.config.env, "run": self.run_name}

    async def checkpoint(self, step: int) -> Path:
        """Save the backend state after ``step``, then (so a manifest never points at a missing state) its manifest."""
        assert self.run_name is not None
        saved = await self.backend.save_state(checkpoint_state_name(self.run_name, step))
        manifest = RunManifest(
            run=self.run_name,
            step=step,
            checkpoint=saved,
            backend=self.settings.backend,
            model=self.settings.model,
            env=self.config.env,
            seed=self.config.seed,
            train_env=self.config.model_dump(mode="json"),
            history=[s.to_json() for s in self.history],
        )
        path = await asyncio.to_thread(write_manifest, self.settings.local.state_dir, manifest)
        self.checkpoints.append((step, saved, path))
        try:
            await asyncio.to_thread(
                prune_run, self.settings.local.state_dir, self.run_name, self.config.keep_checkpoints
            )
        except OSError as exc:  # a full or read-only disk must not stop a run that just saved its state
            log.warning("could not delete the checkpoints before step %d of run %s: %s", step, self.run_name, exc)
        return path

    async def run_step(self, step: int) -> StepStats:
        started = time.monotonic()
        version = self.backend.current_version().version
        groups, failures = await self.collect_with_failures(step, version)
        trajectories = [t for g in groups for t in g.trajectories]
        rewards = [r for g in groups for r in g.rewards]
        solved = [_solved(t, r) for t, r in zip(trajectories, rewards, strict=True)]
        turns = train_turns(groups)
        fb: FwdBwdResult | None = None
        published: int | None = None
        metrics: dict[str, float] = {}
        if turns:
            fb = await self._forward_backward(turns)
            optim = await self.backend.optim_step(adam_params_from(self.settings.train))
            published = (await self.backend.publish(f"envrl-step-{step}")).version
            metrics = {**fb.metrics, **{k: float(v) for k, v in optim.metrics.items()}}
        return StepStats(
            step=step,
            version=version,
            published_version=published,
            mean_reward=sum(rewards) / len(rewards) if rewards else math.nan,
            solved_fraction=sum(solved) / len(solved) if solved else math.nan,
            rollouts=len(trajectories),
            groups=len(groups),
            groups_skipped=sum(g.skipped for g in groups),
            sampled_tokens=sum(t.completion_tokens for t in trajectories),
            trained_turns=len(turns),
            loss=None if fb is None else fb.loss,
            seconds=time.monotonic() - started,
            metrics=metrics,
            rewards=rewards,
            failed_rollouts=len(failures),
            failed_groups=len({f.group for f in failures}),
        )

    async def collect(self, step: int, version: int) -> list[ScoredGroup]:
        """Every complete group of a step, scored (group order is fixed, whatever finishes first)."""
        groups, _ = await self.collect_with_failures(step, version)
        return groups

    async def collect_with_failures(self, step: int, version: int) -> tuple[list[ScoredGroup], list[RolloutFailure]]:
        """The step's complete groups, scored, and its failed rollouts (whose groups are left out). Raises
        :class:`RolloutError` (from the first failure) when more than ``max_failed_fraction`` of them failed."""
        limit = asyncio.Semaphore(self.config.concurrency)
        groups, members = self.config.prompts_per_step, self.config.group_size

        async def one(group: int, member: int) -> tuple[Trajectory, float] | RolloutFailure:
            async with limit:
                try:
                    result: tuple[Trajectory, float] | RolloutFailure = await self._rollout(
                        step, version, group, member
                    )
                except RolloutError as exc:
                    log.warning("%s; dropping group %d from step %d", exc, group, step, exc_info=exc.__cause__)
                    result = RolloutFailure(group, member, exc)
            if self.on_rollout is not None:
                self.on_rollout()
            return result

        results = await asyncio.gather(*(one(g, m) for g in range(groups) for m in range(members)))
        failures = [r for r in results if isinstance(r, RolloutFailure)]
        if len(failures) > self.config.max_failed_fraction * len(results):
            first = failures[0].error
            raise RolloutError(
                f"{len(failures)} of {len(results)} rollouts of step {step} failed (more than "
                f"train_env.max_failed_fraction={self.config.max_failed_fraction:g}); first: {first}"
            ) from first
        failed_groups = {f.group for f in failures}
        scored = []
        for g in range(groups):
            if g in failed_groups:
                continue
            chunk = [r for r in results[g * members : (g + 1) * members] if not isinstance(r, RolloutFailure)]
            scored.append(
                score_group([t for t, _ in chunk], [r for _, r in chunk], std_normalize=self.config.std_normalize)
            )
        return scored, failures

    async def _rollout(self, step: int, version: int, group: int, member: int) -> tuple[Trajectory, float]:
        seed = self.config.seed
        policy = BackendPolicy(
            self.backend,
            version=version,
            max_tokens=self.config.max_tokens,
            temperature=self.config.temperature,
            seed_parts=(seed, step, group, member),
        )
        ctx = RolloutContext(
            policy=policy,
            tokenizer=self.backend.tokenizer(),
            rng=random.Random(derive_seed(seed, step, group)),
            seed=derive_seed(seed, step, group),
            step=step,
            group=group,
            member=member,
            env_args=parse_env_args(self.config.env_args),
        )
        where = f"step {step}, group {group}, member {member}"
        try:
            trajectory = await maybe_await(self.env.rollout(ctx))
        except Exception as exc:
            raise RolloutError(f"rollout failed ({where}): {type(exc).__name__}: {exc}") from exc
        if not isinstance(trajectory, Trajectory):
            raise RolloutError(f"rollout returned {type(trajectory).__name__}, expected a Trajectory ({where})")
        try:
            reward = await maybe_await(self.reward_fn(trajectory)) if self.reward_fn else trajectory.total_reward()
        except Exception as exc:
            raise RolloutError(f"reward hook failed ({where}): {type(exc).__name__}: {exc}") from exc
        if reward is None:
            raise RolloutError(f"the trajectory carries no reward and no reward hook is set ({where})")
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise RolloutError(f"reward must be a finite number, got {reward!r} ({where})")
        return trajectory, float(reward)

    async def _forward_backward(self, turns: list[TrainTurn]) -> FwdBwdResult:
        discard = getattr(self.backend, "discard_gradients", None)
        if callable(discard):  # a failed earlier call must not leave gradients behind to be counted again
            await discard()
        if not isinstance(self.loss, str):
            return await forward_backward_custom(self.backend, turns, self.loss)
        config = ppo_loss_config(self.settings.train) if self.loss == "ppo" else None
        return await self.backend.forward_backward(to_datums(turns), cast(LossName, self.loss), config)


def parse_env_args(pairs: list[str]) -> dict[str, str]:
    """``["url=http://x", "max_turns=3"]`` -> a dict (a later key wins; values keep any further ``=``)."""
    parsed = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        parsed[key.strip()] = value
    return parsed


def _solved(trajectory: Trajectory, reward: float) -> bool:
    return trajectory.solved if trajectory.solved is not None else reward >= SOLVED_THRESHOLD


async def close_env(env: Env) -> None:
    """Call the env's ``aclose`` or ``close`` if it has one (sync or async)."""
    for name in ("aclose", "close"):
        method = getattr(env, name, None)
        if callable(method):
            result = method()
            if inspect.isawaitable(result):
                await result
            return


def open_env_store(settings: Settings) -> Store | None:
    """The store ``train_env.store`` names (created if missing), or None when unset. Refuses the online store: its
    trainer numbers the steps table and, on resume, deletes steps past its checkpoint, env rows included."""
    path = settings.train_env.store
    if path is None:
        return None
    target = Path(path).expanduser().resolve()
    if target == Path(settings.store.path).expanduser().resolve():
        raise SettingsError(
            f"train_env.store {path} is the online store (store.path); give env runs their own file, then plot "
            "it with `openclaw eval --plot-only --plot out.png --set store.path=<that file>`"
        )
    return Store(target)


async def train_on_env(
    settings: Settings,
    env: Env,
    *,
    reward_fn: RewardFn | None = None,
    loss: str | CustomLoss = "ppo",
    backend: Backend | None = None,
    save: str | None = None,
    on_rollout: Callable[[], None] | None = None,
    on_step: Callable[[StepStats], None] | None = None,
    run_name: str | None = None,
    resume: RunManifest | None = None,
) -> tuple[list[StepStats], str | None]:
    """Start the configured backend (unless one is given, started), optionally resume from a manifest, train
    (checkpointing under ``run_name``, recording steps in ``train_env.store``), optionally ``save_state(save)``,
    close what was opened here. Returns the step stats (resumed ones first) and the saved state's path (None
    without ``save``)."""
    from openclaw_cli.backend import create_backend

    store = open_env_store(settings)
    owned = backend is None
    try:
        if backend is None:
            backend = create_backend(settings)
        if owned:
            await backend.start()
        trainer = EnvTrainer(
            backend,
            settings,
            env,
            reward_fn=reward_fn,
            loss=loss,
            on_rollout=on_rollout,
            on_step=on_step,
            run_name=run_name,
            store=store,
        )
        if resume is not None:
            await trainer.resume(resume)
        history = await trainer.run()
        saved = await backend.save_state(save) if save else None
        return history, saved
    finally:
        try:
            await close_env(env)
        finally:
            try:
                if owned and backend is not None:
                    await backend.close()
            finally:
                if store is not None:
                    store.close()
