"""Advantage formulas against hand computations, and datum building."""

from __future__ import annotations

import pytest

from openclaw_cli.learn.algorithms import (
    HINT_HEADER,
    RunningBaseline,
    TrainSample,
    binary_rl_advantages,
    build_datums,
    hybrid_advantages,
    opd_advantages,
    ppo_loss_config,
    teacher_messages,
)
from openclaw_cli.learn.hindsight_demos import echoes_hint, repeats_itself, talks_about_the_question
from openclaw_cli.settings import TrainSettings


def test_binary_rl_is_reward_minus_baseline_on_every_token() -> None:
    assert binary_rl_advantages(1, 3) == [1.0, 1.0, 1.0]
    assert binary_rl_advantages(-1, 2, baseline=0.25) == [-1.25, -1.25]


def test_running_baseline_returns_pre_update_mean() -> None:
    b = RunningBaseline(decay=0.5)
    assert b.update([1.0]) == 0.0  # first batch: nothing known yet
    assert b.value == 1.0  # first reward initialises the average
    assert b.update([-1.0]) == 1.0
    assert b.value == 0.0  # 0.5 * 1 + 0.5 * -1
    off = RunningBaseline()
    off.update([1.0, 1.0])
    assert off.value == 0.0


def test_opd_advantage_is_clipped_teacher_minus_old() -> None:
    teacher = [-0.5, -3.0, -0.1, -40.0]
    old = [-1.0, -1.0, -2.5, -1.0]
    # differences 0.5, -2.0, 2.4, -39 -> clip to +-1
    assert opd_advantages(teacher, old) == pytest.approx([0.5, -1.0, 1.0, -1.0])
    # without the +-1 clip the +-20 log-ratio clamp still applies
    assert opd_advantages(teacher, old, clip=0) == pytest.approx([0.5, -2.0, 2.4, -20.0])
    with pytest.raises(ValueError):
        opd_advantages([-1.0], [-1.0, -2.0])


def test_hybrid_dispatch_per_turn() -> None:
    old, teacher = [-1.0, -2.0], [-0.5, -2.5]
    # both signals: w_opd * (t - old) + w_rl * r = 2*[0.5, -0.5] + 0.5*[1, 1]
    both = hybrid_advantages(old_logprobs=old, reward=1, teacher_logprobs=teacher, w_opd=2.0, w_rl=0.5)
    assert both == pytest.approx([1.5, -0.5])
    assert hybrid_advantages(old_logprobs=old, reward=0, teacher_logprobs=teacher) == pytest.approx([0.5, -0.5])
    assert hybrid_advantages(old_logprobs=old, reward=-1, teacher_logprobs=None) == [-1.0, -1.0]
    assert hybrid_advantages(old_logprobs=old, reward=0, teacher_logprobs=None) is None
    assert hybrid_advantages(old_logprobs=old, reward=None, teacher_logprobs=None) is None


def test_teacher_messages_append_hint_to_last_user_message_once_the_model_has_replied() -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second"}]},
        {"role": "assistant", "content": "draft"},
    ]
    out = teacher_messages(messages, " Use metric units. ")
    assert out[2]["content"] == f"second\n\n{HINT_HEADER}\nUse metric units."
    assert [m["content"] for m in out[:2] + out[3:]] == ["first", "ok", "draft"]
    assert messages[2]["content"] == [{"type": "text", "text": "second"}]  # caller's copy untouched
    with pytest.raises(ValueError):
        teacher_messages([{"role": "system", "content": "x"}], "hint")
    with pytest.raises(ValueError):
        teacher_messages(messages, "  ")


def test_teacher_messages_put_the_hint_of_a_first_reply_in_the_system_message() -> None:
    system = [{"role": "system", "content": [{"type": "text", "text": "Be kind."}]}, {"role": "user", "content": "q"}]
    out = teacher_messages(system, " Answer in one word. ")
    assert out == [
        {"role": "system", "content": f"Be kind.\n\n{HINT_HEADER}\nAnswer in one word."},
        {"role": "user", "content": "q"},
    ]
    assert system[0]["content"] == [{"type": "text", "text": "Be kind."}]  # caller's copy untouched
    # No system message: one is put in front.
    assert teacher_messages([{"role": "user", "content": "q"}], "Answer in one word.") == [
        {"role": "system", "content": f"{HINT_HEADER}\nAnswer in one word."},
        {"role": "user", "content": "q"},
    ]


def _sample(turn_id: int, reward: float | None, version: int = 0, n: int = 2, teacher=None) -> TrainSample:
    return TrainSample(
        turn_id=turn_id,
        session_id="s",
        prompt_tokens=[5, 6],
        completion_tokens=list(range(10, 10 + n)),
        sampler_logprobs=[-1.0] * n,
        version=version,
        reward=reward,
        teacher_logprobs=teacher,
    )


