"""The promotion gate: a trained version is staged, evaluated against the served one on held-out stored sessions
with a scripted judge, and served only when it does not regress; held-back candidates stay servable by pin; failures
hold back (fail closed); a rollback during the evaluation wins; the trainer publishes through the gate."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import free_port

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.promotion import GateConfigError, PromotionGate, held_out_items
from openclaw_cli.learn.trainer_loop import TrainerLoop
from openclaw_cli.settings import LocalSettings, Settings, TrainSettings
from openclaw_cli.store import Store
from openclaw_cli.testing.fake_backend import FakeBackend
from openclaw_cli.testing.fake_training import FakeTrainingBackend
from openclaw_cli.testing.store_turns import captured_exchange
from openclaw_cli.types import PolicyVersion

pytestmark = pytest.mark.timeout(60)

REPLY = re.compile(r"Reply (\d):\nanswer from version (\d+)")


def reply_for_version(version: int) -> str:
    return f"answer from version {version}"


class EvalJudge:
    """Scripted eval judge: grades every reply 1, and in a pair prefers the newer version (or the older one)."""

    name = "eval-judge"

    def __init__(self, prefer: str = "newer") -> None:
        self.prefer = prefer
        self.calls = 0
        self.on_call: Any = None

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        self.calls += 1
        if self.on_call is not None:
            await self.on_call()
        text = messages[-1]["content"]
        shown = {int(position): int(version) for position, version in REPLY.findall(text)}
        if len(shown) < 2:
            return "Fine. \\boxed{1}"
        newer = max(shown, key=shown.__getitem__)
        return f"\\boxed{{{newer if self.prefer == 'newer' else 3 - newer}}}"


class DownJudge:
    name = "down"

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        raise ConnectionError("judge unreachable")


def exchange(session: str, text: str, completion: list[int]) -> CapturedExchange:
    messages = [{"role": "user", "content": text}]
    return captured_exchange(session, messages, prompt_tokens=[11, 12, 13], completion_tokens=completion)


class World:
    def __init__(self, tmp_path: Path, tokenizer: Any, **train: Any) -> None:
        train.setdefault("batch_size", 2)
        train.setdefault("gate_sessions", 3)
        self.settings = Settings(
            method="rl",  # the judged +1 turns below are the signal; the gate is what is tested
            train=TrainSettings(promotion_gate=True, **train),
            local=LocalSettings(state_dir=tmp_path / "ckpt"),
        )
        self.store = Store(tmp_path / "store.sqlite3")
        self.capture = SessionCapture(self.store, self.settings)
        self.backend = FakeTrainingBackend(tokenizer, state_dir=tmp_path / "ckpt", reply_for_version=reply_for_version)
        self.sessions = 0

    def turn(self, *, judged: int | None = None) -> int:
        """A one-turn session, ended (ready); judged with ``judged`` when given."""
        self.sessions += 1
        session = f"s{self.sessions}"
        recorded = self.capture.record_sync(exchange(session, f"question {self.sessions}", [5, 6, 7]))
        self.capture.end_session_sync(session)
        if judged is not None:
            verdict = {"score": judged, "votes": [judged]}
            self.store.complete("judge", recorded.turn_id, json.dumps(verdict), reward=judged)
        return recorded.turn_id

    def gate(self, judge: Any) -> PromotionGate:
        return PromotionGate(self.store, self.backend, judge, self.settings)

    async def publish_after(self, sessions: int, judge: Any) -> tuple[PromotionGate, PolicyVersion]:
        """``sessions`` one-turn sessions, then step 1 published through a gate with ``judge``."""
        for _ in range(sessions):
            self.turn()
        gate = self.gate(judge)
        return gate, await gate.publish("step-00000001")


@pytest.fixture
def world(tmp_path: Path, tiny_tokenizer: Any):
    built = World(tmp_path, tiny_tokenizer)
    yield built
    built.store.close()


async def test_a_candidate_that_wins_is_promoted(world: World) -> None:
    gate, served = await world.publish_after(4, EvalJudge("newer"))
    assert served.version == 1 and world.backend.current_version().version == 1
    assert world.backend.activations == [(1, False)]  # promoted; the trainer is not touched
    decision = gate.decisions[-1]
    assert (decision.candidate, decision.served, decision.promoted) == (1, 0, True)
    # Three held-out sessions (gate_sessions), each pair judged once; the newer version always preferred.
    assert (decision.n, decision.pairs_judged, decision.win_rate) == (3, 3, 1.0)
    assert decision.reason == "no regression: win rate 1.000 >= 0.450"
    assert gate.status()["promoted"] == 1 and gate.status()["last"]["candidate"] == 1


async def test_a_candidate_that_regresses_is_held_back_but_stays_servable(world: World) -> None:
    gate, served = await world.publish_after(3, EvalJudge("older"))
    assert served.version == 0 and world.backend.current_version().version == 0
    assert world.backend.activations == [] and world.backend.servable_versions() == [0, 1]
    decision = gate.decisions[-1]
    assert not decision.promoted and decision.win_rate == 0.0
    assert decision.reason == "regression: win rate 0.000 < 0.450"
    status = gate.status()
    assert (status["held"], status["promoted"], status["evaluating"]) == (1, 0, None)


@pytest.mark.parametrize(
    ("judge", "sessions", "reason"),
    [
        (EvalJudge(), 0, "no held-out sessions to evaluate on yet"),
        (DownJudge(), 2, "evaluation failed: every judge call failed; the first error: ConnectionError"),
    ],
)
async def test_no_evidence_holds_the_candidate_back(world: World, judge: Any, sessions: int, reason: str) -> None:
    gate, served = await world.publish_after(sessions, judge)
    assert served.version == 0 and world.backend.current_version().version == 0
    decision = gate.decisions[-1]
    assert not decision.promoted and decision.reason.startswith(reason) and decision.win_rate is None


async def test_a_rollback_during_the_evaluation_wins(world: World) -> None:
    for _ in range(2):
        world.turn()
    await world.backend.publish()  # version 1 serves
    judge = EvalJudge("newer")

    async def roll_back() -> None:
        if world.backend.current_version().version == 1:
            await world.backend.activate(0, train_from=True)

    judge.on_call = roll_back
    gate = world.gate(judge)
    served = await gate.publish("step-2")
    assert served.version == 0 and world.backend.current_version().version == 0
    assert "serving changed during the evaluation" in gate.decisions[-1].reason


async def test_held_out_items_skip_trained_turns_and_keep_one_per_session(world: World) -> None:
    first = world.turn()
    second = world.turn()
    world.store.complete("trainer", first, json.dumps({"trained": True}))
    # A second turn in session s2 (a continuation): only its newest turn is used.
    history = [{"role": "user", "content": "question 2"}, {"role": "assistant", "content": "reply"}]
    follow = exchange("s2b", "more", [5, 6])
    follow.messages = [*history, {"role": "user", "content": "more"}]
    world.capture.record_sync(follow)
    items = held_out_items(world.store, 5)
    assert [item.source for item in items][-1] == f"turn:{second}"
    assert f"turn:{first}" not in [item.source for item in items]
    assert len({item.source for item in items}) == len(items) == 2


def test_a_backend_that_cannot_stage_is_refused(tiny_tokenizer: Any, tmp_path: Path) -> None:
    class Plain(FakeBackend):
        stage = None  # type: ignore[assignment]

    with Store(tmp_path / "s.sqlite3") as store, pytest.raises(GateConfigError, match=r"train\.promotion_gate"):
        PromotionGate(store, Plain(tiny_tokenizer), EvalJudge(), Settings())


@pytest.mark.parametrize(("prefer", "served_after"), [("newer", 1), ("older", 0)])
async def test_the_trainer_publishes_through_the_gate(world: World, prefer: str, served_after: int) -> None:
    ids = [world.turn(judged=1) for _ in range(2)]  # a full judged batch
    world.turn()  # and a held-out session
    loop = TrainerLoop(world.store, world.backend, world.settings)  # type: ignore[arg-type]
    gate = world.gate(EvalJudge(prefer))
    loop.publisher = gate.publish
    report = await loop.run_once()
    assert report is not None and report.step == 1 and report.version == served_after
    assert world.backend.current_version().version == served_after and world.backend.steps == 1
    steps = await asyncio.to_thread(world.store.steps)
    assert steps[-1][1] == served_after
    for turn_id in ids:
        assert world.store.result_of("trainer", turn_id)["version"] == served_after


async def test_launch_wires_the_gate_into_training_and_status(tiny_tokenizer: Any, tmp_path: Path) -> None:
    import httpx

    from openclaw_cli.launch import Runtime, launch
    from openclaw_cli.settings import StoreSettings

    settings = Settings(
        port=free_port(),
        train=TrainSettings(promotion_gate=True, gate_margin=0.1),
        store=StoreSettings(path=tmp_path / "store.sqlite3"),
        local=LocalSettings(state_dir=tmp_path / "ckpt"),
        proxy={"accept_any_model": True},
    )
    backend = FakeTrainingBackend(tiny_tokenizer, state_dir=tmp_path / "ckpt")
    stop = asyncio.Event()
    ready: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        launch(settings, ui=False, stop=stop, judge_client=EvalJudge(), backend=backend, on_ready=ready.set_result)
    )
    runtime = await asyncio.wait_for(asyncio.shield(ready), timeout=30)
    try:
        assert runtime.trainer.publisher == runtime.gate.publish  # type: ignore[union-attr]
        async with httpx.AsyncClient(base_url=runtime.url, timeout=30) as http:
            promotion = (await http.get("/v1/openclaw/status")).json()["loops"]["promotion"]
        assert promotion == {
            "enabled": True,
            "collapse_guard": {"enabled": True, "held": 0, "last": None},
            "promoted": 0,
            "held": 0,
            "evaluating": None,
            "threshold": 0.4,
            "last": None,
        }
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)

    class Plain(FakeBackend):
        activate = None  # type: ignore[assignment]

    settings.port = free_port()
    with pytest.raises(GateConfigError, match="cannot"):
        await launch(settings, ui=False, judge_client=EvalJudge(), backend=Plain(tiny_tokenizer))
