"""Does the bot internalize a correction? Train with the defaults, then ask held-out questions without it.

    python bench/learning.py [--minutes 8] [--seeds 0 1 2] [--judge policy|scripted] [--control] [--plot-dir DIR]
                             [--script bench/scripts/brevity.json]

Each run (a seed, or the control) is one process on the real pieces (a run's memory is not all given back when it
ends: four runs in one process were killed for memory on a 24 GB machine), with ``Settings()`` defaults (nothing
tuned here): the local backend with the embedded SmolLM2-135M-Instruct, the proxy with capture into a temporary
SQLite store (uvicorn on 127.0.0.1), the judge loop with the policy judging itself (``make_judge_client``;
``judge.mode = auto``), the trainer loop and the publisher ``openclaw launch`` uses (collapse guard).

Scripted users (a :class:`Script`, ``--script FILE``; default ``bench/scripts/brevity.json``) ask the training
questions over the OpenAI API with an ``X-Session-Id`` and want brevity: a reply over ``--max-words`` words gets the
script's correction, a short one that misses the point gets its "wrong" line, a good one gets thanks and the next
question. Per training step the script prints the judge's mean reward and the share of good replies (the users' own
rule); after each run, how the judge scored that run's turns by what the user replied (correction, "wrong", thanks).

The learning claim is measured on the script's held-out questions, never asked in training, at temperature 0: before
training plain and *told* (the script's instruction added to the question), and after training plain.
Pass: after-training plain replies at least 40% shorter than before and at most 1.2x the told model's length;
keyword-hit rate at least the told model's minus 0.10; distinct-word ratio at least 0.5. ``--judge scripted`` swaps
the judge for a rule that reads the users' reactions (the control: does training learn when the signal is right? For
``opd`` it also sets ``judge.next_state_hints = "unhappy"``, so exactly the corrected turns get the user's words as
the hint);
``--control`` runs it beside the first seed.

Lessons (docs/lessons.md) run as in ``openclaw launch``. Over each run the held-out questions are also asked through
the proxy at 0, 1, 2, 5, 10 and 20 minutes, 60 and 110 s after the first correction of form, and after the last step,
as the user gets them (with lessons) and plain (``x-openclaw-lessons: off``), opted out of capture; the run reports
the first correction's minute, every change of the lesson's status, and whether served replies met the told model's
length x1.3 (hits at least its minus 0.10) within 2 minutes of the first correction and after the lesson retired. A
measurement counts at the minute its requests went out (the proxy picks a request's lessons when it arrives); its
replies come back 40-60 s later while training runs. ``--plot-dir`` writes each run's reward-over-steps PNG
(the plot ``openclaw eval --plot`` draws), the served and plain timeline (``lessons-*.png``) and every held-out reply
before, told and after (``held-out-*.json``), to read which answers a run lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from loopback import serve_on_loopback

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@dataclass(frozen=True)
class Opening:
    """A question a user asks before any other (one whose answer is short anyway, say), and what they reply to it
    whatever the answer: a fact correction, or thanks when ``reply`` is None."""

    question: str
    keys: tuple[str, ...]
    reply: str | None = None


@dataclass(frozen=True)
class Script:
    """What the scripted users say and ask (a JSON file in ``bench/scripts``, ``--script``): the system prompt; the
    instruction a *told* question carries; the correction (a reply too long), "wrong" (short, but no keyword) and
    thanks lines; and the training and held-out questions, each with the words (lower case) one of which a right
    answer contains: a short reply must also answer, else "The answer is:" would satisfy the user and the policy
    learns exactly that (seen in an earlier run). Held-out questions are asked only before and after training, never
    by the users: the learning claim is measured on them.

    Optional, so that no single user shapes the rules: ``corrections`` (the same wish in other words, taken in turn
    instead of ``correction``); ``correct_share`` (the share of long replies corrected; the others get ``move_on``);
    ``opening`` (questions each user asks first, with the reply they get whatever the answer, e.g. a fact
    correction); ``fact_corrections`` (per training question, what the user says to a short reply that misses the
    point, instead of ``wrong``)."""

    system: str
    instruction: str
    correction: str
    wrong: str
    thanks: str  # with {question}: the next question follows the thanks
    questions: dict[str, tuple[str, ...]]
    held_out: dict[str, tuple[str, ...]]
    corrections: tuple[str, ...] = ()
    correct_share: float = 1.0
    move_on: str = "OK. Next question: {question}"
    opening: tuple[Opening, ...] = ()
    fact_corrections: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Script:
        data = json.loads(path.read_text())
        data.pop("about", None)
        for key in ("questions", "held_out"):
            data[key] = {question: tuple(words) for question, words in data[key].items()}
        data["corrections"] = tuple(data.get("corrections", ()))
        data["opening"] = tuple(
            Opening(item["question"], tuple(item["keys"]), item.get("reply")) for item in data.get("opening", ())
        )
        asked = set(data["questions"]) | {item.question for item in data["opening"]}
        if asked & set(data["held_out"]):
            raise SystemExit(f"{path}: a held-out question is also a training question")
        if set(data.get("fact_corrections", {})) - set(data["questions"]):
            raise SystemExit(f"{path}: a fact correction names a question the users never ask")
        return cls(**data)

    @property
    def form_corrections(self) -> tuple[str, ...]:
        return self.corrections or (self.correction,)

    @property
    def fact_lines(self) -> tuple[str, ...]:
        """Every line of the script that corrects a fact (or says "wrong"): none may become a lesson."""
        openings = tuple(item.reply for item in self.opening if item.reply)
        return (self.wrong, *openings, *self.fact_corrections.values())


SCRIPT = Script.load(SCRIPTS / "brevity.json")  # --script replaces it (in main, before any run)


class ScriptedRewardJudge:
    """The control (``--judge scripted``): a judge that reads the user's reaction exactly as the users script it,
    so the run shows whether the trainer learns from a correct reward, independent of judge quality."""

    name = "scripted(next state)"

    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        text = str(messages[-1].get("content", ""))
        # Only the next-state part of the judge prompt: the context above it may quote an earlier correction.
        marker = text.rfind("## Next state")
        next_state = text[marker:] if marker >= 0 else text
        reaction = user_reaction(next_state)
        if reaction in ("correction", "wrong"):
            return "The user corrects the reply. \\boxed{-1}"
        if reaction == "thanks":
            return "The user moves on. \\boxed{1}"
        return "\\boxed{0}"


def word_count(text: str) -> int:
    return len(text.split())


def names_a_key_word(reply: str, keys: tuple[str, ...]) -> bool:
    """Whether ``reply`` holds one of a question's key words (lower case): the keyword hit the users and the hit
    rates judge by."""
    return any(word in reply.lower() for word in keys)


@dataclass
class Observed:
    """Every reply the users got: (time, short enough and answering the question?)."""

    replies: list[tuple[float, bool]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the replies themselves, to eyeball
    first_correction_at: float | None = None  # when a user first sent the correction

    def share_short(self, since: float, until: float) -> tuple[float | None, int]:
        window = [ok for t, ok in self.replies if since <= t < until]
        return (sum(window) / len(window) if window else None), len(window)


async def chat_turn(
    client: Any, session: str, messages: list[dict[str, str]], args: argparse.Namespace, who: str
) -> str | None:
    """One main-line turn of a scripted user's session: the reply's text, or None (said, after a pause) when the
    request failed."""
    body = {"model": "policy", "messages": messages, "max_tokens": args.max_tokens, "temperature": 0.8}
    response = await client.post(
        "/v1/chat/completions", json=body, headers={"X-Session-Id": session, "X-Turn-Type": "main"}
    )
    if response.status_code != 200:
        print(f"  {who}: request failed {response.status_code}: {response.text[:200]}")
        await asyncio.sleep(1)
        return None
    return str(response.json()["choices"][0]["message"].get("content") or "")


async def scripted_user(
    client: Any, user: int, args: argparse.Namespace, observed: Observed, stop: asyncio.Event
) -> None:
    rng = random.Random(args.seed * 1000 + user)
    opening = list(SCRIPT.opening)
    asked_for_form = 0  # which of the script's wordings of the wish comes next
    while not stop.is_set():
        session = f"user{user}-{uuid.uuid4().hex[:8]}"
        first = opening.pop(0) if opening else None
        question = first.question if first else rng.choice(list(SCRIPT.questions))
        messages = [{"role": "system", "content": SCRIPT.system}, {"role": "user", "content": question}]
        for _ in range(args.turns):
            if stop.is_set():
                return
            reply = await chat_turn(client, session, messages, args, f"user {user}")
            if reply is None:
                break
            keys = first.keys if first else SCRIPT.questions[question]
            short = word_count(reply) <= args.max_words
            answers = names_a_key_word(reply, keys)
            observed.replies.append((time.time(), short and answers))
            observed.texts.append(reply)
            next_question = rng.choice(list(SCRIPT.questions))
            if first is not None:  # the opening question: its fixed reply, then on to the usual questions
                follow_up = (
                    f"{first.reply} Next question: {next_question}"
                    if first.reply
                    else SCRIPT.thanks.format(question=next_question)
                )
                question, first = next_question, None
            elif not short and rng.random() < SCRIPT.correct_share:
                follow_up = SCRIPT.form_corrections[asked_for_form % len(SCRIPT.form_corrections)]
                asked_for_form += 1
                if observed.first_correction_at is None:
                    observed.first_correction_at = time.time()
            elif not short:
                follow_up = SCRIPT.move_on.format(question=next_question)
                question = next_question
            elif not answers:
                follow_up = SCRIPT.fact_corrections.get(question, SCRIPT.wrong)
            else:
                follow_up = SCRIPT.thanks.format(question=next_question)
                question = next_question
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]


def build_settings(args: argparse.Namespace, work: Path, seed: int) -> Any:
    """``Settings()`` defaults (unless ``--set``); only where things are written, the seed, and the model name the users
    send are fixed here."""
    from openclaw_cli.settings import Settings, parse_overrides

    model = None if args.model == "smollm2" else args.model
    overrides = parse_overrides(args.set or [])  # --set: try other settings against the defaults
    return Settings(
        **{
            **overrides,
            "model": model,
            "store": {"path": work / "store.sqlite3"},
            "local": {**overrides.get("local", {}), "state_dir": work / "ckpt", "seed": seed},
            "proxy": {**overrides.get("proxy", {}), "accept_any_model": True},
        }
    )


def _seconds(seconds: Any) -> str:
    """Where the step's time went, as the trainer recorded it."""
    if not isinstance(seconds, dict):
        return "n/a"
    return "/".join(f"{seconds.get(key, 0):.1f}" for key in ("score", "train", "publish"))


