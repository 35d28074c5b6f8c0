"""A lesson's evidence comes from prompts where it can act: the reply the user corrected counts first, prompts whose
replies are short anyway count for nothing (neither "duplicate" nor "learned"), asking again is new evidence at once,
and retirement needs several passing checks in a row, more after each return (no flapping)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lesson_helpers import (
    LESSON,
    LONG,
    MEDIUM,
    SHORT,
    keeper_with_policy,
    record_conversation,
    record_served,
    served_exchange,
)

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.lesson_checks import PromptTrial, decide
from openclaw_cli.learn.lesson_story import explain_entry
from openclaw_cli.learn.lessons import checks_to_retire

SHORT_ANYWAY = "(short) What is 2 + 2?"  # the scripted policy answers it SHORT, lesson or not


@pytest.fixture
def parts(tmp_path: Path, tiny_tokenizer: Any) -> Any:
    for found in keeper_with_policy(tmp_path, tiny_tokenizer):
        _, _, policy, keeper = found
        # run_once finds and verifies; the tests call the retirement checks themselves
        keeper._checked_versions = {SHARED_ADAPTER: policy.current_version().version}
        yield found


def _short_first(capture: SessionCapture, tokenizer: Any, n: int = 2) -> None:
    """The user's first conversations: questions whose replies are short anyway."""
    for i in range(n):
        record_conversation(capture, tokenizer, f"{SHORT_ANYWAY} ({i})", SHORT, f"Thanks! Next question {i}.")


async def test_the_reported_order_short_answers_a_fact_correction_then_a_form_correction(
    parts: Any, tiny_tokenizer: Any
) -> None:
    """The report: two short-answer prompts, a fact correction, then a form correction of a long reply. The lesson
    is active after one round of the loop: the corrected reply is where it acts, the short ones are no evidence."""
    store, capture, _, keeper = parts
    _short_first(capture, tiny_tokenizer)
    record_conversation(capture, tiny_tokenizer, f"{SHORT_ANYWAY} (capital)", SHORT, "No, the capital is Canberra.")
    await keeper.run_once()
    assert store.lessons() == []  # a fact correction is no lesson
    record_conversation(capture, tiny_tokenizer, "Why is the sky blue?", LONG, LESSON)
    await keeper.run_once()
    (lesson,) = store.lessons()
    assert lesson.status == "active", lesson.evidence
    trials = lesson.evidence[-1]["verification"]["trials"]
    corrected = [t for t in trials if t["corrected"]]
    assert len(corrected) == 1 and corrected[0]["verdict"] == "helped"
    assert corrected[0]["words"] == [len(LONG.split()), len(SHORT.split())]
    assert {t["verdict"] for t in trials if not t["corrected"]} == {"unchanged"}
    assert "helped on 1 of 1 prompts where it acts" in lesson.evidence[-1]["why"]


async def test_no_difference_anywhere_waits_instead_of_duplicating_and_acts_on_the_next_long_reply(
    parts: Any, tiny_tokenizer: Any
) -> None:
    """Feedback text on a short reply, with only short-answer prompts: inconclusive (not a duplicate: no lesson is
    active), it stays a candidate, is not tried again on the same prompts, and the owner's next long reply verifies
    it."""
    store, capture, policy, keeper = parts
    _short_first(capture, tiny_tokenizer, 3)
    turn_id = store.owner_turns("local", 1)[0].id
    await keeper.feedback(turn_id, -1, "Please be more concise.")
    await keeper.run_once()
    (lesson,) = store.lessons()
    assert lesson.status == "candidate"
    assert "waiting for a prompt where it can act" in lesson.evidence[-1]["why"]
    await keeper.run_once()  # the owner's other three prompts (lessons.verify_prompts a round)
    assert len(store.get_lesson(lesson.id).evidence[-1]["verification"]["trials"]) == 6
    asked = policy.samples
    await keeper.run_once()  # nothing new: no trial repeated
    assert policy.samples == asked and store.get_lesson(lesson.id).status == "candidate"
    record_conversation(capture, tiny_tokenizer, "How do airplanes fly?", LONG, "Thanks.")
    await keeper.run_once()
    assert store.get_lesson(lesson.id).status == "active"


