"""Experiment trackers (train.report_to): every tracker, offline, read back with its own reader, gets exactly the
store's step rows, once, in one run that a restart resumes; a tracker that fails never stops the others, is logged
once, and catches up when it works again; the settings reach the run with secrets masked."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import pytest
import wandb_offline
from tracker_readback import store_series
from typer.testing import CliRunner

from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.tracking.hub import PushedRows, RunInfo, TrackerHub, env_row, start_store_hub, store_run
from openclaw_cli.tracking.scalars import EVAL_METRICS, STEP_METRICS, metric_table

pytestmark = pytest.mark.timeout(180)

SECRET = "sk-never-in-a-tracker-0123456789"


def step_row(step: int) -> dict[str, Any]:
    """A steps row as the trainer writes it (a subset of keys varies by step, as in real runs)."""
    row: dict[str, Any] = {
        "loss": 0.5 / step,
        "mean_reward": 0.25 * (step % 3) - 0.25,
        "reward_std": 0.1 * step,
        "advantage": {"mean": 0.01 * step, "std": 0.2, "min": -0.5, "max": 0.5, "tokens": 40 + step},
        "kl_sampler": 1e-3 * step,
        "clip_fraction": 0.0,
        "ratio_mean": 1.0,
        "grad_norm": None if step == 2 else 1.5,  # absent values are left out, never sent as 0
        "lr": 2e-4,
        "tokens": 100 * step,
        "n_samples": 4,
        "n_batch": 4,
        "dropped_stale": 0,
        "unusable": 0,
        "teacher_hints": 2,
        "demos": 1,
        "replayed_demos": step - 1,
        "loops": 0,
        "lesson_demos": 0,
        "method": "opd",
        "trained_turn_ids": [1, 2],
        "seconds": {"score": 1.25, "train": 2.5, "publish": 0.5},
        "publish": {
            "promoted": step != 3,
            "guard_ok": step != 3,
            "kl_base": 0.05 * step,
            "distinct_min": 0.8,
            "win_rate": 0.5,
        },
        "judge": {"progress": 2, "correction": 1, "neutral": 1, "latency_s": 0.75},
        "capture": {"sessions": step, "main_turns": 4 * step, "side_turns": step},
        "lessons": {"active": 1, "candidate": 0, "retired": 0},
    }
    return row


def settings_for(tmp_path: Path, trackers: list[str]) -> Settings:
    return Settings(
        api_key=SECRET,
        store={"path": tmp_path / "store.sqlite3"},
        train={"report_to": trackers},
        tracking={"interval_s": 0.05},
    )


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # what the hub sets by default, made explicit
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_all_four_trackers_get_the_store_rows_once_in_one_run_across_a_restart(tmp_path: Path, offline: None) -> None:
    trackers = ["tensorboard", "wandb", "mlflow", "trackio"]
    settings = settings_for(tmp_path, trackers)
    with Store(settings.store.path) as store:
        for step in (1, 2, 3):
            store.record_step(step, step - (step == 3), step_row(step), now=1_800_000_000.0 + step)
        store.record_evaluation(
            {"win_rate_b": 0.75, "mean_score_a": 0.1, "mean_score_b": 0.4, "n": 8, "pairs_judged": 8},
            now=1_800_000_003.5,
        )
        hub = start_store_hub(store, settings)
        assert hub is not None
        assert hub.stop(60) and all(s["open"] and not s["failing"] for s in hub.status().values()), hub.status()
        run = store_run(store, settings)
    # A restart: the same store, two more steps; the run is resumed, not duplicated, and rows go once.
    with Store(settings.store.path) as store:
        for step in (4, 5):
            store.record_step(step, step - 1, step_row(step), now=1_800_000_000.0 + step)
        hub = start_store_hub(store, settings)
        assert hub is not None and hub.stop(60), hub and hub.status()
        assert store_run(store, settings) == run
        expected = store_series(store.steps())
    assert set(expected) == set(STEP_METRICS)  # every documented step metric is in a full row
    assert expected["train/grad_norm"] == [(1, 1.5), (3, 1.5), (4, 1.5), (5, 1.5)]
    assert expected["publish/promoted"][2] == (3, 0.0)
    eval_step, eval_value = 3, 0.75  # measured after step 3 (the last step recorded before it)

    # TensorBoard, through its own reader: one run directory, every scalar row for row.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = list((tmp_path / "tensorboard").iterdir())
    assert [p.name for p in runs] == [run.name]
    events = EventAccumulator(str(runs[0]), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    for name, points in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(name)]
        assert [s for s, _ in got] == [s for s, _ in points], name
        assert [v for _, v in got] == pytest.approx([v for _, v in points], rel=1e-6), name
    assert [(e.step, e.value) for e in events.Scalars("eval/win_rate")] == [(eval_step, eval_value)]
    *_, config_text = events.Tensors("config/text_summary")  # written by each process, at step 0
    text = config_text.tensor_proto.string_val[0].decode()
    assert "| api_key | " in text and SECRET not in text

    # MLflow, through its client: one run (tagged with the store's run id), every metric's history.
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("openclaw")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.data.tags["openclaw.run_id"] == run.id and found.info.run_name == run.name
    assert found.info.status == "FINISHED"
    for name, points in expected.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, name))
        assert history == points, name
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "eval/win_rate")] == [(3, 0.75)]
    assert found.data.params["api_key"] == "**** (set)" and found.data.params["train.report_to"]

    # W&B offline: a run directory per process, both with the store's run id (wandb sync merges them into one run).
    run_dirs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 2
    rows = []
    for run_dir in run_dirs:
        run_id, display_name, config = wandb_offline.run_info(run_dir)
        assert (run_id, display_name) == (run.id, run.name)
        assert config["api_key"] == "**** (set)"
        rows += wandb_offline.history(run_dir)
    for name, points in expected.items():
        assert [(r["_step"], r[name]) for r in rows if name in r] == points, name
    assert [(r["_step"], r["eval/win_rate"]) for r in rows if "eval/win_rate" in r] == [(3, 0.75)]

    # trackio: its local SQLite store, read with its own storage class.
    from trackio.sqlite_storage import SQLiteStorage

    assert SQLiteStorage.get_runs("openclaw") == [run.name]
    logs = SQLiteStorage.get_logs("openclaw", run.name)
    for name, points in expected.items():
        assert [(r["step"], r[name]) for r in logs if name in r] == points, name
    assert SQLiteStorage.get_run_config("openclaw", run.name)["api_key"] == "**** (set)"

    # The key itself is nowhere under the tracking directory.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


class FakeTracker:
    """A tracker double: fails to open ``open_failures`` times, fails ``log_failures`` sends, records the rest."""

    def __init__(self, name: str, *, open_failures: int = 0, log_failures: int = 0) -> None:
        self.name = name
        self.open_failures = open_failures
        self.log_failures = log_failures
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def open(self, run: RunInfo, config: dict[str, Any]) -> None:
        if self.open_failures:
            self.open_failures -= 1
            raise ConnectionError("api.wandb.ai unreachable")

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        if self.log_failures:
            self.log_failures -= 1
            raise PermissionError("401 bad API key")
        self.logged.append((step, scalars))

    def close(self) -> None:
        self.closed = True


def test_a_failing_tracker_is_logged_once_and_never_holds_back_the_others(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openclaw_cli.tracking import hub as hub_module

    monkeypatch.setattr(hub_module, "REOPEN_AFTER_S", 0.0)  # retry opening at every round
    settings = settings_for(tmp_path, ["tensorboard", "wandb", "mlflow"])
    fakes = {
        "tensorboard": FakeTracker("tensorboard"),
        "wandb": FakeTracker("wandb", open_failures=1000),  # never opens (offline, bad key)
        "mlflow": FakeTracker("mlflow", log_failures=3),  # its server is down for three sends, then back
    }
    caplog.set_level(logging.INFO, logger="openclaw.tracking")
    with Store(settings.store.path) as store:
        run = store_run(store, settings)
        hub = TrackerHub(
            ["tensorboard", "wandb", "mlflow"],
            run,
            {},
            hub_module.StoreRows(store, run.id),
            interval_s=0.01,
            make=fakes.__getitem__,
        )
        hub.start()
        for step in (1, 2, 3):
            store.record_step(step, step, step_row(step))
            hub.wake()
        for _ in range(1000):  # the retries need a few rounds (at most 20 s on a loaded machine)
            if len(fakes["mlflow"].logged) == 3:
                break
            time.sleep(0.02)
        assert hub.stop(10)
        assert store.tracker_state(f"sent:mlflow:{run.id}") == {"step": 3, "eval": 0}
    assert [s for s, _ in fakes["tensorboard"].logged] == [1, 2, 3]
    assert [s for s, _ in fakes["mlflow"].logged] == [1, 2, 3]  # caught up, in order, once each
    assert fakes["wandb"].logged == [] and not fakes["wandb"].closed
    assert fakes["tensorboard"].closed and fakes["mlflow"].closed
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("wandb is off for now (ConnectionError: api.wandb.ai unreachable)" in w for w in warnings) == 1
    assert sum("could not send to mlflow (PermissionError: 401 bad API key)" in w for w in warnings) == 1
    assert any("mlflow works again" in r.getMessage() for r in caplog.records)


def test_each_owners_adapter_is_reported_under_its_own_prefix_on_one_growing_step_axis(tmp_path: Path) -> None:
    """Adapters per owner: every adapter's steps reach the trackers, an owner's under its directory name (an owner
    id, never a key), on a step axis that grows whichever adapter stepped; an evaluation lands after the steps
    before it; each adapter's cursor is its own, so nothing is sent twice."""
    from openclaw_cli.lesson_prompt import key_owner
    from openclaw_cli.tracking.hub import StoreRows

    alice = key_owner("sk-alice-0123456789")
    settings = settings_for(tmp_path, ["tensorboard"])
    fake = FakeTracker("tensorboard")
    with Store(settings.store.path) as store:
        store.record_step(1, 1, step_row(1), now=10.0)
        store.record_step(1, 1, step_row(1), adapter=alice, now=11.0)
        store.record_step(2, 2, step_row(2), adapter=alice, now=12.0)
        store.record_evaluation({"win_rate_b": 0.75, "n": 4}, now=12.5)
        store.record_step(2, 2, step_row(2), now=13.0)
        run = store_run(store, settings)
        hub = TrackerHub(["tensorboard"], run, {}, StoreRows(store, run.id), interval_s=0.01, make=lambda _: fake)
        hub.start()
        assert hub.stop(10)
        cursors = store.tracker_state(f"sent:tensorboard:{run.id}")
    prefix = "key-" + alice[4:]

    def whose(scalars: dict[str, float]) -> str:
        if all(name.startswith("eval/") for name in scalars):
            return "eval"
        if all(name.startswith(prefix + "/") for name in scalars):
            return "alice"
        return "shared" if not any(name.startswith(prefix) for name in scalars) else "mixed"

    assert [(step, whose(scalars)) for step, scalars in fake.logged] == [
        (1, "shared"),
        (2, "alice"),
        (3, "alice"),
        (3, "eval"),
        (4, "shared"),
    ]
    assert fake.logged[1][1][f"{prefix}/train/loss"] == pytest.approx(0.5)
    assert "sk-alice" not in repr(fake.logged)
    assert cursors == {"step": 2, f"step@{alice}": 2, "eval": 1}


