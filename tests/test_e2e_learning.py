"""The whole learning loop on CPU with the local backend: `openclaw launch`'s runtime serves the tiny model, a
scripted user corrects every reply that lacks a chosen behaviour, a scripted judge reads the corrections, and the
trainer updates the served policy. After a fixed number of updates the served policy shows the behaviour more often
and the mean reward is higher than at the start. The scenario (and why the model's embeddings are scaled) is in
tests/e2e_scenario.py, shared with the other backends' e2e tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_scenario import STEPS, ScriptedJudge, assert_learned, e2e_settings, run_scenario
from runtime_helpers import free_port

pytestmark = pytest.mark.timeout(180)


async def test_served_policy_learns_the_corrected_behaviour(learnable_model_dir: Path, tmp_path: Path) -> None:
    settings = e2e_settings(learnable_model_dir, tmp_path, free_port())
    judge = ScriptedJudge()
    result = await run_scenario(settings, judge)
    assert_learned(result, judge)
    # The shutdown checkpoint holds the final step.
    assert (tmp_path / "ckpt" / f"step-{STEPS:08d}" / "openclaw-state.json").is_file()
