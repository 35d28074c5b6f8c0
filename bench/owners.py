"""Yours, not everyone's: does one owner's correction change another owner's bot?

    python bench/owners.py [--minutes 20] [--seeds 0 1 2] [--scopes owner shared] [--script bench/scripts/brevity.json]

One ``openclaw launch`` runtime (the real one: proxy, capture, judge, lessons, trainer) on the embedded SmolLM2 with
every default except ``lora.scope``, and two API keys. Owner A talks as the learning bench's user does
(bench/learning.py: ``--users`` concurrent sessions; a reply over ``--max-words`` words gets the script's correction).
Owner B, at the same time on the same server, asks the same kind of questions and never corrects the form: each reply
gets thanks or a follow-up. Before the users start and when the run ends, the script's held-out questions (never
asked in training) are asked plainly (``x-openclaw-lessons: off``, temperature 0, opted out of capture) with each
owner's key.

Goals, per run: A's plain replies meet the learning loop's goal (bench/learning.py's verdict: at least 40% shorter
than before, at most 1.2x the told model's words, hits at least the told model's minus 0.10, distinct-word ratio at
least 0.5); B's plain replies within 15% of their starting length, hits not lower by more than 0.05. ``--scopes owner
shared`` runs both scopes for each seed, side by side: with ``shared`` the goal for B is expected to fail (one adapter
for both owners: the contradiction an adapter per owner removes), and the table says how far B moved there.

Each run is a process of its own (see bench/learning.py's run_in_child: a run's memory is not all given back).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning  # the bench directory's learning bench: its users, held-out questions and verdict

KEYS = {"A": "sk-owner-a-bench-0000000000", "B": "sk-owner-b-bench-0000000000"}
B_LENGTH_DRIFT = 0.15  # B's plain replies stay within this share of their starting length
B_HITS_DROP = 0.05  # ... and their keyword hits fall by at most this
# B's thanks names nothing about the reply's form. The brevity script's own thanks line ("Thanks, short and clear.")
# is praise *of brevity*, a word on form the owner B never says. B used it until stop 46 (plain replies
# -11/-16/-18%); without it B still moved -20/-11/-8%, so it was not the main cause: that was B's own replies as OPD
# hints (judge.next_state_hints, docs/benchmarks.md).
B_THANKS = "Thanks! Next question: {question}"


@dataclass
class OwnerRun:
    seed: int
    scope: str
    minutes: float
    a_before: learning.HeldOut
    a_after: learning.HeldOut
    b_before: learning.HeldOut
    b_after: learning.HeldOut
    adapters: list[dict[str, Any]]
    b_turns: int


async def praising_user(client: Any, args: argparse.Namespace, stop: asyncio.Event, counted: list[int]) -> None:
    """Owner B: the same kind of questions, and whatever the reply, thanks or a follow-up; never a word on form."""
    script = learning.SCRIPT
    rng = random.Random(args.seed * 1000 + 99)
    follow_ups = ("Interesting, tell me more.", "Thanks! Why is that?", "Great answer. Can you give an example?")
    while not stop.is_set():
        session = f"owner-b-{uuid.uuid4().hex[:8]}"
        messages = [
            {"role": "system", "content": script.system},
            {"role": "user", "content": rng.choice(list(script.questions))},
        ]
        for _ in range(args.turns):
            if stop.is_set():
                return
            reply = await learning.chat_turn(client, session, messages, args, "owner B")
            if reply is None:
                break
            counted[0] += 1
            nxt = rng.choice(list(script.questions))
            follow_up = rng.choice(follow_ups) if rng.random() < 0.5 else B_THANKS.format(question=nxt)
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": follow_up}]


async def plain(base_url: str, owner: str, max_tokens: int) -> learning.HeldOut:
    import httpx

    headers = {"Authorization": f"Bearer {KEYS[owner]}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=600, headers=headers) as http:
        held_out, _ = await learning.ask_held_out_served(http, lessons=False, max_tokens=max_tokens)
    return held_out


async def run_once(args: argparse.Namespace, seed: int, scope: str) -> OwnerRun:
    import httpx

    from openclaw_cli.launch import Runtime, launch

    args.seed = seed
    random.seed(seed)
    with tempfile.TemporaryDirectory(prefix="openclaw-owners-bench-") as tmp:
        settings = learning.build_settings(args, Path(tmp), seed)
        from pydantic import SecretStr

        settings.api_keys = [SecretStr(key) for key in KEYS.values()]
        settings.lora.scope = scope
        settings.port = _free_port()
        stop = asyncio.Event()
        ready: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(launch(settings, ui=False, stop=stop, on_ready=ready.set_result))
        runtime = await asyncio.wait_for(asyncio.shield(ready), timeout=600)
        url = runtime.url
        print(f"\n=== seed {seed}, lora.scope = {scope}; {args.users} sessions of A, 1 of B; {args.minutes} min")
        a_before, b_before = await plain(url, "A", args.max_tokens), await plain(url, "B", args.max_tokens)
        started = time.time()
        stop_users = asyncio.Event()
        observed, b_turns = learning.Observed(), [0]
        a_client = httpx.AsyncClient(base_url=url, timeout=600, headers={"Authorization": f"Bearer {KEYS['A']}"})
        b_client = httpx.AsyncClient(base_url=url, timeout=600, headers={"Authorization": f"Bearer {KEYS['B']}"})
        users = [
            *(
                asyncio.create_task(learning.scripted_user(a_client, u, args, observed, stop_users))
                for u in range(args.users)
            ),
            asyncio.create_task(praising_user(b_client, args, stop_users, b_turns)),
        ]
        try:
            await asyncio.sleep(max(0.0, started + args.minutes * 60 - time.time()))
        finally:
            stop_users.set()
            await asyncio.gather(*users, return_exceptions=True)
            await a_client.aclose()
            await b_client.aclose()
        a_after, b_after = await plain(url, "A", args.max_tokens), await plain(url, "B", args.max_tokens)
        adapters = runtime.trainer.adapters()
        stop.set()
        await asyncio.wait_for(task, timeout=600)
    for row in adapters:
        print(f"  adapter {_label(row['adapter'])}: version {row['version']}, {row['steps']} steps")
    return OwnerRun(seed, scope, args.minutes, a_before, a_after, b_before, b_after, adapters, b_turns[0])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _label(adapter: str) -> str:
    """A or B for an owner's adapter (the runtime names it by the key's hash), else the adapter's own name."""
    from openclaw_cli.lesson_prompt import key_owner

    return next((owner for owner, key in KEYS.items() if key_owner(key) == adapter), adapter)