def test_a_missing_tracker_library_names_the_extra_to_install(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_wandb(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    monkeypatch.delitem(__import__("sys").modules, "wandb", raising=False)
    settings = settings_for(tmp_path, ["wandb"])
    with Store(settings.store.path) as store:
        store.record_step(1, 1, step_row(1))
        hub = start_store_hub(store, settings)
        assert hub is not None and hub.stop(10)
        status = hub.status()["wandb"]
        assert (status["open"], status["failing"], status["sent_rows"]) == (False, True, 0)
        assert "pip install 'openclaw-cli[wandb]'" in status["last_error"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "pip install 'openclaw-cli[wandb]'" in warning and "serving and training go on" in warning


def test_env_training_rows_are_pushed_and_named_in_the_env_table(tmp_path: Path) -> None:
    fake = FakeTracker("tensorboard")
    rows = PushedRows()
    run = RunInfo(id="envrl-1", name="envrl-1", project="openclaw", dir=tmp_path)
    hub = TrackerHub(["tensorboard"], run, {}, rows, interval_s=0.01, make=lambda _: fake).start()
    stats = {
        "step": 1,
        "mean_reward": 0.5,
        "solved_fraction": 0.25,
        "loss": math.nan,
        "rollouts": 8,
        "groups": 2,
        "groups_skipped": 1,
        "sampled_tokens": 64,
        "trained_turns": 4,
        "seconds": 1.5,
        "published_version": 1,
        "source": "env",
    }
    rows.push(env_row(1, stats))
    assert hub.stop(10)
    ((step, scalars),) = fake.logged
    assert step == 1 and scalars == {
        "env/reward_mean": 0.5,
        "env/solved_fraction": 0.25,
        "env/rollouts": 8.0,
        "env/groups_trained": 1.0,
        "env/sampled_tokens": 64.0,
        "env/trained_turns": 4.0,
        "env/seconds": 1.5,
        "policy/version": 1.0,
    }  # a NaN loss is not a scalar: left out


def test_the_docs_table_lists_every_metric_name() -> None:
    docs = (Path(__file__).parents[1] / "docs" / "tracking.md").read_text()
    assert metric_table() in docs
    assert set(EVAL_METRICS) <= set(metric_table().replace("`", " ").split())


def test_report_to_is_validated_where_it_is_given(tmp_path: Path) -> None:
    from openclaw_cli.cli import app

    result = CliRunner().invoke(app, ["launch", "--report-to", "tensorbord", "--set", f"store.path={tmp_path}/s.db"])
    assert result.exit_code == 2
    assert "--report-to 'tensorbord'" in result.output and "tensorboard, wandb, mlflow, trackio" in result.output
    assert not (tmp_path / "s.db").exists()
    assert Settings(train={"report_to": "all"}).train.report_to == ["tensorboard", "wandb", "mlflow", "trackio"]
    assert Settings(train={"report_to": "none"}).train.report_to == []


async def test_a_launch_reports_its_real_steps_to_tensorboard_and_mlflow_across_a_restart(
    learnable_model_dir: Path, tmp_path: Path
) -> None:
    """`openclaw launch` on the tiny model, scripted users and judge (tests/e2e_scenario.py): two steps, a restart,
    one more step; TensorBoard's reader and MLflow's client then hold the store's rows exactly, in one run."""

    import httpx
    import openai
    from e2e_scenario import ScriptedJudge, converse, e2e_settings, wait_for_step
    from runtime_helpers import free_port, launched
    from tracker_readback import mismatches, mlflow_series, tensorboard_series

    settings = e2e_settings(learnable_model_dir, tmp_path, free_port())
    settings = settings.model_copy(
        update={
            "train": settings.train.model_copy(update={"report_to": ["tensorboard", "mlflow"]}),
            "tracking": settings.tracking.model_copy(update={"interval_s": 0.2}),
        }
    )

    async def run(steps: int, first_session: int) -> None:
        async with launched(settings, judge_client=ScriptedJudge()) as runtime:
            client = openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
            async with httpx.AsyncClient(base_url=runtime.url) as http:
                done = runtime.trainer.stats.steps
                for step in range(1, steps + 1):
                    for s in range(2):
                        await converse(client, http, f"user-{first_session}-{step}-{s}", seed=step * 10 + s)
                    await wait_for_step(runtime, done + step)

    await run(2, 0)
    await run(1, 1)  # a restart on the same store
    with Store(settings.store.path) as store:
        steps = store.steps()
        run_name = store.tracker_state("run")["name"]
    assert [s for s, *_ in steps] == [1, 2, 3]
    expected = store_series(steps)
    assert {"train/loss", "train/reward_mean", "judge/latency_s", "capture/main_turns", "policy/version"} <= set(
        expected
    )
    (logdir,) = (tmp_path / "tensorboard").iterdir()
    assert logdir.name == run_name
    assert mismatches(expected, tensorboard_series(logdir), rel=1e-6) == []
    mlflow_run, mlflow = mlflow_series(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert mismatches(expected, mlflow) == [] and mlflow_run.info.run_name == run_name


def test_doctor_checks_each_named_tracker_has_its_library(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from openclaw_cli.commands.doctor import _tracker_checks

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "alembic" else real_find_spec(name, *a)
    )
    checks = _tracker_checks(Settings(train={"report_to": ["tensorboard", "mlflow"]}))
    assert [(c.name, c.ok) for c in checks] == [("tensorboard", True), ("mlflow", False)]
    assert checks[1].detail == "alembic missing: pip install 'openclaw-cli[mlflow]'"
    assert _tracker_checks(Settings()) == []
    server = Settings(train={"report_to": ["mlflow"]}, tracking={"mlflow_uri": "http://127.0.0.1:5000"})
    assert [(c.name, c.ok) for c in _tracker_checks(server)] == [("mlflow", True)]  # a server needs no SQLAlchemy