async def test_a_repeated_correction_reopens_a_rejected_lesson_at_once_on_the_new_reply(
    parts: Any, tiny_tokenizer: Any
) -> None:
    store, capture, _policy, keeper = parts
    lesson_id = store.add_lesson(
        "local",
        "Don't apologize so much.",
        status="rejected",
        origin="correction",
        why="helped on only 0 of 1 prompts where it acts",
    )
    _short_first(capture, tiny_tokenizer)
    # Not the same words: the same content words ("apologize"; "please", "much" are words of form).
    record_conversation(capture, tiny_tokenizer, "Why do we have seasons?", LONG, "Please don't apologize!")
    await keeper.run_once()
    lesson = store.get_lesson(lesson_id)
    assert lesson.status == "active", lesson.evidence
    assert any("you asked for it again" in e["why"] for e in lesson.evidence)
    assert len(store.lessons()) == 1 and lesson.source_turn_ids  # no second candidate


async def test_repeating_a_correction_costs_one_trial_per_new_prompt(parts: Any, tiny_tokenizer: Any) -> None:
    """The bound on re-verification: each round tries at most lessons.verify_prompts new prompts of a candidate, and
    no prompt twice."""
    store, capture, policy, keeper = parts
    keeper.settings.lessons.verify_prompts = 2
    _short_first(capture, tiny_tokenizer, 4)
    asked = policy.samples
    for i in range(5):  # the same wish on short replies (which it cannot change): the candidate keeps waiting
        record_conversation(capture, tiny_tokenizer, f"{SHORT_ANYWAY} again {i}", SHORT, "Be more concise.")
        await keeper.run_once()
    (lesson,) = store.lessons()
    assert lesson.status == "candidate" and len(lesson.source_turn_ids) == 5
    trials = lesson.evidence[-1]["verification"]["trials"]
    tried = [t["turn"] for t in trials]
    assert len(tried) == len(set(tried)) <= 2 * 5
    # A trial is two greedy replies (unchanged beside no served lesson: no more).
    assert policy.samples - asked == 2 * len(trials)


async def test_retirement_counts_only_prompts_where_the_lesson_acts(parts: Any, tiny_tokenizer: Any) -> None:
    """An owner whose untrained prompts all have short answers anyway: the weights look "learned" there (the
    replies are the same with and without the lesson), but that is no evidence, and the lesson stays."""
    store, capture, _policy, keeper = parts
    lesson = await keeper.add("local", LESSON)
    record_served(capture, tiny_tokenizer, [f"{SHORT_ANYWAY} served {i}" for i in range(4)], lesson, SHORT)
    for _ in range(3):
        await keeper.check_retirement()
    kept = store.get_lesson(lesson.id)
    assert kept.status == "active"
    assert "too few untrained prompts where it acts" in kept.evidence[-1]["why"]
    assert sum("too few" in e["why"] for e in kept.evidence) == 1  # said once, not once per check


