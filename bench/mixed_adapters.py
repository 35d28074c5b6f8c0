"""What serving several LoRA adapters at once costs the transformers sampler: 4 concurrent requests spread over 2
adapters, against the same 4 requests on one adapter, in one run.

    python bench/mixed_adapters.py [--model smollm2|tiny|PATH] [--tokens 64] [--rounds 5]

The local sampler decodes every running request in one forward pass, a row per request, each row on the LoRA deltas
of the version it pinned (``PolicyVersions.activate_rows``: the distinct versions' A side by side along the rank
and their B likewise, built once per set of versions; one product through all the A, a row mask keeping each row's
own slice, one product through all the B; the base weights run once for the whole batch). An
adapter per owner (``lora.scope = owner``) is served the same way, and two published versions with different weights
stand in for two owners' adapters here:

- one adapter: 4 concurrent requests all pinned to version 1, and all pinned to version 2 (the mean of the two: a
  version's replies may end sooner, leaving fewer rows in the batch);
- two adapters: the same 4 requests, 2 pinned to version 1 and 2 to version 2 (weights one training step apart).

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


async def publish_two_versions(backend: Any) -> tuple[int, int]:
    """Two published versions whose LoRA weights differ (a training step between them, on the policy's own replies
    with a large learning rate so the deltas are far from zero)."""
    from openclaw_cli.types import AdamParams

    datums = await training_batch(backend, 2, 16)
    versions = []
    for _ in range(2):
        await backend.forward_backward(datums, "importance_sampling")
        await backend.optim_step(AdamParams(learning_rate=1e-3))
        versions.append((await backend.publish()).version)
    return versions[0], versions[1]


async def tokens_per_second(backend: Any, pins: list[int], max_tokens: int) -> float:
    """Total tokens/s of one request per pin, all at once."""
    from openclaw_cli.types import SamplingParams

    tokenizer = backend.tokenizer()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prompts = [tokenizer.render([{"role": "user", "content": q}]) for q in QUESTIONS]
    started = time.perf_counter()
    results = await asyncio.gather(
        *(backend.sample(prompts[i % len(prompts)], params, version=pin) for i, pin in enumerate(pins))
    )
    return sum(len(r.tokens) for r in results) / (time.perf_counter() - started)


async def main_async(args: argparse.Namespace) -> int:
    from openclaw_cli.backends.local import LocalBackend

    with tempfile.TemporaryDirectory(prefix="openclaw-mixed-adapters-") as tmp:
        backend = LocalBackend(build_settings(args.model, Path(tmp)))
        await backend.start()
        first, second = await publish_two_versions(backend)
        two = [first, second, first, second]
        await tokens_per_second(backend, two, 8)  # warm-up
        ratios, singles, mixed = [], [], []
        for round_ in range(args.rounds):
            # Each adapter alone on the same 4 prompts, and the mix: a version's replies may end sooner than the
            # other's (fewer rows left in the batch), so the mix is compared with the mean of the two alone.
            alone = [await tokens_per_second(backend, [pin] * 4, args.tokens) for pin in (first, second)]
            single = statistics.mean(alone)
            both = await tokens_per_second(backend, two, args.tokens)
            singles.append(single)
            mixed.append(both)
            ratios.append(both / single)
            print(
                f"round {round_}: one adapter {single:6.1f} tok/s ({alone[0]:.1f} / {alone[1]:.1f}), two adapters "
                f"{both:6.1f} tok/s",
                flush=True,
            )
    ratio = statistics.median(ratios)
    print(
        f"4 concurrent requests, {args.tokens} tokens each, transformers sampler ({args.model}): one adapter "
        f"{statistics.median(singles):.1f} tok/s, two adapters {statistics.median(mixed):.1f} tok/s; "
        f"two/one = {ratio:.2f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'})"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (embedded), tiny (built offline), or a path")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
