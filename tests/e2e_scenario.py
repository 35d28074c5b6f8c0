"""The end-to-end learning scenario, shared by the per-backend e2e tests (tests/test_e2e_*.py).

`openclaw launch`'s runtime serves a policy, a scripted user talks to it through the real `openai` SDK and corrects
every reply that lacks a chosen behaviour, a scripted judge (a test double of
:class:`~openclaw_cli.learn.judge.JudgeClient`) reads the corrections from the next state, and the trainer updates the
served policy. :func:`run_scenario` plays it and returns what was measured; each test asserts on it.

The behaviour: **the reply starts with a word** (its first non-blank character is a letter). The shared tiny model
cannot learn any such behaviour in a few steps: its tied embeddings are initialised with std 0.02 and the final
RMSNorm fixes the hidden state's norm, so no LoRA on the transformer blocks can move a logit by more than about 1
and its next-token distribution stays nearly uniform. The scenario therefore serves a copy whose embeddings are
scaled by :data:`EMBEDDING_SCALE` (:func:`make_learnable_model`): the base policy then has peaked preferences per
prompt (here it mostly replies with a blank line), and LoRA can shift them within a few steps.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from openclaw_cli.backend import Backend
from openclaw_cli.launch import Runtime, launch
from openclaw_cli.settings import JudgeSettings, LocalSettings, LoraSettings, Settings, StoreSettings, TrainSettings

STEPS = 8
SESSIONS_PER_STEP = 2
REPLIES_PER_SESSION = 4  # the last reply of a session has no next state: judged 0, carries no signal
EVAL_SAMPLES = 48
MAX_TOKENS = 2
EMBEDDING_SCALE = 10.0
LORA_RANK, LORA_ALPHA = 8, 16
CORRECTION = "No, that is not what I asked for. Start your reply with a word."
QUESTIONS = [
    "What is the capital of France?",
    "Please answer briefly.",
    "Tell me something about Tokyo.",
    "How do I add two numbers in Python?",
    "Say hello politely.",
    "What is 2 + 3 * 4?",
]


def has_behaviour(reply: str) -> bool:
    """The reply starts with a word: its first non-blank character is an ASCII letter."""
    first = reply.lstrip()[:1]
    return first.isascii() and first.isalpha()


class ScriptedJudge:
    """A JudgeClient test double: votes -1 when the next state is the user's correction, else +1."""

    name = "scripted-judge"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        self.calls += 1
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        # Only the next-state section counts: the context section may quote an earlier correction.
        next_state = re.split(r"## Next state[^\n]*\n", prompt)[-1]
        return "\\boxed{-1}" if CORRECTION in next_state else "\\boxed{1}"


def make_learnable_model(tiny_model_dir: Path, target: Path, scale: float = EMBEDDING_SCALE) -> Path:
    """Save the tiny model with its (tied) embeddings scaled up by ``scale`` to ``target`` (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(scale)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(target)
    return target


def e2e_settings(model_dir: Path, tmp: Path, port: int, *, backend: str = "local", **overrides: Any) -> Settings:
    """The scenario's settings; ``overrides`` are further Settings fields (e.g. API keys)."""
    return Settings(
        backend=backend,
        model=str(model_dir),
        port=port,
        method="rl",
        judge=JudgeSettings(votes=1),
        lora=LoraSettings(rank=LORA_RANK, alpha=LORA_ALPHA),
        # A high learning rate and small batches: the point is to see learning within seconds on a toy model.
        # The behaviour taught here is one repeated token (the tiny model can learn it in seconds): the collapse guard
        # would rightly hold it back as a loop, and the KL anchor would slow it, so both are off in this scenario.
        train=TrainSettings(
            lr=5e-2,
            batch_size=SESSIONS_PER_STEP * REPLIES_PER_SESSION,
            checkpoint_every=1000,
            max_staleness=0,
            kl_coef=0.0,
            collapse_guard=False,
        ),
        store=StoreSettings(path=tmp / "store.sqlite3"),
        local=LocalSettings(state_dir=tmp / "ckpt", seed=0, keep_versions=2, max_concurrent_requests=2),
        proxy={"accept_any_model": True, "expire_every_s": 3600},
        **overrides,
    )


async def behaviour_rate(client: openai.AsyncOpenAI) -> float:
    """Share of seeded samples (side turns: never trained) that show the behaviour under the served policy."""
    hits = 0
    for seed in range(EVAL_SAMPLES):
        question = QUESTIONS[seed % len(QUESTIONS)]
        reply = await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=1000 + seed,
            extra_headers={"X-Turn-Type": "side", "X-Session-Id": "eval"},
        )
        hits += has_behaviour(reply.choices[0].message.content or "")
    return hits / EVAL_SAMPLES