async def test_a_lesson_that_came_back_needs_more_passing_checks(parts: Any, tiny_tokenizer: Any) -> None:
    store, capture, policy, keeper = parts
    lesson = await keeper.add("local", LESSON)
    served = [{"id": lesson.id, "text": LESSON}]
    record_served(capture, tiny_tokenizer, [f"Served question {i}?" for i in range(3)], lesson, SHORT)
    policy.learned = True
    for _ in range(2):
        await keeper.check_retirement()
    assert store.get_lesson(lesson.id).status == "retired"
    # The user corrects the same thing again: back at once, and now it needs twice the passing checks.
    record_conversation(capture, tiny_tokenizer, "What is the capital of France?", LONG, LESSON)
    await keeper.run_once()
    back = store.get_lesson(lesson.id)
    assert back.status == "active" and checks_to_retire(back, 2) == 4
    record_served(capture, tiny_tokenizer, [f"Later question {i}?" for i in range(3)], lesson, SHORT)  # untrained
    for expected in ("active", "active", "active", "retired"):
        await keeper.check_retirement()
        assert store.get_lesson(lesson.id).status == expected
    # A correction of a reply served while it was still active is no sign that it is missing: it stays retired.
    first = [{"role": "user", "content": "Served before it retired?"}]
    capture.record_sync(served_exchange(tiny_tokenizer, first, LONG, lessons=served))
    again = [*first, {"role": "assistant", "content": LONG}, {"role": "user", "content": LESSON}]
    capture.record_sync(served_exchange(tiny_tokenizer, again, SHORT, lessons=served))
    await keeper.run_once()
    stays = store.get_lesson(lesson.id)
    assert stays.status == "retired" and "served while it was active" in stays.evidence[-1]["why"]
    # Back again (now 6 in a row); a failing check in between starts the count again.
    record_conversation(capture, tiny_tokenizer, "And Spain?", LONG, LESSON)
    await keeper.run_once()
    statuses = []
    for learned in [True, True, False, True, True, True, True, True, True]:
        policy.learned = learned
        await keeper.check_retirement()
        statuses.append(store.get_lesson(lesson.id).status)
    assert statuses == ["active"] * 8 + ["retired"]


def test_lessons_show_explains_a_wait_and_a_rejection_in_words() -> None:
    waiting = {
        "status": "candidate",
        "why": "not verified yet: ...",
        "verification": {
            "outcome": "inconclusive",
            "trials": [
                {"turn": 7, "verdict": "unchanged", "corrected": False, "words": [6, 6], "advantage": 0.0},
                {"turn": 9, "verdict": "indifferent", "corrected": True, "words": [8, 7], "advantage": 0.1},
            ],
        },
    }
    text = explain_entry(waiting)
    assert "turn 9 (the reply you corrected): 8 -> 7 words" in text
    assert "turn 7: the same reply with it (6 words)" in text
    assert "waiting for" in text.lower()
    rejected = {
        "status": "rejected",
        "why": "helped on only 0 of 2 prompts where it acts",
        "verification": {
            "outcome": "rejected",
            "trials": [
                {"turn": 3, "verdict": "hurt", "corrected": False, "words": [30, 4], "advantage": -1.2},
                {"turn": 4, "verdict": "leak", "corrected": False, "words": [30, 12], "leaked": ["canberra"]},
            ],
        },
    }
    text = explain_entry(rejected)
    assert "worse" in text and "canberra" in text
    assert "say it again" in text.lower()
    check = {"status": "active", "check": "few", "acting_prompts": 1, "why": "too few ..."}
    assert "1 of your untrained prompts" in explain_entry(check)


def _trial(turn_id: int, verdict: str, *, corrected: bool = False) -> PromptTrial:
    helped, hurt = verdict == "helped", verdict == "hurt"
    return PromptTrial(turn_id, True, helped, True, [], 1.0 if helped else -1.0 if hurt else 0.0, (30, 10), corrected)


def test_a_tie_is_broken_by_the_reply_the_user_corrected() -> None:
    assert decide([_trial(1, "helped", corrected=True), _trial(2, "hurt")]).outcome == "verified"
    assert decide([_trial(1, "hurt", corrected=True), _trial(2, "helped")]).outcome == "rejected"
    assert decide([_trial(1, "helped"), _trial(2, "hurt")]).outcome == "rejected"
    assert decide([_trial(1, "indifferent"), _trial(2, "unchanged")]).outcome == "inconclusive"


async def test_a_conversation_already_told_is_not_a_prompt_to_verify_on(parts: Any, tiny_tokenizer: Any) -> None:
    """A turn whose conversation already holds a correction of form follows that correction: it cannot show what
    another lesson does (the corrected turns themselves are tried)."""
    store, capture, _, keeper = parts
    record_conversation(capture, tiny_tokenizer, "Why is the sky blue?", LONG, "Way too long.")
    await keeper.run_once()
    record_conversation(capture, tiny_tokenizer, "How do magnets work?", LONG, "Use bullet points from now on.")
    await keeper.run_once()
    bullets = next(lesson for lesson in store.lessons() if "bullet" in lesson.text)
    tried = {t["turn"] for t in bullets.evidence[-1]["verification"]["trials"]}
    told = {turn.id for turn in store.owner_turns("local", 10) if len(turn.messages) > 1}
    assert tried and not tried & told


