"""Batch RL on an environment (GRPO): rollouts -> group advantages -> one optimizer step -> publish, per step.

Each step:

1. fixes the policy version (the one serving now) and runs ``prompts_per_step`` groups of ``group_size`` rollouts,
   ``concurrency`` at a time; the members of a group share a task RNG (same prompt), their samples differ;
2. scores every trajectory (the ``--reward`` hook when given, else the trajectory's own rewards) and turns each
   group's returns into advantages (:mod:`openclaw_cli.envrl.advantages`); groups with all-equal returns are
   skipped;
3. builds Tinker-aligned datums (:mod:`openclaw_cli.envrl.batch`) and calls ``forward_backward`` with ``ppo``
   (clip from ``train.eps_low`` / ``train.eps_high``), ``importance_sampling``, or a custom loss
   (:mod:`openclaw_cli.envrl.custom_loss`), then ``optim_step`` with the ``train.*`` Adam settings, then
   ``publish``. A step whose groups are all skipped trains nothing and publishes nothing.

Only the :class:`~openclaw_cli.backend.Backend` protocol is used, so it runs on any backend. A rollout that raises
stops the run with :class:`RolloutError` naming the step, group and member: training on a silently broken
environment would only teach the policy noise.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from openclaw_cli.algorithms import ppo_loss_config
from openclaw_cli.backend import Backend
from openclaw_cli.envrl.batch import ScoredGroup, TrainTurn, score_group, to_datums, train_turns
from openclaw_cli.envrl.custom_loss import CustomLoss, forward_backward_custom
from openclaw_cli.envrl.hooks import BUILTIN_LOSSES, Env, maybe_await
from openclaw_cli.envrl.rollout import BackendPolicy, RewardFn, RolloutContext, Trajectory, derive_seed
from openclaw_cli.settings import Settings, TrainSettings
from openclaw_cli.types import AdamParams, FwdBwdResult

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

    def line(self) -> str:
        """The per-step metrics line the CLI prints."""
        loss = "-" if self.loss is None else f"{self.loss:.3g}"
        trained = f"v{self.published_version}" if self.published_version is not None else "no signal, not trained"
        return (
            f"step {self.step}: reward {self.mean_reward:.3f}, solved {self.solved_fraction:.0%}, "
            f"{self.sampled_tokens} tokens, {self.groups - self.groups_skipped}/{self.groups} groups trained, "
            f"loss {loss}, {trained} ({self.seconds:.1f}s)"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def adam_params(train: TrainSettings) -> AdamParams:
    return AdamParams(
        learning_rate=train.lr,
        beta1=train.adam_beta1,
        beta2=train.adam_beta2,
        weight_decay=train.weight_decay,
        grad_clip_norm=train.grad_clip_norm,
    )


class EnvTrainer:
    """Runs ``settings.train_env.steps`` GRPO steps of ``env`` on a started backend (module docstring)."""

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

    async def run(self) -> list[StepStats]:
        history = []
        for step in range(1, self.config.steps + 1):
            stats = await self.run_step(step)
            history.append(stats)
            if self.on_step is not None:
                self.on_step(stats)
        return history

    async def run_step(self, step: int) -> StepStats:
        started = time.monotonic()
        version = self.backend.current_version().version
        groups = await self.collect(step, version)
        trajectories = [t for g in groups for t in g.trajectories]
        rewards = [r for g in groups for r in g.rewards]
        solved = [_solved(t, r) for t, r in zip(trajectories, rewards, strict=True)]
        turns = train_turns(groups)
        fb: FwdBwdResult | None = None
        published: int | None = None
        metrics: dict[str, float] = {}
        if turns:
            fb = await self._forward_backward(turns)
            optim = await self.backend.optim_step(adam_params(self.settings.train))
            published = (await self.backend.publish(f"envrl-step-{step}")).version
            metrics = {**fb.metrics, **{k: float(v) for k, v in optim.metrics.items()}}
        return StepStats(
            step=step,
            version=version,
            published_version=published,
            mean_reward=sum(rewards) / len(rewards),
            solved_fraction=sum(solved) / len(solved),
            rollouts=len(trajectories),
            groups=len(groups),
            groups_skipped=sum(g.skipped for g in groups),
            sampled_tokens=sum(t.completion_tokens for t in trajectories),
            trained_turns=len(turns),
            loss=None if fb is None else fb.loss,
            seconds=time.monotonic() - started,
            metrics=metrics,
            rewards=rewards,
        )

    async def collect(self, step: int, version: int) -> list[ScoredGroup]:
        """Every rollout of a step, scored and grouped (group order is fixed, whatever finishes first)."""
        limit = asyncio.Semaphore(self.config.concurrency)
        groups, members = self.config.prompts_per_step, self.config.group_size

        async def one(group: int, member: int) -> tuple[Trajectory, float]:
            async with limit:
                result = await self._rollout(step, version, group, member)
            if self.on_rollout is not None:
                self.on_rollout()
            return result

        results = await asyncio.gather(*(one(g, m) for g in range(groups) for m in range(members)))
        scored = []
        for g in range(groups):
            chunk = results[g * members : (g + 1) * members]
            scored.append(
                score_group([t for t, _ in chunk], [r for _, r in chunk], std_normalize=self.config.std_normalize)
            )
        return scored

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
        return await self.backend.forward_backward(to_datums(turns), self.loss, config)


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
) -> tuple[list[StepStats], str | None]:
    """Start the configured backend (unless one is given, started), train, optionally ``save_state(save)``, close
    what was opened here. Returns the step stats and the saved state's path (None without ``save``)."""
    from openclaw_cli.backend import create_backend

    owned = backend is None
    if backend is None:
        backend = create_backend(settings)
    try:
        if owned:
            await backend.start()
        trainer = EnvTrainer(
            backend, settings, env, reward_fn=reward_fn, loss=loss, on_rollout=on_rollout, on_step=on_step
        )
        history = await trainer.run()
        saved = await backend.save_state(save) if save else None
        return history, saved
    finally:
        try:
            await close_env(env)
        finally:
            if owned:
                await backend.close()
