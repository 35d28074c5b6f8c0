"""What every handler shares: the backend, the capture recorder, settings, model names, request counters."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from openclaw_cli.backend import Backend, BackendError, adapter_backend
from openclaw_cli.capture import CaptureSink
from openclaw_cli.lesson_prompt import LessonBook
from openclaw_cli.proxy.capture_recorder import CaptureRecorder
from openclaw_cli.proxy.models import ModelCatalog
from openclaw_cli.proxy.response_store import StoredResponses
from openclaw_cli.settings import Settings


@dataclass
class BackendHealth:
    """How the backend's sampling has gone lately, for status: a backend that is down shows a growing
    ``consecutive_failures`` and its last error; the first success after that resets it."""

    consecutive_failures: int = 0
    failures: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    last_success_at: float | None = None

    def failed(self, exc: BaseException) -> None:
        status = getattr(exc, "status_code", None)
        if isinstance(exc, BackendError) and status is not None and 400 <= status < 500:
            return  # the request was at fault (e.g. too long), not the backend
        self.consecutive_failures += 1
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.last_error_at = time.time()

    def succeeded(self) -> None:
        self.consecutive_failures = 0
        self.last_success_at = time.time()

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.consecutive_failures == 0,
            "consecutive_failures": self.consecutive_failures,
            "failures": self.failures,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "last_success_at": self.last_success_at,
        }


@dataclass
class ProxyState:
    backend: Backend
    sink: CaptureSink | None
    settings: Settings
    catalog: ModelCatalog
    recorder: CaptureRecorder
    started_at: float = field(default_factory=time.time)
    in_flight: int = 0
    requests_total: int = 0
    health: BackendHealth = field(default_factory=BackendHealth)
    # Extra sections of /v1/openclaw/status by name, added by whoever embeds the app (the runtime adds its loops'
    # backlog); each is a blocking callable, run in a worker thread.
    status_sections: dict[str, Callable[[], Any]] = field(default_factory=dict)
    status_reads: dict[str, Any] = field(default_factory=dict)  # section -> its read in progress (control.py)
    responses: StoredResponses = field(default_factory=StoredResponses)  # for previous_response_id
    lessons: LessonBook | None = None  # active lessons by owner, placed in main-line prompts (lesson_prompt.py)
    lesson_desk: Any = None  # what the lesson and feedback routes call (lesson_routes.LessonDesk), None = 501

    def serving(self, adapter: str) -> Backend:
        """The backend as ``adapter`` sees it: what a request of an owner served by that adapter samples from."""
        return adapter_backend(self.backend, adapter)

    def lease(self) -> InFlightLease:
        self.in_flight += 1
        self.requests_total += 1
        return InFlightLease(self)


class InFlightLease:
    """Counts one generation as in flight until released; releasing twice is harmless (streams release from
    whichever of their cleanup paths runs first)."""

    def __init__(self, state: ProxyState) -> None:
        self._state = state
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._state.in_flight -= 1


def proxy_state(request: Request) -> ProxyState:
    return request.app.state.proxy
