"""The judge's prompts and the parsing of its replies (pure functions, no I/O).

Two prompts, both shown one assistant turn and its next state (the user's next message or a tool's output):

- PRM: is the next state progress, a correction, or ambiguous? The reply ends in ``\\boxed{1}``, ``\\boxed{-1}`` or
  ``\\boxed{0}``; the LAST ``\\boxed{...}`` of a reply is its vote.
- Hint (OPD): does the next state hold hindsight the assistant should have used? ``\\boxed{1}`` plus a 1-3 sentence
  hint between :data:`HINT_START` and :data:`HINT_END`, or ``\\boxed{-1}``.

The prompt text is versioned: change any prompt and bump :data:`PROMPT_VERSION`, so verdicts made by different
prompts can be told apart in the store (each verdict also carries a hash of the exact text, see
:func:`prompt_hashes`, which catches an edit made without a bump).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from string import Template
from typing import Any

from openclaw_cli.tokenizer import flatten_content

PROMPT_VERSION = "prm-hint-v1"

HINT_START, HINT_END = "[HINT_START]", "[HINT_END]"
MIN_HINT_CHARS = 11  # hints of 10 characters or fewer say nothing a teacher could use
MAX_HINT_CHARS = 1200  # far beyond three sentences: the judge rambled instead of writing a hint

# Character budgets per section keep a prompt bounded whatever the conversation holds (head and tail are kept).
CONTEXT_CHARS, REPLY_CHARS, NEXT_STATE_CHARS = 2000, 6000, 4000

PRM_SYSTEM = """\
You grade one step of a conversation between an AI assistant and its user or environment. You see the assistant's \
reply and the NEXT STATE: what came back right after it, either the user's next message or the output of a tool the \
assistant called. Judge the reply only by what the next state reveals about it.

Classify the next state:
- progress: the reply worked. A tool ran and returned what was asked for, or the user accepts the answer, builds on \
it, thanks the assistant, or moves on to a new request.
- correction: the reply failed or missed. The user says it is wrong, asks again, rephrases the same request, says \
"no, I meant ...", or complains; or a tool returned an error, a failing test, or a sign the call was malformed.
- ambiguous: the next state says nothing clear about the reply's quality.

Think briefly, then end your answer with exactly one of:
\\boxed{1} for progress
\\boxed{-1} for correction
\\boxed{0} for ambiguous"""

HINT_SYSTEM = f"""\
You read one step of a conversation between an AI assistant and its user or environment: the assistant's reply and \
the NEXT STATE that followed it (the user's next message or a tool's output). Decide whether the next state holds \
hindsight: information showing what the assistant should have done differently, which it could have used, such as \
a correction, a stated preference, a missing requirement, a fact, or an error message that points at the mistake.

If it does, write a hint addressed to the assistant that would have led to a better reply: one to three concrete \
sentences, phrased as an instruction, without mentioning the next state or the rest of the conversation. Put the \
hint between {HINT_START} and {HINT_END}, then end your answer with \\boxed{{1}}.

If the next state holds no such hindsight (the reply was fine, or the next state is unrelated or unclear), write no \
hint and end your answer with \\boxed{{-1}}."""

_TURN_TEMPLATE = Template(
    """\
## Context: the last user message before the reply
$context

## The assistant's reply
$reply

## Next state (role: $role)
$next_state

$question"""
)
PRM_QUESTION = "Is the next state progress, a correction, or ambiguous? End with \\boxed{1}, \\boxed{-1} or \\boxed{0}."
HINT_QUESTION = (
    f"Does the next state hold hindsight the assistant should have used? If so, give the hint between {HINT_START} "
    f"and {HINT_END} and end with \\boxed{{1}}; otherwise end with \\boxed{{-1}}."
)


def prompt_hashes() -> dict[str, str]:
    """Short SHA-256 of each prompt's full text (system + template + question), stored with every verdict."""

    def digest(*parts: str) -> str:
        return hashlib.sha256("\x00".join((PROMPT_VERSION, *parts)).encode()).hexdigest()[:16]

    return {
        "prm": digest(PRM_SYSTEM, _TURN_TEMPLATE.template, PRM_QUESTION),
        "hint": digest(HINT_SYSTEM, _TURN_TEMPLATE.template, HINT_QUESTION),
    }


# --- rendering a turn ----------------------------------------------------------------------------------------------
def clip_middle(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail (the end of a tool output or a user
    message often carries the verdict)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted ...]\n{text[-tail:]}"


def assistant_text(message: dict[str, Any]) -> str:
    parts = [flatten_content(message.get("content"))]
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        parts.append(f"[tool call] {fn.get('name', '?')}({args})")
    text = "\n".join(p for p in parts if p)
    return text or "(empty reply)"


def state_text(messages: Sequence[dict[str, Any]]) -> str:
    lines = []
    for message in messages:
        role = str(message.get("role", "?"))
        label = f"[{role} {message['name']}]" if message.get("name") else f"[{role}]"
        body = assistant_text(message) if role == "assistant" else flatten_content(message.get("content"))
        lines.append(f"{label} {body}")
    return "\n".join(lines)


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return flatten_content(message.get("content")) or "(empty)"
    return "(none)"


