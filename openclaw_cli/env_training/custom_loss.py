"""Custom losses: a user function of per-token tensors, trained through the ordinary backend protocol.

The function gets a :class:`LossInputs` (one 1-D tensor per trained turn, over its completion tokens) and returns a
scalar tensor, or ``(tensor, metrics)``. It is differentiated with torch here, in this process, and the gradient
is handed to the backend by linearisation (the technique behind Tinker's ``forward_backward_custom``):

1. ``forward_backward`` with ``cross_entropy`` and all weights 0 returns the learner's log-probabilities ``lp`` at
   the current weights and adds a zero gradient;
2. ``g = dL/dlp`` by autograd on the user's loss;
3. ``forward_backward`` with ``importance_sampling``, sampler log-probabilities ``lp`` and advantages ``-g``: its
   loss ``-sum exp(lp' - lp) * (-g)`` has gradient ``sum g * dlp'/dtheta`` at ``lp' = lp``, exactly ``dL/dtheta``.

So it runs on every backend whose ``forward_backward`` returns the learner's log-probabilities, as the protocol
asks; a backend that returns none gets :class:`CustomLossUnsupported`. Costs: two forward/backward passes per step
instead of one. With LoRA dropout > 0 the two passes see different dropout masks, so the gradient is that of a
nearby sample of the dropout noise rather than exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from openclaw_cli.backend import BackendError
from openclaw_cli.env_training.batch import TrainTurn
from openclaw_cli.types import Datum, FwdBwdResult, datum_from_completion

if TYPE_CHECKING:
    import torch

    from openclaw_cli.backend import Backend


class CustomLossUnsupported(BackendError):
    """The backend cannot train a custom loss (it returns no learner log-probabilities)."""


class CustomLossError(ValueError):
    """The custom loss function returned something that cannot be trained on."""


@dataclass
class LossInputs:
    """Per trained turn (same order in every list), over the turn's completion tokens only.

    ``logprobs`` carry the gradient. ``advantages`` are the raw group advantages (not normalised by length);
    ``scale`` is the factor the built-in losses multiply them by (mean over trajectories of the per-trajectory
    token mean), for a custom loss that wants the same normalisation. ``trajectory_ids`` tell which turns belong
    to one episode.
    """

    logprobs: list[torch.Tensor]
    sampler_logprobs: list[torch.Tensor]
    advantages: list[torch.Tensor]
    scale: list[float]
    trajectory_ids: list[int]


CustomLoss = Callable[[LossInputs], Any]
"""``def loss(inputs: LossInputs) -> torch.Tensor | tuple[torch.Tensor, dict[str, float]]``."""


async def forward_backward_custom(backend: Backend, turns: list[TrainTurn], loss_fn: CustomLoss) -> FwdBwdResult:
    """Accumulate the gradient of ``loss_fn`` on the backend (module docstring); returns the custom loss value."""
    import torch

    probe = [datum_from_completion(t.prompt_tokens, t.completion_tokens, weights=0.0) for t in turns]
    scored = await backend.forward_backward(probe, "cross_entropy")
    learner = _completion_logprobs(backend, turns, probe, scored)

    logprobs = [torch.tensor(values, dtype=torch.float32, requires_grad=True) for values in learner]
    inputs = LossInputs(
        logprobs=logprobs,
        sampler_logprobs=[torch.tensor(t.sampler_logprobs, dtype=torch.float32) for t in turns],
        advantages=[torch.full((len(t.completion_tokens),), float(t.advantage)) for t in turns],
        scale=[t.weight for t in turns],
        trajectory_ids=[t.trajectory_id for t in turns],
    )
    returned = loss_fn(inputs)
    value, metrics = returned if isinstance(returned, tuple) else (returned, {})
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        raise CustomLossError(f"a custom loss must return a scalar tensor (or (tensor, metrics)), got {value!r:.80}")
    if not value.requires_grad:
        raise CustomLossError("the custom loss does not depend on inputs.logprobs: it has no gradient to train with")
    grads = torch.autograd.grad(value, logprobs, allow_unused=True)

    linear = [
        datum_from_completion(
            t.prompt_tokens,
            t.completion_tokens,
            logprobs=lp,
            advantages=[0.0] * len(lp) if g is None else (-g).tolist(),
        )
        for t, lp, g in zip(turns, learner, grads, strict=True)
    ]
    result = await backend.forward_backward(linear, "importance_sampling")
    out_metrics = {k: v for k, v in result.metrics.items() if k != "loss:sum"}
    out_metrics.update({str(k): float(v) for k, v in dict(metrics).items()})
    return FwdBwdResult(loss=float(value.detach()), metrics=out_metrics, logprobs=result.logprobs)


def _completion_logprobs(
    backend: Backend, turns: list[TrainTurn], probe: list[Datum], scored: FwdBwdResult
) -> list[list[float]]:
    if len(scored.logprobs) != len(probe):
        raise CustomLossUnsupported(
            f"backend {backend.name!r} returned learner log-probabilities for {len(scored.logprobs)} of "
            f"{len(probe)} datums, so custom losses cannot run on it; use --loss ppo or importance_sampling"
        )
    out = []
    for turn, datum, values in zip(turns, probe, scored.logprobs, strict=True):
        if len(values) != len(datum.model_input):
            raise CustomLossUnsupported(
                f"backend {backend.name!r} returned {len(values)} learner log-probabilities for a datum of "
                f"{len(datum.model_input)} positions; custom losses need one per position"
            )
        out.append([float(v) for v in values[len(turn.prompt_tokens) - 1 :]])
    return out
