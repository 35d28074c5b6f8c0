"""What the backend tests share: a backend started for a fixture (closed after) and a one-message prompt."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
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
