"""Ready-made records for tests: a :class:`~openclaw_cli.store.NewTurn` to seed a store directly, and a
:class:`~openclaw_cli.capture.CapturedExchange` to record through the session capture (no proxy, no model)."""

from __future__ import annotations

from typing import Any

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.store import NewTurn


def new_turn(
    session_id: str = "s",
    *,
    index: int = 0,
    turn_type: str = "main",
    status: str = "ready",
    user_text: str = "hi",
    reply_text: str = "yo",
    created_at: float = 100.0,
    **overrides: Any,
) -> NewTurn:
    """One user message and one assistant reply with 2 prompt tokens and 1 completion token; side turns get
    turn_index -1 as the session logic gives them. Any NewTurn field can be overridden by keyword."""
    fields: dict[str, Any] = {
        "session_id": session_id,
        "parent_turn_id": None,
        "turn_index": index if turn_type == "main" else -1,
        "turn_type": turn_type,
        "type_reason": "test",
        "status": status,
        "api": "openai",
        "model": "m",
        "stream": False,
        "choice_index": 0,
        "messages": [{"role": "user", "content": user_text}],
        "tools": None,
        "request": {"model": "m"},
        "response": {},
        "assistant_message": {"role": "assistant", "content": reply_text},
        "headers": {},
        "metadata": {},
        "prompt_tokens": [1, 2],
        "completion_tokens": [3],
        "logprobs": [-1.0],
        "sampling_logprobs": [],
        "version": 0,
        "finish_reason": "stop",
        "started_at": 0.0,
        "first_token_at": 0.0,
        "finished_at": 0.0,
        "created_at": created_at,
    }
    fields.update(overrides)
    return NewTurn(**fields)


def captured_exchange(
    session: str,
    messages: list[dict[str, Any]],
    *,
    prompt_tokens: list[int],
    completion_tokens: list[int],
    logprobs: list[float] | None = None,
    version: int = 0,
    reply: str = "reply",
    **overrides: Any,
) -> CapturedExchange:
    """One served OpenAI chat reply in session ``session`` (``X-Session-Id``), as the proxy hands it to capture;
    log-probabilities default to -0.5 per completion token. Any other CapturedExchange field by keyword."""
    fields: dict[str, Any] = {
        "api": "openai",
        "headers": {"x-session-id": session},
        "request": {"model": "m", "messages": messages},
        "messages": messages,
        "tools": None,
        "model": "m",
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "logprobs": [-0.5] * len(completion_tokens) if logprobs is None else logprobs,
        "sampling_logprobs": [],
        "version": version,
        "finish_reason": "stop",
        "assistant_message": {"role": "assistant", "content": reply},
        "response": {},
        "started_at": 1.0,
        "first_token_at": 1.0,
        "finished_at": 1.0,
    }
    fields.update(overrides)
    return CapturedExchange(**fields)
