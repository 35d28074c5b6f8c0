"""Track 2: reinforcement learning on environments, with user hooks for rollouts, rewards and losses.

A rollout hook plays one episode with the policy and returns a :class:`Trajectory`::

    from openclaw_cli.env_training import RolloutContext, Trajectory

    async def rollout(ctx: RolloutContext) -> Trajectory:
        a, b = ctx.rng.randint(0, 4), ctx.rng.randint(0, 5)  # same task for the whole GRPO group
        reply = await ctx.policy.chat([{"role": "user", "content": f"What is {a} + {b}?"}])
        return ctx.trajectory(reward=1.0 if str(a + b) in reply.text else 0.0)

and ``openclaw train --env mymodule:rollout`` (or :func:`train_on_env`) trains on it with GRPO. See
:mod:`openclaw_cli.env_training.hooks` for the spec forms and entry-point groups,
:mod:`~openclaw_cli.env_training.trainer` for the loop, :mod:`~openclaw_cli.env_training.custom_loss` for custom
losses, :mod:`~openclaw_cli.env_training.tools` / :mod:`~openclaw_cli.env_training.sandbox` /
:mod:`~openclaw_cli.env_training.remote` for tool-calling, terminal and remote environments.
"""

from openclaw_cli.env_training.advantages import group_advantages
from openclaw_cli.env_training.custom_loss import CustomLoss, CustomLossError, CustomLossUnsupported, LossInputs
from openclaw_cli.env_training.hooks import (
    LOSS_GROUP,
    REWARD_GROUP,
    ROLLOUT_GROUP,
    Env,
    HookError,
    resolve_env,
    resolve_loss,
    resolve_reward,
)
from openclaw_cli.env_training.rollout import (
    BackendPolicy,
    ChatReply,
    ModelTurn,
    Policy,
    RewardFn,
    RolloutContext,
    RolloutFn,
    Trajectory,
)
from openclaw_cli.env_training.tools import ToolLoopResult, call_arguments, function_tool, run_tool_loop
from openclaw_cli.env_training.trainer import EnvTrainer, RolloutError, StepStats, train_on_env

__all__ = [
    "LOSS_GROUP",
    "REWARD_GROUP",
    "ROLLOUT_GROUP",
    "BackendPolicy",
    "ChatReply",
    "CustomLoss",
    "CustomLossError",
    "CustomLossUnsupported",
    "Env",
    "EnvTrainer",
    "HookError",
    "LossInputs",
    "ModelTurn",
    "Policy",
    "RewardFn",
    "RolloutContext",
    "RolloutError",
    "RolloutFn",
    "StepStats",
    "ToolLoopResult",
    "Trajectory",
    "call_arguments",
    "function_tool",
    "group_advantages",
    "resolve_env",
    "resolve_loss",
    "resolve_reward",
    "run_tool_loop",
    "train_on_env",
]
