"""The event loop the long-running commands (``serve``, ``launch``) run on: uvloop when it is installed.

uvloop is a dependency on Linux and macOS (it does not build on Windows); uvicorn pairs it with the httptools parser
it finds installed. Together they took about a quarter off the proxy's CPU per request in bench/proxy_overhead.py.
Nothing here depends on uvloop: without it the standard asyncio loop runs the same code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None (asyncio's default loop) when uvloop is not installed."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest loop available."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
