"""Handing each completed reply to the capture sink.

Rules:
- A reply is recorded once the backend has finished it and all of its text has been written to the client (for a
  stream: before the terminal frame — OpenAI's finish chunk / ``[DONE]``, Anthropic's ``message_delta`` /
  ``message_stop`` — so the turn is stored before the client can send its next request, which keeps next-state
  pairing in order). A client that disconnects earlier gets nothing recorded: a half-delivered reply is not a turn
  anyone saw, and a turn is never stored half-written.
- Rejected requests (4xx) and backend failures record nothing.
- Headers pass through :func:`~openclaw_cli.capture.scrub_headers`, so credentials never reach the store.
- A capture failure or a slow store is logged and never breaks or stalls the reply beyond ``capture_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import Request

from openclaw_cli.capture import ApiKind, CapturedExchange, CaptureSink, RecordedTurn, scrub_headers
from openclaw_cli.proxy.completion import PreparedPrompt
from openclaw_cli.proxy.models import ResolvedModel
from openclaw_cli.types import Message, SampleResult

log = logging.getLogger("openclaw.proxy.capture")


class CaptureRecorder:
    def __init__(self, sink: CaptureSink | None, *, timeout_s: float) -> None:
        self.sink = sink
        self.timeout_s = timeout_s
        self.recorded = 0
        self.failed = 0

    async def record(self, exchange: CapturedExchange) -> RecordedTurn | None:
        """Record one exchange; never raises (the client's reply matters more than its capture)."""
        if self.sink is None:
            return None
        try:
            turn = await asyncio.wait_for(self.sink.record(exchange), timeout=self.timeout_s)
        except TimeoutError:
            self.failed += 1
            log.error("capture timed out after %.1fs; the reply was served but not recorded", self.timeout_s)
            return None
        except Exception:
            self.failed += 1
            log.exception("capture failed; the reply was served but not recorded")
            return None
        self.recorded += 1
        return turn


def build_exchange(
    *,
    api: ApiKind,
    request: Request,
    body: dict[str, Any],
    model: ResolvedModel,
    prepared: PreparedPrompt,
    result: SampleResult,
    finish_reason: str,
    message: Message,
    response: dict[str, Any],
    started_at: float,
    stream: bool,
    choice_index: int = 0,
    request_id: str = "",
) -> CapturedExchange:
    metadata: dict[str, Any] = {"request_id": request_id, "endpoint": request.url.path}
    if model.turn_type_hint is not None:
        metadata["turn_type"] = model.turn_type_hint
    if result.stop_sequence is not None:
        metadata["stop_sequence"] = result.stop_sequence
    return CapturedExchange(
        api=api,
        headers=scrub_headers(request.headers),
        request=body,
        messages=prepared.messages,
        tools=prepared.tools,
        model=model.requested,
        prompt_tokens=list(prepared.prompt_tokens),
        completion_tokens=list(result.tokens),
        logprobs=list(result.logprobs),
        sampling_logprobs=list(result.sampling_logprobs),
        version=result.version,
        finish_reason=finish_reason,
        assistant_message=message,
        response=response,
        started_at=started_at,
        first_token_at=result.first_token_at or result.finished_at,
        finished_at=result.finished_at,
        stream=stream,
        choice_index=choice_index,
        metadata=metadata,
    )
