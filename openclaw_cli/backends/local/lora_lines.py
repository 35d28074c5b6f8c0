"""Policy versions served by name as LoRA adapters: what a vLLM engine (in-process, or a server of the team's own)
needs of the local backend's versions.

Each adapter (:mod:`openclaw_cli.adapters`) has a line of versions numbered on its own; version 0 is the base model
in every line. A published version is written once as a PEFT adapter directory under a name never used before
(``openclaw-<run>-<adapter>-v<N>``: a server keeps adapters by name, and reloading changed weights under an old name
serves stale ones), then handed to ``load``; a version that falls out of an adapter's newest ``keep`` is retired,
and ``unload``-ed and deleted once no request still uses it. From the first publish on the base model is served as
an all-zero adapter too (vLLM's CPU LoRA kernels give a LoRA-less request batched with LoRA ones the last slot's
adapter: upstream PR #48421; with every request a LoRA request the base's output is exact on every platform).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openclaw_cli.adapters import SHARED_ADAPTER, adapter_dirname
from openclaw_cli.backend import BASE_VERSION, BackendError, ChatTokenizer
from openclaw_cli.backends.local.lora_delta import LoraDelta, LoraWeights, write_peft_adapter
from openclaw_cli.types import PolicyVersion, SampleResult, SamplingParams, StreamEvent, TokenChunk

# (adapter directory, never-reused name, what it is for messages) -> what the engine serves it by
Load = Callable[[Path, str, str], Awaitable[Any]]
Unload = Callable[[Any], Awaitable[None]]


@dataclass
class ServedLora:
    info: PolicyVersion
    handle: Any  # what the engine serves this version by (None: the base model, before any publish)
    path: Path | None
    in_flight: int = 0


@dataclass
class _Line:
    current: ServedLora
    published: OrderedDict[int, ServedLora] = field(default_factory=OrderedDict)
    latest: int = BASE_VERSION


def _zero(delta: LoraDelta) -> LoraDelta:
    return LoraDelta(delta.a.new_zeros(delta.a.shape), delta.b.new_zeros(delta.b.shape), delta.scaling)


class LoraLines:
    """Every adapter's servable versions (see the module docstring). ``load`` puts an adapter directory into the
    engine and returns its handle; ``unload`` takes a handle out again (failures there are the engine's LRU having
    done it already, and are ignored)."""

    def __init__(self, *, keep: int, adapter_dir: Path, model_path: Path, load: Load, unload: Unload) -> None:
        self.keep = keep
        self.adapter_dir = Path(adapter_dir)
        # What each adapter's config names as its base (vLLM's filesystem resolver loads an adapter only when this is
        # the server's --model string exactly): the model's path here unless the sampler knows the server's name.
        self.base_model_name = str(model_path)
        self.run = secrets.token_hex(3)  # names stay new across restarts of this process, against a server that stays
        self._load, self._unload = load, unload
        self.base = ServedLora(PolicyVersion(BASE_VERSION, "base"), None, None)
        self._lines: dict[str, _Line] = {}
        self._retired: list[ServedLora] = []
        self._lock = asyncio.Lock()  # version numbers are handed out in publish order

    def _line(self, adapter: str) -> _Line:
        line = self._lines.get(adapter)
        if line is None:
            line = self._lines[adapter] = _Line(current=self.base)
        return line

    def current(self, adapter: str = SHARED_ADAPTER) -> PolicyVersion:
        return self._line(adapter).current.info

    def servable(self, adapter: str = SHARED_ADAPTER) -> list[int]:
        return [BASE_VERSION, *self._line(adapter).published]

    def loaded(self) -> Iterator[ServedLora]:
        """Every version the engine must hold now: the base's adapter, each line's servable versions, and retired
        ones a request still uses (what a server that restarted must be given again)."""
        if self.base.handle is not None:
            yield self.base
        for line in self._lines.values():
            yield from line.published.values()
        yield from (s for s in self._retired if s.in_flight)

    async def publish(
        self,
        weights: LoraWeights,
        name: str | None = None,
        *,
        version: int | None = None,
        make_current: bool = True,
        adapter: str = SHARED_ADAPTER,
    ) -> PolicyVersion:
        """Load ``weights`` as ``adapter``'s next version (``version`` when above every number it used: resuming a
        checkpoint) and, with ``make_current``, serve it from the next request on (else only staged: servable when
        pinned). Loaded before switching, so the first request on it pays nothing."""
        async with self._lock:
            if self.base.handle is None:
                zeros = {key: _zero(delta) for key, delta in weights.items()}
                self.base.handle, self.base.path = await self._write_and_load(
                    zeros, "base", "the base model's zero adapter"
                )
            line = self._line(adapter)
            number = version if version is not None and version > line.latest else line.latest + 1
            info = PolicyVersion(number, name or f"v{number}", time.time())
            what = f"the LoRA adapter for version {number}" + ("" if adapter == SHARED_ADAPTER else f" of {adapter}")
            label = "shared" if adapter == SHARED_ADAPTER else adapter_dirname(adapter)
            handle, path = await self._write_and_load(weights, f"{label}-v{number}", what)
            served = ServedLora(info, handle, path)
            line.published[number] = served
            line.latest = number
            if make_current:
                line.current = served
            while len(line.published) > self.keep:
                # Oldest out first, but never the current version (after a rollback it need not be the newest).
                oldest = next(n for n, s in line.published.items() if s is not line.current)
                self._retired.append(line.published.pop(oldest))
        await self._free_retired()
        return info

    async def _write_and_load(self, weights: LoraWeights, label: str, what: str) -> tuple[Any, Path]:
        name = f"openclaw-{self.run}-{label}"
        path = self.adapter_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(write_peft_adapter, weights, path, self.base_model_name)
        try:
            return await self._load(path, name, what), path
        except Exception:
            shutil.rmtree(path, ignore_errors=True)
            raise

    def make_current(self, version: int, adapter: str = SHARED_ADAPTER) -> PolicyVersion:
        """Serve an already servable version of ``adapter`` from now on (rollback, or promoting a staged one)."""
        served = self.find(version, adapter)
        self._line(adapter).current = served
        return served.info

    def find(self, version: int | None, adapter: str = SHARED_ADAPTER) -> ServedLora:
        """``adapter``'s ``version`` (its current one for None); a 400 naming the servable ones when it is not."""
        line = self._line(adapter)
        if version is None:
            return line.current
        if version == BASE_VERSION:
            return self.base
        if version in line.published:
            return line.published[version]
        known = ", ".join(str(v) for v in self.servable(adapter))
        raise BackendError(f"policy version {version} is not servable; servable versions: {known}", status_code=400)

    def acquire(self, version: int | None, adapter: str = SHARED_ADAPTER) -> ServedLora:
        """:meth:`find`, pinned for a request until :meth:`release`."""
        served = self.find(version, adapter)
        served.in_flight += 1
        return served

    async def release(self, served: ServedLora) -> None:
        served.in_flight -= 1
        if served in self._retired:
            await self._free_retired()

    async def unload_all(self) -> None:
        """At shutdown: take every version out of the engine and delete its directory (a server that stays up keeps
        nothing of ours in memory, and a shared directory nothing on disk)."""
        everything = list(self.loaded())
        self._retired, self._lines = [], {}
        for served in everything:
            await self._drop(served)
        self.base.handle = self.base.path = None

    async def _free_retired(self) -> None:
        """Unload retired versions nobody uses any more and delete their adapter dirs."""
        for served in [s for s in self._retired if s.in_flight == 0]:
            self._retired.remove(served)
            await self._drop(served)

    async def _drop(self, served: ServedLora) -> None:
        if served.handle is not None:
            with contextlib.suppress(Exception):  # the engine's LRU may have done it already
                await self._unload(served.handle)
        if served.path is not None:
            shutil.rmtree(served.path, ignore_errors=True)


