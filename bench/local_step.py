"""Throughput of one local LoRA training step, ours against TRL's GRPOTrainer, on the same model and batch shape.

    .venv/bin/python bench/local_step.py                 # tiny model + SmolLM2-135M-Instruct, 3 timed steps each
    .venv/bin/python bench/local_step.py --models tiny --steps 5

What is compared (per optimizer step, same process, float32, same device):
- ours: ``LoraTrainer.forward_backward(datums, "ppo", cfg)`` + ``optim_step(AdamParams)`` on ``batch`` datums of
  ``prompt_len`` prompt + ``completion_len`` completion tokens (completions are given, as our trainer trains on
  captured samples; it never generates);
- TRL: one ``GRPOTrainer`` optimizer step on the same model, LoRA config (rank, alpha, targets, dropout 0),
  AdamW, grad-clip 1.0, no gradient checkpointing, beta 0 (no reference model), one prompt of ``prompt_len``
  tokens x ``batch`` generations of exactly ``completion_len`` tokens (``min_new_tokens`` forces the length).
  A GRPO step must generate its completions, so TRL is reported twice: the whole step, and the step minus the time
  spent inside its generation call (``_generate_single_turn``), which is the like-for-like training cost.

tokens/step = batch x (prompt_len + completion_len); for TRL it is read back from its own counter
(``state.num_input_tokens_seen``). The first step of each side is a warm-up and not timed.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout without installing
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from openclaw_cli.settings import LoraSettings, Settings  # noqa: E402
from openclaw_cli.types import AdamParams, datum_from_completion  # noqa: E402

TRL_INSTALL_HINT = (
    ".venv/bin/pip install trl -c <(.venv/bin/pip freeze | grep -iE "
    "'^(torch|transformers|tokenizers|peft|accelerate)==')"
)


@dataclass
class Measurement:
    tokens_per_step: float
    seconds_per_step: list[float]
    generation_seconds: list[float] | None = None

    @property
    def step_s(self) -> float:
        return statistics.median(self.seconds_per_step)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def train_only_tokens_per_s(self) -> float | None:
        if self.generation_seconds is None:
            return None
        train = [s - g for s, g in zip(self.seconds_per_step, self.generation_seconds, strict=True)]
        return self.tokens_per_step / statistics.median(train)


# --------------------------------------------------------------------------------------------------- models


def model_dir(name: str, workdir: Path) -> Path:
    if name == "tiny":
        from openclaw_cli.testing.tiny_model import save_tiny_model

        return save_tiny_model(workdir / "tiny")
    if name == "smollm2":
        from openclaw_cli.backends.local.model_loading import embedded_default_path

        return embedded_default_path()  # converts the packaged GGUF on first use (~1 min), then cached
    raise SystemExit(f"unknown model {name!r}; use tiny or smollm2")


def prompt_of_length(tokenizer, length: int) -> tuple[str, list[int]]:
    """A text whose tokenisation (no special tokens) is exactly ``length`` ids, and those ids."""
    words = " ".join(["hello"] * (length * 2))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][:length]
    text = tokenizer.decode(ids)
    again = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(again) != length:
        raise RuntimeError(f"could not build a {length}-token prompt (got {len(again)})")
    return text, again


# --------------------------------------------------------------------------------------------------- ours


def bench_ours(path: Path, args: argparse.Namespace, lora: LoraSettings) -> Measurement:
    from openclaw_cli.backends.local.model_loading import load_model
    from openclaw_cli.backends.local.trainer import LoraTrainer

    loaded = load_model(Settings(model=str(path), local={"device": "cpu", "dtype": "float32"}))
    trainer = LoraTrainer(
        loaded.model,
        lora,
        seed=0,
        max_batch_tokens=args.batch * (args.prompt_len + args.completion_len),
        every_position=False,  # as the local backend trains (bench/output_layer.py measures the difference)
    )
    _, prompt = prompt_of_length(loaded.tokenizer.hf, args.prompt_len)
    generator = torch.Generator().manual_seed(0)
    vocab = loaded.model.config.vocab_size
    datums = []
    for i in range(args.batch):
        completion = torch.randint(0, vocab, (args.completion_len,), generator=generator).tolist()
        datums.append(
            datum_from_completion(
                prompt,
                completion,
                logprobs=[-2.0] * args.completion_len,  # sampler logprobs: any finite values exercise the ratio
                advantages=1.0 if i % 2 == 0 else -1.0,
            )
        )
    adam = AdamParams(learning_rate=1e-4, grad_clip_norm=1.0)
    times = []
    for step in range(args.steps + 1):
        start = time.perf_counter()
        trainer.forward_backward(datums, "ppo", {"eps_low": 0.2, "eps_high": 0.28})
        trainer.optim_step(adam)
        if step > 0:  # step 0 warms up allocator and kernels
            times.append(time.perf_counter() - start)
    return Measurement(tokens_per_step=args.batch * (args.prompt_len + args.completion_len), seconds_per_step=times)


# --------------------------------------------------------------------------------------------------- TRL


def trl_problem() -> str | None:
    if importlib.util.find_spec("trl") is None:
        return f"TRL is not installed; install it without moving torch/transformers: {TRL_INSTALL_HINT}"
    try:
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
    except Exception as exc:  # an incompatible TRL fails at import (e.g. a transformers API it needs is missing)
        return f"TRL is installed but does not import with this transformers ({type(exc).__name__}: {exc})"
    return None


def bench_trl(path: Path, args: argparse.Namespace, lora: LoraSettings, workdir: Path) -> Measurement:
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    transformers.logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    text, _ = prompt_of_length(tokenizer, args.prompt_len)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    class TimedGRPO(GRPOTrainer):
        generation_seconds: list[float]

        def _generate_single_turn(self, *a, **kw):  # the generation call of one step
            start = time.perf_counter()
            try:
                return super()._generate_single_turn(*a, **kw)
            finally:
                self.generation_seconds.append(time.perf_counter() - start)

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.tokens: list[int] = []
            self._start = 0.0

        def on_step_begin(self, _args, state, _control, **_kw):
            self._start = time.perf_counter()
            self.tokens.append(int(state.num_input_tokens_seen))

        def on_step_end(self, _args, state, _control, **_kw):
            self.seconds.append(time.perf_counter() - self._start)
            self.tokens[-1] = int(state.num_input_tokens_seen) - self.tokens[-1]

    def reward(completions, **_kw) -> list[float]:
        # Any varied score: GRPO needs non-zero advantages for a real backward pass.
        return [float(sum(map(ord, str(c))) % 7) for c in completions]

    config = GRPOConfig(
        output_dir=str(workdir / "trl-out"),
        per_device_train_batch_size=args.batch,
        num_generations=args.batch,
        max_completion_length=args.completion_len,
        generation_kwargs={"min_new_tokens": args.completion_len},
        max_steps=args.steps + 1,
        learning_rate=1e-4,
        max_grad_norm=1.0,
        beta=0.0,
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=0.0,
        target_modules=list(lora.targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    dataset = Dataset.from_dict({"prompt": [text] * (args.steps + 1) * 2})
    timer = StepTimer()
    trainer = TimedGRPO(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[timer],
    )
    trainer.generation_seconds = []
    trainer.train()
    if len(timer.seconds) != args.steps + 1 or len(trainer.generation_seconds) != args.steps + 1:
        raise RuntimeError(
            f"expected {args.steps + 1} TRL steps with one generation each, got {len(timer.seconds)} steps and "
            f"{len(trainer.generation_seconds)} generations"
        )
    tokens = timer.tokens[1:]
    return Measurement(
        tokens_per_step=statistics.mean(tokens),
        seconds_per_step=timer.seconds[1:],
        generation_seconds=trainer.generation_seconds[1:],
    )


# --------------------------------------------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2", help="comma list of: tiny, smollm2")
    parser.add_argument("--batch", type=int, default=4, help="sequences per step (= TRL generations per prompt)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (after one warm-up step)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads for both sides (1 = stable figures on a shared machine; 0 = torch's default)",
    )
    parser.add_argument("--no-trl", action="store_true", help="measure our trainer only")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 130))
    lora = Settings().lora
    problem = None if not args.no_trl else "skipped (--no-trl)"
    problem = problem or trl_problem()
    console.print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads; batch {args.batch} x "
        f"({args.prompt_len} prompt + {args.completion_len} completion) tokens; LoRA r={lora.rank} "
        f"alpha={lora.alpha} on {', '.join(lora.targets)}; median of {args.steps} steps after 1 warm-up"
    )
    table = Table(title="LoRA training step throughput (tokens/s, higher is better)")
    for column in (
        "model",
        "tokens/step",
        "ours tok/s",
        "TRL tok/s (whole step)",
        "TRL tok/s (minus generation)",
        "ratio ours/TRL whole",
        "ratio ours/TRL train-only",
    ):
        table.add_column(column, justify="right" if column != "model" else "left")

    with tempfile.TemporaryDirectory(prefix="openclaw-bench-") as tmp:
        workdir = Path(tmp)
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            path = model_dir(name, workdir)
            with console.status(f"{name}: our trainer…"):
                ours = bench_ours(path, args, lora)
            trl: Measurement | None = None
            if problem is None:
                with console.status(f"{name}: TRL GRPOTrainer…"):
                    try:
                        trl = bench_trl(path, args, lora, workdir)
                    except Exception as exc:  # report it and keep our own figures
                        problem = f"TRL run failed on {name}: {type(exc).__name__}: {exc}"
            if trl is not None:
                train_only = trl.train_only_tokens_per_s
                assert train_only is not None
                table.add_row(
                    name,
                    f"{ours.tokens_per_step:.0f} / TRL {trl.tokens_per_step:.0f}",
                    f"{ours.tokens_per_s:,.0f}",
                    f"{trl.tokens_per_s:,.0f}",
                    f"{train_only:,.0f}",
                    f"{ours.tokens_per_s / trl.tokens_per_s:.2f}x",
                    f"{ours.tokens_per_s / train_only:.2f}x",
                )
            else:
                table.add_row(name, f"{ours.tokens_per_step:.0f}", f"{ours.tokens_per_s:,.0f}", "-", "-", "-", "-")
    console.print(table)
    if problem is not None:
        console.print(f"[yellow]TRL comparison not available:[/] {problem}")
    console.print(
        "ours = forward_backward('ppo') + optim_step on given completions. TRL whole step = GRPO generation + "
        "reward + loss + backward + AdamW; 'minus generation' subtracts the time inside its generation call."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
