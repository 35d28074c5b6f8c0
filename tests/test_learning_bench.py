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


def test_judge_readout_tallies_each_user_reaction(bench: ModuleType) -> None:
    script = bench.SCRIPT
    assert bench.user_reaction(script.correction) == "correction"
    assert bench.user_reaction(script.wrong) == "wrong"
    assert bench.user_reaction(script.thanks.format(question="What is DNA?")) == "thanks"
    assert bench.user_reaction("Something else entirely.") is None

    table = bench.judge_readout(
        [("correction", -0.5), ("correction", 0.0), ("correction", -0.2), ("correction", 0.3), ("thanks", 0.6)]
    )

    assert table["correction"] == {"n": 4, "negative": 0.5, "masked": 0.25, "positive": 0.25}
    assert table["thanks"] == {"n": 1, "negative": 0.0, "masked": 0.0, "positive": 1.0}
    assert "wrong" not in table  # no such reply in the run: no row, not a row of zeros


def test_judged_reactions_reads_the_verdict_of_each_turn_by_its_next_state(bench: ModuleType) -> None:
    from types import SimpleNamespace

    script = bench.SCRIPT
    turns = [
        SimpleNamespace(id=1, next_state=[{"role": "user", "content": script.correction}]),
        SimpleNamespace(id=2, next_state=[{"role": "user", "content": script.thanks.format(question="Why?")}]),
        SimpleNamespace(id=3, next_state=None),  # no next state yet: not counted
        SimpleNamespace(id=4, next_state=[{"role": "user", "content": script.wrong}]),  # judge failed: not counted
    ]
    verdicts = {1: {"score": -0.7}, 2: {"score": 0.4}, 3: {"score": 0.0}, 4: {"failed": True}}

    class FakeStore:
        def iter_turns(self, *, turn_type: str) -> list[SimpleNamespace]:
            assert turn_type == "main"
            return turns

        def result_of(self, consumer: str, turn_id: int) -> dict:
            assert consumer == "judge"
            return verdicts[turn_id]

    assert bench.judged_reactions(FakeStore()) == [("correction", -0.7), ("thanks", 0.4)]
