"""The transformers sampler of the local backend: our own token-by-token decode loop with a KV cache.

Why not ``generate``: we need, per token, the policy's raw log-probability (what the trainer computes for the
same version, so importance ratios are ~1 on-policy) and the log-probability under the distribution actually
sampled from, plus real streaming, stop strings held back from the stream, prompt pinning to one policy version,
and prompt cancellation. A small loop does all of that plainly.

One scheduler thread decodes every running request together, a row per request, each row on the version it pinned
(see :class:`TransformersSampler` and :mod:`openclaw_cli.backends.local.serving`); :meth:`TransformersSampler.stream`
hands tokens to asyncio as they are made.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local.cpu_threads import OtherWork, default_decode_threads, per_thread_setter
from openclaw_cli.backends.local.grammar import ConstrainedRow, GrammarMasks
from openclaw_cli.backends.local.serving import PolicyVersions, ServedVersion
from openclaw_cli.backends.sampler_serving import AdapterServing
from openclaw_cli.types import FinishReason, OutputConstraint, SampleResult, SamplingParams, StreamEvent, TokenChunk

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


def choose_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    allowed_logits: torch.Tensor | None = None,
) -> TokenChoice:
    """Draw one token from 1-D ``logits``: temperature, then top-k, then top-p (the order vLLM and HF use).

    Temperature 0 is greedy; its sampling distribution is a point mass, so ``sampling_logprob`` is 0.
    ``allowed_logits``: the logits with the tokens a constraint forbids at -inf (constrained decoding); the token is
    drawn from them, ``sampling_logprob`` is under that masked distribution and ``logprob`` (and the top
    alternatives) under the unmasked policy, as training's importance ratio needs.
    """
    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if params.top_logprobs:
        values, ids = torch.topk(raw, params.top_logprobs)
        top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    drawn_from = logits if allowed_logits is None else allowed_logits.float()
    if params.temperature == 0:
        token = int(torch.argmax(drawn_from))
        return TokenChoice(token, float(raw[token]), 0.0, top)
    scores = drawn_from / params.temperature
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


def teacher_forced_logprobs(
    model: nn.Module, tokens: Sequence[int], device: torch.device, start: int = 1
) -> list[float]:
    """log p(tokens[i] | tokens[:i]) for i >= ``start`` (>= 1), from one forward pass (call under the version to
    score). Only the positions that predict those tokens go through the output layer: scoring a reply after a long
    prompt, the vocabulary-wide logits at every prompt position were a fifth of the pass on SmolLM2."""
    with torch.inference_mode():
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
        kept = len(tokens) - start + 1  # positions start-1 .. n-1; the last predicts nothing
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=kept).logits[0, :-1].float()
        targets = input_ids[0, start:].unsqueeze(-1)
        return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1).tolist()


def next_token_logprobs(
    model: nn.Module, prompt: Sequence[int], candidates: Sequence[int], device: torch.device
) -> list[float]:
    """log p(c | prompt) for each candidate token c, from one forward pass (call under the version to score).
    Only the last position goes through the output layer: the judge's one read per turn, and the vocabulary-wide
    logits at every prompt position were a fifth of its forward pass on SmolLM2."""
    with torch.inference_mode():
        input_ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
        logits = model(input_ids=input_ids, use_cache=False, logits_to_keep=1).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1)[list(candidates)].tolist()


# ---------------------------------------------------------------------------------------------------------------
# The sampler


@dataclass
class _Failure:
    error: BaseException


def _cache_argument_name(model: nn.Module) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name is deprecated); accept both eras.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass(eq=False)
class _Request:
    """One request from admission to its result: its own prefill cache, then a row of the decode batch."""

    prompt: list[int]
    params: SamplingParams
    served: ServedVersion
    deliver: Callable[[StreamEvent | _Failure], None]
    with_chunks: bool
    cancelled: threading.Event
    accepted_at: float
    generator: torch.Generator
    text: IncrementalText
    stop_ids: frozenset[int]
    grammar: ConstrainedRow | None = None  # constrained decoding (params.constraint)
    cache: Any = None  # its own KV cache while the prompt is prefilled; then the batch's
    prefilled: int = 0  # prompt tokens in the cache so far
    pad: int = 0  # left padding of this row in the batch cache
    next_input: int = -1  # the last sampled token, not yet in the cache
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    forced_tokens: list[int] = field(default_factory=list)
    first_token_at: float = 0.0
    finish_reason: FinishReason | None = None

    def result(self) -> SampleResult:
        return SampleResult(
            tokens=self.tokens,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason or "length",
            version=self.served.number,
            text=self.text.text,
            stop_sequence=self.text.stop_sequence,
            sampling_logprobs=self.sampling_logprobs,
            top_logprobs=self.top_logprobs,
            forced_tokens=self.forced_tokens,
            prompt_tokens=len(self.prompt),
            started_at=self.accepted_at,
            first_token_at=self.first_token_at,
            finished_at=time.time(),
        )


def _left_pad(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """Prepend ``size`` zero positions on the sequence axis (-2) of a [batch, heads, seq, dim] cache tensor."""
    if size == 0:
        return tensor
    shape = (*tensor.shape[:-2], size, tensor.shape[-1])
    return torch.cat([tensor.new_zeros(shape), tensor], dim=-2)


def _mergeable(cache: Any) -> bool:
    """Whether a cache is plain per-layer key/value tensors that rows can be padded into and picked out of
    (sliding-window and recurrent layers keep state we cannot pad; such models decode one request at a time)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers:
        return False
    return all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers)


