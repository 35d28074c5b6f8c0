"""`openclaw launch`: serve, collect, judge and train in one process, each loop an asyncio task of one event loop.

- serve: the proxy app under uvicorn's ``Server.serve()`` (capture happens inside it through ``SessionCapture``);
- expire: closes idle sessions so their last turn becomes judgeable;
- judge: :class:`~openclaw_cli.learn.judge.JudgeLoop`;
- train: :class:`~openclaw_cli.learn.trainer_loop.TrainerLoop` (resumed from the newest checkpoint first);
- trackers (``train.report_to``): a daemon thread, :class:`~openclaw_cli.tracking.hub.TrackerHub`, sends the store's
  step rows to TensorBoard / W&B / MLflow / trackio; it never holds up the loops.

They share nothing but the store and the backend, and the backend runs model work in worker threads, so a training
step never blocks a reply and a stalled judge never blocks training of what was already judged.

Shutdown (Ctrl-C, SIGTERM, or ``stop`` set by an embedding caller): the server stops accepting and finishes the
requests in flight, the trainer finishes the step in progress and writes a checkpoint, the judge is given a moment
to finish its batch (unfinished turns are simply claimed again next time), then the backend and store close. A
second Ctrl-C abandons the wait (the trainer's step is cancelled; nothing half-written is kept, checkpoints are
written atomically).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import uvicorn

from openclaw_cli import eventloop
from openclaw_cli.adapters import SHARED_ADAPTER, separate_adapters
from openclaw_cli.backend import Backend, BackendError, create_backend, supports_adapters
from openclaw_cli.capture.retention import purge_expired, retention_loop
from openclaw_cli.dashboard import Snapshot, log_line, render
from openclaw_cli.learn.trainer_pool import TrainerPool
from openclaw_cli.proxy.app import create_app
from openclaw_cli.proxy.server import check_bind
from openclaw_cli.settings import Settings
from openclaw_cli.tracking.hub import start_store_hub

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from openclaw_cli.capture.sessions import SessionCapture
    from openclaw_cli.learn.judge import JudgeClient, JudgeLoop
    from openclaw_cli.learn.lessons import LessonKeeper
    from openclaw_cli.learn.promotion import PromotionGate
    from openclaw_cli.store import Store
    from openclaw_cli.tracking.hub import TrackerHub

log = logging.getLogger("openclaw.launch")

JUDGE_GRACE_S = 10.0  # how long shutdown waits for the judge's current batch before cancelling it
CAPTURE_DRAIN_S = 30.0  # how long shutdown waits for replies whose capture the store has not written yet
REFRESH_S = 1.0  # dashboard refresh
LOG_EVERY_S = 10.0  # --no-ui status line
TRACKERS_STOP_S = 15.0  # how long shutdown waits for the trackers to take the last rows and close


class _Server(uvicorn.Server):
    """uvicorn's server without its signal capture: the runtime owns SIGINT/SIGTERM, so one Ctrl-C stops all four
    loops in order instead of only the HTTP server (uvicorn would also re-raise the signal after serving)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass(eq=False)  # a service object: equal only to itself, and hashable
