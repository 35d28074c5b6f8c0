"""Scored groups of trajectories -> the turns to train and their Tinker-aligned datums.

Every completion token of a trajectory gets the trajectory's group advantage. Backends sum the loss over tokens
(Tinker semantics), so the normalisation lives here: a turn's advantages are multiplied by
``1 / (completion tokens of its trajectory * trajectories trained this step)``. The step then optimises the mean
over trajectories of each trajectory's token mean (GRPO's objective, with a multi-turn episode counting once however
many turns it took). Trajectories of skipped groups (all rewards equal) are not trained and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from openclaw_cli.env_training.advantages import group_advantages
from openclaw_cli.env_training.rollout import Trajectory
from openclaw_cli.types import Datum, datum_from_completion


@dataclass
class ScoredGroup:
    """The trajectories of one prompt with their returns; ``advantages`` is None for a skipped group."""

    trajectories: list[Trajectory]
    rewards: list[float]
    advantages: list[float] | None

    @property
    def skipped(self) -> bool:
        return self.advantages is None


def score_group(trajectories: list[Trajectory], rewards: list[float], *, std_normalize: bool) -> ScoredGroup:
    if len(trajectories) != len(rewards):
        raise ValueError(f"{len(trajectories)} trajectories but {len(rewards)} rewards")
    return ScoredGroup(trajectories, list(rewards), group_advantages(rewards, std_normalize=std_normalize))


@dataclass
class TrainTurn:
    """One turn to train: its tokens, the sampler's log-probabilities, its raw group advantage, and the
    normalisation factor ``weight`` the built-in losses apply to that advantage."""

    prompt_tokens: list[int]
    completion_tokens: list[int]
    sampler_logprobs: list[float]
    advantage: float
    trajectory_id: int
    weight: float = 1.0


def train_turns(groups: list[ScoredGroup]) -> list[TrainTurn]:
    """The turns of every trajectory in the groups that carry a signal, in group/member/turn order."""
    trained = [
        (trajectory, advantage)
        for group in groups
        if group.advantages is not None
        for trajectory, advantage in zip(group.trajectories, group.advantages, strict=True)
        if trajectory.completion_tokens > 0
    ]
    turns: list[TrainTurn] = []
    for trajectory_id, (trajectory, advantage) in enumerate(trained):
        weight = 1.0 / (trajectory.completion_tokens * len(trained))
        for turn in trajectory.turns:
            if not turn.completion_tokens:
                continue
            turns.append(
                TrainTurn(
                    prompt_tokens=list(turn.prompt_tokens),
                    completion_tokens=list(turn.completion_tokens),
                    sampler_logprobs=list(turn.logprobs),
                    advantage=advantage,
                    trajectory_id=trajectory_id,
                    weight=weight,
                )
            )
    return turns


def to_datums(turns: list[TrainTurn]) -> list[Datum]:
    """Datums for the built-in losses (``ppo``, ``importance_sampling``): normalised advantages per token."""
    return [
        datum_from_completion(
            t.prompt_tokens, t.completion_tokens, logprobs=t.sampler_logprobs, advantages=t.advantage * t.weight
        )
        for t in turns
    ]