class TransformersSampler:
    """Samples from the policy versions of one served model, on CPU or GPU, in step-level batches.

    One scheduler thread owns decoding. Each admitted request first has its prompt prefilled into a cache of its
    own: while other requests are decoding, :data:`PREFILL_CHUNK` tokens at a time, one chunk between their decode
    steps (a long prompt never stalls the streams already running), else in one pass. Then its cache joins the
    batch's (left-padded to a common length) and every decode step advances all running requests with one forward
    pass, each row on its own policy version (:meth:`PolicyVersions.activate_rows`). At most ``max_concurrent``
    requests are admitted; the rest wait in order. Padded positions are masked and each row keeps its own position
    ids, so a row's tokens and log-probabilities are those it would get alone (up to float rounding). On CPU,
    prefill runs on all cores, and decode steps too while no training or scoring pass runs (``other_work``), else on
    ``decode_threads`` (:mod:`openclaw_cli.backends.local.cpu_threads`).
    """

    PREFILL_CHUNK = 512

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        versions: PolicyVersions,
        *,
        max_concurrent: int,
        context_length: int,
        decode_threads: int | None = None,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._versions = versions
        self.context_length = context_length
        self._max_concurrent = max_concurrent
        self._device = next(model.parameters()).device
        self._vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self._cache_arg = _cache_argument_name(model)
        self._eos_ids = frozenset(int(t) for t in tokenizer.eos_token_ids)
        self._masks = GrammarMasks(tokenizer, self._vocab_size, sorted(self._eos_ids))
        # CPU: decode steps on fewer threads than prefill (openclaw_cli.backends.local.cpu_threads); None = as is.
        self._set_threads = per_thread_setter() if self._device.type == "cpu" else None
        self._prefill_threads = torch.get_num_threads()
        self._decode_threads = decode_threads or default_decode_threads(self._prefill_threads)
        # Training and scoring passes say when they run: decode steps take every core while none does.
        self.other_work = OtherWork()
        self._lock = threading.Condition()
        self._waiting: deque[_Request] = deque()  # not yet admitted
        self._prefilling: deque[_Request] = deque()  # admitted, prompt not yet all in their own cache
        self._rows: list[_Request] = []  # decoding together; their caches are self._batch_cache
        self._batch_cache: Any = None
        self._closed = False
        self._scheduler: threading.Thread | None = None
        # Teacher scoring (OPD, training-side) gets its own thread so it never waits behind serving.
        self._scoring_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openclaw-scoring")

    @property
    def running_requests(self) -> int:
        """Requests admitted and not finished (prefilling or decoding), for dashboards and tests."""
        with self._lock:
            return len(self._prefilling) + len(self._rows)

    async def sample(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> SampleResult:
        events = self._events(prompt_tokens, params, version, adapter, with_chunks=False)
        async with aclosing(events):
            async for event in events:
                if isinstance(event, SampleResult):
                    return event
        raise BackendError("sampler ended without a result")  # unreachable unless the scheduler misbehaves

    def stream(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> AsyncIterator[StreamEvent]:
        return self._events(prompt_tokens, params, version, adapter, with_chunks=True)

    async def compute_logprobs(
        self, tokens: list[int], *, version: int | None = None, start: int = 1, adapter: str = SHARED_ADAPTER
    ) -> list[float | None]:
        """log p(tokens[i] | tokens[:i]) under a version of ``adapter`` (its current one by default) for
        i >= ``start``; None before it and at index 0."""
        served = self._versions.acquire(version, adapter)
        self._check_tokens(tokens, "tokens")
        if len(tokens) > self.context_length:
            raise BackendError(
                f"{len(tokens)} tokens exceed the model's context length of {self.context_length}", status_code=400
            )
        start = max(start, 1)
        if len(tokens) <= start:
            return [None] * len(tokens)

        def score() -> list[float]:
            with self.other_work.running(), self._versions.activate(served):
                return teacher_forced_logprobs(self._model, tokens, self._device, start)

        try:
            future = self._scoring_executor.submit(score)
        except RuntimeError as exc:
            raise BackendError("the local sampler is closed", retryable=True) from exc
        values = await asyncio.wrap_future(future)
        return [*([None] * start), *values]

    async def next_token_logprobs(
        self, prompt: list[int], candidates: list[int], *, version: int | None = None, adapter: str = SHARED_ADAPTER
    ) -> list[float]:
        """log p(c | prompt) for each candidate token under a version of ``adapter`` (its current one by default)."""
        served = self._versions.acquire(version, adapter)
        self._check_tokens(prompt, "prompt")
        self._check_tokens(candidates, "candidates")
        if not prompt or len(prompt) >= self.context_length:
            raise BackendError(
                f"a prompt of {len(prompt)} tokens leaves no room for one more in a {self.context_length} context",
                status_code=400,
            )

        def score() -> list[float]:
            with self.other_work.running(), self._versions.activate(served):
                return next_token_logprobs(self._model, prompt, candidates, self._device)

        try:
            future = self._scoring_executor.submit(score)
        except RuntimeError as exc:
            raise BackendError("the local sampler is closed", retryable=True) from exc
        return await asyncio.wrap_future(future)

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        """None when decoding can enforce ``constraint`` (llguidance takes its grammar), else why not."""
        return self._masks.error(constraint)

    def close(self) -> None:
        """Stop accepting work: requests not yet admitted fail; running ones stop when their consumers go away."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            self._lock.notify_all()
        for request in waiting:
            request.deliver(
                _Failure(BackendError("the local sampler was closed before this request ran", retryable=True))
            )
        self._scoring_executor.shutdown(wait=False, cancel_futures=True)

    # -- requests --------------------------------------------------------------------------------------------

    async def _events(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None,
        adapter: str,
        *,
        with_chunks: bool,
    ) -> AsyncGenerator[StreamEvent, None]:
        accepted_at = time.time()
        prompt = [int(t) for t in prompt_tokens]
        self._check_request(prompt, params)
        grammar = None
        if params.constraint is not None:  # compiled off the event loop (the first one also builds the vocabulary)
            grammar = await asyncio.to_thread(self._masks.row, params.constraint)
        # Pinned for the whole request, whatever publish does meanwhile.
        served = self._versions.acquire(version, adapter)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[StreamEvent | _Failure] = asyncio.Queue()
        cancelled = threading.Event()

        def deliver(item: StreamEvent | _Failure) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone: nobody is listening any more
                cancelled.set()

        generator = torch.Generator(device=self._device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        request = _Request(
            prompt=prompt,
            params=params,
            served=served,
            deliver=deliver,
            with_chunks=with_chunks,
            cancelled=cancelled,
            accepted_at=accepted_at,
            generator=generator,
            text=IncrementalText(self._tokenizer.decode, params.stop),
            stop_ids=self._eos_ids | frozenset(params.stop_token_ids),
            grammar=grammar,
        )
        with self._lock:
            if self._closed:
                raise BackendError("the local sampler is closed", retryable=True)
            self._waiting.append(request)
            if self._scheduler is None:
                self._scheduler = threading.Thread(target=self._schedule, name="openclaw-sampler", daemon=True)
                self._scheduler.start()
            self._lock.notify_all()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Failure):
                    raise item.error
                yield item
                if isinstance(item, SampleResult):
                    return
        finally:
            cancelled.set()  # consumer closed or cancelled: the scheduler drops the request at its next step
            with self._lock:
                self._lock.notify_all()

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

    # -- the scheduler thread --------------------------------------------------------------------------------

    def _schedule(self) -> None:
        """Admit, prefill one chunk, decode one step; repeat until closed and idle."""
        while True:
            with self._lock:
                self._drop_cancelled()
                while len(self._prefilling) + len(self._rows) < self._max_concurrent and self._waiting:
                    self._prefilling.append(self._waiting.popleft())
                if not self._prefilling and not self._rows:
                    if self._closed:
                        self._scheduler = None
                        return
                    self._lock.wait()
                    continue
                prefill = self._prefilling[0] if self._prefilling else None
            with torch.inference_mode():
                if prefill is not None:
                    self._use_threads(self._prefill_threads)
                    self._guarded([prefill], self._prefill_chunk)
                if self._rows:
                    self._use_threads(self._decode_threads if self.other_work.busy else self._prefill_threads)
                    self._guarded(list(self._rows), self._decode_step)

    def _use_threads(self, count: int) -> None:
        if self._set_threads is not None:
            self._set_threads(count)

    def _drop_cancelled(self) -> None:
        """Forget requests whose consumers left (call with the lock held)."""
        for request in [r for r in self._prefilling if r.cancelled.is_set()]:
            self._prefilling.remove(request)
        gone = [i for i, r in enumerate(self._rows) if r.cancelled.is_set()]
        if gone:
            self._remove_rows(gone)

    def _guarded(self, requests: list[_Request], work: Callable[[], None]) -> None:
        """Run one unit of work; if it raises, the requests it touched fail with a clear error and leave."""
        try:
            work()
        except Exception as exc:
            failure = (
                exc
                if isinstance(exc, BackendError)
                else BackendError(f"sampling failed: {type(exc).__name__}: {exc}", retryable=False)
            )
            if failure is not exc:
                failure.__cause__ = exc
            with self._lock:
                for request in requests:
                    if request in self._prefilling:
                        self._prefilling.remove(request)
                    if request in self._rows:
                        self._remove_rows([self._rows.index(request)])
                    request.deliver(_Failure(failure))

    def _prefill_chunk(self) -> None:
        """Feed the next chunk of the oldest prefilling request's prompt; after the last one, its first token."""
        request = self._prefilling[0]
        if request.prefilled == len(request.prompt):  # prefilled, its cache waits for the batch to drain
            with self._lock:
                if not self._rows:
                    self._prefilling.popleft()
                    self._join_batch(request)
            return
        if request.cache is None:
            from transformers import DynamicCache

            request.cache = DynamicCache(config=getattr(self._model, "config", None))
        start = request.prefilled
        # Chunks only matter while other streams wait on this thread; alone, one pass is fastest.
        end = min(len(request.prompt), start + self.PREFILL_CHUNK) if self._rows else len(request.prompt)
        ids = torch.tensor([request.prompt[start:end]], dtype=torch.long, device=self._device)
        with self._versions.activate(request.served):
            out = self._model(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_arg: request.cache})
        request.prefilled = end
        if end < len(request.prompt):
            return
        with self._lock:
            self._prefilling.popleft()
        if self._accept(request, out.logits[0, -1]):
            return
        with self._lock:
            self._join_batch(request)

    def _decode_step(self) -> None:
        """One forward pass for every running row: its last token in, its next token out."""
        rows = list(self._rows)
        length = self._batch_cache.get_seq_length()
        ids = torch.tensor([[r.next_input] for r in rows], dtype=torch.long, device=self._device)
        positions = torch.tensor([[length - r.pad] for r in rows], dtype=torch.long, device=self._device)
        kwargs: dict[str, Any] = {self._cache_arg: self._batch_cache}
        if any(r.pad for r in rows):
            mask = torch.ones(len(rows), length + 1, dtype=torch.long, device=self._device)
            for i, row in enumerate(rows):
                mask[i, : row.pad] = 0
            kwargs["attention_mask"] = mask
        with self._versions.activate_rows([r.served for r in rows]):
            out = self._model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1, **kwargs)
        finished = [i for i, row in enumerate(rows) if self._accept(row, out.logits[i, -1])]
        if finished:
            with self._lock:
                self._remove_rows(finished)

    def _accept(self, request: _Request, logits: torch.Tensor) -> bool:
        """Choose the request's next token from its logits, stream it; True when the request is finished (its
        result delivered)."""
        params = request.params
        remaining = params.max_tokens - len(request.tokens)
        allowed = request.grammar.masked(logits, remaining) if request.grammar is not None else None
        choice = choose_token(logits, params, request.generator, allowed)
        if request.grammar is not None:
            request.grammar.advance(choice.token)
            if request.grammar.forced:
                request.forced_tokens.append(len(request.tokens))
        if not request.tokens:
            request.first_token_at = time.time()
        request.tokens.append(choice.token)
        request.logprobs.append(choice.logprob)
        request.sampling_logprobs.append(choice.sampling_logprob)
        if params.top_logprobs:
            request.top_logprobs.append(list(choice.top))
        if choice.token in request.stop_ids:
            request.finish_reason = "stop"
            piece = request.text.finish()
        else:
            piece = request.text.push(choice.token)
            if request.text.stop_sequence is not None:
                request.finish_reason = "stop"
            elif len(request.tokens) == params.max_tokens:
                request.finish_reason = "length"
                piece += request.text.finish()
        if request.with_chunks:
            request.deliver(TokenChunk(choice.token, choice.logprob, piece, request.served.number, list(choice.top)))
        if request.finish_reason is not None:
            request.deliver(request.result())
            return True
        request.next_input = choice.token
        return False

    def _join_batch(self, request: _Request) -> None:
        """Add a prefilled request's cache to the batch's, left-padding the shorter side to a common length
        (call with the lock held). A cache that cannot be padded waits until the batch is empty."""
        cache, request.cache = request.cache, None
        if not self._rows:
            self._rows, self._batch_cache, request.pad = [request], cache, 0
            return
        if not (_mergeable(cache) and _mergeable(self._batch_cache)):
            request.cache = cache
            self._prefilling.appendleft(request)  # prefilled already: it joins when the batch drains
            return
        batch_length, own_length = self._batch_cache.get_seq_length(), cache.get_seq_length()
        length = max(batch_length, own_length)
        for batch_layer, own_layer in zip(self._batch_cache.layers, cache.layers, strict=True):
            batch_layer.keys = torch.cat(
                [_left_pad(batch_layer.keys, length - batch_length), _left_pad(own_layer.keys, length - own_length)]
            )
            batch_layer.values = torch.cat(
                [_left_pad(batch_layer.values, length - batch_length), _left_pad(own_layer.values, length - own_length)]
            )
        for row in self._rows:
            row.pad += length - batch_length
        request.pad = length - own_length
        self._rows.append(request)

    def _remove_rows(self, indices: list[int]) -> None:
        """Drop rows from the batch and its cache, then the left padding every remaining row shares (lock held)."""
        keep = [i for i in range(len(self._rows)) if i not in set(indices)]
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._batch_cache = None
            return
        self._batch_cache.batch_select_indices(torch.tensor(keep, device=self._device))
        shared = min(r.pad for r in self._rows)
        if shared:
            for layer in self._batch_cache.layers:
                layer.keys, layer.values = layer.keys[..., shared:, :], layer.values[..., shared:, :]
            for row in self._rows:
                row.pad -= shared


class AdapterSampler(AdapterServing):
    """A :class:`TransformersSampler`'s serving and scoring for one adapter: what a local backend's per-owner view
    (``LocalBackend.adapter``) answers with. Versions are that adapter's own numbers."""

    sampler: TransformersSampler

    def __init__(self, sampler: TransformersSampler, adapter: str) -> None:
        super().__init__(sampler, adapter)

    async def compute_logprobs(
        self, tokens: list[int], *, version: int | None = None, start: int = 1
    ) -> list[float | None]:
        return await self.sampler.compute_logprobs(tokens, version=version, start=start, adapter=self.adapter)
