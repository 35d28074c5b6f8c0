"""Anthropic Messages: ``POST /v1/messages`` (plain and streamed) and ``POST /v1/messages/count_tokens``.

Accepted: model, max_tokens, messages (text / image / tool_use / tool_result / thinking / redacted_thinking
blocks), system (string or text blocks), tools (client tools with input_schema), tool_choice, stop_sequences,
temperature, top_p, top_k, metadata.user_id, stream, ``output_config.format`` (structured output: a JSON Schema;
also the earlier beta's top-level ``output_format``). ``thinking``, ``context_management``, ``output_config.effort``,
``cache_control`` and any other unknown field are accepted and ignored, as are the ``anthropic-version`` /
``anthropic-beta`` headers and a ``?beta=true`` query. ``tool_choice`` any / tool and the output format are
enforced by constrained decoding where the backend has it, else by checking and resampling (see
proxy/constraints.py); ``disable_parallel_tool_use`` by returning the first call. A checked request (or one that may
lose calls) with ``stream`` true gets the full event sequence, but only once the whole reply is known, with
keep-alives meanwhile when that takes longer than ``proxy.keepalive_s``.

A streamed reply is the full event sequence, token by token: ``message_start``, ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (``thinking_delta`` | ``text_delta`` | ``input_json_delta``) /
``content_block_stop``, then ``message_delta`` (stop_reason, stop_sequence, usage) and ``message_stop``. A failure
after the stream has started is sent as ``event: error``. Thinking blocks carry an empty ``signature``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openclaw_cli.proxy.anthropic_convert import (
    anthropic_tool_id,
    apply_tool_choice,
    to_openai_messages,
    to_openai_tools,
)
from openclaw_cli.proxy.api_call import ApiCall, ParsedRequest
from openclaw_cli.proxy.capture_handoff import build_exchange
from openclaw_cli.proxy.completion import (
    SamplingRequest,
    assistant_message,
    dropped_tool_tokens,
    render_prompt,
    tool_input,
)
from openclaw_cli.proxy.constraints import (
    ReplyConstraints,
    Sampled,
    capture_metadata,
    schema_error,
)
from openclaw_cli.proxy.errors import ProxyError, error_body
from openclaw_cli.proxy.live_stream import LiveChoice, guarded_frames, live_choices, split_stream
from openclaw_cli.proxy.respond import ReplyFormat, answer, start_call
from openclaw_cli.proxy.sse import event_frame
from openclaw_cli.proxy.state import ProxyState, proxy_state
from openclaw_cli.proxy.stream_open import OpenStream
from openclaw_cli.proxy.streaming import ContentPiece, Piece, ReasoningPiece, ToolCallPiece
from openclaw_cli.proxy.validation import check_counts, get_field, get_number, read_json_body, string_list
from openclaw_cli.types import Message, ParsedAssistant, SampleResult, ToolCall

log = logging.getLogger("openclaw.proxy.anthropic")
INT32_MAX = 2**31 - 1  # samplers take top_k as int32


@dataclass(kw_only=True)
class MessagesRequest(ParsedRequest):
    message_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])


def _conversation(body: dict[str, Any], state: ProxyState) -> tuple[list[Message], list[dict[str, Any]] | None, bool]:
    get_field(body, "messages", list, required=True)
    limits = state.settings.proxy
    check_counts(body, max_messages=limits.max_messages, max_tools=limits.max_tools)
    messages = to_openai_messages(body.get("system"), body["messages"])
    tools, offered = apply_tool_choice(to_openai_tools(body.get("tools")), body.get("tool_choice"))
    return messages, tools, offered


def parse_constraints(tools: list[dict[str, Any]] | None, choice: Any) -> ReplyConstraints:
    """What tool_choice demands of the reply (``choice`` was already checked by apply_tool_choice)."""
    if not isinstance(choice, dict) or not tools:
        return ReplyConstraints()
    names = frozenset(t["function"]["name"] for t in tools) if choice["type"] in ("any", "tool") else None
    return ReplyConstraints(
        tool_names=names,  # a "tool" choice left only the named tool in ``tools``
        single_tool_call=choice.get("disable_parallel_tool_use") is True,
        param="tool_choice",
    )


def parse_messages_request(body: dict[str, Any], state: ProxyState) -> MessagesRequest:
    model = state.catalog.resolve(get_field(body, "model", str, required=True))
    max_tokens = get_number(body, "max_tokens", low=1, integer=True)
    if max_tokens is None:
        raise ProxyError(400, "missing required parameter 'max_tokens'", param="max_tokens")
    messages, tools, offered = _conversation(body, state)
    metadata = get_field(body, "metadata", dict) or {}
    if metadata.get("user_id") is not None and not isinstance(metadata["user_id"], str):
        raise ProxyError(400, "metadata.user_id must be a string", param="metadata")
    top_k = get_number(body, "top_k", low=0, high=INT32_MAX, integer=True)
    sampling = SamplingRequest(
        max_tokens=int(max_tokens),
        temperature=get_number(body, "temperature", low=0, high=1),
        top_p=get_number(body, "top_p", low=0, high=1),
        top_k=int(top_k) if top_k else None,  # Anthropic's top_k 0 means "off", like our -1
        stop=tuple(string_list(body, "stop_sequences")),
    )
    return MessagesRequest(
        body=body,
        model=model,
        messages=messages,
        tools=tools,
        tools_offered=offered,
        sampling=sampling,
        stream=bool(get_field(body, "stream", bool)),
        constraints=_with_output_format(parse_constraints(tools if offered else None, body.get("tool_choice")), body),
    )


def _with_output_format(constraints: ReplyConstraints, body: dict[str, Any]) -> ReplyConstraints:
    """Add structured output: ``output_config.format`` (or the earlier beta's top-level ``output_format``), a JSON
    Schema the text reply must match. Other ``output_config`` keys (effort) are ignored."""
    config = get_field(body, "output_config", dict) or {}
    where = "output_config.format"
    fmt = config.get("format")
    if fmt is None and body.get("output_format") is not None:
        fmt, where = body["output_format"], "output_format"
    if fmt is None:
        return constraints
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise ProxyError(400, f"{where} must be {{'type': 'json_schema', 'schema': {{...}}}}", param=where)
    problem = schema_error(fmt["schema"])
    if problem is not None:
        raise ProxyError(400, f"{where}.schema is not a valid JSON Schema: {problem}", param=where)
    param = constraints.param if constraints.tool_names is not None else where  # the tool demand is checked first
    return replace(constraints, json_kind="schema", json_schema=fmt["schema"], param=param)


# -- response pieces -----------------------------------------------------------------------------------------------


def anthropic_calls(calls: list[ToolCall]) -> list[ToolCall]:
    """Calls with ``toolu_`` ids and arguments normalised to the exact JSON of the ``input`` object the client
    receives (so the stored assistant message matches what the client sends back next turn)."""
    return [
        ToolCall(anthropic_tool_id(c.id), c.name, json.dumps(tool_input(c.arguments), ensure_ascii=False))
        for c in calls
    ]


def stop_reason_for(result: SampleResult, parsed: ParsedAssistant) -> tuple[str, str | None]:
    if parsed.tool_calls:
        return "tool_use", None
    if result.finish_reason == "length":
        return "max_tokens", None
    if result.stop_sequence is not None:
        return "stop_sequence", result.stop_sequence
    return "end_turn", None


def content_blocks(parsed: ParsedAssistant, calls: list[ToolCall]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.content:
        blocks.append({"type": "text", "text": parsed.content})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)} for c in calls]
    return blocks


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_body(
    req: MessagesRequest,
    blocks: list[dict[str, Any]],
    stop: tuple[str | None, str | None],
    usage_counts: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": req.message_id,
        "type": "message",
        "role": "assistant",
        "model": req.model.requested,
        "content": blocks,
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": usage_counts,
    }


def response_headers(req: MessagesRequest, version: int) -> dict[str, str]:
    return {"request-id": req.message_id, "x-openclaw-policy-version": str(version)}


# -- endpoints -----------------------------------------------------------------------------------------------------


async def count_tokens(request: Request) -> JSONResponse:
    state = proxy_state(request)
    body = await read_json_body(request, state.settings.proxy.max_body_bytes)
    state.catalog.resolve(get_field(body, "model", str, required=True))
    messages, tools, _ = _conversation(body, state)
    prompt = await render_prompt(state.backend, messages, tools)
    # What prepare_prompt counts against the context: tools a template drops still count.
    return JSONResponse({"input_tokens": len(prompt) + dropped_tool_tokens(state.backend.tokenizer(), tools)})


async def create_message(request: Request) -> Response:
    state = proxy_state(request)
    body = await read_json_body(request, state.settings.proxy.max_body_bytes)
    req = parse_messages_request(body, state)
    call = await start_call(request, state, req, api="anthropic", request_id=req.message_id)
    return await answer(call, _REPLY)


async def _recorded_body(call: ApiCall[MessagesRequest], sampled: list[Sampled]) -> tuple[dict[str, Any], int]:
    """The message body for the one sample and the version that answered; recorded first."""
    sample = sampled[0]
    visible = call.req.constraints.visible(sample.parsed)
    extra = capture_metadata(call.req.constraints, sample)
    body_out = await _finish(call, sample.result, visible, stream=call.req.stream, extra=extra)
    return body_out, sample.result.version


async def _replay_as_stream(_req: MessagesRequest, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """A finished message as the streamed event sequence: message_start, ping, each content block whole
    (start / one delta / stop), message_delta, message_stop."""
    start = {**body, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**body["usage"], "output_tokens": 0}
    yield event_frame("message_start", {"type": "message_start", "message": start})
    yield event_frame("ping", {"type": "ping"})
    for index, block in enumerate(body["content"]):
        if block["type"] == "thinking":
            empty, delta = {**block, "thinking": ""}, {"type": "thinking_delta", "thinking": block["thinking"]}
        elif block["type"] == "text":
            empty, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            empty = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        yield event_frame(
            "content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}
        )
        yield event_frame("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield event_frame("content_block_stop", {"type": "content_block_stop", "index": index})
    usage_out = {"input_tokens": body["usage"]["input_tokens"], "output_tokens": body["usage"]["output_tokens"]}
    delta_out = {"stop_reason": body["stop_reason"], "stop_sequence": body["stop_sequence"]}
    yield event_frame("message_delta", {"type": "message_delta", "delta": delta_out, "usage": usage_out})
    yield event_frame("message_stop", {"type": "message_stop"})


class _Blocks:
    """Tracks the open content block of a streamed message and writes the start/stop events around deltas."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        frames = self.stop()
        self.index += 1
        self.open = kind
        frames.append(
            event_frame(
                "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
            )
        )
        return frames

    def delta(self, delta: dict[str, Any]) -> bytes:
        return event_frame("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event_frame("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def frames_for(self, piece: Piece) -> list[bytes]:
        if isinstance(piece, ReasoningPiece):
            frames = (
                []
                if self.open == "thinking"
                else self.start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            )
            return [*frames, self.delta({"type": "thinking_delta", "thinking": piece.text})]
        if isinstance(piece, ContentPiece):
            frames = [] if self.open == "text" else self.start("text", {"type": "text", "text": ""})
            return [*frames, self.delta({"type": "text_delta", "text": piece.text})]
        assert isinstance(piece, ToolCallPiece)
        (call,) = anthropic_calls([piece.call])
        frames = self.start("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        frames.append(self.delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return frames + self.stop()


def _error_frame(_req: MessagesRequest, err: ProxyError) -> bytes:
    return event_frame("error", error_body(err, "anthropic"))


def _sse(call: ApiCall[MessagesRequest], stream: OpenStream) -> AsyncIterator[bytes]:
    choices = live_choices(call.state.backend.tokenizer(), call.prepared, 1)
    error_frame = partial(_error_frame, call.req)
    return guarded_frames(_frames(call, stream, choices), call, stream=stream, choices=choices, error_frame=error_frame)


async def _frames(
    call: ApiCall[MessagesRequest], stream: OpenStream, choices: list[LiveChoice]
) -> AsyncGenerator[bytes, None]:
    splitter = choices[0].splitter
    blocks = _Blocks()
    n_prompt = len(call.prepared.prompt_tokens)
    start_message = message_body(call.req, [], (None, None), usage(n_prompt, 0))
    yield event_frame("message_start", {"type": "message_start", "message": start_message})
    yield event_frame("ping", {"type": "ping"})
    async for step in split_stream(stream, choices):
        if step is None:
            yield event_frame("ping", {"type": "ping"})
            continue
        for piece in step.pieces:
            for frame in blocks.frames_for(piece):
                yield frame
        if step.result is not None:
            for frame in blocks.stop():
                yield frame
            await _finish(call, step.result, splitter.result())
            stop_reason, stop_sequence = stop_reason_for(step.result, splitter.result())
            yield event_frame(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": {"input_tokens": n_prompt, "output_tokens": len(step.result.tokens)},
                },
            )
            yield event_frame("message_stop", {"type": "message_stop"})


async def _finish(
    call: ApiCall[MessagesRequest],
    result: SampleResult,
    received: ParsedAssistant,
    *,
    stream: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Record the reply as the client receives it (a stream: before its terminal events are sent); returns the
    message body."""
    calls = anthropic_calls(received.tool_calls)
    stop = stop_reason_for(result, received)
    n_prompt = len(call.prepared.prompt_tokens)
    body = message_body(call.req, content_blocks(received, calls), stop, usage(n_prompt, len(result.tokens)))
    message = assistant_message(received, calls)
    exchange = build_exchange(
        call,
        result=result,
        finish_reason=str(stop[0]),
        message=message,
        response=body,
        stream=stream,
        extra_metadata=extra,
    )
    await call.state.recorder.record(exchange)
    return body


_REPLY = ReplyFormat(_sse, _recorded_body, _replay_as_stream, _error_frame, response_headers)

routes = [
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/v1/messages", create_message, methods=["POST"]),
]
