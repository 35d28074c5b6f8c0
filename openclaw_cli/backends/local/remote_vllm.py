"""Serve the local policy from vLLM servers the team runs (``local.vllm_servers``); the trainer stays in this process.

The proxy renders each prompt with its own tokenizer and sends the token ids to a server's completions API with
``return_token_ids`` and ``logprobs: 0``, streamed, so what is captured is exactly what the server sampled: its token
ids and their log-probabilities (raw, ``--logprobs-mode raw_logprobs``, vLLM's default: the same quantity a
teacher-forced pass of the same version computes, which :func:`~openclaw_cli.backends.local.remote_checks.check_server`
verifies at start).

**Publishing** (:class:`~openclaw_cli.backends.local.lora_lines.LoraLines`): each version is written once as a PEFT
directory under a name never used before into ``local.vllm_adapter_dir`` (a path every server reads), then loaded
onto every server with vLLM's runtime LoRA API (``/v1/load_lora_adapter``; the servers run with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) before it serves. A request names its version's adapter, pinned when it
starts, so a stream in flight finishes on its version while the next one is published. Versions out of the kept
window that no request pins are unloaded and their directories deleted.

**One URL** (``local.vllm_publish = "resolver"``, e.g. your own load balancer in front of many replicas): a version is
only written, under its new name and naming the server's ``--model`` as its base, into the directory the servers'
filesystem resolver reads (``VLLM_PLUGINS=lora_filesystem_resolver``, ``VLLM_LORA_RESOLVER_CACHE_DIR``); each
replica loads it by name on its first request for it. A one-token request names it before it serves, so a version
that does not resolve fails the publish, not a user's request.

**Replicas.** Requests go to the healthy server with the fewest requests of ours in flight. A request that fails
before its first token (connection refused, a 5xx, a server that lost our adapters by restarting) is retried on
another server, and nothing is captured twice since nothing was returned; a server that dies mid-stream ends that
stream with an error. A failing server is asked again every :data:`PROBE_EVERY_S` seconds and, once it answers, is
given every version it should hold before it gets requests again; a server that restarted unnoticed is found the same
way (its model list lacks our adapters). With every server down, requests get a retryable error (503 with
Retry-After at the proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backend import BackendError, ChatTokenizer
from openclaw_cli.backends.local.grammar import grammar_error, grammar_for
from openclaw_cli.backends.local.lora_delta import LoraWeights
from openclaw_cli.backends.local.lora_lines import LoraLines, ServedLora, ServesLoraLines, StreamedReply
from openclaw_cli.backends.local.remote_checks import Scorer, check_server, grammar_refusal, guidance_grammar
from openclaw_cli.types import OutputConstraint, SamplingParams, StreamEvent

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings

log = logging.getLogger("openclaw.vllm_servers")

PROBE_EVERY_S = 5.0  # how often a failing server is asked again, and a healthy one checked for a restart
CONNECT_TIMEOUT_S = 10.0


@dataclass
class Replica:
    url: str
    healthy: bool = False
    in_flight: int = 0
    loaded: set[str] = field(default_factory=set)  # our adapter names this server holds
    last_error: str | None = None

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "healthy": self.healthy, "in_flight": self.in_flight, "last_error": self.last_error}


class _NoTokenYet(Exception):
    """The request failed before the server sent a token: safe to send it to another server."""


class RemoteVLLMSampler(ServesLoraLines):
    """Token-id sampling and streaming from vLLM servers, LoRA versions loaded onto each (see the module docstring).
    Same interface as :class:`~openclaw_cli.backends.local.vllm_sampler.VLLMSampler`."""

    def __init__(
        self,
        model_path: Path,
        tokenizer: ChatTokenizer,
        settings: Settings,
        *,
        adapter_dir: Path,
        scorer: Scorer | None = None,
        probe_weights: LoraWeights | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        """``scorer`` (the trainer's torch copy of the base model) and ``probe_weights`` (an adapter of the
        trainer's shape) let :meth:`start` check the servers' log-probabilities and LoRA limits (remote_checks)."""
        local = settings.local
        if not local.vllm_servers:
            raise BackendError("local.sampler = 'remote' needs local.vllm_servers (the base URLs of your vLLM servers)")
        self.model_path = Path(model_path)
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.probe_weights = probe_weights
        self.replicas = [Replica(url.rstrip("/")) for url in local.vllm_servers]
        key = local.vllm_api_key.get_secret_value() if local.vllm_api_key is not None else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = client or httpx.AsyncClient(
            headers=headers, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        )
        self.served_model = ""  # the servers' base model name (what a request without an adapter names)
        self.resolver = local.vllm_publish == "resolver"
        self.versions = LoraLines(
            keep=local.keep_versions,
            adapter_dir=adapter_dir,
            model_path=self.model_path,
            load=self._load_everywhere,
            unload=self._unload_everywhere,
        )
        self._watch: asyncio.Task[None] | None = None
        # Why the servers cannot decode under our grammars (remote_checks.grammar_refusal); None when they can.
        self.grammar_refusal: str | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Check every server (one clear error naming the fix, per :mod:`remote_checks`), then serve from those."""
        self.versions.adapter_dir.mkdir(parents=True, exist_ok=True)
        for replica in self.replicas:
            found, root = await check_server(
                self._client,
                replica.url,
                self.tokenizer,
                adapter_dir=self.versions.adapter_dir,
                model_path=self.model_path,
                probe_weights=self.probe_weights,
                scorer=self.scorer,
                resolver=self.resolver,
            )
            if self.resolver:
                self.versions.base_model_name = root  # the resolver loads an adapter naming the server's --model
            if self.served_model and found != self.served_model:
                raise BackendError(
                    f"the vLLM servers serve different models ({self.served_model!r} and {found!r} at {replica.url}); "
                    "every server in local.vllm_servers must serve the same one"
                )
            self.served_model = found
            replica.healthy = True
        refusals = await asyncio.gather(
            *(grammar_refusal(self._client, r.url, self.served_model, self.tokenizer) for r in self.replicas)
        )
        self.grammar_refusal = next((r for r in refusals if r is not None), None)
        if self.grammar_refusal is not None:
            log.warning(
                "constrained replies (JSON Schema, forced tool calls) will be checked and resampled, not decoded "
                "under a grammar: %s",
                self.grammar_refusal,
            )
        self._watch = asyncio.create_task(self._watch_replicas(), name="openclaw-vllm-servers")

    async def close(self) -> None:
        """Unload our versions from the servers (they stay up) and delete their directories, then stop."""
        await self.versions.unload_all()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        await self._client.aclose()

    def status(self) -> list[dict[str, Any]]:
        return [replica.status() for replica in self.replicas]

    # --- versions: ServesLoraLines; loading onto the servers ------------------------------------------------

    async def _load_everywhere(self, path: Path, name: str, what: str) -> str:
        if self.resolver:
            await self._resolves(name, what)
            return name
        healthy = [r for r in self.replicas if r.healthy]
        if not healthy:
            raise BackendError(f"no vLLM server is up to load {what} onto", retryable=True)
        results = await asyncio.gather(*(self._load_on(r, path, name) for r in healthy), return_exceptions=True)
        failures = [(r, e) for r, e in zip(healthy, results, strict=True) if isinstance(e, BaseException)]
        refused = [e for _, e in failures if isinstance(e, BackendError) and not e.retryable]
        if refused:  # the server said no (rank, a bad file): the same on every server, and a fix to name
            raise BackendError(f"vLLM refused {what}: {refused[0]}")
        for replica, exc in failures:  # unreachable: it gets this version with the rest when it is back
            self._down(replica, f"could not load {name}: {exc}")
        if len(failures) == len(healthy):
            raise BackendError(f"no vLLM server took {what}", retryable=True)
        return name

    async def _load_on(self, replica: Replica, path: Path, name: str) -> None:
        try:
            response = await self._client.post(
                f"{replica.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}
            )
        except httpx.HTTPError as exc:
            raise BackendError(f"{replica.url} unreachable: {exc}", retryable=True) from exc
        # Any answer but success is the server refusing this adapter (vLLM answers a failed load with a 500 naming
        # why): the same everywhere, so it fails the publish. Only a server that does not answer is left for later.
        if response.status_code != 200 and "already been loaded" not in response.text:
            raise BackendError(f"{replica.url}: {_error_text(response)}")
        replica.loaded.add(name)

    async def _resolves(self, name: str, what: str) -> None:
        """Name the new adapter in a one-token request: the replica that answers loads it from the resolver's
        directory now, and one that cannot find it fails the publish instead of a user's request."""
        body = {"model": name, "prompt": [self.tokenizer.eos_token_ids[0]], "max_tokens": 1, "temperature": 0.0}
        replica = self._pick(self.served_model, set())
        try:
            response = await self._client.post(f"{replica.url}/v1/completions", json=body)
        except httpx.HTTPError as exc:
            raise BackendError(f"no vLLM server answered while loading {what}: {exc}", retryable=True) from exc
        if response.status_code != 200:
            raise BackendError(
                f"{replica.url} could not load {what} from its resolver directory ({_error_text(response)}); the "
                "servers need VLLM_PLUGINS=lora_filesystem_resolver and VLLM_LORA_RESOLVER_CACHE_DIR set to "
                "local.vllm_adapter_dir at the same path"
            )

    async def _unload_everywhere(self, name: str) -> None:
        for replica in self.replicas:
            if self.resolver or name in replica.loaded:  # resolved adapters are registered too: unload by name
                replica.loaded.discard(name)
                with contextlib.suppress(httpx.HTTPError):
                    await self._client.post(f"{replica.url}/v1/unload_lora_adapter", json={"lora_name": name})

    # --- replicas -------------------------------------------------------------------------------------------

    def _down(self, replica: Replica, why: str) -> None:
        if replica.healthy:
            log.warning("vLLM server %s is out of the rotation: %s", replica.url, why)
        replica.healthy, replica.last_error = False, why

    async def _watch_replicas(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY_S)
            await asyncio.gather(*(self._check_replica(r) for r in self.replicas))

    async def _check_replica(self, replica: Replica) -> None:
        """A healthy server that lost our adapters restarted; a failing one that answers is brought up to date."""
        try:
            response = await self._client.get(f"{replica.url}/v1/models", timeout=CONNECT_TIMEOUT_S)
            response.raise_for_status()
            held = {card.get("id") for card in response.json().get("data", [])}
        except (httpx.HTTPError, ValueError) as exc:
            self._down(replica, f"not answering: {exc}")
            return
        wanted = [s for s in self.versions.loaded() if s.handle is not None]
        # With the resolver a server loads our adapters by name when asked: nothing to hand over.
        missing = [] if self.resolver else [s for s in wanted if s.handle not in held]
        if replica.healthy and not missing:
            return
        replica.loaded &= held
        try:
            for served in missing:
                assert served.path is not None
                await self._load_on(replica, served.path, served.handle)
        except BackendError as exc:
            self._down(replica, f"could not be given our adapters: {exc}")
            return
        if not replica.healthy:
            log.info("vLLM server %s is back, with %d adapters loaded", replica.url, len(wanted))
        replica.healthy, replica.last_error = True, None

    def _pick(self, model: str, tried: set[str]) -> Replica:
        candidates = [
            r
            for r in self.replicas
            if r.healthy and r.url not in tried and (self.resolver or model == self.served_model or model in r.loaded)
        ]
        if not candidates:
            down = "; ".join(f"{r.url}: {r.last_error or 'tried'}" for r in self.replicas)
            raise BackendError(f"no vLLM server can take the request ({down})", retryable=True)
        return min(candidates, key=lambda r: r.in_flight)

    # --- sampling -------------------------------------------------------------------------------------------

    async def stream(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> AsyncIterator[StreamEvent]:
        """Yield a :class:`TokenChunk` per sampled token, then one :class:`SampleResult`, from ``adapter``'s
        ``version`` (its current one when None) on the least busy healthy server."""
        room = self.room(prompt_tokens)
        served = self.versions.acquire(version, adapter)
        try:
            body = self._body(served, prompt_tokens, params, min(params.max_tokens, room))
            tried: set[str] = set()
            while True:
                replica = self._pick(body["model"], tried)
                tried.add(replica.url)
                try:
                    async for event in self._stream_from(replica, body, served, len(prompt_tokens)):
                        yield event
                    return
                except _NoTokenYet as exc:
                    self._down(replica, str(exc))
        finally:
            await self.versions.release(served)

    def _body(self, served: ServedLora, prompt: list[int], params: SamplingParams, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": served.handle or self.served_model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop) or None,
            "stop_token_ids": self.stop_token_ids(params),
            "seed": params.seed,
            "logprobs": 0,  # the sampled token's log-probability (raw: see the module docstring)
            "return_token_ids": True,
            "skip_special_tokens": True,
            "stream": True,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.constraint is not None:
            body["structured_outputs"] = {"grammar": guidance_grammar(self.tokenizer, params.constraint)}
        return body

    async def _stream_from(
        self, replica: Replica, body: dict[str, Any], served: ServedLora, prompt_length: int
    ) -> AsyncIterator[StreamEvent]:
        reply = StreamedReply(served.info.version, prompt_length)
        replica.in_flight += 1
        try:
            async with self._client.stream("POST", f"{replica.url}/v1/completions", json=body) as response:
                await _raise_for_status(response, body["model"])
                async for event in _events(response):
                    choice = (event.get("choices") or [{}])[0]
                    new_ids = [int(t) for t in choice.get("token_ids") or []]
                    new_logprobs = [float(v) for v in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
                    for chunk in reply.add(new_ids, new_logprobs, choice.get("text", "")):
                        yield chunk
                    if choice.get("finish_reason"):
                        reply.finish, reply.stop_reason = choice["finish_reason"], choice.get("stop_reason")
            if reply.finish is None:  # the stream ended without its last chunk: the server went away
                raise httpx.RemoteProtocolError("the stream ended without a finish reason")
        except httpx.HTTPError as exc:
            if not reply.tokens:
                raise _NoTokenYet(f"failed before the first token: {exc}") from exc
            raise BackendError(f"the vLLM server {replica.url} stopped mid-reply: {exc}") from exc
        finally:
            replica.in_flight -= 1
        yield reply.result()

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        """None when the servers' structured outputs can enforce ``constraint`` (the Lark grammar the other samplers
        use, on vLLM's guidance backend: probed at start, see remote_checks.grammar_refusal), else why not."""
        return self.grammar_refusal or grammar_error(grammar_for(self.tokenizer, constraint))


async def _raise_for_status(response: httpx.Response, model: str) -> None:
    if response.status_code == 200:
        return
    await response.aread()
    message = _error_text(response)
    if response.status_code >= 500 or (response.status_code == 404 and model in message):
        # A 5xx, or a server that does not know our adapter (it restarted): another server may take it.
        raise _NoTokenYet(f"HTTP {response.status_code}: {message}")
    raise BackendError(f"the vLLM server refused the request: {message}", status_code=400)


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise BackendError(f"the vLLM server failed mid-reply: {chunk['error']}")
        yield chunk


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message", error))[:300]
    return str(body.get("detail", body) if isinstance(body, dict) else body)[:300]
