"""Two owners on one `openclaw launch` runtime with lora.scope = owner (the default): alice corrects the served tiny
model toward a behaviour until her adapter learns it; bob, on the same server at the same time, is served by the base
model throughout (his adapter never took a step), reply for reply, and no step of alice's adapter trained a turn of
his. The scenario (the behaviour, the scripted judge, the learnable model) is tests/e2e_scenario.py's."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from e2e_scenario import MAX_TOKENS, QUESTIONS, SESSIONS_PER_STEP, ScriptedJudge, converse, e2e_settings
from runtime_helpers import free_port, launched

from openclaw_cli.lesson_prompt import key_owner

pytestmark = pytest.mark.timeout(240)

ALICE, BOB = "sk-alice-0123456789", "sk-bob-0123456789"
STEPS = 4


async def _plain_replies(client: openai.AsyncOpenAI) -> list[tuple[str, str, str]]:
    """(reply, adapter, version) for seeded side requests (never trained)."""
    out = []
    for seed in range(8):
        raw = await client.chat.completions.with_raw_response.create(
            model="policy",
            messages=[{"role": "user", "content": QUESTIONS[seed % len(QUESTIONS)]}],
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=500 + seed,
            extra_headers={"X-Turn-Type": "side", "X-Session-Id": "eval"},
        )
        reply = raw.parse().choices[0].message.content or ""
        out.append((reply, raw.headers["x-openclaw-adapter"], raw.headers["x-openclaw-policy-version"]))
    return out


@pytest.mark.parametrize("backend_name", ["local", "tinker", "fireworks"])
async def test_one_owners_corrections_train_only_their_adapter(
    learnable_model_dir: Path, tmp_path: Path, backend_name: str
) -> None:
    settings = e2e_settings(
        learnable_model_dir, tmp_path, free_port(), backend=backend_name, api_keys=[ALICE, BOB], tinker={"api_key": "k"}
    )
    with contextlib.ExitStack() as doubles:
        backend = None
        if backend_name == "tinker":  # the Tinker backend, unchanged, against its SDK double (tests/test_e2e_tinker.py)
            from e2e_scenario import LORA_ALPHA

            from openclaw_cli.backends.tinker import TinkerBackend
            from openclaw_cli.testing.tinker_double import TinkerDouble

            tinker = TinkerDouble(learnable_model_dir, lora_alpha=LORA_ALPHA, seed=0)
            doubles.callback(tinker.close)
            backend = TinkerBackend(settings, service_client_factory=tinker.service_client)
        if backend_name == "fireworks":  # step-wise mode over loopback HTTP to its double (tests/test_e2e_fireworks.py)
            from openclaw_cli.settings import FireworksSettings
            from openclaw_cli.testing.fireworks_training_double import FireworksTrainingDouble

            model = "accounts/fireworks/models/tiny-learnable"
            fireworks = doubles.enter_context(FireworksTrainingDouble(learnable_model_dir, base_model=model))
            update = FireworksSettings(
                mode="stepwise", api_key=fireworks.api_key, base_url=fireworks.url, base_model=model
            )
            settings = settings.model_copy(update={"fireworks": update})
        await check_two_owners(settings, tmp_path, backend=backend, restart=backend_name == "local")


async def check_two_owners(settings: Any, tmp_path: Path, *, backend: Any = None, restart: bool = False) -> None:
    """alice corrects for STEPS steps while bob watches: alice's adapter (only) learns from her turns only; bob's
    seeded replies stay the base model's. With ``restart``, a second launch resumes each adapter."""
    alice, bob = key_owner(ALICE), key_owner(BOB)
    async with launched(settings, judge_client=ScriptedJudge(), backend=backend) as runtime:
        as_alice = openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key=ALICE, max_retries=0)
        as_bob = openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key=BOB, max_retries=0)
        bob_before = await _plain_replies(as_bob)
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with httpx.AsyncClient(base_url=runtime.url, headers=headers) as http:
            for step in range(1, STEPS + 1):
                for s in range(SESSIONS_PER_STEP):
                    await converse(as_alice, http, f"alice-{step}-{s}", seed=step * 10 + s)
                deadline = asyncio.get_running_loop().time() + 60
                while len(runtime.store.steps(adapter=alice)) < step:
                    assert asyncio.get_running_loop().time() < deadline, runtime.trainer.stats
                    await asyncio.sleep(0.05)
        bob_after = await _plain_replies(as_bob)
        alice_now = await _plain_replies(as_alice)
        adapters = {row["adapter"]: row for row in runtime.trainer.adapters()}
        alice_steps = runtime.store.steps(adapter=alice)
        trained = [t for *_, metrics in alice_steps for t in metrics.get("trained_turn_ids", [])]
        owners = {runtime.store.turn_owner(turn_id) for turn_id in trained}
    assert bob_after == bob_before  # the same seeded replies: bob is still served by the base model
    assert {adapter for _, adapter, _ in bob_after} == {bob} and {v for *_, v in bob_after} == {"0"}
    assert {adapter for _, adapter, _ in alice_now} == {alice} and {v for *_, v in alice_now} == {str(STEPS)}
    assert adapters[alice]["steps"] == STEPS and adapters[alice]["version"] == STEPS
    assert bob not in adapters or adapters[bob]["steps"] == 0
    assert trained and owners == {alice}
    assert (tmp_path / "ckpt" / "adapters" / ("key-" + alice[4:]) / f"step-{STEPS:08d}").is_dir()
    if restart:
        await _restart_resumes_each_adapter(settings, alice, bob, alice_now, bob_after)


async def _restart_resumes_each_adapter(
    settings: Any, alice: str, bob: str, alice_before: list[Any], bob_before: list[Any]
) -> None:
    """A new launch on the same store and checkpoints: alice's adapter resumes from its own checkpoint and serves
    the same replies at the same version; bob is still served by the base."""
    async with launched(settings, judge_client=ScriptedJudge()) as runtime:
        adapters = {row["adapter"]: row for row in runtime.trainer.adapters()}
        alice_again = await _plain_replies(
            openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key=ALICE, max_retries=0)
        )
        bob_again = await _plain_replies(openai.AsyncOpenAI(base_url=f"{runtime.url}/v1", api_key=BOB, max_retries=0))
    assert adapters[alice]["version"] == STEPS and adapters[alice]["steps"] == STEPS
    assert alice_again == alice_before and bob_again == bob_before
