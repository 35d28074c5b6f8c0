"""The agent loop most tool-using environments need: reply -> run its tool calls -> feed results back -> repeat.

A tool that raises does not end the episode: its error becomes the tool result, as a real agent harness would show
it to the model. The loop ends when a reply makes no tool call (the agent's answer) or after ``max_turns`` replies.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from openclaw_cli.env_training.hooks import maybe_await
from openclaw_cli.env_training.rollout import ChatReply, RolloutContext
from openclaw_cli.types import Message, ToolCall

ToolRunner = Callable[[ToolCall], "Awaitable[str] | str"]
"""Runs one tool call and returns the text the model sees as the tool's result."""


@dataclass
class ToolLoopResult:
    messages: list[Message]  # the whole conversation, the replies and tool results included
    replies: list[ChatReply] = field(default_factory=list)
    tool_calls: int = 0
    answered: bool = False  # the last reply made no tool call (False: stopped by max_turns)

    @property
    def final(self) -> ChatReply:
        return self.replies[-1]


def function_tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI-style tool definition (what chat templates render into the prompt)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def call_arguments(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as a dict; ValueError (shown to the model as the tool result) when they are not."""
    try:
        value = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"arguments are not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ValueError("arguments must be a JSON object")
    return value


async def run_tool_loop(
    ctx: RolloutContext,
    messages: list[Message],
    tools: list[dict[str, Any]],
    run_tool: ToolRunner,
    *,
    max_turns: int,
) -> ToolLoopResult:
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    result = ToolLoopResult(messages=list(messages))
    for _ in range(max_turns):
        reply = await ctx.policy.chat(result.messages, tools)
        result.replies.append(reply)
        result.messages.append(reply.message)
        if not reply.parsed.tool_calls:
            result.answered = True
            break
        for call in reply.parsed.tool_calls:
            result.tool_calls += 1
            try:
                output = await maybe_await(run_tool(call))
            except Exception as exc:  # the model sees its tool failing, as in any agent harness
                output = f"error: {exc}"
            result.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": output})
    return result
