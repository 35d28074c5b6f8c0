"""The collapse guard (``train.collapse_guard``, on by default): a trained version that has degenerated never serves.

Small policies trained online break in recognisable ways: they loop ("the the the"), stop answering (an empty or
one-word reply to everything, the cheap way to satisfy "be brief"), or drift far from the base model. Before a new
version serves, the guard replays a fixed probe set on it (sampled at temperature 1 with a fixed seed,
:data:`PROBE_MAX_TOKENS` tokens each) and checks

- every reply has at least :data:`MIN_WORDS` words;
- each reply's distinct-word ratio is at least ``train.guard_min_distinct`` (replies of 8 words or more);

(each of these two only on probes where the base model itself passes it: the guard catches a version that got
worse than the base, not a base that was never good, such as a tiny test model);
- the mean per-token log-ratio ``log pi_new(y) - log pi_base(y)`` over the new version's own probe replies (a
  one-sample estimate of KL(new || base)) is at most ``train.guard_max_kl`` nats.

A version that fails is not served, and training is rewound to the served version's weights (``activate(served,
train_from=True)``): continuing from collapsed weights would only collapse further. The guard runs inside
:class:`openclaw_cli.learn.promotion.PromotionGate` (stage -> guard -> optional win-rate evaluation -> activate), so it
needs a backend with version control (local, Tinker, Fireworks); elsewhere it is skipped with a warning.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from openclaw_cli.types import SamplingParams

if TYPE_CHECKING:
    from openclaw_cli.backend import Backend
    from openclaw_cli.settings import Settings

log = logging.getLogger("openclaw.guard")

PROBE_PROMPTS = (
    "What is the tallest mountain in the world?",
    "Give me one tip for sleeping better.",
    "What do bees make?",
)
PROBE_SYSTEM = "You are a helpful assistant."
PROBE_MAX_TOKENS = 32  # the measured learning runs used 32; longer probes would see late looping but cost each step
PROBE_SEED = 1234
MIN_WORDS = 2
_DISTINCT_MIN_WORDS = 8  # shorter replies are too short for a distinct-word ratio to mean anything


@dataclass
class GuardResult:
    ok: bool
    reason: str
    kl: float | None = None
    distinct: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def distinct_ratio(text: str) -> float:
    """Distinct words over words (1.0 for an empty text): low for looping replies."""
    words = text.lower().split()
    return len(set(words)) / len(words) if words else 1.0


class CollapseGuard:
    def __init__(self, backend: Backend, settings: Settings) -> None:
        self.backend = backend
        self.max_kl = settings.train.guard_max_kl
        self.min_distinct = settings.train.guard_min_distinct
        self.held = 0
        self.last: GuardResult | None = None
        self._base: GuardResult | None = None  # the base model's own probe replies, probed once

    async def check(self, version: int) -> GuardResult:
        """Probe ``version`` (servable when pinned) and judge whether it has collapsed; never raises."""
        try:
            result = await self._check(version)
        except Exception as exc:  # a failed probe must hold the version back, not end training
            log.exception("collapse guard could not probe version %d", version)
            result = GuardResult(ok=False, reason=f"probe failed: {type(exc).__name__}: {exc}")
        self.last = result
        if not result.ok:
            self.held += 1
        return result

    async def _check(self, version: int) -> GuardResult:
        if self._base is None:
            self._base = await self._probe(0)
        result = await self._probe(version)
        base = self._base
        pairs = list(zip(result.replies, result.distinct, base.replies, base.distinct, strict=True))
        short = [r for r, _, b, _ in pairs if len(r.split()) < MIN_WORDS <= len(b.split())]
        looping = [d for r, d, _, bd in pairs if len(r.split()) >= _DISTINCT_MIN_WORDS and d < self.min_distinct <= bd]
        if short:
            result.ok, result.reason = False, f"{len(short)} probe repl(ies) under {MIN_WORDS} words: {short[0]!r}"
        elif looping:
            result.ok, result.reason = False, f"repetitive replies (distinct-word ratio {min(looping):.2f})"
        elif result.kl is not None and result.kl > self.max_kl:
            result.ok = False
            result.reason = f"too far from the base model (KL estimate {result.kl:.2f} > {self.max_kl})"
        return result

    async def _probe(self, version: int) -> GuardResult:
        # The probes go out together: a batching sampler decodes them in one pass per token.
        probed = await asyncio.gather(*(self._probe_one(question, version) for question in PROBE_PROMPTS))
        replies = [text for text, _ in probed]
        log_ratios = [ratio for _, ratios in probed for ratio in ratios]
        kl = sum(log_ratios) / len(log_ratios) if log_ratios else None
        return GuardResult(ok=True, reason="ok", kl=kl, distinct=[distinct_ratio(r) for r in replies], replies=replies)

    async def _probe_one(self, question: str, version: int) -> tuple[str, list[float]]:
        """One probe reply of ``version`` and its per-token ``log pi_new - log pi_base``."""
        tokenizer = self.backend.tokenizer()
        # Sampled at temperature 1 with a fixed seed, not greedy: a policy whose distribution flattened can still
        # answer well greedily while every sampled reply is noise (seen: SmolLM2 at lr 5e-4), and the KL estimate
        # E_new[log new - log base] needs samples from the new policy.
        params = SamplingParams(max_tokens=PROBE_MAX_TOKENS, temperature=1.0, seed=PROBE_SEED)
        messages = [{"role": "system", "content": PROBE_SYSTEM}, {"role": "user", "content": question}]
        prompt = tokenizer.render(messages, add_generation_prompt=True)
        sample = await self.backend.sample(prompt, params, version=version)
        text = tokenizer.decode(sample.tokens).strip()
        ratios: list[float] = []
        if sample.tokens and len(sample.logprobs) == len(sample.tokens):
            base = await self.backend.compute_logprobs(prompt + list(sample.tokens), base=True, start=len(prompt))
            for new_lp, base_lp in zip(sample.logprobs, base[len(prompt) :], strict=True):
                if base_lp is not None:
                    ratios.append(float(new_lp) - float(base_lp))
        return text, ratios

    def status(self) -> dict[str, Any]:
        return {"enabled": True, "held": self.held, "last": self.last.to_json() if self.last else None}
