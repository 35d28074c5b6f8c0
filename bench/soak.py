"""Soak: N clients talk to a launched runtime for T seconds while the judge and the trainer run; does it hold up?

    python bench/soak.py [--backend fake|tiny] [--clients 8] [--duration 60] [--turns 4] [--gate]

A child process runs the whole runtime (``openclaw launch``'s :func:`~openclaw_cli.launch.launch`: proxy + capture
into a fresh SQLite store + idle expiry + judge loop + trainer loop) on 127.0.0.1 with a scripted, instant judge, and
one of two backends:

- ``fake`` (default): :class:`~openclaw_cli.testing.fake_training.FakeTrainingBackend`, replies streamed token by
  token (``--token-delay-ms``) and training steps that cost nothing: measures the runtime itself (proxy, capture,
  store, loops), not a model;
- ``tiny``: the local backend on the tiny offline model (2 layers, CPU): real sampling, real LoRA steps, real
  version swaps, so serving competes with training for the CPU.

The parent runs the clients: each plays multi-turn sessions (``--turns`` requests, each extending the last
reply with a new user message; a seeded mix of OpenAI and Anthropic, streamed and not), then ends half of its
sessions and abandons the rest to idle expiry. At the end it stops the child (the orderly shutdown: in-flight
replies finish, pending captures land, a final checkpoint) and prints:

- requests served, errors (by status), p50 / p99 latency of complete replies, requests per second;
- the child's RSS when ready, after ``--warmup`` seconds of load, and at the end (growth = end - after warm-up);
- turns lost: replies the clients received in full whose request id is not in the store (must be 0);
- what the loops did (judged, trained, steps, versions) and the backlog and capture counters at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from openclaw_cli.testing.local_servers import free_port

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I reverse a list in Python?",
    "Summarize the plot of Hamlet in one sentence.",
    "What is 17 * 23?",
]
RSS_EVERY_S = 10.0
FOLLOW_UPS = ["Thanks. And why?", "No, shorter please.", "Great, one more example.", "That is wrong, try again."]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process: psutil when installed, else /proc (Linux)."""
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("cannot read RSS: install psutil or run on Linux") from None


# --- the child: the runtime -----------------------------------------------------------------------------------------


class InstantJudge:
    """A scripted JudgeClient: two votes of +1 for every -1, so the trainer sees both signs; for the promotion
    gate's pairwise prompts the same answers read as "Reply 1 is better" (a fair coin over balanced orders)."""

    name = "soak-judge"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        self.calls += 1
        return "\\boxed{-1}" if self.calls % 3 == 0 else "\\boxed{1}"


def child_settings(args: argparse.Namespace, work: Path) -> Any:
    from openclaw_cli.settings import JudgeSettings, LocalSettings, LoraSettings, Settings, StoreSettings, TrainSettings

    model = None
    if args.backend == "tiny":
        from openclaw_cli.testing.tiny_model import save_tiny_model

        model = str(save_tiny_model(work / "tiny-model"))
    return Settings(
        model=model,
        port=args.port,
        session_idle_s=args.idle_s,
        judge=JudgeSettings(votes=1, max_concurrency=8),
        lora=LoraSettings(rank=4, alpha=8),
        train=TrainSettings(
            batch_size=args.batch_size,
            checkpoint_every=25,
            promotion_gate=args.gate,
            gate_sessions=4,
            gate_max_tokens=args.max_tokens,
        ),
        store=StoreSettings(path=work / "store.sqlite3"),
        local=LocalSettings(
            state_dir=work / "ckpt", device="cpu", sampler="transformers", keep_versions=3, max_concurrent_requests=4
        ),
        proxy={"accept_any_model": True, "expire_every_s": 1.0},
    )


async def run_child(args: argparse.Namespace) -> None:
    import logging

    from openclaw_cli.launch import launch

    # Quiet by default (the summary is the output); --verbose shows the loops' progress and the gate's decisions.
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR, format="%(asctime)s %(name)s %(message)s"
    )

    work = Path(args.work)
    settings = child_settings(args, work)
    backend = None
    if args.backend == "fake":
        from openclaw_cli.testing.fake_training import FakeTrainingBackend
        from openclaw_cli.testing.tiny_model import save_tiny_model
        from openclaw_cli.tokenizer import HFChatTokenizer

        tokenizer = HFChatTokenizer.from_pretrained(save_tiny_model(work / "tiny-tokenizer"))
        backend = FakeTrainingBackend(
            tokenizer,
            state_dir=work / "ckpt",
            default_reply="Sure. Here is a short answer to that, with a detail or two to make it longer.",
            token_delay_s=args.token_delay_ms / 1000,
        )

    def ready(runtime: Any) -> None:
        print(json.dumps({"ready": runtime.url, "pid": os.getpid()}), flush=True)

    await launch(settings, ui=False, judge_client=InstantJudge(), backend=backend, on_ready=ready)


