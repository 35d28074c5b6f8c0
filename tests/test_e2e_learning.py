"""The whole learning loop on CPU with the local backend: `openclaw launch`'s runtime serves the tiny model, a
scripted user corrects every reply that lacks a chosen behaviour, a scripted judge reads the corrections, and the
trainer updates the served policy. After a fixed number of updates the served policy shows the behaviour more often
and the mean reward is higher than at the start. The scenario (and why the model's embeddings are scaled) is in
tests/e2e_scenario.py, shared with the other backends' e2e tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_scenario import (
    REPLIES_PER_SESSION,
    SESSIONS_PER_STEP,
    STEPS,
    ScriptedJudge,
    e2e_settings,
    free_port,
    make_learnable_model,
    run_scenario,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def learnable_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its (tied) embeddings scaled up, so LoRA can change what it says (see e2e_scenario)."""
    return make_learnable_model(tiny_model_dir, tmp_path_factory.mktemp("learnable-tiny") / "model")


async def test_served_policy_learns_the_corrected_behaviour(learnable_model_dir: Path, tmp_path: Path) -> None:
    settings = e2e_settings(learnable_model_dir, tmp_path, free_port())
    judge = ScriptedJudge()
    result = await run_scenario(settings, judge)
    rate_before, rate_after, round_rates = result.rate_before, result.rate_after, result.round_rates
    version, steps = result.version, result.steps

    assert version == STEPS and [s[1] for s in steps] == list(range(1, STEPS + 1))
    rewards = [metrics["mean_reward"] for _, _, _, metrics in steps]
    # Each batch: 6 judged ±1 turns and 2 session-final turns scored 0 (no next state) -> all 8 in the batch.
    assert all(metrics["n_batch"] == 8 and metrics["n_samples"] <= 6 for *_, metrics in steps)
    assert judge.calls == STEPS * SESSIONS_PER_STEP * (REPLIES_PER_SESSION - 1)
    print(f"behaviour rate {rate_before:.2f} -> {rate_after:.2f}; rounds {round_rates}; rewards {rewards}")
    assert rate_after >= rate_before + 0.5, (rate_before, rate_after, round_rates)
    assert sum(rewards[-2:]) / 2 >= rewards[0] + 0.5, rewards
    # The shutdown checkpoint holds the final step.
    assert (tmp_path / "ckpt" / f"step-{STEPS:08d}" / "openclaw-state.json").is_file()
