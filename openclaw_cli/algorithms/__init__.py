"""Training signals written once against the backend protocol: Binary RL, On-Policy Distillation, and both.

Each function turns judged samples into per-token advantages; :func:`build_datums` turns those into Tinker-aligned
datums for ``Backend.forward_backward(datums, "ppo", ...)``. Backends sum the loss over tokens (Tinker semantics),
so the token-mean of the method is obtained by dividing each sample's advantages by its completion length.
"""

from openclaw_cli.algorithms.binary_rl import RunningBaseline, binary_rl_advantages
from openclaw_cli.algorithms.datums import TrainSample, build_datums, ppo_loss_config
from openclaw_cli.algorithms.hybrid import hybrid_advantages
from openclaw_cli.algorithms.opd import HINT_HEADER, opd_advantages, teacher_messages

__all__ = [
    "HINT_HEADER",
    "RunningBaseline",
    "TrainSample",
    "binary_rl_advantages",
    "build_datums",
    "hybrid_advantages",
    "opd_advantages",
    "ppo_loss_config",
    "teacher_messages",
]