# --- the parent: clients and measurements ---------------------------------------------------------------------------


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    received: set[str] = field(default_factory=set)  # request ids of replies received in full
    errors: Counter[str] = field(default_factory=Counter)
    sessions: int = 0


async def one_request(
    http: Any, rng: random.Random, session: str, messages: list[dict], tally: Tally, args: Any
) -> str | None:
    """One chat turn on a randomly chosen API and mode; returns the reply text (None on failure)."""
    anthropic = rng.random() < args.anthropic_share
    stream = rng.random() < args.stream_share
    headers = {"x-session-id": session}
    if anthropic:
        path = "/v1/messages"
        body: dict[str, Any] = {
            "model": "policy",
            "max_tokens": args.max_tokens,
            "messages": messages,
            "stream": stream,
        }
        id_header = "request-id"
    else:
        path = "/v1/chat/completions"
        body = {"model": "policy", "max_tokens": args.max_tokens, "messages": messages, "stream": stream}
        id_header = "x-request-id"
    started = time.perf_counter()
    try:
        if not stream:
            response = await http.post(path, json=body, headers=headers)
            if response.status_code != 200:
                tally.errors[f"HTTP {response.status_code}"] += 1
                return None
            payload = response.json()
            if anthropic:  # a reply may be empty (content []) or hold tool calls only
                text = "".join(block.get("text", "") for block in payload["content"])
            else:
                text = payload["choices"][0]["message"]["content"] or ""
            request_id = response.headers[id_header]
        else:
            text, complete = "", False
            async with http.stream("POST", path, json=body, headers=headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    tally.errors[f"HTTP {response.status_code}"] += 1
                    return None
                request_id = response.headers[id_header]
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        complete = True
                        continue
                    event = json.loads(data)
                    if anthropic:
                        if event.get("type") == "content_block_delta":
                            text += event["delta"].get("text", "")
                        elif event.get("type") == "message_stop":
                            complete = True
                        elif event.get("type") == "error":
                            tally.errors["stream error"] += 1
                            return None
                    elif "error" in event:
                        tally.errors["stream error"] += 1
                        return None
                    elif event.get("choices"):
                        text += event["choices"][0]["delta"].get("content") or ""
            if not complete:
                tally.errors["stream cut short"] += 1
                return None
    except Exception as exc:  # a soak reports failures, it does not stop on them
        tally.errors[type(exc).__name__] += 1
        return None
    tally.latencies.append(time.perf_counter() - started)
    tally.received.add(request_id)
    return text


async def client(index: int, http: Any, deadline: float, tally: Tally, args: Any) -> None:
    rng = random.Random(args.seed * 1000 + index)
    number = 0
    while time.monotonic() < deadline:
        number += 1
        session = f"soak-{index}-{number}"
        tally.sessions += 1
        messages = [{"role": "user", "content": rng.choice(QUESTIONS)}]
        for _ in range(args.turns):
            if time.monotonic() >= deadline:
                break
            text = await one_request(http, rng, session, messages, tally, args)
            if text is None:
                break
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": rng.choice(FOLLOW_UPS)},
            ]
        if rng.random() < 0.5:  # end half of the sessions; the others expire when idle
            try:
                await http.post(f"/v1/openclaw/sessions/{session}/end")
            except Exception as exc:
                tally.errors[f"end: {type(exc).__name__}"] += 1


def stored_request_ids(store_path: Path) -> set[str]:
    from openclaw_cli.store import Store

    with Store(store_path, create=False) as store:
        return {str(turn.metadata.get("request_id")) for turn in store.iter_turns()}


