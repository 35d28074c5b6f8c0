"""The hand-off from the proxy (serving loop) to the store (collection loop).

The proxy builds one :class:`CapturedExchange` per completed reply and hands it to a :class:`CaptureSink`; the
sink decides the session and the turn type (main / side), pairs the previous main-line turn with its next state,
and persists everything in one transaction. The proxy never re-tokenizes: the token ids here are the ones the
backend sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from openclaw_cli.types import Message

ApiKind = Literal["openai", "anthropic", "responses"]
TurnType = Literal["main", "side"]


@dataclass
class CapturedExchange:
    api: ApiKind
    headers: dict[str, str]  # lower-cased names, secrets already removed (openclaw_cli.secrets_scrub)
    request: dict[str, Any]  # the JSON body as the client sent it
    messages: list[Message]  # the conversation in OpenAI chat format (system first if any), tools excluded
    tools: list[dict[str, Any]] | None  # OpenAI-format tool definitions offered to the model
    model: str  # model name the client asked for
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]  # policy log-probs of completion_tokens (see SampleResult)
    sampling_logprobs: list[float]
    version: int  # policy version that produced the reply
    finish_reason: str  # the API-level reason the client saw (stop, length, tool_calls / end_turn, …)
    assistant_message: Message  # the reply as an OpenAI assistant message (content, tool_calls, reasoning)
    response: dict[str, Any]  # the response body the client received (for streams: the assembled equivalent)
    started_at: float
    first_token_at: float
    finished_at: float
    stream: bool = False
    choice_index: int = 0  # n > 1: one exchange per choice; only choice 0 may be main-line
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RecordedTurn:
    session_id: str
    turn_id: int
    turn_type: TurnType
    turn_index: int  # position on its main line (side turns: -1)


class CaptureSink(Protocol):
    async def record(self, exchange: CapturedExchange) -> RecordedTurn:
        """Persist atomically; after it returns the exchange survives a crash."""
