"""What every handler shares: the backend, the capture recorder, settings, model names, request counters."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from openclaw_cli.backend import Backend
from openclaw_cli.capture import CaptureSink
from openclaw_cli.proxy.capture_handoff import CaptureRecorder
from openclaw_cli.proxy.models import ModelCatalog
from openclaw_cli.settings import Settings


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
