"""How much memory a crowd of owners costs: N owners, each with an adapter of their own, served in turn.

    python bench/owners_memory.py [--owners 200] [--resident 16] [--tokens 8]

The local backend on the embedded SmolLM2 (LoRA rank 32 on every linear layer by default: about 39 MB of LoRA weights
a version), ``lora.scope = owner``. Each owner in turn: its adapter takes one training step and publishes its version
1 (its trainer state swapped into the one PEFT model), then one request is served by it. Then a second pass serves
every owner again, most of them read back from disk. ``lora.resident_adapters`` bounds the adapters kept in memory
for training and for serving; the others wait in files. Prints the process's resident set size (now and its peak)
after each 50 owners, what would be held with no bound, and the cold request time.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def rss_mib() -> float:
    """The process's resident set size now (Linux: /proc/self/statm)."""
    import os

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def main_async(args: argparse.Namespace) -> int:
    from pydantic import SecretStr

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.settings import Settings
    from openclaw_cli.types import AdamParams, SamplingParams, datum_from_completion

    with tempfile.TemporaryDirectory(prefix="openclaw-owners-memory-") as tmp:
        settings = Settings(
            api_keys=[SecretStr("a"), SecretStr("b")],  # several owners: adapters per owner
            local={"state_dir": Path(tmp) / "ckpt", "sampler": "transformers"},
            lora={"resident_adapters": args.resident},
        )
        backend = LocalBackend(settings)
        await backend.start()
        prompt = backend.tokenizer().render([{"role": "user", "content": "What is the capital of France?"}])
        params = SamplingParams(max_tokens=args.tokens, temperature=0.0)
        owners = [f"key:{i:016x}" for i in range(args.owners)]
        started_rss = rss_mib()
        print(f"started: RSS {started_rss:.0f} MiB; {args.owners} owners, lora.resident_adapters = {args.resident}")
        lora_mib = 0.0
        first_pass = time.monotonic()
        for i, owner in enumerate(owners, 1):
            view = backend.adapter(owner)
            reply = await view.sample(prompt, SamplingParams(max_tokens=4, temperature=1.0, seed=i))
            datum = datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0)
            await view.discard_gradients()
            await view.forward_backward([datum], "importance_sampling")
            await view.optim_step(AdamParams(learning_rate=1e-4))
            await view.publish()
            await view.sample(prompt, params)
            if not lora_mib and backend._versions is not None:
                served = backend._versions.acquire(None, owner)
                lora_mib = (
                    sum(
                        d.a.numel() * d.a.element_size() + d.b.numel() * d.b.element_size()
                        for d in served.weights.values()
                    )
                    / 2**20
                )
            if i % 50 == 0 or i == len(owners):
                print(f"  {i:4d} owners trained and served: RSS {rss_mib():.0f} MiB, peak {peak_mib():.0f} MiB")
        first_s = time.monotonic() - first_pass
        cold: list[float] = []
        for owner in owners:
            begun = time.monotonic()
            await backend.adapter(owner).sample(prompt, params)
            cold.append(time.monotonic() - begun)
        print(f"  second pass, every owner served again: RSS {rss_mib():.0f} MiB, peak {peak_mib():.0f} MiB")
        unbounded = args.owners * lora_mib * 3  # a version's LoRA, plus the trainer's weights and two AdamW moments
        print(
            f"one version's LoRA weights: {lora_mib:.1f} MiB; with no bound the {args.owners} owners would hold about "
            f"{unbounded / 1024:.1f} GiB of trainer state and {args.owners * lora_mib / 1024:.1f} GiB of served "
            f"versions on top of the {started_rss:.0f} MiB at start"
        )
        print(
            f"first pass {first_s / args.owners:.2f} s an owner (a step, a publish, a request); second pass: a request "
            f"of {args.tokens} tokens took median {statistics.median(cold):.2f} s, p90 "
            f"{sorted(cold)[int(0.9 * len(cold))]:.2f} s (most adapters read back from disk)"
        )
        await backend.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--owners", type=int, default=200)
    parser.add_argument("--resident", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=8)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
