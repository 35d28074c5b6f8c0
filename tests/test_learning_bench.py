"""The learning bench's own bookkeeping (bench/learning.py is a script, loaded here by path)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "learning.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("learning_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    sys.path.insert(0, str(BENCH.parent))  # as when run as a script: its sibling modules import by name
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


def test_held_out_file_names_each_question_its_replies_and_hits(bench: ModuleType, tmp_path: Path) -> None:
    questions = list(bench.SCRIPT.held_out)
    before = bench.HeldOut.of([f"A long answer about {q}" for q in questions])
    told = bench.HeldOut.of(["Tokyo."] * len(questions))
    after = bench.HeldOut.of(["I do not know."] * len(questions))
    path = tmp_path / "out" / "held-out-policy-seed0.json"

    bench.write_held_out(path, before, told, after)

    rows = json.loads(path.read_text(encoding="utf-8"))
    assert [row["question"] for row in rows] == questions
    tokyo = rows[questions.index("What is the capital of Japan?")]
    assert tokyo["told"] == "Tokyo." and tokyo["told_hit"] is True
    assert tokyo["after"] == "I do not know." and tokyo["after_hit"] is False
    # The per-question hits add up to the hit rates the bench prints.
    assert sum(row["told_hit"] for row in rows) / len(rows) == told.hits
    assert sum(row["after_hit"] for row in rows) / len(rows) == after.hits