def _fmt(value: Any, pattern: str) -> str:
    return "   n/a" if value is None else pattern.format(value)


async def report_steps(store: Any, observed: Observed, started: float, stop: asyncio.Event) -> list[tuple]:
    """Print each new training step as it lands; returns (step, reward, share good, n replies) rows."""
    rows: list[tuple] = []
    printed = 0
    last_time = started
    print(
        f"{'step':>5}{'version':>8}{'t (s)':>8}{'reward':>9}{'good %':>9}{'replies':>9}{'loss':>10}"
        f"{'samples':>9}{'demos':>7}{'replay':>8}{'loops':>7}  {'s score/train/publish':>22}"
    )
    while True:
        steps = await asyncio.to_thread(store.steps)
        for step, version, created_at, metrics in steps[printed:]:
            share, n = observed.share_short(last_time, created_at)
            reward = metrics.get("mean_reward")
            print(
                f"{step:>5}{version if version is not None else '-':>8}{created_at - started:>8.0f}"
                f"{_fmt(reward, '{:>+9.2f}')}{_fmt(None if share is None else 100 * share, '{:>9.0f}')}{n:>9}"
                f"{_fmt(metrics.get('loss'), '{:>10.4f}')}{metrics.get('n_samples', 0):>9}"
                f"{metrics.get('demos', 0):>7}{metrics.get('replayed_demos', 0):>8}{metrics.get('loops', 0):>7}"
                f"  {_seconds(metrics.get('seconds')):>22}"
            )
            rows.append((step, reward, share, n))
            last_time = created_at
        printed = len(steps)
        if stop.is_set():
            return rows
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)


