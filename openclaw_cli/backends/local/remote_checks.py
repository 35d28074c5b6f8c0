"""What a vLLM server must be before the proxy serves from it (``local.vllm_servers``): each check fails with one
line naming the fix. ``openclaw launch`` runs them all at start (the remote sampler's ``start``); ``openclaw doctor``
runs the ones that need no model loaded here (1 and 3, and names the served model: :func:`server_checks`).

1. it answers (``/version``), and is new enough to return the sampled token ids (vLLM >= 0.10.2);
2. it serves the trainer's model with the same chat template: ``/tokenize`` of a probe conversation gives exactly
   the tokens our own rendering does;
3. runtime LoRA loading is on (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; without it the routes are 404);
4. it can load our adapter: the LoRA rank fits its ``--max-lora-rank``, and it reads ``local.vllm_adapter_dir`` at
   the path we write to (with ``local.vllm_publish = "resolver"``: its filesystem resolver finds an adapter written
   there, by name);
5. its log-probabilities are the policy's own: a short reply sampled at temperature 0.5, and its first position's
   runner-up token, are rescored by the trainer's torch copy of the base model; raw log-probabilities (vLLM's
   default) agree, processed ones (``--logprobs-mode processed_logprobs``) or another model's do not.

One more probe is not a refusal (:func:`grammar_refusal`): whether the server decodes under our Lark grammars
(JSON Schema replies, forced tool calls) on vLLM's ``guidance`` backend (llguidance, which reads the compact JSON
layout the grammars ask for). Each grammar we send opens with :data:`GUIDANCE_ONLY`, a directive only llguidance
knows: vLLM's default backend, ``auto``, first tries xgrammar, which reads our Lark too but ignores the layout
(measured on vLLM 0.32's CPU build: the tiny test model padded a JSON reply with whitespace until ``max_tokens``);
refused by xgrammar, ``auto`` falls back to guidance. A server pinned to another backend refuses the grammar, and
the proxy then checks and resamples constrained replies instead, as it does for any sampler that cannot constrain.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from openclaw_cli.backend import BackendError, ChatTokenizer, Check
from openclaw_cli.backends.local.grammar import grammar_for
from openclaw_cli.backends.local.lora_delta import LoraWeights, write_peft_adapter
from openclaw_cli.structured_output import json_form
from openclaw_cli.types import OutputConstraint

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings

# log p(tokens[i] | tokens[:i]) under the base model for i >= start (the trainer's torch copy)
Scorer = Callable[[list[int], int], Awaitable[list[float | None]]]

MIN_VERSION = (0, 10, 2)  # the completions API's return_token_ids
PROBE = [{"role": "user", "content": "Name three colours of the rainbow."}]
MAX_LOGPROB_GAP = 0.1  # mean |ours - theirs| per token; dtype differences stay far below, another model far above
RUNTIME_LORA_FIX = "start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora"
GRAMMAR_FIX = "start it with --structured-outputs-config.backend guidance (or auto, the default, which picks it)"
GRAMMAR_PROBE = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
GUIDANCE_ONLY = "%llguidance {}\n"  # llguidance's options directive (none set); xgrammar refuses a grammar with it


def guidance_grammar(tokenizer: ChatTokenizer, constraint: OutputConstraint) -> str:
    """``constraint`` as the grammar a vLLM server gets: ours, marked so that only the guidance backend takes it."""
    return GUIDANCE_ONLY + grammar_for(tokenizer, constraint)


async def check_server(
    client: httpx.AsyncClient,
    url: str,
    tokenizer: ChatTokenizer,
    *,
    adapter_dir: Path,
    model_path: Path,
    probe_weights: LoraWeights | None,
    scorer: Scorer | None,
    resolver: bool = False,
) -> tuple[str, str]:
    """Run the checks of the module docstring against ``url``; returns the name the server serves its model by and
    its ``--model`` string (what an adapter the resolver loads must name as its base)."""
    version = await _version(client, url)
    if version < MIN_VERSION:
        shown = ".".join(map(str, version))
        raise BackendError(f"vLLM {shown} at {url} is too old to return token ids; upgrade it to vLLM >= 0.10.2")
    model, root = await _served_model(client, url)
    await _same_template(client, url, model, tokenizer)
    await _runtime_lora_on(client, url)
    if probe_weights is not None:  # the resolver loads an adapter only if it names the server's --model string
        base = root if resolver else model_path
        await _takes_our_adapter(client, url, adapter_dir, base, probe_weights, resolver=resolver, tokenizer=tokenizer)
    if scorer is not None:
        await _raw_logprobs(client, url, model, tokenizer, scorer)
    return model, root


async def _get(client: httpx.AsyncClient, url: str) -> Any:
    try:
        response = await client.get(url, timeout=10.0)
    except httpx.HTTPError as exc:
        raise BackendError(
            f"the vLLM server {url.rsplit('/', 1)[0]} is unreachable ({exc}); start it, or fix local.vllm_servers"
        ) from exc
    if response.status_code == 401:
        raise BackendError(f"{url} refused our key (401): set local.vllm_api_key to the server's --api-key")
    if response.status_code != 200:
        raise BackendError(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
    return response.json()


async def _version(client: httpx.AsyncClient, url: str) -> tuple[int, ...]:
    text = str((await _get(client, f"{url}/version")).get("version", "0"))
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
        if not piece.isdigit():
            break
    return tuple(parts)


async def _served_model(client: httpx.AsyncClient, url: str) -> tuple[str, str]:
    """The base model's served name and its ``--model`` string (the card's root)."""
    cards = (await _get(client, f"{url}/v1/models")).get("data") or []
    bases = [c for c in cards if not c.get("parent") and not str(c.get("id", "")).startswith("openclaw-")]
    if not bases:
        raise BackendError(f"{url} lists no model in /v1/models")
    return str(bases[0]["id"]), str(bases[0].get("root") or bases[0]["id"])


async def _same_template(client: httpx.AsyncClient, url: str, model: str, tokenizer: ChatTokenizer) -> None:
    ours = tokenizer.render(PROBE)
    body = {"model": model, "messages": PROBE, "add_generation_prompt": True}
    try:
        response = await client.post(f"{url}/tokenize", json=body, timeout=10.0)
        theirs = [int(t) for t in response.json().get("tokens", [])]
    except (httpx.HTTPError, ValueError) as exc:
        raise BackendError(f"{url} could not tokenize a chat ({exc}); is it a vLLM server?") from exc
    if theirs != ours:
        at = next(
            (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
        )
        raise BackendError(
            f"{url} serves {model!r}, whose chat template renders a probe conversation differently from the trainer's "
            f"model (first difference at token {at}); serve the same model (and chat template) the trainer loads"
        )


async def _runtime_lora_on(client: httpx.AsyncClient, url: str) -> None:
    probe = f"openclaw-probe-{secrets.token_hex(4)}"
    try:
        response = await client.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": probe}, timeout=10.0)
    except httpx.HTTPError as exc:
        raise BackendError(f"{url} is unreachable ({exc})") from exc
    # Loading on: vLLM's own 404 for an adapter it does not hold. Off: the route does not exist (FastAPI's 404).
    if response.status_code == 404 and "cannot be found" in response.text:
        return
    raise BackendError(f"runtime LoRA loading is off at {url} (HTTP {response.status_code}); {RUNTIME_LORA_FIX}")


async def _takes_our_adapter(
    client: httpx.AsyncClient,
    url: str,
    adapter_dir: Path,
    base: str | Path,
    weights: LoraWeights,
    *,
    resolver: bool,
    tokenizer: ChatTokenizer,
) -> None:
    """Write a probe adapter of our shape (naming ``base`` as its base model) and have the server take it: loaded
    with the runtime API, or, with ``resolver``, named in a one-token request for its filesystem resolver to find.
    The probe is unloaded and deleted either way."""
    name = f"openclaw-probe-{secrets.token_hex(4)}"
    path = adapter_dir / name
    await asyncio.to_thread(write_peft_adapter, weights, path, base)
    if resolver:
        prompt = tokenizer.render(PROBE)
        route, body = "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 1, "temperature": 0.0}
    else:
        route, body = "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
    try:
        response = await client.post(f"{url}{route}", json=body, timeout=120.0)
        if response.status_code == 200:
            await client.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=10.0)
            return
    except httpx.HTTPError as exc:
        raise BackendError(f"{url} failed while loading a probe adapter ({exc})") from exc
    finally:
        shutil.rmtree(path, ignore_errors=True)
    text = response.text[:200]
    if "rank" in text.lower():
        rank = next(iter(weights.values())).a.shape[0] if weights else 0
        raise BackendError(
            f"{url} cannot load a LoRA of rank {rank}: start it with --max-lora-rank at least {rank} ({text})"
        )
    if resolver:
        raise BackendError(
            f"{url} did not find an adapter written to {adapter_dir} ({text}): start it with "
            f"VLLM_PLUGINS=lora_filesystem_resolver and VLLM_LORA_RESOLVER_CACHE_DIR={adapter_dir} (the same "
            "directory at the same path), or set local.vllm_publish = 'load'"
        )
    if any(sign in text.lower() for sign in ("not found", "no such file", "does not exist")):
        raise BackendError(
            f"{url} cannot read the adapter written to {path}: local.vllm_adapter_dir must be a directory every "
            f"server reads at the same path ({text})"
        )
    raise BackendError(f"{url} refused a LoRA adapter of ours (HTTP {response.status_code}): {text}")


async def _raw_logprobs(
    client: httpx.AsyncClient, url: str, model: str, tokenizer: ChatTokenizer, scorer: Scorer
) -> None:
    """A short reply sampled at temperature 0.5, with each position's two likeliest tokens; the trainer's torch copy
    rescores the sampled tokens and the first position's runner-up. Raw log-probabilities agree with it. Processed
    ones (the temperature applied) differ little on a peaked model's sampled tokens (near 0 either way: measured on
    the test model, under 0.1 nats) but about double a runner-up's; another model's differ everywhere."""
    prompt = tokenizer.render(PROBE)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0.5,
        "seed": 0,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    try:
        response = await client.post(f"{url}/v1/completions", json=body, timeout=120.0)
        choice = response.json()["choices"][0]
        tokens = [int(t) for t in choice["token_ids"]]
        theirs = [float(v) for v in choice["logprobs"]["token_logprobs"]]
        top = choice["logprobs"].get("top_logprobs") or []
    except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise BackendError(
            f"{url} did not return token ids and log-probabilities for a completion ({exc}); vLLM >= 0.10.2 needed"
        ) from exc
    if not tokens:
        return
    ours = [v for v in await scorer(prompt + tokens, len(prompt)) if v is not None][-len(tokens) :]
    gap = sum(abs(a - b) for a, b in zip(ours, theirs, strict=False)) / len(tokens)
    runner_up = _runner_up(top[0] if top else None, tokens[0])
    if runner_up is not None:
        token, reported = runner_up
        scored = (await scorer([*prompt, token], len(prompt)))[-1]
        # Relative: a runner-up lies far out in the tail, where a bf16 server's rounding is larger in nats.
        if scored is not None and abs(scored - reported) > MAX_LOGPROB_GAP * (1 + abs(scored)):
            gap = max(gap, abs(scored - reported))  # above MAX_LOGPROB_GAP: refused below
    if gap > MAX_LOGPROB_GAP:
        raise BackendError(
            f"{url} reports log-probabilities {gap:.2f} nats per token away from the trainer's own for the same "
            "tokens: start it with --logprobs-mode raw_logprobs (the default), the trainer's model and a dtype "
            "close to local.dtype"
        )


def _runner_up(top: Any, sampled: int) -> tuple[int, float] | None:
    """The likeliest token other than ``sampled`` among a position's top log-probabilities (keys ``token_id:N``, as
    ``return_tokens_as_token_ids`` writes them), with its reported log-probability; None when there is none."""
    if not isinstance(top, dict):
        return None
    others = []
    for key, value in top.items():
        token = str(key).removeprefix("token_id:")
        if token != key and token.isdigit() and int(token) != sampled:
            others.append((int(token), float(value)))
    return max(others, key=lambda item: item[1]) if others else None


async def grammar_refusal(client: httpx.AsyncClient, url: str, model: str, tokenizer: ChatTokenizer) -> str | None:
    """None when the server decodes a one-token reply under the grammar of a small JSON Schema (ours: Lark, as
    :func:`~openclaw_cli.backends.local.grammar.grammar_for` writes it), else why not, naming the fix."""
    grammar = guidance_grammar(tokenizer, OutputConstraint((json_form(GRAMMAR_PROBE),)))
    body = {
        "model": model,
        "prompt": tokenizer.render(PROBE),
        "max_tokens": 1,
        "temperature": 0.0,
        "structured_outputs": {"grammar": grammar},
    }
    try:
        response = await client.post(f"{url}/v1/completions", json=body, timeout=120.0)
    except httpx.HTTPError as exc:
        return f"{url} failed a constrained probe request ({exc})"
    if response.status_code == 200:
        return None
    return f"{url} refused our grammar (HTTP {response.status_code}: {response.text[:200]}); {GRAMMAR_FIX}"


def server_checks(settings: Settings) -> list[Check]:
    """``openclaw doctor``'s view of each server in ``local.vllm_servers``: reachable, recent enough, runtime LoRA
    loading on, and which model it serves (the template, adapter and log-probability checks need the model loaded:
    ``openclaw launch`` runs them)."""
    key = settings.local.vllm_api_key
    headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}

    async def one(client: httpx.AsyncClient, url: str) -> Check:
        try:
            version = await _version(client, url)
            if version < MIN_VERSION:
                raise BackendError(f"vLLM {'.'.join(map(str, version))} is too old to return token ids (>= 0.10.2)")
            model, _ = await _served_model(client, url)
            await _runtime_lora_on(client, url)
        except BackendError as exc:
            return Check(f"vLLM server {url}", False, str(exc))
        return Check(f"vLLM server {url}", True, f"serves {model}; runtime LoRA loading on")

    async def every() -> list[Check]:
        async with httpx.AsyncClient(headers=headers) as client:
            return list(await asyncio.gather(*(one(client, u.rstrip("/")) for u in settings.local.vllm_servers)))

    return asyncio.run(every())
