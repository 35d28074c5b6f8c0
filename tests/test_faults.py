"""Faults: a judge that rejects a turn (gives up after a few tries, visible in status), a judge that is down (turns
wait, uncounted, and serving goes on), and a trainer that fails (retried from discarded gradients, or skipped, while
the last good policy keeps serving) — on the real local backend and the real `launch` runtime where it matters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from runtime_helpers import runtime_settings as tiny_runtime_settings

from openclaw_cli.launch import Runtime, launch
from openclaw_cli.learn.judge import JudgeLoop, OpenAIJudgeClient
from openclaw_cli.settings import Settings, TrainSettings
from openclaw_cli.store import Store
from openclaw_cli.testing.judge_server import FakeJudgeServer
from openclaw_cli.testing.store_turns import new_turn

pytestmark = pytest.mark.timeout(120)


def seed_judgeable(store: Store, texts: list[str]) -> list[int]:
    """One ready turn per text, each with a next state the judge can score."""
    ids = []
    with store.transaction() as tx:
        tx.create_session("s", scope="", id_source="test", now=100.0)
        for i, text in enumerate(texts):
            turn_id = tx.insert_turn(new_turn("s", index=i, status="pending", user_text=text))
            tx.set_next_state(turn_id, [{"role": "user", "content": "thanks"}], "user", 101.0 + i)
            ids.append(turn_id)
    return ids


async def no_sleep(_: float) -> None:
    return None


# --- the judge ------------------------------------------------------------------------------------------------------
async def test_a_turn_the_judge_keeps_rejecting_is_given_up_and_counted(tmp_path: Path) -> None:
    def answer(messages: list[dict[str, Any]]) -> str | tuple[int, str]:
        if "HUGE" in messages[-1]["content"]:
            return 400, "This model's maximum context length is 8192 tokens"
        return "Progress. \\boxed{1}"

    with FakeJudgeServer(answer) as server, Store(tmp_path / "s.sqlite3") as store:
        huge, fine = seed_judgeable(store, ["HUGE question", "small question"])
        settings = Settings(method="rl", judge={"votes": 1, "mode": "vote"})
        client = OpenAIJudgeClient("judge", server.base_url, timeout_s=10)  # the real openai SDK, over HTTP
        loop = JudgeLoop(store, client, settings, max_turn_attempts=2, retry_turn_after_s=0.0, sleep=no_sleep)

        assert await loop.run_once() == 1  # `fine` judged; `huge` rejected once, given back
        assert store.result_of("judge", fine)["score"] == 1
        assert store.result_of("judge", huge) is None
        assert store.handoff_counts() == {"judge": {"failed": 0, "erroring": 1}}
        assert await loop.run_once() == 0  # rejected a second time: given up
        verdict = store.result_of("judge", huge)
        assert (verdict["score"], verdict["failed"], verdict["reason"], verdict["attempts"]) == (
            None,
            True,
            "judge_failed",
            2,
        )
        assert "maximum context length" in verdict["error"] and "BadRequestError" in verdict["error"]
        assert store.handoff_counts() == {"judge": {"failed": 1, "erroring": 0}}
        assert loop.stats.gave_up == 1 and store.get_turn(huge).reward is None
        # A 400 is not retried call by call (the same prompt would be refused again): one request per attempt.
        assert sum("HUGE" in m[-1]["content"] for m in server.requests) == 2
        assert await loop.run_once() == 0 and len(server.requests) == 3  # nothing is handed out any more


async def test_a_judge_that_is_down_never_costs_a_turn_its_attempts(tmp_path: Path) -> None:
    state = {"down": True}

    def answer(messages: list[dict[str, Any]]) -> str | tuple[int, str]:
        return (503, "overloaded") if state["down"] else "\\boxed{-1}"

    with FakeJudgeServer(answer) as server, Store(tmp_path / "s.sqlite3") as store:
        (turn_id,) = seed_judgeable(store, ["question"])
        client = OpenAIJudgeClient("judge", server.base_url, timeout_s=10)
        loop = JudgeLoop(
            store,
            client,
            Settings(method="rl", judge={"votes": 1, "mode": "vote"}),
            retry_attempts=2,
            max_turn_attempts=2,
            down_wait_s=0.0,
            sleep=no_sleep,
        )
        for _ in range(4):  # many rounds with the judge down: the turn waits, never given up
            assert await loop.run_once() == 0
        assert store.result_of("judge", turn_id) is None
        assert store.handoff_counts() == {"judge": {"failed": 0, "erroring": 1}}
        failures = store._read("SELECT failures FROM claims WHERE consumer = 'judge' AND turn_id = ?", (turn_id,))
        assert failures == [(0,)] and len(server.requests) == 8  # 2 calls per round
        state["down"] = False
        assert await loop.run_once() == 1
        assert store.result_of("judge", turn_id)["score"] == -1
        assert store.handoff_counts() == {}


async def test_a_turn_whose_calls_keep_failing_while_the_judge_answers_others_is_given_up(tmp_path: Path) -> None:
    """A 5xx on one prompt while the judge judges the others: that prompt breaks the judge, so its failures count
    (the first one does not: until the judge answers another turn it could just be down)."""

    def answer(messages: list[dict[str, Any]]) -> str | tuple[int, str]:
        if "POISON" in messages[-1]["content"]:
            time.sleep(0.3)  # fails after the other turn of its batch is judged: the counting order is fixed
            return 500, "internal error"
        return "\\boxed{1}"

    with FakeJudgeServer(answer) as server, Store(tmp_path / "s.sqlite3") as store:
        # Seeded oldest first; the judge takes the newest first: POISON with q1, then q2, then q3.
        *newest_last, poison = seed_judgeable(store, ["q3", "q2", "q1", "POISON question"])
        fine = newest_last[::-1]
        loop = JudgeLoop(
            store,
            OpenAIJudgeClient("judge", server.base_url, timeout_s=10),
            Settings(method="rl", judge={"votes": 1, "mode": "vote"}),
            batch_size=2,
            retry_attempts=1,
            max_turn_attempts=2,
            down_wait_s=0.0,
            sleep=no_sleep,
        )
        counted = "SELECT failures FROM claims WHERE consumer = 'judge' AND turn_id = ?"
        assert await loop.run_once() == 1  # q1 judged; POISON failed, not counted (the judge may just be down)
        assert store._read(counted, (poison,)) == [(0,)] and store.result_of("judge", poison) is None
        assert await loop.run_once() == 1  # q2 judged since POISON's last failure: this one counts
        assert store._read(counted, (poison,)) == [(1,)]
        assert await loop.run_once() == 1  # q3 judged; POISON's second counted failure: given up
        verdict = store.result_of("judge", poison)
        assert (verdict["failed"], verdict["reason"], verdict["attempts"]) == (True, "judge_failed", 2)
        assert "while the judge answered other turns" in verdict["error"]
        assert [store.result_of("judge", t)["score"] for t in fine] == [1, 1, 1]
        assert loop.stats.gave_up == 1 and store.handoff_counts() == {"judge": {"failed": 1, "erroring": 0}}


async def test_the_judge_resumes_turns_a_killed_process_was_judging_without_waiting_for_the_lease(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sqlite3"
    crashed = Store(path)
    (turn_id,) = seed_judgeable(crashed, ["question"])
    assert [t.id for t in crashed.claim_ready("judge", 8, lease_s=600.0)] == [turn_id]  # then killed mid-judge
    crashed.close()

    with FakeJudgeServer(lambda messages: "\\boxed{1}") as server, Store(path) as store:
        loop = JudgeLoop(
            store,
            OpenAIJudgeClient("judge", server.base_url, timeout_s=10),
            Settings(method="rl", judge={"mode": "vote"}),
        )
        stop = asyncio.Event()
        runner = asyncio.create_task(loop.run(stop))
        deadline = time.monotonic() + 10
        while store.result_of("judge", turn_id) is None:  # well before the 600 s lease would have run out
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(runner, timeout=10)
        assert store.result_of("judge", turn_id)["score"] == 1


# --- the trainer on the real local backend ------------------------------------------------------------------------
async def test_a_retried_step_after_an_optim_step_failure_accumulates_the_batch_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.learn.trainer_loop import TrainerLoop
    from openclaw_cli.types import AdamParams

    settings = runtime_settings(tiny_model_dir, tmp_path, train=TrainSettings(batch_size=2))
    failing, reference = LocalBackend(settings), LocalBackend(settings)
    await failing.start()
    await reference.start()
    try:
        trainer = failing._require_trainer()
        real_optim_step = trainer.optim_step
        seen: dict[str, Any] = {"calls": 0}

        def optim_step_failing_once(adam: AdamParams) -> Any:
            seen["calls"] += 1
            if seen["calls"] == 1:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")  # before any update
            seen["grads"] = [p.grad.detach().clone() for p in trainer._lora_params]
            return real_optim_step(adam)

        trainer.optim_step = optim_step_failing_once  # type: ignore[method-assign]
        real_forward_backward = failing.forward_backward
        batches: list[Any] = []

        async def spy_forward_backward(datums: Any, loss: Any, loss_config: Any = None) -> Any:
            batches.append(datums)
            return await real_forward_backward(datums, loss, loss_config)

        failing.forward_backward = spy_forward_backward  # type: ignore[method-assign]

        with Store(settings.store.path) as store:
            tokenizer = failing.tokenizer()
            turns = []
            for i, text in enumerate(["Hello!", "Thanks!"]):  # ready turns with the policy's own log-probs
                prompt = tokenizer.render([{"role": "user", "content": text}])
                completion = tokenizer.encode("Paris.")
                scored = await failing.compute_logprobs(prompt + completion)
                logprobs = [float(v) for v in scored[len(prompt) :] if v is not None]
                turns.append(
                    new_turn("s", index=i, prompt_tokens=prompt, completion_tokens=completion, logprobs=logprobs)
                )
            with store.transaction() as tx:
                tx.create_session("s", scope="", id_source="test", now=1.0)
                ids = [tx.insert_turn(turn) for turn in turns]
            for turn_id, score in zip(ids, (1, -1), strict=True):
                store.complete("judge", turn_id, f'{{"score": {score}}}', reward=score)
            loop = TrainerLoop(store, failing, settings)
            assert await loop.run_once() is None  # optim_step failed after forward_backward accumulated
            report = await loop.run_once()
            assert report is not None and report.step == 1 and failing.current_version().version == 1
        assert len(batches) == 2 and [d.model_input for d in batches[0]] == [d.model_input for d in batches[1]]

        # What one forward_backward of that batch accumulates on a fresh trainer with the same initial weights:
        await reference.forward_backward(batches[0], "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})
        expected = [p.grad for p in reference._require_trainer()._lora_params]
        assert all(torch.allclose(got, want) for got, want in zip(seen["grads"], expected, strict=True))
        assert any(want.abs().sum() > 0 for want in expected)  # a real gradient, so doubling it would show
    finally:
        await failing.close()
        await reference.close()


# --- the whole runtime --------------------------------------------------------------------------------------------


def runtime_settings(model_dir: Path, tmp_path: Path, **overrides: Any) -> Settings:
    # Binary RL on the scripted judge's votes: the faults, not the method, are under test.
    return tiny_runtime_settings(model_dir, tmp_path, **{"method": "rl", **overrides})


class DownJudge:
    name = "down"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        self.calls += 1
        raise ConnectionError("judge endpoint unreachable")


class ApprovingJudge:
    name = "approving"

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        return "Good. \\boxed{1}"


async def start(settings: Settings, judge: Any) -> tuple[asyncio.Task[None], Runtime, asyncio.Event]:
    stop = asyncio.Event()
    ready: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(launch(settings, ui=False, stop=stop, judge_client=judge, on_ready=ready.set_result))
    return task, await asyncio.wait_for(asyncio.shield(ready), timeout=60), stop


async def chat_turns(runtime: Runtime, session: str, n: int) -> list[Any]:
    """``n`` turns of one conversation (each one makes the previous turn ready)."""
    client = openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = []
    replies = []
    for i in range(n):
        messages.append({"role": "user", "content": f"Question {i}?"})
        reply = await client.chat.completions.create(
            model="policy", messages=messages, max_tokens=3, seed=i, extra_headers={"x-session-id": session}
        )
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    return replies


async def wait_for(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


async def test_judge_down_turns_wait_and_serving_is_unaffected(tiny_model_dir: Path, tmp_path: Path) -> None:
    judge = DownJudge()
    task, runtime, stop = await start(runtime_settings(tiny_model_dir, tmp_path), judge)
    try:
        replies = await chat_turns(runtime, "down", 3)  # two turns become ready for the judge
        await wait_for(lambda: runtime.store.handoff_counts().get("judge", {}).get("erroring", 0) >= 2, 30)
        more = await chat_turns(runtime, "still-serving", 2)  # the judge is still down: replies keep coming
        assert all(r.choices[0].message.role == "assistant" for r in [*replies, *more])
        assert judge.calls >= 2
        for turn in runtime.store.iter_turns(turn_type="main", status="ready"):
            assert runtime.store.result_of("judge", turn.id) is None and turn.reward is None
        async with httpx.AsyncClient(base_url=runtime.url) as http:
            status = (await http.get("/v1/openclaw/status")).json()
        loops = status["loops"]
        assert loops["handoff"]["judge"]["erroring"] >= 2 and loops["judge"]["gave_up"] == 0
        assert "judge endpoint unreachable" in loops["judge"]["last_error"]
        assert status["policy_version"] == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def test_a_trainer_that_always_fails_skips_batches_and_the_last_good_policy_serves(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.learn.trainer_loop import MAX_STEP_ATTEMPTS

    async def broken_optim_step(self: LocalBackend, adam: Any) -> Any:
        raise RuntimeError("optimizer on a lost device")

    monkeypatch.setattr(LocalBackend, "optim_step", broken_optim_step)
    settings = runtime_settings(tiny_model_dir, tmp_path, train=TrainSettings(batch_size=2))
    task, runtime, stop = await start(settings, ApprovingJudge())
    try:
        await chat_turns(runtime, "learner", 3)  # two ready turns: one batch
        ready = [t.id for t in runtime.store.iter_turns(turn_type="main", status="ready")]
        assert len(ready) == 2
        await wait_for(lambda: all(runtime.store.result_of("trainer", i) is not None for i in ready), 30)
        error = "RuntimeError: optimizer on a lost device"
        assert [runtime.store.result_of("trainer", i) for i in ready] == [{"trained": False, "error": error}] * 2
        assert runtime.trainer.stats.failures == MAX_STEP_ATTEMPTS and runtime.store.steps() == []
        (reply,) = await chat_turns(runtime, "after", 1)
        assert reply.system_fingerprint == "openclaw-v0"  # the base policy still serves
        assert runtime.backend.current_version().version == 0
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
