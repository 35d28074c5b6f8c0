"""What a rollout hook sees and returns: the :class:`RolloutContext` in, a :class:`Trajectory` out.

A rollout plays one episode of an environment with the policy. It samples through ``ctx.policy`` (token ids and
log-probabilities straight from the backend, at the policy version fixed for the whole training step), renders
chats and parses tool calls with ``ctx.tokenizer``, draws the task from ``ctx.rng``, and returns the model turns it
took with a reward. Every sample made through ``ctx.policy`` is recorded, so ``ctx.trajectory(reward)`` builds the
trajectory from them.

Seeding (GRPO needs every member of a group to face the same task): ``ctx.rng`` is seeded from
``(seed, step, group)`` and so gives the same sequence to all ``group_size`` members of a group; the policy's
sampling seeds also include the member index and a call counter, so the members' samples differ.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from openclaw_cli.types import Message, ParsedAssistant, SampleResult, SamplingParams

if TYPE_CHECKING:
    from openclaw_cli.backend import Backend, ChatTokenizer


@dataclass
class ModelTurn:
    """One model call: the exact prompt and completion ids, the sampler's log-probabilities, the policy version.

    ``logprobs[i]`` is the policy's raw log-probability of ``completion_tokens[i]`` (what the importance ratio
    compares the learner against). ``reward`` is an optional per-turn reward set by the environment.
    """

    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    version: int
    text: str = ""
    finish_reason: str = "stop"
    reward: float | None = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.completion_tokens):
            raise ValueError(
                f"a turn needs one logprob per completion token: {len(self.logprobs)} logprobs, "
                f"{len(self.completion_tokens)} tokens"
            )


@dataclass
class Trajectory:
    """One episode. Its return is ``reward`` (the final reward) plus the sum of the turns' own rewards.

    ``solved`` feeds the "fraction solved" metric; when the environment leaves it unset, a return >= 1 counts as
    solved. ``info`` is free-form and shown nowhere but the metrics file.
    """

    turns: list[ModelTurn]
    reward: float | None = None
    solved: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def total_reward(self) -> float | None:
        """Final reward + per-turn rewards; None when the trajectory carries no reward at all."""
        turn_rewards = [t.reward for t in self.turns if t.reward is not None]
        if self.reward is None and not turn_rewards:
            return None
        return float(self.reward or 0.0) + float(sum(turn_rewards))

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.completion_tokens) for t in self.turns)


@dataclass
class ChatReply:
    """A sampled assistant reply: the recorded turn plus its parsed content and tool calls."""

    turn: ModelTurn
    parsed: ParsedAssistant

    @property
    def text(self) -> str:
        return self.turn.text

    @property
    def message(self) -> Message:
        """The reply as an OpenAI-style assistant message, ready to append to the conversation."""
        message: Message = {"role": "assistant", "content": self.parsed.content}
        if self.parsed.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.parsed.tool_calls
            ]
        if self.parsed.reasoning:
            message["reasoning_content"] = self.parsed.reasoning
        return message


@runtime_checkable
class Policy(Protocol):
    """The policy handle a rollout samples from; every sample is appended to :attr:`turns`."""

    version: int
    turns: list[ModelTurn]

    async def sample(
        self,
        prompt_tokens: list[int],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: Sequence[str] = (),
    ) -> ModelTurn: ...

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> ChatReply: ...


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (the same on every run and platform, unlike ``hash``)."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


class BackendPolicy:
    """:class:`Policy` over any :class:`~openclaw_cli.backend.Backend`, pinned to one policy version."""

    def __init__(
        self,
        backend: Backend,
        *,
        version: int,
        max_tokens: int,
        temperature: float,
        seed_parts: tuple[object, ...],
    ) -> None:
        self.backend = backend
        self.version = version
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.turns: list[ModelTurn] = []
        self._seed_parts = seed_parts
        self._calls = 0

    async def sample(
        self,
        prompt_tokens: list[int],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: Sequence[str] = (),
    ) -> ModelTurn:
        self._calls += 1
        params = SamplingParams(
            max_tokens=max_tokens or self.max_tokens,
            temperature=self.temperature if temperature is None else temperature,
            stop=tuple(stop),
            seed=derive_seed(*self._seed_parts, self._calls),
        )
        result: SampleResult = await self.backend.sample(list(prompt_tokens), params, version=self.version)
        turn = ModelTurn(
            prompt_tokens=list(prompt_tokens),
            completion_tokens=list(result.tokens),
            logprobs=list(result.logprobs),
            version=result.version,
            text=result.text,
            finish_reason=result.finish_reason,
        )
        self.turns.append(turn)
        return turn

    async def chat(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
    ) -> ChatReply:
        tokenizer = self.backend.tokenizer()
        prompt = tokenizer.render(messages, tools)
        turn = await self.sample(prompt, max_tokens=max_tokens, temperature=temperature)
        return ChatReply(turn=turn, parsed=parse_reply(tokenizer, turn.text, tools_offered=bool(tools)))


def parse_reply(tokenizer: ChatTokenizer, text: str, *, tools_offered: bool) -> ParsedAssistant:
    """Split a reply into content / tool calls / reasoning; without tools offered, everything stays content."""
    parsed = tokenizer.parse_assistant(text)
    if not tools_offered and parsed.tool_calls:
        return ParsedAssistant(content=text, reasoning=parsed.reasoning)
    return parsed


@dataclass
class RolloutContext:
    """Everything a rollout needs. ``rng`` is shared by the whole group (choose the task with it); ``env_args``
    are the ``--env-arg KEY=VALUE`` pairs (``train_env.env_args``)."""

    policy: Policy
    tokenizer: ChatTokenizer
    rng: random.Random
    seed: int
    step: int = 0
    group: int = 0
    member: int = 0
    env_args: dict[str, str] = field(default_factory=dict)

    def trajectory(
        self, reward: float | None = None, *, solved: bool | None = None, info: dict[str, Any] | None = None
    ) -> Trajectory:
        """The trajectory of every turn sampled through ``self.policy`` so far."""
        return Trajectory(turns=list(self.policy.turns), reward=reward, solved=solved, info=dict(info or {}))


RolloutFn = Callable[[RolloutContext], "Awaitable[Trajectory] | Trajectory"]
"""A rollout hook: ``async def rollout(ctx: RolloutContext) -> Trajectory``."""

RewardFn = Callable[[Trajectory], "Awaitable[float] | float"]
"""A reward hook: maps a finished trajectory to its return (replaces the trajectory's own rewards)."""
