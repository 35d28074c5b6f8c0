"""Fireworks backend (planned). Registered now so `openclaw backends` can report on it; training lands later."""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

from openclaw_cli.backend import Check, NotYetAvailable
from openclaw_cli.settings import env_secret

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings


class FireworksBackend:
    name = "fireworks"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @classmethod
    def diagnose(cls, settings: Settings) -> list[Check]:
        installed = find_spec("fireworks") is not None
        key = env_secret(settings.fireworks.api_key, "FIREWORKS_API_KEY")
        return [
            Check("sdk installed", installed, "" if installed else "pip install 'openclaw-cli[fireworks]'"),
            Check("api key", key is not None, "" if key else "set FIREWORKS_API_KEY or fireworks.api_key"),
            Check("implemented", False, "the Fireworks backend is not built yet; use --backend local"),
        ]

    async def start(self) -> None:
        raise NotYetAvailable("the Fireworks backend is not built yet; use --backend local for now")
