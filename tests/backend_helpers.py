"""What the backend tests share: a backend started for a fixture (closed after), a one-message prompt, and a wait
for a condition."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

B = TypeVar("B")


@contextlib.asynccontextmanager
async def running(backend: B) -> AsyncIterator[B]:
    """``backend`` started; closed when the block ends, however it ends."""
    await backend.start()  # type: ignore[attr-defined]
    try:
        yield backend
    finally:
        await backend.close()  # type: ignore[attr-defined]


def user_prompt(backend: Any, text: str = "What is the capital of France?") -> list[int]:
    """One user message rendered by the backend's chat template, as the proxy renders it."""
    return backend.tokenizer().render([{"role": "user", "content": text}])


async def wait_until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` on the event loop until it holds; fail the test after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
