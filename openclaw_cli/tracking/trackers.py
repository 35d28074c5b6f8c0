"""One adapter per tracker, each over the tracker's own library, imported only when that tracker is named.

Every adapter is synchronous and is only called from the hub's thread (openclaw_cli.tracking.hub). ``open`` joins
the run named by :class:`RunInfo` (created the first time, resumed after a restart), ``log`` sends one row's scalars
at a step, ``close`` flushes. The timestamp of a row is when the store recorded it, where the tracker takes one.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("openclaw.tracking")

# The modules each tracker needs (mlflow's SQLite store, the default, needs SQLAlchemy and Alembic).
MODULES = {
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    "trackio": ("trackio",),
}


def missing_modules(tracker: str, *, mlflow_uri: str | None = None) -> list[str]:
    """The modules ``tracker`` needs that are not installed (without importing them); an MLflow server URI (not
    SQLite) needs no SQLAlchemy or Alembic here."""
    import importlib.util

    needed = MODULES[tracker]
    if tracker == "mlflow" and mlflow_uri and not mlflow_uri.startswith("sqlite"):
        needed = ("mlflow",)
    return [module for module in needed if importlib.util.find_spec(module) is None]


class TrackerUnavailable(RuntimeError):
    """The tracker's library is missing or the tracker refused to open (the message says what to do)."""


@dataclass(frozen=True)
class RunInfo:
    id: str  # stable across restarts; letters, digits, '-' and '_' (W&B's run id)
    name: str
    project: str
    dir: Path  # where local trackers write
    mlflow_uri: str | None = None


class Tracker(Protocol):
    name: str

    def open(self, run: RunInfo, config: dict[str, Any]) -> None: ...

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None: ...

    def close(self) -> None: ...


def shown(value: Any) -> str:
    """A setting as text: strings as they are, everything else as JSON (null, [..], numbers)."""
    return value if isinstance(value, str) else json.dumps(value)


def install_hint(tracker: str, missing: list[str]) -> str:
    """What is missing for ``tracker`` and the extra that installs it (the doctor's line and the launch log's); each
    tracker's extra in pyproject.toml bears its name."""
    return f"{', '.join(missing)} missing: pip install 'openclaw-cli[{tracker}]'"


def load(tracker: str, *, mlflow_uri: str | None = None) -> Any:
    """Import ``tracker``'s library, or raise TrackerUnavailable saying what is missing and the extra to install."""
    import importlib

    missing = missing_modules(tracker, mlflow_uri=mlflow_uri)
    if not missing:
        module = MODULES[tracker][0]
        try:
            return importlib.import_module(module)
        except ImportError as exc:  # present but broken (or a dependency of it missing)
            missing = [f"{module} ({exc})"]
    raise TrackerUnavailable(f"train.report_to names {tracker}, but {install_hint(tracker, missing)}")


