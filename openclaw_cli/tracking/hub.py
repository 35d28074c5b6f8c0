"""The thread that feeds the trackers: opens them, sends rows past each tracker's cursor every interval, and closes
them at the end. Nothing here runs on the event loop, and nothing a tracker does (a hung network call, a bad key,
a missing library) reaches serving or training: each tracker's first failure is logged once, it is retried later,
and the rows wait (in the store, or in memory for a pushed source) until it takes them."""

from __future__ import annotations

import bisect
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from openclaw_cli.adapters import SHARED_ADAPTER, adapter_dirname
from openclaw_cli.tracking.scalars import eval_scalars, step_scalars
from openclaw_cli.tracking.trackers import TRACKER_TYPES, RunInfo, Tracker

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings
    from openclaw_cli.store import Store

log = logging.getLogger("openclaw.tracking")

REOPEN_AFTER_S = 300.0  # a tracker that could not open is tried again this long after


@dataclass(frozen=True)
class Row:
    stream: str  # "step" or "eval": each has its own cursor
    key: int  # the cursor value once this row is sent (step number or evaluation id)
    step: int  # the tracker step it is logged at
    wall_time: float
    scalars: dict[str, float]


class RowSource(Protocol):
    def rows_after(self, sent: dict[str, int]) -> list[Row]: ...

    def sent(self, tracker: str) -> dict[str, int]: ...

    def mark_sent(self, tracker: str, sent: dict[str, int]) -> None: ...


class StoreRows:
    """Rows from the store's ``steps`` and ``evaluations`` tables; cursors kept in the store per tracker and run.

    Every adapter's steps are reported (:mod:`openclaw_cli.adapters`): the shared adapter's under the metric names
    of :data:`~openclaw_cli.tracking.scalars.STEP_METRICS`, an owner's or group's under the same names prefixed with
    its directory name (``key-3f2a…/train/loss``: an owner id, never a key), so a tracker shows a section per owner.
    The tracker's step is the count of steps taken so far by all adapters together (one adapter alone: its own step
    number), which keeps growing as every tracker needs, whichever adapter stepped.
    """

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def rows_after(self, sent: dict[str, int]) -> list[Row]:
        new_steps = [
            (adapter, step)
            for adapter in self.store.trained_adapters()
            for step in self.store.steps(after=sent.get(step_stream(adapter), 0), adapter=adapter)
        ]
        evaluations = self.store.evaluations(after=sent.get("eval", 0))
        times = self.store.step_times()  # read last: it holds every step read above

        def steps_taken(when: float) -> int:
            return bisect.bisect_right(times, when)

        rows = [
            Row(step_stream(adapter), s, steps_taken(t), t, adapter_scalars(adapter, step_scalars(v, m)))
            for adapter, (s, v, t, m) in new_steps
        ]
        # An evaluation is logged at the last step recorded before it ran.
        rows += [Row("eval", eval_id, steps_taken(at), at, eval_scalars(report)) for eval_id, at, report in evaluations]
        # In step order, an evaluation after the step it followed: W&B drops a row logged at an earlier step.
        return sorted(rows, key=lambda row: (row.step, row.stream == "eval"))

    def sent(self, tracker: str) -> dict[str, int]:
        return self.store.tracker_state(f"sent:{tracker}:{self.run_id}") or {"step": 0, "eval": 0}

    def mark_sent(self, tracker: str, sent: dict[str, int]) -> None:
        self.store.set_tracker_state(f"sent:{tracker}:{self.run_id}", sent)


def step_stream(adapter: str) -> str:
    """The cursor name of ``adapter``'s steps: ``step`` for the shared adapter (as before adapters per owner)."""
    return "step" if adapter == SHARED_ADAPTER else f"step@{adapter}"


def adapter_scalars(adapter: str, scalars: dict[str, float]) -> dict[str, float]:
    """``scalars`` under ``adapter``'s prefix (none for the shared adapter)."""
    if adapter == SHARED_ADAPTER:
        return scalars
    prefix = adapter_dirname(adapter)
    return {f"{prefix}/{name}": value for name, value in scalars.items()}


class PushedRows:
    """Rows handed over by the caller (``openclaw train --env``), kept until every tracker has them."""

    def __init__(self) -> None:
        self._rows: list[Row] = []
        self._sent: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def push(self, row: Row) -> None:
        with self._lock:
            self._rows.append(row)

    def rows_after(self, sent: dict[str, int]) -> list[Row]:
        with self._lock:
            return [row for row in self._rows if row.key > sent.get(row.stream, -1)]

    def sent(self, tracker: str) -> dict[str, int]:
        with self._lock:
            return dict(self._sent.get(tracker, {}))

    def mark_sent(self, tracker: str, sent: dict[str, int]) -> None:
        with self._lock:
            self._sent[tracker] = dict(sent)


@dataclass
class _Slot:
    tracker: Tracker
    is_open: bool = False
    failing: bool = False  # its last open or send failed (logged once until it works again)
    last_error: str | None = None
    retry_at: float = 0.0
    sent_rows: int = 0


