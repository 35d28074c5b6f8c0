"""Track 2 in real use: failed rollouts drop their group (and stop the run past a limit), mid-run checkpoints and
``--resume``, env steps recorded in the SQLite store for ``openclaw eval --plot``, one AdamParams helper."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
from tracker_readback import tensorboard_series
from typer.testing import CliRunner

from openclaw_cli.backend import NotYetAvailable
from openclaw_cli.cli import app
from openclaw_cli.env_training import EnvTrainer, RolloutContext, RolloutError, Trajectory, train_on_env
from openclaw_cli.env_training.checkpoints import (
    ResumeError,
    RunManifest,
    find_manifest,
    prune_run,
    read_manifest,
    runs_dir,
    write_manifest,
)
from openclaw_cli.env_training.hooks import FunctionEnv
from openclaw_cli.learn.algorithms import adam_params_from
from openclaw_cli.learn.evaluation import reward_series
from openclaw_cli.settings import LocalSettings, Settings, SettingsError, TrainEnvSettings, TrainSettings
from openclaw_cli.store import Store
from openclaw_cli.testing.fake_backend import FakeBackend
from openclaw_cli.types import AdamParams, Datum, FwdBwdResult, PolicyVersion, StepResult

pytestmark = pytest.mark.timeout(120)


class StatefulRecordingBackend(FakeBackend):
    """Scripted sampling; training calls recorded; its "weights" are the number of optimizer steps taken, which
    save_state/load_state keep and restore (in a dict shared by the backends of one test, like a disk)."""

    def __init__(self, tokenizer, disk: dict[str, int] | None = None) -> None:
        super().__init__(tokenizer, default_reply="ok")
        self.disk = {} if disk is None else disk
        self.weights = 0
        self.forward_backward_calls: list[list[Datum]] = []
        self.loaded: list[str] = []

    async def forward_backward(self, datums, loss, loss_config=None) -> FwdBwdResult:
        self.forward_backward_calls.append(datums)
        return FwdBwdResult(loss=0.5, metrics={}, logprobs=[])

    async def optim_step(self, adam: AdamParams) -> StepResult:
        self.weights += 1
        return StepResult(step=self.weights, metrics={})

    async def save_state(self, name: str) -> str:
        self.disk[f"mem://{name}"] = self.weights
        return f"mem://{name}"

    async def load_state(self, path: str) -> PolicyVersion:
        self.loaded.append(path)
        self.weights = self.disk[path]
        return self.current_version()


def settings_for(tmp_path: Path, **train_env) -> Settings:
    options = {"steps": 1, "group_size": 4, "prompts_per_step": 2, "max_tokens": 8, "seed": 7, **train_env}
    return Settings(
        train=TrainSettings(lr=0.01),
        local=LocalSettings(state_dir=tmp_path / "ckpt"),
        train_env=TrainEnvSettings(env="tests:member_env", **options),
    )


def member_rewards(draws: list[tuple[int, int, int, float]] | None = None, fail=lambda ctx: False):
    """Reward = member index (every group has a signal); records (step, group, member, task draw); ``fail(ctx)``
    makes a rollout raise."""

    async def rollout(ctx: RolloutContext) -> Trajectory:
        if draws is not None:
            draws.append((ctx.step, ctx.group, ctx.member, ctx.rng.random()))
        if fail(ctx):
            raise KeyError(f"task {ctx.group} broke")
        await ctx.policy.chat([{"role": "user", "content": "hi"}])
        return ctx.trajectory(float(ctx.member))

    return rollout


# -- failure policy ---------------------------------------------------------------------------------------------


async def test_a_failed_rollout_drops_its_group_and_is_logged(tiny_tokenizer, tmp_path, caplog) -> None:
    backend = StatefulRecordingBackend(tiny_tokenizer)
    env = FunctionEnv(member_rewards(fail=lambda ctx: ctx.group == 1 and ctx.member == 2))
    with caplog.at_level(logging.WARNING, logger="openclaw.envrl"):
        stats = await EnvTrainer(backend, settings_for(tmp_path), env).run_step(4)

    assert stats.failed_rollouts == 1 and stats.failed_groups == 1
    # Only group 0 is left: 4 rollouts, rewards 0..3, all four trained; group 1's three good members are dropped too.
    assert stats.groups == 1 and stats.rollouts == 4 and stats.rewards == [0.0, 1.0, 2.0, 3.0]
    assert stats.mean_reward == 1.5 and stats.trained_turns == 4
    assert [len(call) for call in backend.forward_backward_calls] == [4]
    assert stats.published_version == 1
    assert "1 rollouts failed (1 groups dropped)" in stats.line()
    [record] = [r for r in caplog.records if "rollout failed" in r.getMessage()]
    assert "step 4, group 1, member 2" in record.getMessage() and "KeyError" in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)


async def test_too_many_failures_stop_the_run_naming_the_first(tiny_tokenizer, tmp_path) -> None:
    backend = StatefulRecordingBackend(tiny_tokenizer)
    # 5 of 8 fail: more than half.
    five = FunctionEnv(member_rewards(fail=lambda ctx: ctx.group == 0 or ctx.member == 3))
    with pytest.raises(
        RolloutError,
        match=r"5 of 8 rollouts of step 1 failed .*max_failed_fraction=0.5\); first: "
        r"rollout failed \(step 1, group 0, member 0\): KeyError",
    ) as caught:
        await EnvTrainer(backend, settings_for(tmp_path), five).run_step(1)
    assert isinstance(caught.value.__cause__, RolloutError)
    assert backend.forward_backward_calls == []

    # Exactly half is not more than half: the step goes on, but with every group dropped it trains nothing.
    four = FunctionEnv(member_rewards(fail=lambda ctx: ctx.member >= 2))
    stats = await EnvTrainer(backend, settings_for(tmp_path), four).run_step(1)
    assert stats.failed_rollouts == 4 and stats.failed_groups == 2 and stats.groups == 0
    assert stats.published_version is None and math.isnan(stats.mean_reward)
    assert stats.to_json()["mean_reward"] is None and "reward -" in stats.line()

    # A stricter limit, from the settings, stops the same step.
    with pytest.raises(RolloutError, match="4 of 8"):
        await EnvTrainer(backend, settings_for(tmp_path, max_failed_fraction=0.25), four).run_step(1)


# -- checkpoints and resume -------------------------------------------------------------------------------------


async def test_checkpoints_and_resume_continue_the_same_run(tiny_tokenizer, tmp_path) -> None:
    disk: dict[str, int] = {}
    settings = settings_for(tmp_path, steps=4, checkpoint_every=2, group_size=2, prompts_per_step=2)
    first_draws: list = []
    first = EnvTrainer(
        StatefulRecordingBackend(tiny_tokenizer, disk),
        settings,
        FunctionEnv(member_rewards(first_draws)),
        run_name="r1",
    )
    history = await first.run()
    assert [s.step for s in history] == [1, 2, 3, 4]
    assert sorted(disk) == ["mem://r1-step-0002", "mem://r1-step-0004"] and disk["mem://r1-step-0002"] == 2
    run_dir = runs_dir(tmp_path / "ckpt") / "r1"
    assert sorted(p.name for p in run_dir.iterdir()) == ["step-0002.json", "step-0004.json"]

    manifest = read_manifest(find_manifest(tmp_path / "ckpt", "r1@2"))
    assert (manifest.run, manifest.step, manifest.checkpoint) == ("r1", 2, "mem://r1-step-0002")
    assert (manifest.env, manifest.seed, manifest.train_env["checkpoint_every"]) == ("tests:member_env", 7, 2)
    assert manifest.history == [s.to_json() for s in history[:2]]
    assert find_manifest(tmp_path / "ckpt", "r1").name == "step-0004.json"  # a run name means its last checkpoint
    assert find_manifest(tmp_path / "ckpt", "latest").name == "step-0004.json"

    # A fresh trainer on a fresh backend of the same type picks up after step 2.
    backend = StatefulRecordingBackend(tiny_tokenizer, disk)
    resumed_draws: list = []
    steps_seen: list[int] = []
    second = EnvTrainer(
        backend, settings, FunctionEnv(member_rewards(resumed_draws)), on_step=lambda s: steps_seen.append(s.step)
    )
    await second.resume(manifest)
    assert backend.loaded == ["mem://r1-step-0002"] and backend.weights == 2
    resumed = await second.run()
    assert steps_seen == [3, 4] and [s.step for s in resumed] == [1, 2, 3, 4]
    assert [s.to_json() for s in resumed[:2]] == manifest.history  # the manifest's metrics, carried over
    assert backend.weights == 4  # two more optimizer steps on top of the loaded state
    # Same seeded task sequence: steps 3 and 4 draw exactly the tasks the first run drew for them.
    assert sorted(resumed_draws) == sorted(d for d in first_draws if d[0] >= 3)
    # It keeps checkpointing under the same run name (overwriting step 4 with the resumed lineage).
    assert second.run_name == "r1" and [c[0] for c in second.checkpoints] == [4]


async def test_only_the_newest_checkpoints_of_a_run_are_kept(tiny_tokenizer, tmp_path) -> None:
    state_dir = tmp_path / "ckpt"

    class FolderStateBackend(StatefulRecordingBackend):
        async def save_state(self, name: str) -> str:  # as the local backend does: a folder in state_dir
            folder = state_dir / name
            folder.mkdir(parents=True)
            (folder / "weights").write_text(str(self.weights))
            return str(folder)

    settings = settings_for(tmp_path, steps=5, checkpoint_every=1, keep_checkpoints=2, group_size=2, prompts_per_step=1)
    trainer = EnvTrainer(FolderStateBackend(tiny_tokenizer), settings, FunctionEnv(member_rewards()), run_name="r5")
    await trainer.run()
    run_dir = runs_dir(state_dir) / "r5"
    assert sorted(p.name for p in run_dir.iterdir()) == ["step-0004.json", "step-0005.json"]
    assert sorted(p.name for p in state_dir.iterdir() if not p.name.startswith(".")) == [
        "r5-step-0004",
        "r5-step-0005",
    ]
    assert read_manifest(find_manifest(state_dir, "r5")).checkpoint == str(state_dir / "r5-step-0005")
    with pytest.raises(ResumeError, match="no checkpoint of run 'r5@2'"):
        find_manifest(state_dir, "r5@2")

    # A saved state that is not a folder in state_dir (a cloud URI, a path elsewhere) is never deleted.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_manifest(state_dir, RunManifest("r6", 1, str(outside), "local", None, None, 7, {}))
    write_manifest(state_dir, RunManifest("r6", 2, "tinker://run/step-2", "tinker", None, None, 7, {}))
    write_manifest(state_dir, RunManifest("r6", 3, "tinker://run/step-3", "tinker", None, None, 7, {}))
    assert prune_run(state_dir, "r6", 1) == [1, 2] and outside.is_dir()
    assert [p.name for p in (runs_dir(state_dir) / "r6").iterdir()] == ["step-0003.json"]


async def test_a_failed_checkpoint_is_logged_and_training_goes_on(tiny_tokenizer, tmp_path, caplog) -> None:
    backend = StatefulRecordingBackend(tiny_tokenizer)

    async def cannot_save(name: str) -> str:
        raise NotYetAvailable("no state here")

    backend.save_state = cannot_save
    settings = settings_for(tmp_path, steps=2, checkpoint_every=1, group_size=2, prompts_per_step=1)
    trainer = EnvTrainer(backend, settings, FunctionEnv(member_rewards()), run_name="r3")
    with caplog.at_level(logging.WARNING, logger="openclaw.envrl"):
        history = await trainer.run()
    assert [s.step for s in history] == [1, 2] and trainer.checkpoints == []
    assert trainer.checkpoint_errors == [(1, "no state here"), (2, "no state here")]
    assert "checkpoint after step 1 failed" in caplog.text and not runs_dir(tmp_path / "ckpt").exists()


async def test_resume_refuses_another_env_or_seed_and_unknown_runs(tiny_tokenizer, tmp_path) -> None:
    disk: dict[str, int] = {}
    settings = settings_for(tmp_path, steps=2, checkpoint_every=1, group_size=2, prompts_per_step=1)
    await EnvTrainer(
        StatefulRecordingBackend(tiny_tokenizer, disk), settings, FunctionEnv(member_rewards()), run_name="r2"
    ).run()
    manifest = read_manifest(find_manifest(tmp_path / "ckpt", "r2"))
    other = settings_for(tmp_path, steps=2, seed=8)
    with pytest.raises(ResumeError, match=r"seed 7 \(this run: 8\)"):
        await EnvTrainer(StatefulRecordingBackend(tiny_tokenizer, disk), other, FunctionEnv(member_rewards())).resume(
            manifest
        )
    with pytest.raises(ResumeError, match=r"no checkpoint of run 'nope'.*runs: r2"):
        find_manifest(tmp_path / "ckpt", "nope")
    with pytest.raises(ResumeError, match="no checkpointed env runs"):
        find_manifest(tmp_path / "elsewhere", "latest")
    with pytest.raises(ValueError, match="run name"):
        EnvTrainer(
            StatefulRecordingBackend(tiny_tokenizer, disk), settings, FunctionEnv(member_rewards()), run_name="a/b"
        )


# -- steps in the store -----------------------------------------------------------------------------------------


async def test_env_steps_are_recorded_in_the_store_and_plotted_by_eval(tiny_tokenizer, tmp_path) -> None:
    settings = settings_for(tmp_path, steps=2, group_size=2, prompts_per_step=1, store=tmp_path / "env.sqlite3")
    settings.store.path = tmp_path / "online.sqlite3"
    backend = StatefulRecordingBackend(tiny_tokenizer)
    history, saved = await train_on_env(settings, FunctionEnv(member_rewards()), backend=backend, run_name="plot")
    assert saved is None and [s.mean_reward for s in history] == [0.5, 0.5]

    with Store(tmp_path / "env.sqlite3", create=False) as store:
        steps = store.steps()
    assert [(step, version) for step, version, _, _ in steps] == [(1, 1), (2, 2)]
    metrics = steps[0][3]
    assert metrics["source"] == "env" and metrics["env"] == "tests:member_env" and metrics["run"] == "plot"
    assert metrics["mean_reward"] == 0.5 and metrics["rewards"] == [0.0, 1.0] and metrics["failed_rollouts"] == 0
    assert reward_series(steps) == ("mean_reward", [1, 2], [0.5, 0.5])

    # The online store's steps table belongs to the online trainer (it deletes steps past its checkpoint).
    settings.train_env.store = settings.store.path
    with pytest.raises(SettingsError, match="is the online store"):
        await train_on_env(settings, FunctionEnv(member_rewards()), backend=backend)


def test_one_adam_params_helper_for_both_trainers() -> None:
    train = TrainSettings(lr=0.02, adam_beta1=0.8, adam_beta2=0.9, weight_decay=0.1, grad_clip_norm=2.0)
    assert adam_params_from(train) == AdamParams(
        learning_rate=0.02, beta1=0.8, beta2=0.9, weight_decay=0.1, grad_clip_norm=2.0
    )


# -- the CLI on the tiny model: checkpoint, then --resume --------------------------------------------------------

ENV_FILE = """
async def rollout(ctx):
    await ctx.policy.chat([{"role": "user", "content": "Say something."}], max_tokens=4)
    return ctx.trajectory(float(ctx.member))