async def converse(client: openai.AsyncOpenAI, http: httpx.AsyncClient, session: str, seed: int) -> list[bool]:
    """One session: the user asks, and corrects every reply that lacks the behaviour; then ends the session."""
    messages: list[dict[str, str]] = [{"role": "user", "content": QUESTIONS[seed % len(QUESTIONS)]}]
    outcomes = []
    for i in range(REPLIES_PER_SESSION):
        reply = await client.chat.completions.create(
            model="policy",
            messages=messages,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=seed * 100 + i,
            extra_headers={"X-Session-Id": session},
        )
        text = reply.choices[0].message.content or ""
        ok = has_behaviour(text)
        outcomes.append(ok)
        follow_up = f"Thanks. {QUESTIONS[(seed + i + 1) % len(QUESTIONS)]}" if ok else CORRECTION
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]
    (await http.post(f"/v1/openclaw/sessions/{session}/end")).raise_for_status()
    return outcomes


async def wait_for_step(runtime: Runtime, step: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while runtime.trainer.stats.steps < step:
        assert time.monotonic() < deadline, f"no training step {step} within {timeout_s}s: {runtime.trainer.stats}"
        await asyncio.sleep(0.05)


@dataclass
class ScenarioResult:
    rate_before: float
    rate_after: float
    round_rates: list[float]
    version: int  # the served policy version at the end
    steps: list[tuple[Any, ...]]  # Store.steps() after the run: (step, version, created_at, metrics)
    sampler_kind: str | None = None  # the local backend's sampler ("transformers" | "vllm")
    # With check_served_logprobs: the largest gap between a served reply's logprobs (current version) and the
    # backend's teacher-forced logprobs of the same tokens at that version.
    served_logprob_gap: float | None = None


async def served_logprob_gap(backend: Backend, prompt: list[int]) -> float:
    """Sample a reply from the current version, score the same tokens teacher-forced, return the largest gap."""
    from openclaw_cli.types import SamplingParams

    version = backend.current_version().version
    served = await backend.sample(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=5), version=version)
    scored = await backend.compute_logprobs(prompt + served.tokens)  # the current version, as served
    tail = scored[len(prompt) :]
    return max(abs(a - float(b)) for a, b in zip(served.logprobs, tail, strict=True) if b is not None)


async def run_scenario(
    settings: Settings,
    judge: ScriptedJudge,
    *,
    backend: Backend | None = None,
    ready_timeout_s: float = 60.0,
    check_served_logprobs: bool = False,
) -> ScenarioResult:
    """Launch the runtime (with ``backend`` instead of the one the settings name, when given), measure the
    behaviour rate, train for :data:`STEPS` steps of scripted sessions, measure again, and shut down."""
    stop = asyncio.Event()
    ready: asyncio.Future[Runtime] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        launch(settings, ui=False, stop=stop, judge_client=judge, on_ready=ready.set_result, backend=backend)
    )
    try:
        runtime = await asyncio.wait_for(asyncio.shield(ready), timeout=ready_timeout_s)
        base_url = runtime.url
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
        async with httpx.AsyncClient(base_url=base_url) as http:
            rate_before = await behaviour_rate(client)
            round_rates = []
            for step in range(1, STEPS + 1):
                outcomes = []
                for s in range(SESSIONS_PER_STEP):
                    outcomes += await converse(client, http, f"user-{step}-{s}", seed=step * 10 + s)
                round_rates.append(sum(outcomes) / len(outcomes))
                await wait_for_step(runtime, step)
            rate_after = await behaviour_rate(client)
            version = runtime.backend.current_version().version
            gap = None
            if check_served_logprobs:
                prompt = runtime.backend.tokenizer().render([{"role": "user", "content": QUESTIONS[0]}])
                gap = await served_logprob_gap(runtime.backend, prompt)
        steps = runtime.store.steps()
        sampler_kind = getattr(runtime.backend, "sampler_kind", None)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=60)
    return ScenarioResult(rate_before, rate_after, round_rates, version, steps, sampler_kind, gap)


def assert_learned(result: ScenarioResult, judge: ScriptedJudge) -> None:
    """What every backend's e2e learning test asserts: STEPS steps, each published as the next version; each batch
    holds 6 judged +-1 turns and 2 session-final turns scored 0 (no next state), so all 8 are in it and at most 6
    train beside the loop probe's samples (the tiny model's greedy replies loop); the judge read every turn that had
    a next state; and the served policy shows the behaviour at least 0.5 more often, with the mean reward of the last
    two steps at least 0.5 above the first step's."""
    assert result.version == STEPS and [s[1] for s in result.steps] == list(range(1, STEPS + 1))
    rewards = [metrics["mean_reward"] for _, _, _, metrics in result.steps]
    assert all(metrics["n_batch"] == 8 and metrics["n_samples"] - metrics["loops"] <= 6 for *_, metrics in result.steps)
    assert judge.calls == STEPS * SESSIONS_PER_STEP * (REPLIES_PER_SESSION - 1)
    print(
        f"behaviour rate {result.rate_before:.2f} -> {result.rate_after:.2f}; rounds {result.round_rates}; "
        f"rewards {rewards}"
    )
    assert result.rate_after >= result.rate_before + 0.5, result
    assert sum(rewards[-2:]) / 2 >= rewards[0] + 0.5, rewards
