"""The two measurements a lesson's life depends on, and the rules that read them.

**One trial** (:func:`try_prompt`): on one of the owner's prompts, a model answers greedily as served today (with the
owner's active lessons, ``r0``) and with the lesson added (``r1``). The frozen base model reading the user's original
correction scores both: ``Δ(r) = log p(r | prompt + correction) - log p(r | prompt)`` (summed over the reply; the
pointwise mutual information of reply and correction, so a reply is not preferred for being short). The trial's
verdict:

- ``leak``: a content word of the lesson (four letters or more, or a number) turns up in ``r1`` though neither the
  prompt nor ``r0`` has it ("Canberra" in an answer about photosynthesis);
- ``unchanged``: ``r1 == r0``: the lesson does not act on this prompt (a brevity lesson on a reply that is short
  anyway). No evidence either way. ``covered`` when the lesson *would* change the plain reply on its own but adds
  nothing beside the lessons served already: an active lesson already asks for the same;
- ``helped``: ``Δ(r1) - Δ(r0) >=`` :data:`PREFERENCE_MARGIN` nats and ``r1`` stays a plausible answer to the plain
  prompt (mean log-probability at least the hindsight demonstrations' bar);
- ``hurt``: ``Δ(r1) - Δ(r0) <= -``:data:`PREFERENCE_MARGIN`, or ``r1`` is implausible;
- ``indifferent``: changed, but the teacher hardly tells the two apart: no evidence either way.

**In place of a rival** (``replacing``): a candidate about the same kind of thing as an active lesson is tried with
that lesson taken out, and its ``guard`` is ``Δ(r1) - Δ(r0)`` as the base model reading *that lesson's* correction
scores them: a replacement that its own reader prefers but the older lesson's reader finds worse by the margin is
``hurt``.

**The turn the correction answered** is the first prompt tried: the lesson must change the answer there. Its ``r0``
is the greedy reply as served today, not the reply the user corrected: that one was sampled (often at a temperature),
and a new greedy reply differs from it whether or not the lesson does anything, so a lesson that repeats an active
one would look like it helped.

**Verification** (candidate -> active, :func:`decide`) reads the verdicts of every prompt tried so far. A leak
rejects outright. Otherwise only prompts where the lesson acts count: *verified* when it helped on more of them than
it hurt (at least one), *rejected* when not; with none yet it is *inconclusive* and waits for a prompt where it can
act, except that a lesson covered by an active one on some prompt is a *duplicate* (merged into it). A tie is
broken by the turns the corrections answered: verified when one of them helped and none hurt (the user's own reply
is the prompt that matters most). A first version called every candidate that changed no reply a duplicate, with or
without an active lesson; a user whose earlier replies were short anyway had their first brevity correction rejected
that way and waited ten minutes on a timer.

**Retirement** (active -> retired, :func:`lesson_effect`). The same trial with the *current policy* answering, on the
owner's newest prompts that the trainer has not trained on yet, whose conversation holds no correction of form, and
on which the lesson *acts* (the base model's trial there is ``helped``): a prompt whose plain reply already meets the
lesson says nothing about what the weights learned. The median of ``Δ(with) - Δ(without)`` (0 where the two replies
are the same) is what the lesson still adds. The keeper (:mod:`openclaw_cli.learn.lessons`) retires on several such
checks in a row and brings a lesson back when it slips.

A first version measured the log-probability gap of the replies the lesson had shaped, under the policy with and
without it. In a 20-minute learning run it retired the lesson after 5 minutes (gap 0.99 nats) while held-out plain
replies were still 27-33 words against 10-11 served: the trainer had just trained on exactly those turns (the
demonstrations for their plain prompts), so the gap said "learned" for them and for nothing else. A second version
measured on any untrained prompt, three at a time, and retired on one passing check: prompts whose replies were short
anyway said "learned", and the lesson retired and came back 5 to 8 times in 20 minutes.
"""

from __future__ import annotations

import asyncio
import logging
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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

Verdict = Literal["leak", "unchanged", "covered", "helped", "hurt", "indifferent"]
Outcome = Literal["verified", "duplicate", "rejected", "inconclusive"]