class TrackerHub:
    """Runs the trackers named in ``names`` on a daemon thread (see the module docstring)."""

    def __init__(
        self,
        names: Sequence[str],
        run: RunInfo,
        config: dict[str, Any],
        source: RowSource,
        *,
        interval_s: float = 5.0,
        make: Callable[[str], Tracker] | None = None,
    ) -> None:
        factory: Callable[[str], Tracker] = make or (lambda name: TRACKER_TYPES[name]())
        self.run = run
        self.config = config
        self.source = source
        self.interval_s = interval_s
        self._slots = [_Slot(factory(name)) for name in names]
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._main, name="openclaw-trackers", daemon=True)

    @property
    def names(self) -> list[str]:
        return [slot.tracker.name for slot in self._slots]

    def start(self) -> TrackerHub:
        self._thread.start()
        return self

    def wake(self) -> None:
        """Send what is new now instead of at the next interval."""
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Send what is left, close the trackers; False if that took longer than ``timeout_s`` (the thread is a
        daemon: a tracker stuck on the network cannot hold the process)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("trackers still busy after %.0fs at shutdown; unsent rows wait in the store", timeout_s)
            return False
        return True

    def status(self) -> dict[str, Any]:
        return {
            slot.tracker.name: {
                "open": slot.is_open,
                "failing": slot.failing,
                "sent_rows": slot.sent_rows,
                "last_error": slot.last_error if slot.failing else None,
            }
            for slot in self._slots
        }

    # -- the thread ------------------------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            while True:
                self._round()
                if self._stopping.is_set():
                    break
                self._wake.wait(self.interval_s)
                self._wake.clear()
        finally:
            for slot in self._slots:
                if slot.is_open:
                    try:
                        slot.tracker.close()
                    except Exception as exc:
                        log.warning("closing %s failed: %s", slot.tracker.name, _reason(exc))

    def _round(self) -> None:
        for slot in self._slots:
            if not slot.is_open and not self._open(slot):
                continue
            try:
                self._send(slot)
            except Exception as exc:
                self._failed(slot, f"could not send to {slot.tracker.name} ({_reason(exc)}); the store keeps the rows")

    def _open(self, slot: _Slot) -> bool:
        if time.monotonic() < slot.retry_at:
            return False
        try:
            slot.tracker.open(self.run, self.config)
        except Exception as exc:
            slot.retry_at = time.monotonic() + REOPEN_AFTER_S
            self._failed(
                slot,
                f"{slot.tracker.name} is off for now ({_reason(exc)}); serving and training go on, "
                f"it is retried every {REOPEN_AFTER_S:.0f}s",
            )
            return False
        slot.is_open = True
        self._recovered(slot, f"{slot.tracker.name}: reporting run {self.run.name!r} ({self.run.id})")
        return True

    def _send(self, slot: _Slot) -> None:
        name = slot.tracker.name
        sent = self.source.sent(name)
        rows = self.source.rows_after(sent)
        for row in rows:
            if row.scalars:
                slot.tracker.log(row.step, row.scalars, row.wall_time)
            sent = {**sent, row.stream: row.key}
            slot.sent_rows += 1
            self.source.mark_sent(name, sent)
        if rows and slot.failing:
            self._recovered(slot, f"{name} works again; {len(rows)} waiting rows sent")

    def _failed(self, slot: _Slot, message: str) -> None:
        slot.last_error = message
        if not slot.failing:
            log.warning(message)
        else:
            log.debug(message)
        slot.failing = True

    def _recovered(self, slot: _Slot, message: str) -> None:
        log.info(message)
        slot.failing = False


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def tracking_dir(settings: Settings) -> Path:
    """tracking.dir, else the store's directory (.openclaw/ by default)."""
    if settings.tracking.dir is not None:
        return Path(settings.tracking.dir).expanduser()
    return Path(settings.store.path).expanduser().parent


def settings_config(settings: Settings) -> dict[str, Any]:
    """The settings as the run's config: flat dotted keys, secrets masked (as `openclaw config show` shows them)."""
    from openclaw_cli.settings import effective_values

    return dict(effective_values(settings))


def store_run(store: Store, settings: Settings) -> RunInfo:
    """The store's run: made on the first launch with trackers, the same one after every restart; a new one when
    tracking.run_name names another."""
    wanted = settings.tracking.run_name
    fresh = {"id": uuid.uuid4().hex[:16], "name": wanted or time.strftime("openclaw-%Y%m%d-%H%M%S")}
    run = store.tracker_run(fresh)
    if wanted and run["name"] != wanted:
        run = fresh
        store.set_tracker_state("run", run)
    return _run_info(settings, str(run["id"]), str(run["name"]))


def start_store_hub(store: Store, settings: Settings) -> TrackerHub | None:
    """The hub `openclaw launch` runs: every step row and evaluation in the store, to train.report_to."""
    if not settings.train.report_to:
        return None
    run = store_run(store, settings)
    hub = _hub(settings, run, StoreRows(store, run.id))
    log.info("reporting to %s as run %r", ", ".join(hub.names), run.name)
    return hub.start()


def start_pushed_hub(settings: Settings, run_name: str) -> tuple[TrackerHub, PushedRows] | None:
    """The hub `openclaw train --env` runs: the caller pushes each step's row; the run is named after the env run
    (so ``--resume`` continues the same tracker run)."""
    if not settings.train.report_to:
        return None
    rows = PushedRows()
    run_id = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_name)[:64]
    return _hub(settings, _run_info(settings, run_id, run_name), rows).start(), rows


def _run_info(settings: Settings, run_id: str, name: str) -> RunInfo:
    return RunInfo(
        id=run_id,
        name=name,
        project=settings.tracking.project,
        dir=tracking_dir(settings),
        mlflow_uri=settings.tracking.mlflow_uri,
    )


def _hub(settings: Settings, run: RunInfo, source: RowSource) -> TrackerHub:
    """A hub (not started) for train.report_to, with the settings as the run's config."""
    return TrackerHub(
        settings.train.report_to, run, settings_config(settings), source, interval_s=settings.tracking.interval_s
    )


def env_row(step: int, metrics: dict[str, Any], wall_time: float | None = None) -> Row:
    """A ``train --env`` step (its StepStats JSON) as a row."""
    return Row("step", step, step, time.time() if wall_time is None else wall_time, step_scalars(None, metrics))
