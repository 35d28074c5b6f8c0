"""Serving from a Fireworks deployment: token-id prompts in, exact token ids and log-probabilities out.

The proxy renders the chat with the model's own tokenizer (:class:`~openclaw_cli.tokenizer.HFChatTokenizer`) and
hands us prompt token ids; they go to the **completions** endpoint as an integer-array prompt, so Fireworks never
re-renders or re-tokenizes the conversation. Every request asks for ``logprobs`` and ``return_token_ids`` (plus
``raw_output`` when not streaming), so a capture keeps the exact completion ids and their log-probabilities.
``context_length_exceeded_behavior`` is ``error``: the proxy budgets the reply itself, and a silent truncation would
change what was sampled.

Streaming is real: the streaming completions API sends token ids and log-probabilities with every chunk. A chunk's
text is attached to its last token; each token is handed on when the next one arrives (text that comes without a
token, such as a final flush, still reaches the client).

Log-probabilities: Fireworks' ``logprob`` is taken as the policy's raw log-probability (what training needs) and
``sampling_logprob``, when sent, as the one under the processed sampling distribution.

**Model names.** Version 0 is the base model served by the deployment, ``<base_model>#accounts/<a>/deployments/<d>``.
A published LoRA on a multi-LoRA deployment is ``accounts/<a>/models/<lora>#accounts/<a>/deployments/<d>``; on a
hot-reload deployment the name stays the base one and the merged addon changes underneath (so only the current
version can be served there).

**Scaled to zero.** A deployment with no replica answers 503 ``DEPLOYMENT_SCALING_UP`` while it starts one. Such a
request is retried with exponential backoff for up to ``fireworks.scale_up_timeout_s`` (``status`` says so); if the
deployment is still scaling after that, the request fails with a retryable :class:`BackendError` (the proxy sends
503 + Retry-After), never a crash.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from openclaw_cli.backend import BASE_VERSION, BackendError, ChatTokenizer, none_before
from openclaw_cli.backends.fireworks.control import api_error, error_detail, status_of
from openclaw_cli.structured_output import plain_json_schema
from openclaw_cli.types import FinishReason, PolicyVersion, SampleResult, SamplingParams, StreamEvent, TokenChunk

if TYPE_CHECKING:
    from fireworks import AsyncFireworks

log = logging.getLogger("openclaw.fireworks")

SCALING_UP_CODE = "DEPLOYMENT_SCALING_UP"


def deployment_model_name(model: str, deployment: str) -> str:
    """The name that routes a request for ``model`` to ``deployment`` (both full resource names)."""
    return f"{model}#{deployment}"


# ---------------------------------------------------------------------------------------------------------------
# Versions


@dataclass(frozen=True)
class ServedModel:
    """One servable policy version: the model name requests use, and the LoRA behind it (None for the base)."""

    info: PolicyVersion
    request_model: str
    lora_model: str | None = None
    deployed_model: str | None = None  # accounts/<a>/deployedModels/<id>, to unload it later

    @property
    def number(self) -> int:
        return self.info.version


class ServedVersions:
    """Which model name serves which policy version.

    ``exclusive`` (hot-reload deployments): a publish replaces the weights behind the one name, so every earlier
    version, the base included, stops being servable, and nothing can be staged. Otherwise the base stays servable
    and the newest ``keep`` published LoRAs too, never dropping the current one (which after a rollback, or while a
    newer version is only staged, need not be the newest); ``publish`` returns the ones that fell out, for the
    caller to unload.
    """

    def __init__(self, base: ServedModel, *, keep: int, exclusive: bool) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._base = base
        self._keep = keep
        self._exclusive = exclusive
        self._lock = threading.Lock()
        self._published: OrderedDict[int, ServedModel] = OrderedDict()
        self._current = base
        self._latest = base.number

    def current(self) -> ServedModel:
        return self._current

    def base(self) -> ServedModel:
        """The base model (version 0)."""
        return self._base

    def servable(self) -> list[int]:
        with self._lock:
            if self._exclusive and self._published:
                return [self._current.number]
            return [BASE_VERSION, *self._published]

    def published(self) -> list[ServedModel]:
        with self._lock:
            return list(self._published.values())

    def resolve(self, version: int | None) -> ServedModel:
        with self._lock:
            if version is None or version == self._current.number:
                return self._current
            served = self._published.get(version)
            if version == BASE_VERSION and not (self._exclusive and self._published):
                served = self._base
            if served is None or (self._exclusive and served is not self._current):
                known = ", ".join(str(v) for v in self._servable_locked())
                raise BackendError(
                    f"policy version {version} is not servable; servable versions: {known}", status_code=400
                )
            return served

    def publish(
        self,
        request_model: str,
        *,
        lora_model: str | None,
        deployed_model: str | None,
        name: str | None = None,
        version: int | None = None,
        make_current: bool = True,
    ) -> tuple[PolicyVersion, list[ServedModel]]:
        """Serve ``request_model`` as the next version (or ``version`` when above every number used so far);
        returns its identity and the versions that stopped being servable. ``make_current=False`` stages it:
        servable when pinned, the current version keeps serving (not possible when ``exclusive``)."""
        if self._exclusive and not make_current:
            raise BackendError(
                "a hot-reload deployment serves a new LoRA as soon as it is loaded, so it cannot be staged; "
                "use fireworks.addon_mode = 'multi_lora'",
                status_code=409,
            )
        with self._lock:
            number = version if version is not None and version > self._latest else self._latest + 1
            info = PolicyVersion(number, name or f"v{number}", time.time())
            served = ServedModel(info, request_model, lora_model, deployed_model)
            dropped: list[ServedModel] = []
            if self._exclusive:
                dropped = list(self._published.values())
                self._published.clear()
            self._published[number] = served
            if make_current:
                self._current = served
            self._latest = number
            return info, dropped + self._evict_locked()

    def make_current(self, version: int) -> ServedModel:
        """Serve an already servable version from now on (rollback, or promoting a staged version); requests
        already running keep the model they resolved."""
        served = self.resolve(version)
        with self._lock:
            self._current = served
        return served

    def _evict_locked(self) -> list[ServedModel]:
        dropped: list[ServedModel] = []
        while len(self._published) > self._keep:
            oldest = next(n for n, v in self._published.items() if v is not self._current)
            dropped.append(self._published.pop(oldest))
        return dropped

    def _servable_locked(self) -> list[int]:
        if self._exclusive and self._published:
            return [self._current.number]
        return [BASE_VERSION, *self._published]


# ---------------------------------------------------------------------------------------------------------------
# Requests and responses


def completion_request(model: str, prompt: Sequence[int], params: SamplingParams, *, stream: bool) -> dict[str, Any]:
    """The completions request for one sample (keyword arguments of ``completions.create``)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt],
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "logprobs": True,
        "return_token_ids": True,
        "context_length_exceeded_behavior": "error",
    }
    if not stream:
        body["raw_output"] = True  # a second source of the exact ids; too heavy to repeat in every chunk
    if params.top_p < 1.0:
        body["top_p"] = params.top_p
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        body["seed"] = params.seed
    if stream:
        body["stream"] = True
    if params.constraint is not None:  # only a plain JSON answer gets here (FireworksBatchBackend.accepts_constraint)
        schema = plain_json_schema(params.constraint)
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    return body


