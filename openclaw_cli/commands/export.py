"""``openclaw export``: captured turns as JSONL, one turn per line.

``--format messages`` gives each turn in OpenAI chat format (the prompt messages followed by the assistant reply)
with its session/turn ids, type, status, next state and reward; ``--format tokens`` gives the exact prompt and
completion token ids, the sampler's log-probs and the policy version: what training consumes. ``--owner ID`` keeps
one owner's turns (what an owner asking for their data gets, as `openclaw forget-owner` erases it).

With ``store.redact`` set (see :mod:`openclaw_cli.capture.redaction`), ``messages`` rows carry redacted text and
``tokens`` rows leave out the turns whose text holds an enabled kind (token ids cannot be redacted).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from openclaw_cli.capture.redaction import Redactor
from openclaw_cli.command_support import (
    EXIT_REFUSED,
    CliFailure,
    ConfigOption,
    OutputOption,
    SetOption,
    command_settings,
    open_existing_store,
)
from openclaw_cli.store import Store, TurnRecord


class ExportFormat(StrEnum):
    messages = "messages"
    tokens = "tokens"


class TurnTypeFilter(StrEnum):
    main = "main"
    side = "side"


@dataclass(frozen=True)
class ExportFilters:
    session_ids: tuple[str, ...] | None = None
    turn_type: str | None = None
    status: str | None = None
    since: float | None = None
    owner: str | None = None


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: float | None = None) -> float:
    """A start time as Unix seconds from: Unix seconds, an ISO date/datetime (no zone = local time), or an age
    such as ``30m``, ``2h``, ``7d``."""
    value = text.strip()
    relative = _RELATIVE.match(value.lower())
    if relative:
        now = time.time() if now is None else now
        return now - float(relative.group(1)) * _UNIT_SECONDS[relative.group(2)]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise ValueError(
            f"--since expects Unix seconds, an ISO date/time (2026-05-01, 2026-05-01T12:00) or an age (30m, 2h, 7d); "
            f"got {text!r}"
        ) from None


def messages_row(turn: TurnRecord) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session_id": turn.session_id,
        "turn_id": turn.id,
        "turn_index": turn.turn_index,
        "parent_turn_id": turn.parent_turn_id,
        "type": turn.turn_type,
        "status": turn.status,
        "reward": turn.reward,
        "version": turn.version,
        "model": turn.model,
        "api": turn.api,
        "finish_reason": turn.finish_reason,
        "created_at": turn.created_at,
        "messages": [*turn.messages, turn.assistant_message],
    }
    if turn.tools is not None:
        row["tools"] = turn.tools
    row["next_state"] = turn.next_state
    row["next_state_role"] = turn.next_state_role
    return row


def tokens_row(turn: TurnRecord) -> dict[str, Any]:
    return {
        "session_id": turn.session_id,
        "turn_id": turn.id,
        "turn_index": turn.turn_index,
        "type": turn.turn_type,
        "status": turn.status,
        "reward": turn.reward,
        "version": turn.version,
        "finish_reason": turn.finish_reason,
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": turn.completion_tokens,
        "logprobs": turn.logprobs,
        "sampling_logprobs": turn.sampling_logprobs,
    }


def export_turns(
    store: Store, fmt: ExportFormat, filters: ExportFilters, out: TextIO, *, redactor: Redactor | None = None
) -> int:
    """Write one JSON line per matching turn (id order); returns how many. With an enabled ``redactor``, message
    rows are redacted and token rows of turns holding a secret are left out."""
    to_row = messages_row if fmt is ExportFormat.messages else tokens_row
    count = 0
    for turn in store.iter_turns(
        session_ids=filters.session_ids,
        turn_type=filters.turn_type,
        status=filters.status,
        since=filters.since,
        owner=filters.owner,
    ):
        row = to_row(turn)
        if redactor is not None and redactor.enabled:
            if fmt is ExportFormat.tokens and redactor.kinds_in_turn(turn):
                continue
            row = redactor.redact_value(row) if fmt is ExportFormat.messages else row
        out.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")))
        out.write("\n")
        count += 1
    return count


@contextmanager
def _open_output(path: Path | None) -> Iterator[TextIO]:
    if path is None:
        yield sys.stdout
        return
    # The export holds whole conversations: owner-only, like the store itself.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        yield handle


def export_command(
    format: Annotated[
        ExportFormat, typer.Option("--format", "-f", help="messages: OpenAI chat format; tokens: token ids.")
    ] = ExportFormat.messages,
    out: OutputOption = None,
    session: Annotated[list[str] | None, typer.Option("--session", help="Only this session id (repeatable).")] = None,
    turn_type: Annotated[TurnTypeFilter | None, typer.Option("--type", help="Only main or side turns.")] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="Only turns in this status (pending, ready, …).")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only turns captured since: Unix seconds, ISO date/time, or 2h/7d.")
    ] = None,
    owner: Annotated[
        str | None, typer.Option("--owner", help="Only this owner's turns (key:<hash> or session:<id>).")
    ] = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Export captured turns as JSONL."""
    settings = command_settings(config, set_)
    try:
        filters = ExportFilters(
            session_ids=tuple(session) if session else None,
            turn_type=turn_type.value if turn_type is not None else None,
            status=status,
            since=parse_since(since) if since is not None else None,
            owner=owner,
        )
    except ValueError as exc:
        raise CliFailure(str(exc), EXIT_REFUSED) from None
    store = open_existing_store(settings)
    try:
        with _open_output(out) as handle:
            count = export_turns(store, format, filters, handle, redactor=Redactor.from_settings(settings))
    except OSError as exc:
        raise CliFailure(f"cannot write {out}: {exc}") from None
    finally:
        store.close()
    if out is not None:
        typer.echo(f"exported {count} turns to {out}", err=True)
