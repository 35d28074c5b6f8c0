"""Track 2 core: group advantages, datum normalisation, the GRPO step against a recording backend, custom losses."""

from __future__ import annotations

import math
import random

import pytest

from openclaw_cli.env_training import (
    CustomLossUnsupported,
    EnvTrainer,
    ModelTurn,
    RolloutContext,
    RolloutError,
    Trajectory,
    group_advantages,
)
from openclaw_cli.env_training.batch import score_group, to_datums, train_turns
from openclaw_cli.env_training.custom_loss import forward_backward_custom
from openclaw_cli.env_training.hooks import FunctionEnv
from openclaw_cli.env_training.rollout import BackendPolicy
from openclaw_cli.env_training.trainer import parse_env_args
from openclaw_cli.settings import Settings, TrainEnvSettings, TrainSettings
from openclaw_cli.testing.fake_backend import FakeBackend
from openclaw_cli.types import AdamParams, Datum, FwdBwdResult, StepResult

# -- group advantages -------------------------------------------------------------------------------------------


def test_advantages_are_mean_centred_by_default() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    # mean 0.05: the one format-credit sample is pushed up, the three blank ones down by the same total
    assert group_advantages([0.2, 0.0, 0.0, 0.0]) == pytest.approx([0.15, -0.05, -0.05, -0.05])
    assert group_advantages([3.0, 1.0]) == [1.0, -1.0]


def test_std_normalisation_divides_by_the_population_std() -> None:
    # rewards 1,0,0,1: mean 0.5, population std 0.5 -> +-1 (up to the epsilon in the denominator)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], std_normalize=True) == pytest.approx([1, -1, -1, 1], rel=1e-5)
    # 0.2,0,0,0: centred 0.15,-0.05,..; std = sqrt((0.0225 + 3 * 0.0025) / 4) = sqrt(0.0075)
    std = math.sqrt(0.0075)
    expected = [0.15 / std, -0.05 / std, -0.05 / std, -0.05 / std]
    assert group_advantages([0.2, 0.0, 0.0, 0.0], std_normalize=True) == pytest.approx(expected, rel=1e-4)


def test_groups_without_signal_are_skipped_and_bad_rewards_refused() -> None:
    assert group_advantages([0.5, 0.5, 0.5]) is None
    assert group_advantages([1.0]) is None
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("nan")])
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([])


# -- datums -----------------------------------------------------------------------------------------------------


def turn(prompt: list[int], completion: list[int], reward: float | None = None) -> ModelTurn:
    return ModelTurn(prompt, completion, [-0.5] * len(completion), version=0, reward=reward)


def test_datums_normalise_per_trajectory_and_skip_signal_free_groups() -> None:
    two_turns = Trajectory([turn([1, 2], [3, 4]), turn([1, 2, 3, 4, 5], [6])], reward=1.0)  # 3 completion tokens
    one_turn = Trajectory([turn([7], [8, 9, 10])], reward=0.0)  # 3 tokens
    flat = [Trajectory([turn([1], [2])], reward=0.3) for _ in range(2)]
    groups = [
        score_group([two_turns, one_turn], [1.0, 0.0], std_normalize=False),  # advantages +0.5, -0.5
        score_group(flat, [0.3, 0.3], std_normalize=False),  # all equal: skipped
    ]
    assert groups[1].skipped
    turns = train_turns(groups)
    assert [t.trajectory_id for t in turns] == [0, 0, 1]
    # weight = 1 / (tokens of the trajectory * trajectories trained) = 1 / (3 * 2)
    assert all(t.weight == pytest.approx(1 / 6) for t in turns)
    datums = to_datums(turns)
    first = datums[0]
    assert first.model_input == [1, 2, 3]  # prompt + completion[:-1]
    assert first.loss_fn_inputs["target_tokens"] == [0, 3, 4]
    assert first.loss_fn_inputs["advantages"] == pytest.approx([0.0, 0.5 / 6, 0.5 / 6])
    assert first.loss_fn_inputs["logprobs"] == [0.0, -0.5, -0.5]
    assert datums[2].loss_fn_inputs["advantages"] == pytest.approx([-0.5 / 6] * 3)


def test_env_args_parse_with_later_keys_winning() -> None:
    assert parse_env_args(["url=http://h:1/?a=b", "max_turns=3", "max_turns=5"]) == {
        "url": "http://h:1/?a=b",
        "max_turns": "5",
    }
    with pytest.raises(ValueError, match="KEY=VALUE"):
        TrainEnvSettings(env_args=["no-equals-sign"])


