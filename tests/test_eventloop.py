"""``openclaw serve`` / ``launch`` run on uvloop when it is installed (a dependency off Windows), else on asyncio's."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from openclaw_cli import eventloop


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


@pytest.mark.skipif(sys.platform == "win32", reason="uvloop does not build on Windows")
def test_runs_on_uvloop_when_installed() -> None:
    assert importlib.util.find_spec("uvloop") is not None, "uvloop is a dependency: pip install -e . installs it"
    assert eventloop.run(_loop_module()).startswith("uvloop")


def test_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    assert eventloop.loop_factory() is None
    assert eventloop.run(_loop_module()).startswith("asyncio")
