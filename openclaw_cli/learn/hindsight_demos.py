"""Hindsight demonstrations: the reply the base model writes once it has read the user's correction.

OPD scores the student's own reply token by token against a teacher that read the hint, and (with the upper clip at
0) only ever pushes tokens down: it says what not to write, never what to write, and a small model drifts to
whatever is left unpunished (late in 20-minute runs SmolLM2 started quoting the user's correction back). A
demonstration says what to write: for a turn that carries a hint (``train.demo_for``), the frozen base model
answers the same conversation *with* the hint (greedy: the told model's own answer), and the policy is trained to give
that answer *without* it, with a constant positive advantage ``train.demo_weight`` under the same PPO loss. Its
"sampler" log-probabilities are the current policy's, so the ratio is 1 when the step's one gradient is taken and the
clip does not bind: the learning rate sets how far a step moves, and (Adam being blind to the gradient's scale) the
weight only sets the demonstrations' share of the step against the OPD and KL terms (2.0 measured the same as 1.0,
docs/algorithms.md). This is context distillation from the user's own words, and what the learning target asks for: the
bot, asked plainly, answers as the base model does when told.

Dropping the cut-off ones is a choice by length (half of SmolLM2's greedy answers to the learning bench's questions
run past 128 tokens), once suspected of shortening the replies of a user who never spoke of length
(bench/owners.py's owner B). Measured, it was not: with demonstrations off that user's replies moved nearly as much
(20% shorter against 25%); the cause was OPD on hints that were no corrections (``judge.next_state_hints``,
docs/judge.md). Keeping cut-off ones as prefixes with no end was tried (2 seeds) and slowed every step: the learning
user got 6-8 steps in 20 minutes instead of 13-15 and missed the goal; so they stay dropped.

A demonstration is dropped (logged at debug level) when it is empty, was cut off by the token budget, repeats
itself (fewer than half its words distinct: 'The answer is "The answer is "...'), echoes the hint (four words of
it in a row, or the whole demonstration is a run of the hint's words: "Try again."), talks about "this question"
instead of only answering it (:func:`talks_about_the_question`), or is implausible as a reply
to the plain conversation: mean log-probability under the frozen base model below :data:`MIN_MEAN_LOGPROB`. Measured
on SmolLM2 on demonstrations it wrote in a learning run: answers to the question score -0.3 to -2.0 a token; the
teacher's junk ("You are an empowered and helpful AI assistant.", the *next* question a "thanks; next question:
..." hint asked, "Try again.") -3.5 to -5. The base, not the policy, so that a policy that drifted towards junk
cannot vouch for it.

**Replay** (``train.demo_replay``): a demonstration is trained again in that many later steps (each time rescored
by the current policy, so its ratio is 1 again when the gradient is taken). A correction is the scarcest thing the
loop gets, and one Adam step is a fixed-size move whose direction is the batch's mean gradient: the same targets in
consecutive batches keep that direction, where a batch of four fresh turns moves it around. A replayed
demonstration belongs to a turn trained in an earlier step, so it never counts as a trained turn again (the step
ledger's "at most once" is about turns), and the buffer lives in memory: a restart starts it empty.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re

from openclaw_cli.backend import BASE_VERSION, Backend, completion_logprobs
from openclaw_cli.learn.algorithms import TrainSample
from openclaw_cli.store import TurnRecord
from openclaw_cli.types import SamplingParams

log = logging.getLogger("openclaw.trainer")

HINT_ECHO_WORDS = 4
# Per-token mean log-probability of the demonstration under the base model given the plain conversation (see the
# module docstring for what it separates).
MIN_MEAN_LOGPROB = -2.5
_WORD = re.compile(r"[a-z0-9']+")
_QUESTION_TALK = re.compile(r"\b(this|that|your|the)\s+question\b", re.IGNORECASE)


def _word_runs(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def echoes_hint(reply: str, hint: str, n: int = HINT_ECHO_WORDS) -> bool:
    """True when the reply repeats ``n`` consecutive words of the hint, or is itself a shorter run of the hint's words
    (case and punctuation ignored)."""
    words = _WORD.findall(reply.lower())
    if 0 < len(words) < n:
        return tuple(words) in _word_runs(hint, len(words))
    return bool(_word_runs(reply, n) & _word_runs(hint, n))


def talks_about_the_question(reply: str) -> bool:
    """True when the reply speaks of "this question" (or your / the / that question) instead of only answering it.

    SmolLM2's teacher opens some demonstrations that way and a few are nothing else ("The answer to this question is a
    classic example of a logical fallacy.", 'The answer to this question is: "How do airplanes fly."': 2 of 16 on the
    learning bench's training questions); trained in, the opener outlived the answers it introduced and held-out
    replies shrank to "The answer to this question lies in ..." with the fact gone. An answer never needs the words,
    so a demonstration that has them is dropped, hollow or not."""
    return _QUESTION_TALK.search(reply) is not None


def repeats_itself(reply: str) -> bool:
    """Fewer than half the words distinct (the collapse guard's own threshold)."""
    words = _WORD.findall(reply.lower())
    return len(words) >= 4 and len(set(words)) < 0.5 * len(words)


async def hindsight_demo(
    backend: Backend,
    turn: TurnRecord,
    hint: str,
    hinted_prompt: list[int],
    *,
    weight: float,
    max_tokens: int,
    version: int,
    plain_prompt: list[int] | None = None,
    consolidates: tuple[int, ...] = (),
) -> TrainSample | None:
    """The base model's reply to ``hinted_prompt`` (``turn``'s conversation with ``hint``, as the OPD teacher reads
    it) as a positive sample without the hint, or None when it cannot be written or is not usable (see the module
    docstring). ``plain_prompt``: the conversation without the hint, when it is not the turn's prompt as served (a
    turn served with lessons, whose demonstration distils them: ``consolidates`` names them)."""
    try:
        reply = await backend.sample(
            hinted_prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), version=BASE_VERSION
        )
    except Exception as exc:
        log.warning("turn %d: cannot write a hindsight demonstration: %s", turn.id, exc)
        return None
    text = reply.text.strip()
    if not reply.tokens or not text or reply.finish_reason != "stop":
        log.debug("turn %d: demonstration dropped (empty or cut off): %r", turn.id, text[:80])
        return None
    if echoes_hint(text, hint) or repeats_itself(text) or talks_about_the_question(text):
        log.debug(
            "turn %d: demonstration dropped (echoes the hint or itself, or talks about the question): %r",
            turn.id,
            text[:80],
        )
        return None
    prompt = list(turn.prompt_tokens) if plain_prompt is None else list(plain_prompt)
    completion = list(reply.tokens)
    try:
        base_tail, tail = await asyncio.gather(
            completion_logprobs(backend, prompt, completion, base=True),
            completion_logprobs(backend, prompt, completion),
        )
    except Exception as exc:
        log.warning("turn %d: cannot score the hindsight demonstration: %s", turn.id, exc)
        return None
    if base_tail is None or tail is None:
        return None
    mean = sum(base_tail) / len(base_tail)
    if mean < MIN_MEAN_LOGPROB:
        log.debug("turn %d: demonstration dropped (implausible, mean logprob %.2f): %r", turn.id, mean, text[:80])
        return None
    log.debug("turn %d: demonstration (mean logprob %.2f): %r", turn.id, mean, text[:80])
    return TrainSample(
        turn_id=turn.id,
        session_id=turn.session_id,
        prompt_tokens=prompt,
        completion_tokens=completion,
        sampler_logprobs=tail,
        version=version,
        demo_weight=weight,
        consolidates=consolidates,
    )