def test_trajectory_return_adds_final_and_turn_rewards() -> None:
    assert Trajectory([turn([1], [2], reward=0.25), turn([1], [2], reward=0.5)], reward=1.0).total_reward() == 1.75
    assert Trajectory([turn([1], [2], reward=0.25)]).total_reward() == 0.25
    assert Trajectory([turn([1], [2])]).total_reward() is None
    with pytest.raises(ValueError, match="one logprob per completion token"):
        ModelTurn([1], [2, 3], [-0.1], version=0)


# -- the GRPO step against a recording backend ------------------------------------------------------------------


class RecordingBackend(FakeBackend):
    """FakeBackend's scripted sampling, plus training calls that are recorded instead of run."""

    def __init__(self, tokenizer, *, learner_logprobs: bool = True, **kwargs) -> None:
        super().__init__(tokenizer, default_reply="ok", **kwargs)
        self.learner_logprobs = learner_logprobs
        self.forward_backward_calls: list[tuple[list[Datum], str, dict[str, float] | None]] = []
        self.optim_calls: list[AdamParams] = []
        self.discards = 0

    async def forward_backward(self, datums, loss, loss_config=None) -> FwdBwdResult:
        self.forward_backward_calls.append((datums, loss, loss_config))
        # A recognisable learner logprob per position: -0.01 * (position + 1)
        logprobs = [[-0.01 * (i + 1) for i in range(len(d.model_input))] for d in datums]
        return FwdBwdResult(loss=0.25, metrics={"n_tokens": 1.0}, logprobs=logprobs if self.learner_logprobs else [])

    async def discard_gradients(self) -> None:
        self.discards += 1

    async def optim_step(self, adam: AdamParams) -> StepResult:
        self.optim_calls.append(adam)
        return StepResult(step=len(self.optim_calls), metrics={"grad_norm": 0.5})


def env_settings(**train_env) -> Settings:
    options = {"steps": 1, "group_size": 4, "prompts_per_step": 2, "max_tokens": 8, "seed": 7, **train_env}
    return Settings(train=TrainSettings(lr=0.01, eps_low=0.1, eps_high=0.3), train_env=TrainEnvSettings(**options))


def scripted_env(seen: list[tuple[int, int, float, int]]):
    """Group 0 rewards its members 0, 1, 2, 3; group 1 gives everyone 1 (no signal). Records the task draws."""

    async def rollout(ctx: RolloutContext) -> Trajectory:
        seen.append((ctx.group, ctx.member, ctx.rng.random(), ctx.seed))
        await ctx.policy.chat([{"role": "user", "content": "hi"}])
        return ctx.trajectory(float(ctx.member) if ctx.group == 0 else 1.0, solved=ctx.member == 3)

    return rollout


async def test_one_grpo_step_trains_the_informative_group_with_ppo(tiny_tokenizer) -> None:
    backend = RecordingBackend(tiny_tokenizer)
    seen: list[tuple[int, int, float, int]] = []
    trainer = EnvTrainer(backend, env_settings(), FunctionEnv(scripted_env(seen)))
    stats = await trainer.run_step(1)

    # Same task draw (and seed) for every member of a group, different across groups.
    draws = {g: {(rnd, seed) for gg, _, rnd, seed in seen if gg == g} for g in (0, 1)}
    assert len(draws[0]) == 1 and len(draws[1]) == 1 and draws[0] != draws[1]
    # Different sampling seeds per member, pinned to the version that was current.
    seeds = [call.params.seed for call in backend.calls]
    assert len(set(seeds)) == 8 and all(call.params.max_tokens == 8 for call in backend.calls)

    [(datums, loss, config)] = backend.forward_backward_calls
    assert loss == "ppo" and config == pytest.approx({"clip_low_threshold": 0.9, "clip_high_threshold": 1.3})
    assert len(datums) == 4  # group 0 only
    n_tokens = len(tiny_tokenizer.encode("ok")) + 1  # reply + stop token
    for member, datum in enumerate(datums):
        completion = datum.loss_fn_inputs["advantages"][-n_tokens:]
        assert completion == pytest.approx([(member - 1.5) / (n_tokens * 4)] * n_tokens)
    assert backend.discards == 1
    assert backend.optim_calls == [AdamParams(learning_rate=0.01, beta1=0.9, beta2=0.95, grad_clip_norm=1.0)]
    assert stats.published_version == 1 and backend.current_version().version == 1
    assert stats.groups == 2 and stats.groups_skipped == 1 and stats.trained_turns == 4
    assert stats.mean_reward == pytest.approx((0 + 1 + 2 + 3 + 4 * 1) / 8)
    assert stats.solved_fraction == pytest.approx(2 / 8)
    assert stats.sampled_tokens == 8 * n_tokens and stats.loss == 0.25