class Runtime:
    """The running process: its parts, for the dashboard and for tests that embed it."""

    settings: Settings
    backend: Backend
    store: Store
    sink: SessionCapture
    judge: JudgeLoop
    trainer: TrainerPool
    server: _Server
    app: Starlette = field(init=False)  # the proxy app create_app built
    started_at: float = field(default_factory=time.time)
    errors: list[str] = field(default_factory=list)
    gate: PromotionGate | None = None
    lessons: LessonKeeper | None = None
    trackers: TrackerHub | None = None

    def __post_init__(self) -> None:
        self.app = cast("Starlette", self.server.config.app)

    def loop_status(self) -> dict[str, Any]:
        """The loops' backlog and counters for ``/v1/openclaw/status`` (reads the store: call it from a worker
        thread). Ages are seconds; None when nothing waits."""
        from openclaw_cli.learn.judge import JUDGE_CONSUMER

        now = time.time()

        def age(since: float | None) -> float | None:
            return None if since is None else round(max(0.0, now - since), 3)

        to_judge, oldest_to_judge = self.store.backlog(JUDGE_CONSUMER)
        to_train, oldest_to_train = self.trainer.backlog()
        judge, trainer = self.judge.stats, self.trainer.stats
        return {
            "backlog": {
                "to_judge": to_judge,  # ready main-line turns the judge has not scored yet
                "oldest_to_judge_age_s": age(oldest_to_judge),
                "judged_not_trained": to_train,  # scored, not yet in a training step (includes a partial batch)
                "oldest_judged_not_trained_age_s": age(oldest_to_train),
                # turns waiting for their next state (the next request of the session, or its idle expiry)
                "oldest_pending_age_s": age(self.store.oldest_turn_at("pending")),
                "batch_size": self.settings.train.batch_size,
            },
            "judge": {
                "judged": judge.judged,
                "failed": judge.failed,
                "gave_up": judge.gave_up,  # judged-failed: max_turn_attempts counted failures, never trained
                "last_error": judge.last_error,
            },
            # Per consumer, from the store (survives restarts): turns given up on, and turns waiting for a retry.
            "handoff": self.store.handoff_counts(),
            "trainer": {
                "steps": trainer.steps,
                "trained_samples": trainer.trained_samples,
                "skipped_batches": trainer.skipped_batches,
                "stale_turns": trainer.stale_turns,  # came too late to train on (users outpace the trainer)
                "failures": trainer.failures,
                "last_error": trainer.last_error,
            },
            # Each adapter's serving version and steps (lora.scope = owner: one per owner id or group name).
            "adapters": self.trainer.adapters(),
            "promotion": self.gate.status() if self.gate is not None else {"enabled": False},
            "lessons": self.lessons.status() if self.lessons is not None else {"enabled": False},
            "trackers": self.trackers.status() if self.trackers is not None else {},
        }

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def snapshot(self) -> Snapshot:
        """The numbers the dashboard shows (reads the store: call it from a worker thread)."""
        try:
            version = self.backend.current_version().version
            backend_ok = True
        except Exception as exc:
            version, backend_ok = -1, False
            self._note(f"backend: {type(exc).__name__}: {exc}")
        stats = self.sink.stats()
        proxy = self.app.state.proxy
        trainer = self.trainer.stats
        errors = list(self.errors)
        if trainer.last_error:
            errors.append(f"trainer: {trainer.last_error}")
        if self.judge.stats.last_error:
            errors.append(f"judge: {self.judge.stats.last_error}")
        lessons = self.lessons.status() if self.lessons is not None else {"counts": {}, "active": []}
        if self.lessons is not None and self.lessons.last_error:
            errors.append(f"lessons: {self.lessons.last_error}")
        if self.trackers is not None:
            errors += [f"trackers: {s['last_error']}" for s in self.trackers.status().values() if s["last_error"]]
        return Snapshot(
            url=self.url,
            backend=self.backend.name,
            backend_ok=backend_ok,
            policy_version=version,
            requests_total=proxy.requests_total,
            in_flight=proxy.in_flight,
            sessions_open=stats["sessions"]["open"],
            sessions_total=stats["sessions"]["total"],
            turns_pending=stats["pending"],
            turns_ready=stats["ready"],
            judged=self.judge.stats.judged,
            trained=trainer.trained_samples,
            steps=trainer.steps,
            batch_size=self.settings.train.batch_size,
            method=self.settings.method,
            rewards=list(trainer.rewards),
            last_loss=trainer.last_metrics.get("loss"),
            errors=errors,
            uptime_s=time.time() - self.started_at,
            lessons_active=[lesson["text"] for lesson in lessons["active"]],
            lessons_by_status=lessons["counts"],
            adapters=self.trainer.adapters(),
            servers=self._served_by(),
        )

    def _served_by(self) -> list[dict[str, Any]]:
        """The vLLM servers the backend serves from (local.vllm_servers), each with its health; [] otherwise."""
        serving = getattr(self.backend, "serving_status", None)
        return list(serving().get("vllm_servers", [])) if callable(serving) else []

    def _note(self, error: str) -> None:
        if not self.errors or self.errors[-1] != error:
            self.errors = [*self.errors[-9:], error]


