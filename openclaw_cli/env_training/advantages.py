"""GRPO group advantages: each sample is scored against the other samples of the same prompt.

``A_i = r_i - mean(r)`` over the group (mean-centred), and with ``std_normalize`` divided by the group's population
standard deviation (``ddof = 0``) as in the original GRPO. The default is centred only, the Tinker cookbook's habit
(and Dr. GRPO's argument): dividing by the standard deviation inflates tiny reward differences in groups that are
almost all right or all wrong, so those groups get as much weight as the informative ones.

A group whose rewards are all equal has no signal (every advantage is 0) and is skipped: it would cost a forward
and backward pass and, with the per-trajectory normalisation, dilute the other groups' gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EQUAL_TOLERANCE = 1e-9  # rewards closer than this count as equal
STD_EPSILON = 1e-6  # keeps the division finite when the spread is tiny but not zero


def group_advantages(rewards: Sequence[float], *, std_normalize: bool = False) -> list[float] | None:
    """Per-sample advantages for one group, or None when the group carries no signal (all rewards equal)."""
    if not rewards:
        raise ValueError("a group needs at least one reward")
    values = [float(r) for r in rewards]
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"rewards must be finite, got {values}")
    if max(values) - min(values) <= EQUAL_TOLERANCE:
        return None
    mean = sum(values) / len(values)
    centred = [v - mean for v in values]
    if not std_normalize:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + STD_EPSILON) for c in centred]
