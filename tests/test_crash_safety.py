"""`kill -9` of a real `openclaw launch` under load, several times, on one store.

A client thread drives four conversations at once through the real SDKs (OpenAI streaming and not, Anthropic
streaming and not) while the launch process serves, judges (a scripted OpenAI-compatible judge on loopback) and
trains (local backend, tiny model, a step every 2 judged turns, a checkpoint every 2 steps). The process is killed
with SIGKILL at seeded random moments — mid-request, mid-judge, mid-step, mid-publish, mid-checkpoint, wherever the
moment falls — and restarted on the same store and state_dir. Checked:

- after every restart: what the store says about steps up to the newest checkpoint is untouched, and every step
  after it (trained, committed, but never checkpointed: its weights died with the process) is gone, so its turns
  are trained again on top of that checkpoint;
- at the end (one more restart, then a clean stop): every reply the client received in full is stored exactly once
  (matched by response id, with the text it received), no turn appears in two step records, each trained turn's
  claim names the step that lists it, the steps end at the final checkpoint, and SQLite's integrity check passes.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from runtime_helpers import free_port

from openclaw_cli.learn.trainer_loop import list_checkpoints
from openclaw_cli.store import Store
from openclaw_cli.testing.judge_server import FakeJudgeServer

REPO_ROOT = Path(__file__).resolve().parents[1]
KILLS = 3
SEED = 20240611
TURNS_PER_SESSION = 4  # then the conversation starts over under a new session id (short prompts, fast steps)


def judge_answer(messages: list[dict[str, Any]]) -> str:
    """+1 or -1, fixed per prompt, so batches carry a training signal and reruns judge alike."""
    digest = hashlib.sha256(messages[-1]["content"].encode()).digest()
    return "\\boxed{1}" if digest[0] % 2 else "\\boxed{-1}"


@dataclass
class Received:
    api: str
    stream: bool
    response_id: str
    text: str
    run: int = 0  # which launch process served it (0 = the first)


class IncompleteReply(Exception):
    """A stream that ended cleanly without its final event: a server bug, not a crash."""


@dataclass
class Conversation:
    api: str
    stream: bool
    number: int = 0
    generation: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return f"{self.api}-{'stream' if self.stream else 'plain'}-{self.number}-{self.generation}"

    def next_user_message(self) -> None:
        if len(self.messages) >= 2 * TURNS_PER_SESSION:
            self.generation += 1
            self.messages = []
        self.messages.append({"role": "user", "content": f"Q{len(self.messages) // 2} of {self.session_id}?"})


class LoadDriver(threading.Thread):
    """Round-robin over the conversations; a reply counts as received only when the SDK finished it cleanly."""

    def __init__(self, port: int) -> None:
        super().__init__(name="crash-test-client", daemon=True)
        base = f"http://127.0.0.1:{port}"
        self.openai = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=20)
        self.anthropic = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=20)
        self.conversations = [
            Conversation(api, stream, number=i)
            for i, (api, stream) in enumerate(
                [("openai", True), ("openai", False), ("anthropic", True), ("anthropic", False)]
            )
        ]
        for conversation in self.conversations:
            conversation.next_user_message()
        self.received: list[Received] = []
        self.failed_requests = 0
        self.incomplete_replies = 0
        self.run_number = 0  # set by the test at each restart
        self.died: BaseException | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            self._drive()
        except BaseException as exc:  # reported by the test: a dead client would make the load silently stop
            self.died = exc

    def _drive(self) -> None:
        while not self.halt.is_set():
            for conversation in self.conversations:
                if self.halt.is_set():
                    return
                run = self.run_number
                try:
                    got = self._send(conversation)
                except IncompleteReply:
                    self.incomplete_replies += 1
                    continue
                except Exception:  # refused, reset, cut off mid-body (the SDKs raise their own and httpx's kinds)
                    self.failed_requests += 1  # the server is down or died mid-reply: not received, try again
                    time.sleep(0.2)
                    continue
                got.run = run
                self.received.append(got)
                conversation.messages.append({"role": "assistant", "content": got.text})
                conversation.next_user_message()

    def _send(self, conversation: Conversation) -> Received:
        headers = {"x-session-id": conversation.session_id}
        messages: Any = list(conversation.messages)
        if conversation.api == "openai":
            if not conversation.stream:
                reply = self.openai.chat.completions.create(
                    model="policy", messages=messages, max_tokens=4, extra_headers=headers
                )
                return Received("openai", False, reply.id, reply.choices[0].message.content or "")
            parts, response_id, finished = [], "", False
            for chunk in self.openai.chat.completions.create(
                model="policy", messages=messages, max_tokens=4, stream=True, extra_headers=headers
            ):
                response_id = chunk.id
                for choice in chunk.choices:
                    parts.append(choice.delta.content or "")
                    finished = finished or choice.finish_reason is not None
            if not finished:
                raise IncompleteReply(f"OpenAI stream {response_id} ended without a finish_reason")
            return Received("openai", True, response_id, "".join(parts))
        if not conversation.stream:
            message = self.anthropic.messages.create(
                model="policy", messages=messages, max_tokens=4, extra_headers=headers
            )
        else:
            with self.anthropic.messages.stream(
                model="policy", messages=messages, max_tokens=4, extra_headers=headers
            ) as stream:
                for _ in stream:
                    pass
                message = stream.get_final_message()  # raises unless message_stop arrived
        text = "".join(block.text for block in message.content if block.type == "text")
        return Received("anthropic", conversation.stream, message.id, text)


class Launch:
    """`openclaw launch` as a child process: the real CLI, output to a log file."""

    def __init__(self, tmp_path: Path, model_dir: Path, judge_url: str, port: int) -> None:
        self.port = port
        self.log_path = tmp_path / "launch.log"
        self.store_path = tmp_path / "store.sqlite3"
        self.state_dir = tmp_path / "ckpt"
        self.cwd = tmp_path
        sets = {
            "store.path": self.store_path,
            "local.state_dir": self.state_dir,
            "local.max_concurrent_requests": 2,
            "judge.base_url": judge_url,
            "judge.model": "scripted-judge",
            "judge.votes": 1,
            "method": "rl",  # the scripted judge's votes are the signal
            "train.batch_size": 2,
            "train.checkpoint_every": 2,
            "lora.rank": 4,
            "lora.alpha": 8,
            "proxy.accept_any_model": "true",
        }
        self.argv = [sys.executable, "-m", "openclaw_cli", "launch", "--no-ui", "--model", str(model_dir)]
        self.argv += ["--port", str(port)]
        for key, value in sets.items():
            self.argv += ["--set", f"{key}={value}"]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Start and wait until it serves; returns when it was started."""
        started = time.time()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start at {started:.3f} =====\n".encode())
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.cwd,
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"launch exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1).status_code == 200:
                    return started
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"launch did not serve within 60 s:\n{self.log_tail()}")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(timeout=30) == -signal.SIGKILL

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def wait_for_uncheckpointed_step(launch: Launch, since: float, timeout_s: float) -> None:
    """Wait for an odd step committed by the process started at ``since``: an older odd step may be one the new
    process has not discarded yet (it resumes after it starts serving)."""
    conn = sqlite3.connect(f"file:{launch.store_path}?mode=ro", uri=True, timeout=5)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            (last,) = conn.execute("SELECT IFNULL(MAX(step), 0) FROM steps WHERE created_at >= ?", (since,)).fetchone()
            if last % 2 == 1:
                return
            time.sleep(0.01)
    finally:
        conn.close()


