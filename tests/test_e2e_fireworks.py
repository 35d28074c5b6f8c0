"""The end-to-end learning scenario (tests/e2e_scenario.py) with ``backend = "fireworks"`` in step-wise mode.

`openclaw launch` builds the backend from the settings alone, exactly as for a user: ``fireworks.base_url`` points
at the HTTP test double of Fireworks' training service (openclaw_cli/testing/fireworks_training_double.py), so the
real ``fireworks.training.sdk`` does every session, training, future-polling, checkpoint and sampling call over
loopback. The double trains and samples the same tiny model with the local backend's math; the learning must show
just as with the local backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_scenario import (
    LORA_ALPHA,
    LORA_RANK,
    STEPS,
    ScriptedJudge,
    assert_learned,
    e2e_settings,
    run_scenario,
)
from runtime_helpers import free_port

from openclaw_cli.settings import FireworksSettings
from openclaw_cli.testing.fireworks_training_double import FireworksTrainingDouble

pytestmark = pytest.mark.timeout(240)

BASE_MODEL = "accounts/fireworks/models/tiny-learnable"


@pytest.fixture
def double(learnable_model_dir: Path) -> Iterator[FireworksTrainingDouble]:
    with FireworksTrainingDouble(learnable_model_dir, base_model=BASE_MODEL) as running:
        yield running


async def test_served_policy_learns_through_fireworks_stepwise_training(
    learnable_model_dir: Path, tmp_path: Path, double: FireworksTrainingDouble
) -> None:
    settings = e2e_settings(learnable_model_dir, tmp_path, free_port(), backend="fireworks")
    settings = settings.model_copy(
        update={
            "fireworks": FireworksSettings(
                mode="stepwise", api_key=double.api_key, base_url=double.url, base_model=BASE_MODEL
            )
        }
    )
    judge = ScriptedJudge()
    result = await run_scenario(settings, judge)

    assert_learned(result, judge)

    # Everything went over the wire: one LoRA run with our rank and alpha, a forward_backward + optim_step + sampler
    # snapshot per step (each future polled through try_again), serving from those snapshots, and the shutdown
    # checkpoint saved at the service with its local record where resume looks; then the session was released.
    (created,) = double.bodies("/api/v1/create_model")
    assert created["base_model"] == BASE_MODEL
    assert (created["lora_config"]["rank"], created["lora_config"]["alpha"]) == (LORA_RANK, LORA_ALPHA)
    fwd = double.bodies("/api/v1/forward_backward")
    assert len(fwd) == len(double.bodies("/api/v1/optim_step")) == STEPS
    assert {body["forward_backward_input"]["loss_fn"] for body in fwd} == {"ppo"}
    assert len(double.bodies("/api/v1/save_weights_for_sampler")) == STEPS
    assert all(f.try_again >= 2 for f in double.futures("/api/v1/forward_backward"))
    models = {body["model"] for body in double.bodies("/inference/v1/completions")}
    assert sum("/checkpoints/" in model for model in models) == STEPS  # every published version served
    record = json.loads((tmp_path / "ckpt" / f"step-{STEPS:08d}" / "openclaw-state.json").read_text())
    assert record["backend"] == "fireworks" and record["trainer_step"] == STEPS and record["version"] == STEPS
    saved = [body["path"] for body in double.bodies("/api/v1/save_weights")]
    version_states = [p for p in saved if p.startswith("openclaw-v") and p.endswith("-train")]  # for rollback
    assert len(version_states) == STEPS + 1  # one per published version, and the fresh run's (version 0)
    assert [p for p in saved if p not in version_states] == [f"step-{STEPS:08d}"]
    assert record["service_path"].endswith(f"/step-{STEPS:08d}")
    assert len(double.deleted_sessions) == 1
