"""What a fake OpenAI-compatible judge endpoint answers: one chat completion."""

from __future__ import annotations

from typing import Any

import httpx


def completion_response(model: str, content: str, *, finish: str = "stop", logprobs: Any = None) -> httpx.Response:
    """A 200 chat.completion with one assistant choice (``logprobs``: the choice's logprobs object, if any)."""
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "finish_reason": finish, "message": message, "logprobs": logprobs}
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": model, "choices": [choice]}
    return httpx.Response(200, json=body)