"""


def test_openclaw_train_resumes_a_checkpointed_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    env_file = tmp_path / "member_env.py"
    env_file.write_text(ENV_FILE)
    common = [
        "--model", str(tiny_model_dir),
        "--set", f"local.state_dir={tmp_path / 'ckpt'}",
        "--set", "lora.rank=4",
        "--set", f"train_env.store={tmp_path / 'env.sqlite3'}",
        "--set", f"store.path={tmp_path / 'online.sqlite3'}",
        "--report-to", "tensorboard",  # the env run is a TensorBoard run, continued by --resume
        "--set", f"tracking.dir={tmp_path / 'trackers'}",
    ]  # fmt: skip
    sizes = ["--steps", "2", "--group-size", "2", "--prompts-per-step", "1", "--max-tokens", "4"]
    every_step = ["--set", "train_env.checkpoint_every=1"]
    first = CliRunner().invoke(
        app, ["train", "--env", f"{env_file}:rollout", *sizes, "--save", "cli-run", *every_step, *common]
    )
    assert first.exit_code == 0, first.output
    assert "continue with `openclaw train --resume cli-run`" in first.output
    assert (tmp_path / "ckpt" / "cli-run-step-0002" / "openclaw-state.json").is_file()

    metrics = tmp_path / "resumed.jsonl"
    second = CliRunner().invoke(
        app, ["train", "--resume", "latest", "--steps", "3", "--no-save", "--metrics", str(metrics), *common]
    )
    assert second.exit_code == 0, second.output
    assert "resuming run cli-run after step 2" in second.output
    assert re.search(r"step 3: reward 0\.500", second.output) and "done: 3 steps" in second.output
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [3]
    with Store(tmp_path / "env.sqlite3", create=False) as store:
        assert [step for step, *_ in store.steps()] == [1, 2, 3]
        rewards = [(step, metrics["mean_reward"]) for step, _, _, metrics in store.steps()]
    series = tensorboard_series(tmp_path / "trackers" / "tensorboard" / "cli-run")
    assert [s for s, _ in series["env/reward_mean"]] == [s for s, _ in rewards] == [1, 2, 3]
    assert [v for _, v in series["env/reward_mean"]] == pytest.approx([v for _, v in rewards])

    refused = CliRunner().invoke(app, ["train", "--resume", "cli-run", "--seed", "99", "--no-save", *common])
    assert refused.exit_code == 2 and "seed 0 (this run: 99)" in refused.output
