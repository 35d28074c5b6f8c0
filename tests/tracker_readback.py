"""Tracker data read back with each tracker's own reader, as {metric name: [(step, value), ...]}, to compare with
the store's rows (tests/test_tracking*.py and scripts/tracked_launch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openclaw_cli.tracking.scalars import step_scalars


def store_series(steps: list[tuple[int, int | None, float, dict[str, Any]]]) -> dict[str, list[tuple[int, float]]]:
    """What the trackers should hold: every step row's scalars (Store.steps() rows)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, version, _, metrics in steps:
        for name, value in step_scalars(version, metrics).items():
            series.setdefault(name, []).append((step, value))
    return series


def tensorboard_series(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of one run directory, through TensorBoard's EventAccumulator (all event files in it)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def mlflow_series(uri: str, experiment: str = "openclaw") -> tuple[Any, dict[str, list[tuple[int, float]]]]:
    """(the one run of ``experiment``, its metric histories), through MlflowClient."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(found) == 1, f"{len(found)} MLflow runs in {experiment!r}, expected one"
    run = found[0]
    series = {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        for name in run.data.metrics
    }
    return run, series


def mismatches(
    expected: dict[str, list[tuple[int, float]]], got: dict[str, list[tuple[int, float]]], *, rel: float = 0.0
) -> list[str]:
    """What differs, metric by metric (``rel``: TensorBoard keeps float32); empty when they agree row for row."""
    problems = []
    for name, points in expected.items():
        seen = got.get(name, [])
        if [s for s, _ in seen] != [s for s, _ in points]:
            problems.append(f"{name}: steps {[s for s, _ in seen]} != {[s for s, _ in points]}")
            continue
        for (step, value), (_, want) in zip(seen, points, strict=True):
            if abs(value - want) > rel * abs(want):
                problems.append(f"{name} at step {step}: {value} != {want}")
    extra = sorted(set(got) - set(expected) - {n for n in got if n.startswith("eval/")})
    problems += [f"{name}: in the tracker, not in the store" for name in extra]
    return problems