def test_build_datums_per_sample_mean_scaling_and_filters() -> None:
    train = TrainSettings(max_staleness=2, loss_norm="sample")
    samples = [
        _sample(1, 1, n=2),
        _sample(2, -1, n=4),
        _sample(3, 0),  # no signal for RL
        _sample(4, 1, version=0),
    ]
    datums, ids = build_datums(samples, "rl", train, current_version=2)
    assert ids == [1, 2, 4]
    # per-sample token mean, then mean over the 3 kept samples: A / (n_tokens * 3)
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([0.0, 1 / 6, 1 / 6])
    assert datums[1].loss_fn_inputs["advantages"] == pytest.approx([0.0] + [-1 / 12] * 4)
    assert datums[0].loss_fn_inputs["logprobs"] == [0.0, -1.0, -1.0]
    # staleness: version 0 is 3 versions behind 3 -> dropped
    _, ids = build_datums(samples, "rl", train, current_version=3)
    assert ids == []


def test_build_datums_token_level_mean_weighs_every_token_the_same() -> None:
    train = TrainSettings(max_staleness=2, loss_norm="token")
    samples = [_sample(1, 1, n=2), _sample(2, -1, n=4), _sample(3, 0), _sample(4, 1, version=0)]
    datums, ids = build_datums(samples, "rl", train, current_version=2)
    assert ids == [1, 2, 4]
    # 2 + 4 + 2 = 8 trained tokens: every advantage / 8, however long its reply
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([0.0, 1 / 8, 1 / 8])
    assert datums[1].loss_fn_inputs["advantages"] == pytest.approx([0.0] + [-1 / 8] * 4)
    assert datums[2].loss_fn_inputs["advantages"] == pytest.approx([0.0, 1 / 8, 1 / 8])


def test_build_datums_opd_needs_a_hint() -> None:
    train = TrainSettings(opd_max_advantage=1.0)  # the symmetric clip of the reference method
    samples = [_sample(1, 1), _sample(2, None, teacher=[-0.5, -1.5])]
    datums, ids = build_datums(samples, "opd", train, current_version=0)
    assert ids == [2]
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([0.0, 0.25, -0.25])
    # The default keeps only the teacher's objections: the +0.5 (teacher likes it more) is clipped to 0.
    datums, _ = build_datums(samples, "opd", TrainSettings(), current_version=0)
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([0.0, 0.0, -0.25])


def test_opd_upper_clip() -> None:
    assert opd_advantages([-0.5, -3.0, -1.0], [-1.0, -1.0, -1.0], clip=1.0, clip_high=0.0) == [0.0, -1.0, 0.0]
    assert opd_advantages([-0.5, -3.0], [-1.0, -1.0], clip=1.0, clip_high=0.25) == [0.25, -1.0]


def test_ppo_loss_config_from_eps() -> None:
    assert ppo_loss_config(TrainSettings(eps_low=0.2, eps_high=0.28)) == pytest.approx(
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    )


def test_at_least_one_sample_per_session_rule() -> None:
    train = TrainSettings()
    samples = [
        _sample(1, 0),  # session s: only score-0 turns -> the first one with a next state is kept
        _sample(2, 0),
        TrainSample(7, "t", [5], [9, 9], [-1.0, -1.0], 0, reward=1),  # session t has a signal
        TrainSample(8, "t", [5], [9], [-1.0], 0, reward=0),
        TrainSample(9, "u", [5], [9], [-1.0], 0, reward=0, has_next_state=False),  # ended: no next state
    ]
    datums, ids = build_datums(samples, "rl", train, current_version=0, baseline=0.5)
    assert ids == [1, 7]
    # turn 1: A = (0 - 0.5) / (2 tokens * 2 samples); turn 7: (1 - 0.5) / (2 * 2)
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([0.0, -0.125, -0.125])
    assert datums[1].loss_fn_inputs["advantages"] == pytest.approx([0.125, 0.125])  # 1-token prompt: no pad
    # OPD has no reward term: the rule does not apply
    assert build_datums(samples, "opd", train, current_version=0)[1] == []


def test_kl_anchor_subtracts_beta_times_old_minus_base_on_trained_tokens() -> None:
    train = TrainSettings(kl_coef=0.5)
    # sampler (old) logprobs -1, -1; the base gave -2 and -0.5: the policy likes token 1 more than the base did
    sample = TrainSample(1, "s", [5], [9, 9], [-1.0, -1.0], 1, reward=1, base_logprobs=[-2.0, -0.5])
    datums, ids = build_datums([sample], "rl", train, current_version=1)
    assert ids == [1]
    # A_t = 1 - 0.5 * (old - base) = [1 - 0.5, 1 + 0.25], divided by 2 tokens * 1 sample
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([0.25, 0.625])
    # without base logprobs (a version-0 sample: old is the base) the penalty is 0
    plain = TrainSample(2, "s", [5], [9, 9], [-1.0, -1.0], 0, reward=1)
    assert build_datums([plain], "rl", train, current_version=1)[0][0].loss_fn_inputs["advantages"] == pytest.approx(
        [0.5, 0.5]
    )


