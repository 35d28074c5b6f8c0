"""The two measurements a lesson's life depends on.

**Verification** (candidate -> active, :func:`verify_candidate`). On a few recent prompts of the same owner that the
correction did not come from, the frozen base model answers greedily twice: as served today (with the owner's
active lessons, ``r0``) and with the candidate added (``r1``). The candidate is *verified* when, on a majority of those
prompts,

1. it changes the reply (``r1 != r0``; on none of them: it *duplicates* what is served already, and merges into the
   active lesson whose words it shares most);
2. the teacher that reads the original correction prefers ``r1``: ``Δ(r) = log p(r | prompt + correction) -
   log p(r | prompt)`` (summed over the reply; the pointwise mutual information of reply and correction, so a reply is
   not preferred for being short) is larger for ``r1`` than for ``r0`` by at least :data:`PREFERENCE_MARGIN` nats;
3. ``r1`` stays a plausible answer to the plain prompt (mean log-probability under the base model at least
   :data:`~openclaw_cli.learn.hindsight_demos.MIN_MEAN_LOGPROB`, the hindsight demonstrations' bar);
4. nothing leaks from the correction: no content word of the lesson (four letters or more, or a number) appears in
   ``r1`` unless the prompt or ``r0`` has it ("Canberra" turning up in an answer about photosynthesis).

Any prompt that leaks rejects the candidate outright.

**Retirement** (active -> retired, :func:`lesson_effect`). The same test with the *current policy* answering: on the
owner's newest prompts that the trainer has not trained on yet and whose conversation holds no correction of form
(so neither the weights nor the context were handed the answer), its greedy replies without the lesson and with it,
scored by the base model reading the user's correction. The median of ``Δ(with) - Δ(without)`` (0 where the two
replies are the same) is what the lesson still adds: at or below ``lessons.retire_gap`` the weights answer as it asks
on their own and it retires; a retired lesson whose effect grows past ``lessons.return_gap`` comes back.

A first version measured the log-probability gap of the replies the lesson had shaped, under the policy with and
without it. In a 20-minute learning run it retired the lesson after 5 minutes (gap 0.99 nats) while held-out plain
replies were still 27-33 words against 10-11 served: the trainer had just trained on exactly those turns (the
demonstrations for their plain prompts), so the gap said "learned" for them and for nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openclaw_cli.backend import BASE_VERSION, Backend, completion_logprobs
from openclaw_cli.instructions import with_instruction
from openclaw_cli.learn.hindsight_demos import MIN_MEAN_LOGPROB
from openclaw_cli.lesson_prompt import with_lessons
from openclaw_cli.store import TurnRecord
from openclaw_cli.tokenizer import flatten_content
from openclaw_cli.types import Message, SamplingParams

log = logging.getLogger("openclaw.lessons")

PREFERENCE_MARGIN = 0.5
_CONTENT_WORD = re.compile(r"[a-z]{4,}|\d+")
_COMMON_WORDS = (
    "that this with your just give only need want please answer answers reply replies short shorter long "
    "longer much more less very really from then them they what when where which will would could should "
    "about like sentence sentences words word line lines key fact facts point points text always never don't "
    "dont stop tell explain explanation wordy verbose brief concise too far here there keep make sure does"
)
# Words of a lesson that say how to answer, not what about: never a topic leak.
_COMMON = frozenset(_COMMON_WORDS.split())


@dataclass
class PromptTrial:
    turn_id: int
    changed: bool
    preferred: bool
    plausible: bool
    leaked: list[str]
    advantage: float  # Δ(r1) - Δ(r0), nats
    words: tuple[int, int]  # words of r0, r1

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn_id,
            "changed": self.changed,
            "preferred": self.preferred,
            "plausible": self.plausible,
            "leaked": self.leaked,
            "advantage": round(self.advantage, 3),
            "words": list(self.words),
        }


@dataclass
class Verification:
    outcome: str  # verified | duplicate | rejected | inconclusive
    why: str
    trials: list[PromptTrial] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "trials": [t.to_json() for t in self.trials]}


def content_words(text: str) -> set[str]:
    return {w for w in _CONTENT_WORD.findall(text.lower()) if w not in _COMMON}


def _last_user_text(messages: Sequence[Message]) -> str:
    users = [m for m in messages if m.get("role") == "user"]
    return flatten_content(users[-1].get("content")) if users else ""


async def _greedy(backend: Backend, prompt: list[int], max_tokens: int, version: int | None) -> tuple[list[int], str]:
    result = await backend.sample(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), version=version)
    return list(result.tokens), result.text.strip()


async def _reply_logprob(backend: Backend, prompt: list[int], reply: list[int], *, base: bool) -> list[float] | None:
    if not reply:
        return []
    return await completion_logprobs(backend, prompt, reply, base=base)


async def _trial(
    backend: Backend,
    turn: TurnRecord,
    served: Sequence[str],
    candidate: str,
    correction: str,
    max_tokens: int,
    version: int | None = BASE_VERSION,
) -> PromptTrial | None:
    """One prompt: ``version``'s greedy replies without and with ``candidate`` (beside ``served``), scored by the
    frozen base model reading ``correction``."""
    tokenizer = backend.tokenizer()
    messages = turn.messages
    try:
        plain = tokenizer.render(messages, turn.tools)
        before = tokenizer.render(with_lessons(messages, list(served)), turn.tools)
        after = tokenizer.render(with_lessons(messages, [*served, candidate]), turn.tools)
        teacher = tokenizer.render(with_instruction(messages, correction), turn.tools)
    except Exception as exc:  # a conversation this template cannot render: not a usable prompt
        log.debug("turn %d: cannot render for verification: %s", turn.id, exc)
        return None
    (r0, text0), (r1, text1) = await asyncio.gather(
        _greedy(backend, before, max_tokens, version), _greedy(backend, after, max_tokens, version)
    )
    scores = await asyncio.gather(
        _reply_logprob(backend, teacher, r0, base=True),
        _reply_logprob(backend, plain, r0, base=True),
        _reply_logprob(backend, teacher, r1, base=True),
        _reply_logprob(backend, plain, r1, base=True),
    )
    if any(s is None for s in scores):
        return None
    t0, p0, t1, p1 = (s or [] for s in scores)
    advantage = (sum(t1) - sum(p1)) - (sum(t0) - sum(p0))
    plausible = bool(p1) and sum(p1) / len(p1) >= MIN_MEAN_LOGPROB
    known = content_words(_last_user_text(messages)) | content_words(text0)
    leaked = sorted((content_words(candidate) & content_words(text1)) - known)
    return PromptTrial(
        turn_id=turn.id,
        changed=r0 != r1,
        preferred=advantage >= PREFERENCE_MARGIN,
        plausible=plausible,
        leaked=leaked,
        advantage=advantage,
        words=(len(text0.split()), len(text1.split())),
    )


async def verify_candidate(
    backend: Backend,
    candidate: str,
    correction: str,
    prompts: Sequence[TurnRecord],
    served: Sequence[str],
    *,
    max_tokens: int,
) -> Verification:
    """Try ``candidate`` on ``prompts`` (see the module docstring); ``served``: the owner's active lessons' texts."""
    found = await asyncio.gather(
        *(_trial(backend, turn, served, candidate, correction, max_tokens) for turn in prompts)
    )
    trials = [t for t in found if t is not None]
    if not trials:
        return Verification("inconclusive", "no prompt of this owner could be tried")
    leaks = sorted({word for t in trials for word in t.leaked})
    if leaks:
        return Verification("rejected", f"its topic leaks into other answers ({', '.join(leaks[:5])})", trials)
    if not any(t.changed for t in trials):
        return Verification("duplicate", "it changes no reply beyond what is served already", trials)
    good = [t for t in trials if t.changed and t.preferred and t.plausible]
    if 2 * len(good) > len(trials):
        return Verification("verified", f"helped on {len(good)} of {len(trials)} other prompts", trials)
    return Verification("rejected", f"helped on only {len(good)} of {len(trials)} other prompts", trials)


async def lesson_effect(
    backend: Backend,
    lesson: str,
    correction: str,
    prompts: Sequence[TurnRecord],
    others: Sequence[str],
    *,
    max_tokens: int,
) -> tuple[float, list[PromptTrial]] | None:
    """What the lesson still adds to the *current policy*: on ``prompts``, its greedy replies without the lesson
    (beside the owner's ``others``) and with it, and the median over prompts of ``Δ(with) - Δ(without)`` as the base
    model reading ``correction`` scores them (0 when the replies are the same). None when no prompt could be tried."""
    found = await asyncio.gather(
        *(_trial(backend, turn, others, lesson, correction, max_tokens, version=None) for turn in prompts)
    )
    trials = [t for t in found if t is not None]
    if not trials:
        return None
    return statistics.median(t.advantage if t.changed else 0.0 for t in trials), trials
