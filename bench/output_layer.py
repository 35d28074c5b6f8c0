"""What skipping the output layer over the prompt saves: the local backend against scoring every position.

    .venv/bin/python bench/output_layer.py                      # SmolLM2-135M, 8 datums of 300 + 40 tokens
    .venv/bin/python bench/output_layer.py --model tiny --repeats 5

SmolLM2's output layer maps 576 hidden units onto a 49,152-word vocabulary at every position it is asked for, and a
log-softmax runs over each. A reply after a prompt needs it only where the reply's tokens are predicted. Three
places do this now, each measured against the same call scoring every position (the peer: how it ran before), in
the same process, same inputs, calls alternated, median of ``--repeats`` after a warm-up:

- a training step (``LoraTrainer.forward_backward`` + ``optim_step``, PPO), ``every_position=True`` (as the Tinker and
  Fireworks doubles run) against ``False`` (the local backend), which also checks that both give the same loss;
- teacher-forced scoring of prompt + reply (``teacher_forced_logprobs``), from position 1 against from the reply;
- the judge's verdict read (``next_token_logprobs``): its cost with every position's logits is timed by calling the
  model without ``logits_to_keep``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch

from openclaw_cli.settings import LoraSettings, Settings
from openclaw_cli.types import AdamParams, datum_from_completion


def paired_seconds(peer: Callable[[], object], ours: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of each, calls alternated (peer, ours, peer, ...) after one warm-up of each, so a machine that
    speeds up or slows down during the run (a shared 2-core box) affects both alike."""
    peer(), ours()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for run, into in ((peer, times[0]), (ours, times[1])):
            start = time.perf_counter()
            run()
            into.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def load(name: str, workdir: Path) -> Any:
    from openclaw_cli.backends.local.model_loading import embedded_default_path, load_model
    from openclaw_cli.testing.tiny_model import save_tiny_model

    path = save_tiny_model(workdir / "tiny") if name == "tiny" else embedded_default_path()
    return load_model(Settings(model=str(path), local={"device": "cpu", "dtype": "float32"}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--batch", type=int, default=8, help="datums per training step")
    parser.add_argument("--prompt-len", type=int, default=300)
    parser.add_argument("--completion-len", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from openclaw_cli.backends.local.sampler import next_token_logprobs, teacher_forced_logprobs
    from openclaw_cli.backends.local.trainer import LoraTrainer

    with tempfile.TemporaryDirectory() as tmp:
        loaded = load(args.model, Path(tmp))
    model, device = loaded.model, torch.device("cpu")
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (args.prompt_len,), generator=generator).tolist()
    completions = [
        torch.randint(0, vocab, (args.completion_len,), generator=generator).tolist() for _ in range(args.batch)
    ]
    datums = [
        datum_from_completion(prompt, c, logprobs=[-2.0] * len(c), advantages=1.0 if i % 2 else -1.0)
        for i, c in enumerate(completions)
    ]
    print(
        f"{args.model}, {torch.get_num_threads()} threads; {args.batch} datums of {args.prompt_len} prompt + "
        f"{args.completion_len} reply tokens; median of {args.repeats}"
    )
    rows = []
    losses = {}

    def training_step(every: bool) -> Callable[[], None]:
        trainer = LoraTrainer(model, LoraSettings(), seed=0, every_position=every)

        def step() -> None:
            losses[every] = trainer.forward_backward(datums, "ppo", {"eps_low": 0.2, "eps_high": 0.28}).loss
            trainer.optim_step(AdamParams(learning_rate=0.0))  # lr 0: every repeat trains the same weights

        return step

    peer_s, ours_s = paired_seconds(training_step(True), training_step(False), args.repeats)
    rows += [("training step, every_position=True", peer_s), ("training step, every_position=False", ours_s)]
    if abs(losses[True] - losses[False]) > 1e-4 * max(1.0, abs(losses[True])):
        raise SystemExit(f"the two training steps disagree: loss {losses[True]} against {losses[False]}")

    tokens = prompt + completions[0]
    peer_s, ours_s = paired_seconds(
        lambda: teacher_forced_logprobs(model, tokens, device, 1),
        lambda: teacher_forced_logprobs(model, tokens, device, len(prompt)),
        args.repeats,
    )
    rows += [("scoring prompt + reply from position 1", peer_s), (f"... from position {len(prompt)}", ours_s)]

    def every_logit() -> None:
        with torch.inference_mode():
            model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0, -1]

    peer_s, ours_s = paired_seconds(every_logit, lambda: next_token_logprobs(model, prompt, [1], device), args.repeats)
    rows += [("verdict read, every position's logits", peer_s), ("verdict read, last position only", ours_s)]
    for i in range(0, len(rows), 2):
        (peer, peer_s), (ours, ours_s) = rows[i], rows[i + 1]
        print(f"  {peer:<45} {peer_s:7.3f} s\n  {ours:<45} {ours_s:7.3f} s   {peer_s / ours_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