@dataclass
class KillState:
    """What the store and the state dir held right after a kill."""

    steps: dict[int, tuple[float, dict[str, Any]]]  # step -> (created_at, metrics)
    checkpoint: int  # newest finished checkpoint on disk (0: none)


def wait_for_a_reply(driver: LoadDriver, run: int, timeout_s: float) -> None:
    """Wait until the client has a full reply from process ``run``, so every process serves some load."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not any(r.run == run for r in driver.received):
        time.sleep(0.05)


def read_after_kill(launch: Launch) -> KillState:
    with Store(launch.store_path) as store:
        steps = {step: (created, metrics) for step, _, created, metrics in store.steps()}
    found = list_checkpoints(launch.state_dir)
    return KillState(steps, found[-1][0] if found else 0)


def check_recovery(launch: Launch, before: KillState, restarted_at: float) -> int:
    """Steps up to the newest checkpoint are as they were; every step after it is gone or new. Returns how many
    committed steps the crash had lost (their turns are trained again)."""
    with Store(launch.store_path) as store:
        now = {step: (created, metrics) for step, _, created, metrics in store.steps()}
    for step, row in before.steps.items():
        if step <= before.checkpoint:
            assert now.get(step) == row, f"step {step} (checkpointed) changed across the restart"
    for step, (created, _) in now.items():
        if step > before.checkpoint:
            assert created >= restarted_at, f"step {step} survived the crash but no checkpoint had it"
    return sum(1 for step in before.steps if step > before.checkpoint)


# Four starts of a process that imports torch and transformers: about a minute on 2 idle cores, more when they
# are busy with other work.
@pytest.mark.timeout(300)
def test_kill_9_at_random_moments_loses_no_received_reply_and_trains_no_turn_twice(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    with FakeJudgeServer(judge_answer) as judge:
        port = free_port()
        launch = Launch(tmp_path, tiny_model_dir, judge.base_url, port)
        driver = LoadDriver(port)
        started_at = launch.start()
        driver.start()
        lost_steps = 0
        try:
            for kill in range(KILLS):
                wait_for_a_reply(driver, kill, timeout_s=60)
                if kill == 1:
                    # Aim one kill at the window between a step's commit and the next checkpoint (an odd step with
                    # a checkpoint every 2), so recovery from a lost step is exercised whatever the timing; the
                    # others land wherever the seeded clock puts them.
                    wait_for_uncheckpointed_step(launch, since=started_at, timeout_s=30)
                else:
                    time.sleep(rng.uniform(1.0, 3.0))
                launch.kill()
                state = read_after_kill(launch)
                time.sleep(rng.uniform(0.0, 0.5))  # the client keeps knocking on a closed port meanwhile
                started_at = launch.start()
                driver.run_number = kill + 1
                lost_steps += check_recovery(launch, state, started_at)
            time.sleep(2.0)
        finally:
            driver.halt.set()
            driver.join(timeout=30)
            exit_code = launch.stop() if launch.process and launch.process.poll() is None else None
    assert exit_code == 0, launch.log_tail()
    assert driver.died is None and not driver.is_alive(), f"the client thread died: {driver.died!r}"
    assert driver.incomplete_replies == 0
    received = driver.received
    # Load got through to every process, the killed ones and the last.
    assert {r.run for r in received} == set(range(KILLS + 1)), f"replies per run: {[r.run for r in received]}"
    assert {(r.api, r.stream) for r in received} == {
        ("openai", True),
        ("openai", False),
        ("anthropic", True),
        ("anthropic", False),
    }

    conn = sqlite3.connect(launch.store_path)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()
    with Store(launch.store_path) as store:  # opens: quick_check and schema checks pass too
        turns = list(store.iter_turns())
        by_response_id: dict[str, list[Any]] = {}
        for turn in turns:
            by_response_id.setdefault(turn.metadata.get("request_id", ""), []).append(turn)
        for reply in received:
            stored = by_response_id.get(reply.response_id, [])
            assert len(stored) == 1, f"{reply} is stored {len(stored)} times"
            (turn,) = stored
            assert (turn.api, turn.stream) == (reply.api, reply.stream)
            if not turn.assistant_message.get("tool_calls"):
                assert (turn.assistant_message.get("content") or "") == reply.text

        steps = store.steps()
        trained = [turn_id for *_, metrics in steps for turn_id in metrics["trained_turn_ids"]]
        assert len(trained) == len(set(trained)), "a turn was trained by two surviving steps"
        claim_steps = dict(
            store._read("SELECT turn_id, step FROM claims WHERE consumer = 'trainer' AND step IS NOT NULL")
        )
        for step, _, _, metrics in steps:
            for turn_id in metrics["trained_turn_ids"]:
                assert claim_steps[turn_id] == step
        assert [s for s, *_ in steps] == list(range(1, len(steps) + 1))
        assert steps, f"nothing was trained:\n{launch.log_tail()}"
        # The clean stop checkpointed the last step: nothing in the store is ahead of the saved weights.
        assert list_checkpoints(launch.state_dir)[-1][0] == steps[-1][0]
        assert store.checkpoints()[-1][0] == steps[-1][0]
    summary = {
        "replies_received": len(received),
        "failed_requests": driver.failed_requests,
        "turns_stored": len(turns),
        "steps": len(steps),
        "steps_lost_and_redone": lost_steps,
    }
    print(json.dumps(summary))