async def test_a_step_without_signal_trains_and_publishes_nothing(tiny_tokenizer) -> None:
    backend = RecordingBackend(tiny_tokenizer)

    async def constant(ctx: RolloutContext) -> Trajectory:
        await ctx.policy.chat([{"role": "user", "content": "hi"}])
        return ctx.trajectory(0.0)

    stats = await EnvTrainer(backend, env_settings(), FunctionEnv(constant)).run_step(1)
    assert backend.forward_backward_calls == [] and backend.optim_calls == []
    assert stats.published_version is None and backend.current_version().version == 0
    assert "no signal" in stats.line()


async def test_reward_hook_replaces_the_env_reward_and_failures_name_the_rollout(tiny_tokenizer) -> None:
    backend = RecordingBackend(tiny_tokenizer)
    seen: list = []
    trainer = EnvTrainer(
        backend, env_settings(), FunctionEnv(scripted_env(seen)), reward_fn=lambda t: 2.0, loss="importance_sampling"
    )
    stats = await trainer.run_step(1)
    assert stats.rewards == [2.0] * 8 and stats.published_version is None

    async def broken(ctx: RolloutContext) -> Trajectory:
        if ctx.group == 1 and ctx.member == 2:
            raise KeyError("no such task")
        return ctx.trajectory(0.0)

    # With no failures tolerated, the first one stops the run and is named.
    with pytest.raises(RolloutError, match=r"1 of 8 rollouts of step 3 failed.*step 3, group 1, member 2\): KeyError"):
        await EnvTrainer(backend, env_settings(max_failed_fraction=0.0), FunctionEnv(broken)).run_step(3)

    async def no_reward(ctx: RolloutContext) -> Trajectory:
        return ctx.trajectory()

    with pytest.raises(RolloutError, match="no reward"):
        await EnvTrainer(backend, env_settings(), FunctionEnv(no_reward)).run_step(1)


# -- custom losses ----------------------------------------------------------------------------------------------


async def test_custom_loss_gradient_is_handed_over_by_linearisation(tiny_tokenizer) -> None:
    import torch

    from openclaw_cli.env_training.batch import TrainTurn

    backend = RecordingBackend(tiny_tokenizer)
    turns = [TrainTurn([5, 6, 7], [8, 9], [-0.3, -0.4], advantage=2.0, trajectory_id=0, weight=0.25)]
    received = {}

    def squared(inputs):
        received["inputs"] = inputs
        return (inputs.logprobs[0] ** 2).sum() * inputs.advantages[0][0], {"custom": 1.5}

    result = await forward_backward_custom(backend, turns, squared)
    (probe, probe_loss, _), (linear, linear_loss, _) = backend.forward_backward_calls
    assert probe_loss == "cross_entropy" and all(w == 0 for w in probe[0].loss_fn_inputs["weights"])
    # The learner logprobs of the completion positions (model_input positions 2 and 3 of 4): -0.03, -0.04.
    learner = [-0.03, -0.04]
    assert received["inputs"].logprobs[0].tolist() == pytest.approx(learner)
    assert received["inputs"].sampler_logprobs[0].tolist() == pytest.approx([-0.3, -0.4])
    assert received["inputs"].scale == [0.25]
    # dL/dlp = 2 * lp * A = 4 * lp; the linear datum carries advantages -dL/dlp and sampler logprobs = learner's.
    assert linear_loss == "importance_sampling"
    assert linear[0].loss_fn_inputs["advantages"][-2:] == pytest.approx([-4 * v for v in learner])
    assert linear[0].loss_fn_inputs["logprobs"][-2:] == pytest.approx(learner)
    assert result.loss == pytest.approx(2.0 * (0.03**2 + 0.04**2))
    assert result.metrics["custom"] == 1.5
    # And the identity it relies on: d/dlp' of -sum exp(lp' - lp) * (-g) at lp' = lp is g.
    lp = torch.tensor(learner, requires_grad=True)
    g = torch.tensor([-4 * v for v in learner]) * -1
    (-(torch.exp(lp - lp.detach()) * -g).sum()).backward()
    assert lp.grad.tolist() == pytest.approx(g.tolist())


async def test_custom_loss_needs_learner_logprobs(tiny_tokenizer) -> None:
    from openclaw_cli.env_training.batch import TrainTurn

    backend = RecordingBackend(tiny_tokenizer, learner_logprobs=False)
    turns = [TrainTurn([5, 6], [8], [-0.3], advantage=1.0, trajectory_id=0)]
    with pytest.raises(CustomLossUnsupported, match="custom losses cannot run on it"):
        await forward_backward_custom(backend, turns, lambda inputs: inputs.logprobs[0].sum())


