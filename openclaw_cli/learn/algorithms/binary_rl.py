"""Binary RL: every response token gets the turn's scalar reward (optionally minus a running baseline)."""

from __future__ import annotations

from dataclasses import dataclass


def binary_rl_advantages(reward: float, n_tokens: int, baseline: float = 0.0) -> list[float]:
    """A_t = r - b for every completion token."""
    if n_tokens < 1:
        raise ValueError("a completion has at least one token")
    return [float(reward) - baseline] * n_tokens


@dataclass
class RunningBaseline:
    """Exponential moving average of rewards. The reference method uses groups of size 1 (no baseline), so
    every +1 turn is pushed up and every -1 down no matter how the policy does on average; subtracting a running
    mean turns that into "better or worse than usual". ``decay = 0`` disables it (b stays 0)."""

    decay: float = 0.0
    value: float = 0.0
    seen: int = 0

    def update(self, rewards: list[float]) -> float:
        """Fold in a batch of rewards and return the baseline to use for *that* batch (the pre-update value)."""
        current = self.value
        if self.decay > 0:
            for r in rewards:
                self.value = r if self.seen == 0 else self.decay * self.value + (1 - self.decay) * r
                self.seen += 1
        return current
