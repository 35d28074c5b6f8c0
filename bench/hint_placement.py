"""Where the OPD teacher reads the user's hint: the base model's greedy answers with the hint in each place.

For every training question of ``bench/learning.py`` the embedded model (the frozen base, as the teacher and the
hindsight demonstrations use it) answers greedily with the user's "too long" correction as the hint:

- ``told``: the question with the user's instruction added, as ``bench/learning.py`` asks the told model (the target);
- ``first/in system``: a first reply, the hint in the system message (what ``teacher_messages`` does there);
- ``first/after question``: a first reply, the hint after the question (what it did before);
- ``later/in system`` and ``later/after last user``: a second reply (the model's own long answer and the user's
  correction already in the conversation), the hint in each place.

Prints mean words, keyword-hit rate and the share that ended by themselves, per placement. Run:
``python bench/hint_placement.py`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning import CORRECTION, INSTRUCTION, QUESTIONS, SYSTEM, word_count

from openclaw_cli.learn.algorithms.opd import HINT_HEADER, teacher_messages


def _with_hint_after_last_user(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    out = [dict(message) for message in messages]
    last_user = max(i for i, message in enumerate(out) if message["role"] == "user")
    out[last_user]["content"] = f"{out[last_user]['content']}\n\n{HINT_HEADER}\n{hint}"
    return out


def _with_hint_in_system(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    out = [dict(message) for message in messages]
    out[0]["content"] = f"{out[0]['content']}\n\n{HINT_HEADER}\n{hint}"
    return out


async def main() -> None:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.settings import Settings
    from openclaw_cli.types import SamplingParams

    backend = LocalBackend(Settings())
    await backend.start()
    tokenizer = backend.tokenizer()
    params = SamplingParams(max_tokens=128, temperature=0.0)

    async def answer(messages: list[dict[str, Any]]) -> tuple[str, bool]:
        result = await backend.sample(tokenizer.render(messages), params, version=0)
        return result.text.strip(), result.finish_reason == "stop"

    rows: dict[str, list[tuple[int, bool, bool]]] = {}
    for question, keys in QUESTIONS.items():
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        plain, _ = await answer(first)
        later = [*first, {"role": "assistant", "content": plain}, {"role": "user", "content": CORRECTION}]
        contexts = {
            "told": [first[0], {"role": "user", "content": f"{question} {INSTRUCTION}"}],
            "first/in system": teacher_messages(first, CORRECTION),
            "first/after question": _with_hint_after_last_user(first, CORRECTION),
            "later/in system": _with_hint_in_system(later, CORRECTION),
            "later/after last user": teacher_messages(later, CORRECTION),
        }
        for name, messages in contexts.items():
            text, stopped = await answer(messages)
            rows.setdefault(name, []).append((word_count(text), any(k in text.lower() for k in keys), stopped))
        print(f"  {question}", flush=True)
    await backend.close()
    print(f"\n{'placement':24}{'words':>7}{'hits':>7}{'ended':>7}   ({len(QUESTIONS)} questions, greedy)")
    for name, results in rows.items():
        n = len(results)
        words = sum(r[0] for r in results) / n
        hits = sum(r[1] for r in results) / n
        ended = sum(r[2] for r in results) / n
        print(f"{name:24}{words:7.1f}{hits:7.2f}{ended:7.2f}")


if __name__ == "__main__":
    asyncio.run(main())