def plain(value: Any) -> Any:
    """SDK models -> plain dicts/lists (parsing the dicts is indifferent to which union variant the SDK chose)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="python")
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def logprob_entries(logprobs: Any) -> list[dict[str, Any]]:
    """Per-token entries ``{token_id?, logprob, sampling_logprob?}`` from either log-probability format."""
    data = plain(logprobs)
    if not isinstance(data, dict):
        return []
    content = data.get("content")
    if isinstance(content, list):
        return [entry for entry in content if isinstance(entry, dict)]
    values = data.get("token_logprobs")  # legacy format: parallel lists
    if isinstance(values, list):
        ids = data.get("token_ids") or [None] * len(values)
        return [{"token_id": tid, "logprob": lp} for tid, lp in zip(ids, values, strict=False)]
    return []


class _Completion:
    """Accumulates one completion from a response or a stream of chunks, enforcing ``stop_token_ids`` (the API has
    no such parameter: generation is cut after the first such token, which is kept, as a stop token is)."""

    def __init__(self, stop_token_ids: Sequence[int]) -> None:
        self.stop_ids = frozenset(stop_token_ids)
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.sampling_logprobs: list[float | None] = []
        self.text = ""
        self.finish_reason: str | None = None
        self.cut = False

    def add(self, choice: dict[str, Any]) -> list[tuple[int, float]]:
        """Take one choice (whole response or chunk); returns the new (token, logprob) pairs."""
        if self.cut:
            return []
        ids = choice.get("token_ids")
        if ids is None and isinstance(choice.get("raw_output"), dict):
            ids = choice["raw_output"].get("completion_token_ids")
        entries = logprob_entries(choice.get("logprobs"))
        if ids is None:
            ids = [e.get("token_id") for e in entries]
        if any(t is None for t in ids):
            raise BackendError("Fireworks returned no token ids for the completion (return_token_ids unsupported?)")
        if len(entries) != len(ids):
            raise BackendError(
                f"Fireworks returned {len(ids)} completion tokens but {len(entries)} log-probabilities; the exact "
                "tokens of this reply cannot be recorded"
            )
        added: list[tuple[int, float]] = []
        for token, entry in zip(ids, entries, strict=True):
            logprob = float(entry["logprob"])
            self.tokens.append(int(token))
            self.logprobs.append(logprob)
            sampling = entry.get("sampling_logprob")
            self.sampling_logprobs.append(float(sampling) if sampling is not None else None)
            added.append((int(token), logprob))
            if int(token) in self.stop_ids:
                self.cut = True
                self.finish_reason = "stop"
                break
        if not self.cut:
            self.text += choice.get("text") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return added

    def result(
        self,
        tokenizer: ChatTokenizer,
        params: SamplingParams,
        version: int,
        prompt_len: int,
        started: float,
        first: float,
    ) -> SampleResult:
        if self.finish_reason == "error":
            raise BackendError("Fireworks ended the completion with an error", retryable=True)
        if self.finish_reason is None:  # a complete reply always says why it ended; a broken stream does not
            raise BackendError("the Fireworks reply ended without a finish reason (connection lost?)", retryable=True)
        finish: FinishReason = "length" if self.finish_reason == "length" else "stop"
        text = tokenizer.decode(self.tokens) if self.cut else self.text
        stop_sequence = None
        if finish == "stop" and params.stop and not self.cut:
            eos = set(getattr(tokenizer, "eos_token_ids", ()))
            if not self.tokens or self.tokens[-1] not in eos:
                full = tokenizer.decode(self.tokens)
                stop_sequence = next((s for s in params.stop if s in full), None)
        sampling = [float(v) for v in self.sampling_logprobs or [] if v is not None]
        complete = bool(self.sampling_logprobs) and len(sampling) == len(self.sampling_logprobs or [])
        return SampleResult(
            tokens=list(self.tokens),
            logprobs=list(self.logprobs),
            finish_reason=finish,
            version=version,
            text=text,
            stop_sequence=stop_sequence,
            sampling_logprobs=sampling if complete else [],
            prompt_tokens=prompt_len,
            started_at=started,
            first_token_at=first or time.time(),
            finished_at=time.time(),
        )


# ---------------------------------------------------------------------------------------------------------------
# The sampler


def is_scaling_up(exc: BaseException) -> bool:
    if status_of(exc) != 503:
        return False
    code, message = error_detail(getattr(exc, "body", None))
    return SCALING_UP_CODE in code or SCALING_UP_CODE in message or "scaling up" in message.lower()


@dataclass(eq=False)  # a service object: equal only to itself, and hashable
class FireworksSampler:
    """Samples, streams and scores token ids against the versions in a :class:`ServedVersions`."""

    _client: AsyncFireworks
    _tokenizer: ChatTokenizer
    versions: ServedVersions
    _: KW_ONLY
    deployment: str
    scale_up_timeout_s: float
    first_backoff_s: float = 1.0
    max_backoff_s: float = 15.0
    scaling_since: float | None = field(default=None, init=False)  # when the current scale-up wait began (wall time)
    scale_up_retries: int = field(default=0, init=False)  # 503 DEPLOYMENT_SCALING_UP answers retried (all requests)

    @property
    def status(self) -> str:
        if self.scaling_since is None:
            return "serving"
        return f"deployment {self.deployment} is scaling up (waiting {time.time() - self.scaling_since:.0f} s)"

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        served = self.versions.resolve(version)
        started = time.time()
        body = completion_request(served.request_model, prompt_tokens, params, stream=False)
        response = await self._create(body)
        data = plain(response)
        choices = data.get("choices") or []
        if not choices:
            raise BackendError("Fireworks returned a completion without choices", retryable=True)
        completion = _Completion(params.stop_token_ids)
        completion.add(choices[0])
        return completion.result(self._tokenizer, params, served.number, len(prompt_tokens), started, 0.0)

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        served = self.versions.resolve(version)  # pinned now: a publish during the stream does not move it
        return self._stream(served, list(prompt_tokens), params)

    async def _stream(
        self, served: ServedModel, prompt_tokens: list[int], params: SamplingParams
    ) -> AsyncIterator[StreamEvent]:
        started = time.time()
        first = 0.0
        stream = await self._create(completion_request(served.request_model, prompt_tokens, params, stream=True))
        completion = _Completion(params.stop_token_ids)
        held: TokenChunk | None = None  # the newest token, released when the next one arrives (see module doc)
        emitted = ""  # text of the chunks already yielded
        pending = ""  # text that arrived before any token
        try:
            async for chunk in self._chunks(stream):
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    before = len(completion.text)
                    added = completion.add(choice)
                    text = completion.text[before:]
                    if not added:
                        if held is not None:
                            held.text += text
                        else:
                            pending += text
                        continue
                    first = first or time.time()
                    for i, (token, logprob) in enumerate(added):
                        if held is not None:
                            emitted += held.text
                            yield held
                        piece = pending + text if i == len(added) - 1 else ""
                        pending = ""
                        held = TokenChunk(token, logprob, piece, served.number)
                if completion.cut:
                    break
            result = completion.result(self._tokenizer, params, served.number, len(prompt_tokens), started, first)
            if held is not None:
                if completion.cut:  # text past a stop token id never belonged to this reply
                    held.text = result.text[len(emitted) :] if result.text.startswith(emitted) else ""
                yield held
            yield result
        finally:
            await stream.close()

    async def _chunks(self, stream: Any) -> AsyncIterator[dict[str, Any]]:
        """The stream's chunks as dicts; an error event or a broken connection is a retryable BackendError."""
        import httpx
        from fireworks import APIError

        try:
            async for chunk in stream:
                data = plain(chunk)
                if isinstance(data, dict) and data.get("error") and not data.get("choices"):
                    code, message = error_detail(data)
                    detail = f"{code}: {message}" if code and message else (message or code)
                    raise BackendError(f"Fireworks stream error: {detail}", retryable=True)
                yield data
        except (httpx.HTTPError, APIError) as exc:
            raise BackendError(f"the Fireworks stream broke: {exc}", retryable=True) from exc

    async def compute_logprobs(
        self, tokens: list[int], *, version: int | None = None, start: int = 1
    ) -> list[float | None]:
        """log p(tokens[i] | tokens[:i]) via an echoed completion (every position is echoed); None before
        ``start`` and at index 0."""
        if len(tokens) < 2:
            return [None] * len(tokens)
        served = self.versions.resolve(version)
        body = {
            "model": served.request_model,
            "prompt": [int(t) for t in tokens],
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": True,
            "logprobs": True,
            "return_token_ids": True,
            "context_length_exceeded_behavior": "error",
        }
        data = plain(await self._create(body))
        choices = data.get("choices") or []
        entries = logprob_entries(choices[0].get("logprobs")) if choices else []
        if len(entries) < len(tokens):
            raise BackendError(
                f"Fireworks echoed {len(entries)} log-probabilities for a {len(tokens)}-token sequence; cannot score it"
            )
        echoed = entries[: len(tokens)]
        if any(e.get("token_id") is not None and int(e["token_id"]) != t for e, t in zip(echoed, tokens, strict=True)):
            raise BackendError("Fireworks echoed different token ids than were sent; cannot score the sequence")
        return none_before([None, *(float(e["logprob"]) for e in echoed[1:])], start)

    async def _create(self, body: dict[str, Any]) -> Any:
        """``completions.create`` with the scale-up retry (see the module docstring)."""
        deadline: float | None = None
        delay = self.first_backoff_s
        waited_here = False
        while True:
            try:
                response = await self._client.completions.create(**body)
            except Exception as exc:
                if not is_scaling_up(exc):
                    raise api_error(exc, f"sampling from {body['model']}") from exc
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self.scale_up_timeout_s
                if self.scaling_since is None:
                    self.scaling_since = time.time()
                    log.warning(
                        "Fireworks deployment %s is scaling up from zero; requests wait up to %.0f s",
                        self.deployment,
                        self.scale_up_timeout_s,
                    )
                if now + delay > deadline:
                    raise BackendError(
                        f"Fireworks deployment {self.deployment} is still scaling up after "
                        f"{self.scale_up_timeout_s:.0f} s; try again shortly",
                        retryable=True,
                        status_code=503,
                    ) from exc
                self.scale_up_retries += 1
                waited_here = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
                continue
            if waited_here and self.scaling_since is not None:
                log.info("Fireworks deployment %s is serving again", self.deployment)
            self.scaling_since = None
            return response


__all__ = [
    "BASE_VERSION",
    "FireworksSampler",
    "ServedModel",
    "ServedVersions",
    "completion_request",
    "deployment_model_name",
    "is_scaling_up",
]