def mlflow_tracking_uri(configured: str | None, directory: Path) -> str:
    """tracking.mlflow_uri, else MLFLOW_TRACKING_URI, else a SQLite store in ``directory``."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{directory / 'mlflow.db'}"


class TensorBoardTracker:
    """Event files under ``<dir>/tensorboard/<run name>``, written with TensorBoard's own event writer (no
    TensorFlow or torch needed). A restart adds a new event file to the same directory: TensorBoard shows one run."""

    name = "tensorboard"

    def __init__(self) -> None:
        self._writer: Any = None
        self.logdir: Path | None = None

    def open(self, run: RunInfo, config: dict[str, Any]) -> None:
        load(self.name)
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.logdir = run.dir / "tensorboard" / run.name
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.logdir))
        self._write_config(config)

    def _write_config(self, config: dict[str, Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

        # The text plugin's summary: the settings as a Markdown table on TensorBoard's Text tab.
        rows = ["| setting | value |", "| --- | --- |"]
        rows += [f"| {key} | {shown(value)} |" for key, value in config.items()]
        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING,
            string_val=["\n".join(rows).encode()],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]),
        )
        metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        value = summary_pb2.Summary.Value(tag="config/text_summary", metadata=metadata, tensor=tensor)
        self._writer.add_event(event_pb2.Event(step=0, summary=summary_pb2.Summary(value=[value])))
        self._writer.flush()

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(tag=name, simple_value=value) for name, value in scalars.items()]
        self._writer.add_event(
            event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values))
        )
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class WandbTracker:
    """A W&B run with a fixed id, resumed on restart (``resume="allow"``). Online needs ``WANDB_API_KEY`` (or
    ``wandb login``); ``WANDB_MODE=offline`` writes the run under ``<dir>/wandb`` for ``wandb sync`` later."""

    name = "wandb"

    def __init__(self) -> None:
        self._run: Any = None

    def open(self, run: RunInfo, config: dict[str, Any]) -> None:
        wandb = load(self.name)
        run.dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=run.project,
            name=run.name,
            id=run.id,
            resume="allow",
            dir=str(run.dir),
            config=config,
            # console capture would copy the terminal (the dashboard) into the run; system stats are not ours
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()


MLFLOW_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value


class MlflowTracker:
    """An MLflow run found by its ``openclaw.run_id`` tag (created the first time), through ``MlflowClient``: no
    global active run. The tracking URI: tracking.mlflow_uri, else MLFLOW_TRACKING_URI, else a SQLite store at
    ``<dir>/mlflow.db``. The settings are the run's parameters (MLflow keeps a parameter's first value: a setting
    changed across a restart keeps its first value there)."""

    name = "mlflow"

    def __init__(self) -> None:
        self._client: Any = None
        self._run_id: str | None = None
        self.uri: str | None = None

    def open(self, run: RunInfo, config: dict[str, Any]) -> None:
        self.uri = mlflow_tracking_uri(run.mlflow_uri, run.dir)
        load(self.name, mlflow_uri=self.uri)
        from mlflow import MlflowClient
        from mlflow.entities import Param

        run.dir.mkdir(parents=True, exist_ok=True)
        with _quiet_logger("mlflow", "alembic"):
            client = MlflowClient(tracking_uri=self.uri)
            experiment = client.get_experiment_by_name(run.project)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(run.project)
            found = client.search_runs(
                [experiment_id], filter_string=f"tags.`openclaw.run_id` = '{run.id}'", max_results=1
            )
        if found:
            self._run_id = found[0].info.run_id
            client.update_run(self._run_id, status="RUNNING")
            known = set(found[0].data.params)
        else:
            created = client.create_run(experiment_id, run_name=run.name, tags={"openclaw.run_id": run.id})
            self._run_id = created.info.run_id
            known = set()
        params = [Param(key, shown(value)[:MLFLOW_PARAM_CHARS]) for key, value in config.items() if key not in known]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters a call
            client.log_batch(self._run_id, params=params[start : start + 100])
        self._client = client

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        from mlflow.entities import Metric

        stamp = int(wall_time * 1000)
        metrics = [Metric(name, value, stamp, step) for name, value in scalars.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self) -> None:
        if self._client is not None and self._run_id is not None:
            self._client.set_terminated(self._run_id, status="FINISHED")


class TrackioTracker:
    """A trackio run (local SQLite under ``<dir>/trackio`` unless TRACKIO_DIR is set), resumed by name."""

    name = "trackio"

    def __init__(self) -> None:
        self._run: Any = None

    def open(self, run: RunInfo, config: dict[str, Any]) -> None:
        # trackio reads TRACKIO_DIR once, when first imported.
        os.environ.setdefault("TRACKIO_DIR", str(run.dir / "trackio"))
        trackio = load(self.name)
        with contextlib.redirect_stdout(io.StringIO()) as said:  # it prints its banner to stdout
            self._run = trackio.init(
                project=run.project,
                name=run.name,
                config=config,
                resume="allow",
                auto_log_cpu=False,
                auto_log_gpu=False,
                embed=False,
            )
        log.debug("trackio: %s", said.getvalue().strip())

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        if self._run is not None:
            with contextlib.redirect_stdout(io.StringIO()):
                self._run.finish()


TRACKER_TYPES: dict[str, type[TensorBoardTracker | WandbTracker | MlflowTracker | TrackioTracker]] = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
    "trackio": TrackioTracker,
}


@contextlib.contextmanager
def _quiet_logger(*names: str) -> Any:
    """MLflow logs its database migrations at INFO on first use; keep them out of the launch log."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
