"""scripts/gpu_check.py, the CUDA path's one-command check, run here on the CPU (``--device cpu``) so it cannot rot
while no GPU machine is at hand: every stage must pass and print its one summary line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[1]
STAGES = ["environment", "tiny model", "batched decode", "LoRA step", "publish + hot swap", "launch loop"]


def test_the_gpu_check_passes_every_stage_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("STAGE ")]
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert [line.split(":")[0].removeprefix("STAGE ") for line in lines] == STAGES
    assert all(": PASS " in line for line in lines), lines
    assert done.stdout.strip().endswith("GPU CHECK PASS: 6/6 stages")
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["stage"] for r in results] == STAGES and all(r["ok"] for r in results)
