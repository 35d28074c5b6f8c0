"""What serving two owners' LoRA adapters at once costs: 4 concurrent requests spread over 2 owners' adapters,
against the same 4 requests on one owner's adapter, in one run, on the transformers or the vLLM sampler.

    python bench/mixed_adapters.py [--sampler transformers|vllm] [--model smollm2|tiny|PATH] [--tokens 64]
                                   [--rounds 5]

Two owners (two API keys, ``lora.scope = owner``) each get an adapter of their own: owner A's trained one step,
owner B's two steps (different weights). How each sampler batches them:

- transformers: every running request decodes in one forward pass, a row per request, each row on the LoRA deltas
  of the adapter version it pinned (``PolicyVersions.activate_rows``: the distinct versions' A side by side along
  the rank and their B likewise, built once per set of versions; one product through all the A, a row mask keeping
  each row's own slice, one product through all the B; the base weights run once for the whole batch);
- vllm: vLLM's multi-LoRA (``max_loras`` slots, its punica kernels apply each request's adapter in one batch).

The cases:

- one adapter: 4 concurrent requests all of owner A, and all of owner B (the mean of the two: an adapter's replies
  may end sooner, leaving fewer rows in the batch);
- two adapters: the same 4 requests, 2 of owner A and 2 of owner B.

Every request asks for ``--tokens`` new tokens at temperature 0 from prompts that make the model talk; a reply that
ends early counts the tokens it made. The two cases alternate over ``--rounds`` rounds and the ratio (two adapters
over one, total tokens/s) is taken within each round, then the median: a shared 2-core machine drifts by +-20% within
minutes. The goal: at least 0.8. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import QUESTIONS
from swap_latency import build_settings, training_batch

GOAL = 0.8


OWNER_KEYS = ("sk-bench-owner-a-0123456789", "sk-bench-owner-b-0123456789")


async def two_owners_adapters(backend: Any) -> tuple[Any, Any]:
    """Owner A's and owner B's views of ``backend``, each with a published adapter of its own; the weights differ
    (A one training step, B two, on the policy's own replies with a large learning rate so the deltas are far from
    zero)."""
    from openclaw_cli.lesson_prompt import key_owner
    from openclaw_cli.types import AdamParams

    datums = await training_batch(backend, 2, 16)
    views = []
    for steps, key in enumerate(OWNER_KEYS, start=1):
        view = backend.adapter(key_owner(key))
        for _ in range(steps):
            await view.forward_backward(datums, "importance_sampling")
            await view.optim_step(AdamParams(learning_rate=1e-3))
        await view.publish()
        views.append(view)
    return views[0], views[1]


async def tokens_per_second(views: list[Any], max_tokens: int) -> float:
    """Total tokens/s of one request per owner's view, all at once."""
    from openclaw_cli.types import SamplingParams

    tokenizer = views[0].tokenizer()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompts = [tokenizer.render([{"role": "user", "content": q}]) for q in QUESTIONS]
    started = time.perf_counter()
    results = await asyncio.gather(*(view.sample(prompts[i % len(prompts)], params) for i, view in enumerate(views)))
    return sum(len(r.tokens) for r in results) / (time.perf_counter() - started)


async def main_async(args: argparse.Namespace) -> int:
    from openclaw_cli.backends.local import LocalBackend

    with tempfile.TemporaryDirectory(prefix="openclaw-mixed-adapters-") as tmp:
        settings = build_settings(args.model, Path(tmp), api_key=OWNER_KEYS[0], api_keys=[OWNER_KEYS[1]])
        settings.local.sampler = args.sampler
        backend = LocalBackend(settings)
        await backend.start()
        if backend.sampler_kind != args.sampler:
            raise SystemExit(f"asked for the {args.sampler} sampler, got {backend.sampler_kind}")
        a, b = await two_owners_adapters(backend)
        two = [a, b, a, b]
        await tokens_per_second(two, 8)  # warm-up
        ratios, singles, mixed = [], [], []
        for round_ in range(args.rounds):
            # Each adapter alone on the same 4 prompts, and the mix: one adapter's replies may end sooner than the
            # other's (fewer rows left in the batch), so the mix is compared with the mean of the two alone.
            alone = [await tokens_per_second([view] * 4, args.tokens) for view in (a, b)]
            single = statistics.mean(alone)
            both = await tokens_per_second(two, args.tokens)
            singles.append(single)
            mixed.append(both)
            ratios.append(both / single)
            print(
                f"round {round_}: one adapter {single:6.1f} tok/s ({alone[0]:.1f} / {alone[1]:.1f}), two adapters "
                f"{both:6.1f} tok/s",
                flush=True,
            )
        await backend.close()
    ratio = statistics.median(ratios)
    print(
        f"4 concurrent requests, {args.tokens} tokens each, {args.sampler} sampler ({args.model}): one adapter "
        f"{statistics.median(singles):.1f} tok/s, two adapters {statistics.median(mixed):.1f} tok/s; "
        f"two/one = {ratio:.2f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampler", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument("--model", default="smollm2", help="smollm2 (embedded), tiny (built offline), or a path")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
