"""OpenAI Chat Completions: ``POST /v1/chat/completions`` (plain and streamed) and ``GET /v1/models``.

Accepted: messages (string or content parts; system / developer / user / assistant / tool), tools, tool_choice,
parallel_tool_calls, temperature, top_p, top_k (a vLLM-style extension), max_tokens / max_completion_tokens, stop,
seed, n, logprobs / top_logprobs, stream + stream_options.include_usage, user. Unknown fields are ignored.

Known limits, by design:
- ``top_logprobs``: the k most likely tokens of the sampler's raw distribution at each position (the local backend
  reports them; a backend that cannot gives the sampled token alone). Log-probabilities are the policy's raw ones
  (temperature 1, no top-k/top-p), the values the trainer uses.
- ``tool_choice``: "none" hides the tools from the model; a named function shows the model only that tool;
  ``{"type": "allowed_tools", "allowed_tools": {"mode": "auto" | "required", "tools": [...]}}`` shows only the listed
  tools. "required" / a named function / allowed_tools with mode "required" and ``response_format`` json_object /
  json_schema are enforced by constrained decoding where the backend has it, else by checking and resampling (see
  proxy/constraints.py); ``parallel_tool_calls`` false by returning the first call. A request that is checked (or
  may lose calls) with ``stream`` true is answered as a stream, but only once the whole reply is known, with
  keep-alives meanwhile when that takes longer than ``proxy.keepalive_s`` (see buffered_stream.py).
- Other unknown fields are accepted and ignored.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from openclaw_cli.backend import ChatTokenizer
from openclaw_cli.proxy.api_call import ApiCall, ParsedRequest
from openclaw_cli.proxy.capture_handoff import build_exchange
from openclaw_cli.proxy.completion import (
    SamplingRequest,
    assistant_message,
    split_completion,
)
from openclaw_cli.proxy.constraints import (
    JsonKind,
    ReplyConstraints,
    Sampled,
    capture_metadata,
    schema_error,
)
from openclaw_cli.proxy.errors import ProxyError, error_body
from openclaw_cli.proxy.live_stream import LiveChoice, guarded_frames, live_choices, split_stream
from openclaw_cli.proxy.respond import ReplyFormat, answer, start_call
from openclaw_cli.proxy.sse import DONE_FRAME, KEEPALIVE_COMMENT, data_frame
from openclaw_cli.proxy.state import ProxyState, proxy_state
from openclaw_cli.proxy.stream_open import OpenStream
from openclaw_cli.proxy.streaming import ContentPiece, Piece, ReasoningPiece
from openclaw_cli.proxy.validation import check_counts, get_field, get_number, read_json_body, string_list
from openclaw_cli.types import Message, ParsedAssistant, SampleResult, TopLogprobs

log = logging.getLogger("openclaw.proxy.openai")

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_N = 16
MAX_TOP_LOGPROBS = 20
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1  # samplers take top_k as int32 and a seed as int64


@dataclass(kw_only=True)
class ChatRequest(ParsedRequest):
    n: int = 1
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    request_id: str = field(default_factory=lambda: "chatcmpl-" + uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


# -- request parsing -----------------------------------------------------------------------------------------------


def parse_messages(body: dict[str, Any]) -> list[Message]:
    raw = get_field(body, "messages", list, required=True)
    if not raw:
        raise ProxyError(400, "'messages' must contain at least one message", param="messages")
    messages: list[Message] = []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ProxyError(400, f"{where} must be an object", param=where)
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:  # (a list or object is not hashable: check the type first)
            raise ProxyError(400, f"{where}.role must be one of {', '.join(sorted(ROLES))}; got {role!r}", param=where)
        content = msg.get("content")
        if content is not None and not isinstance(content, str | list):
            raise ProxyError(400, f"{where}.content must be a string, an array of parts or null", param=where)
        if content is None and role != "assistant":
            raise ProxyError(400, f"{where}.content is required for role {role}", param=where)
        if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
            raise ProxyError(400, f"{where} (role tool) needs a string 'tool_call_id'", param=where)
        calls = msg.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list) and all(isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls)
        ):
            raise ProxyError(400, f"{where}.tool_calls must be an array of function calls", param=where)
        # Chat templates know "system", not OpenAI's newer "developer" role (same meaning).
        messages.append({**msg, "role": "system"} if role == "developer" else dict(msg))
    return messages


def parse_tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, bool]:
    """(tools to show the model, whether to parse tool calls from the reply) after applying tool_choice."""
    tools = get_field(body, "tools", list) or []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ProxyError(400, f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", param="tools")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ProxyError(400, f"tools[{i}].function.name must be a non-empty string", param="tools")
    choice = body.get("tool_choice")
    if choice is None or choice in ("auto", "required"):
        return (tools or None), bool(tools)
    if choice == "none":
        return None, False
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = _allowed_tool_names(choice, tools)
        return [t for t in tools if t["function"]["name"] in allowed], True
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise ProxyError(400, f"tool_choice names function {name!r}, which is not in 'tools'", param="tool_choice")
        return chosen, True
    raise ProxyError(
        400,
        "tool_choice must be 'none', 'auto', 'required', {'type': 'function', ...} or {'type': 'allowed_tools', ...}",
        param="tool_choice",
    )


def _allowed_tool_names(choice: dict[str, Any], tools: list[dict[str, Any]]) -> frozenset[str]:
    """The names an ``{"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`` choice lets the model call."""
    allowed = choice.get("allowed_tools")
    shape = "tool_choice.allowed_tools must be {'mode': 'auto' | 'required', 'tools': [{'type': 'function', ...}]}"
    if not isinstance(allowed, dict) or allowed.get("mode") not in ("auto", "required"):
        raise ProxyError(400, shape, param="tool_choice")
    refs = allowed.get("tools")
    if not isinstance(refs, list) or not refs:
        raise ProxyError(400, shape + " with at least one tool", param="tool_choice")
    names: set[str] = set()
    for i, ref in enumerate(refs):
        fn = ref.get("function") if isinstance(ref, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ProxyError(
                400,
                f"tool_choice.allowed_tools.tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                param="tool_choice",
            )
        names.add(name)
    missing = sorted(names - {t["function"]["name"] for t in tools})
    if missing:
        raise ProxyError(
            400, f"tool_choice.allowed_tools names {missing[0]!r}, which is not in 'tools'", param="tool_choice"
        )
    return frozenset(names)


def parse_response_format(body: dict[str, Any]) -> tuple[JsonKind | None, dict[str, Any] | None]:
    """(JSON kind the reply must be: None / "object" / "schema", the schema if one was given). A json_object with a
    ``schema`` (the form Together, Fireworks and instructor's JSON_SCHEMA mode send) is held to that schema."""
    fmt = get_field(body, "response_format", dict)
    if fmt is None or fmt.get("type") == "text":
        return None, None
    if fmt.get("type") == "json_object":
        if fmt.get("schema") is None:
            return "object", None
        return "schema", _checked_schema(fmt["schema"], "response_format.schema")
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ProxyError(
                400, "response_format.json_schema must be an object with a 'name'", param="response_format"
            )
        schema = spec.get("schema")
        return "schema", None if schema is None else _checked_schema(schema, "response_format.json_schema.schema")
    raise ProxyError(
        400, "response_format.type must be 'text', 'json_object' or 'json_schema'", param="response_format"
    )


def _checked_schema(schema: Any, where: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise ProxyError(400, f"{where} must be an object", param="response_format")
    problem = schema_error(schema)
    if problem is not None:
        raise ProxyError(400, f"{where} is not a valid JSON Schema: {problem}", param="response_format")
    return schema


def parse_constraints(body: dict[str, Any], tools: list[dict[str, Any]] | None) -> ReplyConstraints:
    """What the reply must be, from tool_choice (after parse_tools), parallel_tool_calls and response_format."""
    choice = body.get("tool_choice")
    names: frozenset[str] | None = None
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        must_call = choice["allowed_tools"]["mode"] == "required"  # (checked by parse_tools)
    else:
        must_call = choice == "required" or isinstance(choice, dict)
    if tools and must_call:
        names = frozenset(t["function"]["name"] for t in tools)  # a named / allowed choice left only those in ``tools``
    json_kind, schema = parse_response_format(body)
    return ReplyConstraints(
        tool_names=names,
        single_tool_call=get_field(body, "parallel_tool_calls", bool) is False,
        json_kind=json_kind,
        json_schema=schema,
        param="tool_choice" if names is not None else ("response_format" if json_kind else None),
    )


def parse_chat_request(body: dict[str, Any], state: ProxyState) -> ChatRequest:
    limits = state.settings.proxy
    check_counts(body, max_messages=limits.max_messages, max_tools=limits.max_tools)
    model = state.catalog.resolve(get_field(body, "model", str, required=True))
    messages = parse_messages(body)
    tools, tools_offered = parse_tools(body)
    constraints = parse_constraints(body, tools if tools_offered else None)
    max_tokens = get_number(body, "max_completion_tokens", low=1, integer=True)
    if max_tokens is None:
        max_tokens = get_number(body, "max_tokens", low=1, integer=True)
    sampling = SamplingRequest(
        max_tokens=max_tokens,
        temperature=get_number(body, "temperature", low=0, high=2),
        top_p=get_number(body, "top_p", low=0, high=1),
        top_k=get_number(body, "top_k", low=-INT32_MAX, high=INT32_MAX, integer=True),
        stop=tuple(string_list(body, "stop", max_items=4)),
        seed=get_number(body, "seed", low=-INT64_MAX - 1, high=INT64_MAX - MAX_N, integer=True),
    )
    stream_options = get_field(body, "stream_options", dict) or {}
    logprobs = bool(get_field(body, "logprobs", bool))
    top_logprobs = get_number(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS, integer=True) or 0
    if top_logprobs and not logprobs:
        raise ProxyError(400, "'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    sampling.top_logprobs = int(top_logprobs)
    get_field(body, "user", str)
    return ChatRequest(
        body=body,
        model=model,
        messages=messages,
        tools=tools,
        tools_offered=tools_offered,
        sampling=sampling,
        n=int(get_number(body, "n", low=1, high=MAX_N, integer=True) or 1),
        stream=bool(get_field(body, "stream", bool)),
        include_usage=bool(stream_options.get("include_usage")),
        logprobs=logprobs,
        top_logprobs=int(top_logprobs),
        constraints=constraints,
    )


# -- response pieces -----------------------------------------------------------------------------------------------


def finish_reason_for(result: SampleResult, parsed: ParsedAssistant) -> str:
    if parsed.tool_calls:
        return "tool_calls"
    return "length" if result.finish_reason == "length" else "stop"


def _token_entry(tokenizer: ChatTokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.decode([token_id])
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def logprob_entry(
    tokenizer: ChatTokenizer, token_id: int, logprob: float, top_n: int, alternatives: TopLogprobs | None = None
) -> dict[str, Any]:
    """One token's logprobs entry: the sampled token and its ``top_n`` most likely alternatives from the sampler's
    raw distribution. A backend that reports no alternatives gives the sampled token alone as the top list."""
    entry = _token_entry(tokenizer, token_id, logprob)
    if top_n <= 0:
        return {**entry, "top_logprobs": []}
    if alternatives:
        return {**entry, "top_logprobs": [_token_entry(tokenizer, t, lp) for t, lp in alternatives[:top_n]]}
    return {**entry, "top_logprobs": [dict(entry)]}


def logprob_entries(tokenizer: ChatTokenizer, result: SampleResult, top_n: int) -> list[dict[str, Any]]:
    eos = set(tokenizer.eos_token_ids)
    tops = result.top_logprobs if len(result.top_logprobs) == len(result.tokens) else [None] * len(result.tokens)
    return [
        logprob_entry(tokenizer, t, lp, top_n, alternatives)
        for t, lp, alternatives in zip(result.tokens, result.logprobs, tops, strict=False)
        if t not in eos
    ]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    req: ChatRequest, version: int, choices: list[dict[str, Any]], usage_counts: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": req.created,
        "model": req.model.requested,
        "system_fingerprint": f"openclaw-v{version}",
        "choices": choices,
        "usage": usage_counts,
    }


def response_headers(req: ChatRequest, version: int) -> dict[str, str]:
    return {"x-request-id": req.request_id, "x-openclaw-policy-version": str(version)}


# -- endpoints -----------------------------------------------------------------------------------------------------


async def list_models(request: Request) -> JSONResponse:
    return JSONResponse(proxy_state(request).catalog.listing())


async def get_model(request: Request) -> JSONResponse:
    return JSONResponse(proxy_state(request).catalog.entry(request.path_params["model_id"]))


async def chat_completions(request: Request) -> Response:
    state = proxy_state(request)
    body = await read_json_body(request, state.settings.proxy.max_body_bytes)
    req = parse_chat_request(body, state)
    call = await start_call(request, state, req, api="openai", request_id=req.request_id)
    return await answer(call, _REPLY, n=req.n)


async def _recorded_body(call: ApiCall[ChatRequest], sampled: list[Sampled]) -> tuple[dict[str, Any], int]:
    """The completion body for ``sampled`` and the version that answered; each choice recorded first."""
    req = call.req
    tokenizer = call.state.backend.tokenizer()
    choices = []
    for i, sample in enumerate(sampled):
        parsed = req.constraints.visible(sample.parsed)
        finish, message = finish_reason_for(sample.result, parsed), assistant_message(parsed)
        lp = {"content": logprob_entries(tokenizer, sample.result, req.top_logprobs)} if req.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": finish})
    version = sampled[0].result.version
    total = usage(len(call.prepared.prompt_tokens), sum(len(s.result.tokens) for s in sampled))
    body = completion_body(req, version, choices, total)
    for choice, sample in zip(choices, sampled, strict=True):
        extra = capture_metadata(req.constraints, sample)
        await _record_choice(call, sample.result, choice, stream=req.stream, extra=extra)
    return body, version


async def _replay_as_stream(req: ChatRequest, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """A finished completion as chat.completion.chunk events: per choice the role, reasoning, content, each tool
    call, then the finish reason; the usage chunk when asked for; [DONE]."""
    base = {k: body[k] for k in ("id", "created", "model", "system_fingerprint")} | {"object": "chat.completion.chunk"}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        payload: dict[str, Any] = {
            **base,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }
        if req.include_usage:
            payload["usage"] = None
        return data_frame(payload)

    for choice in body["choices"]:
        index, message = choice["index"], choice["message"]
        yield chunk(index, {"role": "assistant", "content": ""})
        if message.get("reasoning_content"):
            yield chunk(index, {"reasoning_content": message["reasoning_content"]})
        if message.get("content"):
            yield chunk(index, {"content": message["content"]})
        for k, call in enumerate(message.get("tool_calls") or []):
            yield chunk(index, {"tool_calls": [{"index": k, **call}]})
        yield chunk(index, {}, choice["finish_reason"], choice["logprobs"])
    if req.include_usage:
        yield data_frame({**base, "choices": [], "usage": body["usage"]})
    yield DONE_FRAME


class _ChunkWriter:
    """``chat.completion.chunk`` frames for each choice; a frame carries the log-prob entries gathered for its choice
    since the last one."""

    def __init__(self, req: ChatRequest, version: int) -> None:
        self.req = req
        self.version = version
        self.logprobs: list[list[dict[str, Any]]] = [[] for _ in range(req.n)]

    def chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        req = self.req
        pending, self.logprobs[index] = self.logprobs[index], []
        payload: dict[str, Any] = {
            "id": req.request_id,
            "object": "chat.completion.chunk",
            "created": req.created,
            "model": req.model.requested,
            "system_fingerprint": f"openclaw-v{self.version}",
            "choices": [
                {
                    "index": index,
                    "delta": delta,
                    "logprobs": {"content": pending} if req.logprobs and (pending or finish) else None,
                    "finish_reason": finish,
                }
            ],
        }
        if req.include_usage:
            payload["usage"] = None
        return data_frame(payload)


def _error_frame(_req: ChatRequest, err: ProxyError) -> bytes:
    return data_frame(error_body(err, "openai"))


def _sse(call: ApiCall[ChatRequest], stream: OpenStream) -> AsyncIterator[bytes]:
    choices = live_choices(call.state.backend.tokenizer(), call.prepared, call.req.n)
    error_frame = partial(_error_frame, call.req)
    return guarded_frames(_frames(call, stream, choices), call, stream=stream, choices=choices, error_frame=error_frame)


async def _frames(
    call: ApiCall[ChatRequest], stream: OpenStream, choices: list[LiveChoice]
) -> AsyncGenerator[bytes, None]:
    req = call.req
    tokenizer = call.state.backend.tokenizer()
    eos = set(tokenizer.eos_token_ids)
    writer = _ChunkWriter(req, stream.version)
    results: dict[int, SampleResult] = {}
    for i in range(req.n):
        yield writer.chunk(i, {"role": "assistant", "content": ""})
    async for step in split_stream(stream, choices):
        if step is None:
            yield KEEPALIVE_COMMENT
            continue
        index, token = step.index, step.token
        if token is not None:
            writer.version = token.version
            if req.logprobs and token.token_id not in eos:
                writer.logprobs[index].append(
                    logprob_entry(tokenizer, token.token_id, token.logprob, req.top_logprobs, token.top_logprobs)
                )
        for piece in step.pieces:
            yield writer.chunk(index, _delta(piece))
        if step.result is not None:
            writer.version = step.result.version
            results[index] = step.result
            received = choices[index].splitter.result()
            finish = finish_reason_for(step.result, received)
            await _record_streamed(call, step.result, received, finish, index)
            yield writer.chunk(index, {}, finish)
    if req.include_usage:
        counts = usage(len(call.prepared.prompt_tokens), sum(len(r.tokens) for r in results.values()))
        yield data_frame({**_usage_chunk_base(req, writer.version), "usage": counts})
    yield DONE_FRAME


async def _record_streamed(
    call: ApiCall[ChatRequest], result: SampleResult, received: ParsedAssistant, finish: str, index: int
) -> None:
    req = call.req
    tokenizer = call.state.backend.tokenizer()
    if log.isEnabledFor(logging.DEBUG):
        reparsed = split_completion(tokenizer, result.text, call.prepared.tools_offered)
        if (reparsed.content, reparsed.reasoning) != (received.content, received.reasoning):
            log.debug("stream %s: streamed split differs from parse_assistant (documented edge case)", req.request_id)
    message = assistant_message(received)
    lp = {"content": logprob_entries(tokenizer, result, req.top_logprobs)} if req.logprobs else None
    choice = {"index": index, "message": message, "logprobs": lp, "finish_reason": finish}
    await _record_choice(call, result, choice, stream=True)


async def _record_choice(
    call: ApiCall[ChatRequest],
    result: SampleResult,
    choice: dict[str, Any],
    *,
    stream: bool,
    extra: dict[str, Any] | None = None,
) -> None:
    """Record one choice as its own turn, with the single-choice completion body it would have been answered with."""
    counts = usage(len(call.prepared.prompt_tokens), len(result.tokens))
    single = completion_body(call.req, result.version, [choice], counts)
    exchange = build_exchange(
        call,
        result=result,
        finish_reason=choice["finish_reason"],
        message=choice["message"],
        response=single,
        stream=stream,
        choice_index=choice["index"],
        extra_metadata=extra,
    )
    await call.state.recorder.record(exchange)


def _usage_chunk_base(req: ChatRequest, version: int) -> dict[str, Any]:
    return {
        "id": req.request_id,
        "object": "chat.completion.chunk",
        "created": req.created,
        "model": req.model.requested,
        "system_fingerprint": f"openclaw-v{version}",
        "choices": [],
    }


def _delta(piece: Piece) -> dict[str, Any]:
    if isinstance(piece, ContentPiece):
        return {"content": piece.text}
    if isinstance(piece, ReasoningPiece):
        return {"reasoning_content": piece.text}
    call = piece.call
    return {
        "tool_calls": [
            {
                "index": piece.index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ]
    }


_REPLY = ReplyFormat(_sse, _recorded_body, _replay_as_stream, _error_frame, response_headers)

routes = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", get_model, methods=["GET"]),
]
