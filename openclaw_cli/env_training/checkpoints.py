"""Mid-run checkpoints of ``openclaw train --env``: one JSON manifest per checkpointed step, and finding one again.

Every ``train_env.checkpoint_every`` steps the trainer saves the backend state as ``<run>-step-<NNNN>`` (the backend
decides where; the local backend writes ``local.state_dir/<run>-step-<NNNN>``) and then writes a manifest beside it,
``local.state_dir/.envrl-runs/<run>/step-<NNNN>.json``, holding what resuming needs: the saved state's path, the env
spec, the seed, the whole ``train_env`` section and the metrics of every step so far. The manifests live in a
hidden folder so that nothing listing checkpoint folders in ``state_dir`` (``openclaw eval latest``, the online
trainer) mistakes a run folder for a checkpoint. A manifest is written only after its state was saved, and
atomically, so one that exists always points at a complete state.

Only the newest ``train_env.keep_checkpoints`` checkpoints of a run are kept (:func:`prune_run`): older manifests are
deleted, then their saved states when those are folders inside ``state_dir`` (a cloud backend's saved state is a URI
on that service, left alone).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_FORMAT = 1
RUNS_DIR = ".envrl-runs"
LATEST = "latest"
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # leaves room for "-step-NNNN" in a state name
_MANIFEST_NAME = re.compile(r"^step-(\d+)\.json$")


class ResumeError(RuntimeError):
    """No manifest to resume from, an unreadable one, or one that does not match this run's settings."""


@dataclass
class RunManifest:
    run: str
    step: int  # the last step whose state ``checkpoint`` holds; a resumed run continues at step + 1
    checkpoint: str  # what the backend's save_state returned (a path or URI its load_state accepts)
    backend: str
    model: str | None
    env: str | None
    seed: int
    train_env: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)  # StepStats.to_json() of steps 1..step
    created_at: float = 0.0
    format: int = MANIFEST_FORMAT


def manifest_mismatches(manifest: RunManifest, *, env: str | None, seed: int, backend: str) -> list[str]:
    """What differs between a manifest and the run about to continue it (empty: it may resume)."""
    return [
        f"{name} {theirs!r} (this run: {ours!r})"
        for name, theirs, ours in (
            ("env", manifest.env, env),
            ("seed", manifest.seed, seed),
            ("backend", manifest.backend, backend),
        )
        if theirs != ours
    ]


def check_run_name(name: str) -> str:
    if not _RUN_NAME.match(name):
        raise ValueError(f"run name {name!r} must be letters, digits, '.', '_' or '-' (max 100, no leading '.')")
    return name


def checkpoint_state_name(run: str, step: int) -> str:
    return f"{run}-step-{step:04d}"


def runs_dir(state_dir: Path) -> Path:
    return Path(state_dir).expanduser() / RUNS_DIR


def manifest_path(state_dir: Path, run: str, step: int) -> Path:
    return runs_dir(state_dir) / run / f"step-{step:04d}.json"


def write_manifest(state_dir: Path, manifest: RunManifest) -> Path:
    """Write ``manifest`` atomically (temp file + rename) and return its path."""
    target = manifest_path(state_dir, manifest.run, manifest.step)
    target.parent.mkdir(parents=True, exist_ok=True)
    manifest.created_at = manifest.created_at or time.time()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(manifest), handle, indent=1, allow_nan=False, default=str)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_manifest(path: Path) -> RunManifest:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ResumeError(f"cannot read run manifest {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise ResumeError(f"{path} is not a run manifest of format {MANIFEST_FORMAT}")
    try:
        return RunManifest(**data)
    except TypeError as exc:
        raise ResumeError(f"{path} is not a valid run manifest: {exc}") from exc


def _run_manifests(run_dir: Path) -> list[tuple[int, Path]]:
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _MANIFEST_NAME.match(p.name))]
    return sorted(found)


def find_manifest(state_dir: Path, spec: str) -> Path:
    """The manifest to resume from: ``latest`` (the newest manifest of any run), ``RUN`` (that run's last
    checkpointed step), ``RUN@STEP``, or a path to a manifest file."""
    root = runs_dir(state_dir)
    if spec == LATEST:
        newest = [found[-1][1] for run in _dirs(root) if (found := _run_manifests(run))]
        if not newest:
            raise ResumeError(f"no checkpointed env runs in {root} to resume")
        return max(newest, key=lambda p: (p.stat().st_mtime, p.name))
    as_path = Path(spec).expanduser()
    if as_path.suffix == ".json" and as_path.is_file():
        return as_path
    run, _, step = spec.partition("@")
    found = _run_manifests(root / run) if _RUN_NAME.match(run) else []
    if step:
        if not step.isdigit():
            raise ResumeError(f"--resume RUN@STEP needs a step number, got {step!r}")
        found = [(s, p) for s, p in found if s == int(step)]
    if not found:
        known = ", ".join(sorted(p.name for p in _dirs(root))) or "none"
        raise ResumeError(f"no checkpoint of run {spec!r} in {root} (runs: {known})")
    return found[-1][1]


def prune_run(state_dir: Path, run: str, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` checkpoints of ``run`` and return the steps deleted. Each manifest goes
    first, then its state, so a crash in between leaves an unreferenced folder, never a manifest without a state."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    root = Path(state_dir).expanduser().resolve()
    removed: list[int] = []
    for step, path in _run_manifests(runs_dir(state_dir) / run)[:-keep]:
        try:
            saved: str | None = read_manifest(path).checkpoint
        except ResumeError:
            saved = None
        path.unlink(missing_ok=True)
        removed.append(step)
        if not saved or "://" in saved:
            continue
        state = Path(saved).expanduser().resolve()
        if state.is_dir() and state != root and state.is_relative_to(root):
            shutil.rmtree(state, ignore_errors=True)
    return removed


def _dirs(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