async def test_custom_loss_trains_like_the_builtin_loss_on_the_local_backend(tiny_model_dir, tmp_path) -> None:
    """The same importance-sampling objective, written as a custom loss, moves the LoRA weights exactly as the
    backend's own loss does. Adam with a huge eps makes the update proportional to the gradient (not its sign)."""
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.env_training.batch import TrainTurn
    from openclaw_cli.settings import LocalSettings, LoraSettings

    rng = random.Random(0)
    prompt = [rng.randrange(10, 400) for _ in range(12)]
    completion = [rng.randrange(10, 400) for _ in range(5)]
    turns = [
        TrainTurn(prompt, completion, [-5.5] * 5, advantage=1.0, trajectory_id=0, weight=0.2),
        TrainTurn(prompt[:6], completion[:3], [-6.0] * 3, advantage=-0.5, trajectory_id=1, weight=0.3),
    ]
    adam = AdamParams(learning_rate=50.0, eps=1e3, grad_clip_norm=0.0)

    def importance_sampling(inputs):
        total = 0
        for lp, slp, a, scale in zip(
            inputs.logprobs, inputs.sampler_logprobs, inputs.advantages, inputs.scale, strict=True
        ):
            total = total - (torch.exp(lp - slp) * a * scale).sum()
        return total

    import torch

    scored = []
    for custom in (False, True):
        settings = Settings(
            model=str(tiny_model_dir),
            lora=LoraSettings(rank=4, alpha=8),
            local=LocalSettings(state_dir=tmp_path / f"ckpt-{custom}", seed=0),
        )
        backend = LocalBackend(settings)
        await backend.start()
        try:
            if custom:
                await forward_backward_custom(backend, turns, importance_sampling)
            else:
                await backend.forward_backward(to_datums(turns), "importance_sampling")
            await backend.optim_step(adam)
            await backend.publish()
            if not custom:
                base = await backend.compute_logprobs(prompt + completion, base=True)
            scored.append(await backend.compute_logprobs(prompt + completion))
        finally:
            await backend.close()
    builtin, custom = ([v for v in s if v is not None] for s in scored)
    moved = max(abs(b - t) for b, t in zip([v for v in base if v is not None], builtin, strict=True))
    assert moved > 1e-2  # the step really changed the policy, so agreement below is not trivial
    assert custom == pytest.approx(builtin, abs=1e-5)


async def test_backend_policy_records_every_sample(tiny_tokenizer) -> None:
    backend = FakeBackend(tiny_tokenizer, ["first", "second reply"])
    policy = BackendPolicy(backend, version=0, max_tokens=16, temperature=1.0, seed_parts=(1, 2, 3, 4))
    reply = await policy.chat([{"role": "user", "content": "a"}])
    await policy.sample([1, 2, 3], max_tokens=2)
    assert reply.text == "first" and reply.message == {"role": "assistant", "content": "first"}
    assert policy.turns[0].prompt_tokens == tiny_tokenizer.render([{"role": "user", "content": "a"}])
    assert len(policy.turns) == 2 and len(policy.turns[1].completion_tokens) == 2
    assert backend.calls[1].params.max_tokens == 2 and backend.calls[0].params.seed != backend.calls[1].params.seed


async def test_the_same_loop_trains_on_the_tinker_backend(tiny_model_dir, tmp_path) -> None:
    """Only the backend protocol is used: the Tinker backend (against its SDK-level test double) takes PPO steps and
    a custom loss, and publishes a version per step."""
    pytest.importorskip("tinker")
    from openclaw_cli.backends.tinker import TinkerBackend
    from openclaw_cli.testing.tinker_double import TinkerDouble

    async def rollout(ctx: RolloutContext) -> Trajectory:
        await ctx.policy.chat([{"role": "user", "content": "Say something."}], max_tokens=4)
        return ctx.trajectory(float(ctx.member))  # always a signal: member 0 below the group mean, 1 above

    settings = Settings(
        backend="tinker",
        model=str(tiny_model_dir),
        lora={"rank": 4},
        tinker={"api_key": "tml-test-key-0123456789"},
        local={"state_dir": str(tmp_path / "ckpt")},
        train_env=TrainEnvSettings(steps=2, group_size=2, prompts_per_step=2, max_tokens=4),
    )
    double = TinkerDouble(tiny_model_dir, lora_alpha=8)
    backend = TinkerBackend(settings, service_client_factory=double.service_client)
    await backend.start()
    try:
        history = await EnvTrainer(backend, settings, FunctionEnv(rollout)).run()
        custom = EnvTrainer(backend, settings, FunctionEnv(rollout), loss=lambda i: -(i.logprobs[0] * 0.1).sum())
        custom_step = await custom.run_step(3)
    finally:
        await backend.close()
        double.close()
    assert [s.published_version for s in history] == [1, 2] and custom_step.published_version == 3
    losses = [call.args["loss_fn"] for call in double.calls("forward_backward")]
    assert losses == ["ppo", "ppo", "cross_entropy", "importance_sampling"]
