"""OpenAI Responses: ``POST /v1/responses`` (plain and streamed), what current Codex speaks.

Accepted: model, instructions, input (items, see responses_convert.py), tools (function and custom), tool_choice,
parallel_tool_calls, max_output_tokens, temperature, top_p, text.format (json_object / json_schema), stream, store,
previous_response_id, user, prompt_cache_key (a session id, as Codex sends it). reasoning, include, metadata,
truncation, service_tier and any other unknown field are accepted and ignored.

``previous_response_id`` continues a response this process produced with ``store`` not false: the conversation of
the last :data:`KEEP_RESPONSES` such responses is kept in memory (not across restarts); an unknown id is a 404 with
code ``previous_response_not_found``. ``store: false`` (Codex's default) keeps nothing here; the turn is captured
for training either way, like every other API's.

A streamed reply is the event sequence Codex parses, token by token: ``response.created``, ``response.in_progress``,
then per output item ``response.output_item.added``, its deltas (``response.reasoning_text.delta`` |
``response.output_text.delta`` after ``response.content_part.added`` | ``response.function_call_arguments.delta`` |
``response.custom_tool_call_input.delta``), their ``.done`` events and ``response.output_item.done`` with the whole
item, then ``response.completed`` with the response (id, output, usage). A prompt that cannot fit the context is
``response.failed`` with code ``context_length_exceeded`` on a stream (Codex reads the code there), a 400 otherwise;
a failure mid-stream is ``response.failed`` too. Constrained requests (tool_choice required / named, text.format)
are met as on the other APIs: decoded under the constraint and streamed token by token where the backend constrains
decoding, else checked, resampled and streamed once the reply is known.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from openclaw_cli.proxy.api_call import ApiCall, ParsedRequest
from openclaw_cli.proxy.capture_handoff import build_exchange
from openclaw_cli.proxy.completion import SamplingRequest, assistant_message
from openclaw_cli.proxy.constraints import Sampled, capture_metadata
from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.proxy.live_stream import LiveChoice, guarded_frames, live_choices, split_stream
from openclaw_cli.proxy.openai_api import parse_constraints, parse_tools
from openclaw_cli.proxy.respond import ReplyFormat, answer, start_call
from openclaw_cli.proxy.response_store import KEEP_RESPONSES
from openclaw_cli.proxy.responses_convert import (
    CUSTOM_INPUT_KEY,
    chat_tool_choice,
    to_chat_messages,
    to_chat_tools,
)
from openclaw_cli.proxy.sse import KEEPALIVE_COMMENT, SSE_HEADERS, SSE_MEDIA_TYPE, event_frame
from openclaw_cli.proxy.state import ProxyState, proxy_state
from openclaw_cli.proxy.stream_open import OpenStream
from openclaw_cli.proxy.streaming import ContentPiece, Piece, ReasoningPiece, ToolCallPiece
from openclaw_cli.proxy.validation import check_counts, get_field, get_number, read_json_body
from openclaw_cli.types import ParsedAssistant, SampleResult, ToolCall

log = logging.getLogger("openclaw.proxy.responses")


@dataclass(kw_only=True)
class ResponsesRequest(ParsedRequest):
    custom_tools: frozenset[str]
    store: bool = True
    response_id: str = field(default_factory=lambda: "resp_" + uuid.uuid4().hex)
    created_at: int = field(default_factory=lambda: int(time.time()))


# -- request parsing -----------------------------------------------------------------------------------------------


def _text_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format`` (json_schema's name/schema moved under ``json_schema``)."""
    text = get_field(body, "text", dict) or {}
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise ProxyError(400, "text.format must be an object", param="text.format")
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema")}}
    return fmt


