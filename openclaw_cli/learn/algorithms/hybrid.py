"""Hybrid: A_t = w_opd * (teacher - old) + w_rl * r, with per-turn dispatch when only one signal exists."""

from __future__ import annotations

from openclaw_cli.learn.algorithms.binary_rl import binary_rl_advantages
from openclaw_cli.learn.algorithms.opd import opd_advantages


def hybrid_advantages(
    *,
    old_logprobs: list[float],
    reward: float | None,
    teacher_logprobs: list[float] | None,
    w_opd: float = 1.0,
    w_rl: float = 1.0,
    baseline: float = 0.0,
    opd_clip: float = 1.0,
    opd_clip_high: float | None = None,
) -> list[float] | None:
    """Hint and a non-zero reward -> both terms; hint only -> OPD term; reward only -> RL term; neither -> None."""
    n = len(old_logprobs)
    has_rl = reward is not None and reward != 0
    has_opd = teacher_logprobs is not None
    if not has_rl and not has_opd:
        return None
    total = [0.0] * n
    if has_opd:
        assert teacher_logprobs is not None
        total = [w_opd * a for a in opd_advantages(teacher_logprobs, old_logprobs, opd_clip, opd_clip_high)]
    if has_rl:
        assert reward is not None
        total = [t + w_rl * a for t, a in zip(total, binary_rl_advantages(reward, n, baseline), strict=True)]
    return total
