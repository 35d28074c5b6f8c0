"""``openclaw train --env MODULE:FN``: batch RL (GRPO) on an environment, on any backend.

Flags override ``[train_env]`` in the config file, which overrides the defaults; ``--set`` reaches everything else
(e.g. ``--set train.lr=5e-5``). At the end the trained state is saved with the backend's ``save_state`` (under
``local.state_dir`` for the local backend) unless ``--no-save``.

Every ``train_env.checkpoint_every`` steps the run is checkpointed (:mod:`openclaw_cli.env_training.checkpoints`);
``--resume RUN`` (or ``latest``, or ``RUN@STEP``) continues it from its last checkpoint with the run's own
``[train_env]`` settings, flags and ``--set train_env.*`` still winning (e.g. ``--steps 20`` to extend it).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from openclaw_cli.command_support import (
    EXIT_REFUSED,
    CliFailure,
    ConfigOption,
    ReportToOption,
    SetOption,
    command_overrides,
    with_report_to,
)

if TYPE_CHECKING:
    from rich.console import Console

    from openclaw_cli.env_training.checkpoints import RunManifest
    from openclaw_cli.env_training.custom_loss import CustomLoss
    from openclaw_cli.env_training.hooks import Env
    from openclaw_cli.env_training.rollout import RewardFn
    from openclaw_cli.env_training.trainer import StepStats
    from openclaw_cli.settings import Settings


def train_command(
    env: Annotated[
        str | None,
        typer.Option("--env", help="Rollout hook: MODULE:FN, path/to/file.py[:FN] or an openclaw.rollouts name."),
    ] = None,
    reward: Annotated[
        str | None, typer.Option("--reward", help="Reward hook (trajectory -> float); default: the env's reward.")
    ] = None,
    loss: Annotated[
        str | None, typer.Option("--loss", help="ppo (default), importance_sampling, or a custom loss hook.")
    ] = None,
    steps: Annotated[int | None, typer.Option("--steps", min=1, help="Optimizer steps.")] = None,
    group_size: Annotated[int | None, typer.Option("--group-size", min=2, help="GRPO samples per prompt.")] = None,
    prompts_per_step: Annotated[
        int | None, typer.Option("--prompts-per-step", min=1, help="GRPO groups per step.")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", min=1, help="Budget of one model call.")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature", min=0.0, help="Rollout sampling.")] = None,
    std_normalize: Annotated[
        bool | None,
        typer.Option("--std-normalize/--mean-centred", help="Divide group advantages by the std (default: no)."),
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seeds tasks and sampling.")] = None,
    env_arg: Annotated[
        list[str] | None, typer.Option("--env-arg", metavar="KEY=VALUE", help="Option for the env (repeatable).")
    ] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="Backend name (see `openclaw backends`).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="HF model id or local path.")] = None,
    save: Annotated[
        str | None, typer.Option("--save", help="Name of the saved state (default envrl-<date>-<time>).")
    ] = None,
    no_save: Annotated[bool, typer.Option("--no-save", help="Do not save the trained state.")] = False,
    resume: Annotated[
        str | None,
        typer.Option("--resume", metavar="RUN", help="Continue a checkpointed run: its name, RUN@STEP, or latest."),
    ] = None,
    metrics: Annotated[
        Path | None, typer.Option("--metrics", help="Also write one JSON line of metrics per step here.")
    ] = None,
    report_to: ReportToOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Train the policy with RL on an environment (GRPO groups, PPO loss), then save it."""
    from openclaw_cli.env_training.hooks import HookError, resolve_env, resolve_loss, resolve_reward

    flags = {
        "env": env,
        "reward": reward,
        "loss": loss,
        "steps": steps,
        "group_size": group_size,
        "prompts_per_step": prompts_per_step,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "std_normalize": std_normalize,
        "seed": seed,
    }
    named = {"backend": backend, "model": model}
    settings, manifest, run_name = _resolve_run(flags, named, env_arg or [], set_ or [], config, resume, save)
    settings = with_report_to(settings, report_to)
    spec = settings.train_env
    if not spec.env:
        raise CliFailure("no environment: pass --env MODULE:FN (or set train_env.env)", EXIT_REFUSED)
    try:
        env_hook = resolve_env(spec.env)
        reward_hook = resolve_reward(spec.reward) if spec.reward else None
        loss_hook = resolve_loss(spec.loss)
    except HookError as exc:
        raise CliFailure(str(exc), EXIT_REFUSED) from None

    save_name = None if no_save else (save or run_name)
    history, saved = _run_with_progress(
        settings, env_hook, reward_hook, loss_hook, save_name, metrics, run_name=run_name, resume=manifest
    )
    _print_summary(history, saved, settings, run_name)


def _print_summary(history: list[StepStats], saved: str | None, settings: Settings, run_name: str) -> None:
    from rich.console import Console

    console = Console()
    if history:
        first, last = history[0], history[-1]
        console.print(
            f"done: {len(history)} steps, mean reward {first.mean_reward:.3f} -> {last.mean_reward:.3f}, "
            f"solved {first.solved_fraction:.0%} -> {last.solved_fraction:.0%}",
            soft_wrap=True,
        )
    if saved:
        console.print(f"saved trained state to {saved}", soft_wrap=True, highlight=False)
    if _has_checkpoint(settings, run_name):
        console.print(
            f"checkpoints every {settings.train_env.checkpoint_every} steps; "
            f"continue with `openclaw train --resume {run_name}`",
            soft_wrap=True,
            highlight=False,
        )


