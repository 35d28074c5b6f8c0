"""`openclaw eval`: replay on two versions, judge with a scripted double, win-rate math, the PNG, clear errors."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from openclaw_cli.backends.local import LocalBackend
from openclaw_cli.cli import app
from openclaw_cli.learn.evaluation import (
    EvalError,
    EvalItem,
    EvalOptions,
    PolicyChoice,
    balanced_orders,
    evaluate,
    judge_replies,
    load_prompt_file,
    load_stored_items,
    majority,
    parse_choice,
    parse_score,
    plot_reward_over_steps,
    resolve_checkpoint,
)
from openclaw_cli.settings import LocalSettings, LoraSettings, Settings
from openclaw_cli.store import NewTurn, Store
from openclaw_cli.testing.store_turns import new_turn

A = PolicyChoice("base", 0)
B = PolicyChoice("v1", 1)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class ScriptedJudge:
    """Answers the two eval prompts by rules over the text it is shown; records every call."""

    def __init__(self, *, score: Any = None, pair: Any = None) -> None:
        self.score = score or (lambda reply: "\\boxed{1}")
        self.pair = pair or (lambda first, second: "\\boxed{1}")
        self.calls: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        self.calls.append(messages)
        user = messages[-1]["content"]
        if "Reply to grade:\n" in user:
            return self.score(user.split("Reply to grade:\n", 1)[1])
        first = user.split("Reply 1:\n", 1)[1].split("\n\nReply 2:\n", 1)[0]
        second = user.split("\n\nReply 2:\n", 1)[1]
        return self.pair(first, second)


def prefers(tag: str):
    """A judge that always picks the reply containing ``tag``, wherever it is shown."""
    return lambda first, second: "I pick \\boxed{1}" if tag in first else "so \\boxed{2}"


def items_of(n: int) -> list[EvalItem]:
    return [EvalItem(messages=[{"role": "user", "content": f"question {i}"}], source=f"q{i}") for i in range(n)]


# --- win-rate math ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 10])
@pytest.mark.parametrize(("favourite", "expected"), [("from B", 1.0), ("from A", 0.0)])
async def test_a_judge_that_always_prefers_one_version_gives_one_or_zero(n: int, favourite: str, expected: float):
    items = items_of(n)
    replies_a = [f"answer {i} from A" for i in range(n)]
    replies_b = [f"answer {i} from B" for i in range(n)]
    judge = ScriptedJudge(
        score=lambda reply: "\\boxed{1}" if "from B" in reply else "\\boxed{-1}", pair=prefers(favourite)
    )
    report = await judge_replies(judge, items, replies_a, replies_b, A, B, EvalOptions(seed=3))
    assert report.win_rate_b == expected
    assert report.pairs_judged == n and report.ties == 0
    assert (report.wins_b, report.wins_a) == ((n, 0) if expected == 1.0 else (0, n))
    assert (report.mean_score_a, report.mean_score_b) == (-1.0, 1.0)
    # Both presentation orders were really used: half the items (rounded down) showed B first.
    assert sum(r.b_shown_first for r in report.items) == n // 2


async def test_a_judge_that_always_picks_the_first_position_is_cancelled_out() -> None:
    judge = ScriptedJudge(pair=lambda first, second: "\\boxed{1}")
    report = await judge_replies(judge, items_of(8), ["a"] * 8, ["b"] * 8, A, B, EvalOptions(seed=11))
    assert (report.wins_a, report.wins_b, report.win_rate_b) == (4, 4, 0.5)


async def test_ties_count_half_and_invalid_answers_are_left_out() -> None:
    answers = iter(["\\boxed{0}", "no idea", "\\boxed{0}", "\\boxed{0}"])
    judge = ScriptedJudge(pair=lambda first, second: next(answers), score=lambda reply: "\\boxed{maybe}")
    report = await judge_replies(judge, items_of(4), ["a"] * 4, ["b"] * 4, A, B, EvalOptions())
    assert (report.ties, report.pairs_judged) == (3, 3)
    assert report.win_rate_b == 0.5
    assert report.mean_score_a is None and report.scored_a == 0  # no valid absolute score at all


async def test_one_win_one_tie_one_loss_is_one_half_and_win_tie_is_three_quarters() -> None:
    # Per item, what the judge thinks: B better, tie, A better (decided by content, so order does not matter).
    verdict = {"0": "b", "1": "tie", "2": "a", "3": "b"}

    def pair(first: str, second: str) -> str:
        item = first.split()[-1]
        winner = verdict[item]
        if winner == "tie":
            return "\\boxed{0}"
        return "\\boxed{1}" if first.startswith(winner) else "\\boxed{2}"

    judge = ScriptedJudge(pair=pair)
    replies_a = [f"a reply {i}" for i in range(4)]
    replies_b = [f"b reply {i}" for i in range(4)]
    report = await judge_replies(judge, items_of(3), replies_a[:3], replies_b[:3], A, B, EvalOptions())
    assert (report.wins_b, report.ties, report.wins_a, report.win_rate_b) == (1, 1, 1, 0.5)
    report = await judge_replies(judge, items_of(4), replies_a, replies_b, A, B, EvalOptions())
    assert report.win_rate_b == pytest.approx((2 + 0.5) / 4)


def test_parsing_and_majority() -> None:
    assert parse_score("first \\boxed{-1} then \\boxed{ 1 }") == 1  # the last box counts
    assert parse_score("\\boxed{2}") is None and parse_score("no box") is None
    assert parse_choice("\\boxed{2}") == 2 and parse_choice("\\boxed{tie}") == 0 and parse_choice("x") is None
    assert majority([1, 1, -1]) == 1 and majority([1, -1]) == 0 and majority([None, None]) is None
    assert majority([None, -1]) == -1


def test_balanced_orders_are_half_each_way_and_seeded() -> None:
    orders = balanced_orders(9, seed=5)
    assert sum(orders) == 4 and balanced_orders(9, seed=5) == orders
    assert len({tuple(balanced_orders(10, seed=s)) for s in range(6)}) > 1  # the seed changes the order


async def test_a_judge_that_always_fails_is_a_clear_error() -> None:
    class Broken:
        async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
            raise ConnectionError("judge endpoint refused the connection")

    with pytest.raises(EvalError, match=r"every judge call failed.*refused the connection"):
        await judge_replies(Broken(), items_of(2), ["a", "a"], ["b", "b"], A, B, EvalOptions())


# --- prompt sets -----------------------------------------------------------------------------------------------


def test_prompt_file_is_read_and_checked(tmp_path: Path) -> None:
    good = tmp_path / "prompts.jsonl"
    good.write_text(
        json.dumps({"messages": [{"role": "user", "content": "hi"}]})
        + "\n\n"
        + json.dumps({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "tools": []})
        + "\n"
    )
    items = load_prompt_file(good)
    assert [i.source for i in items] == [f"{good}:1", f"{good}:3"]
    assert items[1].messages[1]["content"] == "q" and items[1].tools == []

    cases = {
        "": "holds no prompts",
        "{not json\n": ":1: not JSON",
        '{"messages": []}\n': 'non-empty "messages"',
        '{"messages": [{"content": "x"}]}\n': 'needs a "role"',
        '{"messages": [{"role": "assistant", "content": "x"}]}\n': "the last message is the assistant's",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(EvalError, match=message):
            load_prompt_file(bad)
    with pytest.raises(EvalError, match="cannot read prompt file"):
        load_prompt_file(tmp_path / "missing.jsonl")


def _turn(session_id: str, index: int, text: str, *, turn_type: str = "main", created_at: float = 100.0) -> NewTurn:
    return new_turn(
        session_id,
        index=index,
        turn_type=turn_type,
        status="ready" if turn_type == "main" else "skipped",
        user_text=text,
        reply_text="old reply",
        created_at=created_at,
        started_at=created_at,
        first_token_at=created_at,
        finished_at=created_at,
    )


def seed_store(path: Path) -> Store:
    store = Store(path)
    with store.transaction() as tx:
        tx.create_session("s", scope="", id_source="inferred", now=100.0)
        tx.insert_turn(_turn("s", 0, "What is the capital of France?", created_at=100.0))
        tx.insert_turn(_turn("s", -1, "summarise memory", turn_type="side", created_at=150.0))
        tx.insert_turn(_turn("s", 1, "And of Japan?", created_at=200.0))
        tx.insert_turn(_turn("s", 2, "Thank you very much!", created_at=300.0))
    return store


def test_stored_items_are_the_last_main_turns(tmp_path: Path) -> None:
    store = seed_store(tmp_path / "store.sqlite3")
    try:
        texts = [i.messages[-1]["content"] for i in load_stored_items(store, last=2)]
        assert texts == ["And of Japan?", "Thank you very much!"]  # the side turn is never an eval prompt
        texts = [i.messages[-1]["content"] for i in load_stored_items(store, last=None, since=150.0)]
        assert texts == ["And of Japan?", "Thank you very much!"]
        with pytest.raises(EvalError, match="nothing to eval: the store holds no main-line turns since"):
            load_stored_items(store, since=1000.0)
    finally:
        store.close()
    with Store(tmp_path / "empty.sqlite3") as empty, pytest.raises(EvalError, match="nothing to eval"):
        load_stored_items(empty)


def test_version_specs(tmp_path: Path) -> None:
    state = tmp_path / "ckpt"
    assert resolve_checkpoint("base", state) is None
    with pytest.raises(EvalError, match=r"no checkpoints in .* as 'latest'"):
        resolve_checkpoint("latest", state)
    (state / ".step-2.tmp-x").mkdir(parents=True)  # an unfinished save is never "latest"
    (state / "step-1").mkdir()
    assert resolve_checkpoint("latest", state) == state / "step-1"
    assert resolve_checkpoint("step-1", state) == state / "step-1"
    assert resolve_checkpoint(str(state / "step-1"), tmp_path) == state / "step-1"
    with pytest.raises(EvalError, match=r"unknown version 'step-9'.*\(step-1\)"):
        resolve_checkpoint("step-9", state)


# --- end to end on the tiny model ------------------------------------------------------------------------------


def tiny_settings(model_dir: Path, tmp_path: Path) -> Settings:
    return Settings(
        model=str(model_dir),
        lora=LoraSettings(rank=4, alpha=8),
        local=LocalSettings(state_dir=tmp_path / "ckpt", keep_versions=2, max_concurrent_requests=2),
    )


@pytest.fixture
async def backend(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[LocalBackend]:
    instance = LocalBackend(tiny_settings(tiny_model_dir, tmp_path))
    await instance.start()
    yield instance
    await instance.close()


async def test_eval_over_a_jsonl_replays_both_versions_and_judges_them(backend: LocalBackend, tmp_path: Path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": f"Hello {i}"}]}) + "\n" for i in range(3))
    )
    version = await backend.publish("trained")
    judge = ScriptedJudge(pair=lambda first, second: "\\boxed{1}")  # always the reply shown first
    options = EvalOptions(max_tokens=6, seed=1)
    report = await evaluate(backend, judge, load_prompt_file(prompts), A, PolicyChoice("v", version.version), options)

    assert report.n == 3 and report.scored_a == report.scored_b == 3
    assert report.mean_score_a == report.mean_score_b == 1.0
    # A first-position judge wins for B exactly on the items that showed B first.
    shown_b_first = sum(r.b_shown_first for r in report.items)
    assert shown_b_first == 1 and report.win_rate_b == pytest.approx(shown_b_first / 3)
    assert all(isinstance(r.reply_a, str) and isinstance(r.reply_b, str) for r in report.items)
    # The judge saw the real conversation and the replies the policy produced.
    pair_calls = [c for c in judge.calls if "Reply 1:" in c[-1]["content"]]
    assert len(pair_calls) == 3 and len(judge.calls) == 9
    first_item = report.items[0]
    shown = next(c[-1]["content"] for c in pair_calls if "Hello 0" in c[-1]["content"])
    assert f"Reply 1:\n{first_item.reply_b if first_item.b_shown_first else first_item.reply_a}" in shown


async def test_a_version_that_is_not_servable_is_reported_per_item(backend: LocalBackend) -> None:
    report = await evaluate(
        backend, ScriptedJudge(), items_of(2), A, PolicyChoice("gone", 7), EvalOptions(max_tokens=4)
    )
    assert all(r.reply_b is None and "not servable" in (r.error or "") for r in report.items)
    assert report.pairs_judged == 0 and report.win_rate_b is None and report.scored_a == 2


def test_cli_eval_over_stored_sessions_with_a_checkpoint(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    import openclaw_cli.learn.judge

    monkeypatch.chdir(tmp_path)
    seed_store(tmp_path / "store.sqlite3").close()

    async def save_checkpoint() -> None:
        instance = LocalBackend(tiny_settings(tiny_model_dir, tmp_path))
        await instance.start()
        try:
            await instance.publish()
            await instance.save_state("step-00000001")
        finally:
            await instance.close()

    asyncio.run(save_checkpoint())
    judge = ScriptedJudge(pair=lambda first, second: "\\boxed{0}")
    monkeypatch.setattr(openclaw_cli.learn.judge, "make_judge_client", lambda settings, backend=None: judge)
    sets = [
        f"model={tiny_model_dir}",
        "lora.rank=4",
        "lora.alpha=8",
        f"store.path={tmp_path / 'store.sqlite3'}",
        f"local.state_dir={tmp_path / 'ckpt'}",
    ]
    args = ["eval", "--json", "--last", "2", "--max-tokens", "4"]
    for pair in sets:
        args += ["--set", pair]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)["eval"]
    assert document["b"]["spec"] == "latest" and document["b"]["checkpoint"].endswith("step-00000001")
    assert document["b"]["version"] == 1 and document["a"]["version"] == 0
    assert (document["n"], document["ties"], document["win_rate_b"]) == (2, 2, 0.5)
    assert [i["source"] for i in document["items"]] == ["turn:3", "turn:4"]

    result = CliRunner().invoke(app, [*args, "--b", "nope"])
    assert result.exit_code == 1 and "unknown version 'nope'" in result.output


def test_cli_errors_are_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    store_set = ["--set", f"store.path={tmp_path / 'store.sqlite3'}", "--set", f"local.state_dir={tmp_path / 'c'}"]

    result = runner.invoke(app, ["eval", *store_set])
    assert result.exit_code == 1 and "error: no store at" in result.output

    Store(tmp_path / "store.sqlite3").close()
    result = runner.invoke(app, ["eval", *store_set])
    assert result.exit_code == 1 and "nothing to eval" in result.output

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    result = runner.invoke(app, ["eval", "--prompts", str(prompts), *store_set])
    assert result.exit_code == 1 and "no checkpoints in" in result.output

    result = runner.invoke(app, ["eval", "--plot-only", *store_set])
    assert result.exit_code == 2 and "--plot-only needs --plot" in result.output
    result = runner.invoke(app, ["eval", "--plot-only", "--plot", str(tmp_path / "r.png"), *store_set])
    assert result.exit_code == 1 and "no training steps recorded yet" in result.output


# --- the plot --------------------------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    crc = struct.unpack(">I", data[16 + length : 20 + length])[0]
    assert crc == zlib.crc32(data[12 : 16 + length])  # the header chunk is intact
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
    return struct.unpack(">II", data[16:24])


def test_reward_plot_is_a_valid_png(tmp_path: Path) -> None:
    with Store(tmp_path / "store.sqlite3") as store:
        for step in range(1, 13):
            store.record_step(step, step, {"loss": 0.1, "mean_reward": -1 + step / 6})
        store.record_step(13, 13, {"loss": 0.1, "mean_reward": None})  # a step with nothing judged: skipped
        steps = store.steps()
    out = tmp_path / "reward.png"
    assert plot_reward_over_steps(steps, out) == "mean_reward"
    assert png_size(out.read_bytes()) == (700, 400)

    with pytest.raises(EvalError, match=r"no step records a reward under .*keys seen: loss"):
        plot_reward_over_steps([(1, 1, 0.0, {"loss": 1.0})], out)
    with pytest.raises(EvalError, match="no training steps recorded yet"):
        plot_reward_over_steps([], out)
    assert plot_reward_over_steps([(1, 1, 0.0, {"r": 0.5})], out, metric="r") == "r"
