"""The two ways every API answers a generation request, shared by Chat Completions, Responses and Messages.

- :func:`answer`: picks between the two for a parsed request (:func:`start_call` renders and budgets it).
- :func:`stream_response`: a live SSE stream of the backend's tokens (the stream is opened before the response
  starts, so a failure to start is still an HTTP error; it is closed when the client leaves, even before the body).
- :func:`whole_reply_response`: the reply sampled whole (checked against the request's demands where decoding
  does not enforce them), answered as JSON, or for such a request with ``stream: true`` replayed as a stream once
  known, with keep-alives while it is sampled (see :mod:`openclaw_cli.proxy.buffered_stream`). The reply is
  recorded before any of it is sent.

Each API supplies only what differs, as a :class:`ReplyFormat`: its live frames, how its body is built and recorded,
how a body replays as its stream, its error frame and headers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Generic

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from openclaw_cli.adapters import ADAPTER_HEADER, adapter_of
from openclaw_cli.capture import ApiKind
from openclaw_cli.capture.sessions import client_session_scope, likely_main_line
from openclaw_cli.lesson_prompt import (
    LESSONS_HEADER,
    ActiveLesson,
    lesson_block,
    lessons_header_value,
    lessons_wanted,
    owner_of,
    prompt_lessons,
    with_lessons,
)
from openclaw_cli.proxy.api_call import ApiCall, ParsedRequest, R
from openclaw_cli.proxy.auth import presented_key
from openclaw_cli.proxy.buffered_stream import buffered_stream_response
from openclaw_cli.proxy.completion import prepare_prompt
from openclaw_cli.proxy.constraints import Sampled, decoding_constraint, sample_satisfying
from openclaw_cli.proxy.disconnect import ClientGone, unless_disconnected
from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.proxy.sse import KEEPALIVE_COMMENT, SSE_HEADERS, SSE_MEDIA_TYPE
from openclaw_cli.proxy.state import ProxyState
from openclaw_cli.proxy.stream_open import OpenStream, open_stream
from openclaw_cli.settings import Settings

Headers = Callable[[int], dict[str, str]]  # the API's response headers for a policy version


@dataclass(frozen=True)
class ReplyFormat(Generic[R]):
    """How one API writes its replies; the rest of answering is shared."""

    live: Callable[[ApiCall[R], OpenStream], AsyncIterator[bytes]]  # a live stream's frames
    record: Callable[[ApiCall[R], list[Sampled]], Awaitable[tuple[dict[str, Any], int]]]  # (body, version), recorded
    as_stream: Callable[[R, dict[str, Any]], AsyncIterator[bytes]]  # a whole body replayed as the API's stream
    error_frame: Callable[[R, ProxyError], bytes]  # a failure after the stream's status line
    headers: Callable[[R, int], dict[str, str]]  # the response headers for a policy version


async def start_call(request: Request, state: ProxyState, req: R, *, api: ApiKind, request_id: str) -> ApiCall[R]:
    """The parsed request with its prompt rendered (with its owner's lessons, :func:`served_lessons`) and its reply
    budgeted under the proxy's limits (see ``prepare_prompt``: a request that cannot fit raises its
    :class:`ProxyError`)."""
    owner, lessons = served_lessons(request, state, req)
    prepared = await prepare_prompt(
        state.backend,
        with_lessons(req.messages, [lesson.text for lesson in lessons]),
        req.tools,
        tools_offered=req.tools_offered,
        sampling=req.sampling,
        default_max_tokens=state.settings.proxy.default_max_tokens,
        max_output_tokens=state.settings.proxy.max_output_tokens,
    )
    prepared = replace(
        prepared,
        messages=req.messages,
        lessons=tuple(lessons),
        owner=owner,
        adapter=adapter_of(state.settings, owner),
    )
    constraints, constraint = decoding_constraint(
        state.backend,
        req.constraints,
        prepared.tools if prepared.tools_offered else None,
        reasoning_open=prepared.starts_in_reasoning,
    )
    if constraint is not None:
        prepared = replace(prepared, params=replace(prepared.params, constraint=constraint))
    req.constraints = constraints
    return ApiCall(api, request_id, request, state, req, prepared)


def served_lessons(request: Request, state: ProxyState, req: ParsedRequest) -> tuple[str, list[ActiveLesson]]:
    """The request's owner and the lessons it is served with: the owner's active lessons within
    ``lessons.max_tokens``, for a request that is likely main-line and did not say ``x-openclaw-lessons: off``."""
    headers = request.headers
    owner = request_owner(request, state.settings, req.body)
    # Most requests' owners have no lesson: the main-line heuristic (regexes over the last messages) runs only
    # when there is something to place.
    if state.lessons is None or not state.lessons.for_owner(owner):
        return owner, []
    tokenizer = state.backend.tokenizer()
    budget = state.settings.lessons.max_tokens
    lessons = prompt_lessons(
        state.lessons,
        owner,
        wanted=lessons_wanted(headers),
        main_line=likely_main_line(headers, req.model.turn_type_hint, req.messages),
        fits=lambda texts: len(tokenizer.encode(lesson_block(texts))) <= budget,
    )
    return owner, lessons


def request_owner(request: Request, settings: Settings, body: dict[str, Any]) -> str:
    """Whose lessons a request gets and changes: its API key, or its session scope (see lesson_prompt.owner_of)."""
    scope, _ = client_session_scope(request.headers, body)
    return owner_of(settings, presented_key(request.scope.get("headers", [])), scope)


def served_by_headers(call: ApiCall[Any]) -> dict[str, str]:
    """What shaped the reply besides the policy version: the lessons in its prompt and the adapter that answered."""
    return {
        LESSONS_HEADER: lessons_header_value(lesson.id for lesson in call.prepared.lessons),
        ADAPTER_HEADER: call.prepared.adapter,
    }


async def answer(call: ApiCall[R], reply: ReplyFormat[R], n: int = 1) -> Response:
    """A live stream of the backend's tokens (``reply.live`` writes its frames) when the client streams and nothing
    has to be checked before it is sent; else the whole reply (JSON, or replayed as a stream)."""
    req = call.req
    api_headers = reply.headers
    reply = replace(reply, headers=lambda r, version: {**api_headers(r, version), **served_by_headers(call)})
    if req.stream and not req.constraints.active:
        opened = await open_stream(call.state, call.prepared, n)
        return stream_response(opened, reply.live(call, opened), partial(reply.headers, req))
    return await whole_reply_response(call, reply, n)


def stream_response(stream: OpenStream, frames: AsyncIterator[bytes], headers: Headers) -> StreamingResponse:
    """An SSE response over an opened backend stream."""
    return StreamingResponse(
        frames,
        media_type=SSE_MEDIA_TYPE,
        headers={**SSE_HEADERS, **headers(stream.version)},
        background=BackgroundTask(stream.close),  # runs even when the client left before the body started
    )


async def whole_reply_response(call: ApiCall[R], reply: ReplyFormat[R], n: int) -> Response:
    """Sample ``n`` replies that meet the request's constraints and answer them as JSON, or (a streaming request) as
    a replayed stream."""
    request, state, req = call.request, call.state, call.req
    limits = state.settings.proxy
    lease = state.lease()
    backend = state.serving(call.prepared.adapter)
    sampling = sample_satisfying(
        backend,
        call.prepared,
        n,
        req.constraints,
        retries=limits.tool_choice_retries,
        retry_after_s=limits.retry_after_s,
        health=state.health,
    )
    if req.stream:

        async def replay(sampled: list[Sampled]) -> tuple[AsyncIterator[bytes], dict[str, str]]:
            body, version = await reply.record(call, sampled)
            return reply.as_stream(req, body), reply.headers(req, version)

        return await buffered_stream_response(
            request,
            sampling,
            lease=lease,
            keepalive_s=limits.keepalive_s,
            # An SSE comment, not an API event: a ping before the first event is out of order for a strict client,
            # and every SSE parser skips comments.
            keepalive_frame=KEEPALIVE_COMMENT,
            replay=replay,
            error_frame=partial(reply.error_frame, req),
            early_headers=reply.headers(req, backend.current_version().version),
            retry_after_s=limits.retry_after_s,
        )
    try:
        sampled = await unless_disconnected(request, sampling)
    except ClientGone:
        return Response(status_code=499)
    finally:
        lease.release()
    body, version = await reply.record(call, sampled)
    return JSONResponse(body, headers=reply.headers(req, version))
