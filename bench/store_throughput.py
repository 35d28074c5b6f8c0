"""Capture throughput: record N synthetic exchanges through SessionCapture (the proxy's sink) and print turns/s.

Conversations are inferred (no session header), so every record does the full work: canonical hashing of the
history, the prefix lookup, pairing the previous turn with its next state, and one committed transaction. Turns of
different conversations are interleaved and recorded ``--concurrency`` at a time from asyncio, as the proxy does.

    .venv/bin/python bench/store_throughput.py --turns 5000                 # coding-agent sized turns
    .venv/bin/python bench/store_throughput.py --turns 5000 --shape chat    # short chat turns
    .venv/bin/python bench/store_throughput.py --turns 2000 --synchronous FULL
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store


@dataclass(frozen=True)
class Shape:
    """How big the synthetic conversations are."""

    system_repeats: int  # the system prompt is a 33-character sentence repeated this often
    prompt_base: int  # prompt tokens of the first turn
    prompt_growth: int  # extra prompt tokens per turn
    completion: int  # completion tokens per turn
    reply_repeats: int
    tool_calls: bool  # every other reply is a tool call with a 20-line tool result
    turns_per_session: int


SHAPES = {
    # A coding agent: ~1 KB system prompt, tool calls and results, prompts growing from 300 to ~1,650 tokens.
    "agent": Shape(30, 300, 150, 120, 4, True, 10),
    # A chat app: short system prompt, one-line messages, ~100-token prompts, five turns per conversation.
    "chat": Shape(1, 60, 30, 30, 1, False, 5),
}


def _exchange(
    rng: random.Random, shape: Shape, conv: int, history: list[dict[str, Any]], turn: int
) -> CapturedExchange:
    prompt_len = shape.prompt_base + shape.prompt_growth * turn
    completion_len = shape.completion
    call = shape.tool_calls and turn % 2 == 0
    reply = f"Reply {turn} of conversation {conv}. " * shape.reply_repeats
    assistant: dict[str, Any] = {"role": "assistant", "content": reply}
    if call:
        assistant["tool_calls"] = [
            {
                "id": f"call_{conv}_{turn}",
                "type": "function",
                "function": {"name": "read_file", "arguments": f'{{"path": "src/module_{turn}.py"}}'},
            }
        ]
    return CapturedExchange(
        api="openai",
        headers={},
        request={"model": "openclaw-policy", "messages": history, "temperature": 0.7},
        messages=list(history),
        tools=None,
        model="openclaw-policy",
        prompt_tokens=[rng.randrange(50_000) for _ in range(prompt_len)],
        completion_tokens=[rng.randrange(50_000) for _ in range(completion_len)],
        logprobs=[-rng.random() for _ in range(completion_len)],
        sampling_logprobs=[-rng.random() for _ in range(completion_len)],
        version=1,
        finish_reason="tool_calls" if call else "stop",
        assistant_message=assistant,
        response={"id": f"chatcmpl-{conv}-{turn}"},
        started_at=0.0,
        first_token_at=0.0,
        finished_at=0.0,
    )


def _next_history(history: list[dict[str, Any]], exchange: CapturedExchange, turn: int) -> list[dict[str, Any]]:
    reply = exchange.assistant_message
    if reply.get("tool_calls"):
        call_id = reply["tool_calls"][0]["id"]
        follow = {"role": "tool", "tool_call_id": call_id, "content": f"file contents {turn}\n" * 20}
    else:
        follow = {"role": "user", "content": f"Thanks, now do step {turn + 1}."}
    return [*history, reply, follow]


def _workload(turns: int, shape: Shape, seed: int) -> list[tuple[int, CapturedExchange]]:
    """(conversation, exchange) in arrival order: conversations advance in round-robin, so turns interleave."""
    rng = random.Random(seed)
    turns_per_session = shape.turns_per_session
    sessions = max(1, turns // turns_per_session)
    histories = [
        [
            {"role": "system", "content": "You are a careful coding agent. " * shape.system_repeats},
            {"role": "user", "content": f"Task {conv}: refactor the parser."},
        ]
        for conv in range(sessions)
    ]
    exchanges: list[tuple[int, CapturedExchange]] = []
    for turn in range(turns_per_session):
        for conv in range(sessions):
            if len(exchanges) == turns:
                return exchanges
            exchange = _exchange(rng, shape, conv, histories[conv], turn)
            exchanges.append((conv, exchange))
            histories[conv] = _next_history(histories[conv], exchange, turn)
    return exchanges


async def _run(capture: SessionCapture, exchanges: list[tuple[int, CapturedExchange]], concurrency: int) -> list[float]:
    """``concurrency`` clients, each owning a share of the conversations and sending its next request as soon as
    the previous one is recorded (a client waits for a reply before it continues a conversation)."""
    latencies: list[float] = []

    async def client(mine: list[CapturedExchange]) -> None:
        for exchange in mine:
            start = time.perf_counter()
            await capture.record(exchange)
            latencies.append(time.perf_counter() - start)

    shares: list[list[CapturedExchange]] = [[] for _ in range(concurrency)]
    for conv, exchange in exchanges:
        shares[conv % concurrency].append(exchange)
    await asyncio.gather(*(client(share) for share in shares))
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="agent")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--synchronous", choices=["NORMAL", "FULL"], default="NORMAL")
    parser.add_argument("--path", type=Path, default=None, help="Store file (default: a temporary directory).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    shape = SHAPES[args.shape]
    exchanges = _workload(args.turns, shape, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.path or Path(tmp) / "bench.sqlite3"
        with Store(path, synchronous=args.synchronous) as store:
            capture = SessionCapture(store, Settings())
            start, cpu_start = time.perf_counter(), time.process_time()
            latencies = asyncio.run(_run(capture, exchanges, args.concurrency))
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            stats = capture.stats()
        size_mb = path.stat().st_size / 1e6
    latencies.sort()
    p50 = statistics.median(latencies) * 1e3
    p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1e3
    print(
        f"{len(exchanges)} turns in {elapsed:.2f} s = {len(exchanges) / elapsed:,.0f} turns/s "
        f"(shape={args.shape}, synchronous={args.synchronous}, concurrency={args.concurrency}); "
        f"record latency p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )
    # On a shared machine wall time depends on the neighbours; CPU time spent by this process does not.
    print(f"CPU {cpu:.2f} s = {len(exchanges) / cpu:,.0f} turns per CPU-second ({cpu / elapsed:.0%} of one core)")
    print(
        f"sessions {stats['sessions']['total']}, main turns {stats['turns']['main']} "
        f"(ready {stats['ready']}, pending {stats['pending']}), side {stats['turns']['side']}, "
        f"db {size_mb:.1f} MB before checkpoint"
    )
    if stats["turns"]["side"] or stats["sessions"]["total"] != max(1, args.turns // shape.turns_per_session):
        raise SystemExit("session inference went wrong in the benchmark workload")


if __name__ == "__main__":
    main()
