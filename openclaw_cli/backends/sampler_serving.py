"""The serving half of the backend protocol, answered by a sampler that keeps its own policy versions.

The local backend (transformers or vLLM sampler) and the Fireworks batch backend (a deployment) serve the same way:
``sample`` / ``stream`` go to the sampler with the version pinned by the caller, and ``compute_logprobs`` scores
with the sampler too, the base model being version 0. They inherit :class:`ServesFromSampler` and say which sampler
serves; the training half stays theirs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backend import BASE_VERSION
from openclaw_cli.backend import Serves as ServingSampler
from openclaw_cli.types import OutputConstraint, SampleResult, SamplingParams, StreamEvent


class ScoringSampler(Protocol):
    async def compute_logprobs(
        self, tokens: list[int], *, version: int | None = None, start: int = 1
    ) -> list[float | None]: ...


class ServesAdapters(Protocol):
    """A sampler that serves many adapters' versions (the transformers and vLLM samplers)."""

    async def sample(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> SampleResult: ...

    def stream(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> AsyncIterator[StreamEvent]: ...

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None: ...


class AdapterServing:
    """A multi-adapter sampler's serving for one adapter: what a backend's per-owner view answers requests with.
    Versions are that adapter's own numbers."""

    def __init__(self, sampler: ServesAdapters, adapter: str) -> None:
        self.sampler = sampler
        self.adapter = adapter

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        return await self.sampler.sample(prompt_tokens, params, version, adapter=self.adapter)

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self.sampler.stream(prompt_tokens, params, version, adapter=self.adapter)

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        return self.sampler.accepts_constraint(constraint)


class ServesFromSampler:
    """``sample``, ``stream`` and ``compute_logprobs`` of the backend protocol, delegated to a sampler."""

    def _serving_sampler(self) -> ServingSampler:
        """The sampler that answers requests (raises BackendError before ``start``)."""
        raise NotImplementedError

    def _scoring_sampler(self) -> ScoringSampler:
        """The sampler that scores tokens (raises BackendError before ``start``)."""
        raise NotImplementedError

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        return await self._serving_sampler().sample(prompt_tokens, params, version)

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self._serving_sampler().stream(prompt_tokens, params, version)

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        version = BASE_VERSION if base else None
        return await self._scoring_sampler().compute_logprobs(tokens, version=version, start=start)
