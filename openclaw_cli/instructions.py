"""Where an instruction goes in a conversation so that the model follows it: one placement, measured, shared by the
OPD teacher's hint (:func:`openclaw_cli.learn.algorithms.opd.teacher_messages`) and the lessons the proxy serves
(:mod:`openclaw_cli.lesson_prompt`), so a lesson is served exactly as the teacher reads a correction.

For the first reply to a conversation (no assistant message in it yet) the instruction goes into the system message
(appended to it, or a new one in front): read that way, SmolLM2's greedy answers to the 16 training questions of
``bench/learning.py`` with the user's "too long" correction averaged 16 words and hit the answer's keyword in 13 of
16; appended to the question, 13 words but only 9 of 16 ('The answer is "No, that is too long."';
``bench/hint_placement.py``). Once the conversation holds a reply of the model's own, a system-message instruction
makes it copy that reply (41 words), so there it goes after the last user message.
"""

from __future__ import annotations

import copy
from typing import Any

from openclaw_cli.tokenizer import flatten_content

INSTRUCTION_HEADER = "[user's hint / instruction]"


def with_instruction(
    messages: list[dict[str, Any]], text: str, header: str = INSTRUCTION_HEADER
) -> list[dict[str, Any]]:
    """A copy of ``messages`` with ``header`` + ``text`` where the model follows it best (see the module docstring).

    Raises ValueError for an empty instruction or a conversation without a user message."""
    if not text.strip():
        raise ValueError("an instruction must not be empty")
    out = copy.deepcopy(messages)
    users = [message for message in out if message.get("role") == "user"]
    if not users:
        raise ValueError("the conversation has no user message to attach the instruction to")
    quoted = f"{header}\n{text.strip()}"
    if not any(message.get("role") == "assistant" for message in out):
        if out[0].get("role") == "system":
            out[0]["content"] = f"{flatten_content(out[0].get('content'))}\n\n{quoted}"
        else:
            out.insert(0, {"role": "system", "content": quoted})
        return out
    users[-1]["content"] = f"{flatten_content(users[-1].get('content'))}\n\n{quoted}"
    return out
