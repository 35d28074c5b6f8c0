"""Does the loop learn? A scripted user corrects one behaviour; watch reward and behaviour per training step.

    python bench/learning.py [--minutes 5] [--model smollm2|tiny|PATH] [--max-words 20]

Everything runs in one process on the real pieces: the local backend (the embedded SmolLM2-135M-Instruct by
default), the proxy app with capture into a temporary SQLite store (served by uvicorn on 127.0.0.1), the judge loop
(:class:`openclaw_cli.judge.JudgeLoop`) with the policy itself as judge (``make_judge_client`` with no judge model:
the frozen base version), and the trainer loop (:class:`openclaw_cli.trainer_loop.TrainerLoop`, Binary RL).

The scripted users ask short factual questions over the OpenAI API with an ``X-Session-Id``. The behaviour they
want: a right answer (it names one of the question's key words) in at most ``--max-words`` words. A longer reply
gets a correction as the next message ("No, that is far too long ..."), a short one that misses the point gets
"No, that does not answer my question", a good one gets thanks and the next question, so the next state carries
the signal the judge should read. For every training step the script prints the judge's mean reward of the step's
batch and, measured independently by the user's own rule, the share of replies since the previous step that were
good (short and right). At the end it compares the first and last thirds of the run and shows a few replies.

What to expect: the judge is a 135M model reading its own transcripts; it rarely answers with a valid
``\\boxed{}`` vote, so most turns score 0 and are masked out, and few or no training steps happen. ``--judge
scripted`` swaps in a rule that reads the user's reaction (the control: is the trainer learning when the reward is
right?). The behaviour column is the ground truth of whether the policy learned.

Seen on a shared 2-core CPU, SmolLM2, 8-10 min runs: the policy as judge gave almost no valid vote (2 steps, 2
samples in 8 min). With the scripted judge and a length-only rule (an earlier version of this script), lr 1e-3, the
short-reply share went 56% -> 100% in about 15 steps, by collapsing to "The answer is:" (reward hacking the rule).
With the current rule (short and right), the 135M model is almost never right at first, every batch is all -1, and
at lr 1e-3 the policy degenerated to gibberish within 20 steps: Binary RL without a baseline only pushes down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

SYSTEM = "You are a helpful assistant."
# Each question with the words (lower case) one of which a right answer contains: a short reply must also answer,
# else "The answer is:" would satisfy the user and the policy learns exactly that (seen in an earlier run).
QUESTIONS: dict[str, tuple[str, ...]] = {
    "What is the capital of France?": ("paris",),
    "Why is the sky blue?": ("scatter",),
    "What is photosynthesis?": ("light", "sun"),
    "Who wrote Romeo and Juliet?": ("shakespeare",),
    "How many legs does a spider have?": ("8", "eight"),
    "What is the boiling point of water?": ("100", "212"),
    "What does a CPU do?": ("process", "instruction", "comput"),
    "Why do we have seasons?": ("tilt", "axis"),
    "What is the largest ocean on Earth?": ("pacific",),
    "How do airplanes fly?": ("lift", "wing"),
    "What is gravity?": ("force", "attract", "mass"),
    "What is the speed of light?": ("299", "300", "186", "3 x 10", "3x10"),
    "What language is spoken in Brazil?": ("portuguese",),
    "What is a prime number?": ("divisible", "factor", "divisor"),
    "How does a rainbow form?": ("refract", "reflect", "droplet", "prism"),
    "What is DNA?": ("genetic", "gene", "deoxyribo", "hered"),
}
CORRECTION = "No, that is far too long. Answer in one short sentence, please."
WRONG = "No, that does not answer my question. Try again."
THANKS = "Thanks, short and clear. Next question: {question}"


class ScriptedRewardJudge:
    """The control (``--judge scripted``): a judge that reads the user's reaction exactly as the users script it,
    so the run shows whether the trainer learns from a correct reward, independent of judge quality."""

    name = "scripted(next state)"

    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        text = str(messages[-1].get("content", ""))
        # Only the next-state part of the judge prompt: the context above it may quote an earlier correction.
        marker = text.rfind("## Next state")
        next_state = text[marker:] if marker >= 0 else text
        if CORRECTION in next_state or WRONG in next_state:
            return "The user corrects the reply. \\boxed{-1}"
        if THANKS.split("{", 1)[0] in next_state:
            return "The user moves on. \\boxed{1}"
        return "\\boxed{0}"


def word_count(text: str) -> int:
    return len(text.split())


@dataclass
class Observed:
    """Every reply the users got: (time, short enough and answering the question?)."""

    replies: list[tuple[float, bool]] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # the replies themselves, to eyeball

    def share_short(self, since: float, until: float) -> tuple[float | None, int]:
        window = [ok for t, ok in self.replies if since <= t < until]
        return (sum(window) / len(window) if window else None), len(window)


async def scripted_user(
    client: Any, user: int, args: argparse.Namespace, observed: Observed, stop: asyncio.Event
) -> None:
    rng = random.Random(user)
    while not stop.is_set():
        session = f"user{user}-{uuid.uuid4().hex[:8]}"
        question = rng.choice(list(QUESTIONS))
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        for _ in range(args.turns):
            if stop.is_set():
                return
            body = {"model": "policy", "messages": messages, "max_tokens": args.max_tokens, "temperature": 0.8}
            response = await client.post(
                "/v1/chat/completions", json=body, headers={"X-Session-Id": session, "X-Turn-Type": "main"}
            )
            if response.status_code != 200:
                print(f"  user {user}: request failed {response.status_code}: {response.text[:200]}")
                await asyncio.sleep(1)
                break
            reply = response.json()["choices"][0]["message"].get("content") or ""
            short = word_count(reply) <= args.max_words
            answers = any(word in reply.lower() for word in QUESTIONS[question])
            observed.replies.append((time.time(), short and answers))
            observed.texts.append(reply)
            if not short:
                follow_up = CORRECTION
            elif not answers:
                follow_up = WRONG
            else:
                question = rng.choice(list(QUESTIONS))
                follow_up = THANKS.format(question=question)
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]


def build_settings(args: argparse.Namespace, work: Path) -> Any:
    from openclaw_cli.settings import Settings

    if args.model == "tiny":
        from openclaw_cli.testing.tiny_model import save_tiny_model

        model: str | None = str(save_tiny_model(work / "tiny-model"))
    else:
        model = None if args.model == "smollm2" else args.model
    return Settings(
        model=model,
        method="rl",
        judge={"votes": args.votes, "max_concurrency": 2},
        lora={"rank": args.rank, "alpha": args.rank * 2},
        train={"lr": args.lr, "batch_size": args.batch_size, "checkpoint_every": 1000},
        store={"path": work / "store.sqlite3"},
        local={"state_dir": work / "ckpt", "device": "auto", "keep_versions": 3, "max_concurrent_requests": 4},
        proxy={"accept_any_model": True},
    )


async def serve(app: Any) -> tuple[Any, asyncio.Task[None], str]:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


def _fmt(value: Any, pattern: str) -> str:
    return "   n/a" if value is None else pattern.format(value)


async def report_steps(store: Any, observed: Observed, started: float, stop: asyncio.Event) -> list[tuple]:
    """Print each new training step as it lands; returns (step, reward, share good, n replies) rows."""
    rows: list[tuple] = []
    printed = 0
    last_time = started
    print(f"{'step':>5}{'version':>8}{'t (s)':>8}{'reward':>9}{'good %':>9}{'replies':>9}{'loss':>10}")
    while True:
        steps = await asyncio.to_thread(store.steps)
        for step, version, created_at, metrics in steps[printed:]:
            share, n = observed.share_short(last_time, created_at)
            reward = metrics.get("mean_reward")
            print(
                f"{step:>5}{version if version is not None else '-':>8}{created_at - started:>8.0f}"
                f"{_fmt(reward, '{:>+9.2f}')}{_fmt(None if share is None else 100 * share, '{:>9.0f}')}{n:>9}"
                f"{_fmt(metrics.get('loss'), '{:>10.4f}')}"
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


async def main_async(args: argparse.Namespace) -> int:
    import httpx

    from backends.local import LocalBackend
    from openclaw_cli.judge import JudgeLoop, make_judge_client
    from openclaw_cli.proxy import create_app
    from openclaw_cli.sessions import SessionCapture
    from openclaw_cli.store import Store
    from openclaw_cli.trainer_loop import TrainerLoop

    with tempfile.TemporaryDirectory(prefix="openclaw-learning-bench-") as tmp:
        work = Path(tmp)
        settings = build_settings(args, work)
        backend = LocalBackend(settings)
        t0 = time.perf_counter()
        await backend.start()
        print(f"model: {settings.model or 'embedded SmolLM2-135M-Instruct'} loaded in {time.perf_counter() - t0:.1f}s")
        store = Store(settings.store.path)
        server, server_task, base_url = await serve(create_app(backend, SessionCapture(store, settings), settings))
        client = ScriptedRewardJudge() if args.judge == "scripted" else make_judge_client(settings, backend)
        judge = JudgeLoop(store, client, settings, max_tokens=args.judge_max_tokens, poll_s=0.5)
        trainer = TrainerLoop(store, backend, settings, poll_s=0.5)
        print(
            f"judge: {judge.judge_name}, {settings.judge.votes} vote(s); training: {settings.method}, batch "
            f"{settings.train.batch_size}, lr {settings.train.lr}, LoRA rank {settings.lora.rank}; users: {args.users} "
            f"x {args.turns} turns/session; goal: right answers in at most {args.max_words} words; {args.minutes} min"
        )
        stop_users, stop_loops, stop_report = asyncio.Event(), asyncio.Event(), asyncio.Event()
        observed = Observed()
        started = time.time()
        async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
            loops = [asyncio.create_task(judge.run(stop_loops)), asyncio.create_task(trainer.run(stop_loops))]
            users = [
                asyncio.create_task(scripted_user(client, u, args, observed, stop_users)) for u in range(args.users)
            ]
            reporter = asyncio.create_task(report_steps(store, observed, started, stop_report))
            try:
                await asyncio.sleep(args.minutes * 60)
            finally:
                stop_users.set()
                await asyncio.gather(*users, return_exceptions=True)
                stop_loops.set()
                await asyncio.gather(*loops, return_exceptions=True)
                stop_report.set()
                rows = await reporter
        ended = time.time()
        summarize(observed, rows, started, ended)
        print(
            f"judged {judge.stats.judged} turns (last error: {judge.stats.last_error}); trainer: "
            f"{trainer.stats.steps} steps, {trainer.stats.trained_samples} samples, failures "
            f"{trainer.stats.failures} (last error: {trainer.stats.last_error})"
        )
        server.should_exit = True
        with contextlib.suppress(Exception):
            await server_task
        await backend.close()
        store.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (embedded default), tiny, or a model path")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--max-words", type=int, default=20, help="the length limit the users want")
    parser.add_argument("--max-tokens", type=int, default=64, help="policy reply limit")
    parser.add_argument("--users", type=int, default=2, help="concurrent scripted users")
    parser.add_argument("--turns", type=int, default=4, help="turns per session")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument(
        "--judge",
        choices=["policy", "scripted"],
        default="policy",
        help="policy: the policy judges itself (default); scripted: a rule that reads the user's reaction (control)",
    )
    parser.add_argument("--votes", type=int, default=1, help="judge votes per turn")
    parser.add_argument("--judge-max-tokens", type=int, default=160)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