async def launch(
    settings: Settings,
    *,
    ui: bool,
    stop: asyncio.Event | None = None,
    judge_client: JudgeClient | None = None,
    on_ready: Callable[[Runtime], Awaitable[None] | None] | None = None,
    backend: Backend | None = None,
) -> None:
    """Run serve + idle expiry + judge + train until Ctrl-C / SIGTERM or until ``stop`` is set.

    ``judge_client`` replaces the judge named by the settings (tests and embedders); ``on_ready`` is called once
    everything is up and the port accepts connections; ``backend`` (not started) replaces the one named by the
    settings (tests and benches; it is started and closed here like the named one).
    """
    from openclaw_cli.capture.sessions import SessionCapture
    from openclaw_cli.learn.judge import JudgeLoop, make_judge_client
    from openclaw_cli.store import Store

    check_bind(settings)
    stop = stop or asyncio.Event()
    # Bind before loading the model: a busy port fails in a second, not after a minute of loading.
    sock = _bind(settings.host, settings.port)
    given_backend, backend = backend, None
    store: Store | None = None
    try:
        # The store first: a damaged one (quick_check at open) fails in a second, not after the model has loaded.
        store = Store(settings.store.path)
        backend = given_backend if given_backend is not None else create_backend(settings)
        require_adapter_support(backend, settings)  # refuse before loading a model for nothing
        if settings.train.promotion_gate:
            from openclaw_cli.learn.promotion import require_gate_support

            require_gate_support(backend)
        await backend.start()
        sink = SessionCapture(store, settings)
        client = judge_client if judge_client is not None else make_judge_client(settings, backend)
        from openclaw_cli.learn.promotion import make_publisher

        # Every adapter's loop publishes through a gate of its own (the collapse guard, the promotion gate).
        trainer = TrainerPool(
            store,
            backend,
            settings,
            gate_for=lambda view, adapter: make_publisher(store, view, client, settings, adapter=adapter),
        )
        gate = cast("PromotionGate | None", trainer.gates[SHARED_ADAPTER])
        judge = JudgeLoop(store, client, settings, trainer_waiting=trainer.waiting)
        await trainer.resume()
        from openclaw_cli.learn.lessons import lesson_keeper

        keeper = lesson_keeper(store, backend, settings)
        app = create_app(backend, sink, settings, lessons=keeper.book, lesson_desk=keeper)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=30
        )
        runtime = Runtime(settings, backend, store, sink, judge, trainer, _Server(config))
        runtime.gate = gate
        runtime.lessons = keeper
        app.state.proxy.status_sections["loops"] = runtime.loop_status
        await _run(runtime, sock, stop, ui=ui, on_ready=on_ready)
    finally:
        sock.close()
        try:
            if backend is not None:
                await backend.close()
        finally:
            if store is not None:
                store.close()


def require_adapter_support(backend: Backend, settings: Settings) -> None:
    """Refuse to start where owners would get adapters of their own (``lora.scope = "owner"`` with several owners)
    that the backend or another setting cannot give them: never a silently shared adapter."""
    if not separate_adapters(settings):
        return
    if not supports_adapters(backend):
        # A backend may say why it cannot here (e.g. a hot-reload Fireworks deployment holds one LoRA).
        why = getattr(backend, "no_adapters_because", None) or f"the {backend.name} backend keeps one adapter"
        raise BackendError(
            f"lora.scope = 'owner' with several owners: {why}; set lora.scope = 'shared' for one adapter everyone "
            "shares"
        )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