def parse_responses_request(body: dict[str, Any], state: ProxyState) -> ResponsesRequest:
    limits = state.settings.proxy
    model = state.catalog.resolve(get_field(body, "model", str, required=True))
    if "input" not in body and "previous_response_id" not in body:
        raise ProxyError(400, "missing required parameter 'input'", param="input")
    messages = to_chat_messages(body.get("instructions"), body.get("input", []))
    previous = get_field(body, "previous_response_id", str)
    if previous:
        earlier = state.responses.get(previous)
        if earlier is None:
            raise ProxyError(
                404,
                f"previous_response_id {previous!r} is not known: this server keeps the newest {KEEP_RESPONSES} "
                "responses created with store not false, in memory only; send the whole conversation as 'input'",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        # Instructions are not carried over from the earlier response (as on OpenAI's API): the new ones lead.
        system = [m for m in messages if m.get("role") == "system"][:1] if body.get("instructions") else []
        rest = messages[len(system) :]
        messages = [*system, *[m for m in earlier if m.get("role") != "system" or not system], *rest]
    if not messages:
        raise ProxyError(400, "'input' must contain at least one item", param="input")
    check_counts(
        {"messages": messages, "tools": body.get("tools") or []},
        max_messages=limits.max_messages,
        max_tools=limits.max_tools,
    )
    chat_tools, custom = to_chat_tools(body.get("tools"))
    chat_body: dict[str, Any] = {"tools": chat_tools, "tool_choice": chat_tool_choice(body.get("tool_choice"))}
    if "parallel_tool_calls" in body:
        chat_body["parallel_tool_calls"] = body["parallel_tool_calls"]
    fmt = _text_format(body)
    if fmt is not None:
        chat_body["response_format"] = fmt
    tools, tools_offered = parse_tools(chat_body)
    constraints = parse_constraints(chat_body, tools if tools_offered else None)
    sampling = SamplingRequest(
        max_tokens=get_number(body, "max_output_tokens", low=1, integer=True),
        temperature=get_number(body, "temperature", low=0, high=2),
        top_p=get_number(body, "top_p", low=0, high=1),
    )
    store = get_field(body, "store", bool)
    return ResponsesRequest(
        body=body,
        model=model,
        messages=messages,
        tools=tools,
        tools_offered=tools_offered,
        custom_tools=custom,
        sampling=sampling,
        stream=bool(get_field(body, "stream", bool)),
        store=store is not False,
        constraints=constraints,
    )


# -- response pieces -----------------------------------------------------------------------------------------------


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(req: ResponsesRequest, item_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    """A function call, or a custom tool call (its free-form input unwrapped from the ``input`` argument)."""
    done = status == "completed"
    if call.name in req.custom_tools:
        try:
            value = json.loads(call.arguments).get(CUSTOM_INPUT_KEY, "")
        except (ValueError, AttributeError):
            value = call.arguments
        return {
            "type": "custom_tool_call",
            "id": item_id,
            "call_id": call.id,
            "name": call.name,
            "input": str(value) if done else "",
            "status": status,
        }
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if done else "",
        "status": status,
    }


def output_items(req: ResponsesRequest, parsed: ParsedAssistant) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if parsed.reasoning:
        items.append(reasoning_item(_item_id("rs"), parsed.reasoning))
    if parsed.content:
        items.append(message_item(_item_id("msg"), parsed.content))
    items += [call_item(req, _item_id("fc"), call) for call in parsed.tool_calls]
    return items


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_body(
    req: ResponsesRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage_counts: dict[str, Any] | None,
    incomplete: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body = req.body
    return {
        "id": req.response_id,
        "object": "response",
        "created_at": req.created_at,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": req.model.requested,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "store": req.store,
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "usage": usage_counts,
        "metadata": body.get("metadata") or {},
    }


def finish_of(result: SampleResult, parsed: ParsedAssistant) -> tuple[str, str | None]:
    """(status, incomplete reason) of a finished reply."""
    if result.finish_reason == "length" and not parsed.tool_calls:
        return "incomplete", "max_output_tokens"
    return "completed", None


def response_headers(req: ResponsesRequest, version: int) -> dict[str, str]:
    return {"x-request-id": req.response_id, "x-openclaw-policy-version": str(version)}


def failed_body(req: ResponsesRequest, err: ProxyError) -> dict[str, Any]:
    return response_body(
        req,
        status="failed",
        output=[],
        usage_counts=None,
        error={"code": err.code or err.kind, "message": err.message},
    )


# -- endpoint ------------------------------------------------------------------------------------------------------


async def create_response(request: Request) -> Response:
    state = proxy_state(request)
    body = await read_json_body(request, state.settings.proxy.max_body_bytes)
    req = parse_responses_request(body, state)
    try:
        call = await start_call(request, state, req, api="responses", request_id=req.response_id)
    except ProxyError as err:
        if not (req.stream and err.code == "context_length_exceeded"):
            raise
        # Codex reads a context overflow from response.failed's error code (it then tells the user to compact).
        return StreamingResponse(
            _failed_stream(req, err),
            media_type=SSE_MEDIA_TYPE,
            headers={**SSE_HEADERS, "x-request-id": req.response_id},
        )
    return await answer(call, _REPLY)


async def _recorded_body(call: ApiCall[ResponsesRequest], sampled: list[Sampled]) -> tuple[dict[str, Any], int]:
    sample, req = sampled[0], call.req
    parsed = req.constraints.visible(sample.parsed)
    output = output_items(req, parsed)
    extra = capture_metadata(req.constraints, sample)
    body_out = await _finish(call, sample.result, parsed, output, stream=req.stream, extra=extra)
    return body_out, sample.result.version


async def _finish(
    call: ApiCall[ResponsesRequest],
    result: SampleResult,
    received: ParsedAssistant,
    output: list[dict[str, Any]],
    *,
    stream: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record the reply as the client receives it and keep its conversation for previous_response_id (store not
    false); returns the response body."""
    req, prepared = call.req, call.prepared
    status, incomplete = finish_of(result, received)
    body = response_body(
        req,
        status=status,
        output=output,
        usage_counts=usage(len(prepared.prompt_tokens), len(result.tokens)),
        incomplete=incomplete,
    )
    message = assistant_message(received)
    exchange = build_exchange(
        call,
        result=result,
        finish_reason="tool_calls" if received.tool_calls else ("length" if incomplete else "stop"),
        message=message,
        response=body,
        stream=stream,
        extra_metadata=extra,
    )
    await call.state.recorder.record(exchange)
    if req.store:
        call.state.responses.put(req.response_id, [*prepared.messages, message])
    return body


class _Events:
    """Numbered Responses stream events, and the open output item of a streamed reply."""

    def __init__(self, req: ResponsesRequest) -> None:
        self.req = req
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # finished output items, in order
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.open_text = ""

    def frame(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event_frame(kind, payload)

    def _index(self) -> int:
        return len(self.items)

    def start(self, item: dict[str, Any]) -> list[bytes]:
        frames = self.close()
        self.open, self.open_text = item, ""
        frames.append(self.frame("response.output_item.added", output_index=self._index(), item=item))
        if item["type"] == "message":
            frames.append(
                self.frame(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._index(),
                    content_index=0,
                    part=text_part(""),
                )
            )
        return frames

    def close(self) -> list[bytes]:
        """The .done events of the open item (its whole text known now) and output_item.done."""
        item = self.open
        if item is None:
            return []
        self.open = None
        index, text, ids = self._index(), self.open_text, {"item_id": item["id"], "output_index": self._index()}
        frames = []
        if item["type"] == "message":
            item = message_item(item["id"], text)
            frames.append(self.frame("response.output_text.done", **ids, content_index=0, text=text, logprobs=[]))
            frames.append(self.frame("response.content_part.done", **ids, content_index=0, part=text_part(text)))
        elif item["type"] == "reasoning":
            item = reasoning_item(item["id"], text)
            frames.append(self.frame("response.reasoning_text.done", **ids, content_index=0, text=text))
        frames.append(self.frame("response.output_item.done", output_index=index, item=item))
        self.items.append(item)
        return frames

    def piece(self, piece: Piece) -> list[bytes]:
        if isinstance(piece, ToolCallPiece):
            done = call_item(self.req, _item_id("fc"), piece.call)
            frames = self.start({**call_item(self.req, done["id"], piece.call, status="in_progress")})
            ids = {"item_id": done["id"], "output_index": self._index()}
            if done["type"] == "custom_tool_call":
                frames.append(self.frame("response.custom_tool_call_input.delta", **ids, delta=done["input"]))
                frames.append(self.frame("response.custom_tool_call_input.done", **ids, input=done["input"]))
            else:
                frames.append(self.frame("response.function_call_arguments.delta", **ids, delta=done["arguments"]))
                frames.append(self.frame("response.function_call_arguments.done", **ids, arguments=done["arguments"]))
            self.open = None
            frames.append(self.frame("response.output_item.done", output_index=self._index(), item=done))
            self.items.append(done)
            return frames
        kind = "reasoning" if isinstance(piece, ReasoningPiece) else "message"
        assert isinstance(piece, ReasoningPiece | ContentPiece)
        frames = []
        if self.open is None or self.open["type"] != kind:
            empty = (
                {"type": "reasoning", "id": _item_id("rs"), "summary": [], "content": []}
                if kind == "reasoning"
                else message_item(_item_id("msg"), "", status="in_progress")
            )
            frames = self.start(empty)
        assert self.open is not None
        self.open_text += piece.text
        ids = {"item_id": self.open["id"], "output_index": self._index(), "content_index": 0}
        delta_kind = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, list[Any]] = {} if kind == "reasoning" else {"logprobs": []}
        frames.append(self.frame(delta_kind, **ids, delta=piece.text, **extra))
        return frames


def _pieces_of(item: dict[str, Any], req: ResponsesRequest) -> list[Piece]:
    """A finished output item as the pieces a live stream would have produced (for replaying a buffered reply)."""
    if item["type"] == "reasoning":
        return [ReasoningPiece(item["content"][0]["text"])]
    if item["type"] == "message":
        return [ContentPiece(item["content"][0]["text"])]
    arguments = (
        json.dumps({CUSTOM_INPUT_KEY: item["input"]}, ensure_ascii=False)
        if item["type"] == "custom_tool_call"
        else item["arguments"]
    )
    return [ToolCallPiece(0, ToolCall(item["call_id"], item["name"], arguments))]


async def _replay_as_stream(req: ResponsesRequest, body: dict[str, Any]) -> AsyncIterator[bytes]:
    events = _Events(req)
    yield events.frame("response.created", response={**body, "status": "in_progress", "output": [], "usage": None})
    for item in body["output"]:
        for piece in _pieces_of(item, req):
            for frame in events.piece(piece):
                yield frame
    for frame in events.close():
        yield frame
    yield events.frame("response.completed", response=body)


async def _failed_stream(req: ResponsesRequest, err: ProxyError) -> AsyncIterator[bytes]:
    events = _Events(req)
    yield events.frame(
        "response.created", response=response_body(req, status="in_progress", output=[], usage_counts=None)
    )
    yield events.frame("response.failed", response=failed_body(req, err))


def _error_frame(req: ResponsesRequest, err: ProxyError) -> bytes:
    return _Events(req).frame("response.failed", response=failed_body(req, err))


def _sse(call: ApiCall[ResponsesRequest], stream: OpenStream) -> AsyncIterator[bytes]:
    req = call.req
    choices = live_choices(call.state.backend.tokenizer(), call.prepared, 1)
    events = _Events(req)  # one sequence_number count for the frames and a failure's frame

    def error_frame(err: ProxyError) -> bytes:
        return events.frame("response.failed", response=failed_body(req, err))

    frames = _frames(call, stream, choices, events)
    return guarded_frames(frames, call, stream=stream, choices=choices, error_frame=error_frame)


async def _frames(
    call: ApiCall[ResponsesRequest], stream: OpenStream, choices: list[LiveChoice], events: _Events
) -> AsyncGenerator[bytes, None]:
    req = call.req
    splitter = choices[0].splitter
    started = response_body(req, status="in_progress", output=[], usage_counts=None)
    yield events.frame("response.created", response=started)
    yield events.frame("response.in_progress", response=started)
    async for step in split_stream(stream, choices):
        if step is None:
            yield KEEPALIVE_COMMENT
            continue
        for piece in step.pieces:
            for frame in events.piece(piece):
                yield frame
        if step.result is not None:
            for frame in events.close():
                yield frame
            body = await _finish(call, step.result, splitter.result(), list(events.items), stream=True)
            yield events.frame("response.completed", response=body)


_REPLY = ReplyFormat(_sse, _recorded_body, _replay_as_stream, _error_frame, response_headers)

routes = [Route("/v1/responses", create_response, methods=["POST"])]