@dataclass
class PromptTrial:
    turn_id: int
    changed: bool
    preferred: bool
    plausible: bool
    leaked: list[str]
    advantage: float  # Δ(r1) - Δ(r0), nats
    words: tuple[int, int]  # words of r0, r1
    corrected: bool = False  # the turn a correction answered
    covered: bool = False  # unchanged beside the served lessons, though alone it changes the plain reply
    # Tried in place of older lessons of the same kind: the worst Δ(r1) - Δ(r0) by their own corrections' readers.
    guard: float | None = None

    @property
    def verdict(self) -> Verdict:
        if self.leaked:
            return "leak"
        if not self.changed:
            return "covered" if self.covered else "unchanged"
        guard_hurt = self.guard is not None and self.guard <= -PREFERENCE_MARGIN
        if self.preferred and self.plausible and not guard_hurt:
            return "helped"
        if self.advantage <= -PREFERENCE_MARGIN or not self.plausible or guard_hurt:
            return "hurt"
        return "indifferent"

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn_id,
            "verdict": self.verdict,
            "corrected": self.corrected,
            "changed": self.changed,
            "preferred": self.preferred,
            "plausible": self.plausible,
            "leaked": self.leaked,
            "advantage": round(self.advantage, 3),
            "words": list(self.words),
            **({"guard": round(self.guard, 3)} if self.guard is not None else {}),
        }


@dataclass
class Verification:
    outcome: Outcome
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


async def try_prompt(
    backend: Backend,
    turn: TurnRecord,
    served: Sequence[str],
    lesson: str,
    correction: str,
    max_tokens: int,
    *,
    version: int | None = BASE_VERSION,
    corrected: bool = False,
    cover: bool = False,
    replacing: Sequence[str] = (),
    guards: Sequence[str] = (),
) -> PromptTrial | None:
    """One prompt (see the module docstring): ``version``'s greedy replies as ``served`` and with ``lesson`` added
    (in place of the ``replacing`` lessons among them), scored by the frozen base model reading ``correction`` (and,
    as ``guard``, reading each of ``guards``, the replaced lessons' corrections). ``corrected``: ``turn`` is the one
    a correction answered (recorded with the trial); ``cover``: when unchanged, also find out whether it acts alone
    (two more greedy replies). None when the prompt cannot be tried."""
    tokenizer = backend.tokenizer()
    messages = turn.messages
    kept = [text for text in served if text not in replacing]
    try:
        plain = tokenizer.render(messages, turn.tools)
        before = tokenizer.render(with_lessons(messages, list(served)), turn.tools)
        after = tokenizer.render(with_lessons(messages, [*kept, lesson]), turn.tools)
        readers = [tokenizer.render(with_instruction(messages, text), turn.tools) for text in (correction, *guards)]
    except Exception as exc:  # a conversation this template cannot render: not a usable prompt
        log.debug("turn %d: cannot render for a lesson trial: %s", turn.id, exc)
        return None
    (r0, text0), (r1, text1) = await asyncio.gather(
        _greedy(backend, before, max_tokens, version), _greedy(backend, after, max_tokens, version)
    )
    found = await asyncio.gather(
        *(_reply_logprob(backend, context, r, base=True) for context in (plain, *readers) for r in (r0, r1))
    )
    if any(score is None for score in found):
        return None
    sums = [sum(score or []) for score in found]
    plain0, plain1 = sums[:2]
    # Per reader: Δ(r1) - Δ(r0), with Δ(r) = log p(r | reader) - log p(r | plain).
    gains = [(read1 - plain1) - (read0 - plain0) for read0, read1 in zip(sums[2::2], sums[3::2], strict=True)]
    p1 = found[1] or []
    plausible = bool(p1) and sum(p1) / len(p1) >= MIN_MEAN_LOGPROB
    known = content_words(_last_user_text(messages)) | content_words(text0)
    leaked = sorted((content_words(lesson) & content_words(text1)) - known)
    covered = False
    if cover and r0 == r1 and served:
        # Unchanged beside (or in place of) the served lessons: does it act alone? Then an active lesson already
        # asks for it.
        (bare, _), (alone, _) = await asyncio.gather(
            _greedy(backend, plain, max_tokens, version),
            _greedy(backend, tokenizer.render(with_lessons(messages, [lesson]), turn.tools), max_tokens, version),
        )
        covered = alone != bare and r0 != bare
    return PromptTrial(
        turn_id=turn.id,
        changed=r0 != r1,
        preferred=gains[0] >= PREFERENCE_MARGIN,
        plausible=plausible,
        leaked=leaked,
        advantage=gains[0],
        words=(len(text0.split()), len(text1.split())),
        corrected=corrected,
        covered=covered,
        guard=min(gains[1:]) if guards else None,
    )


