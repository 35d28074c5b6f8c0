"""Handing each completed reply to the capture sink.

Rules:
- A reply is recorded once the backend has finished it and all of its text has been written to the client (for a
  stream: before the terminal frame — OpenAI's finish chunk / ``[DONE]``, Anthropic's ``message_delta`` /
  ``message_stop``, Responses' ``response.completed`` — so the turn is stored before the client can send its next
  request, which keeps next-state pairing in order).
- A stream the client leaves mid-reply is recorded as what it delivered (:func:`record_aborted`): a *side* turn with
  ``finish_reason`` "aborted", so it is visible (status counts it under ``capture.aborted``) but never trained,
  since the policy did not finish that reply. A non-streamed reply the client stopped waiting for records nothing.
- Rejected requests (4xx) and backend failures record nothing.
- Headers pass through :func:`~openclaw_cli.secrets_scrub.scrub_headers`, so credentials never reach the store.
- A capture failure or a slow store is logged and never breaks or stalls the reply beyond ``capture_timeout_s``.
- Opt-out: a request with ``X-OpenClaw-Opt-Out: 1`` (or true/yes/on) is served normally and never handed to the
  sink: nothing of it is stored, so it is never judged, trained on or exported. The header works per request;
  to keep a whole conversation out, send it on every request (SDK ``default_headers``, Claude Code's
  ``ANTHROPIC_CUSTOM_HEADERS``), since a later request without it carries the earlier messages in its history.

Backpressure and the counts: :class:`~openclaw_cli.proxy.capture_recorder.CaptureRecorder`, which the proxy's state
holds (it knows nothing of API calls, so the state needs nothing from here).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.lesson_prompt import describe
from openclaw_cli.proxy.api_call import ApiCall
from openclaw_cli.secrets_scrub import scrub_headers
from openclaw_cli.types import Message, SampleResult, TokenChunk

log = logging.getLogger("openclaw.proxy.capture")

ABORTED = "aborted"  # finish_reason of a stream the client left
_ABORTED_META = {"turn_type": "side", "aborted": True}  # what a left stream's turn is tagged with


def build_exchange(
    call: ApiCall[Any],
    result: SampleResult,
    finish_reason: str,
    message: Message,
    response: dict[str, Any],
    stream: bool,
    choice_index: int = 0,
    extra_metadata: dict[str, Any] | None = None,
) -> CapturedExchange:
    """What capture stores of one reply (every API, streamed or not); the API records it before the client gets the
    reply's end."""
    req, prepared = call.req, call.prepared
    metadata: dict[str, Any] = {
        "request_id": call.request_id,
        "endpoint": call.request.scope["path"],
        "owner": prepared.owner,
        "adapter": prepared.adapter,
    }
    if prepared.lessons:  # the prompt as served: prompt_tokens were rendered with these in the lesson block
        metadata["lessons"] = describe(prepared.lessons)
    if req.model.turn_type_hint is not None:
        metadata["turn_type"] = req.model.turn_type_hint
    if result.stop_sequence is not None:
        metadata["stop_sequence"] = result.stop_sequence
    if prepared.params.constraint is not None:  # decoded under the request's tool call / JSON demand
        metadata["constrained_decoding"] = True
        if result.forced_tokens:
            metadata["forced_tokens"] = list(result.forced_tokens)
    metadata.update(extra_metadata or {})
    return CapturedExchange(
        api=call.api,
        headers=scrub_headers(call.request.scope["headers"]),
        request=req.body,
        messages=prepared.messages,
        tools=prepared.tools,
        model=req.model.requested,
        prompt_tokens=list(prepared.prompt_tokens),
        completion_tokens=list(result.tokens),
        logprobs=list(result.logprobs),
        sampling_logprobs=list(result.sampling_logprobs),
        version=result.version,
        finish_reason=finish_reason,
        assistant_message=message,
        response=response,
        started_at=req.started_at,
        first_token_at=result.first_token_at or result.finished_at,
        finished_at=result.finished_at,
        stream=stream,
        choice_index=choice_index,
        metadata=metadata,
    )


@dataclass
class PartialReply:
    """What a stream has delivered so far: recorded as a partial turn when the client leaves before the end."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    version: int = 0
    first_token_at: float = 0.0
    finished: bool = False

    def add(self, chunk: TokenChunk) -> None:
        self.first_token_at = self.first_token_at or time.time()
        self.tokens.append(chunk.token_id)
        self.logprobs.append(chunk.logprob)
        self.version = chunk.version

    def abandoned(self) -> bool:
        return not self.finished and bool(self.tokens)


def record_abandoned(call: ApiCall[Any], partials: Sequence[PartialReply]) -> None:
    """A stream's cleanup: record each choice the client left mid-reply (see :func:`record_aborted`)."""
    for index, partial in enumerate(partials):
        if partial.abandoned():
            record_aborted(call, partial, choice_index=index)


def record_aborted(call: ApiCall[Any], partial: PartialReply, choice_index: int = 0) -> None:
    """Record the part of a reply a client received before it left: a side turn (stored, never trained: the policy
    did not finish it) with ``finish_reason`` "aborted"."""
    now = time.time()
    result = SampleResult(
        tokens=list(partial.tokens),
        logprobs=list(partial.logprobs),
        finish_reason="length",
        version=partial.version,
        text=call.state.backend.tokenizer().decode(partial.tokens),
        prompt_tokens=len(call.prepared.prompt_tokens),
        started_at=call.req.started_at,
        first_token_at=partial.first_token_at,
        finished_at=now,
    )
    message: Message = {"role": "assistant", "content": result.text}
    response = {"aborted": True, "tokens_delivered": len(partial.tokens)}
    exchange = build_exchange(
        call, result, ABORTED, message, response, stream=True, choice_index=choice_index, extra_metadata=_ABORTED_META
    )
    call.state.recorder.record_aborted(exchange)