def _turn_messages(
    system: str,
    question: str,
    history: Sequence[dict[str, Any]],
    reply: dict[str, Any],
    next_state: Sequence[dict[str, Any]],
    next_state_role: str | None,
) -> list[dict[str, str]]:
    role = next_state_role or (str(next_state[-1].get("role")) if next_state else "none")
    user = _TURN_TEMPLATE.substitute(
        context=clip_middle(_last_user_text(history), CONTEXT_CHARS),
        reply=clip_middle(assistant_text(reply), REPLY_CHARS),
        role=role,
        next_state=clip_middle(state_text(next_state), NEXT_STATE_CHARS),
        question=question,
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# Chat messages asking for one PRM vote on a reply given what followed it, and asking whether what followed holds a
# hint for OPD: (history, reply, next_state, next_state_role) -> messages.
prm_messages = partial(_turn_messages, PRM_SYSTEM, PRM_QUESTION)
hint_messages = partial(_turn_messages, HINT_SYSTEM, HINT_QUESTION)


# --- parsing replies -----------------------------------------------------------------------------------------------
_BOXED = "\\boxed{"
_LATEX_WRAPPER = re.compile(r"^\\[A-Za-z]+\{(.*)\}$", re.DOTALL)  # \text{1}, \mathbf{-1}, ...
_VOTE_VALUES = {"1": 1, "+1": 1, "-1": -1, "\u22121": -1, "0": 0, "+0": 0, "-0": 0}


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces inside it balanced), or None when there is
    none or the last one is never closed (a truncated reply: an earlier box may just quote the instructions)."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth = 1
    i = start + len(_BOXED)
    begin = i
    while i < len(text):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None


def _unwrap(content: str) -> str:
    content = content.strip().strip("$").strip()
    while True:
        if content.startswith("{") and content.endswith("}"):
            content = content[1:-1].strip()
            continue
        match = _LATEX_WRAPPER.match(content)
        if match is None:
            return content
        content = match.group(1).strip()


def parse_vote(text: str, allowed: frozenset[int] = frozenset({-1, 0, 1})) -> int | None:
    """The vote in a judge reply: its last ``\\boxed{}`` read as 1, -1 or 0 (spaces, ``+1``, ``\\text{}`` tolerated);
    None when there is no box, the box holds anything else, or the value is not in ``allowed``."""
    content = last_boxed(text)
    if content is None:
        return None
    value = _VOTE_VALUES.get(re.sub(r"\s+", "", _unwrap(content)))
    return value if value in allowed else None


def majority(votes: Sequence[int | None]) -> int:
    """The value most valid votes agree on; 0 when no vote is valid or the top count is shared."""
    counts = Counter(v for v in votes if v is not None).most_common()
    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return 0
    return counts[0][0]


@dataclass(frozen=True)
class HintReply:
    """One parsed hint answer: ``accepted`` is the box (1 / -1 / None if invalid); ``hint`` is set only when the
    judge said 1 and gave a usable hint."""

    accepted: int | None
    hint: str | None


def _clean_hint(text: str) -> str:
    text = " ".join(text.split())
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()
    return text


def parse_hint(text: str) -> HintReply:
    """Read a hint answer. The hint is the text between the last :data:`HINT_START` and the :data:`HINT_END` after
    it; it is kept only with ``\\boxed{1}`` and when longer than 10 characters and shorter than
    :data:`MAX_HINT_CHARS` after whitespace is collapsed."""
    accepted = parse_vote(text, frozenset({-1, 1}))
    if accepted != 1:
        return HintReply(accepted, None)
    start = text.rfind(HINT_START)
    end = text.find(HINT_END, start + len(HINT_START)) if start >= 0 else -1
    if start < 0 or end < 0:
        return HintReply(accepted, None)
    hint = _clean_hint(text[start + len(HINT_START) : end])
    if not MIN_HINT_CHARS <= len(hint) <= MAX_HINT_CHARS:
        return HintReply(accepted, None)
    return HintReply(accepted, hint)


def hint_key(hint: str) -> str:
    """What makes two hints the same: case, whitespace and trailing punctuation ignored."""
    return " ".join(hint.casefold().split()).rstrip(".!;:, ")


def dedupe_hints(hints: Sequence[str]) -> list[str]:
    """Distinct hints in first-seen order (first wording kept)."""
    seen: set[str] = set()
    out = []
    for hint in hints:
        key = hint_key(hint)
        if key not in seen:
            seen.add(key)
            out.append(hint)
    return out


def choose_hint(hints: Sequence[str]) -> str | None:
    """The hint the teacher gets: the one the most answers agree on (several independent samples giving the same
    hindsight is the best sign it is real); among equally frequent ones the longest (more concrete, the legacy
    rule), then the earliest. None when there is none."""
    if not hints:
        return None
    counts = Counter(hint_key(h) for h in hints)
    order = {hint: i for i, hint in enumerate(dedupe_hints(hints))}
    return max(order, key=lambda h: (counts[hint_key(h)], len(h), -order[h]))