def summarize(observed: Observed, rows: list[tuple], started: float, ended: float) -> None:
    third = (ended - started) / 3
    first, n_first = observed.share_short(started, started + third)
    last, n_last = observed.share_short(ended - third, ended + 1)
    rewards = [r for _, r, _, _ in rows if r is not None]
    print()
    print(f"steps: {len(rows)}, replies: {len(observed.replies)}; the first and last replies:")
    for text in [*observed.texts[:3], "...", *observed.texts[-3:]]:
        print(f"  {text!r}" if text != "..." else "  ...")
    if first is not None and last is not None:
        print(
            f"good replies: first third {100 * first:.0f}% (n={n_first}) -> last third {100 * last:.0f}% (n={n_last})"
        )
    if rewards:
        half = max(1, len(rewards) // 2)
        early, late = rewards[:half], rewards[half:] or rewards[-1:]
        early_mean, late_mean = sum(early) / len(early), sum(late) / len(late)
        print(f"judge reward: first half of steps {early_mean:+.2f} -> second half {late_mean:+.2f}")
    else:
        print("no step recorded a reward (nothing was judged ±1, or no step ran): see the judge/trainer stats above")


def user_reaction(next_text: str) -> str | None:
    """Which of the script's lines a next state is (``correction``, ``wrong`` or ``thanks``), else None."""
    if any(line in next_text for line in SCRIPT.form_corrections):
        return "correction"
    if any(line in next_text for line in SCRIPT.fact_lines):
        return "wrong"
    if any(line.split("{", 1)[0] in next_text for line in (SCRIPT.thanks, SCRIPT.move_on)):
        return "thanks"
    return None


def judge_readout(scored: list[tuple[str, float]]) -> dict[str, dict[str, float]]:
    """How the judge scored each kind of user reaction in a run: ``(reaction, score)`` pairs -> per reaction the
    count and the shares scored below 0, exactly 0 (masked under the margin) and above 0."""
    table: dict[str, dict[str, float]] = {}
    for reaction in ("correction", "wrong", "thanks"):
        scores = [score for kind, score in scored if kind == reaction]
        if scores:
            table[reaction] = {
                "n": len(scores),
                "negative": sum(s < 0 for s in scores) / len(scores),
                "masked": sum(s == 0 for s in scores) / len(scores),
                "positive": sum(s > 0 for s in scores) / len(scores),
            }
    return table


def judged_reactions(store: Any) -> list[tuple[str, float]]:
    """``(reaction, score)`` for every main-line turn the judge scored whose next state is one of the script's lines:
    the judge's accuracy on this run's own turns (the users know what they meant)."""
    from openclaw_cli.learn.judge import JUDGE_CONSUMER
    from openclaw_cli.tokenizer import flatten_content

    pairs = []
    for turn in store.iter_turns(turn_type="main"):
        verdict = store.result_of(JUDGE_CONSUMER, turn.id)
        score = verdict.get("score") if isinstance(verdict, dict) else None
        text = " ".join(flatten_content(m.get("content")) for m in turn.next_state or [])
        reaction = user_reaction(text)
        if reaction is not None and isinstance(score, int | float):
            pairs.append((reaction, float(score)))
    return pairs


def print_judge_readout(table: dict[str, dict[str, float]]) -> None:
    if not table:
        print("judge on this run's turns: nothing judged")
        return
    parts = [
        f"{reaction} n={int(row['n'])}: {100 * row['negative']:.0f}% < 0, {100 * row['masked']:.0f}% masked, "
        f"{100 * row['positive']:.0f}% > 0"
        for reaction, row in table.items()
    ]
    print("judge on this run's turns (by the user's reply): " + "; ".join(parts))


@dataclass
class HeldOut:
    """Replies to the held-out questions (temperature 0) and their measures."""

    replies: list[str]
    words: float  # mean words per reply
    hits: float  # share naming one of the question's key words
    distinct: float  # mean distinct-word ratio

    @classmethod
    def of(cls, replies: list[str]) -> HeldOut:
        from openclaw_cli.learn.collapse_guard import distinct_ratio

        keys = list(SCRIPT.held_out.values())
        hits = [names_a_key_word(r, ks) for r, ks in zip(replies, keys, strict=True)]
        return cls(
            replies,
            sum(word_count(r) for r in replies) / len(replies),
            sum(hits) / len(hits),
            sum(distinct_ratio(r) for r in replies) / len(replies),
        )


async def ask_held_out(
    backend: Any, *, told: bool, max_tokens: int, version: int | None = None, lessons: tuple[str, ...] = ()
) -> HeldOut:
    """Every held-out question, greedy, plain or with the user's instruction added; with ``lessons`` placed as the
    proxy serves them."""
    from openclaw_cli.lesson_prompt import with_lessons
    from openclaw_cli.types import SamplingParams

    tokenizer = backend.tokenizer()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    replies = []
    for question in SCRIPT.held_out:
        text = f"{question} {SCRIPT.instruction}" if told else question
        messages = [{"role": "system", "content": SCRIPT.system}, {"role": "user", "content": text}]
        prompt = tokenizer.render(with_lessons(messages, lessons))
        result = await backend.sample(prompt, params, version=version)
        replies.append(result.text.strip())
    return HeldOut.of(replies)


TIMELINE_MINUTES = (0, 1, 2, 5, 10, 20)
MAX_RETIREMENTS = 2  # in one run: more is a lesson flapping
# Measured again this long after the users' first correction of form: a measurement takes 40-60 s while training
# runs, so one of them is sent within 2 minutes of it whatever the fixed marks do.
AFTER_FIRST_CORRECTION_S = (60.0, 110.0)
# Held-out requests through the proxy are opted out of capture: they are never stored, judged, trained on, or a
# lesson's source, but are served with the owner's lessons as any request (opt-out stops capture, not service).
HELD_OUT_HEADERS = {"X-OpenClaw-Opt-Out": "1", "X-Turn-Type": "main"}


async def ask_held_out_served(http: Any, *, lessons: bool, max_tokens: int) -> tuple[HeldOut, str]:
    """Every held-out question through the proxy, greedy, as the user gets it (``lessons``) or plain
    (``x-openclaw-lessons: off``), all at once (the sampler batches them); and the lesson ids that shaped them."""
    headers = {**HELD_OUT_HEADERS, **({} if lessons else {"x-openclaw-lessons": "off"})}

    async def one(question: str) -> tuple[str, str]:
        messages = [{"role": "system", "content": SCRIPT.system}, {"role": "user", "content": question}]
        body = {"model": "policy", "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
        response = await http.post("/v1/chat/completions", json=body, headers=headers)
        response.raise_for_status()
        text = response.json()["choices"][0]["message"].get("content") or ""
        return text.strip(), response.headers.get("x-openclaw-lessons", "none")

    answers = await asyncio.gather(*(one(question) for question in SCRIPT.held_out))
    shaped = sorted({ids for _, ids in answers})
    return HeldOut.of([text for text, _ in answers]), "+".join(shaped)


@dataclass
class TimelinePoint:
    """One measurement. ``sent``: the minute (since the run started) its requests went out, all at once, which is
    when the proxy chose the lessons that shaped them; ``minute``: when the last reply came back (40-60 s later while
    training runs)."""

    minute: float
    version: int
    served: HeldOut
    plain: HeldOut
    lessons: str  # the lesson ids that shaped the served replies ("none" when none)
    sent: float


async def measure_point(http: Any, backend: Any, started: float, max_tokens: int) -> TimelinePoint:
    """The held-out questions served and plain, now."""
    version = backend.current_version().version
    sent = round((time.time() - started) / 60, 2)
    (served, lessons), (plain, _) = await asyncio.gather(
        ask_held_out_served(http, lessons=True, max_tokens=max_tokens),
        ask_held_out_served(http, lessons=False, max_tokens=max_tokens),
    )
    point = TimelinePoint(round((time.time() - started) / 60, 2), version, served, plain, lessons, sent)
    print(
        f"  held-out sent at {sent:5.2f} min, answered by {point.minute:5.2f} (version {version}): served "
        f"{served.words:5.1f} words, hits {served.hits:.2f} (lessons {lessons}); plain {plain.words:5.1f} words, "
        f"hits {plain.hits:.2f}"
    )
    return point


async def measure_timeline(
    http: Any,
    backend: Any,
    started: float,
    minutes: float,
    max_tokens: int,
    stop: asyncio.Event,
    observed: Observed,
) -> list[TimelinePoint]:
    """The held-out questions served and plain at each of :data:`TIMELINE_MINUTES` after 0 inside the run, and at
    each of :data:`AFTER_FIRST_CORRECTION_S` after the users' first correction of form (so a run whose first
    correction comes late is still measured within 2 minutes of it)."""
    marks = [started + m * 60 for m in TIMELINE_MINUTES if 0 < m < minutes]
    follow_ups: list[float] | None = None
    points: list[TimelinePoint] = []
    while not stop.is_set():
        corrected = observed.first_correction_at
        if follow_ups is None and corrected is not None:
            follow_ups = [corrected + after for after in AFTER_FIRST_CORRECTION_S]
        due = [*marks, *(follow_ups or [])]
        if not due:
            break
        now = time.time()
        if min(due) > now:
            with contextlib.suppress(TimeoutError):  # a short wait: the first correction may come meanwhile
                await asyncio.wait_for(stop.wait(), timeout=min(min(due) - now, 5.0))
            continue
        marks = [mark for mark in marks if mark > now]
        if follow_ups:
            follow_ups = [mark for mark in follow_ups if mark > now]
        points.append(await measure_point(http, backend, started, max_tokens))
    return points


def lesson_events(store: Any, started: float) -> list[dict[str, Any]]:
    """Every lesson's status changes, in minutes since the run started."""
    events = []
    for lesson in store.lessons():
        for entry in lesson.evidence:
            if entry.get("status") != (events[-1]["status"] if events and events[-1]["id"] == lesson.id else None):
                events.append(
                    {
                        "id": lesson.id,
                        "minute": round((entry["at"] - started) / 60, 2),
                        "status": entry["status"],
                        "why": entry.get("why", ""),
                        "text": lesson.text,
                        "correction": (lesson.evidence[0].get("correction") or "") if lesson.evidence else "",
                    }
                )
    return events


@dataclass
class RunResult:
    seed: int
    judge: str
    after: HeldOut
    steps: int
    held_back: int
    minutes: float
    rows: list[tuple] = field(default_factory=list)
    timeline: list[TimelinePoint] = field(default_factory=list)
    lessons: list[dict[str, Any]] = field(default_factory=list)
    first_correction_minute: float | None = None


async def train_once(args: argparse.Namespace, seed: int, judge_kind: str, plot_dir: Path | None) -> RunResult:
    """One run from the base model: users + judge + trainer for ``--minutes``, then the held-out questions."""
    import httpx

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.capture.sessions import SessionCapture
    from openclaw_cli.learn.judge import JudgeLoop, make_judge_client
    from openclaw_cli.learn.lessons import lesson_keeper
    from openclaw_cli.learn.promotion import make_publisher
    from openclaw_cli.learn.trainer_loop import TrainerLoop
    from openclaw_cli.proxy import create_app
    from openclaw_cli.store import Store

    args.seed = seed
    random.seed(seed)
    with tempfile.TemporaryDirectory(prefix="openclaw-learning-bench-") as tmp:
        work = Path(tmp)
        settings = build_settings(args, work, seed)
        if judge_kind == "scripted" and not any(pair.startswith("judge.next_state_hints=") for pair in args.set or []):
            # The control's point is a right signal: with opd that means hints exactly on the turns the user
            # corrected (the scripted judge scores those -1), not on every reply as the default does.
            settings.judge.next_state_hints = "unhappy"
        backend = LocalBackend(settings)
        await backend.start()
        store = Store(settings.store.path)
        keeper = lesson_keeper(store, backend, settings)
        server, server_task, base_url = await serve_on_loopback(
            create_app(backend, SessionCapture(store, settings), settings, lessons=keeper.book, lesson_desk=keeper)
        )
        client = ScriptedRewardJudge() if judge_kind == "scripted" else make_judge_client(settings, backend)
        trainer = TrainerLoop(store, backend, settings)
        judge = JudgeLoop(store, client, settings, trainer_waiting=trainer.waiting)
        gate = make_publisher(store, backend, client, settings)
        if gate is not None:
            trainer.publisher = gate.publish
        print(
            f"\n=== seed {seed}, judge {judge.judge_name} ({judge.mode}); method {settings.method}, batch "
            f"{settings.train.batch_size}, lr {settings.train.lr}, LoRA r{settings.lora.rank}, "
            f"KL {settings.train.kl_coef}; {args.users} users x {args.turns} turns; {args.minutes} min"
        )
        stop_users, stop_loops, stop_report = asyncio.Event(), asyncio.Event(), asyncio.Event()
        observed = Observed()
        started = time.time()
        async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
            loops = [
                asyncio.create_task(judge.run(stop_loops)),
                asyncio.create_task(trainer.run(stop_loops)),
                asyncio.create_task(keeper.run(stop_loops)),
                asyncio.create_task(keeper.book.run(stop_loops)),
            ]
            # The timeline's first point (minute 0) is measured before any user speaks.
            first_point = await measure_point(http, backend, started, args.max_tokens)
            timeline_task = asyncio.create_task(
                measure_timeline(http, backend, started, args.minutes, args.max_tokens, stop_users, observed)
            )
            users = [asyncio.create_task(scripted_user(http, u, args, observed, stop_users)) for u in range(args.users)]
            reporter = asyncio.create_task(report_steps(store, observed, started, stop_report))
            try:
                await asyncio.sleep(max(0.0, started + args.minutes * 60 - time.time()))
            finally:
                stop_users.set()
                timeline = [first_point, *await timeline_task]
                await asyncio.gather(*users, return_exceptions=True)
                stop_loops.set()
                await asyncio.gather(*loops, return_exceptions=True)
                stop_report.set()
                rows = await reporter
        summarize(observed, rows, started, time.time())
        print(
            f"judged {judge.stats.judged} turns (last error: {judge.stats.last_error}); trainer: "
            f"{trainer.stats.steps} steps, {trainer.stats.trained_samples} samples (last error: "
            f"{trainer.stats.last_error}); served version {backend.current_version().version}"
        )
        held_back = gate.guard.held if gate is not None and gate.guard is not None else 0
        print_judge_readout(judge_readout(await asyncio.to_thread(judged_reactions, store)))
        if plot_dir is not None and rows:
            from openclaw_cli.learn.evaluation import plot_reward_over_steps

            plot_dir.mkdir(parents=True, exist_ok=True)
            path = plot_dir / f"learning-{judge_kind}-seed{seed}.png"
            plot_reward_over_steps(store.steps(), path)
            print(f"reward-over-steps plot: {path}")
        after = await ask_held_out(backend, told=False, max_tokens=args.max_tokens)
        # The end of the timeline: served and plain after the last step, through the proxy.
        async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
            end = await measure_point(http, backend, started, args.max_tokens)
        timeline.append(end)
        events = lesson_events(store, started)
        for event in events:
            print(f"  lesson {event['id']} {event['status']} at {event['minute']:.2f} min: {event['why'][:100]}")
        # Also at the end of each run, so a long bench shows its results as they come.
        print(
            f"held-out after this run, plain: {after.words:5.1f} words, hits {after.hits:.2f}, "
            f"distinct {after.distinct:.2f}; served {end.served.words:5.1f} words, hits {end.served.hits:.2f}"
        )
        server.should_exit = True
        with contextlib.suppress(Exception):
            await server_task
        await backend.close()
        store.close()
    first = observed.first_correction_at
    return RunResult(
        seed,
        judge_kind,
        after,
        len(rows),
        held_back,
        args.minutes,
        rows,
        timeline,
        events,
        None if first is None else round((first - started) / 60, 2),
    )


def run_in_child(seed: int, judge_kind: str) -> RunResult | None:
    """One run in a process of its own, this script with ``--one-run``: a run's memory was not all given back when it
    ended (about 11 GB for SmolLM2 at its peak before the local backend returned freed pages to the OS, see
    openclaw_cli/backends/local/heap.py), and four runs in one process were killed for memory on a 24 GB machine; a
    process per run also keeps one run's failure from ending the others. None (said) when the child fails."""
    with tempfile.TemporaryDirectory(prefix="openclaw-learning-run-") as tmp:
        result_file = Path(tmp) / "result.json"
        command = [sys.executable, __file__, *sys.argv[1:], "--one-run", f"{seed}:{judge_kind}"]
        code = subprocess.run([*command, "--result-file", str(result_file)], check=False).returncode
        if code != 0 or not result_file.exists():
            print(f"\n!!! the run for seed {seed}, judge {judge_kind} failed (exit code {code}); left out below")
            return None
        data = json.loads(result_file.read_text())
    data["after"] = HeldOut(**data["after"])
    data["timeline"] = [
        TimelinePoint(p["minute"], p["version"], HeldOut(**p["served"]), HeldOut(**p["plain"]), p["lessons"], p["sent"])
        for p in data["timeline"]
    ]
    return RunResult(**data)


def one_run(args: argparse.Namespace) -> int:
    """``--one-run SEED:KIND``: train once and write the result to ``--result-file`` (see :func:`run_in_child`)."""
    seed, _, kind = args.one_run.partition(":")
    result = asyncio.run(train_once(args, int(seed), kind, args.plot_dir))
    args.result_file.write_text(json.dumps(asdict(result)))
    return 0


def verdict_line(before: HeldOut, told: HeldOut, after: HeldOut) -> tuple[bool, str]:
    shorter = 1 - after.words / before.words if before.words else 0.0
    checks = {
        ">=40% shorter": shorter >= 0.40,
        "<=1.2x told": after.words <= 1.2 * told.words,
        "hits >= told-0.10": after.hits >= told.hits - 0.10,
        "distinct >= 0.5": after.distinct >= 0.5,
    }
    text = ", ".join(f"{name} {'ok' if ok else 'FAIL'}" for name, ok in checks.items())
    return all(checks.values()), f"{100 * shorter:.0f}% shorter; {text}"


def served_goal(point: TimelinePoint, told: HeldOut) -> bool:
    """Served held-out replies at most 1.3x the told model's length, keyword hits at least the told model's minus
    0.10."""
    return point.served.words <= 1.3 * told.words and point.served.hits >= told.hits - 0.10


def lesson_life(result: RunResult) -> tuple[int, float, list[str]]:
    """(retirements, minutes at least one lesson was active, the lessons born of a fact correction) in a run."""
    retirements = sum(1 for e in result.lessons if e["status"] == "retired")
    end = max([result.minutes, *(e["minute"] for e in result.lessons)])
    spans: list[tuple[float, float]] = []
    by_lesson: dict[int, list[dict[str, Any]]] = {}
    for event in result.lessons:
        by_lesson.setdefault(event["id"], []).append(event)
    for events in by_lesson.values():
        ends = [e["minute"] for e in events[1:]] + [end]
        spans += [(e["minute"], stop) for e, stop in zip(events, ends, strict=True) if e["status"] == "active"]
    active, covered_to = 0.0, 0.0  # the union of the spans: two lessons active at once count once
    for start, stop in sorted(spans):
        start = max(start, covered_to)
        if stop > start:
            active += stop - start
            covered_to = stop
    facts = sorted(
        {
            e["text"]
            for e in result.lessons
            if any(line and line in str(e.get("correction", "")) for line in SCRIPT.fact_lines)
        }
    )
    return retirements, round(active, 2), facts


def lesson_verdict(result: RunResult, told: HeldOut) -> tuple[bool, bool, str]:
    """(served within 2 minutes of the first correction, every retirement followed by served replies still in the
    goal and at most :data:`MAX_RETIREMENTS`, the line that says so)."""
    corrected = result.first_correction_minute
    effect = next(
        (p.sent for p in result.timeline if corrected is not None and p.sent >= corrected and served_goal(p, told)),
        None,
    )
    fast = corrected is not None and effect is not None and effect - corrected <= 2.0
    retired = next((e["minute"] for e in result.lessons if e["status"] == "retired"), None)
    after_retirement = [p for p in result.timeline if retired is not None and p.sent >= retired]
    retirements, active, facts = lesson_life(result)
    kept = all(served_goal(p, told) for p in after_retirement) and retirements <= MAX_RETIREMENTS
    first = "n/a" if corrected is None else f"{corrected:.2f}"
    line = (
        f"first correction {first} min, served in the goal at {'never' if effect is None else f'{effect:.2f} min'} "
        f"({'ok' if fast else 'FAIL'}); retired at {'never' if retired is None else f'{retired:.2f} min'}"
        f"{'' if retired is None else ', served after it ' + ('ok' if kept else 'FAIL')}; "
        f"{retirements} retirements ({'ok' if retirements <= MAX_RETIREMENTS else 'FAIL'}), a lesson active "
        f"{active:.1f} min; lessons from fact corrections: {len(facts)} ({'ok' if not facts else 'FAIL'})"
    )
    return fast and not facts, kept, line


def plot_timeline(result: RunResult, told: HeldOut, path: Path) -> None:
    """Served and plain held-out words over the run's minutes, the told model's length as the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [p.sent for p in result.timeline]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(minutes, [p.served.words for p in result.timeline], marker="o", label="served (with lessons)")
    ax.plot(minutes, [p.plain.words for p in result.timeline], marker="s", label="plain (x-openclaw-lessons: off)")
    ax.axhline(told.words, color="gray", linestyle="--", label="base model, told")
    ax.axhline(1.3 * told.words, color="gray", linestyle=":", label="goal: 1.3x told")
    for event in result.lessons:
        if event["status"] in ("active", "retired"):
            ax.axvline(event["minute"], color="green" if event["status"] == "active" else "red", alpha=0.3)
    ax.set_xlabel("minutes")
    ax.set_ylabel("held-out words per reply")
    ax.set_title(f"seed {result.seed}: lesson active (green) / retired (red)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_held_out(path: Path, before: HeldOut, told: HeldOut, after: HeldOut) -> None:
    """Each held-out question with its replies before (plain and told) and after training, and whether each names a
    key word: the per-question view behind the hit rates."""
    rows = []
    for i, (question, keys) in enumerate(SCRIPT.held_out.items()):
        replies = {"before": before.replies[i], "told": told.replies[i], "after": after.replies[i]}
        hits = {f"{name}_hit": names_a_key_word(reply, keys) for name, reply in replies.items()}
        rows.append({"question": question, **replies, **hits})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


async def main_async(args: argparse.Namespace) -> int:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.settings import Settings

    base = LocalBackend(build_settings(args, Path(tempfile.gettempdir()), 0) if args.model != "smollm2" else Settings())
    await base.start()
    before = await ask_held_out(base, told=False, max_tokens=args.max_tokens)
    told = await ask_held_out(base, told=True, max_tokens=args.max_tokens)
    await base.close()
    print(f"script {args.script.name}: held-out ({len(SCRIPT.held_out)} questions, temperature 0, never trained on):")
    print(f"  before, plain: {before.words:5.1f} words, hits {before.hits:.2f}, distinct {before.distinct:.2f}")
    print(f"  before, told:  {told.words:5.1f} words, hits {told.hits:.2f}, distinct {told.distinct:.2f}")
    runs = [(seed, args.judge) for seed in args.seeds]
    if args.control:  # the scripted-judge control beside the first seed
        runs.insert(1, (args.seeds[0], "scripted"))
    results = []
    for seed, kind in runs:
        result = run_in_child(seed, kind)
        if result is not None:  # as each run ends: three seeds and the control take over an hour
            after = result.after
            line = verdict_line(before, told, after)[1]
            print(f"{kind} seed {seed}: {result.steps} steps, {after.words:.1f} words, hits {after.hits:.2f}; {line}")
            results.append(result)
    print("\n=== held-out after training, plain (before / told as above)")
    print(f"{'judge':>9}{'seed':>6}{'steps':>7}{'held':>6}{'words':>8}{'hits':>7}{'distinct':>10}  verdict")
    passed = 0
    for r in results:
        ok, line = verdict_line(before, told, r.after)
        passed += ok and r.judge == "policy"
        print(
            f"{r.judge:>9}{r.seed:>6}{r.steps:>7}{r.held_back:>6}{r.after.words:>8.1f}{r.after.hits:>7.2f}"
            f"{r.after.distinct:>10.2f}  {'PASS' if ok else 'fail'}: {line}"
        )
    print("\n=== lessons: held-out served (as the user gets them) and plain, over the run")
    fast_runs = retired_runs = 0
    for r in results:
        fast, kept, line = lesson_verdict(r, told)
        fast_runs += fast
        retired_runs += kept
        print(f"{r.judge:>9}{r.seed:>6}  {line}")
        for p in r.timeline:
            print(
                f"{'':>17}{p.sent:6.2f} min v{p.version:<3} served {p.served.words:5.1f} w / {p.served.hits:.2f} "
                f"({p.lessons}); plain {p.plain.words:5.1f} w / {p.plain.hits:.2f}"
            )
    print(
        f"served in the goal within 2 min of the first correction (no fact lesson): {fast_runs} of {len(results)} "
        f"runs; at most {MAX_RETIREMENTS} retirements with served kept in the goal after them: {retired_runs} of "
        f"{len(results)}"
    )
    if args.plot_dir is not None:
        for r in results:
            plot_timeline(r, told, args.plot_dir / f"lessons-{r.judge}-seed{r.seed}.png")
        for r in results:
            write_held_out(args.plot_dir / f"held-out-{r.judge}-seed{r.seed}.json", before, told, r.after)
    for r in results[:1]:
        print(f"\nexamples (seed {r.seed}, {r.judge}):")
        for q, b, a in list(zip(SCRIPT.held_out, before.replies, r.after.replies, strict=True))[:4]:
            print(f"  Q: {q}\n    before: {b!r}\n    after:  {a!r}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (embedded default) or a model path")
    parser.add_argument("--minutes", type=float, default=8.0, help="training time per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-words", type=int, default=20, help="the length limit the users want")
    parser.add_argument("--max-tokens", type=int, default=64, help="reply limit (users and held-out)")
    parser.add_argument("--users", type=int, default=2, help="concurrent scripted users")
    parser.add_argument("--turns", type=int, default=4, help="turns per session")
    parser.add_argument(
        "--judge",
        choices=["policy", "scripted"],
        default="policy",
        help="policy: the policy judges itself (the default product); scripted: a rule that reads the users (control)",
    )
    parser.add_argument("--control", action="store_true", help="also run the scripted-judge control (first seed)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a setting other than its default")
    parser.add_argument("--plot-dir", type=Path, default=None, help="write reward-over-steps PNGs here")
    parser.add_argument(
        "--script", type=Path, default=SCRIPTS / "brevity.json", help="the users' lines and questions (JSON)"
    )
    parser.add_argument("--debug", action="append", metavar="LOGGER", help="log this logger at debug level")
    parser.add_argument("--one-run", metavar="SEED:JUDGE", help=argparse.SUPPRESS)  # a child of run_in_child
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global SCRIPT
    SCRIPT = Script.load(args.script)  # each run's child parses the same arguments, so it loads the same script
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in args.debug or []:
        logging.getLogger(name).setLevel(logging.DEBUG)
    if args.one_run:
        return one_run(args)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
