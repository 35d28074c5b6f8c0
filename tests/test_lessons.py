"""Lessons: found in form corrections (never in fact corrections), verified on other prompts, served in the owner's
main-line prompts only, distilled by the trainer, retired when learned and brought back when the behaviour slips,
rated by explicit feedback, and kept across a kill -9."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from lesson_helpers import LESSON, LONG, SHORT, ScriptedPolicy, keeper_with_policy, served_exchange
from lesson_helpers import record_conversation as _conversation

from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.lesson_finder import form_kinds, is_form_correction, lesson_from_reply
from openclaw_cli.learn.lessons import load_active
from openclaw_cli.lesson_prompt import INSTRUCTION_HEADER, ActiveLesson, LessonBook, key_owner
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store

FACT_CORRECTIONS = [
    "No, the capital of Australia is Canberra.",
    "That's wrong: water boils at 100 degrees Celsius at sea level.",
    "Actually the Moon landing was in 1969.",
    "No. Mount Everest is the tallest mountain.",
    "Incorrect, there are seven continents.",
    "The author of Hamlet is Shakespeare, not Marlowe.",
    "Wrong, light is faster than sound.",
    "No, a spider has eight legs.",
    "That's not right. The Pacific is the largest ocean.",
    "Hmm, I think photosynthesis happens in the chloroplasts.",
    "No, Tokyo is the capital of Japan.",
    "The chemical symbol for gold is Au.",
    "Nope, the heart has four chambers.",
    "It was Marie Curie who discovered radium.",
    "No, 7 times 8 is 56.",
    "Oxygen's atomic number is 8, not 6.",
    "Wrong year: the Berlin Wall fell in 1989.",
    "Actually, bats are mammals.",
    "No, the Nile flows north.",
    "That's false; penguins live in the southern hemisphere.",
]


# --- finding ---------------------------------------------------------------------------------------------------------
def test_twenty_fact_corrections_make_no_lesson() -> None:
    assert [text for text in FACT_CORRECTIONS if is_form_correction(text)] == []


@pytest.mark.parametrize(
    ("reply", "lesson"),
    [
        (LESSON, LESSON),
        (
            "No, that is far too long. Please answer in one short sentence.",
            "That is far too long. Please answer in one short sentence.",
        ),
        ("Use bullet points from now on.", "Use bullet points from now on."),
        ("Paris is right. But please don't apologize so much.", "But please don't apologize so much."),
        ("Way too verbose, I only need a few words.", "Way too verbose, I only need a few words."),
    ],
)
def test_form_corrections_become_the_users_own_words(reply: str, lesson: str) -> None:
    assert lesson_from_reply(reply, 300) == lesson


def test_a_long_message_is_a_new_request_not_a_correction() -> None:
    text = "Please write a short story about a dragon " + "and a knight " * 20
    assert lesson_from_reply(text, 300) is None


# --- serving ---------------------------------------------------------------------------------------------------------
def _book(lessons: dict[str, list[ActiveLesson]]) -> LessonBook:
    book = LessonBook(lambda: lessons)
    book.refresh_sync()
    return book


def _start(make_proxy: Any, tiny_tokenizer: Any, settings: Settings, book: LessonBook) -> Any:
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink
    from openclaw_cli.testing.loopback_proxy import LoopbackProxy

    backend = FakeBackend(tiny_tokenizer, ["ok"] * 20)
    sink = MemorySink()
    server = BackgroundServer(create_app(backend, sink, settings, lessons=book)).start()
    return LoopbackProxy(backend, sink, server), server


def test_lesson_block_goes_to_its_owner_only_and_is_recorded(make_proxy: Any, tiny_tokenizer: Any) -> None:
    alice, bob = "sk-alice-0123456789", "sk-bob-0123456789"
    settings = Settings(api_key=alice, api_keys=[bob])
    book = _book({key_owner(alice): [ActiveLesson(7, LESSON)]})
    proxy, server = _start(make_proxy, tiny_tokenizer, settings, book)
    try:
        body = {"model": "openclaw-policy", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        url = f"{server.base_url}/v1/chat/completions"
        as_alice = httpx.post(url, json=body, headers={"Authorization": f"Bearer {alice}"})
        as_bob = httpx.post(url, json=body, headers={"Authorization": f"Bearer {bob}"})
        off = httpx.post(url, json=body, headers={"x-api-key": alice, "x-openclaw-lessons": "off"})
        title = {**body, "messages": [*body["messages"], {"role": "user", "content": "Give a title for this chat."}]}
        side = httpx.post(url, json=title, headers={"x-api-key": alice})
        nobody = httpx.post(url, json=body)
    finally:
        server.stop()
    assert as_alice.status_code == as_bob.status_code == off.status_code == side.status_code == 200
    assert nobody.status_code == 401
    assert as_alice.headers["x-openclaw-lessons"] == "7"
    assert as_bob.headers["x-openclaw-lessons"] == off.headers["x-openclaw-lessons"] == "none"
    assert side.headers["x-openclaw-lessons"] == "none"
    prompts = [tiny_tokenizer.decode(call.prompt_tokens) for call in proxy.backend.calls]
    assert INSTRUCTION_HEADER in prompts[0] and LESSON in prompts[0]  # a first reply: in the system message
    assert all(LESSON not in prompt for prompt in prompts[1:])
    recorded = proxy.sink.exchanges
    assert recorded[0].metadata["lessons"] == [{"id": 7, "text": LESSON}]
    assert recorded[0].metadata["owner"] == key_owner(alice) != recorded[1].metadata["owner"]
    assert alice not in json.dumps([e.metadata for e in recorded]) + json.dumps([e.headers for e in recorded])
    # capture keeps the client's conversation (sessions pair on it), not the prompt with the block
    assert recorded[0].messages == body["messages"]


def test_lesson_budget_keeps_the_block_within_max_tokens(make_proxy: Any, tiny_tokenizer: Any) -> None:
    settings = Settings()
    settings.lessons.max_tokens = 20
    long_lesson = "Always answer with exactly one sentence and never add any explanation or any examples at all."
    book = _book({"local": [ActiveLesson(1, "Be brief."), ActiveLesson(2, long_lesson)]})
    _, server = _start(make_proxy, tiny_tokenizer, settings, book)
    try:
        body = {"model": "openclaw-policy", "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", json=body)
    finally:
        server.stop()
    assert reply.headers["x-openclaw-lessons"] == "1"


# --- the store ---------------------------------------------------------------------------------------------------
def test_a_version_3_store_migrates_and_keeps_its_turns(tmp_path: Path) -> None:
    import sqlite3

    from openclaw_cli.store import MIGRATIONS, SCHEMA_VERSION

    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    from openclaw_cli.store.schema import APPLICATION_ID

    conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
    for step in MIGRATIONS[:3]:
        for statement in step:
            conn.execute(statement)
    conn.execute("PRAGMA user_version=3")
    conn.commit()
    conn.close()
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        lesson_id = store.add_lesson("local", LESSON, status="active", origin="user", why="test")
        assert [lesson.id for lesson in store.lessons(statuses=["active"])] == [lesson_id]


# --- keeper with a scripted policy ---------------------------------------------------------------------------------
@pytest.fixture
def keeper_parts(tmp_path: Path, tiny_tokenizer: Any) -> Any:
    yield from keeper_with_policy(tmp_path, tiny_tokenizer)


def _questions(capture: SessionCapture, tokenizer: Any, n: int = 3) -> None:
    for i in range(n):
        _conversation(capture, tokenizer, f"Question number {i}?", LONG, f"Thanks! Next question {i}.")


async def test_a_form_correction_is_verified_activated_and_served(keeper_parts: Any, tiny_tokenizer: Any) -> None:
    store, capture, _, keeper = keeper_parts
    _questions(capture, tiny_tokenizer)
    _conversation(capture, tiny_tokenizer, "What is the capital of France?", LONG, LESSON)
    await keeper.run_once()
    (lesson,) = store.lessons()
    assert (lesson.status, lesson.text, lesson.origin) == ("active", LESSON, "correction")
    trials = lesson.evidence[-1]["verification"]["trials"]
    assert len(trials) == 3 and all(t["changed"] and t["preferred"] and t["plausible"] for t in trials)
    assert keeper.book.for_owner("local") == [ActiveLesson(lesson.id, LESSON)]
    assert keeper.book.for_owner("key:someone-else") == []


async def test_a_fact_correction_makes_no_lesson_and_a_leaking_one_is_rejected(
    keeper_parts: Any, tiny_tokenizer: Any
) -> None:
    store, capture, policy, keeper = keeper_parts
    _questions(capture, tiny_tokenizer)
    for i, text in enumerate(FACT_CORRECTIONS):
        _conversation(capture, tiny_tokenizer, f"Fact question {i}?", LONG, text)
    await keeper.run_once()
    await keeper.run_once()
    assert store.lessons() == []
    policy.leak = "Canberra"
    # The fact rides in its own sentence: only the form correction is kept.
    assert lesson_from_reply("Too long. The answer is Canberra.", 300) == "Too long."
    # Here it rides in the cue sentence itself; verification sees it leak into other answers.
    _conversation(capture, tiny_tokenizer, "Capital of Australia?", LONG, "Too long, just say Canberra.")
    await keeper.run_once()
    (lesson,) = store.lessons()
    assert lesson.status == "rejected" and "canberra" in lesson.evidence[-1]["why"]


async def test_retired_when_learned_and_back_when_it_slips(keeper_parts: Any, tiny_tokenizer: Any) -> None:
    store, capture, policy, keeper = keeper_parts
    lesson = await keeper.add("local", LESSON)
    served = [{"id": lesson.id, "text": LESSON}]
    for i in range(3):  # turns served with the lesson (short replies), not yet trained on
        messages = [{"role": "user", "content": f"Served question {i}?"}]
        capture.record_sync(served_exchange(tiny_tokenizer, messages, SHORT, lessons=served))
    told = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": LONG},
        {"role": "user", "content": LESSON},
    ]
    capture.record_sync(served_exchange(tiny_tokenizer, told, SHORT))  # its context holds the correction: not a prompt
    assert store.get_lesson(lesson.id).uses == 3
    await keeper.check_retirement()
    active = store.get_lesson(lesson.id)
    assert active.status == "active" and active.evidence[-1]["effect"] > 1.0  # the policy still answers LONG
    assert len(active.evidence[-1]["trials"]) == 3
    assert all(t["turn"] != 4 for t in active.evidence[-1]["trials"])
    policy.learned = True
    await keeper.check_retirement()
    passing = store.get_lesson(lesson.id)  # one passing check is not enough (lessons.retire_checks = 2)
    assert passing.status == "active" and "passing check 1 of 2" in passing.evidence[-1]["why"]
    await keeper.check_retirement()
    retired = store.get_lesson(lesson.id)
    assert retired.status == "retired" and retired.evidence[-1]["effect"] == 0.0
    assert keeper.book.for_owner("local") == []
    policy.learned = False
    await keeper.check_retirement()
    assert store.get_lesson(lesson.id).status == "active"
    assert "slipped" in store.get_lesson(lesson.id).evidence[-1]["why"]


async def test_a_retired_lesson_comes_back_when_the_user_corrects_the_same_thing(
    keeper_parts: Any, tiny_tokenizer: Any
) -> None:
    store, capture, _, keeper = keeper_parts
    # Every word of this one is a common word of instructions: it is the same lesson by its words, not its topic.
    text = "That is far too long. Answer in one short sentence, please."
    lesson = await keeper.add("local", text)
    store.set_lesson_status(lesson.id, "retired", "learned (test)")
    _conversation(capture, tiny_tokenizer, "What is the capital of France?", LONG, "No, " + text.lower())
    await keeper.run_once()
    assert [(x.id, x.status) for x in store.lessons()] == [(lesson.id, "active")]
    assert "corrected the same thing again" in store.get_lesson(lesson.id).evidence[-1]["why"]


async def test_feedback_overrides_the_verdict_and_its_text_is_a_candidate(
    keeper_parts: Any, tiny_tokenizer: Any
) -> None:
    store, capture, _, keeper = keeper_parts
    _conversation(capture, tiny_tokenizer, "What is 2+2?", LONG, "ok")
    turn_id = store.main_turns_of_session(store.sessions()[0].id)[0]
    out = await keeper.feedback(turn_id, -1, "Too long, answer in one sentence.", owner="local")
    assert out["lesson"]["status"] == "candidate" and out["lesson"]["origin"] == "feedback"
    assert store.feedback_for(turn_id) == (-1, "Too long, answer in one sentence.")
    from openclaw_cli.lesson_prompt import LessonError

    with pytest.raises(LessonError):
        await keeper.feedback(turn_id, 1, None, owner=key_owner("sk-other-0123456789"))


async def test_trainer_takes_the_users_rating_over_the_judge(tmp_path: Path, tiny_tokenizer: Any) -> None:
    from openclaw_cli.learn.trainer_loop import TrainerLoop

    store = Store(tmp_path / "s.sqlite3")
    settings = Settings(method="rl")
    settings.train.kl_coef = 0.0
    capture = SessionCapture(store, settings)
    _conversation(capture, tiny_tokenizer, "What is 2+2?", LONG, "Thanks!")
    turn = store.get_turn(store.main_turns_of_session(store.sessions()[0].id)[0])
    store.add_feedback(turn.id, -1, "Too long.")
    trainer = TrainerLoop(store, ScriptedPolicy(tiny_tokenizer), settings)  # type: ignore[arg-type]
    trainer._verdicts[turn.id] = {"score": 1.0}
    samples, rewards, _ = await trainer._samples([turn])
    assert rewards == [-1.0] and samples[0].reward == -1.0
    store.close()


# --- consolidation -------------------------------------------------------------------------------------------------
async def test_a_lesson_served_turn_is_a_demonstration_for_the_plain_prompt(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    from openclaw_cli.learn.algorithms import build_datums
    from openclaw_cli.learn.trainer_loop import TrainerLoop

    store = Store(tmp_path / "s.sqlite3")
    settings = Settings(method="rl")
    settings.train.kl_coef = 0.0
    settings.train.demo_weight = 1.5
    capture = SessionCapture(store, settings)
    lesson_id = store.add_lesson("local", LESSON, status="active", origin="user", why="test")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    capture.record_sync(served_exchange(tiny_tokenizer, messages, SHORT, lessons=[{"id": lesson_id, "text": LESSON}]))
    turn = store.get_turn(1)
    policy = ScriptedPolicy(tiny_tokenizer)
    trainer = TrainerLoop(store, policy, settings)  # type: ignore[arg-type]
    trainer._verdicts[turn.id] = {"score": 0.0}
    samples, _, _ = await trainer._samples([turn])
    (demo,) = [s for s in samples if s.consolidates]
    plain = tiny_tokenizer.render(messages)
    assert demo.consolidates == (lesson_id,)
    assert demo.prompt_tokens == plain != turn.prompt_tokens  # trained without the lesson block
    assert demo.completion_tokens == tiny_tokenizer.encode(SHORT)  # the base model's reply with the lesson
    # Its "sampler" log-probabilities are the current policy's: -1.5 a token (SHORT does not fit the plain prompt).
    assert demo.sampler_logprobs == [-1.5] * len(demo.completion_tokens)
    datums, _ = build_datums(samples, "rl", settings.train, current_version=0, baseline=0.0)
    (datum,) = [d for d in datums if list(d.model_input[: len(plain)]) == plain]
    n = len(demo.completion_tokens)
    # By hand: the constant demonstration advantage 1.5 on every token, scaled by loss_norm "token" (1 / the batch's
    # trained tokens: the demonstration is the only datum, the plain turn has no signal).
    assert len(datums) == 1
    assert list(datum.loss_fn_inputs["advantages"]) == [0.0] * (len(plain) - 1) + [1.5 / n] * n
    assert list(datum.loss_fn_inputs["target_tokens"]) == [0] * (len(plain) - 1) + demo.completion_tokens
    store.close()


# --- crash safety --------------------------------------------------------------------------------------------------
_WRITER = """
import os, signal, sys
from openclaw_cli.store import Store
store = Store(sys.argv[1])
lesson = store.add_lesson("local", "Too wordy. Just give me the key fact.", status="candidate", origin="correction",
                          why="the user's reply to turn 1")