class DemoReplay:
    """The demonstrations still to be trained again, each with the number of later steps it has left."""

    def __init__(self, uses: int) -> None:
        self.uses = uses
        self._held: list[tuple[TrainSample, int]] = []

    def __len__(self) -> int:
        return len(self._held)

    async def due(self, backend: Backend, version: int) -> list[TrainSample]:
        """The held demonstrations rescored by the current policy (``version``), marked as replays; one that cannot
        be scored is left out of this step (logged)."""

        async def rescored(demo: TrainSample) -> TrainSample | None:
            try:
                logprobs = await completion_logprobs(backend, demo.prompt_tokens, demo.completion_tokens)
            except Exception as exc:
                log.warning("turn %d: cannot rescore a replayed demonstration: %s", demo.turn_id, exc)
                return None
            if logprobs is None:
                return None
            return dataclasses.replace(demo, sampler_logprobs=logprobs, version=version, replayed=True)

        found = await asyncio.gather(*(rescored(demo) for demo, _ in self._held))
        return [demo for demo in found if demo is not None]

    def after_step(self, fresh: list[TrainSample]) -> None:
        """A step was taken: every held demonstration used one replay, and the step's new ones join."""
        kept = [(demo, left - 1) for demo, left in self._held if left > 1]
        if self.uses > 0:
            kept += [(demo, self.uses) for demo in fresh if demo.demo_weight is not None and not demo.replayed]
        self._held = kept

    def clear(self) -> None:
        """Forget every held demonstration (the step they were in was not served)."""
        self._held = []
