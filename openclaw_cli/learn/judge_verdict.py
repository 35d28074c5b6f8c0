"""Verdicts read from the judge model's own probabilities instead of its generated text (pure functions, no I/O).

Two readouts, each a few forward passes per turn and always a verdict (no ``\\boxed{}`` to fail to parse):

- **channel** (the default for the policy judging itself): how much more likely the judge model finds the next state
  after a prefix that says the reply worked than after one that says it did not, each holding the assistant's reply,
  averaged over two wordings (:data:`CHANNEL_FRAMES`: "the user was satisfied / dissatisfied and replied:", "It
  worked. / It did not work. The user replied:"). On the 84 labelled steps of ``tests/data/judge_next_states.jsonl``
  (``bench/judge_accuracy.py``) SmolLM2-135M scored this way separates satisfied from correcting next states with
  AUC 0.91 (the logprob readout: 0.57), where asking it "yes or no" directly is at chance (AUC 0.47-0.51, it
  answers "no" to everything) and three sampled chains of thought give almost no parsable vote. The wordings were
  chosen on the first 44 steps (six candidates, two kept at the cost of the one before) and checked on 40 written
  afterwards: AUC 0.80 -> 0.95 on the first set, 0.82 -> 0.85 on the new one. The previous readout's calibration
  against a content-free next state ("OK."; "Calibrate Before Use", Zhao et al. 2021) made it worse (AUC 0.84
  uncalibrated) and cost two of its four passes, so it is gone.
- **logprob**: the judge's next-token distribution over three verdict words after a short question (one forward
  pass, GenRM-style); for judges strong enough to answer directly (an OpenAI-compatible endpoint returning
  ``top_logprobs``, or a larger policy).

Either way the result is a log-odds ``x`` of progress over correction; the reward is ``P(+1) - P(-1) = tanh(x / 2)``
and 0 when ``|x|`` is below the confidence margin (``judge.margin``), so an unsure judge masks the turn out instead of
training on a coin flip.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from openclaw_cli.learn.judge_prompts import clip_middle

VERDICT_PROMPT_VERSION = "verdict-v2"

# The next state as the judge reads it, and the reply inside the channel prefixes: short, so a verdict stays cheap.
CHANNEL_REPLY_CHARS = 400
CHANNEL_NEXT_STATE_CHARS = 600
# (positive, negative) prefix wordings; the channel log-odds is the mean over them (see the module docstring).
CHANNEL_FRAMES: tuple[tuple[str, str], ...] = (
    ("The {who} was satisfied and replied:", "The {who} was dissatisfied and replied:"),
    ("It worked. The {who} replied:", "It did not work. The {who} replied:"),
)
_CHANNEL_PREFIX = "The assistant said: {reply}\n{frame}"

# logprob mode: three words whose first tokens differ in the usual tokenizers.
VERDICT_WORDS: dict[str, int] = {"good": 1, "bad": -1, "unclear": 0}
VERDICT_SYSTEM = (
    "You grade one reply of an AI assistant by what came right after it: the user's next message or the output of a "
    "tool it called. Answer with one word: good (it worked, or the user accepts it and moves on), bad (the user "
    "corrects or complains, or the tool reports an error), or unclear."
)
VERDICT_QUESTION = "Given what came next, was the assistant's reply good, bad, or unclear? Answer with one word."

HINT_CHARS = 300  # a user's correction longer than this is clipped before it becomes a teacher hint
_SPECIAL_TOKEN = re.compile(r"<\|[^|<>]{0,40}\|>|</?s>|\[/?INST\]")


def _who(next_state_role: str | None) -> str:
    return "user" if next_state_role in (None, "user") else "program"


def channel_prefix(reply_text: str, next_state_role: str | None, verdict: int, frame: int = 0) -> str:
    """The text the judge continues with the next state, for ``verdict`` +1 (it worked) or -1 (it did not), in the
    wording ``CHANNEL_FRAMES[frame]``."""
    reply = " ".join(clip_middle(reply_text, CHANNEL_REPLY_CHARS).split()) or "(nothing)"
    positive, negative = CHANNEL_FRAMES[frame]
    wording = (positive if verdict > 0 else negative).format(who=_who(next_state_role))
    return _CHANNEL_PREFIX.format(reply=reply, frame=wording)


def channel_text(next_state_text: str) -> str:
    """The next state as the continuation the judge scores (whitespace collapsed, clipped)."""
    return " " + (" ".join(clip_middle(next_state_text, CHANNEL_NEXT_STATE_CHARS).split()) or "(nothing)")


def channel_log_odds(pairs: Sequence[tuple[float, float]]) -> float:
    """Log-odds of progress: the mean over the wordings of log p(next | worked) - log p(next | did not)."""
    if not pairs:
        raise ValueError("channel_log_odds needs at least one (worked, did not) pair")
    return sum(positive - negative for positive, negative in pairs) / len(pairs)


def verdict_log_odds(logprobs: Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """From the judge's log-probabilities of the verdict words (missing = never), the log-odds of good over bad and
    the three probabilities renormalised over the verdicts."""
    probs = {word: math.exp(logprobs[word]) if word in logprobs else 0.0 for word in VERDICT_WORDS}
    total = sum(probs.values())
    if total <= 0.0:
        return 0.0, {word: 0.0 for word in VERDICT_WORDS}
    probs = {word: p / total for word, p in probs.items()}
    floor = 1e-9  # a verdict the judge never gives still leaves a finite log-odds
    return math.log(max(probs["good"], floor)) - math.log(max(probs["bad"], floor)), probs


def reward_from_log_odds(log_odds: float, margin: float) -> float:
    """``P(+1) - P(-1) = tanh(x / 2)`` for a two-way log-odds ``x``; 0 when ``|x| < margin`` (not confident)."""
    if not math.isfinite(log_odds) or abs(log_odds) < margin:
        return 0.0
    return math.tanh(log_odds / 2.0)


def hint_from_next_state(text: str) -> str | None:
    """The user's own next message as an OPD hint: template control tokens removed (the teacher must not read the
    user's words as turns of its own), whitespace collapsed, clipped. None when nothing is left. The words go in as
    the user wrote them: framing them ("The user's feedback on an earlier answer: ...") kept held-out keyword hits
    lower in a measured trial (0.38 against 0.50-0.62 for the raw words, same steps)."""
    cleaned = " ".join(_SPECIAL_TOKEN.sub(" ", text).split())
    if not cleaned:
        return None
    if len(cleaned) > HINT_CHARS:
        cleaned = cleaned[: HINT_CHARS - 3].rstrip() + "..."
    return cleaned
