"""The transformers sampler of the local backend: our own token-by-token decode loop with a KV cache.

Why not ``generate``: we need, per token, the policy's raw log-probability (what the trainer computes for the
same version, so importance ratios are ~1 on-policy) and the log-probability under the distribution actually
sampled from, plus real streaming, stop strings held back from the stream, prompt pinning to one policy version,
and prompt cancellation. A small loop does all of that plainly.

Each request runs in a worker thread (a pool sized ``max_concurrent``) with its version activated on that thread
(see :mod:`backends.local.serving`); :meth:`TransformersSampler.stream` hands tokens to asyncio as they are made.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from backends.local.serving import PolicyVersions, ServedVersion
from openclaw_cli.backend import BackendError
from openclaw_cli.types import FinishReason, SampleResult, SamplingParams, StreamEvent, TokenChunk

REPLACEMENT_CHAR = "\ufffd"  # what a decoder yields for an incomplete UTF-8 sequence


class SamplingCancelled(Exception):
    """The consumer went away; the worker loop stops at the next token."""


# ---------------------------------------------------------------------------------------------------------------
# Choosing one token


def filter_top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` highest scores (ties at the threshold are all kept); ``top_k <= 0`` keeps all."""
    if top_k <= 0 or top_k >= scores.shape[-1]:
        return scores
    threshold = torch.topk(scores, top_k).values[-1]
    return scores.masked_fill(scores < threshold, float("-inf"))


def filter_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability mass reaches ``top_p`` (nucleus)."""
    if top_p >= 1.0:
        return scores
    sorted_scores, order = torch.sort(scores, descending=True)
    probs = torch.softmax(sorted_scores, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    # A token is dropped when the tokens ranked above it already hold top_p; the most likely one always stays.
    drop = mass_before >= top_p
    drop[0] = False
    return scores.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))


@dataclass(frozen=True)
class TokenChoice:
    token: int
    logprob: float  # raw policy: log_softmax of the logits (temperature 1, unfiltered)
    sampling_logprob: float  # under the processed distribution the token was drawn from
    top: tuple[tuple[int, float], ...] = ()  # the params.top_logprobs most likely tokens of the raw distribution


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> TokenChoice:
    """Draw one token from 1-D ``logits``: temperature, then top-k, then top-p (the order vLLM and HF use).

    Temperature 0 is greedy; its sampling distribution is a point mass, so ``sampling_logprob`` is 0.
    """
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if params.top_logprobs:
        values, ids = torch.topk(raw, params.top_logprobs)
        top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    if params.temperature == 0:
        token = int(torch.argmax(logits))
        return TokenChoice(token, float(raw[token]), 0.0, top)
    scores = logits / params.temperature
    scores = filter_top_p(filter_top_k(scores, params.top_k), params.top_p)
    processed = torch.log_softmax(scores, dim=-1)
    token = int(torch.multinomial(processed.exp(), 1, generator=generator))
    return TokenChoice(token, float(raw[token]), float(processed[token]), top)


# ---------------------------------------------------------------------------------------------------------------
# Tokens -> text


class IncrementalText:
    """Turns a growing token list into text deltas for streaming.

    Never splits a UTF-8 character (a delta is released only when the decoded window does not end in U+FFFD), and
    holds back any tail that could still grow into one of ``stops``. When a stop string appears, the text is cut
    before it and :attr:`stop_sequence` is set. The deltas concatenate to :attr:`text` exactly.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = tuple(s for s in stops if s)
        self._tokens: list[int] = []
        # Decode a short window [window_start:] rather than everything (O(n) per token instead of O(n^2)); the
        # window keeps one already-decoded stretch in front so tokenizers that treat a leading space specially
        # decode the new token as they would in context.
        self._window_start = 0
        self._read_start = 0
        self._decoded = ""  # complete characters decoded so far (cut at a stop string once found)
        self._released = 0  # how much of _decoded has been handed out
        self.stop_sequence: str | None = None

    @property
    def text(self) -> str:
        return self._decoded[: self._released]

    def push(self, token: int) -> str:
        """Add one generated token; returns the text that can now be released (often empty)."""
        if self.stop_sequence is not None:
            raise RuntimeError("a stop sequence was already found; nothing more can be added")
        self._tokens.append(token)
        prefix = self._decode(self._tokens[self._window_start : self._read_start])
        full = self._decode(self._tokens[self._window_start :])
        if len(full) <= len(prefix) or full.endswith(REPLACEMENT_CHAR):
            return ""
        self._decoded += full[len(prefix) :]
        self._window_start, self._read_start = self._read_start, len(self._tokens)
        return self._release(final=False)

    def finish(self) -> str:
        """Generation is over: release what is held (an unfinished UTF-8 tail decodes as U+FFFD)."""
        if self.stop_sequence is None and self._read_start < len(self._tokens):
            prefix = self._decode(self._tokens[self._window_start : self._read_start])
            full = self._decode(self._tokens[self._window_start :])
            self._decoded += full[len(prefix) :]
            self._window_start = self._read_start = len(self._tokens)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        start = self._released
        if self.stop_sequence is None and self._stops:
            found = [(at, stop) for stop in self._stops if (at := self._decoded.find(stop, start)) != -1]
            if found:
                at, stop = min(found)
                self.stop_sequence = stop
                self._decoded = self._decoded[:at]
        end = len(self._decoded)
        if self.stop_sequence is None and not final:
            end -= self._held_back_length(self._decoded[start:])
        self._released = end
        return self._decoded[start:end]

    def _held_back_length(self, pending: str) -> int:
        """Length of the longest tail of ``pending`` that is a proper prefix of a stop string."""
        longest = min(len(pending), max((len(s) - 1 for s in self._stops), default=0))
        for size in range(longest, 0, -1):
            tail = pending[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0


# ---------------------------------------------------------------------------------------------------------------
# Teacher-forced scoring


def teacher_forced_logprobs(model: nn.Module, tokens: Sequence[int], device: torch.device) -> list[float]:
    """log p(tokens[i] | tokens[:i]) for i >= 1, from one forward pass (call under the version to score)."""
    with torch.inference_mode():
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
        logits = model(input_ids=input_ids, use_cache=False).logits[0, :-1].float()
        targets = input_ids[0, 1:].unsqueeze(-1)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1).tolist()