def _record_served_conversation(
    capture: SessionCapture, tokenizer: Any, question: str, lesson: Any, reply: str, next_user: str
) -> None:
    """A conversation whose reply was served with ``lesson`` (a stored lesson), answered by ``next_user``."""
    served = [{"id": lesson.id, "text": lesson.text}]
    first = [{"role": "user", "content": question}]
    capture.record_sync(served_exchange(tokenizer, first, reply, lessons=served))
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": next_user}]
    capture.record_sync(served_exchange(tokenizer, second, reply, lessons=served))


async def test_newer_words_for_the_same_wish_replace_the_weaker_lesson(parts: Any, tiny_tokenizer: Any) -> None:
    """The rewording user: "tl;dr?" is active but the model follows it only half-way; the user corrects a reply
    served with it in other words. Beside it the new wording would be judged together with the weak one; tried in
    place of it (same kind: length), it shortens the reply by its own reader and by the old lesson's reader, so it
    replaces it. A third wording that does worse in place of the new one is rejected, and the new one stays."""
    store, capture, policy, keeper = parts
    policy.heeded = "brief"
    await keeper.book.refresh()
    old_id = store.add_lesson(
        "local", "tl;dr?", status="active", origin="correction", why="verified", data={"correction": "tl;dr?"}
    )
    await keeper.book.refresh()
    old = store.get_lesson(old_id)
    _record_served_conversation(capture, tiny_tokenizer, "Why is the sky blue?", old, MEDIUM, "Can you keep it brief?")
    await keeper.run_once()
    by_text = {lesson.text: lesson for lesson in store.lessons()}
    new = by_text["Can you keep it brief?"]
    assert new.status == "active", new.evidence
    assert "in place of lesson" in new.evidence[-1]["why"] and new.evidence[-1]["replacing"] == [old_id]
    corrected = [t for t in new.evidence[-1]["verification"]["trials"] if t["corrected"]]
    assert corrected[0]["verdict"] == "helped" and corrected[0]["guard"] > 0
    assert corrected[0]["words"] == [len(MEDIUM.split()), len(SHORT.split())]
    replaced = store.get_lesson(old_id)
    assert replaced.status == "rejected" and replaced.evidence[-1]["replaced_by"] == new.id
    assert [a.text for a in keeper.book.for_owner("local")] == ["Can you keep it brief?"]

    _record_served_conversation(capture, tiny_tokenizer, "How do tides work?", new, SHORT, "Too much text.")
    await keeper.run_once()
    third = {lesson.text: lesson for lesson in store.lessons()}["Too much text."]
    assert third.status == "rejected", third.evidence
    assert {t["verdict"] for t in third.evidence[-1]["verification"]["trials"] if t["corrected"]} == {"hurt"}
    assert store.get_lesson(new.id).status == "active"
    story = explain_entry({**third.evidence[-1], "status": "rejected"})
    assert f"Tried in place of lesson {new.id}" in story
    assert "worse by your own correction" in story


async def test_a_lesson_about_another_thing_is_tried_beside_the_active_one(parts: Any, tiny_tokenizer: Any) -> None:
    """A wish about length next to an active one about language: not rivals, so the new one is tried beside it and
    both stay served."""
    store, capture, policy, keeper = parts
    policy.heeded = "brief"
    other_id = store.add_lesson("local", "Answer in French.", status="active", origin="correction", why="verified")
    await keeper.book.refresh()
    other = store.get_lesson(other_id)
    _record_served_conversation(capture, tiny_tokenizer, "Why is the sky blue?", other, MEDIUM, "Be brief.")
    await keeper.run_once()
    new = {lesson.text: lesson for lesson in store.lessons()}["Be brief."]
    assert new.status == "active", new.evidence
    assert "replacing" not in new.evidence[-1]
    assert store.get_lesson(other_id).status == "active"
    assert sorted(a.text for a in keeper.book.for_owner("local")) == ["Answer in French.", "Be brief."]
