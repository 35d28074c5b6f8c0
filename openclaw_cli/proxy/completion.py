"""The API-neutral part of serving one chat request: render the prompt, budget the reply, sample, split the text.

Both API modules translate their request into OpenAI-format messages + tools + sampling knobs, call
:func:`prepare_prompt`, and then either :func:`sample_choices` (one reply) or :func:`open_streams` (token by token).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, cast

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backend import Backend, BackendError, ChatTokenizer
from openclaw_cli.lesson_prompt import LOCAL_OWNER, ActiveLesson
from openclaw_cli.proxy.errors import UNAVAILABLE_ERRORS, ProxyError, from_backend_exception
from openclaw_cli.proxy.state import BackendHealth
from openclaw_cli.tokenizer import THINK_OPEN, ChatTemplateError
from openclaw_cli.types import Message, ParsedAssistant, SampleResult, SamplingParams, StreamEvent, ToolCall


@dataclass
class SamplingRequest:
    """Sampling knobs as the client gave them (None = not given)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


@dataclass
class PreparedPrompt:
    # The client's conversation in OpenAI format (what capture stores and pairs sessions on); ``prompt_tokens`` is
    # rendered from it with ``lessons`` placed (see openclaw_cli.lesson_prompt) when there are any.
    messages: list[Message]
    tools: list[dict[str, Any]] | None  # tools shown to the model (None = none)
    tools_offered: bool  # whether tool calls are parsed out of the reply
    prompt_tokens: list[int]
    params: SamplingParams
    starts_in_reasoning: bool  # the rendered prompt ends inside an open <think>
    lessons: tuple[ActiveLesson, ...] = ()  # the owner's lessons placed in the prompt
    owner: str = LOCAL_OWNER  # whose lessons these are (never an API key itself)
    adapter: str = SHARED_ADAPTER  # whose weights serve it (openclaw_cli.adapters)


# Below this much message text a render takes ~0.2 ms: less than handing it to a worker thread and back costs (and
# that hop also contends for the GIL under load), so it runs inline.
_INLINE_RENDER_MAX_CHARS = 4096
# What a backend raises when it cannot sample: mapped to the caller's 5xx (or the 4xx the backend names).
SAMPLING_ERRORS: tuple[type[BaseException], ...] = (BackendError, *UNAVAILABLE_ERRORS)


def _small_enough_to_render_inline(messages: list[Message], tools: list[dict[str, Any]] | None) -> bool:
    if tools:
        return False
    total = 0
    for message in messages:
        content = message.get("content")
        if content is None:
            continue
        if not isinstance(content, str) or message.get("tool_calls"):
            return False
        total += len(content)
        if total > _INLINE_RENDER_MAX_CHARS:
            return False
    return True


