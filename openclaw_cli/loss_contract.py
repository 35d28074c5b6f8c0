"""Loss names, their required inputs and PPO clip settings: validated the same way by every backend.

Torch-free, so remote backends (Tinker, Fireworks) check a ``loss_config`` exactly as the local trainer does
before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from openclaw_cli.types import LOSS_NAMES

DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.28

_RATIO_KEYS = ("clip_low_threshold", "clip_high_threshold")
_EPS_KEYS = ("eps_low", "eps_high")
_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": (),
    "ppo": _RATIO_KEYS + _EPS_KEYS,
}
_REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
}


def required_inputs(loss: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` keys (besides ``target_tokens``) that ``loss`` cannot run without."""
    check_loss_name(loss)
    return _REQUIRED_INPUTS[loss]


def check_loss_name(loss: str) -> None:
    if loss not in LOSS_NAMES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSS_NAMES)}")


@dataclass(frozen=True)
class ClipBounds:
    """PPO ratio bounds: the clipped ratio lies in [low, high]."""

    low: float = DEFAULT_CLIP_LOW
    high: float = DEFAULT_CLIP_HIGH


def validate_loss_config(loss: str, config: Mapping[str, float] | None) -> ClipBounds | None:
    """Check ``config`` for ``loss``; for ``ppo`` return its ratio bounds, else None.

    PPO takes Tinker's ratio bounds ``clip_low_threshold``/``clip_high_threshold`` or the equivalent
    ``eps_low``/``eps_high`` (low = 1 - eps_low, high = 1 + eps_high), not both. Unknown keys are an error rather
    than silently ignored, because a misspelt clip setting would otherwise train with the defaults.
    """
    check_loss_name(loss)
    config = dict(config or {})
    allowed = _CONFIG_KEYS[loss]
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        accepted = ", ".join(allowed) if allowed else "no keys"
        raise ValueError(f"loss_config for {loss!r} has unknown key(s) {', '.join(unknown)}; it accepts {accepted}")
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"loss_config[{key!r}] must be a number, got {value!r}")
    if loss != "ppo":
        return None
    uses_ratio = any(k in config for k in _RATIO_KEYS)
    uses_eps = any(k in config for k in _EPS_KEYS)
    if uses_ratio and uses_eps:
        raise ValueError("loss_config for 'ppo' mixes clip_*_threshold and eps_* keys; use one form")
    if uses_eps:
        low = 1.0 - float(config.get("eps_low", 1.0 - DEFAULT_CLIP_LOW))
        high = 1.0 + float(config.get("eps_high", DEFAULT_CLIP_HIGH - 1.0))
    else:
        low = float(config.get("clip_low_threshold", DEFAULT_CLIP_LOW))
        high = float(config.get("clip_high_threshold", DEFAULT_CLIP_HIGH))
    if not 0.0 <= low <= 1.0 <= high:
        raise ValueError(f"ppo clip bounds must satisfy 0 <= low <= 1 <= high, got low={low}, high={high}")
    return ClipBounds(low=low, high=high)