class ServesLoraLines:
    """The version and whole-reply half of a sampler whose versions are :class:`LoraLines` (the in-process and the
    remote vLLM samplers): they add ``stream`` (and how to load an adapter)."""

    versions: LoraLines
    tokenizer: ChatTokenizer

    def current_version(self, adapter: str = SHARED_ADAPTER) -> PolicyVersion:
        return self.versions.current(adapter)

    def servable(self, adapter: str = SHARED_ADAPTER) -> list[int]:
        return self.versions.servable(adapter)

    async def publish(
        self,
        weights: LoraWeights,
        name: str | None = None,
        *,
        version: int | None = None,
        make_current: bool = True,
        adapter: str = SHARED_ADAPTER,
    ) -> PolicyVersion:
        """Load ``weights`` as ``adapter``'s next version, then serve it (see :meth:`LoraLines.publish`)."""
        return await self.versions.publish(weights, name, version=version, make_current=make_current, adapter=adapter)

    def make_current(self, version: int, adapter: str = SHARED_ADAPTER) -> PolicyVersion:
        """Serve an already servable version of ``adapter`` from now on (rollback, or promoting a staged one)."""
        return self.versions.make_current(version, adapter)

    def stream(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> AsyncIterator[StreamEvent]:
        raise NotImplementedError

    async def sample(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> SampleResult:
        """The whole reply of :meth:`stream`."""
        result: SampleResult | None = None
        async for event in self.stream(prompt_tokens, params, version, adapter=adapter):
            if isinstance(event, SampleResult):
                result = event
        if result is None:  # a stream always ends with a SampleResult unless the engine broke its contract
            raise BackendError("vLLM returned no completion", retryable=True)
        return result

    def stop_token_ids(self, params: SamplingParams) -> list[int]:
        """The request's stop tokens and the model's end-of-turn tokens (a reply always ends at the latter)."""
        return sorted({*params.stop_token_ids, *self.tokenizer.eos_token_ids})

    def room(self, prompt_tokens: list[int]) -> int:
        """How many tokens a reply to ``prompt_tokens`` may have; a 400 for an empty or too long prompt."""
        if not prompt_tokens:
            raise BackendError("the prompt is empty", status_code=400)
        context = self.tokenizer.context_length
        room = context - len(prompt_tokens)
        if room < 1:
            raise BackendError(
                f"the prompt has {len(prompt_tokens)} tokens; the context holds {context}", status_code=400
            )
        return room


@dataclass
class StreamedReply:
    """One reply as a vLLM engine streams it (a step's new token ids, their log-probabilities and its text at a
    time), and the :class:`SampleResult` it ends as."""

    version: int
    prompt_tokens: int
    started: float = field(default_factory=time.time)
    first_token_at: float = 0.0
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish: str | None = None
    stop_reason: Any = None

    def add(self, ids: list[int], logprobs: list[float], text: str) -> list[TokenChunk]:
        """Take one step's tokens; returns a chunk per token (the step's text goes with its last token: vLLM's delta
        text belongs to the step as a whole)."""
        if len(ids) != len(logprobs):
            raise BackendError(f"vLLM sent {len(ids)} tokens with {len(logprobs)} log-probabilities")
        if ids and not self.first_token_at:
            self.first_token_at = time.time()
        self.tokens += ids
        self.logprobs += logprobs
        self.text.append(text)
        last = len(ids) - 1
        return [
            TokenChunk(token_id=t, logprob=lp, text=text if i == last else "", version=self.version)
            for i, (t, lp) in enumerate(zip(ids, logprobs, strict=True))
        ]

    def result(self) -> SampleResult:
        if self.finish not in ("stop", "length"):
            raise BackendError(f"vLLM ended the request with finish reason {self.finish!r}", retryable=True)
        return SampleResult(
            tokens=self.tokens,
            logprobs=self.logprobs,
            finish_reason="stop" if self.finish == "stop" else "length",
            version=self.version,
            text="".join(self.text),
            stop_sequence=self.stop_reason if isinstance(self.stop_reason, str) else None,
            prompt_tokens=self.prompt_tokens,
            started_at=self.started,
            first_token_at=self.first_token_at or time.time(),
            finished_at=time.time(),
        )
