"""The records the store reads and writes (turns, sessions, prefix matches, purge results) and their row mapping."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_cli.store.codec import loads_json, unpack_floats, unpack_ints


@dataclass
class NewTurn:
    """Everything one turn row needs; the session logic fills it, the store encodes it."""

    session_id: str
    parent_turn_id: int | None
    turn_index: int
    turn_type: str
    type_reason: str
    status: str
    api: str
    model: str
    stream: bool
    choice_index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    request: dict[str, Any]
    response: dict[str, Any]
    assistant_message: dict[str, Any]
    headers: dict[str, str]
    metadata: dict[str, Any]
    prompt_tokens: Sequence[int]
    completion_tokens: Sequence[int]
    logprobs: Sequence[float]
    sampling_logprobs: Sequence[float]
    version: int
    finish_reason: str
    started_at: float
    first_token_at: float
    finished_at: float
    created_at: float


@dataclass
class TurnRecord:
    id: int
    session_id: str
    parent_turn_id: int | None
    turn_index: int
    turn_type: str
    type_reason: str
    status: str
    api: str
    model: str
    stream: bool
    choice_index: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    request: dict[str, Any]
    response: dict[str, Any]
    assistant_message: dict[str, Any]
    headers: dict[str, str]
    metadata: dict[str, Any]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    sampling_logprobs: list[float]
    version: int
    finish_reason: str
    started_at: float
    first_token_at: float
    finished_at: float
    next_state: list[dict[str, Any]] | None
    next_state_role: str | None
    reward: float | None
    created_at: float
    ready_at: float | None


@dataclass
class SessionRecord:
    id: str
    scope: str
    id_source: str
    status: str
    parent_session_id: str | None
    fork_turn_id: int | None
    system_hash: bytes | None
    main_turns: int
    side_turns: int
    tail_turn_id: int | None
    created_at: float
    last_seen_at: float
    ended_at: float | None


@dataclass
class PrefixMatch:
    """A stored turn whose canonical history (messages + reply) equals a prefix of a new request."""

    hash: bytes
    turn_id: int
    session_id: str
    turn_type: str
    turn_index: int
    is_tail: bool  # the latest main turn of its session
    session_open: bool


TURN_COLUMNS = (
    "t.id, t.session_id, t.parent_turn_id, t.turn_index, t.turn_type, t.type_reason, t.status, t.api, t.model, "
    "t.stream, t.choice_index, d.messages, d.tools, d.request, d.request_messages_elided, d.response, "
    "d.assistant_message, d.headers, d.metadata, d.prompt_tokens, d.completion_tokens, d.logprobs, "
    "d.sampling_logprobs, t.version, t.finish_reason, t.started_at, t.first_token_at, t.finished_at, t.next_state, "
    "t.next_state_role, t.reward, t.created_at, t.ready_at"
)
TURN_FROM = "turns t JOIN turn_data d ON d.turn_id = t.id"
SESSION_COLUMNS = (
    "id, scope, id_source, status, parent_session_id, fork_turn_id, system_hash, main_turns, side_turns, "
    "tail_turn_id, created_at, last_seen_at, ended_at"
)


def turn_from_row(row: sqlite3.Row | tuple[Any, ...]) -> TurnRecord:
    (
        id_,
        session_id,
        parent_turn_id,
        turn_index,
        turn_type,
        type_reason,
        status,
        api,
        model,
        stream,
        choice_index,
        messages,
        tools,
        request,
        request_messages_elided,
        response,
        assistant_message,
        headers,
        metadata,
        prompt_tokens,
        completion_tokens,
        logprobs,
        sampling_logprobs,
        version,
        finish_reason,
        started_at,
        first_token_at,
        finished_at,
        next_state,
        next_state_role,
        reward,
        created_at,
        ready_at,
    ) = row
    messages_list = json.loads(messages)
    request_dict = json.loads(request)
    if request_messages_elided:
        request_dict["messages"] = json.loads(messages)  # a separate copy: callers may edit either
    return TurnRecord(
        id=id_,
        session_id=session_id,
        parent_turn_id=parent_turn_id,
        turn_index=turn_index,
        turn_type=turn_type,
        type_reason=type_reason,
        status=status,
        api=api,
        model=model,
        stream=bool(stream),
        choice_index=choice_index,
        messages=messages_list,
        tools=loads_json(tools),
        request=request_dict,
        response=json.loads(response),
        assistant_message=json.loads(assistant_message),
        headers=json.loads(headers),
        metadata=json.loads(metadata),
        prompt_tokens=unpack_ints(prompt_tokens),
        completion_tokens=unpack_ints(completion_tokens),
        logprobs=unpack_floats(logprobs),
        sampling_logprobs=unpack_floats(sampling_logprobs),
        version=version,
        finish_reason=finish_reason,
        started_at=started_at,
        first_token_at=first_token_at,
        finished_at=finished_at,
        next_state=loads_json(next_state),
        next_state_role=next_state_role,
        reward=reward,
        created_at=created_at,
        ready_at=ready_at,
    )


def session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    return SessionRecord(*row)


@dataclass(frozen=True)
class PurgeResult:
    turns: int
    sessions: int