def test_a_constrained_replys_forced_tokens_get_no_advantage() -> None:
    """Tokens the grammar forced were certain under the masked policy the reply was drawn from: no gradient there.
    The ratio stays against the unmasked policy's logprobs (stored), for every token."""
    train = TrainSettings(kl_coef=0.5, loss_norm="sample")
    sample = TrainSample(
        1, "s", [5], [7, 8, 9, 2], [-1.0, -3.0, -1.0, -0.5], 1, reward=1, base_logprobs=[-1.0] * 4, forced_tokens=(1, 3)
    )
    datums, ids = build_datums([sample], "rl", train, current_version=1)
    assert ids == [1]
    # 1 - 0.5 * (old - base) on the free tokens 0 and 2, 0 on the forced 1 and 3; / 4 tokens * 1 sample
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([0.25, 0.0, 0.25, 0.0])
    assert datums[0].loss_fn_inputs["logprobs"] == pytest.approx([-1.0, -3.0, -1.0, -0.5])


def test_a_hindsight_demonstration_trains_its_constant_advantage_without_the_kl_anchor() -> None:
    train = TrainSettings(kl_coef=0.5, loss_norm="sample")
    own = TrainSample(1, "s", [5], [9, 9], [-1.0, -1.0], 1, teacher_logprobs=[-1.5, -0.5], base_logprobs=[-2.0, -1.0])
    demo = TrainSample(1, "s", [5], [7, 8, 2], [-0.2, -0.4, -0.1], 1, base_logprobs=[-3.0] * 3, demo_weight=0.8)
    datums, ids = build_datums([own, demo], "opd", train, current_version=1)
    assert ids == [1]  # one turn, two samples
    # own reply: clip(teacher - old, -1, 0) - 0.5 * (old - base) = [-0.5 - 0.5, 0 - 0] over 2 tokens * 2 samples
    assert datums[0].loss_fn_inputs["advantages"] == pytest.approx([-0.25, 0.0])
    # the demonstration: 0.8 on each of its 3 tokens, no anchor (its base logprobs are ignored), / (3 * 2)
    assert datums[1].loss_fn_inputs["advantages"] == pytest.approx([0.8 / 6] * 3)
    assert datums[1].loss_fn_inputs["logprobs"] == pytest.approx([-0.2, -0.4, -0.1])
    # a weight of 0 is no sample at all
    zero = TrainSample(2, "s", [5], [7], [-0.2], 1, demo_weight=0.0)
    assert build_datums([zero], "opd", train, current_version=1) == ([], [])


def test_echoes_hint_is_four_words_of_the_hint_in_a_row() -> None:
    hint = "No, that is far too long. Answer in one short sentence, please."
    assert echoes_hint("Sure: answer in one short sentence.", hint)
    assert echoes_hint("THAT IS FAR too long", hint)  # case and punctuation do not hide it
    assert not echoes_hint("Paris is the capital of France, in one sentence.", hint)
    assert echoes_hint("Try again.", "No, that does not answer my question. Try again.")  # all of it is the hint's
    assert not echoes_hint("Paris again.", "No, that does not answer my question. Try again.")
    assert not echoes_hint("long too", hint)  # the hint's words, not a run of them


def test_a_demonstration_that_talks_about_the_question_is_told_apart() -> None:
    assert talks_about_the_question("The answer to this question is a classic example of a logical fallacy.")
    assert talks_about_the_question('The answer to THIS  question is: "How do airplanes fly."')
    assert talks_about_the_question("That's a great question. Your question is about Paris.")
    assert not talks_about_the_question("Paris is the capital of France.")
    assert not talks_about_the_question("Questions about gravity: it is the force between masses.")


def test_a_demonstration_that_repeats_itself_is_told_apart() -> None:
    assert repeats_itself('The answer is "The answer is "The answer is "')
    assert not repeats_itself("Paris is the capital of France.")
    assert not repeats_itself("No no no")  # too short to judge


def test_a_batch_without_signal_gives_no_datums() -> None:
    # Only "at least one per session" samples with score 0 and no baseline: every advantage is 0, so no step.
    samples = [_sample(1, 0), TrainSample(2, "t", [5], [9], [-1.0], 0, reward=0)]
    assert build_datums(samples, "rl", TrainSettings(), current_version=0) == ([], [])
    # with a baseline the same samples carry a signal (pushed down by how much better the policy usually does)
    datums, ids = build_datums(samples, "rl", TrainSettings(), current_version=0, baseline=0.5)
    assert len(datums) == 2
    assert ids == [1, 2]
