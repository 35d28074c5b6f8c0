"""Loop probe: where a greedy reply starts repeating itself, what gets trained, and what is left alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from openclaw_cli.learn.algorithms import TrainSample, build_datums
from openclaw_cli.learn.loop_probe import LOOP_ADVANTAGE, align_to_sentence_end, loop_start, probe_loops
from openclaw_cli.settings import TrainSettings
from openclaw_cli.types import PolicyVersion, SampleResult, SamplingParams

# Token ids as words, so the cases read: 1 = "Intro", 2 = ".", 3 = "X", 4 = "is", 5 = "Y".
INTRO, STOP, X, IS, Y = 1, 2, 3, 4, 5
WORDS = {INTRO: "Intro", STOP: ".", X: " X", IS: " is", Y: " Y"}


def decode(tokens: Sequence[int]) -> str:
    return "".join(WORDS.get(t, f" w{t}") for t in tokens)


def test_a_reply_that_ends_or_moves_on_is_no_loop() -> None:
    assert loop_start([X, IS, Y, STOP]) is None
    assert loop_start([X, IS, Y, STOP, X, IS, Y, STOP, 7, 8, 9]) is None  # repeated once, then moved on
    assert loop_start([X, IS, Y, STOP, X, IS, Y, STOP]) is None  # one repetition is not yet a loop
    assert loop_start([7, 7, 7, 7, 7, 7, 7, 7]) is None  # a run shorter than MIN_PERIOD is left alone


def test_the_earliest_start_and_the_true_period_of_a_loop_cut_off_by_the_budget() -> None:
    span = [X, IS, Y, STOP]
    tokens = [INTRO, 9, *span, *span, *span, X, IS]  # the budget cut the fourth occurrence
    assert loop_start(tokens) == (6, 4)  # first repetition at index 6; the period 8 starts later and loses


def test_the_trained_repetition_starts_after_the_sentence_end_inside_the_ambiguous_window() -> None:
    # "Intro. X is Y. X is Y. X is Y." is periodic from the first "." on: the raw start is the "." that ends the
    # first "X is Y", which must not be pushed down.
    span = [X, IS, Y, STOP]
    tokens = [INTRO, STOP, *span, *span, *span]
    start, period = loop_start(tokens) or (0, 0)
    assert (start, period) == (5, 4) and tokens[start] == STOP
    aligned = align_to_sentence_end(tokens, start, period, decode)
    assert aligned == 6 and tokens[aligned : aligned + period] == span
    # No sentence end inside the window: the raw start stays.
    assert align_to_sentence_end([7, 8, 9, 7, 8, 9, 7, 8, 9], 3, 3, decode) == 3


class ProbeBackend:
    """Answers every greedy probe with ``reply`` (its tokens, logprob -0.25 each, ``finish``)."""

    def __init__(self, reply: list[int], finish: str = "length") -> None:
        self.reply, self.finish = reply, finish
        self.prompts: list[tuple[list[int], SamplingParams, int | None]] = []

    def tokenizer(self) -> Any:
        return self

    def decode(self, tokens: Sequence[int]) -> str:
        return decode(tokens)

    def current_version(self) -> PolicyVersion:
        return PolicyVersion(3, "v3")

    async def sample(self, prompt: list[int], params: SamplingParams, version: int | None = None) -> SampleResult:
        self.prompts.append((prompt, params, version))
        return SampleResult(
            tokens=list(self.reply), logprobs=[-0.25] * len(self.reply), finish_reason=self.finish, version=3
        )  # type: ignore[arg-type]


def sample(turn_id: int, prompt: list[int], **extra: Any) -> TrainSample:
    return TrainSample(
        turn_id=turn_id,
        session_id=f"s{turn_id}",
        prompt_tokens=prompt,
        completion_tokens=[X],
        sampler_logprobs=[-1.0],
        version=3,
        **extra,
    )


LOOPING = [INTRO, STOP, *[X, IS, Y, STOP] * 3]


async def test_a_looping_greedy_reply_trains_its_first_repetition_with_a_negative_advantage() -> None:
    backend = ProbeBackend(LOOPING)
    batch = [
        sample(1, [40, 41]),
        sample(2, [40, 41]),  # the same prompt: probed once
        sample(3, [42], demo_weight=1.0),  # a demonstration's prompt is not probed
        sample(4, [43]),
        sample(5, [44]),  # beyond probes=2
    ]
    found = await probe_loops(backend, batch, probes=2, max_tokens=64, version=3)  # type: ignore[arg-type]
    assert [(p, params.temperature, params.max_tokens, v) for p, params, v in backend.prompts] == [
        ([40, 41], 0.0, 64, 3),
        ([43], 0.0, 64, 3),
    ]
    assert len(found) == 2
    probe = found[0]
    assert probe.turn_id == 1 and probe.prompt_tokens == [40, 41, INTRO, STOP, X, IS, Y, STOP]
    assert probe.completion_tokens == [X, IS, Y, STOP] and probe.sampler_logprobs == [-0.25] * 4
    assert probe.token_advantages == [LOOP_ADVANTAGE] * 4 and probe.version == 3


@pytest.mark.parametrize("finish", ["stop", "tool_calls"])
async def test_a_reply_that_ended_before_the_budget_trains_nothing(finish: str) -> None:
    backend = ProbeBackend(LOOPING, finish=finish)
    assert await probe_loops(backend, [sample(1, [40])], probes=2, max_tokens=64, version=3) == []  # type: ignore[arg-type]


def test_a_probe_sample_trains_exactly_its_advantages_and_is_no_trained_turn_of_its_own() -> None:
    train = TrainSettings(kl_coef=0.1, loss_norm="sample")
    fresh = sample(1, [40], reward=1.0, base_logprobs=[-3.0])
    probe = sample(1, [40, X], token_advantages=[-1.0], base_logprobs=[-3.0])
    probe.completion_tokens, probe.sampler_logprobs = [IS], [-0.5]
    other = sample(2, [41], token_advantages=[-1.0])  # the probe of a turn with no signal of its own
    datums, trained = build_datums([fresh, probe, other], "rl", train, current_version=3, baseline=0.0)
    assert trained == [1]
    # Per-sample mean over 3 samples: the probe's advantage is -1 / (1 token * 3 samples), no KL anchor.
    probe_datum = datums[1]
    assert probe_datum.loss_fn_inputs["advantages"][-1] == pytest.approx(-1.0 / 3)
    # RL: reward 1 with the anchor 0.1 * (-1 - -3) = 0.2 off.
    assert datums[0].loss_fn_inputs["advantages"][-1] == pytest.approx((1.0 - 0.2) / 3)
