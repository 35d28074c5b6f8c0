"""Reply latency through the proxy while new weights are published and while training runs.

    python bench/swap_latency.py [--requests 40] [--max-tokens 16] [--model PATH|smollm2]

One process: the local backend (the tiny offline model by default; ``--model smollm2`` is the embedded
SmolLM2-135M-Instruct, or give any model path), the real proxy app with capture into a temporary SQLite store,
served by uvicorn on 127.0.0.1, and an httpx client on the same event loop. The client sends ``--requests``
sequential non-streamed chat completions (greedy, a fixed ``--max-tokens``; ``ignore_eos`` is not used, so the
reply may stop early, identically in every phase) in four phases:

1. idle: nothing else runs;
2. swaps b2b: a background task calls ``backend.publish()`` back to back (each one reads the LoRA weights from
   the trainer and swaps the served version): a stress test, hundreds of swaps per second;
3. swaps paced: the same with ``--swap-every`` seconds between publishes (a fast trainer's cadence);
4. training: a background task runs ``forward_backward`` + ``optim_step`` + ``publish`` back to back on a small
   batch of the policy's own completions.

It prints p50/p99 latency per phase and the ratio to idle (the goal is at most 2x), plus how many swaps or steps
happened during each phase. On a CPU machine the training phase measures mostly compute contention (the trainer
and the sampler share the same cores), not locking: the swaps phase is the one that shows whether serving waits
for a swap.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from loopback import serve_on_loopback

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Please answer briefly and politely. What is the capital of France?"},
]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def build_settings(model: str, work: Path, **extra: Any) -> Any:
    """Bench settings on ``model`` (smollm2, tiny or a path) under ``work``; ``extra`` are further Settings fields."""
    from openclaw_cli.settings import LocalSettings, LoraSettings, Settings, StoreSettings

    if model == "tiny":
        from openclaw_cli.testing.tiny_model import save_tiny_model

        model_path: str | None = str(save_tiny_model(work / "tiny-model"))
        lora = LoraSettings(rank=4, alpha=8)
    else:
        model_path = None if model == "smollm2" else model
        lora = LoraSettings()
    return Settings(
        model=model_path,
        lora=lora,
        store=StoreSettings(path=work / "store.sqlite3"),
        local=LocalSettings(state_dir=work / "ckpt", device="cpu", sampler="transformers", keep_versions=3),
        proxy={"accept_any_model": True},
        **extra,
    )


async def training_batch(backend: Any, size: int, max_tokens: int) -> list[Any]:
    """A small importance-sampling batch from the policy's own completions (what the trainer would train on)."""
    from openclaw_cli.types import SamplingParams, datum_from_completion

    prompt = backend.tokenizer().render(MESSAGES)
    datums = []
    for seed in range(size):
        result = await backend.sample(prompt, SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed))
        datums.append(datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=1.0))
    return datums


async def run_phase(
    client: Any,
    requests: int,
    max_tokens: int,
    background: Callable[[], Awaitable[None]] | None,
    pause_s: float = 0.0,
) -> tuple[list[float], int]:
    """Latencies of ``requests`` sequential replies, with ``background`` repeated (``pause_s`` apart) until they
    are done."""
    done = asyncio.Event()
    rounds = 0

    async def repeat() -> None:
        nonlocal rounds
        assert background is not None
        while not done.is_set():
            await background()
            rounds += 1
            if pause_s:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), pause_s)

    worker = asyncio.create_task(repeat()) if background is not None else None
    latencies = []
    body = {"model": "policy", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0}
    try:
        if worker is not None:
            await asyncio.sleep(0.05)  # let the background work get going first
        for _ in range(requests):
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            elapsed = time.perf_counter() - started
            if response.status_code != 200:
                raise RuntimeError(f"request failed with {response.status_code}: {response.text[:300]}")
            latencies.append(elapsed)
    finally:
        done.set()
        if worker is not None:
            await worker
    return latencies, rounds


async def main_async(args: argparse.Namespace) -> int:
    import httpx

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.capture.sessions import SessionCapture
    from openclaw_cli.proxy import create_app
    from openclaw_cli.store import Store
    from openclaw_cli.types import AdamParams

    with tempfile.TemporaryDirectory(prefix="openclaw-swap-bench-") as tmp:
        work = Path(tmp)
        settings = build_settings(args.model, work)
        backend = LocalBackend(settings)
        started = time.perf_counter()
        await backend.start()
        model_name = settings.model or "embedded SmolLM2-135M-Instruct"
        load_s = time.perf_counter() - started
        print(f"model: {model_name} (loaded in {load_s:.1f}s), torch threads: {_torch_threads()}")
        store = Store(settings.store.path)
        app = create_app(backend, SessionCapture(store, settings), settings)
        server, server_task, base_url = await serve_on_loopback(app)
        batch = await training_batch(backend, args.batch, args.max_tokens)
        adam = AdamParams(learning_rate=1e-5)

        async def swap() -> None:
            await backend.publish()

        async def train_step() -> None:
            await backend.forward_backward(batch, "importance_sampling")
            await backend.optim_step(adam)
            await backend.publish()

        # A publish alone takes this long (the time a swap would block serving if it blocked at all).
        swap_times = []
        for _ in range(5):
            t0 = time.perf_counter()
            await backend.publish()
            swap_times.append(time.perf_counter() - t0)
        step_t0 = time.perf_counter()
        await train_step()
        step_time = time.perf_counter() - step_t0

        results: dict[str, tuple[list[float], int]] = {}
        try:
            async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
                await run_phase(client, 3, args.max_tokens, None)  # warm-up
                results["idle"] = await run_phase(client, args.requests, args.max_tokens, None)
                results["swaps b2b"] = await run_phase(client, args.requests, args.max_tokens, swap)
                results[f"swaps /{args.swap_every:g}s"] = await run_phase(
                    client, args.requests, args.max_tokens, swap, args.swap_every
                )
                if not args.no_training:
                    results["during training"] = await run_phase(client, args.requests, args.max_tokens, train_step)
        finally:
            server.should_exit = True
            with contextlib.suppress(Exception):
                await server_task
            await backend.close()
            store.close()

    print(
        f"one publish: median {statistics.median(swap_times) * 1000:.1f} ms; one training step (batch "
        f"{args.batch}) + publish: {step_time * 1000:.0f} ms; {args.requests} sequential requests per phase, "
        f"max_tokens {args.max_tokens}"
    )
    idle_p50 = percentile(results["idle"][0], 50)
    idle_p99 = percentile(results["idle"][0], 99)
    print(f"{'phase':<18}{'p50 ms':>10}{'p99 ms':>10}{'p50 ×idle':>11}{'p99 ×idle':>11}{'background':>18}")
    worst = 0.0
    for phase, (latencies, rounds) in results.items():
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        background = "" if phase == "idle" else f"{rounds} {'swaps' if 'swap' in phase else 'steps'}"
        print(
            f"{phase:<18}{p50 * 1000:>10.1f}{p99 * 1000:>10.1f}{p50 / idle_p50:>10.2f}x{p99 / idle_p99:>10.2f}x"
            f"{background:>18}"
        )
        worst = max(worst, p99 / idle_p99)
    print(f"goal: p99 during swaps/training ≤ 2× idle -> {'met' if worst <= 2 else 'NOT met'} (worst {worst:.2f}×)")
    return 0


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny (default), smollm2 (embedded default), or a path")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4, help="training batch size in the training phase")
    parser.add_argument(
        "--swap-every", type=float, default=0.5, help="pause between publishes in the paced swaps phase (seconds)"
    )
    parser.add_argument("--no-training", action="store_true", help="skip the training phase")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
