"""Training signals written once against the backend protocol: Binary RL, On-Policy Distillation, and both.

Each function turns judged samples into per-token advantages; :func:`build_datums` turns those into Tinker-aligned
datums for ``Backend.forward_backward(datums, "ppo", ...)``. Backends sum the loss over tokens (Tinker semantics),
so the token-mean of the method is obtained by dividing each sample's advantages by its completion length.
"""

from openclaw_cli.learn.algorithms.binary_rl import RunningBaseline, binary_rl_advantages
from openclaw_cli.learn.algorithms.datums import TrainSample, build_datums, ppo_loss_config
from openclaw_cli.learn.algorithms.hybrid import hybrid_advantages
from openclaw_cli.learn.algorithms.opd import HINT_HEADER, opd_advantages, teacher_messages
from openclaw_cli.settings import TrainSettings
from openclaw_cli.types import AdamParams


def adam_params_from(train: TrainSettings) -> AdamParams:
    """The optimizer settings of one ``optim_step`` from ``[train]`` (shared by the online and the env trainer)."""
    return AdamParams(
        learning_rate=train.lr,
        beta1=train.adam_beta1,
        beta2=train.adam_beta2,
        weight_decay=train.weight_decay,
        grad_clip_norm=train.grad_clip_norm,
    )


__all__ = [
    "HINT_HEADER",
    "RunningBaseline",
    "TrainSample",
    "adam_params_from",
    "binary_rl_advantages",
    "build_datums",
    "hybrid_advantages",
    "opd_advantages",
    "ppo_loss_config",
    "teacher_messages",
]