def next_token_logprobs(
    model: nn.Module, prompt: Sequence[int], candidates: Sequence[int], device: torch.device
) -> list[float]:
    """log p(c | prompt) for each candidate token c, from one forward pass (call under the version to score)."""
    with torch.inference_mode():
        input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
        logits = model(input_ids=input_ids, use_cache=False).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1)[list(candidates)].tolist()


# ---------------------------------------------------------------------------------------------------------------
# The sampler


@dataclass
class _Failure:
    error: BaseException


def _cache_argument_name(model: nn.Module) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name is deprecated); accept both eras.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class TransformersSampler:
    """Samples from the policy versions of one served model, on CPU or GPU, a thread per running request."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        versions: PolicyVersions,
        *,
        max_concurrent: int,
        context_length: int,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._versions = versions
        self.context_length = context_length
        self._device = next(model.parameters()).device
        self._vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self._cache_arg = _cache_argument_name(model)
        self._eos_ids = frozenset(int(t) for t in tokenizer.eos_token_ids)
        self._executor = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="openclaw-sampler")
        # Teacher scoring (OPD, training-side) gets its own thread so it never takes a serving slot.
        self._scoring_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openclaw-scoring")
        self._running = 0
        self._running_lock = threading.Lock()

    @property
    def running_requests(self) -> int:
        """Decode loops executing right now (for dashboards and tests)."""
        return self._running

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        async with aclosing(self._events(prompt_tokens, params, version, with_chunks=False)) as events:
            async for event in events:
                if isinstance(event, SampleResult):
                    return event
        raise BackendError("sampler ended without a result")  # unreachable unless the worker misbehaves

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self._events(prompt_tokens, params, version, with_chunks=True)

    async def compute_logprobs(self, tokens: list[int], *, version: int | None = None) -> list[float | None]:
        """log p(tokens[i] | tokens[:i]) under a version (the current one by default); index 0 is None."""
        served = self._versions.acquire(version)
        self._check_tokens(tokens, "tokens")
        if len(tokens) > self.context_length:
            raise BackendError(
                f"{len(tokens)} tokens exceed the model's context length of {self.context_length}", status_code=400
            )
        if len(tokens) < 2:
            return [None] * len(tokens)

        def score() -> list[float]:
            with self._versions.activate(served):
                return teacher_forced_logprobs(self._model, tokens, self._device)

        try:
            future = self._scoring_executor.submit(score)
        except RuntimeError as exc:
            raise BackendError("the local sampler is closed", retryable=True) from exc
        values = await asyncio.wrap_future(future)
        return [None, *values]

    async def next_token_logprobs(
        self, prompt: list[int], candidates: list[int], *, version: int | None = None
    ) -> list[float]:
        """log p(c | prompt) for each candidate token under a version (the current one by default)."""
        served = self._versions.acquire(version)
        self._check_tokens(prompt, "prompt")
        self._check_tokens(candidates, "candidates")
        if not prompt or len(prompt) >= self.context_length:
            raise BackendError(
                f"a prompt of {len(prompt)} tokens leaves no room for one more in a {self.context_length} context",
                status_code=400,
            )

        def score() -> list[float]:
            with self._versions.activate(served):
                return next_token_logprobs(self._model, prompt, candidates, self._device)

        try:
            future = self._scoring_executor.submit(score)
        except RuntimeError as exc:
            raise BackendError("the local sampler is closed", retryable=True) from exc
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Stop accepting work; running loops see their consumers go away and stop at the next token."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._scoring_executor.shutdown(wait=False, cancel_futures=True)

    # -- internals -------------------------------------------------------------------------------------------

    async def _events(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None, *, with_chunks: bool
    ) -> AsyncIterator[StreamEvent]:
        accepted_at = time.time()
        prompt = [int(t) for t in prompt_tokens]
        self._check_request(prompt, params)
        served = self._versions.acquire(version)  # pinned for the whole request, whatever publish does meanwhile
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamEvent | _Failure] = asyncio.Queue()
        cancelled = threading.Event()

        def deliver(item: StreamEvent | _Failure) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone: nobody is listening any more
                cancelled.set()

        def work() -> None:
            try:
                emit = deliver if with_chunks else None
                deliver(self._generate(prompt, params, served, emit, cancelled, accepted_at))
            except SamplingCancelled:
                pass
            except BackendError as exc:
                deliver(_Failure(exc))
            except Exception as exc:
                failure = BackendError(f"sampling failed: {type(exc).__name__}: {exc}", retryable=False)
                failure.__cause__ = exc
                deliver(_Failure(failure))

        try:
            future = self._executor.submit(work)
        except RuntimeError as exc:  # executor shut down
            raise BackendError("the local sampler is closed", retryable=True) from exc

        def never_ran(done: Future[None]) -> None:
            # close() cancels requests still waiting for a worker; their consumers must not wait forever.
            if done.cancelled():
                deliver(_Failure(BackendError("the local sampler was closed before this request ran", retryable=True)))

        future.add_done_callback(never_ran)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Failure):
                    raise item.error
                yield item
                if isinstance(item, SampleResult):
                    return
        finally:
            cancelled.set()  # consumer closed or cancelled: the worker stops at its next token

    def _check_tokens(self, tokens: Sequence[int], what: str) -> None:
        bad = [t for t in tokens if not 0 <= t < self._vocab_size]
        if bad:
            raise BackendError(
                f"{what} hold ids outside the vocabulary (size {self._vocab_size}): {bad[:5]}", status_code=400
            )

    def _check_request(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise BackendError("the prompt is empty; at least one token is needed", status_code=400)
        self._check_tokens(prompt, "prompt tokens")
        if len(prompt) + params.max_tokens > self.context_length:
            raise BackendError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's context "
                f"length of {self.context_length} tokens; shorten the conversation or lower max_tokens",
                status_code=400,
            )

    def _generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        served: ServedVersion,
        emit: Callable[[StreamEvent], None] | None,
        cancelled: threading.Event,
        accepted_at: float,
    ) -> SampleResult:
        with self._running_lock:
            self._running += 1
        try:
            with self._versions.activate(served), torch.inference_mode():
                return self._decode_loop(prompt, params, served.number, emit, cancelled, accepted_at)
        finally:
            with self._running_lock:
                self._running -= 1

    def _decode_loop(
        self,
        prompt: list[int],
        params: SamplingParams,
        version: int,
        emit: Callable[[StreamEvent], None] | None,
        cancelled: threading.Event,
        accepted_at: float,
    ) -> SampleResult:
        from transformers import DynamicCache

        generator = torch.Generator(device=self._device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        stop_ids = self._eos_ids | frozenset(params.stop_token_ids)
        text = IncrementalText(self._tokenizer.decode, params.stop)
        cache = DynamicCache(config=getattr(self._model, "config", None))
        next_input = torch.tensor([prompt], dtype=torch.long, device=self._device)
        tokens: list[int] = []
        logprobs: list[float] = []
        sampling_logprobs: list[float] = []
        top_logprobs: list[list[tuple[int, float]]] = []
        first_token_at = 0.0
        finish_reason: FinishReason = "length"
        while len(tokens) < params.max_tokens:
            if cancelled.is_set():
                raise SamplingCancelled
            out = self._model(input_ids=next_input, use_cache=True, logits_to_keep=1, **{self._cache_arg: cache})
            choice = choose_token(out.logits[0, -1], params, generator)
            if not tokens:
                first_token_at = time.time()
            tokens.append(choice.token)
            logprobs.append(choice.logprob)
            sampling_logprobs.append(choice.sampling_logprob)
            if params.top_logprobs:
                top_logprobs.append(list(choice.top))
            if choice.token in stop_ids:
                finish_reason = "stop"
                piece = text.finish()
            else:
                piece = text.push(choice.token)
                if text.stop_sequence is not None:
                    finish_reason = "stop"
                elif len(tokens) == params.max_tokens:
                    piece += text.finish()
            if emit is not None:
                emit(TokenChunk(choice.token, choice.logprob, piece, version, list(choice.top)))
            if finish_reason == "stop":
                break
            next_input = torch.tensor([[choice.token]], dtype=torch.long, device=self._device)
        return SampleResult(
            tokens=tokens,
            logprobs=logprobs,
            finish_reason=finish_reason,
            version=version,
            text=text.text,
            stop_sequence=text.stop_sequence,
            sampling_logprobs=sampling_logprobs,
            top_logprobs=top_logprobs,
            prompt_tokens=len(prompt),
            started_at=accepted_at,
            first_token_at=first_token_at,
            finished_at=time.time(),
        )
