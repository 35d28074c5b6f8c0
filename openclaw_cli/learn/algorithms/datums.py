"""Judged samples -> per-token advantages -> Tinker-aligned datums for one optimizer step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from openclaw_cli.learn.algorithms.binary_rl import binary_rl_advantages
from openclaw_cli.learn.algorithms.hybrid import hybrid_advantages
from openclaw_cli.learn.algorithms.opd import opd_advantages
from openclaw_cli.settings import TrainSettings
from openclaw_cli.types import Datum, datum_from_completion

Method = Literal["rl", "opd", "combined"]


@dataclass
class TrainSample:
    """One main-line assistant turn with its judgement, as the trainer sees it."""

    turn_id: int
    session_id: str
    prompt_tokens: list[int]
    completion_tokens: list[int]
    sampler_logprobs: list[float]  # log pi_old(a_t | s), stored at serving time
    version: int  # policy version that produced it
    reward: float | None = None  # PRM majority in {-1, 0, +1}; None = not judged for RL
    teacher_logprobs: list[float] | None = None  # log pi_teacher(a_t | s + hint); None = no accepted hint
    has_next_state: bool = True  # False when the session ended right after this turn
    base_logprobs: list[float] | None = None  # log pi_base(a_t | s) for the KL anchor; None = same as the sampler's
    # A hindsight demonstration (openclaw_cli/learn/hindsight_demos.py): the completion is the base model's hinted
    # reply, trained with this constant advantage on every token and no KL anchor (it is the target, not a drift).
    demo_weight: float | None = None
    # A demonstration trained again in a later step (DemoReplay): its turn was trained before and is not again.
    replayed: bool = False
    # Explicit per-token advantages (a loop probe's repetition, openclaw_cli/learn/loop_probe.py): trained as they
    # are, no KL anchor; the sample rides along its turn's step and never counts as a trained turn of its own.
    token_advantages: list[float] | None = None
    # A demonstration that distils lessons (openclaw_cli/learn/lessons.py): the ids of the lessons its turn was served
    # with; the completion is the base model's reply with them, trained as the reply to the conversation without.
    consolidates: tuple[int, ...] = ()
    # Constrained decoding (metadata ``forced_tokens``): completion positions where the grammar left one token. The
    # reply was drawn from the masked policy, under which these tokens are certain: no policy gradient there.
    forced_tokens: tuple[int, ...] = ()


def ppo_loss_config(train: TrainSettings) -> dict[str, float]:
    """The PPO clip as ratio bounds (Tinker's loss_fn_config names)."""
    return {"clip_low_threshold": 1.0 - train.eps_low, "clip_high_threshold": 1.0 + train.eps_high}


def _advantages(sample: TrainSample, method: Method, train: TrainSettings, baseline: float) -> list[float] | None:
    if sample.token_advantages is not None:
        if len(sample.token_advantages) != len(sample.completion_tokens):
            raise ValueError(f"turn {sample.turn_id}: advantages and completion tokens differ in length")
        return list(sample.token_advantages) if any(sample.token_advantages) else None
    if sample.demo_weight is not None:
        return [sample.demo_weight] * len(sample.completion_tokens) if sample.demo_weight else None
    advantages = _signal(sample, method, train, baseline)
    if advantages is not None and train.kl_coef != 0 and sample.base_logprobs is not None:
        advantages = kl_anchored(advantages, sample.sampler_logprobs, sample.base_logprobs, train.kl_coef)
    if advantages is not None and sample.forced_tokens:
        forced = set(sample.forced_tokens)
        advantages = [0.0 if i in forced else a for i, a in enumerate(advantages)]
    return advantages


def kl_anchored(advantages: list[float], old: list[float], base: list[float], coef: float) -> list[float]:
    """A_t - beta * (log pi_old(a_t) - log pi_base(a_t)): the per-token KL penalty to the base folded into the
    advantage, so a token the policy now likes more than the base did is pushed back in proportion."""
    if not len(advantages) == len(old) == len(base):
        raise ValueError("advantages, sampler and base logprobs differ in length")
    return [a - coef * (o - b) for a, o, b in zip(advantages, old, base, strict=True)]


def _signal(sample: TrainSample, method: Method, train: TrainSettings, baseline: float) -> list[float] | None:
    n = len(sample.completion_tokens)
    if method == "rl":
        if sample.reward is None or sample.reward == 0:
            return None
        return binary_rl_advantages(sample.reward, n, baseline)
    if method == "opd":
        if sample.teacher_logprobs is None:
            return None
        return [
            train.w_opd * a
            for a in opd_advantages(sample.teacher_logprobs, sample.sampler_logprobs, clip_high=train.opd_max_advantage)
        ]
    return hybrid_advantages(
        old_logprobs=sample.sampler_logprobs,
        reward=sample.reward,
        teacher_logprobs=sample.teacher_logprobs,
        w_opd=train.w_opd,
        w_rl=train.w_rl,
        baseline=baseline,
        opd_clip_high=train.opd_max_advantage,
    )


def build_datums(
    samples: list[TrainSample],
    method: Method,
    train: TrainSettings,
    *,
    current_version: int,
    baseline: float = 0.0,
) -> tuple[list[Datum], list[int]]:
    """Datums for one step and the turn ids they came from.

    - Samples more than ``train.max_staleness`` versions behind ``current_version`` are dropped (not down-weighted):
      their sampler logprobs no longer describe the policy being trained, and the PPO clip alone does not bound
      the bias of a far off-policy sample.
    - A sample with no usable signal (RL: reward 0 or unjudged; OPD: no hint) is left out, except for the
      "at least one sample per session" rule of the RL term (methods rl and combined): when none of a session's
      samples in the batch carries a signal, its first score-0 turn that has a next state is kept with the RL
      advantage ``w_rl * (0 - baseline)``. Without a baseline that adds no gradient, only a share of the
      normalisation (as a loss-mask-1 sample does in the reference method); with ``train.baseline_decay`` it
      pushes an "ambiguous" turn down by how much better than that the policy usually does.
    - A batch in which every advantage is 0 gives no datums: a step without signal publishes nothing.
    - A hindsight demonstration (``demo_weight`` set) gets that constant advantage on every token, whatever the
      method, and no KL anchor; a sample with ``token_advantages`` (a loop probe's) gets exactly those.
    - KL anchor (``train.kl_coef``): a sample with signal and ``base_logprobs`` gets
      ``-kl_coef * (log pi_old - log pi_base)`` added to each token's advantage (:func:`kl_anchored`).
    - A constrained reply's forced tokens (``forced_tokens``) get advantage 0: drawn from the masked policy, they
      were certain, so the reply says nothing about them (see docs/algorithms.md, "Constrained replies").
    - Loss normalisation (``train.loss_norm``): backends sum over tokens, so the advantages are scaled here.
      ``token``: divided by the batch's total trained tokens (every token weighs the same, so a long reply's
      objections are not diluted by its length); ``sample``: divided by the sample's length and the number of
      samples (the mean over samples of the per-sample token mean, which weighs each token of a long reply less).
    """
    kept: list[tuple[TrainSample, list[float]]] = []
    zero_score: dict[str, TrainSample] = {}  # first score-0 turn with a next state, per session
    for sample in samples:
        if current_version - sample.version > train.max_staleness:
            continue
        if len(sample.sampler_logprobs) != len(sample.completion_tokens):
            raise ValueError(f"turn {sample.turn_id}: logprobs and completion tokens differ in length")
        advantages = _advantages(sample, method, train, baseline)
        if advantages is not None:
            kept.append((sample, advantages))
        elif sample.reward == 0 and sample.has_next_state:
            zero_score.setdefault(sample.session_id, sample)
    if method != "opd":
        represented = {sample.session_id for sample, _ in kept}
        weight = 1.0 if method == "rl" else train.w_rl
        for session_id, sample in zero_score.items():
            if session_id not in represented:
                n = len(sample.completion_tokens)
                kept.append((sample, [weight * a for a in binary_rl_advantages(0.0, n, baseline)]))
        kept.sort(key=lambda item: item[0].turn_id)
    if all(a == 0.0 for _, advantages in kept for a in advantages):
        # No sample carries a signal (e.g. only the "at least one" samples of an all-zero batch, no baseline): a
        # step would change nothing but Adam's moments, and publishing it would call an unchanged policy new.
        return [], []
    datums = []
    total_tokens = sum(len(advantages) for _, advantages in kept)
    for sample, advantages in kept:
        scale = 1.0 / total_tokens if train.loss_norm == "token" else 1.0 / (len(advantages) * len(kept))
        datums.append(
            datum_from_completion(
                sample.prompt_tokens,
                sample.completion_tokens,
                logprobs=sample.sampler_logprobs,
                advantages=[a * scale for a in advantages],
            )
        )
    # A turn and its demonstration are one trained turn; a replayed demonstration's turn was trained in its own step.
    trained = (sample.turn_id for sample, _ in kept if not sample.replayed and sample.token_advantages is None)
    return datums, list(dict.fromkeys(trained))
