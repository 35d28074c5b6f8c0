"""Loop probe: find where the policy's greedy reply starts repeating itself, and push that repetition down.

A small model asked at temperature 0 often ends its answer not with the end-of-turn token but by starting it over:
"Photosynthesis is how plants make food. Photosynthesis is how plants make food. ..." until the token budget runs
out. On ``bench/learning.py`` (SmolLM2, brevity users) 12 of 16 held-out replies had shrunk to a sentence after 20
minutes, and the 2-4 that looped to the limit decided the mean length (each about 2.5 words of it). Training never
sees such a reply: the users' replies are sampled at temperature 1, where the loop rarely starts, and a hindsight
demonstration that repeats itself is dropped. So each step the trainer asks the current policy for greedy replies to
a few of the batch's own prompts (:func:`probe_loops`); where one has run into a loop (it hit the token budget and its
tail repeats one span at least twice, :func:`loop_start`), the first repetition of that span is trained with a
negative advantage on every token: token-level unlikelihood on exactly the continuation that should have been the end
of the reply (Welleck et al. 2019 penalise repeated tokens the same way). Nothing is trained for a reply that ends or
does not repeat, so a policy that does not loop pays only the probe's sampling.

The repetition must be exact (token for token) and periodic up to the budget: a reply that repeats a phrase and
then moves on, or a long list whose lines differ, is not a loop. Where the loop begins is ambiguous by up to a
period ("Intro. X is Y. X is Y. ..." repeats from the first "." as well as from the second "X"), and pushing down the
full stop that ends the first sentence would teach the opposite of ending there, so the trained repetition starts
right after the first sentence end inside that window (:func:`align_to_sentence_end`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Sequence

from openclaw_cli.backend import Backend
from openclaw_cli.learn.algorithms import TrainSample
from openclaw_cli.types import SamplingParams

log = logging.getLogger("openclaw.trainer")

MIN_PERIOD = 3  # tokens: shorter runs ("...", "!!!") are left alone
MIN_REPEATS = 2  # repetitions after the first occurrence before a tail counts as a loop
_SENTENCE_END = re.compile(r"[.!?:\n]\s*$")
LOOP_ADVANTAGE = -1.0  # the same size as OPD's strongest objection (its lower clip)


def loop_start(
    tokens: Sequence[int], *, min_period: int = MIN_PERIOD, min_repeats: int = MIN_REPEATS
) -> tuple[int, int] | None:
    """``(start, period)`` of the earliest loop the reply ends in, or None.

    The reply's tail from ``start - period`` on is one span of ``period`` tokens written over and over (the last
    repetition may be cut off by the budget), with at least ``min_repeats`` full repetitions after the first
    occurrence; ``start`` is the first token of the first repetition: where the reply should have ended.
    """
    n = len(tokens)
    best: tuple[int, int] | None = None
    for period in range(min_period, n // (min_repeats + 1) + 1):
        # Walk back from the end while each token equals the one a period before it.
        i = n - 1
        while i >= period and tokens[i] == tokens[i - period]:
            i -= 1
        start = i + 1  # tokens[start:] all repeat the span a period before them
        if start < period:
            start = period
        if n - start >= min_repeats * period and (best is None or start < best[0]):
            best = (start, period)
    return best


def align_to_sentence_end(
    tokens: Sequence[int], start: int, period: int, decode: Callable[[Sequence[int]], str]
) -> int:
    """The first position in ``[start, start + period)`` right after a token that ends a sentence or line (what
    ``decode`` shows ending in ``.``, ``!``, ``?``, ``:`` or a newline); ``start`` when none does."""
    for offset in range(period):
        if _SENTENCE_END.search(decode([tokens[start + offset - 1]])):
            return start + offset
    return start


async def probe_loops(
    backend: Backend, samples: Sequence[TrainSample], *, probes: int, max_tokens: int, version: int
) -> list[TrainSample]:
    """Greedy replies of the current policy (``version``) to the prompts of up to ``probes`` of ``samples``; for each
    that ends in a loop, a sample training its first repetition with :data:`LOOP_ADVANTAGE` on every token."""
    prompts: list[TrainSample] = []
    seen: set[tuple[int, ...]] = set()
    for sample in samples:
        key = tuple(sample.prompt_tokens)
        if sample.demo_weight is None and not sample.replayed and key not in seen:
            seen.add(key)
            prompts.append(sample)
        if len(prompts) == probes:
            break

    async def probe(sample: TrainSample) -> TrainSample | None:
        try:
            reply = await backend.sample(
                list(sample.prompt_tokens), SamplingParams(max_tokens=max_tokens, temperature=0.0), version=version
            )
        except Exception as exc:
            log.warning("turn %d: loop probe failed: %s", sample.turn_id, exc)
            return None
        if reply.finish_reason != "length" or len(reply.logprobs) != len(reply.tokens):
            return None
        found = loop_start(reply.tokens)
        if found is None:
            return None
        start, period = found
        start = align_to_sentence_end(reply.tokens, start, period, backend.tokenizer().decode)
        log.debug(
            "turn %d: greedy reply loops from token %d (period %d): %r", sample.turn_id, start, period, reply.text[:120]
        )
        return TrainSample(
            turn_id=sample.turn_id,
            session_id=sample.session_id,
            prompt_tokens=list(sample.prompt_tokens) + list(reply.tokens[:start]),
            completion_tokens=list(reply.tokens[start : start + period]),
            sampler_logprobs=list(reply.logprobs[start : start + period]),
            version=reply.version,
            token_advantages=[LOOP_ADVANTAGE] * period,
        )

    found = await asyncio.gather(*(probe(sample) for sample in prompts))
    return [sample for sample in found if sample is not None]
