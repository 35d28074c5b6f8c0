"""The Track 2 examples: their environment logic with scripted replies, each one end to end through
``openclaw train`` on the tiny model, and GRPO raising the calculator example's reward on a learnable tiny model.

The learnable model is the tiny model with its tied embeddings scaled up (the trick of test_e2e_learning.py: with
std-0.02 embeddings no LoRA can move a logit by much). The scale here is 6, not 10: at 10 the calculator prompt
makes the base policy answer with blank lines 99% of the time, so no sample in a group ever earns a reward and GRPO
has nothing to learn from; at 6 a few samples per step contain a digit, and LoRA can still shift the preferences.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

from openclaw_cli.cli import app
from openclaw_cli.env_training import EnvTrainer, RolloutContext, resolve_env
from openclaw_cli.env_training.rollout import BackendPolicy
from openclaw_cli.settings import LocalSettings, LoraSettings, Settings, TrainEnvSettings, TrainSettings
from openclaw_cli.testing.fake_backend import FakeBackend

pytestmark = pytest.mark.timeout(240)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EMBEDDING_SCALE = 6.0


def load_example(name: str) -> ModuleType:
    module_name = f"track2_example_{name}"
    if module_name not in sys.modules:  # registered first: dataclasses look their module up while it loads
        spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[module_name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[module_name])
    return sys.modules[module_name]


def tool_call(name: str, **arguments: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def scripted_context(tokenizer, replies: list[str], *, seed: int = 123) -> tuple[RolloutContext, FakeBackend]:
    backend = FakeBackend(tokenizer, replies, default_reply="(no more script)")
    policy = BackendPolicy(backend, version=0, max_tokens=256, temperature=1.0, seed_parts=(seed,))
    return RolloutContext(policy=policy, tokenizer=tokenizer, rng=random.Random(seed), seed=seed), backend


# -- environment logic with scripted replies --------------------------------------------------------------------


def test_calculator_tool_and_answer_check() -> None:
    calc = load_example("track2_calculator")
    assert calc.calculate("2 + 3 * 4") == "14" and calc.calculate("(7 - 1) / 4") == "1.5"
    for bad in ("__import__('os').system('true')", "x + 1", "2 ** 8", "1 / 0"):
        with pytest.raises(ValueError):
            calc.calculate(bad)
    assert calc.score(7, "The answer is 7.") == (1.0, True)
    assert calc.score(7, "8") == (calc.FORMAT_REWARD, False)
    assert calc.score(7, "\n\n") == (0.0, False)
    tasks = [calc.make_task(random.Random(seed)) for seed in range(200)]
    assert {t.answer for t in tasks} == set(range(10))


async def test_calculator_episode_runs_the_tool_and_rewards_the_right_answer(tiny_tokenizer) -> None:
    calc = load_example("track2_calculator")
    task = calc.make_task(random.Random(123))
    expression = task.question.removeprefix("What is ").removesuffix("?")
    ctx, backend = scripted_context(tiny_tokenizer, [tool_call("calculator", expression=expression), f"{task.answer}"])
    trajectory = await calc.rollout(ctx)
    assert (trajectory.reward, trajectory.solved, trajectory.info["tool_calls"]) == (1.0, True, 1)
    assert len(trajectory.turns) == 2
    # The second model call saw the tool's real result.
    second_prompt = tiny_tokenizer.decode(backend.calls[1].prompt_tokens)
    assert f"<tool_response>\n{task.answer}\n</tool_response>" in second_prompt

    wrong = (task.answer + 1) % 10
    ctx, _ = scripted_context(tiny_tokenizer, [tool_call("calculator", expression="1 +"), str(wrong)])
    trajectory = await calc.rollout(ctx)
    assert (trajectory.reward, trajectory.solved) == (calc.FORMAT_REWARD, False)


def terminal_solution(instruction: str) -> str:
    if "largest" in instruction:
        return "sort -n data.txt | tail -n 1 > answer.txt"
    if "smallest" in instruction:
        return "sort -n data.txt | head -n 1 > answer.txt"
    return "wc -l < data.txt > answer.txt"


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_terminal_episode_is_rewarded_from_the_answer_file(tiny_tokenizer, seed: int) -> None:
    term = load_example("track2_terminal")
    task = term.make_task(random.Random(seed))
    replies = [tool_call("shell", command=terminal_solution(task.instruction)), "DONE"]
    ctx, _ = scripted_context(tiny_tokenizer, replies, seed=seed)
    trajectory = await term.rollout(ctx)
    assert (trajectory.reward, trajectory.solved) == (1.0, True), trajectory.info


async def test_terminal_episode_refuses_escapes_and_scores_missing_files_zero(tiny_tokenizer) -> None:
    term = load_example("track2_terminal")
    replies = [tool_call("shell", command="cat /etc/hostname > answer.txt"), "DONE"]
    ctx, backend = scripted_context(tiny_tokenizer, replies)
    trajectory = await term.rollout(ctx)
    assert (trajectory.reward, trajectory.solved) == (0.0, False)
    assert "refused: path '/etc/hostname' is outside the sandbox" in tiny_tokenizer.decode(
        backend.calls[1].prompt_tokens
    )

    ctx, _ = scripted_context(tiny_tokenizer, [tool_call("shell", command="echo nope > answer.txt"), "DONE"])
    assert (await term.rollout(ctx)).reward == term.PARTIAL_REWARD


async def test_remote_episode_over_http(tiny_tokenizer) -> None:
    server_module = load_example("track2_remote_env_server")
    client_module = load_example("track2_remote_env")
    key, value = random.Random(123).choice(server_module.CHANGES)
    fixed = server_module.render_config({**server_module.ORIGINAL, key: value})
    env = client_module.ExampleRemoteEnv()
    try:
        replies = [
            tool_call("read_file", path="settings.ini"),
            tool_call("write_file", path="settings.ini", content=fixed),
        ]
        ctx, backend = scripted_context(tiny_tokenizer, [*replies, "DONE"])
        trajectory = await env.rollout(ctx)
        assert (trajectory.reward, trajectory.solved, trajectory.info["done"]) == (1.0, True, True)
        assert len(trajectory.turns) == 3
        assert "debug = true" in tiny_tokenizer.decode(backend.calls[1].prompt_tokens)  # read_file's result
        assert env.url is not None and env.url.startswith("http://127.0.0.1:")

        broken = tool_call("write_file", path="settings.ini", content="[app]\nname = demo\n")
        ctx, _ = scripted_context(tiny_tokenizer, [broken, "DONE"])
        assert (await env.rollout(ctx)).reward == 0.0
    finally:
        await env.aclose()
    assert env.url is None  # the bundled server was stopped


# -- every example end to end through the CLI --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("example", "extra"),
    [
        ("track2_calculator.py", ["--env-arg", "max_turns=2"]),
        ("track2_terminal.py", ["--env-arg", "max_turns=2", "--env-arg", "command_timeout_s=2"]),
        ("track2_remote_env.py", ["--env-arg", "max_turns=2"]),
    ],
)
def test_examples_run_through_openclaw_train(tiny_model_dir: Path, tmp_path: Path, example: str, extra) -> None:
    metrics = tmp_path / "metrics.jsonl"
    args = [
        "train",
        "--env",
        str(EXAMPLES / example),
        "--model",
        str(tiny_model_dir),
        "--steps",
        "2",
        "--group-size",
        "2",
        "--prompts-per-step",
        "2",
        "--max-tokens",
        "8",
        "--metrics",
        str(metrics),
        "--save",
        "final",
        "--set",
        f"local.state_dir={tmp_path / 'ckpt'}",
        "--set",
        "lora.rank=4",
        *extra,
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert re.search(r"step 1: reward \d\.\d{3}, solved \d+%, \d+ tokens", result.output)
    assert "done: 2 steps" in result.output
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2] and all(m["rollouts"] == 4 for m in lines)
    assert (tmp_path / "ckpt" / "final" / "openclaw-state.json").is_file()


def test_train_refuses_a_bad_env_spec_before_loading_a_model(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--env", "no_such_module_xyz:rollout", "--no-save"])
    assert result.exit_code == 2
    assert "no module named 'no_such_module_xyz'" in result.output
    result = CliRunner().invoke(app, ["train", "--no-save"])
    assert result.exit_code == 2 and "no environment: pass --env" in result.output
    result = CliRunner().invoke(app, ["train", "--env", "x.py", "--env-arg", "url", "--no-save"])
    assert result.exit_code == 2 and "--env-arg expects KEY=VALUE, got 'url'" in result.output


# -- GRPO learns on the calculator example -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def learnable_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from e2e_scenario import make_learnable_model

    return make_learnable_model(tiny_model_dir, tmp_path_factory.mktemp("learnable-tiny-x6") / "model", EMBEDDING_SCALE)


async def test_grpo_raises_the_calculator_reward(learnable_model_dir: Path, tmp_path: Path) -> None:
    from openclaw_cli.backends.local import LocalBackend

    settings = Settings(
        model=str(learnable_model_dir),
        lora=LoraSettings(rank=8, alpha=16),
        # A high learning rate: the point is to see learning within seconds on a toy model.
        train=TrainSettings(lr=3e-2),
        local=LocalSettings(state_dir=tmp_path / "ckpt", seed=0, keep_versions=2, max_concurrent_requests=4),
        train_env=TrainEnvSettings(
            env="examples/track2_calculator.py", steps=8, group_size=8, prompts_per_step=4, max_tokens=4, seed=0
        ),
    )
    env = resolve_env(str(EXAMPLES / "track2_calculator.py"))
    backend = LocalBackend(settings)
    await backend.start()
    try:
        history = await EnvTrainer(backend, settings, env).run()
        # Paired evaluation: the same 64 tasks and sampling seeds under the base policy and the trained one.
        evaluation = settings.train_env.model_copy(update={"group_size": 4, "prompts_per_step": 16})
        evaluator = EnvTrainer(backend, settings.model_copy(update={"train_env": evaluation}), env)
        before, after = await asyncio.gather(
            evaluator.collect(10_000, 0), evaluator.collect(10_000, backend.current_version().version)
        )
    finally:
        await backend.close()
    rewards = [round(s.mean_reward, 3) for s in history]
    reward_before = sum(r for g in before for r in g.rewards) / 64
    reward_after = sum(r for g in after for r in g.rewards) / 64
    print(f"training rewards {rewards}; eval reward {reward_before:.3f} -> {reward_after:.3f}")
    assert all(s.published_version is not None for s in history[2:]), "later steps must find groups with signal"
    assert reward_after >= reward_before + 0.1, (reward_before, reward_after, rewards)
    assert sum(rewards[-3:]) / 3 >= sum(rewards[:2]) / 2 + 0.08, rewards