async def run_parent(args: argparse.Namespace) -> int:
    import httpx

    work = Path(tempfile.mkdtemp(prefix="openclaw-soak-"))
    args.port = free_port()
    command = [sys.executable, __file__, "--child", "--work", str(work), "--port", str(args.port)]
    for name in ("backend", "token_delay_ms", "batch_size", "max_tokens", "idle_s"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    command += ["--gate"] if args.gate else []
    command += ["--verbose"] if args.verbose else []
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    line = await asyncio.to_thread(child.stdout.readline)
    if not line:
        print("the runtime did not start", file=sys.stderr)
        return 1
    url = json.loads(line)["ready"]
    rss = {"ready": rss_bytes(child.pid)}
    trend: list[int] = []  # every RSS_EVERY_S after the warm-up
    tally = Tally()
    limits = httpx.Limits(max_connections=args.clients * 2, max_keepalive_connections=args.clients * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        started = time.monotonic()
        deadline = started + args.duration

        async def sample_rss() -> None:
            await asyncio.sleep(min(args.warmup, args.duration))
            rss["after_warmup"] = rss_bytes(child.pid)
            while time.monotonic() < deadline - RSS_EVERY_S / 2:
                await asyncio.sleep(RSS_EVERY_S)
                trend.append(rss_bytes(child.pid))

        sampler = asyncio.create_task(sample_rss())
        await asyncio.gather(*(client(i, http, deadline, tally, args) for i in range(args.clients)))
        elapsed = time.monotonic() - started
        await sampler
        rss["end"] = rss_bytes(child.pid)
        status = (await http.get("/v1/openclaw/status")).json()
    child.send_signal(signal.SIGINT)  # orderly stop: in-flight replies finish, captures land, a checkpoint
    await asyncio.to_thread(child.wait, 120)
    stored = stored_request_ids(work / "store.sqlite3")
    lost = tally.received - stored

    n = len(tally.latencies)
    mib = 1024 * 1024
    loops = status.get("loops", {})
    print(f"soak: backend {args.backend}, {args.clients} clients, {elapsed:.0f}s, gate {'on' if args.gate else 'off'}")
    print(f"requests served     {n} ({n / elapsed:.1f}/s), sessions {tally.sessions}")
    print(f"errors              {sum(tally.errors.values())} {dict(tally.errors) or ''}")
    if n:
        p50, p99 = percentile(tally.latencies, 50) * 1000, percentile(tally.latencies, 99) * 1000
        mean = statistics.fmean(tally.latencies) * 1000
        print(f"latency             p50 {p50:.1f} ms, p99 {p99:.1f} ms, mean {mean:.1f} ms")
    print(
        f"child RSS           ready {rss['ready'] / mib:.1f} MiB, after {args.warmup:.0f}s warm-up "
        f"{rss['after_warmup'] / mib:.1f} MiB, end {rss['end'] / mib:.1f} MiB "
        f"(growth after warm-up {(rss['end'] - rss['after_warmup']) / mib:+.1f} MiB)"
    )
    print(f"RSS every {RSS_EVERY_S:.0f}s (MiB) {' '.join(f'{v / mib:.0f}' for v in trend)}")
    print(f"turns lost          {len(lost)} of {len(tally.received)} received in full ({len(stored)} stored)")
    print(
        f"loops               judged {loops.get('judge', {}).get('judged')}, trained "
        f"{loops.get('trainer', {}).get('trained_samples')} in {loops.get('trainer', {}).get('steps')} steps, "
        f"policy version {status.get('policy_version')}, promotion {json.dumps(loops.get('promotion'))}"
    )
    print(f"backlog at the end  {json.dumps(loops.get('backlog'))}")
    print(f"capture             {json.dumps(status.get('capture'))}")
    print(f"child exit code     {child.returncode}")
    if args.keep:
        print(f"store and checkpoints kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if not lost and child.returncode == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["fake", "tiny"], default="fake")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the baseline RSS reading")
    parser.add_argument("--turns", type=int, default=4, help="requests per session")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--token-delay-ms", type=float, default=1.0, help="fake backend: delay per streamed token")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--idle-s", type=float, default=5.0, help="session idle expiry")
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--anthropic-share", type=float, default=0.3)
    parser.add_argument("--gate", action="store_true", help="train.promotion_gate = true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the store and checkpoints for inspection")
    parser.add_argument("--verbose", action="store_true", help="the runtime's log (INFO) on stderr")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(run_child(args))
        return 0
    return asyncio.run(run_parent(args))


if __name__ == "__main__":
    sys.exit(main())