def _resolve_run(
    flags: dict[str, Any],
    named: dict[str, str | None],
    env_args: list[str],
    set_pairs: list[str],
    config: Path | None,
    resume: str | None,
    save: str | None,
) -> tuple[Settings, RunManifest | None, str]:
    """The run's settings (config < --set < named flags; a resumed run's own train_env under what was given now),
    the manifest it resumes from, and its name; refuses (exit 2) what cannot run."""
    from openclaw_cli.env_training.checkpoints import (
        ResumeError,
        check_run_name,
        find_manifest,
        manifest_mismatches,
        read_manifest,
    )
    from openclaw_cli.settings import SettingsError, TrainEnvSettings, load_settings

    try:
        overrides = command_overrides(set_pairs, **named)
        section = overrides.setdefault("train_env", {})
        if not isinstance(section, dict):
            raise SettingsError("--set train_env=... must name a key inside the section, e.g. train_env.steps=5")
        section.update({k: v for k, v in flags.items() if v is not None})
        settings = load_settings(overrides, config=config)
        manifest = None
        if resume is not None:
            manifest = read_manifest(find_manifest(settings.local.state_dir, resume))
            # The run's own settings, so it continues as it started; what was given explicitly now still wins.
            settings.train_env = TrainEnvSettings(**{**manifest.train_env, **section})
            mismatches = manifest_mismatches(
                manifest, env=settings.train_env.env, seed=settings.train_env.seed, backend=settings.backend
            )
            if mismatches:
                raise ResumeError(f"run {manifest.run!r} step {manifest.step} was saved with " + ", ".join(mismatches))
        run_name = check_run_name(manifest.run if manifest else (save or time.strftime("envrl-%Y%m%d-%H%M%S")))
        bad = [pair for pair in env_args if "=" not in pair or not pair.partition("=")[0].strip()]
        if bad:
            raise SettingsError(f"--env-arg expects KEY=VALUE, got {bad[0]!r}")
        if env_args:  # after the configured ones, so a flag wins over the same key in the config file
            settings.train_env.env_args = [*settings.train_env.env_args, *env_args]
    except (SettingsError, ValueError, ResumeError) as exc:
        raise CliFailure(str(exc), EXIT_REFUSED) from None
    return settings, manifest, run_name


def _has_checkpoint(settings: Settings, run_name: str) -> bool:
    from openclaw_cli.env_training.checkpoints import ResumeError, find_manifest

    try:
        find_manifest(settings.local.state_dir, run_name)
    except ResumeError:
        return False
    return True


def _announce(console: Console, settings: Settings, loss: str | CustomLoss, resume: RunManifest | None) -> None:
    """The run's first lines: what trains on what, and where a resumed run picks up."""
    spec = settings.train_env
    model = settings.model or "the default model"
    loss_name = loss if isinstance(loss, str) else getattr(loss, "__name__", "custom loss")
    console.print(
        f"training {spec.env} on {settings.backend} ({model}): {spec.steps} steps x {spec.prompts_per_step} prompts "
        f"x {spec.group_size} samples, loss {loss_name}",
        soft_wrap=True,
        highlight=False,
    )
    if resume:
        console.print(
            f"resuming run {resume.run} after step {resume.step} ({resume.checkpoint})", soft_wrap=True, highlight=False
        )


def _run_with_progress(
    settings: Settings,
    env: Env,
    reward: RewardFn | None,
    loss: str | CustomLoss,
    save_name: str | None,
    metrics_path: Path | None,
    *,
    run_name: str,
    resume: RunManifest | None = None,
) -> tuple[list[StepStats], str | None]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from openclaw_cli.backend import BackendError
    from openclaw_cli.env_training.checkpoints import ResumeError
    from openclaw_cli.env_training.custom_loss import CustomLossError
    from openclaw_cli.env_training.trainer import RolloutError, train_on_env
    from openclaw_cli.settings import SettingsError
    from openclaw_cli.store import StoreError

    spec = settings.train_env
    per_step = spec.group_size * spec.prompts_per_step
    metrics_file = metrics_path.open("w", encoding="utf-8") if metrics_path is not None else None
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("rollouts"),
        TimeElapsedColumn(),
    )
    _announce(progress.console, settings, loss, resume)
    first_step = resume.step + 1 if resume else 1
    remaining = max(spec.steps - first_step + 1, 0)
    task = progress.add_task(f"step {min(first_step, spec.steps)}/{spec.steps}", total=remaining * per_step)

    def on_rollout() -> None:
        progress.advance(task)

    from openclaw_cli.tracking.hub import env_row, start_pushed_hub

    tracking = start_pushed_hub(settings, run_name)

    def on_step(stats: StepStats) -> None:
        if tracking is not None:
            tracking[1].push(env_row(stats.step, {**stats.to_json(), "source": "env"}))
            tracking[0].wake()
        progress.console.print(stats.line(), soft_wrap=True, highlight=False)
        progress.update(task, description=f"step {min(stats.step + 1, spec.steps)}/{spec.steps}")
        if metrics_file is not None:
            metrics_file.write(json.dumps(stats.to_json()) + "\n")
            metrics_file.flush()

    try:
        with progress:
            return asyncio.run(
                train_on_env(
                    settings,
                    env,
                    reward_fn=reward,
                    loss=loss,
                    save=save_name,
                    on_rollout=on_rollout,
                    on_step=on_step,
                    run_name=run_name,
                    resume=resume,
                )
            )
    except (RolloutError, BackendError, CustomLossError, ResumeError, SettingsError, StoreError) as exc:
        raise CliFailure(str(exc)) from None
    finally:
        if metrics_file is not None:
            metrics_file.close()
        if tracking is not None:
            tracking[0].stop(30.0)
