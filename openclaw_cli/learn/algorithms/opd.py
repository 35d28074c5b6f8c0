"""On-Policy Distillation: a hint-conditioned teacher scores the student's own tokens.

A_t = clip(log pi_teacher(a_t | s + hint) - log pi_old(a_t | s), -c, c). The log-ratio is first clamped to +-20 (a
token the teacher finds impossible must not produce an infinite advantage), then clipped to +-c (default 1, the
reference method's current recipe) so a few surprising tokens cannot dominate a batch.
"""

from __future__ import annotations

from typing import Any

from openclaw_cli.instructions import INSTRUCTION_HEADER, with_instruction

HINT_HEADER = INSTRUCTION_HEADER
LOGRATIO_CLAMP = 20.0


def teacher_messages(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The teacher's context: the same conversation with the hint where the model follows it best (placed by
    :func:`openclaw_cli.instructions.with_instruction`, as the proxy places a user's lessons)."""
    if not hint.strip():
        raise ValueError("an OPD hint must not be empty")
    return with_instruction(messages, hint, HINT_HEADER)


def opd_advantages(
    teacher_logprobs: list[float], old_logprobs: list[float], clip: float = 1.0, clip_high: float | None = None
) -> list[float]:
    """Per-token ``teacher - old``, clamped to +-20, then clipped to ``[-clip, clip_high]`` (``clip_high`` None =
    ``clip``; ``clip <= 0`` = no clip). A ``clip_high`` of 0 keeps only the teacher's objections: a token the
    student sampled from its tail, which a flatter (hint-confused) teacher happens to rate higher, is not pushed up,
    so the student's distribution does not flatten."""
    if len(teacher_logprobs) != len(old_logprobs):
        raise ValueError(f"teacher has {len(teacher_logprobs)} logprobs, student has {len(old_logprobs)}")
    high = clip if clip_high is None else clip_high
    out = []
    for teacher, old in zip(teacher_logprobs, old_logprobs, strict=True):
        diff = max(-LOGRATIO_CLAMP, min(LOGRATIO_CLAMP, teacher - old))
        out.append(max(-clip, min(high, diff)) if clip > 0 else diff)
    return out
