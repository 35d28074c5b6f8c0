"""One generation request on its way to an answer, as every API's reply writers, capture and stream guard see it.

Chat Completions, Responses and Messages each parse their body into a request of their own
(a :class:`ParsedRequest` with fields of its own); from then on the HTTP request, the proxy, the parsed request and
its rendered prompt travel together as one :class:`ApiCall`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from starlette.requests import Request

from openclaw_cli.capture import ApiKind
from openclaw_cli.proxy.completion import PreparedPrompt, SamplingRequest
from openclaw_cli.proxy.constraints import ReplyConstraints
from openclaw_cli.proxy.models import ResolvedModel
from openclaw_cli.proxy.state import ProxyState
from openclaw_cli.types import Message


@dataclass(kw_only=True)
class ParsedRequest:
    """What every API's parsed request carries for rendering, budgeting, answering and capture (each API's request
    adds its own fields)."""

    body: dict[str, Any]
    model: ResolvedModel
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    tools_offered: bool
    sampling: SamplingRequest
    stream: bool = False
    constraints: ReplyConstraints = field(default_factory=ReplyConstraints)
    started_at: float = field(default_factory=time.time)


R = TypeVar("R", bound=ParsedRequest)


@dataclass(frozen=True)
class ApiCall(Generic[R]):
    """A parsed request being answered: ``request_id`` is the id the API's reply carries (and capture records)."""

    api: ApiKind
    request_id: str
    request: Request
    state: ProxyState
    req: R
    prepared: PreparedPrompt