store.set_lesson_status(lesson, "active", "verified")
print(lesson, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_lessons_survive_kill_9_and_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    done = subprocess.run([sys.executable, "-c", _WRITER, str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    lesson_id = int(done.stdout.strip())
    with Store(path) as store:
        (lesson,) = store.lessons()
        assert (lesson.id, lesson.status, [e["status"] for e in lesson.evidence]) == (
            lesson_id,
            "active",
            ["candidate", "active"],
        )
        book = LessonBook(load_active(store))
        book.refresh_sync()
        assert book.for_owner("local") == [ActiveLesson(lesson_id, LESSON)]
    assert os.path.exists(path)


async def test_forgetting_erases_the_text_and_says_weights_keep_it(keeper_parts: Any, tiny_tokenizer: Any) -> None:
    store, capture, _, keeper = keeper_parts
    _conversation(capture, tiny_tokenizer, "What is 2+2?", LONG, "No, far too long: reply in one short sentence.")
    await keeper.run_once()
    (found,) = store.lessons()
    assert found.evidence[0]["correction"] == "No, far too long: reply in one short sentence."
    await keeper.forget(found.id, "local")
    assert "short sentence" not in json.dumps(store.get_lesson(found.id).to_json())
    lesson = await keeper.add("local", LESSON)
    assert keeper.book.for_owner("local")
    forgotten = await keeper.forget(lesson.id, "local")
    assert forgotten.status == "forgotten" and LESSON not in json.dumps(store.get_lesson(lesson.id).to_json())
    assert "until you roll back" in forgotten.evidence[-1]["why"]
    assert keeper.book.for_owner("local") == []
    await asyncio.sleep(0)


# --- the HTTP routes and the CLI ----------------------------------------------------------------------------------
def test_lesson_routes_teach_list_rate_and_forget_per_owner(tmp_path: Path, tiny_tokenizer: Any) -> None:
    from openclaw_cli.learn.lessons import lesson_keeper
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import FakeBackend

    alice, bob = "sk-alice-0123456789", "sk-bob-0123456789"
    settings = Settings(api_key=alice, api_keys=[bob])
    store = Store(tmp_path / "store.sqlite3")
    backend = FakeBackend(tiny_tokenizer, ["A long answer."] * 10)
    keeper = lesson_keeper(store, backend, settings)
    app = create_app(backend, SessionCapture(store, settings), settings, lessons=keeper.book, lesson_desk=keeper)
    server = BackgroundServer(app).start()
    url = server.base_url
    as_alice, as_bob = {"x-api-key": alice}, {"x-api-key": bob}
    try:
        taught = httpx.post(f"{url}/v1/openclaw/lessons", json={"text": LESSON}, headers=as_alice)
        assert taught.status_code == 201 and taught.json()["status"] == "active"
        lesson_id = taught.json()["id"]
        assert [x["id"] for x in httpx.get(f"{url}/v1/openclaw/lessons", headers=as_alice).json()["lessons"]] == [
            lesson_id
        ]
        assert httpx.get(f"{url}/v1/openclaw/lessons", headers=as_bob).json()["lessons"] == []
        assert httpx.get(f"{url}/v1/openclaw/lessons/{lesson_id}", headers=as_bob).status_code == 404
        chat = {"model": "openclaw-policy", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        reply = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=as_alice)
        assert reply.headers["x-openclaw-lessons"] == str(lesson_id)  # from the very next request
        response_id = reply.json()["id"]
        bad = httpx.post(
            f"{url}/v1/openclaw/feedback", json={"response_id": response_id, "rating": 5}, headers=as_alice
        )
        assert bad.status_code == 400 and "rating" in bad.json()["error"]["message"]
        assert store.feedback_for(1) is None  # a bad request changed nothing
        theirs = httpx.post(
            f"{url}/v1/openclaw/feedback", json={"response_id": response_id, "rating": "down"}, headers=as_bob
        )
        assert theirs.status_code == 404
        rated = httpx.post(
            f"{url}/v1/openclaw/feedback",
            json={"response_id": response_id, "rating": "down", "text": "Use bullet points from now on."},
            headers=as_alice,
        )
        assert rated.status_code == 201 and rated.json()["lesson"]["status"] == "candidate"
        assert store.feedback_for(rated.json()["turn_id"]) == (-1, "Use bullet points from now on.")
        forgotten = httpx.delete(f"{url}/v1/openclaw/lessons/{lesson_id}", headers=as_alice)
        assert forgotten.status_code == 200 and "roll back" in forgotten.json()["note"]
        again = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=as_alice)
        assert again.headers["x-openclaw-lessons"] == "none"
        assert httpx.get(f"{url}/v1/openclaw/lessons/abc", headers=as_alice).status_code == 400
    finally:
        server.stop()
        store.close()


async def test_an_opted_out_correction_makes_no_lesson_but_is_served_with_lessons(
    tmp_path: Path, tiny_tokenizer: Any
) -> None:
    from openclaw_cli.learn.lessons import lesson_keeper
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import FakeBackend

    settings = Settings()
    store = Store(tmp_path / "store.sqlite3")
    backend = FakeBackend(tiny_tokenizer, [LONG] * 10)
    keeper = lesson_keeper(store, backend, settings)
    await keeper.add("local", "Answer in one short sentence.")
    app = create_app(backend, SessionCapture(store, settings), settings, lessons=keeper.book, lesson_desk=keeper)
    server = BackgroundServer(app).start()
    out = {"X-OpenClaw-Opt-Out": "1", "X-Session-Id": "private"}
    first = [{"role": "user", "content": "What is the capital of France?"}]
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            reply = await http.post(
                "/v1/chat/completions", json={"model": "openclaw-policy", "messages": first}, headers=out
            )
            assert reply.headers["x-openclaw-lessons"] == "1"  # served with the owner's lessons all the same
            again = [*first, {"role": "assistant", "content": LONG}, {"role": "user", "content": LESSON}]
            await http.post("/v1/chat/completions", json={"model": "openclaw-policy", "messages": again}, headers=out)
        await keeper.run_once()
    finally:
        server.stop()
    assert [lesson.origin for lesson in store.lessons()] == ["user"]  # nothing stored, so nothing learned from it
    assert store.sessions() == []
    store.close()


async def test_a_duplicate_merges_into_the_active_lesson_and_the_budget_retires_the_oldest(
    keeper_parts: Any, tiny_tokenizer: Any
) -> None:
    store, capture, _, keeper = keeper_parts
    first = await keeper.add("local", "Answer briefly.")
    _questions(capture, tiny_tokenizer)
    # The scripted policy already answers SHORT with any lesson in the prompt: this one changes no reply (not even
    # the one corrected, served SHORT beside the active lesson), though alone it would.
    _conversation(capture, tiny_tokenizer, "What is the capital of France?", SHORT, "Too long. Be concise.")
    await keeper.run_once()
    duplicate = next(lesson for lesson in store.lessons() if lesson.id != first.id)
    assert duplicate.status == "rejected" and f"merged into lesson {first.id}" in duplicate.evidence[-1]["why"]
    assert "asked for it again" in store.get_lesson(first.id).evidence[-1]["why"]
    keeper.settings.lessons.max_active = 2
    second = await keeper.add("local", "Use plain text.")
    third = await keeper.add("local", "No markdown.")
    statuses = {lesson.id: lesson.status for lesson in store.lessons()}
    assert (statuses[first.id], statuses[second.id], statuses[third.id]) == ("retired", "active", "active")
    assert [a.id for a in keeper.book.for_owner("local")] == [second.id, third.id]


def test_openclaw_lessons_command_lists_adds_shows_and_forgets(tmp_path: Path, tiny_tokenizer: Any) -> None:
    from typer.testing import CliRunner

    from openclaw_cli.cli import app as cli_app
    from openclaw_cli.learn.lessons import lesson_keeper
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import FakeBackend

    settings = Settings(api_key="sk-cli-0123456789")
    store = Store(tmp_path / "store.sqlite3")
    backend = FakeBackend(tiny_tokenizer, ["ok"])
    keeper = lesson_keeper(store, backend, settings)
    app = create_app(backend, SessionCapture(store, settings), settings, lessons=keeper.book, lesson_desk=keeper)
    server = BackgroundServer(app).start()
    port = server.base_url.rsplit(":", 1)[1]
    runner = CliRunner()
    env = {"OPENCLAW_API_KEY": "sk-cli-0123456789"}
    try:
        empty = runner.invoke(cli_app, ["lessons", "--port", port], env=env)
        assert empty.exit_code == 0 and "no lessons yet" in empty.output, empty.output
        added = runner.invoke(cli_app, ["lessons", "--port", port, "add", LESSON], env=env)
        assert added.exit_code == 0 and f"lesson 1 is active: {LESSON}" in added.output, added.output
        listed = runner.invoke(cli_app, ["lessons", "--port", port, "list", "--json"], env=env)
        assert [x["text"] for x in json.loads(listed.output)["lessons"]] == [LESSON]
        shown = runner.invoke(cli_app, ["lessons", "--port", port, "show", "1"], env=env)
        assert "taught directly by the user" in shown.output
        trial = {"turn": 4, "verdict": "unchanged", "corrected": True, "words": [6, 6], "advantage": 0.0}
        waiting = store.add_lesson(
            key_owner("sk-cli-0123456789"), "Be brief.", status="candidate", origin="feedback", why="x"
        )
        store.note_lesson(waiting, "not verified yet", {"verification": {"outcome": "inconclusive", "trials": [trial]}})
        explained = runner.invoke(cli_app, ["lessons", "--port", port, "show", str(waiting)], env=env)
        assert "turn 4 (the reply you corrected): the same reply with it (6 words)" in explained.output
        assert "Waiting for a prompt of yours whose reply it would change" in " ".join(explained.output.split())
        missing = runner.invoke(cli_app, ["lessons", "--port", port, "show", "9"], env=env)
        assert missing.exit_code == 2 and "no lesson 9" in missing.output
        forgotten = runner.invoke(cli_app, ["lessons", "--port", port, "forget", "1"], env=env)
        assert forgotten.exit_code == 0 and "until you roll back" in forgotten.output
        refused = runner.invoke(cli_app, ["lessons", "--port", port], env={"OPENCLAW_API_KEY": "wrong"})
        assert refused.exit_code == 1 and "refused the API key" in refused.output
    finally:
        server.stop()
        store.close()


def test_the_real_sdks_see_the_lesson_header_and_can_turn_lessons_off(make_proxy: Any, tiny_tokenizer: Any) -> None:
    import anthropic
    import openai

    book = _book({"local": [ActiveLesson(5, LESSON)]})
    _, server = _start(make_proxy, tiny_tokenizer, Settings(), book)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        raw = client.chat.completions.with_raw_response.create(model="openclaw-policy", messages=messages)
        assert raw.headers["x-openclaw-lessons"] == "5" and raw.parse().choices[0].message.content == "ok"
        off = client.chat.completions.with_raw_response.create(
            model="openclaw-policy", messages=messages, extra_headers={"x-openclaw-lessons": "off"}
        )
        assert off.headers["x-openclaw-lessons"] == "none"
        claude = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
        with claude.messages.with_streaming_response.create(
            model="openclaw-policy", max_tokens=16, messages=messages, stream=True
        ) as streamed:
            assert streamed.headers["x-openclaw-lessons"] == "5"
            assert any(b"message_stop" in chunk for chunk in streamed.iter_bytes())
    finally:
        server.stop()


def test_wordings_of_one_wish_share_a_kind_and_standing_rules_have_none() -> None:
    """Which lessons are rivals (the newer may replace the older): the same kind of wish in other words."""
    length = ["tl;dr?", "Can you keep it brief?", "Too much text.", "Shorter, please.", "One sentence is enough."]
    assert {kind for text in length for kind in form_kinds(text)} == {"length"}
    assert form_kinds("Answer in French.") == {"language"}
    assert form_kinds("Use bullet points.") == {"shape"}
    assert form_kinds("That is too formal.") == {"tone"}
    assert form_kinds("Never apologize.") == form_kinds("Don't use jargon.") == frozenset()
