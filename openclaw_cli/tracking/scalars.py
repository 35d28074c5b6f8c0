"""The metric names trackers receive (the table in docs/tracking.md is generated from :data:`STEP_METRICS`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# name -> (path into the step's metrics row, what it is). A path is dotted keys; "=version" is the row's version.
STEP_METRICS: dict[str, tuple[str, str]] = {
    "train/loss": ("loss", "the step's PPO loss (the backend's sum over tokens, normalised per train.loss_norm)"),
    "train/reward_mean": ("mean_reward", "mean judge score of the batch (-1 correction, 0 neutral, +1 progress)"),
    "train/reward_std": ("reward_std", "spread (population std) of those scores"),
    "train/advantage_mean": ("advantage.mean", "mean per-token advantage over the tokens that carry a gradient"),
    "train/advantage_std": ("advantage.std", "spread of those advantages"),
    "train/advantage_min": ("advantage.min", "smallest of them"),
    "train/advantage_max": ("advantage.max", "largest of them"),
    "train/advantage_tokens": ("advantage.tokens", "how many tokens carry a gradient"),
    "train/kl_sampler": ("kl_sampler", "mean log ratio of trainer to sampler on the trained tokens (drift check)"),
    "train/ratio_mean": ("ratio_mean", "mean PPO ratio"),
    "train/clip_fraction": ("clip_fraction", "share of tokens whose ratio was clipped"),
    "train/grad_norm": ("grad_norm", "gradient norm before clipping (where the backend reports it)"),
    "train/lr": ("lr", "learning rate (train.lr)"),
    "train/tokens": ("tokens", "tokens in the step's datums"),
    "train/samples": ("n_samples", "datums trained (turns, demonstrations, replays, loop probes)"),
    "train/batch_turns": ("n_batch", "captured turns the batch consumed (train.batch_size)"),
    "train/dropped_stale": ("dropped_stale", "turns too many versions old to train"),
    "train/unusable": ("unusable", "turns without usable token logprobs (or withheld by store.redact)"),
    "train/teacher_hints": ("teacher_hints", "samples distilled from a hint (OPD)"),
    "train/demos": ("demos", "hindsight demonstrations trained"),
    "train/replayed_demos": ("replayed_demos", "earlier demonstrations replayed"),
    "train/lesson_demos": ("lesson_demos", "turns served with a lesson, trained as if served without it"),
    "train/loop_probes": ("loops", "loop-probe samples that fired (a looping reply trained against)"),
    "time/score_s": ("seconds.score", "seconds scoring teacher / base logprobs"),
    "time/train_s": ("seconds.train", "seconds in forward-backward and the optimizer step"),
    "time/publish_s": ("seconds.publish", "seconds publishing (collapse guard and gate included)"),
    "policy/version": ("=version", "policy version serving after the step"),
    "publish/promoted": ("publish.promoted", "1 when the new version was served, 0 when held back"),
    "publish/guard_ok": ("publish.guard_ok", "1 when the collapse guard passed the version, 0 when it held it"),
    "publish/kl_base": ("publish.kl_base", "collapse guard's KL estimate of the new version to the base model"),
    "publish/distinct_min": ("publish.distinct_min", "collapse guard's lowest distinct-word ratio over its probes"),
    "publish/win_rate": ("publish.win_rate", "promotion gate: the new version's win rate over the served one"),
    "judge/progress": ("judge.progress", "verdicts +1 in the batch"),
    "judge/correction": ("judge.correction", "verdicts -1 in the batch"),
    "judge/neutral": ("judge.neutral", "verdicts 0 in the batch (no next state, unclear, under judge.margin)"),
    "judge/latency_s": ("judge.latency_s", "mean seconds a verdict took (judge calls and retries)"),
    "capture/sessions": ("capture.sessions", "sessions in the store"),
    "capture/main_turns": ("capture.main_turns", "trainable main-line turns captured"),
    "capture/side_turns": ("capture.side_turns", "side turns captured (never trained)"),
    "lessons/active": ("lessons.active", "lessons in use in prompts"),
    "lessons/candidate": ("lessons.candidate", "lessons waiting for verification"),
    "lessons/retired": ("lessons.retired", "lessons retired because the weights learned them"),
}

# `openclaw train --env` rows (tagged "source": "env"): StepStats fields.
ENV_METRICS: dict[str, tuple[str, str]] = {
    "env/reward_mean": ("mean_reward", "mean rollout reward"),
    "env/solved_fraction": ("solved_fraction", "share of rollouts that solved the task"),
    "env/loss": ("loss", "the step's loss"),
    "env/rollouts": ("rollouts", "rollouts run"),
    "env/failed_rollouts": ("failed_rollouts", "rollouts that failed"),
    "env/groups_trained": ("=groups_trained", "GRPO groups with signal"),
    "env/sampled_tokens": ("sampled_tokens", "tokens sampled"),
    "env/trained_turns": ("trained_turns", "model calls trained"),
    "env/seconds": ("seconds", "wall time of the step"),
    "policy/version": ("published_version", "policy version after the step"),
}

# `openclaw eval` reports (EvalReport.to_json()), sent at the latest training step when they reach the store.
EVAL_METRICS: dict[str, tuple[str, str]] = {
    "eval/win_rate": ("win_rate_b", "win rate of version B over A (ties count half)"),
    "eval/mean_score_a": ("mean_score_a", "mean judge score of version A's replies"),
    "eval/mean_score_b": ("mean_score_b", "mean judge score of version B's replies"),
    "eval/prompts": ("n", "held-out prompts evaluated"),
    "eval/pairs_judged": ("pairs_judged", "A/B pairs the judge compared"),
}


def number(value: Any) -> float | None:
    """A finite float for a tracker, or None: bools become 1/0; strings, lists and NaN are not scalars."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def _lookup(row: Mapping[str, Any], path: str) -> Any:
    value: Any = row
    for key in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _pick(table: Mapping[str, tuple[str, str]], row: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, (path, _) in table.items():
        value = number(_lookup(row, path.removeprefix("=")))
        if value is not None:
            out[name] = value
    return out


def step_scalars(version: int | None, metrics: Mapping[str, Any]) -> dict[str, float]:
    """The scalars of one ``steps`` row (a value the row lacks is left out, never sent as 0)."""
    if metrics.get("source") == "env":
        groups = number(metrics.get("groups"))
        skipped = number(metrics.get("groups_skipped"))
        extra = {"groups_trained": groups - skipped} if groups is not None and skipped is not None else {}
        return _pick(ENV_METRICS, {**metrics, **extra})
    return _pick(STEP_METRICS, {**metrics, "version": version})


def eval_scalars(report: Mapping[str, Any]) -> dict[str, float]:
    return _pick(EVAL_METRICS, report)


def metric_table() -> str:
    """The Markdown table of every metric name (docs/tracking.md holds its output; a test keeps them equal)."""
    lines = ["| name | what it is | steps row key |", "| --- | --- | --- |"]
    for table in (STEP_METRICS, ENV_METRICS, EVAL_METRICS):
        for name, (path, what) in table.items():
            key = "version column" if path == "=version" else "(computed)" if path.startswith("=") else f"`{path}`"
            lines.append(f"| `{name}` | {what} | {key} |")
    return "\n".join(lines)
