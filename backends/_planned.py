"""Shared shell for cloud backends that are registered but not built yet.

Registering them now lets `openclaw backends` / `doctor` report SDK and credential status; `start()` fails with a
plain "not built yet" message instead of pretending.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING, ClassVar

from openclaw_cli.backend import Check, NotYetAvailable
from openclaw_cli.settings import env_secret

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings


class PlannedCloudBackend:
    name: ClassVar[str]
    title: ClassVar[str]
    sdk_module: ClassVar[str]
    key_env: ClassVar[str]

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @classmethod
    def diagnose(cls, settings: Settings) -> list[Check]:
        installed = find_spec(cls.sdk_module) is not None
        section = getattr(settings, cls.name)
        key = env_secret(section.api_key, cls.key_env)
        return [
            Check("sdk installed", installed, "" if installed else f"pip install 'openclaw-cli[{cls.name}]'"),
            Check("api key", key is not None, "" if key else f"set {cls.key_env} or {cls.name}.api_key"),
            Check("implemented", False, f"the {cls.title} backend is not built yet; use --backend local"),
        ]

    async def start(self) -> None:
        raise NotYetAvailable(f"the {self.title} backend is not built yet; use --backend local for now")
