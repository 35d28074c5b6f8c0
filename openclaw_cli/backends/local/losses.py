"""The three Tinker losses, as pure torch functions of per-token tensors (no model here).

Notation (all tensors share one shape, any shape; padding is expressed as weight 0):
``lp`` learner logprobs of the target tokens (carries the gradient), ``slp`` sampler logprobs, ``A`` advantages,
``w`` weights. Losses are SUMMED over every token, with no normalisation: the algorithms layer scales the
advantages (or weights) when it wants a token mean. This matches Tinker, so a datum trains identically on every
backend.

- ``cross_entropy``:       -sum w * lp
- ``importance_sampling``: -sum w * r * A,                             r = exp(lp - slp)
- ``ppo``:                 -sum w * min(r * A, clamp(r, lo, hi) * A)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

# Validation lives with the algorithms: torch-free and shared with the remote backends.
from openclaw_cli.loss_contract import (
    ClipBounds,
    required_inputs,
    validate_loss_config,
)

# exp() of a float32 overflows past ~88, and a sampler logprob of -1e4 or -inf (a token the sampler's top-k/top-p
# had removed, or a placeholder) would otherwise turn one token's ratio into inf and the whole loss and every
# gradient into inf/NaN. +-20 bounds the ratio to [2e-9, 4.9e8]: far outside any clip range, so PPO is unchanged,
# and for importance sampling such a token is already hopelessly off-policy.
LOG_RATIO_LIMIT = 20.0


@dataclass(frozen=True)
class LossStats:
    """Sums that add across micro-batches; :meth:`metrics` turns them into the reported means."""

    loss_sum: float = 0.0
    n_tokens: int = 0  # tokens with weight > 0
    clipped_tokens: int = 0  # PPO: weighted tokens whose clipped branch is the active one
    ratio_sum: float = 0.0
    kl_sum: float = 0.0
    has_sampler: bool = False
    is_ppo: bool = False

    def __add__(self, other: LossStats) -> LossStats:
        return LossStats(
            loss_sum=self.loss_sum + other.loss_sum,
            n_tokens=self.n_tokens + other.n_tokens,
            clipped_tokens=self.clipped_tokens + other.clipped_tokens,
            ratio_sum=self.ratio_sum + other.ratio_sum,
            kl_sum=self.kl_sum + other.kl_sum,
            has_sampler=self.has_sampler or other.has_sampler,
            is_ppo=self.is_ppo or other.is_ppo,
        )

    def metrics(self) -> dict[str, float]:
        """``loss:sum`` and ``n_tokens`` always; means over weighted tokens only when there is at least one
        (a mean over nothing is undefined, and a made-up 0 would read as a real value on a dashboard)."""
        out = {"loss:sum": self.loss_sum, "n_tokens": float(self.n_tokens)}
        if self.n_tokens == 0:
            return out
        if self.has_sampler:
            out["ratio_mean"] = self.ratio_sum / self.n_tokens
            out["kl_sampler"] = self.kl_sum / self.n_tokens
        if self.is_ppo:
            out["clip_fraction"] = self.clipped_tokens / self.n_tokens
        return out


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor  # scalar, differentiable with respect to the learner logprobs
    stats: LossStats


def cross_entropy_loss(lp: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """-sum w * lp."""
    return -_weighted_sum(w, lp)


def importance_sampling_loss(
    lp: torch.Tensor, slp: torch.Tensor, advantages: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """-sum w * r * A with r = exp(lp - slp); d loss / d lp = -w * r * A."""
    return -_weighted_sum(w, importance_ratio(lp, slp) * advantages)


def ppo_loss(
    lp: torch.Tensor, slp: torch.Tensor, advantages: torch.Tensor, w: torch.Tensor, bounds: ClipBounds
) -> torch.Tensor:
    """-sum w * min(r * A, clamp(r, low, high) * A); the gradient is -w * r * A where unclipped, 0 where clipped."""
    ratio = importance_ratio(lp, slp)
    clipped = ppo_clip_active(ratio, advantages, bounds)
    # Where the clipped branch wins, its value clamp(r)*A is a constant bound times A: no gradient flows, exactly
    # as in min(). Selecting the branch explicitly avoids min()'s tie rule splitting gradients inside the range.
    surrogate = torch.where(clipped, ratio.clamp(bounds.low, bounds.high) * advantages, ratio * advantages)
    return -_weighted_sum(w, surrogate)


def importance_ratio(lp: torch.Tensor, slp: torch.Tensor) -> torch.Tensor:
    return torch.exp(_log_ratio(lp, slp))


def ppo_clip_active(ratio: torch.Tensor, advantages: torch.Tensor, bounds: ClipBounds) -> torch.Tensor:
    """True where min(r*A, clamp(r)*A) takes the clamped branch strictly: r > high with A > 0, r < low with A < 0."""
    return ((ratio > bounds.high) & (advantages > 0)) | ((ratio < bounds.low) & (advantages < 0))


def compute_loss(
    loss: str,
    lp: torch.Tensor,
    *,
    weights: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    advantages: torch.Tensor | None = None,
    config: Mapping[str, float] | None = None,
) -> LossOutput:
    """Evaluate ``loss`` and its metrics. ``weights`` default to 1 everywhere; ``lp`` should be float32."""
    bounds = validate_loss_config(loss, config)
    provided = {"logprobs": sampler_logprobs, "advantages": advantages}
    missing = [key for key in required_inputs(loss) if provided[key] is None]
    if missing:
        raise ValueError(f"loss {loss!r} needs loss_fn_inputs {', '.join(missing)}")
    w = torch.ones_like(lp) if weights is None else weights
    for name, tensor in (("weights", w), ("logprobs", sampler_logprobs), ("advantages", advantages)):
        if tensor is not None and tensor.shape != lp.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, learner logprobs {tuple(lp.shape)}")

    if loss == "cross_entropy":
        value = cross_entropy_loss(lp, w)
    elif loss == "importance_sampling":
        assert sampler_logprobs is not None and advantages is not None  # checked above
        value = importance_sampling_loss(lp, sampler_logprobs, advantages, w)
    else:
        assert sampler_logprobs is not None and advantages is not None and bounds is not None
        value = ppo_loss(lp, sampler_logprobs, advantages, w, bounds)
    stats = _stats(value, lp, w, sampler_logprobs, advantages, bounds)
    return LossOutput(loss=value, stats=stats)


def _log_ratio(lp: torch.Tensor, slp: torch.Tensor) -> torch.Tensor:
    return (lp - slp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


def _weighted_sum(w: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    # Zero-weight positions (prompt, padding) are dropped rather than multiplied by 0, so a non-finite value there
    # (e.g. a -inf placeholder) cannot turn the sum into NaN.
    return torch.where(w != 0, w * values, torch.zeros_like(values)).sum()


@torch.no_grad()
def _stats(
    value: torch.Tensor,
    lp: torch.Tensor,
    w: torch.Tensor,
    slp: torch.Tensor | None,
    advantages: torch.Tensor | None,
    bounds: ClipBounds | None,
) -> LossStats:
    active = w > 0
    n_tokens = int(active.sum().item())
    ratio_sum = kl_sum = 0.0
    clipped = 0
    if slp is not None:
        log_ratio = _log_ratio(lp.detach(), slp)
        ratio = log_ratio.exp()
        # k3 estimator of KL(sampler || learner) with x = slp - lp: E[exp(x) - x - 1] >= 0, unbiased, low variance.
        neg = -log_ratio
        k3 = torch.exp(neg) - neg - 1.0
        ratio_sum = float(ratio[active].sum().item())
        kl_sum = float(k3[active].sum().item())
        if bounds is not None and advantages is not None:
            clipped = int((ppo_clip_active(ratio, advantages, bounds) & active).sum().item())
    return LossStats(
        loss_sum=float(value.detach().item()),
        n_tokens=n_tokens,
        clipped_tokens=clipped,
        ratio_sum=ratio_sum,
        kl_sum=kl_sum,
        has_sampler=slp is not None,
        is_ppo=bounds is not None,
    )
