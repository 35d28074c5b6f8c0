"""The local backend's CUDA path end to end, one summary line per stage (scripts/gpu_check.sh runs it).

    python scripts/gpu_check.py [--device cuda|cpu] [--out DIR]

Stages, each timed and PASS/FAIL on its own line (``STAGE <name>: PASS|FAIL <what it measured> [s]``):

1. environment: Python, torch (its CUDA), transformers, peft versions and the device.
2. tiny model: the offline test model (openclaw_cli.testing.tiny_model) built on the spot, nothing downloaded.
3. batched decode: four requests of different lengths decoded together by the transformers sampler, each reply's
   sampler logprobs against a teacher-forced pass of the same tokens (bf16 on CUDA by default: tolerance 0.05 nats
   a token; float32: 1e-3), and a float32 backend's greedy reply against Hugging Face generate's.
4. LoRA step: PPO on a sampled reply; the untrained learner's logprobs equal the sampler's (ratio 1), the step
   moves the reply's logprob up with a positive advantage.
5. publish + hot swap: a stream in flight finishes on its version while a new version is published; the next
   sample is served by the new version, with sampler logprobs equal to teacher-forced ones under it.
6. launch loop: `openclaw launch`'s runtime on the tiny learnable model with a scripted judge and scripted users
   (tests/e2e_scenario.py) until 8 training steps are published as versions 1..8; reports the behaviour rate
   before and after and the served-logprob gap.

Exit 0 when every stage passes. ``--device cpu`` runs the same stages on the CPU (to check the script itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # e2e_scenario: the scripted users and judge of the e2e learning tests

RESULTS: list[dict[str, Any]] = []


async def stage(name: str, body: Callable[[], Awaitable[str]]) -> bool:
    started = time.monotonic()
    try:
        detail = await body()
        ok = True
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        traceback.print_exc(file=sys.stderr)
        ok = False
    seconds = time.monotonic() - started
    RESULTS.append({"stage": name, "ok": ok, "detail": detail, "seconds": round(seconds, 1)})
    print(f"STAGE {name}: {'PASS' if ok else 'FAIL'} {detail} [{seconds:.1f}s]", flush=True)
    return ok


def settings_for(model: Path, state: Path, device: str, **local: Any) -> Any:
    from openclaw_cli.settings import LocalSettings, LoraSettings, Settings

    return Settings(
        model=str(model),
        lora=LoraSettings(rank=4, alpha=8),
        local=LocalSettings(
            state_dir=state, device=device, keep_versions=3, max_concurrent_requests=4, sampler="transformers", **local
        ),
    )


def max_gap(xs: list[float], ys: list[float | None]) -> float:
    return max(abs(x - float(y)) for x, y in zip(xs, ys, strict=True) if y is not None)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="openclaw-gpu-check-"))
    state: dict[str, Any] = {}

    async def environment() -> str:
        import peft
        import torch
        import transformers

        if args.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA device")
        where = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
        return (
            f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"transformers {transformers.__version__}, peft {peft.__version__}, device {where}"
        )

    async def tiny_model() -> str:
        from openclaw_cli.testing.tiny_model import save_tiny_model

        state["model"] = save_tiny_model(work / "tiny")
        config = json.loads((state["model"] / "config.json").read_text())
        return f"{config['num_hidden_layers']} layers, hidden {config['hidden_size']}, at {state['model']}"

    async def batched_decode() -> str:
        from openclaw_cli.backends.local import LocalBackend
        from openclaw_cli.types import SamplingParams

        lines = []
        for dtype, tolerance in (("auto", 0.05), ("float32", 1e-3)):
            backend = LocalBackend(settings_for(state["model"], work / f"decode-{dtype}", args.device, dtype=dtype))
            await backend.start()
            try:
                tokenizer = backend.tokenizer()
                texts = ["Hi", "What is the capital of France?", "Tell me a long story about a cat", "2+2?"]
                prompts = [tokenizer.render([{"role": "user", "content": t}]) for t in texts]
                rows: list[int] = []  # the batch size of every forward pass of the served model

                def count_rows(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any], rows: list[int] = rows) -> None:
                    ids = kwargs.get("input_ids", args[0] if args else None)
                    if ids is not None:
                        rows.append(int(ids.shape[0]))

                hook = backend._loaded.model.register_forward_pre_hook(count_rows, with_kwargs=True)
                try:
                    results = await asyncio.gather(
                        *(backend.sample(p, SamplingParams(max_tokens=24, seed=i)) for i, p in enumerate(prompts))
                    )
                finally:
                    hook.remove()
                gap = 0.0
                for prompt, result in zip(prompts, results, strict=True):
                    forced = await backend.compute_logprobs(prompt + result.tokens)
                    gap = max(gap, max_gap(result.logprobs, forced[len(prompt) :]))
                tokens = sum(len(r.tokens) for r in results)
                if max(rows, default=0) < 2:
                    raise AssertionError(f"four concurrent requests were never decoded together (batch sizes {rows})")
                if gap > tolerance:
                    raise AssertionError(
                        f"dtype {dtype}: sampler vs teacher-forced logprob gap {gap:.2e} > {tolerance}"
                    )
                if dtype == "float32":
                    lines.append(await greedy_matches_generate(backend, prompts[1]))
                lines.append(f"{dtype}: {tokens} tokens, up to {max(rows)} rows a pass, max logprob gap {gap:.1e}")
            finally:
                await backend.close()
        return "; ".join(lines)

    async def greedy_matches_generate(backend: Any, prompt: list[int]) -> str:
        import torch

        from openclaw_cli.types import SamplingParams

        ours = await backend.sample(prompt, SamplingParams(max_tokens=16, temperature=0.0))
        model = backend._loaded.model
        ids = torch.tensor([prompt], device=model.device)
        with torch.no_grad():
            generated = model.generate(ids, max_new_tokens=16, do_sample=False, attention_mask=torch.ones_like(ids))
        theirs = generated[0, len(prompt) :].tolist()
        if ours.tokens != theirs[: len(ours.tokens)]:
            raise AssertionError(f"greedy decode {ours.tokens} differs from generate {theirs}")
        return f"greedy = generate ({len(ours.tokens)} tokens)"

    async def lora_step() -> str:
        from openclaw_cli.backends.local import LocalBackend
        from openclaw_cli.learn.algorithms import ppo_loss_config
        from openclaw_cli.settings import TrainSettings
        from openclaw_cli.types import AdamParams, SamplingParams, datum_from_completion

        backend = LocalBackend(settings_for(state["model"], work / "train", args.device))
        await backend.start()
        state["backend"] = backend
        tokenizer = backend.tokenizer()
        prompt = tokenizer.render([{"role": "user", "content": "What is the capital of France?"}])
        sampled = await backend.sample(prompt, SamplingParams(max_tokens=16, seed=7))
        datum = datum_from_completion(prompt, sampled.tokens, logprobs=sampled.logprobs, advantages=1.0)
        out = await backend.forward_backward([datum], "ppo", ppo_loss_config(TrainSettings()))
        ratio = out.metrics.get("ratio_mean")
        if ratio is None or abs(ratio - 1.0) > 0.02:
            raise AssertionError(f"untrained learner's ratio to the sampler is {ratio}, not 1")
        await backend.optim_step(AdamParams(learning_rate=0.05, beta2=0.99))
        after = await backend.forward_backward([datum], "ppo", ppo_loss_config(TrainSettings()))
        await backend.discard_gradients()
        before_lp = sum(sampled.logprobs)
        after_lp = sum(after.logprobs[0][len(prompt) - 1 :])
        if not after_lp > before_lp:
            raise AssertionError(f"a positive advantage did not raise the reply's logprob ({before_lp} -> {after_lp})")
        state["prompt"] = prompt
        return f"loss {out.loss:.4f}, ratio {ratio:.4f}, reply logprob {before_lp:.2f} -> {after_lp:.2f}"

    async def publish_hot_swap() -> str:
        from openclaw_cli.types import AdamParams, SampleResult, SamplingParams, TokenChunk, datum_from_completion

        backend = state["backend"]
        prompt = state["prompt"]
        v1 = await backend.publish("gpu-check-1")
        result: SampleResult | None = None
        chunks = 0
        hook = backend._loaded.model.register_forward_pre_hook(lambda *_: time.sleep(0.01))
        try:
            async for event in backend.stream(prompt, SamplingParams(max_tokens=32, seed=9)):
                if isinstance(event, TokenChunk):
                    chunks += 1
                    if chunks == 1:
                        warm = await backend.sample(prompt, SamplingParams(max_tokens=8, seed=1), version=v1.version)
                        datum = datum_from_completion(prompt, warm.tokens, logprobs=warm.logprobs, advantages=-1.0)
                        await backend.forward_backward([datum], "importance_sampling")
                        await backend.optim_step(AdamParams(learning_rate=0.05, beta2=0.99))
                        v2 = await backend.publish("gpu-check-2")
                else:
                    result = event
        finally:
            hook.remove()
        if result is None or result.version != v1.version:
            raise AssertionError(f"the stream in flight did not finish on version {v1.version}: {result}")
        after = await backend.sample(prompt, SamplingParams(max_tokens=16, seed=3))
        forced = await backend.compute_logprobs(prompt + after.tokens)
        gap = max_gap(after.logprobs, forced[len(prompt) :])
        if after.version != v2.version or gap > 0.05:
            raise AssertionError(f"after the swap: version {after.version} (want {v2.version}), gap {gap:.2e}")
        await backend.close()
        swapped = f"v{v1.version} while v{v2.version} went live"
        return f"a stream of {len(result.tokens)} tokens finished on {swapped}; sampler vs teacher-forced gap {gap:.1e}"

    async def launch_loop() -> str:
        from e2e_scenario import STEPS, ScriptedJudge, e2e_settings, make_learnable_model, run_scenario
        from runtime_helpers import free_port

        learnable = make_learnable_model(state["model"], work / "learnable")
        settings = e2e_settings(learnable, work / "launch", free_port())
        settings = settings.model_copy(update={"local": settings.local.model_copy(update={"device": args.device})})
        judge = ScriptedJudge()
        result = await run_scenario(settings, judge, check_served_logprobs=True)
        versions = [s[1] for s in result.steps]
        if result.version != STEPS or versions != list(range(1, STEPS + 1)):
            raise AssertionError(f"published versions {versions}, serving {result.version}")
        return (
            f"{STEPS} steps -> v{result.version}; behaviour rate {result.rate_before:.2f} -> {result.rate_after:.2f}; "
            f"served-logprob gap {result.served_logprob_gap:.1e}; sampler {result.sampler_kind}"
        )

    ok = await stage("environment", environment)
    ok = ok and await stage("tiny model", tiny_model)
    if ok:
        await stage("batched decode", batched_decode)
        if await stage("LoRA step", lora_step):
            await stage("publish + hot swap", publish_hot_swap)
        await stage("launch loop", launch_loop)
    passed = all(r["ok"] for r in RESULTS) and len(RESULTS) == 6
    print(f"GPU CHECK {'PASS' if passed else 'FAIL'}: {sum(r['ok'] for r in RESULTS)}/6 stages", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(RESULTS, indent=2))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
