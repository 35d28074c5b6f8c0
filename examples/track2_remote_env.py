"""Track 2 example: an environment behind HTTP (SWE / GUI style), trained with GRPO like any other.

    openclaw train --env examples/track2_remote_env.py --steps 10 --max-tokens 256                 # bundled server
    openclaw train --env examples/track2_remote_env.py --env-arg url=http://127.0.0.1:8765          # your server

The rollout side is :class:`openclaw_cli.env_training.remote.RemoteEnv`: reset an episode on the server, let the policy
reply (tool calls included) and send each reply to ``/step`` until the server says done or ``max_turns`` replies
went by (``--env-arg max_turns=N``, default 8), then ask ``/reward``. The protocol is four JSON POST routes,
documented in that module, so the server can be anything: a container farm running repositories and test suites, a
browser or emulator driver, a game. Members of a GRPO group reset with the same seed and so get the same task.

Without ``--env-arg url=...`` this example starts the tiny server of ``track2_remote_env_server.py`` (a "change one
setting in settings.ini" task with ``read_file`` / ``write_file`` tools) on 127.0.0.1 at a free port, and stops it
when training ends. The tiny test model never solves it; the test checks that episodes run end to end over HTTP.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from openclaw_cli.env_training import RolloutContext, Trajectory
from openclaw_cli.env_training.remote import RemoteEnv

SERVER_FILE = Path(__file__).with_name("track2_remote_env_server.py")


def load_server_module() -> ModuleType:
    """The sibling server file as a module (examples/ is not a package)."""
    name = "openclaw_example_remote_env_server"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, SERVER_FILE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class ExampleRemoteEnv(RemoteEnv):
    """A :class:`RemoteEnv` that brings up the bundled server when no ``url`` is given."""

    def __init__(self) -> None:
        super().__init__()
        self._server: Any = None
        self._start_lock = asyncio.Lock()

    async def rollout(self, ctx: RolloutContext) -> Trajectory:
        if not ctx.env_args.get("url") and self.url is None:
            async with self._start_lock:
                if self._server is None:
                    self._server = load_server_module().EnvServer()
                    self.url = self._server.start()
        return await super().rollout(ctx)

    async def aclose(self) -> None:
        await super().aclose()
        if self._server is not None:
            self._server.stop()
            self._server = None
            self.url = None


env = ExampleRemoteEnv()
