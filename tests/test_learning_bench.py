"""The learning bench's own bookkeeping (bench/learning.py is a script, loaded here by path)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


SCRIPT_FILES = sorted((BENCH.parent / "scripts").glob("*.json"))


@pytest.mark.parametrize("path", SCRIPT_FILES, ids=lambda p: p.stem)
def test_every_scripted_user_corrects_form_as_a_lesson_and_facts_never(bench: ModuleType, path: Path) -> None:
    from openclaw_cli.learn.lesson_finder import lesson_from_reply

    script = bench.Script.load(path)
    assert all(lesson_from_reply(line, 300) for line in script.form_corrections)
    # A fact line as the users send it: alone, or followed by the next question.
    sent = [
        line for fact in script.fact_lines for q in script.questions for line in (fact, f"{fact} Next question: {q}")
    ]
    assert [line for line in sent if lesson_from_reply(line, 300)] == []


def test_the_scripts_cover_the_users_the_rules_must_hold_for() -> None:
    names = {path.stem for path in SCRIPT_FILES}
    assert {"brevity", "terse", "short-first", "mixed", "some-long", "reworded"} <= names


async def test_a_scripted_user_opens_rewords_and_lets_some_long_replies_go(bench: ModuleType) -> None:
    """The users' behaviour the new scripts rely on, against a client that always answers long."""
    import asyncio
    import types

    long_reply = " ".join(["word"] * 40)
    sent: list[str] = []
    stop = asyncio.Event()

    class Client:
        async def post(self, path: str, json: dict, headers: dict) -> types.SimpleNamespace:
            sent.append(json["messages"][-1]["content"])
            if len(sent) >= 12:
                stop.set()
            body = {"choices": [{"message": {"content": long_reply}}]}
            return types.SimpleNamespace(status_code=200, json=lambda: body)

    script = bench.Script(
        system="s",
        instruction="i",
        correction="tl;dr?",
        wrong="w",
        thanks="thanks {question}",
        questions={"Q1?": ("a",), "Q2?": ("b",)},
        held_out={"H?": ("c",)},
        corrections=("tl;dr?", "Too much text."),
        correct_share=0.5,
        opening=(bench.Opening("Short?", ("x",), "No, it is X."),),
    )
    original, bench.SCRIPT = bench.SCRIPT, script
    try:
        args = types.SimpleNamespace(seed=0, turns=4, max_tokens=8, max_words=20)
        observed = bench.Observed()
        await bench.scripted_user(Client(), 0, args, observed, stop)
    finally:
        bench.SCRIPT = original
    assert sent[0] == "Short?" and sent[1].startswith("No, it is X. Next question: ")
    corrections = [line for line in sent if line in script.corrections]
    assert corrections[:2] == ["tl;dr?", "Too much text."]  # the wish reworded, in turn
    assert any(line.startswith("OK. Next question:") for line in sent)  # some long replies let go
    assert observed.first_correction_at is not None


def test_lesson_life_counts_retirements_overlapping_active_minutes_once_and_fact_lessons(bench: ModuleType) -> None:
    fact = bench.SCRIPT.wrong
    events = [
        {"id": 1, "minute": 1.0, "status": "active", "text": "Be brief.", "correction": "Too long."},
        {"id": 2, "minute": 2.0, "status": "active", "text": "Shorter.", "correction": "Shorter."},
        {"id": 1, "minute": 4.0, "status": "retired", "text": "Be brief.", "correction": "Too long."},
        {"id": 2, "minute": 3.0, "status": "retired", "text": "Shorter.", "correction": "Shorter."},
        {"id": 3, "minute": 4.5, "status": "candidate", "text": "Try again.", "correction": fact},
    ]
    result = bench.RunResult(0, "policy", bench.HeldOut([], 0, 0, 0), 1, 0, 5.0, lessons=events)
    assert bench.lesson_life(result) == (2, 3.0, ["Try again."])


def test_served_in_the_goal_counts_from_when_the_requests_went_out(bench: ModuleType) -> None:
    """The proxy picks a request's lessons when it arrives, so a measurement counts at the minute it was sent (its
    replies come back 40-60 s later while training runs); one sent before the first correction never counts."""
    told = bench.HeldOut([], 10.0, 0.6, 0.9)
    long, short = bench.HeldOut([], 30.0, 0.6, 0.9), bench.HeldOut([], 12.0, 0.6, 0.9)

    def point(sent: float, answered: float, served: Any) -> Any:
        return bench.TimelinePoint(answered, 0, served, long, "1", sent)

    def verdict(timeline: list[Any]) -> tuple[bool, bool, str]:
        result = bench.RunResult(0, "policy", long, 1, 0, 5.0, timeline=timeline, first_correction_minute=0.8)
        return bench.lesson_verdict(result, told)

    fast, _, line = verdict([point(0.5, 1.2, short), point(1.0, 1.8, long), point(2.9, 3.6, short)])
    assert not fast and "served in the goal at 2.90 min (FAIL)" in line  # the first was sent before the correction
    fast, _, line = verdict([point(1.0, 1.8, long), point(2.6, 3.4, short)])
    assert fast and "served in the goal at 2.60 min (ok)" in line  # answered after 2 minutes, sent within them
