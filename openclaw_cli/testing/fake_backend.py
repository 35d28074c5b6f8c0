"""TEST DOUBLES for the proxy: a scripted serving backend (runs no model) and an in-memory capture sink.

:class:`FakeBackend` answers every request with the next scripted reply: the reply text is turned into token ids
with the real tokenizer (so ids, decoding, tool-call markup and chat templates are all genuine), a stop token is
appended, and tokens are streamed one by one with an optional per-token delay. That makes tool calls, incremental
streaming, mid-stream failures and stop sequences reproducible in tests and benchmarks of the proxy.

What is fake: log-probabilities are made-up deterministic numbers (``-0.01 * (1 + i % 10)``), sampling knobs other
than ``max_tokens`` and ``stop`` are ignored, and training calls raise :class:`~openclaw_cli.backend.NotYetAvailable`.
``publish`` / ``stage`` only hand out version numbers (``activate`` switches between them, so rollback and promotion
can be tested; a pinned known version is reported as the one that answered). Never register it as a real backend.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backend import BackendError, ChatTokenizer, NotYetAvailable
from openclaw_cli.capture import CapturedExchange, RecordedTurn
from openclaw_cli.types import (
    AdamParams,
    Datum,
    FwdBwdResult,
    LossName,
    PolicyVersion,
    SampleResult,
    SamplingParams,
    StepResult,
    StreamEvent,
    TokenChunk,
)


@dataclass
class ScriptedReply:
    """One reply. ``error`` is raised before the first token; ``fail_after_tokens`` raises a BackendError after that
    many tokens were streamed; ``token_delay_s`` overrides the backend's default delay; ``stop_token`` False leaves
    the stop token off (as when a model runs out of budget)."""

    text: str
    token_delay_s: float | None = None
    error: BackendError | None = None
    fail_after_tokens: int | None = None
    stop_token: bool = True


@dataclass
class FakeCall:
    prompt_tokens: list[int]
    params: SamplingParams
    started_at: float
    finished_at: float | None = None  # set when the last token was produced
    closed_early: bool = False  # the consumer stopped reading before the end
    tokens_produced: int = 0


def fake_logprob(position: int) -> float:
    return -0.01 * (1 + position % 10)


def fake_top_logprobs(token: int, position: int, k: int) -> list[tuple[int, float]]:
    """The double's k alternatives at a position: the sampled token first (with its fake logprob), then the next
    token ids, each 1 nat less likely."""
    return [(token + j, fake_logprob(position) - j) for j in range(k)]


@dataclass
class _Plan:
    tokens: list[int]
    texts: list[str]  # text newly visible after each token ("" while held back)
    finish_reason: str
    stop_sequence: str | None
    text: str


class FakeBackend:
    """Implements the serving half of the Backend protocol from a script (see the module docstring)."""

    name = "fake"

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        replies: Iterable[str | ScriptedReply] = (),
        *,
        default_reply: str = "OK.",
        token_delay_s: float = 0.0,
        version: int = 0,
    ) -> None:
        self._tokenizer = tokenizer
        self._replies: deque[ScriptedReply] = deque()
        self.queue(*replies)
        self.default_reply = default_reply
        self.token_delay_s = token_delay_s
        self._version = PolicyVersion(version, "fake-base" if version == 0 else f"fake-v{version}")
        self._servable: dict[int, PolicyVersion] = {0: PolicyVersion(0, "fake-base"), version: self._version}
        self._latest = version
        self.activations: list[tuple[int, bool]] = []  # (version, train_from) of every activate() call
        self.calls: list[FakeCall] = []
        self.started = False
        self.closed = False
        self.adapter_name = SHARED_ADAPTER
        self._views: dict[str, FakeBackend] = {}

    # -- optional capability: an adapter per owner (SupportsAdapters) -----------------------------------------------

    def adapter(self, name: str) -> FakeBackend:
        """The double as adapter ``name`` sees it: its own version numbers (the base, 0, until it publishes), the
        same script and call log (the replies come from one queue whichever adapter asks)."""
        if name == self.adapter_name:
            return self
        view = self._views.get(name)
        if view is None:
            view = copy.copy(self)
            view.adapter_name = name
            view._version = PolicyVersion(0, "fake-base")
            view._servable = {0: view._version}
            view._latest = 0
            self._views[name] = view
        return view

    def queue(self, *replies: str | ScriptedReply) -> None:
        for reply in replies:
            self._replies.append(reply if isinstance(reply, ScriptedReply) else ScriptedReply(reply))

    # -- protocol: lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    def tokenizer(self) -> ChatTokenizer:
        return self._tokenizer

    def current_version(self) -> PolicyVersion:
        return self._version

    async def publish(self, name: str | None = None) -> PolicyVersion:
        self._version = await self.stage(name)
        return self._version

    # -- optional capability: version control (rollback, promotion gate) ---------------------------------------

    async def stage(self, name: str | None = None) -> PolicyVersion:
        """A new version number, servable when pinned, not current (see SupportsVersionControl)."""
        self._latest += 1
        staged = PolicyVersion(self._latest, name or f"fake-v{self._latest}")
        self._servable[staged.version] = staged
        return staged

    async def activate(self, version: int, *, train_from: bool = False) -> PolicyVersion:
        if version not in self._servable:
            known = ", ".join(str(v) for v in self.servable_versions())
            raise BackendError(f"policy version {version} is not servable; servable versions: {known}", status_code=404)
        self.activations.append((version, train_from))
        self._version = self._servable[version]
        return self._version

    def servable_versions(self) -> list[int]:
        return sorted(self._servable)

    # -- protocol: serving -------------------------------------------------------------------------------------

    def _next_reply(self, version: int) -> ScriptedReply:
        """The reply to the next request, which ``version`` answers (subclasses may make replies depend on it)."""
        return self._replies.popleft() if self._replies else ScriptedReply(self.default_reply)

    def _plan(self, reply: ScriptedReply, params: SamplingParams) -> _Plan:
        tokens = self._tokenizer.encode(reply.text)
        if reply.stop_token and self._tokenizer.eos_token_ids:
            tokens = [*tokens, self._tokenizer.eos_token_ids[0]]
        finish, stop_seq = "stop", None
        if len(tokens) > params.max_tokens:
            tokens, finish = tokens[: params.max_tokens], "length"
        texts: list[str] = []
        emitted = ""  # text released so far; always a prefix of the final text
        final_text: str | None = None
        for i in range(len(tokens)):
            full = self._tokenizer.decode(tokens[: i + 1])
            hit = _first_stop(full, params.stop)
            if hit is not None:  # keep the token that completed the stop string, drop the string from the text
                at, stop_seq = hit
                tokens, finish, final_text = tokens[: i + 1], "stop", full[:at]
                texts.append(final_text[len(emitted) :])
                break
            # Hold back an incomplete UTF-8 sequence and any tail that could still become a stop string.
            safe = full[: len(full) - _stop_prefix_len(full, params.stop)].rstrip("\ufffd")
            if len(safe) > len(emitted) and safe.startswith(emitted):
                texts.append(safe[len(emitted) :])
                emitted = safe
            else:
                texts.append("")
        if final_text is None:
            final_text = self._tokenizer.decode(tokens)
            if texts:
                texts[-1] += final_text[len(emitted) :]  # release whatever was still held back
        return _Plan(tokens, texts, finish, stop_seq, final_text)

    async def _events(
        self, prompt_tokens: list[int], params: SamplingParams, pinned: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        # A pinned version the double knows is reported as the one that answered; any other pin is ignored.
        version = pinned if pinned in self._servable else self._version.version
        reply = self._next_reply(version)
        call = FakeCall(list(prompt_tokens), params, time.time())
        self.calls.append(call)
        if reply.error is not None:
            raise reply.error
        plan = self._plan(reply, params)
        delay = self.token_delay_s if reply.token_delay_s is None else reply.token_delay_s
        first_at = 0.0
        completed = False
        tops = [fake_top_logprobs(token, i, params.top_logprobs) for i, token in enumerate(plan.tokens)]
        try:
            for i, (token, text) in enumerate(zip(plan.tokens, plan.texts, strict=True)):
                if reply.fail_after_tokens is not None and i >= reply.fail_after_tokens:
                    raise BackendError("scripted failure in the middle of the reply")
                if delay > 0:
                    await asyncio.sleep(delay)
                first_at = first_at or time.time()
                call.tokens_produced = i + 1
                yield TokenChunk(
                    token_id=token, logprob=fake_logprob(i), text=text, version=version, top_logprobs=tops[i]
                )
            call.finished_at = time.time()
            completed = True
            logprobs = [fake_logprob(i) for i in range(len(plan.tokens))]
            yield SampleResult(
                tokens=list(plan.tokens),
                logprobs=logprobs,
                finish_reason=plan.finish_reason,  # type: ignore[arg-type]
                version=version,
                text=plan.text,
                stop_sequence=plan.stop_sequence,
                sampling_logprobs=list(logprobs),
                top_logprobs=tops if params.top_logprobs else [],
                prompt_tokens=len(prompt_tokens),
                started_at=call.started_at,
                first_token_at=first_at or call.finished_at,
                finished_at=call.finished_at,
            )
        finally:
            if not completed:
                call.closed_early = True

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self._events(prompt_tokens, params, version)

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        result: SampleResult | None = None
        async for event in self._events(prompt_tokens, params, version):
            if isinstance(event, SampleResult):
                result = event
        assert result is not None
        return result

    # -- protocol: training (not faked) ------------------------------------------------------------------------

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        raise NotYetAvailable("FakeBackend is a serving test double; it computes no log-probabilities")

    async def forward_backward(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        raise NotYetAvailable("FakeBackend is a serving test double; it does not train")

    async def discard_gradients(self) -> None:
        return None  # it never accumulates any

    async def optim_step(self, adam: AdamParams) -> StepResult:
        raise NotYetAvailable("FakeBackend is a serving test double; it does not train")

    async def save_state(self, name: str) -> str:
        raise NotYetAvailable("FakeBackend is a serving test double; it has no state to save")

    async def load_state(self, path: str) -> PolicyVersion:
        raise NotYetAvailable("FakeBackend is a serving test double; it has no state to load")


class MemorySink:
    """TEST DOUBLE capture sink: keeps every exchange in ``exchanges`` (no sessions, no pairing, no disk).

    ``fail_with`` makes every ``record`` raise it, to test that capture failures never break a reply.
    """

    def __init__(self, *, fail_with: Exception | None = None) -> None:
        self.exchanges: list[CapturedExchange] = []
        self.ended: list[str] = []
        self.fail_with = fail_with

    async def record(self, exchange: CapturedExchange) -> RecordedTurn:
        if self.fail_with is not None:
            raise self.fail_with
        self.exchanges.append(exchange)
        n = len(self.exchanges)
        return RecordedTurn(session_id="memory", turn_id=n, turn_type="main", turn_index=n - 1)

    async def end_session(self, session_id: str) -> bool:
        self.ended.append(session_id)
        return True

    def stats(self) -> dict[str, int]:
        return {"recorded": len(self.exchanges), "ended": len(self.ended)}


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    hits = [(text.find(s), s) for s in stops if s and s in text]
    return min(hits) if hits else None


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    best = 0
    for stop in stops:
        for size in range(min(len(text), len(stop) - 1), 0, -1):
            if stop.startswith(text[-size:]):
                best = max(best, size)
                break
    return best


__all__ = ["FakeBackend", "FakeCall", "MemorySink", "ScriptedReply", "fake_logprob"]
