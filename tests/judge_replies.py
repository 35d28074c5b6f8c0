"""What a fake OpenAI-compatible judge endpoint answers (one chat completion), and a store seeded with turns for a
judge to read."""

from __future__ import annotations

from typing import Any

import httpx

from openclaw_cli.store import Store
from openclaw_cli.testing.store_turns import new_turn


def completion_response(model: str, content: str, *, finish: str = "stop", logprobs: Any = None) -> httpx.Response:
    """A 200 chat.completion with one assistant choice (``logprobs``: the choice's logprobs object, if any)."""
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "finish_reason": finish, "message": message, "logprobs": logprobs}
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": model, "choices": [choice]}
    return httpx.Response(200, json=body)


def seed_session(store: Store, next_states: list[str | None]) -> list[int]:
    """One session, one main turn per entry: a str becomes that user next state, None ends the session there."""
    ids = []
    with store.transaction() as tx:
        tx.create_session("s", scope="", id_source="inferred", now=100.0)
        for i, state in enumerate(next_states):
            turn = new_turn(index=i, status="pending", user_text=f"question {i}", reply_text=f"answer {i}")
            turn_id = tx.insert_turn(turn)
            tx.touch_session("s", 100.0, main_turn_id=turn_id)
            ids.append(turn_id)
            if state is not None:
                tx.set_next_state(turn_id, [{"role": "user", "content": state}], "user", 101.0)
            else:
                tx.close_session("s", "ended", 102.0)
    return ids
