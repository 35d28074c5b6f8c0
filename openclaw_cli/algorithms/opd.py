"""On-Policy Distillation: a hint-conditioned teacher scores the student's own tokens.

A_t = clip(log pi_teacher(a_t | s + hint) - log pi_old(a_t | s), -c, c). The log-ratio is first clamped to +-20 (a
token the teacher finds impossible must not produce an infinite advantage), then clipped to +-c (default 1, the
reference method's current recipe) so a few surprising tokens cannot dominate a batch.
"""

from __future__ import annotations

import copy
from typing import Any

from openclaw_cli.tokenizer import flatten_content

HINT_HEADER = "[user's hint / instruction]"
LOGRATIO_CLAMP = 20.0


def teacher_messages(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The teacher's context: the same conversation with the hint where the model follows it best.

    For the first reply to a conversation (no assistant message in it yet) the hint is an instruction in the system
    message (appended to it, or a new one in front): read that way, SmolLM2's greedy answers to the 16 training
    questions of ``bench/learning.py`` with the user's "too long" correction as the hint averaged 16 words and hit the
    answer's keyword in 13 of 16; appended to the question, 13 words but only 9 of 16 ('The answer is "No, that is too
    long."'; ``bench/hint_placement.py``). Once the conversation holds a reply of the model's own, a system-message
    hint makes it copy that reply (41 words), so there the hint goes after the last user message."""
    if not hint.strip():
        raise ValueError("an OPD hint must not be empty")
    out = copy.deepcopy(messages)
    users = [message for message in out if message.get("role") == "user"]
    if not users:
        raise ValueError("the conversation has no user message to attach the hint to")
    quoted = f"{HINT_HEADER}\n{hint.strip()}"
    if not any(message.get("role") == "assistant" for message in out):
        if out[0].get("role") == "system":
            out[0]["content"] = f"{flatten_content(out[0].get('content'))}\n\n{quoted}"
        else:
            out.insert(0, {"role": "system", "content": quoted})
        return out
    users[-1]["content"] = f"{flatten_content(users[-1].get('content'))}\n\n{quoted}"
    return out


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