def b_verdict(run: OwnerRun) -> tuple[bool, str]:
    drift = run.b_after.words / run.b_before.words - 1 if run.b_before.words else 0.0
    hits_drop = run.b_before.hits - run.b_after.hits
    ok = abs(drift) <= B_LENGTH_DRIFT and hits_drop <= B_HITS_DROP
    words = f"B {run.b_before.words:.1f} -> {run.b_after.words:.1f} words ({drift:+.0%})"
    return ok, f"{words}, hits {run.b_before.hits:.2f} -> {run.b_after.hits:.2f}"


def result_line(run: OwnerRun, told: learning.HeldOut) -> str:
    a_ok, a_line = learning.verdict_line(run.a_before, told, run.a_after)
    b_ok, b_line = b_verdict(run)
    steps = ", ".join(f"{_label(row['adapter'])} {row['steps']}" for row in run.adapters)
    return (
        f"seed {run.seed} {run.scope:>6}: A {run.a_before.words:.1f} -> {run.a_after.words:.1f} words, hits "
        f"{run.a_after.hits:.2f} [{'PASS' if a_ok else 'fail'}: {a_line}]; {b_line} "
        f"[{'PASS' if b_ok else 'fail'}]; steps {steps}; B turns {run.b_turns}"
    )


def run_in_child(args: argparse.Namespace, seed: int, scope: str) -> OwnerRun | None:
    with tempfile.TemporaryDirectory(prefix="openclaw-owners-run-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, __file__, *sys.argv[1:], "--one-run", f"{seed}:{scope}", "--result-file", str(out)]
        code = subprocess.run(command, check=False).returncode
        if code != 0 or not out.exists():
            print(f"\n!!! the run for seed {seed}, scope {scope} failed (exit code {code}); left out below")
            return None
        data = json.loads(out.read_text())
    for key in ("a_before", "a_after", "b_before", "b_after"):
        data[key] = learning.HeldOut(**data[key])
    return OwnerRun(**data)


async def told_model(args: argparse.Namespace) -> learning.HeldOut:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.settings import Settings

    base = LocalBackend(Settings())
    await base.start()
    try:
        return await learning.ask_held_out(base, told=True, max_tokens=args.max_tokens)
    finally:
        await base.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scopes", nargs="+", choices=["owner", "shared"], default=["owner", "shared"])
    parser.add_argument("--max-words", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--users", type=int, default=2, help="owner A's concurrent sessions")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE")
    parser.add_argument("--script", type=Path, default=learning.SCRIPTS / "brevity.json")
    parser.add_argument("--one-run", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = "smollm2"
    learning.SCRIPT = learning.Script.load(args.script)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.one_run:
        seed, _, scope = args.one_run.partition(":")
        result = asyncio.run(run_once(args, int(seed), scope))
        args.result_file.write_text(json.dumps(asdict(result)))
        return 0
    told = asyncio.run(told_model(args))
    print(f"told model (held-out, the instruction added): {told.words:.1f} words, hits {told.hits:.2f}")
    runs = []
    for seed in args.seeds:
        for scope in args.scopes:
            run = run_in_child(args, seed, scope)
            if run is not None:
                print(result_line(run, told))  # as each run ends: a 3-seed side-by-side takes over two hours
                runs.append(run)
    print("\n=== held-out, plain, per owner (before -> after)")
    for run in runs:
        print(result_line(run, told))
    return 0


if __name__ == "__main__":
    sys.exit(main())
