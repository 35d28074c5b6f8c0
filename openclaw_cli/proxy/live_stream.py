"""What every API's live stream does with the backend's events, whatever frames it writes.

Chat Completions, Responses and Messages stream the same way: the backend's token events (merged over ``n``
choices, with ``None`` for a keep-alive while nothing arrived; see :mod:`openclaw_cli.proxy.event_merge`) go
through one :class:`~openclaw_cli.proxy.streaming.AssistantStreamSplitter` per choice, which turns text into
reasoning / content / tool-call pieces; what the client has received is kept per choice, so a reply it leaves
mid-way is recorded as a side turn. :func:`split_stream` does that walk and :func:`guarded_frames` the ending: a
failure mid-stream becomes the API's own error frame (the status line is long sent), and a stream that ends in any
other way (finished, or the client left) records the abandoned choices and closes the backend stream. Each API
writes only its frames.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openclaw_cli.backend import ChatTokenizer
from openclaw_cli.proxy.api_call import ApiCall
from openclaw_cli.proxy.capture_handoff import PartialReply, record_abandoned
from openclaw_cli.proxy.completion import PreparedPrompt, parser_for
from openclaw_cli.proxy.errors import ProxyError, from_stream_failure
from openclaw_cli.proxy.stream_open import OpenStream
from openclaw_cli.proxy.streaming import AssistantStreamSplitter, Piece
from openclaw_cli.types import SampleResult, TokenChunk


@dataclass
class LiveChoice:
    """One choice of a live stream: its splitter and what the client has received of it."""

    splitter: AssistantStreamSplitter
    partial: PartialReply = field(default_factory=PartialReply)


def live_choices(tokenizer: ChatTokenizer, prepared: PreparedPrompt, n: int) -> list[LiveChoice]:
    parse = parser_for(tokenizer, prepared.tools_offered)
    return [
        LiveChoice(
            AssistantStreamSplitter(
                parse, tools_offered=prepared.tools_offered, starts_in_reasoning=prepared.starts_in_reasoning
            )
        )
        for _ in range(n)
    ]


@dataclass
class StreamStep:
    """What one backend event became: the pieces of choice ``index`` it completed, the token it came with, and, when
    the choice just finished, its sample (``result``)."""

    index: int
    pieces: list[Piece]
    token: TokenChunk | None = None
    result: SampleResult | None = None


async def split_stream(stream: OpenStream, choices: Sequence[LiveChoice]) -> AsyncIterator[StreamStep | None]:
    """The stream's events as pieces per choice; ``None`` where the API sends a keep-alive."""
    item = stream.first
    while True:
        if item is None:
            yield None
        else:
            index, event = item
            choice = choices[index]
            if isinstance(event, TokenChunk):
                choice.partial.add(event)
                yield StreamStep(index, choice.splitter.feed(event.text), token=event)
            else:
                choice.partial.finished = True
                yield StreamStep(index, choice.splitter.finish(), result=event)
        try:
            item = await stream.events.__anext__()
        except StopAsyncIteration:
            return


async def guarded_frames(
    frames: AsyncGenerator[bytes, None],
    call: ApiCall[Any],
    *,
    stream: OpenStream,
    choices: Sequence[LiveChoice],
    error_frame: Callable[[ProxyError], bytes],
) -> AsyncIterator[bytes]:
    """``frames``, ended the same way for every API (see the module docstring)."""
    failed = False
    try:
        async for frame in frames:
            yield frame
    except Exception as exc:
        err = from_stream_failure(exc, retry_after_s=call.state.settings.proxy.retry_after_s)
        failed = True
        log = logging.getLogger(f"openclaw.proxy.{call.api}")
        log.error("stream %s failed mid-way: %s", call.request_id, err.message)
        yield error_frame(err)
    finally:
        try:
            await frames.aclose()
        finally:
            if not failed:  # a choice the client left mid-reply is kept as a side turn
                record_abandoned(call, [choice.partial for choice in choices])
            await stream.close()