async def _run(
    runtime: Runtime,
    sock: socket.socket,
    stop: asyncio.Event,
    *,
    ui: bool,
    on_ready: Callable[[Runtime], Awaitable[None] | None] | None,
) -> None:
    force = asyncio.Event()
    loop = asyncio.get_running_loop()
    removers = _install_signal_handlers(loop, stop, force)
    server = runtime.server
    # The trainer and judge stop on their own `halt` event, set only after the server has drained, so replies in
    # flight still get captured and the final checkpoint includes the last step.
    halt = asyncio.Event()
    # The start-up purge runs before any loop does: once idle expiry and the judge have claimed an expired turn,
    # the purge must leave it alone (it never deletes a claimed turn), and it would be judged and trained first.
    if runtime.settings.store.retention_days is not None:
        try:
            await asyncio.to_thread(purge_expired, runtime.store, runtime.settings)
        except Exception:
            log.exception("retention purge at start failed; the hourly purge will retry")
    tasks: dict[str, asyncio.Task[None]] = {
        "serve": asyncio.create_task(server.serve(sockets=[sock]), name="openclaw-serve"),
        "expire": asyncio.create_task(_expire_idle(runtime, halt), name="openclaw-expire"),
        "judge": asyncio.create_task(runtime.judge.run(halt), name="openclaw-judge"),
        "train": asyncio.create_task(runtime.trainer.run(halt), name="openclaw-train"),
        **(runtime.lessons.start(halt) if runtime.lessons is not None else {}),
        # store.retention_days: hourly after the start-up purge above (returns at once when retention is off)
        "retention": asyncio.create_task(
            retention_loop(runtime.store, runtime.settings, halt, run_first=False), name="openclaw-retention"
        ),
    }
    try:
        # train.report_to: a daemon thread sends the store's step rows to the trackers; it never blocks these loops.
        runtime.trackers = start_store_hub(runtime.store, runtime.settings)
        while not server.started:
            if tasks["serve"].done():
                await tasks["serve"]  # surfaces the startup error
                raise RuntimeError("the HTTP server stopped before it started")
            await asyncio.sleep(0.02)
        log.info("serving on %s; judging and training in the background", runtime.url)
        if on_ready is not None:
            result = on_ready(runtime)
            if asyncio.iscoroutine(result):
                await result
        reporter = asyncio.create_task(_report(runtime, halt, ui=ui), name="openclaw-report")
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait([waiter, tasks["serve"]], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        log.info("stopping: no new requests; finishing the current step")
        server.should_exit = True
        await _finish(tasks["serve"], force, None)
        # Replies already sent whose capture a slow store has not written yet land now (a second Ctrl-C skips it).
        recorder = runtime.app.state.proxy.recorder
        await _finish(asyncio.create_task(recorder.drain(CAPTURE_DRAIN_S), name="openclaw-capture-drain"), force, None)
        if recorder.backlog:
            log.error("%d replies were served but their capture did not finish before shutdown", recorder.backlog)
        halt.set()
        await _finish(tasks["train"], force, None)
        if runtime.trackers is not None:  # the last step is in the store now; send it and close the runs
            await asyncio.to_thread(runtime.trackers.stop, TRACKERS_STOP_S)
        await _finish(tasks["judge"], force, JUDGE_GRACE_S)
        await _finish(tasks["expire"], force, 0)
        await _finish(tasks["retention"], force, 5)
        await _finish(reporter, force, 5)
    finally:
        if runtime.trackers is not None:
            runtime.trackers.stop(0)  # after an error: nothing waits for a tracker
        for task in tasks.values():
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for remove in removers:
            remove()
        log.info("stopped")


async def _finish(task: asyncio.Task[None], force: asyncio.Event, grace_s: float | None) -> None:
    """Wait for ``task`` (at most ``grace_s``, or until a second Ctrl-C), then cancel it; log how it ended."""
    forced = asyncio.create_task(force.wait())
    try:
        done, _ = await asyncio.wait([task, forced], timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        forced.cancel()
    if task not in done:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        try:
            await task
        except Exception:
            log.exception("%s ended with an error", task.get_name())


def _install_signal_handlers(
    loop: asyncio.AbstractEventLoop, stop: asyncio.Event, force: asyncio.Event
) -> list[Callable[[], object]]:
    """First SIGINT/SIGTERM: orderly stop. Second: stop waiting. Only possible on the main thread (signals)."""
    if threading.current_thread() is not threading.main_thread():
        return []

    def on_signal() -> None:
        if stop.is_set():
            log.warning("second interrupt: not waiting for the current step")
            force.set()
        else:
            stop.set()

    removers: list[Callable[[], object]] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
        except (NotImplementedError, RuntimeError, ValueError):  # e.g. Windows event loops
            continue
        removers.append(partial(loop.remove_signal_handler, sig))
    return removers


async def _expire_idle(runtime: Runtime, stop: asyncio.Event) -> None:
    """Close sessions that went quiet, so their last turn becomes judgeable; failures are logged and retried."""
    every = runtime.settings.proxy.expire_every_s
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
            return
        try:
            expired = await runtime.sink.expire_idle()
            if expired:
                log.info("expired %d idle session(s)", expired)
        except Exception as exc:
            log.exception("expiring idle sessions failed; will retry")
            runtime._note(f"expiry: {type(exc).__name__}: {exc}")


async def _report(runtime: Runtime, stop: asyncio.Event, *, ui: bool) -> None:
    """The rich Live dashboard, or a plain status line every LOG_EVERY_S seconds with --no-ui."""
    if not ui:
        last: str | None = None
        while not stop.is_set():
            line = log_line(await asyncio.to_thread(runtime.snapshot))
            if line != last:
                log.info("%s", line)
                last = line
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=LOG_EVERY_S)
        return
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    with Live(render(await asyncio.to_thread(runtime.snapshot)), console=console, refresh_per_second=2) as live:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=REFRESH_S)
            live.update(render(await asyncio.to_thread(runtime.snapshot)))


def run_launch(settings: Settings, *, ui: bool) -> None:
    """Blocking entry point of ``openclaw launch`` (on uvloop when installed, see :mod:`openclaw_cli.eventloop`)."""
    eventloop.run(launch(settings, ui=ui))
