"""A captured exchange as the proxy records one served with lessons (shared by the lesson tests)."""

from __future__ import annotations

from typing import Any

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.lesson_prompt import with_lessons


def served_exchange(tokenizer: Any, messages: list[dict[str, Any]], reply: str, **metadata: Any) -> CapturedExchange:
    served = with_lessons(messages, [item["text"] for item in metadata.get("lessons", [])])
    prompt = tokenizer.render(served)
    completion = tokenizer.encode(reply)
    return CapturedExchange(
        api="openai",
        headers={},
        request={"model": "openclaw-policy", "messages": messages},
        messages=messages,
        tools=None,
        model="openclaw-policy",
        prompt_tokens=prompt,
        completion_tokens=completion,
        logprobs=[-0.3] * len(completion),
        sampling_logprobs=[-0.3] * len(completion),
        version=0,
        finish_reason="stop",
        assistant_message={"role": "assistant", "content": reply},
        response={"id": "x"},
        started_at=1.0,
        first_token_at=1.0,
        finished_at=1.0,
        metadata={"owner": "local", **metadata},
    )