async def render_prompt(backend: Backend, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[int]:
    """Render with the model's chat template; off the event loop unless the prompt is small (a 20k-token prompt
    takes a while)."""
    tokenizer = backend.tokenizer()
    try:
        if _small_enough_to_render_inline(messages, tools):
            return tokenizer.render(messages, tools or None)
        return await asyncio.to_thread(tokenizer.render, messages, tools or None)
    except ChatTemplateError as exc:
        raise ProxyError(400, str(exc), param="messages") from None


_PROBE_TOOL = {
    "type": "function",
    "function": {"name": "openclaw_probe", "description": "probe", "parameters": {"type": "object", "properties": {}}},
}


def template_drops_tools(tokenizer: ChatTokenizer) -> bool:
    """Whether the model's chat template leaves tools out of the prompt (SmolLM2's does): the model then never sees
    the client's tools, and the rendered prompt understates what the client sent. Checked once per tokenizer."""
    cached = getattr(tokenizer, "_openclaw_drops_tools", None)
    if cached is None:
        probe = [{"role": "user", "content": "hi"}]
        try:
            cached = tokenizer.render(probe, [_PROBE_TOOL]) == tokenizer.render(probe, None)
        except Exception:  # a template that refuses tools entirely drops them too
            cached = True
        with contextlib.suppress(AttributeError):  # a slotted tokenizer: checked again next time
            tokenizer._openclaw_drops_tools = cached  # type: ignore[attr-defined]
    return bool(cached)


def dropped_tool_tokens(tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None) -> int:
    """Tokens of the tools the template left out (0 when it renders them): what the client sent still counts against
    the context, so a request that overflows it says so instead of running on a prompt that lost its tools."""
    if not tools or not template_drops_tools(tokenizer):
        return 0
    return len(tokenizer.encode(json.dumps(tools, ensure_ascii=False)))


def output_cap(settings_cap: int | None, context_length: int) -> int:
    """``proxy.max_output_tokens``, or sized to the model: a quarter of its context window, at most 4096 tokens (an
    agent's 32k default on a small model would otherwise stream for many minutes)."""
    if settings_cap is not None:
        return settings_cap
    return max(1, min(4096, context_length // 4))


_MEDIA_PARTS = {
    "image_url": "an image",
    "image": "an image",
    "input_image": "an image",
    "input_audio": "audio",
    "audio": "audio",
    "input_file": "a file",
    "file": "a file",
}


def reject_media(tokenizer: ChatTokenizer, messages: list[Message]) -> None:
    """A text-only model (every tokenizer that does not list more ``input_modalities``) cannot read an image, audio
    or file part: say so with a 400 instead of silently replacing it by a placeholder."""
    accepted = set(getattr(tokenizer, "input_modalities", ("text",)))
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            what = _MEDIA_PARTS.get(kind) if isinstance(kind, str) else None
            modality = {"an image": "image", "audio": "audio", "a file": "file"}.get(what or "")
            if what is not None and modality not in accepted:
                raise ProxyError(
                    400,
                    f"messages[{i}].content[{j}] is {what} ({kind}), but the served model reads text only; send the "
                    "content as text or serve a model that accepts it",
                    param=f"messages[{i}].content[{j}]",
                    code="unsupported_content",
                )


async def prepare_prompt(
    backend: Backend,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    *,
    tools_offered: bool,
    sampling: SamplingRequest,
    default_max_tokens: int,
    max_output_tokens: int | None = None,
) -> PreparedPrompt:
    """Render and budget one request; never starts a generation that cannot finish sensibly.

    - The prompt's size counts the client's tools even when the chat template drops them
      (:func:`dropped_tool_tokens`).
    - A prompt that leaves no room at all is a 400 (``context_length_exceeded``), worded as Anthropic's API words it
      ("prompt is too long: N tokens > M maximum"): Claude Code parses exactly that to report the overflow and
      compact its conversation.
    - The reply budget is the client's max_tokens, capped by the server's :func:`output_cap`. When the client asked
      for a budget and prompt + budget does not fit, that is a 400 too ("input length and `max_tokens` exceed
      context limit: P + M > C", Anthropic's wording, which Claude Code reads to retry with a smaller budget).
      Without a client budget, ``default_max_tokens`` is capped by the room left.
    """
    tokenizer = backend.tokenizer()
    reject_media(tokenizer, messages)
    prompt = await render_prompt(backend, messages, tools)
    context = int(tokenizer.context_length)
    counted = len(prompt) + dropped_tool_tokens(tokenizer, tools)
    room = context - counted
    if room < 1:
        dropped = counted - len(prompt)
        note = (
            f" ({dropped} of them the client's tools, which this model's chat template leaves out)" if dropped else ""
        )
        raise ProxyError(
            400,
            f"prompt is too long: {counted} tokens > {context - 1} maximum{note} (the model's context window is "
            f"{context} tokens and at least 1 must be left for the reply); shorten the conversation",
            param="messages",
            code="context_length_exceeded",
        )
    cap = output_cap(max_output_tokens, context)
    if sampling.max_tokens is not None:
        budget = min(sampling.max_tokens, cap)
        if budget > room:
            raise ProxyError(
                400,
                f"input length and `max_tokens` exceed context limit: {counted} + {budget} > {context}, decrease "
                "input length or `max_tokens` and try again",
                param="max_tokens",
                code="context_length_exceeded",
            )
    else:
        budget = min(default_max_tokens, cap, room)
    try:
        params = SamplingParams(
            max_tokens=budget,
            temperature=1.0 if sampling.temperature is None else float(sampling.temperature),
            top_p=1.0 if sampling.top_p is None else float(sampling.top_p),
            top_k=-1 if sampling.top_k is None else int(sampling.top_k),
            stop=sampling.stop,
            seed=sampling.seed,
            top_logprobs=sampling.top_logprobs,
        )
    except ValueError as exc:
        raise ProxyError(400, str(exc)) from None
    return PreparedPrompt(
        messages=messages,
        tools=tools or None,
        tools_offered=tools_offered and bool(tools),
        prompt_tokens=prompt,
        params=params,
        starts_in_reasoning=_ends_in_open_think(tokenizer, prompt),
    )


def _ends_in_open_think(tokenizer: ChatTokenizer, prompt: list[int]) -> bool:
    tail = tokenizer.decode(prompt[-8:]).rstrip()
    return tail.endswith(THINK_OPEN)


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index`` of an n>1 request: a distinct seed per choice, so seeded choices are not all identical."""
    if index == 0 or params.seed is None:
        return params
    return SamplingParams(**{**params.__dict__, "seed": params.seed + index})


async def sample_choices(
    backend: Backend,
    prepared: PreparedPrompt,
    n: int,
    *,
    retry_after_s: int,
    health: BackendHealth | None = None,
) -> list[SampleResult]:
    """``n`` complete replies, sampled concurrently; a backend failure becomes the matching ProxyError (a backend
    that cannot be reached: 503/529, see :func:`~openclaw_cli.proxy.errors.from_backend_exception`)."""
    params = [choice_params(prepared.params, i) for i in range(n)]
    return await sample_with_params(backend, prepared, params, retry_after_s=retry_after_s, health=health)


async def sample_with_params(
    backend: Backend,
    prepared: PreparedPrompt,
    params: list[SamplingParams],
    *,
    retry_after_s: int,
    health: BackendHealth | None = None,
) -> list[SampleResult]:
    """One complete reply per entry of ``params``, sampled concurrently (errors mapped as in :func:`sample_choices`)."""
    calls = [backend.sample(prepared.prompt_tokens, p) for p in params]
    try:
        # One reply (nearly every request) is awaited in place: gather would wrap it in a task of its own.
        results = [await calls[0]] if len(calls) == 1 else list(await asyncio.gather(*calls))
    except SAMPLING_ERRORS as exc:
        if health is not None:
            health.failed(exc)
        raise from_backend_exception(exc, retry_after_s=retry_after_s) from None
    if health is not None:
        health.succeeded()
    return results


def open_streams(backend: Backend, prepared: PreparedPrompt, n: int) -> list[AsyncIterator[StreamEvent]]:
    return [backend.stream(prepared.prompt_tokens, choice_params(prepared.params, i)) for i in range(n)]


@lru_cache(maxsize=64)
def _accepts_tools_offered(tokenizer_type: type[Any]) -> bool:
    try:
        return "tools_offered" in inspect.signature(tokenizer_type.parse_assistant).parameters
    except (AttributeError, TypeError, ValueError):
        return False


def parser_for(tokenizer: ChatTokenizer, tools_offered: bool) -> Any:
    """``text -> ParsedAssistant``: the tokenizer's own parser, told whether tools were offered when it can be."""
    if _accepts_tools_offered(type(tokenizer)):
        return partial(cast(Any, tokenizer).parse_assistant, tools_offered=tools_offered)
    return tokenizer.parse_assistant


def split_completion(tokenizer: ChatTokenizer, text: str, tools_offered: bool) -> ParsedAssistant:
    return parser_for(tokenizer, tools_offered)(text)


def assistant_message(parsed: ParsedAssistant, calls: list[ToolCall] | None = None) -> Message:
    """The reply as an OpenAI assistant message: content None when the reply is only tool calls, as OpenAI does."""
    calls = parsed.tool_calls if calls is None else calls
    message: Message = {"role": "assistant", "content": parsed.content if parsed.content or not calls else None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    return message


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the JSON object Anthropic's ``tool_use.input`` must be (non-objects are wrapped)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}
