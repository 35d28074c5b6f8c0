"""The records the store reads and writes (turns, sessions, prefix matches, purge results) and their row mapping."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from openclaw_cli.store.codec import dumps_json, loads_json, pack_floats, pack_ints, unpack_floats, unpack_ints


@dataclass
class TurnFields:
    """The fields a turn is written with, in the store's column order (what :class:`NewTurn` and
    :class:`TurnRecord` share)."""

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


@dataclass
class NewTurn(TurnFields):
    """Everything one turn row needs; the session logic fills it, the store encodes it."""

    created_at: float


@dataclass
class TurnRecord(TurnFields):
    """A stored turn as read back: its id, the arrays as lists, and what the loops added (next state, reward)."""

    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    sampling_logprobs: list[float]
    next_state: list[dict[str, Any]] | None
    next_state_role: str | None
    reward: float | None
    created_at: float
    ready_at: float | None
    id: int


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


# Fields kept in turn_data (written once) rather than in turns (small, the fields that change).
_TURN_DATA_FIELDS = frozenset(
    {
        "messages",
        "tools",
        "request",
        "response",
        "assistant_message",
        "headers",
        "metadata",
        "prompt_tokens",
        "completion_tokens",
        "logprobs",
        "sampling_logprobs",
    }
)
_DECODE: dict[str, Callable[[Any], Any]] = {
    "stream": bool,
    "messages": json.loads,
    "tools": loads_json,
    "request": json.loads,
    "response": json.loads,
    "assistant_message": json.loads,
    "headers": json.loads,
    "metadata": json.loads,
    "prompt_tokens": unpack_ints,
    "completion_tokens": unpack_ints,
    "logprobs": unpack_floats,
    "sampling_logprobs": unpack_floats,
    "next_state": loads_json,
}
_TURN_FIELD_NAMES = tuple(f.name for f in fields(TurnFields))  # once: new_turn_rows runs on every capture
_ENCODE: dict[str, Callable[[Any], Any]] = {
    "stream": int,
    "messages": dumps_json,
    "tools": lambda tools: None if tools is None else dumps_json(tools),
    "request": dumps_json,
    "response": dumps_json,
    "assistant_message": dumps_json,
    "headers": dumps_json,
    "metadata": dumps_json,
    "prompt_tokens": pack_ints,
    "completion_tokens": pack_ints,
    "logprobs": pack_floats,
    "sampling_logprobs": pack_floats,
}


def new_turn_rows(turn: NewTurn, **replaced: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A new turn's ``turns`` and ``turn_data`` columns, encoded, from :class:`TurnFields`' one field list (the read
    side below follows the same list); ``replaced`` overrides fields before encoding (the store passes scrubbed
    copies). The ``turns`` row also gets the token counts and ``created_at``; ``ready_at`` and ``ready_seq`` are the
    caller's (they depend on the transaction)."""
    turns: dict[str, Any] = {}
    data: dict[str, Any] = {}
    for name in _TURN_FIELD_NAMES:
        value = replaced[name] if name in replaced else getattr(turn, name)
        encoded = _ENCODE[name](value) if name in _ENCODE else value
        (data if name in _TURN_DATA_FIELDS else turns)[name] = encoded
    turns.update(
        n_prompt_tokens=len(turn.prompt_tokens),
        n_completion_tokens=len(turn.completion_tokens),
        created_at=turn.created_at,
    )
    return turns, data


# Each column a turn is read with: (table alias, name), in TurnRecord's order plus the storage-only flag that says
# the request's messages were stored once, in turn_data.messages. Columns and decoding both follow this one list.
_TURN_READ: tuple[tuple[str, str], ...] = (
    ("t", "id"),  # first: claim and purge queries read a row's id as row[0]
    *(("d" if f.name in _TURN_DATA_FIELDS else "t", f.name) for f in fields(TurnFields)),
    ("d", "request_messages_elided"),
    ("t", "next_state"),
    ("t", "next_state_role"),
    ("t", "reward"),
    ("t", "created_at"),
    ("t", "ready_at"),
)
TURN_COLUMNS = ", ".join(f"{table}.{name}" for table, name in _TURN_READ)
TURN_FROM = "turns t JOIN turn_data d ON d.turn_id = t.id"
SESSION_COLUMNS = (
    "id, scope, id_source, status, parent_session_id, fork_turn_id, system_hash, main_turns, side_turns, "
    "tail_turn_id, created_at, last_seen_at, ended_at"
)


def turn_from_row(row: sqlite3.Row | tuple[Any, ...]) -> TurnRecord:
    values = {name: value for (_, name), value in zip(_TURN_READ, row, strict=True)}
    elided = values.pop("request_messages_elided")
    decoded = {name: _DECODE[name](value) if name in _DECODE else value for name, value in values.items()}
    if elided:
        decoded["request"]["messages"] = json.loads(values["messages"])  # a separate copy: callers may edit either
    return TurnRecord(**decoded)


def session_from_row(row: tuple[Any, ...]) -> SessionRecord:
    return SessionRecord(*row)


@dataclass(frozen=True)
class PurgeResult:
    turns: int
    sessions: int