async def try_candidate(
    backend: Backend,
    candidate: str,
    correction: str,
    prompts: Sequence[TurnRecord],
    served: Sequence[str],
    *,
    max_tokens: int,
    corrected_turns: Iterable[int] = (),
    replacing: Sequence[str] = (),
    guards: Sequence[str] = (),
) -> list[PromptTrial]:
    """The base model's trials of ``candidate`` on ``prompts`` (``served``: the owner's active lessons' texts;
    ``corrected_turns``: the turns a correction answered; ``replacing``/``guards``: served lessons it is tried in
    place of, and their corrections)."""
    answered = set(corrected_turns)
    found = await asyncio.gather(
        *(
            try_prompt(
                backend,
                turn,
                served,
                candidate,
                correction,
                max_tokens,
                corrected=turn.id in answered,
                cover=True,
                replacing=replacing,
                guards=guards,
            )
            for turn in prompts
        )
    )
    return [t for t in found if t is not None]


def decide(trials: Sequence[PromptTrial]) -> Verification:
    """What every trial of a candidate so far says (see the module docstring)."""
    trials = list(trials)
    if not trials:
        return Verification("inconclusive", "no prompt of this owner could be tried yet")
    leaks = sorted({word for t in trials for word in t.leaked})
    if leaks:
        return Verification("rejected", f"its topic leaks into other answers ({', '.join(leaks[:5])})", trials)
    helped = sum(t.verdict == "helped" for t in trials)
    hurt = sum(t.verdict == "hurt" for t in trials)
    if helped + hurt == 0:
        if any(t.verdict == "covered" for t in trials):
            return Verification("duplicate", "a lesson served already asks for the same: it changes no reply", trials)
        return Verification(
            "inconclusive",
            f"it made no difference the correction's reader cares about on the {len(trials)} prompts tried: "
            "waiting for a prompt where it can act",
            trials,
        )
    if helped > hurt:
        return Verification("verified", f"helped on {helped} of {helped + hurt} prompts where it acts", trials)
    answered = {t.verdict for t in trials if t.corrected}
    if helped == hurt and "helped" in answered and "hurt" not in answered:
        return Verification(
            "verified",
            f"helped on {helped} of {helped + hurt} prompts where it acts, the reply you corrected among them",
            trials,
        )
    return Verification("rejected", f"helped on only {helped} of {helped + hurt} prompts where it acts", trials)


async def lesson_effect(
    backend: Backend,
    lesson: str,
    correction: str,
    prompts: Sequence[TurnRecord],
    others: Sequence[str],
    *,
    max_tokens: int,
) -> tuple[float, list[PromptTrial]] | None:
    """What the lesson still adds to the *current policy*: on ``prompts`` (ones where it acts on the base model),
    its greedy replies without the lesson (beside the owner's ``others``) and with it, and the median over prompts of
    ``Δ(with) - Δ(without)`` as the base model reading ``correction`` scores them (0 when the replies are the same).
    None when no prompt could be tried."""
    found = await asyncio.gather(
        *(try_prompt(backend, turn, others, lesson, correction, max_tokens, version=None) for turn in prompts)
    )
    trials = [t for t in found if t is not None]
    if not trials:
        return None
    return statistics.median(t.advantage if t.changed else 0.0 for t in trials), trials
