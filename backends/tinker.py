"""Tinker backend (planned). Registered now so `openclaw backends` can report on it; training lands later."""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

from openclaw_cli.backend import Check, NotYetAvailable
from openclaw_cli.settings import env_secret

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings


class TinkerBackend:
    name = "tinker"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @classmethod
    def diagnose(cls, settings: Settings) -> list[Check]:
        installed = find_spec("tinker") is not None
        key = env_secret(settings.tinker.api_key, "TINKER_API_KEY")
        return [
            Check("sdk installed", installed, "" if installed else "pip install 'openclaw-cli[tinker]'"),
            Check("api key", key is not None, "" if key else "set TINKER_API_KEY or tinker.api_key"),
            Check("implemented", False, "the Tinker backend is not built yet; use --backend local"),
        ]

    async def start(self) -> None:
        raise NotYetAvailable("the Tinker backend is not built yet; use --backend local for now")
