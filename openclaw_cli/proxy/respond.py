"""The two ways every API answers a generation request, shared by Chat Completions, Responses and Messages.

- :func:`answer`: picks between the two for a parsed request (:func:`prepare_request` renders and budgets it).
- :func:`stream_response`: a live SSE stream of the backend's tokens (the stream is opened before the response
  starts, so a failure to start is still an HTTP error; it is closed when the client leaves, even before the body).
- :func:`whole_reply_response`: the reply sampled whole (checked against the request's constraints), answered as
  JSON, or for a constrained request with ``stream: true`` replayed as a stream once known, with keep-alives while
  it is sampled (see :mod:`openclaw_cli.proxy.buffered_stream`). The reply is recorded before any of it is sent.

Each API supplies only what differs: how its body is built and recorded, how a body replays as its stream, and its
error frame and headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from openclaw_cli.proxy.buffered_stream import buffered_stream_response
from openclaw_cli.proxy.completion import PreparedPrompt, SamplingRequest, prepare_prompt
from openclaw_cli.proxy.constraints import ReplyConstraints, Sampled, sample_satisfying
from openclaw_cli.proxy.disconnect import ClientGone, unless_disconnected
from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.proxy.sse import KEEPALIVE_COMMENT, SSE_HEADERS, SSE_MEDIA_TYPE
from openclaw_cli.proxy.state import ProxyState
from openclaw_cli.proxy.stream_open import OpenStream, open_stream
from openclaw_cli.types import Message

RecordBody = Callable[[list[Sampled]], Awaitable[tuple[dict[str, Any], int]]]  # -> (body, version), recorded first
Headers = Callable[[int], dict[str, str]]  # the API's response headers for a policy version


class GenerationRequest(Protocol):
    """What every API's parsed request carries for rendering, budgeting and answering."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    tools_offered: bool
    sampling: SamplingRequest
    stream: bool
    constraints: ReplyConstraints


async def prepare_request(state: ProxyState, req: GenerationRequest) -> PreparedPrompt:
    """The request's prompt rendered and its reply budgeted under the proxy's limits (see ``prepare_prompt``)."""
    return await prepare_prompt(
        state.backend,
        req.messages,
        req.tools,
        tools_offered=req.tools_offered,
        sampling=req.sampling,
        default_max_tokens=state.settings.proxy.default_max_tokens,
        max_output_tokens=state.settings.proxy.max_output_tokens,
    )


async def answer(
    request: Request,
    state: ProxyState,
    req: GenerationRequest,
    prepared: PreparedPrompt,
    *,
    n: int,
    live: Callable[[OpenStream], AsyncIterator[bytes]],
    record: RecordBody,
    as_stream: Callable[[dict[str, Any]], AsyncIterator[bytes]],
    error_frame: Callable[[ProxyError], bytes],
    headers: Headers,
) -> Response:
    """A live stream of the backend's tokens (``live`` writes its frames) when the client streams and nothing has to
    be checked before it is sent; else the whole reply (JSON, or replayed as a stream)."""
    if req.stream and not req.constraints.active:
        opened = await open_stream(state, prepared, n)
        return stream_response(opened, live(opened), headers)
    return await whole_reply_response(
        request,
        state,
        prepared,
        n=n,
        constraints=req.constraints,
        stream=req.stream,
        record=record,
        as_stream=as_stream,
        error_frame=error_frame,
        headers=headers,
    )


def stream_response(stream: OpenStream, frames: AsyncIterator[bytes], headers: Headers) -> StreamingResponse:
    """An SSE response over an opened backend stream."""
    return StreamingResponse(
        frames,
        media_type=SSE_MEDIA_TYPE,
        headers={**SSE_HEADERS, **headers(stream.version)},
        background=BackgroundTask(stream.close),  # runs even when the client left before the body started
    )


async def whole_reply_response(
    request: Request,
    state: ProxyState,
    prepared: PreparedPrompt,
    *,
    n: int,
    constraints: ReplyConstraints,
    stream: bool,
    record: RecordBody,
    as_stream: Callable[[dict[str, Any]], AsyncIterator[bytes]],
    error_frame: Callable[[ProxyError], bytes],
    headers: Headers,
) -> Response:
    """Sample ``n`` replies that meet ``constraints`` and answer them as JSON, or (``stream``) as a replayed stream."""
    limits = state.settings.proxy
    lease = state.lease()
    sampling = sample_satisfying(
        state.backend,
        prepared,
        n,
        constraints,
        retries=limits.tool_choice_retries,
        retry_after_s=limits.retry_after_s,
        health=state.health,
    )
    if stream:

        async def replay(sampled: list[Sampled]) -> tuple[AsyncIterator[bytes], dict[str, str]]:
            body, version = await record(sampled)
            return as_stream(body), headers(version)

        return await buffered_stream_response(
            request,
            sampling,
            lease=lease,
            keepalive_s=limits.keepalive_s,
            # An SSE comment, not an API event: a ping before the first event is out of order for a strict client,
            # and every SSE parser skips comments.
            keepalive_frame=KEEPALIVE_COMMENT,
            replay=replay,
            error_frame=error_frame,
            early_headers=headers(state.backend.current_version().version),
            retry_after_s=limits.retry_after_s,
        )
    try:
        sampled = await unless_disconnected(request, sampling)
    except ClientGone:
        return Response(status_code=499)
    finally:
        lease.release()
    body, version = await record(sampled)
    return JSONResponse(body, headers=headers(version))
