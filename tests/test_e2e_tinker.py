"""The end-to-end learning scenario (tests/e2e_scenario.py) with ``backend = "tinker"``: the Tinker backend, unchanged,
pointed at the Tinker test double (openclaw_cli/testing/tinker_double.py), which trains and samples the same tiny
model with the local backend's math. Serving, capture, judging, datums, training, publishing and the shutdown
checkpoint all go through the Tinker SDK's interface; the learning must show just as with the local backend.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_scenario import LORA_ALPHA, STEPS, ScriptedJudge, assert_learned, e2e_settings, run_scenario
from runtime_helpers import free_port

from openclaw_cli.backends.tinker import TinkerBackend
from openclaw_cli.testing.tinker_double import TinkerDouble

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def double(learnable_model_dir: Path) -> Iterator[TinkerDouble]:
    # Same LoRA scaling (alpha / rank) and init seed as the local backend gets from e2e_settings.
    built = TinkerDouble(learnable_model_dir, lora_alpha=LORA_ALPHA, seed=0)
    yield built
    built.close()


async def test_served_policy_learns_through_the_tinker_backend(
    learnable_model_dir: Path, tmp_path: Path, double: TinkerDouble
) -> None:
    settings = e2e_settings(learnable_model_dir, tmp_path, free_port(), backend="tinker")
    backend = TinkerBackend(settings, service_client_factory=double.service_client)
    judge = ScriptedJudge()
    result = await run_scenario(settings, judge, backend=backend)

    assert_learned(result, judge)

    # Everything went through the service interface: one LoRA run, a forward_backward + optim_step + snapshot per
    # step, and the shutdown checkpoint saved on the service with its local record where resume looks.
    assert [c.args["rank"] for c in double.calls("create_lora_training_client")] == [settings.lora.rank]
    assert len(double.calls("forward_backward")) == len(double.calls("optim_step")) == STEPS
    assert {c.args["loss_fn"] for c in double.calls("forward_backward")} == {"ppo"}
    assert len(double.calls("save_weights_and_get_sampling_client")) == STEPS
    record = json.loads((tmp_path / "ckpt" / f"step-{STEPS:08d}" / "openclaw-state.json").read_text())
    assert record["backend"] == "tinker" and record["trainer_step"] == STEPS and record["version"] == STEPS
    saved = [c.args["name"] for c in double.calls("save_state")]
    version_states = [n for n in saved if n.startswith("openclaw-v") and n.endswith("-train")]  # for rollback
    assert len(version_states) == STEPS + 1  # one per published version, and the fresh run's (version 0)
    assert [n for n in saved if n not in version_states] == [f"step-{STEPS:08d}"]
    assert record["service_path"].endswith(f"/weights/step-{STEPS:08d}")
    assert [c.args["status"] for c in double.calls("close")] == ["success"]
