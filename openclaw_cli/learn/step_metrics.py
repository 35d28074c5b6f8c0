"""The parts of a training step's metrics row that describe its surroundings rather than the update itself: the
spread of the batch's rewards, the advantages actually trained, the judge's verdicts on the batch, what capture and
lessons hold at that moment, and the publish decision (collapse guard, promotion gate). They go into the store's
``steps`` row with the rest, so every tracker (openclaw_cli.tracking) reports exactly what the store holds."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openclaw_cli.store import Store
    from openclaw_cli.types import Datum


def spread(values: Sequence[float]) -> float | None:
    """Population standard deviation (None for an empty list)."""
    if not values:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def advantage_stats(datums: Iterable[Datum]) -> dict[str, float | int | None]:
    """Mean, spread, min and max of the per-token advantages that carry a gradient (non-zero), over the step's datums,
    and how many tokens that is; all None (tokens 0) when none does."""
    values = [float(a) for d in datums for a in d.loss_fn_inputs.get("advantages", ()) if a]
    if not values:
        return {"mean": None, "std": None, "min": None, "max": None, "tokens": 0}
    return {
        "mean": sum(values) / len(values),
        "std": spread(values),
        "min": min(values),
        "max": max(values),
        "tokens": len(values),
    }


def verdict_counts(verdicts: Iterable[dict[str, Any]]) -> dict[str, float | int | None]:
    """The judge's verdicts on a batch: how many read progress (+1), a correction (-1) or neither (0), and the mean
    wall time of a verdict (seconds; None where the verdicts predate timing)."""
    counts = {"progress": 0, "correction": 0, "neutral": 0}
    seconds: list[float] = []
    for verdict in verdicts:
        score = verdict.get("score")
        if isinstance(score, int | float):
            counts["progress" if score > 0 else "correction" if score < 0 else "neutral"] += 1
        took = verdict.get("seconds")
        if isinstance(took, int | float):
            seconds.append(float(took))
    return {**counts, "latency_s": sum(seconds) / len(seconds) if seconds else None}


def store_counts(store: Store) -> dict[str, dict[str, int]]:
    """Capture and lesson counts at this moment (a blocking read: call it from a worker thread)."""
    counts = store.counts()
    turns = counts["turns"]
    capture = {
        "sessions": sum(counts["sessions"].values()),
        "main_turns": sum(turns.get("main", {}).values()),
        "side_turns": sum(turns.get("side", {}).values()),
    }
    by_status = store.lesson_counts()
    lessons = {status: by_status.get(status, 0) for status in ("active", "candidate", "retired")}
    return {"capture": capture, "lessons": lessons}
