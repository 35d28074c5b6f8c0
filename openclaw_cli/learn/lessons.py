"""Lessons: a user's correction of how the bot answers acts at once in the prompt, is verified, is distilled into the
weights, and retires from the prompt once the weights carry it.

**Statuses.** ``candidate`` (found, not yet tried) -> ``active`` (verified: served in the owner's main-line prompts)
-> ``retired`` (the weights answer as it asks without it; no longer served). ``rejected``: verification found that
it does not help, leaks its topic into other answers, or duplicates an active lesson (then it merges into that one).
``forgotten``: the user removed it (its text is erased; weights already trained keep what they learned until a
rollback). Every change carries its evidence (``openclaw lessons show ID``).

**Where lessons come from.**

- The user's next message after a main-line turn, when it corrects the form of answers
  (:mod:`openclaw_cli.learn.lesson_finder`): the lesson is their own words. A fact correction makes none.
- Explicit feedback (``POST /v1/openclaw/feedback`` with text): the text is a candidate.
- ``openclaw lessons add TEXT`` / ``POST /v1/openclaw/lessons``: taught directly, active at once (the user said so).

Opted-out exchanges are never stored, so they make no lessons; they are still served with their owner's lessons.
Text is redacted (``store.redact``, and API keys always) before it is stored.

**The loop** (:meth:`LessonKeeper.run`, beside the judge and trainer loops): it claims ready main-line turns as the
consumer ``lessons``, turns form corrections into candidates, verifies candidates, activates them (the proxy serves
them from the next request on), and after each new policy version checks what every active and retired lesson still
adds to the current policy, to retire it or bring it back. An owner keeps at most ``lessons.max_active`` active
lessons; a new one retires the oldest.

**Verification** (:func:`~openclaw_cli.learn.lesson_checks.decide`) tries a candidate first on the reply its
correction answered (where it must change the answer), then on the owner's other recent prompts, each prompt once, and
decides on every trial so far: only prompts where the lesson acts count. With none yet it waits (inconclusive) for the
owner's next prompts; after :data:`MAX_QUIET_PROMPTS` prompts without a difference it is rejected.

**Newer words for the same wish.** A candidate about the same kind of thing as an active lesson of its owner
(:func:`~openclaw_cli.learn.lesson_finder.form_kinds`: length, shape, language, case, tone; never a standing rule)
is tried *in place of* it, not beside it: it must do better by its own correction and no worse by the older lesson's
(the trial's ``guard``). Verified, it replaces the older one (rejected, "replaced by"). Measured on SmolLM2
(``bench/lesson_wordings.py``): "tl;dr?" served alone gave held-out replies of 23.8 words, "Can you keep it brief?"
alone 14.0, the two together 18.2, so a user who rewords the wish is served best by their clearest words, not by
every wording at once.

**Asking again is evidence.** The same correction again (the same words, or the same content words) adds its turn to
the lesson's sources: a candidate is tried on it in the next round, a rejected lesson is re-opened at once, a retired
one comes back. The cost stays bounded without a timer: each round tries at most ``lessons.verify_prompts`` new
prompts per candidate, and a candidate is tried on each prompt once (again only when the owner's served lessons
change), so a user who repeats a correction a hundred times costs a hundred trials at most, one per new turn.

**Retirement** needs evidence that stands up: a check (after each new policy version) counts only when at least
``lessons.verify_prompts`` untrained prompts of the owner are ones the lesson acts on (for the base model), and a
lesson retires after ``lessons.retire_checks`` passing checks in a row, ``retire_checks`` more for each time it came
back (:func:`checks_to_retire`). One passing check on three prompts, most of them short-answer prompts the lesson
never acted on, retired a lesson 5 to 8 times in a 20-minute run, each time while its user still needed it.

Consolidation (the distillation) happens in the trainer: a turn served with lessons is also trained as a hindsight
demonstration for the same conversation without them (``lessons.consolidate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from openclaw_cli.adapters import adapter_of, trainer_consumer
from openclaw_cli.backend import Backend, adapter_backend
from openclaw_cli.capture.redaction import Redactor, enabled_kinds
from openclaw_cli.learn.lesson_checks import (
    PromptTrial,
    Verification,
    content_words,
    decide,
    lesson_effect,
    try_candidate,
    try_prompt,
)
from openclaw_cli.learn.lesson_finder import form_kinds, is_form_correction, lesson_from_reply
from openclaw_cli.lesson_prompt import FORGET_NOTE, ActiveLesson, LessonBook, LessonError, served_lessons
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store, TurnRecord
from openclaw_cli.store.lessons import FORGOTTEN_TEXT, LessonRecord
from openclaw_cli.tokenizer import flatten_content

log = logging.getLogger("openclaw.lessons")

CONSUMER = "lessons"
_WORDS = re.compile(r"[a-z0-9']+")
LEASE_S = 600.0
# A candidate that made no difference on this many of its owner's prompts is rejected (nothing here for it to change);
# the same correction again re-opens it at once.
MAX_QUIET_PROMPTS = 12
POLL_S = 1.0


def load_active(store: Store) -> Callable[[], dict[str, list[ActiveLesson]]]:
    """The loader a :class:`LessonBook` refreshes from: active lessons by owner, oldest first."""

    def load() -> dict[str, list[ActiveLesson]]:
        book: dict[str, list[ActiveLesson]] = {}
        for lesson in store.lessons(statuses=["active"]):
            book.setdefault(lesson.owner, []).append(ActiveLesson(lesson.id, lesson.text))
        return book

    return load


def lesson_keeper(store: Store, backend: Backend, settings: Settings) -> LessonKeeper:
    """The lesson keeper and its book of active lessons (read once now, so the first request already has them)."""
    book = LessonBook(load_active(store), enabled=settings.lessons.enabled)
    book.refresh_sync()
    return LessonKeeper(store, backend, settings, book)


class LessonKeeper:
    """Finds, verifies, serves (through ``book``), retires and brings back lessons; also what the lesson and
    feedback routes call."""

    def __init__(self, store: Store, backend: Backend, settings: Settings, book: LessonBook) -> None:
        self.store = store
        self.backend = backend
        self.settings = settings
        self.book = book
        self._redactor = Redactor({*enabled_kinds(settings.store.redact), "api_key"})
        self._checked_versions: dict[str, int] | None = None  # each lesson owner's adapter's version, last check
        # A candidate's trials so far, by turn, with the served lessons they were tried beside (their r0 holds only
        # while those stay the same): each prompt is tried once per candidate.
        self._trials: dict[int, tuple[tuple[str, ...], dict[int, PromptTrial | None]]] = {}
        # Whether a lesson acts on a prompt for the frozen base model (beside the other served lessons): the
        # retirement check's filter, worked out once per prompt.
        self._acts: dict[tuple[int, tuple[str, ...]], dict[int, bool]] = {}
        self.stats: dict[str, Any] = {"found": 0, "verified": 0, "rejected": 0, "retired": 0, "returned": 0}
        self.last_error: str | None = None

    # -- what users do -----------------------------------------------------------------------------------------
    async def add(self, owner: str, text: str) -> LessonRecord:
        """A lesson the user teaches directly: active at once (no verification: the user said so)."""
        clean = self._clean(text)
        lesson_id = await asyncio.to_thread(
            self.store.add_lesson, owner, clean, status="active", origin="user", why="taught directly by the user"
        )
        await self._enforce_budget(owner, keep=lesson_id)
        await self.book.refresh()
        return await self._get(lesson_id)

    async def forget(self, lesson_id: int, owner: str | None) -> LessonRecord:
        lesson = await self._get(lesson_id, owner)
        if lesson.status == "forgotten":
            return lesson
        done = await asyncio.to_thread(
            self.store.set_lesson_status, lesson_id, "forgotten", FORGET_NOTE, text=FORGOTTEN_TEXT
        )
        await self.book.refresh()
        assert done is not None
        return done

    async def feedback(self, turn_id: int, rating: int, text: str | None, owner: str | None = None) -> dict[str, Any]:
        """Record a rating of a turn (it overrides the judge's verdict when the turn is trained); its text is the
        turn's hint and a lesson candidate of the turn's owner. ``owner``: the caller, who may rate only their own
        turns."""
        turn = await asyncio.to_thread(self.store.get_turn, turn_id)
        turn_owner = await asyncio.to_thread(self.store.turn_owner, turn_id) if turn is not None else None
        if turn is None or (owner is not None and (turn_owner or "local") != owner):
            raise LessonError(f"no turn {turn_id} of yours in the store", 404)
        clean = self._clean(text) if text and text.strip() else None
        feedback_id = await asyncio.to_thread(self.store.add_feedback, turn_id, rating, clean)
        out: dict[str, Any] = {"feedback_id": feedback_id, "turn_id": turn_id, "rating": rating, "lesson": None}
        if clean and self.settings.lessons.enabled:
            lesson = await self._candidate(turn_owner or "local", clean, origin="feedback", turn=turn)
            out["lesson"] = lesson.to_json() if lesson is not None else None
        return out

    async def get(self, lesson_id: int, owner: str | None) -> LessonRecord:
        return await self._get(lesson_id, owner)

    async def _get(self, lesson_id: int, owner: str | None = None) -> LessonRecord:
        lesson = await asyncio.to_thread(self.store.get_lesson, lesson_id)
        if lesson is None or (owner is not None and lesson.owner != owner):
            raise LessonError(f"no lesson {lesson_id}" + ("" if owner is None else " of yours"), 404)
        return lesson

    def _clean(self, text: str) -> str:
        clean = " ".join(self._redactor.redact_text(text).split())
        if not clean:
            raise LessonError("a lesson needs some text")
        if len(clean) > self.settings.lessons.max_chars:
            raise LessonError(
                f"a lesson is at most {self.settings.lessons.max_chars} characters (lessons.max_chars); "
                f"this one has {len(clean)}"
            )
        return clean

    # -- the loop -----------------------------------------------------------------------------------------------
    def start(self, stop: asyncio.Event) -> dict[str, asyncio.Task[None]]:
        """The tasks `launch` and `serve` run until ``stop``: the book's refresh (lessons changed by another process)
        and, with ``lessons.enabled``, this loop."""
        tasks = {"lesson-book": asyncio.create_task(self.book.run(stop), name="openclaw-lesson-book")}
        if self.settings.lessons.enabled:
            tasks["lessons"] = asyncio.create_task(self.run(stop), name="openclaw-lessons")
        return tasks

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                busy = await self.run_once()
            except Exception as exc:  # the loop must outlive one bad turn or a busy store
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("lesson loop round failed; trying again")
                busy = False
            if not busy:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=POLL_S)

    async def run_once(self) -> bool:
        """One round: new corrections, pending candidates, and (after a new policy version) the retirement checks.
        Returns whether it did anything."""
        busy = await self._find()
        busy = await self._verify_pending() or busy
        versions = await self._lesson_versions()
        if versions != self._checked_versions:
            self._checked_versions = versions
            busy = await self.check_retirement() or busy
        return busy

    def serving(self, owner: str) -> Backend:
        """The backend as ``owner``'s adapter sees it: a lesson is tried on, and retired by, its owner's weights."""
        return adapter_backend(self.backend, adapter_of(self.settings, owner))

    async def _lesson_versions(self) -> dict[str, int]:
        """The current version of every adapter serving an owner with an active or retired lesson."""
        owners = await asyncio.to_thread(self.store.lesson_owners, ["active", "retired"])
        adapters = {adapter_of(self.settings, owner) for owner in owners}
        return {a: adapter_backend(self.backend, a).current_version().version for a in sorted(adapters)}

    async def _find(self) -> bool:
        turns = await asyncio.to_thread(self.store.claim_ready, CONSUMER, 16, LEASE_S)
        for turn in turns:
            lesson = None
            text = _next_user_text(turn)
            if text is not None and self.settings.lessons.enabled:
                found = lesson_from_reply(text, self.settings.lessons.max_chars)
                if found is not None:
                    owner = await asyncio.to_thread(self.store.turn_owner, turn.id) or "local"
                    lesson = await self._candidate(
                        owner,
                        self._redactor.redact_text(found),
                        "correction",
                        turn,
                        correction=self._redactor.redact_text(text),
                    )
            result = '{"lesson": %s}' % (lesson.id if lesson is not None else "null")
            await asyncio.to_thread(self.store.complete, CONSUMER, turn.id, result)
        return bool(turns)

    async def _candidate(
        self, owner: str, text: str, origin: str, turn: TurnRecord, *, correction: str | None = None
    ) -> LessonRecord | None:
        """A new candidate; or, when the owner asked for the same before (the same words, or the same content
        words), that lesson with this turn as new evidence: a candidate tries it next round, a rejected one is
        re-opened at once, a retired one comes back (unless the corrected reply was served with it).
        ``correction``: the user's whole reply (redacted), which the trials' teacher reads."""
        lessons = await asyncio.to_thread(self.store.lessons, owner=owner)
        words = content_words(text)
        for lesson in lessons:
            if lesson.status == "forgotten" or not _same_lesson(lesson.text, text, words):
                continue
            if lesson.status == "active":
                return lesson
            if lesson.status == "candidate":
                await asyncio.to_thread(self.store.add_lesson_sources, lesson.id, [turn.id])
                return lesson
            if lesson.status == "rejected":
                await asyncio.to_thread(self.store.add_lesson_sources, lesson.id, [turn.id])
                return await asyncio.to_thread(
                    self.store.set_lesson_status,
                    lesson.id,
                    "candidate",
                    f"you asked for it again (turn {turn.id}): tried again on that reply",
                    expect=["rejected"],
                )
            if lesson.status == "retired":
                if lesson.id in {lesson_id for lesson_id, _ in served_lessons(turn)}:
                    # The corrected reply was served with it (it retired meanwhile): no sign that it is missing.
                    why = f"the user corrected turn {turn.id}, served while it was active: it stays retired"
                    await self._note(lesson, why, {})
                    return lesson
                back = await asyncio.to_thread(
                    self.store.set_lesson_status,
                    lesson.id,
                    "active",
                    f"the user corrected the same thing again (turn {turn.id}): back in the prompt",
                    data={"returned": True, "returns": returns_of(lesson) + 1},
                    expect=["retired"],
                )
                self.stats["returned"] += 1
                await self._enforce_budget(owner, keep=lesson.id)
                await self.book.refresh()
                return back
        lesson_id = await asyncio.to_thread(
            self.store.add_lesson,
            owner,
            text,
            status="candidate",
            origin=origin,
            source_turn_ids=[turn.id],
            why=f"the user's {'feedback' if origin == 'feedback' else 'reply'} to turn {turn.id}",
            data={"correction": correction or text},
        )
        self.stats["found"] += 1
        log.info("lesson %d (candidate) from turn %d: %r", lesson_id, turn.id, text)
        return await self._get(lesson_id)

    async def _verify_pending(self) -> bool:
        candidates = await asyncio.to_thread(self.store.lessons, statuses=["candidate"])
        busy = False
        for lesson in candidates:
            busy = await self.verify(lesson) or busy
        return busy

    async def _untried_prompts(self, lesson: LessonRecord, tried: dict[int, PromptTrial | None]) -> list[TurnRecord]:
        """Up to ``lessons.verify_prompts`` prompts the candidate has not been tried on: the turns its corrections
        answered first (where it must change the answer), then the owner's newest other main-line turns."""
        cfg = self.settings.lessons
        recent = await asyncio.to_thread(self.store.owner_turns, lesson.owner, 8 * cfg.verify_prompts)
        by_id = {turn.id: turn for turn in recent}  # most answered turns are recent: read only the older ones
        answered = [
            turn
            for turn_id in sorted(set(lesson.source_turn_ids), reverse=True)
            if (turn := by_id.get(turn_id) or await asyncio.to_thread(self.store.get_turn, turn_id)) is not None
        ]
        # Not a conversation that already holds a correction of form: its reply follows that correction, so it
        # cannot show what this lesson does (measured: such a turn's short reply made a candidate look implausible).
        others = [
            t for t in recent if not _told_in_context(t) and all(_usable_prompt(t, source) for source in answered)
        ]
        return [t for t in [*answered, *others] if t.id not in tried][: cfg.verify_prompts]

    async def verify(self, lesson: LessonRecord) -> bool:
        """Try one candidate on prompts it has not been tried on yet (in place of its rivals: active lessons of the
        same kind), and decide on every trial so far (see :func:`~openclaw_cli.learn.lesson_checks.decide`).
        Returns whether it tried any."""
        served = tuple(a.text for a in self.book.for_owner(lesson.owner))
        known, tried = self._trials.get(lesson.id, (served, {}))
        if known != served:
            tried = {}  # the served lessons changed: the earlier trials' "as served" replies no longer hold
        prompts = await self._untried_prompts(lesson, tried)
        if not prompts:
            return False  # nothing (new) to try it on yet
        rivals = await self._rivals(lesson, served)
        started = time.monotonic()
        new = await try_candidate(
            self.serving(lesson.owner),
            lesson.text,
            _correction_of(lesson),
            prompts,
            served,
            max_tokens=self.settings.lessons.verify_max_tokens,
            corrected_turns=lesson.source_turn_ids,
            replacing=[rival.text for rival in rivals],
            guards=[_correction_of(rival) for rival in rivals],
        )
        tried.update({turn.id: None for turn in prompts})  # one that could not be tried is not tried again
        tried.update({trial.turn_id: trial for trial in new})
        self._trials[lesson.id] = (served, tried)
        result = decide([t for t in tried.values() if t is not None])
        data = {"verification": result.to_json(), "seconds": round(time.monotonic() - started, 1)}
        if rivals:
            data["replacing"] = [rival.id for rival in rivals]
        await self._settle(lesson, result, data, rivals, len(tried))
        return True

    async def _settle(
        self, lesson: LessonRecord, result: Verification, data: dict[str, Any], rivals: list[LessonRecord], tried: int
    ) -> None:
        """Act on a candidate's verification: activate it (its rivals leave), merge it, reject it, or note it."""
        if result.outcome == "verified":
            why = result.why
            if rivals:
                why += f", in place of lesson {', '.join(str(r.id) for r in rivals)}: the same wish in newer words"
            await asyncio.to_thread(
                self.store.set_lesson_status, lesson.id, "active", why, data=data, expect=["candidate"]
            )
            for rival in rivals:
                await asyncio.to_thread(
                    self.store.set_lesson_status,
                    rival.id,
                    "rejected",
                    f"replaced by lesson {lesson.id}: your newer words for the same wish did better where they act",
                    data={"replaced_by": lesson.id},
                    expect=["active"],
                )
            self.stats["verified"] += 1
            self._trials.pop(lesson.id, None)
            await self._enforce_budget(lesson.owner, keep=lesson.id)
            await self.book.refresh()
            log.info("lesson %d active: %s", lesson.id, why)
        elif result.outcome == "duplicate":
            await self._merge(lesson, data, rivals)
            self._trials.pop(lesson.id, None)
        elif result.outcome == "rejected" or tried >= MAX_QUIET_PROMPTS:
            why = result.why
            if result.outcome != "rejected":
                why = f"it made no difference on any of the {tried} prompts tried: nothing here for it to change"
            await asyncio.to_thread(
                self.store.set_lesson_status, lesson.id, "rejected", why, data=data, expect=["candidate"]
            )
            self.stats["rejected"] += 1
            log.info("lesson %d rejected: %s", lesson.id, why)
        else:
            await asyncio.to_thread(self.store.note_lesson, lesson.id, f"not verified yet: {result.why}", data)

    async def _rivals(self, lesson: LessonRecord, served: tuple[str, ...]) -> list[LessonRecord]:
        """The owner's active lessons (served now) about the same thing as ``lesson`` (:func:`form_kinds`): the
        candidate is tried in place of them, since the user's newer words for a wish supersede the older ones."""
        kinds = form_kinds(lesson.text)
        if not kinds:
            return []
        active = await asyncio.to_thread(self.store.lessons, owner=lesson.owner, statuses=["active"])
        return [a for a in active if a.id != lesson.id and a.text in served and kinds & form_kinds(a.text)]

    async def _merge(self, lesson: LessonRecord, data: dict[str, Any], rivals: list[LessonRecord]) -> None:
        active = rivals or await asyncio.to_thread(self.store.lessons, owner=lesson.owner, statuses=["active"])
        words = content_words(lesson.text)
        into = max(active, key=lambda a: len(content_words(a.text) & words), default=None)
        why = "it changes no reply beyond the lessons served already"
        if into is not None:
            why += f": merged into lesson {into.id}"
            await asyncio.to_thread(
                self.store.note_lesson,
                into.id,
                f"the user asked for it again (lesson {lesson.id}, turns {lesson.source_turn_ids})",
            )
        await asyncio.to_thread(
            self.store.set_lesson_status, lesson.id, "rejected", why, data=data, expect=["candidate"]
        )
        self.stats["rejected"] += 1

    async def _enforce_budget(self, owner: str, *, keep: int) -> None:
        active = await asyncio.to_thread(self.store.lessons, owner=owner, statuses=["active"])
        excess = len(active) - self.settings.lessons.max_active
        for lesson in [a for a in active if a.id != keep][: max(0, excess)]:
            await asyncio.to_thread(
                self.store.set_lesson_status,
                lesson.id,
                "retired",
                f"more than lessons.max_active = {self.settings.lessons.max_active} active lessons: the oldest leaves",
                expect=["active"],
            )

    async def check_retirement(self) -> bool:
        """After a new policy version: measure what every active and retired lesson (with at least
        ``lessons.min_shaped`` turns shaped) still adds to the current policy on prompts where it acts
        (:func:`~openclaw_cli.learn.lesson_checks.lesson_effect`); retire the learned ones after enough passing
        checks in a row (:func:`checks_to_retire`), bring back the slipped ones. Returns whether any was checked."""
        cfg = self.settings.lessons
        lessons = await asyncio.to_thread(self.store.lessons, statuses=["active", "retired"])
        changed = checked = False
        for lesson in lessons:
            if lesson.uses < cfg.min_shaped:
                continue
            version = self.serving(lesson.owner).current_version().version
            others = tuple(a.text for a in self.book.for_owner(lesson.owner) if a.id != lesson.id)
            prompts = await self._acting_prompts(lesson, others)
            if len(prompts) < cfg.verify_prompts:
                if lesson.status != "active":
                    continue
                await self._note(
                    lesson,
                    f"too few untrained prompts where it acts to judge ({len(prompts)} of {cfg.verify_prompts})",
                    {"check": "few", "policy_version": version, "acting_prompts": len(prompts)},
                )
                continue
            measured = await lesson_effect(
                self.serving(lesson.owner),
                lesson.text,
                _correction_of(lesson),
                prompts[: cfg.verify_prompts],
                others,
                max_tokens=cfg.verify_max_tokens,
            )
            if measured is None:
                continue
            checked = True
            effect, trials = measured
            passed = effect <= cfg.retire_gap
            data = {
                "effect": round(effect, 3),
                "check": "pass" if passed else "fail",
                "policy_version": version,
                "returns": returns_of(lesson),
                "trials": [t.to_json() for t in trials],
            }
            if lesson.status == "active":
                changed = await self._judge_active(lesson, effect, passed, version, data) or changed
            elif effect > cfg.return_gap:
                why = f"slipped: its effect grew to {effect:.2f} nats (> lessons.return_gap {cfg.return_gap})"
                await asyncio.to_thread(
                    self.store.set_lesson_status,
                    lesson.id,
                    "active",
                    why,
                    data={**data, "returned": True, "returns": returns_of(lesson) + 1},
                    expect=["retired"],
                )
                self.stats["returned"] += 1
                changed = True
            else:
                await self._note(lesson, f"effect {effect:.2f} nats: still learned", data)
        if changed:
            await self.book.refresh()
        return checked

    async def _judge_active(
        self, lesson: LessonRecord, effect: float, passed: bool, version: int, data: dict[str, Any]
    ) -> bool:
        """Record an active lesson's check; retire it once enough checks in a row passed. Returns whether it
        retired."""
        cfg = self.settings.lessons
        streak = passing_streak(lesson) + 1 if passed else 0
        needed = checks_to_retire(lesson, cfg.retire_checks)
        if streak < needed:
            what = f"passing check {streak} of {needed} in a row" if passed else "not learned yet"
            await self._note(lesson, f"effect {effect:.2f} nats: {what}", data)
            return False
        why = (
            f"learned: {needed} checks in a row, the last on {len(data['trials'])} untrained prompts where it acts, "
            f"found the policy without it answering about as it does with it (effect {effect:.2f} nats <= "
            f"lessons.retire_gap {cfg.retire_gap})"
        )
        await asyncio.to_thread(self.store.set_lesson_status, lesson.id, "retired", why, data=data, expect=["active"])
        self.stats["retired"] += 1
        log.info("lesson %d retired at version %d (effect %.2f)", lesson.id, version, effect)
        return True

    async def _note(self, lesson: LessonRecord, why: str, data: dict[str, Any]) -> None:
        """Evidence that changes no status, with the lesson's count of returns carried (so it outlives the evidence
        kept); the same "too few prompts" again is not written twice in a row (the evidence keeps its newest entries,
        and a quiet owner would fill it with that line)."""
        last = lesson.evidence[-1] if lesson.evidence else {}
        if data.get("check") == "few" and last.get("why") == why:
            return
        await asyncio.to_thread(self.store.note_lesson, lesson.id, why, {**data, "returns": returns_of(lesson)})

    async def _acting_prompts(self, lesson: LessonRecord, others: tuple[str, ...]) -> list[TurnRecord]:
        """The owner's newest prompts that the trainer has not trained on, whose conversation holds no correction of
        form, and on which the lesson acts for the frozen base model (its trial there is ``helped``), newest first.
        Each prompt's base trial is run once (at most ``2 * lessons.verify_prompts`` new ones a check)."""
        cfg = self.settings.lessons
        recent = await asyncio.to_thread(
            self.store.owner_turns,
            lesson.owner,
            8 * cfg.verify_prompts,
            not_done_by=trainer_consumer(adapter_of(self.settings, lesson.owner)),
        )
        prompts = [turn for turn in recent if not _told_in_context(turn)]
        known = self._acts.get((lesson.id, others), {})
        # Only the prompts still in the window are kept: the cache stays as small as the window.
        acts = self._acts[(lesson.id, others)] = {t.id: known[t.id] for t in prompts if t.id in known}
        fresh = [turn for turn in prompts if turn.id not in acts][: 2 * cfg.verify_prompts]
        found = await asyncio.gather(
            *(
                try_prompt(
                    self.serving(lesson.owner), turn, others, lesson.text, _correction_of(lesson), cfg.verify_max_tokens
                )
                for turn in fresh
            )
        )
        for turn, trial in zip(fresh, found, strict=True):
            acts[turn.id] = trial is not None and trial.verdict == "helped"
        return [turn for turn in prompts if acts.get(turn.id)]

    def status(self) -> dict[str, Any]:
        """For /v1/openclaw/status and the dashboard: counts by status and the active lessons (blocking read)."""
        active = [
            {"id": lesson.id, "owner": lesson.owner, "text": lesson.text, "uses": lesson.uses}
            for lesson in self.store.lessons(statuses=["active"])
        ]
        return {"counts": self.store.lesson_counts(), "active": active, **self.stats, "last_error": self.last_error}


def passing_streak(lesson: LessonRecord) -> int:
    """Passing retirement checks in a row at the end of the lesson's evidence (a check with too few prompts neither
    counts nor breaks it; a failing check, a change of status or the user asking again ends it)."""
    streak = 0
    for entry in reversed(lesson.evidence):
        check = entry.get("check")
        if check == "few":
            continue
        if check != "pass" or entry.get("status") != lesson.status:
            break
        streak += 1
    return streak


def checks_to_retire(lesson: LessonRecord, per_round: int) -> int:
    """Passing checks in a row a lesson needs to retire: ``lessons.retire_checks``, and as many more for each time
    it came back (hysteresis: a lesson that retired too early once must show more before it leaves again)."""
    return per_round * (1 + returns_of(lesson))


def returns_of(lesson: LessonRecord) -> int:
    """How often the lesson came back after retiring (every check and return records the count, so it outlives the
    evidence kept)."""
    return max((int(entry.get("returns", 0)) for entry in lesson.evidence), default=0)


def _correction_of(lesson: LessonRecord) -> str:
    """The user's whole correction the lesson came from (what verification's teacher reads), else its text."""
    first = lesson.evidence[0] if lesson.evidence else {}
    return str(first.get("correction") or lesson.text)


def _same_lesson(known: str, text: str, words: set[str]) -> bool:
    """The same words again (case and punctuation aside), or the same content words when it has any."""
    if " ".join(_WORDS.findall(known.lower())) == " ".join(_WORDS.findall(text.lower())):
        return True
    return bool(words) and content_words(known) == words


def _told_in_context(turn: TurnRecord) -> bool:
    """Whether a user message of the turn's conversation already corrects the form of answers (its plain reply then
    follows the conversation, not the weights: no prompt to judge what the weights learned)."""
    return any(is_form_correction(flatten_content(m.get("content"))) for m in turn.messages if m.get("role") == "user")


def _next_user_text(turn: TurnRecord) -> str | None:
    """The user's message that followed the turn, when its next state is one."""
    if not turn.next_state or turn.next_state_role != "user":
        return None
    users = [m for m in turn.next_state if m.get("role") == "user"]
    return flatten_content(users[-1].get("content")) if users else None


def _usable_prompt(turn: TurnRecord, source: TurnRecord | None) -> bool:
    """A prompt to verify on: not the corrected turn, and not a later turn of the same conversation (its history
    already holds the correction, so its plain reply follows it)."""
    if source is None:
        return True
    if turn.id == source.id:
        return False
    return not (turn.session_id == source.session_id and turn.id > source.id)
