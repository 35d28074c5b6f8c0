"""Chat rendering and completion parsing with the model's own Hugging Face tokenizer and chat template.

Shared by every backend: the exact prompt ids a backend samples from come from :meth:`HFChatTokenizer.render`,
and tool calls / reasoning are split out of the completion text by :meth:`HFChatTokenizer.parse_assistant`, which
knows the formats models actually emit:

- Hermes/Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one block per call; SmolLM2 puts a
  JSON list inside one block);
- Llama 3.x: the whole reply is ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``);
- reasoning in ``<think>…</think>`` (Qwen3, DeepSeek-R1 style).

JSON is read with a real decoder (``json.JSONDecoder.raw_decode``), never by regex.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from openclaw_cli.types import Message, ParsedAssistant, ToolCall

TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
DEFAULT_CONTEXT_LENGTH = 8192


class ChatTemplateError(ValueError):
    """The messages cannot be rendered by this model's template (the message says why)."""


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def flatten_content(content: Any) -> str:
    """OpenAI content (string, or list of parts) -> plain text. Image parts become a placeholder."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for part in content:
            if isinstance(part, str):
                pieces.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind in ("text", "input_text", "output_text"):
                    pieces.append(str(part.get("text", "")))
                elif kind in ("image_url", "image", "input_image"):
                    pieces.append("[image]")
        return "".join(pieces)
    raise ChatTemplateError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _normalise_messages(messages: list[Message]) -> list[dict[str, Any]]:
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise ChatTemplateError(f"messages[{i}] needs a 'role'")
        norm: dict[str, Any] = {"role": msg["role"], "content": flatten_content(msg.get("content"))}
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                fn = call.get("function", {})
                args = fn.get("arguments", "{}")
                if not isinstance(args, str):
                    args = json.dumps(args, ensure_ascii=False)
                calls.append(
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {"name": fn.get("name", ""), "arguments": args},
                    }
                )
            norm["tool_calls"] = calls
        for key in ("tool_call_id", "name", "reasoning_content"):
            if msg.get(key) is not None:
                norm[key] = msg[key]
        out.append(norm)
    return out


def _parse_call_object(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:  # arguments given as a JSON string: normalise to compact JSON text
            args = json.loads(args)
        except json.JSONDecodeError:
            return ToolCall(id=new_tool_call_id(), name=obj["name"], arguments=args)
    return ToolCall(id=new_tool_call_id(), name=obj["name"], arguments=json.dumps(args, ensure_ascii=False))


def _calls_from_json_text(text: str) -> list[ToolCall] | None:
    """Parse text that is exactly one JSON object or list of call objects; None when it is not."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value, end = _DECODER.raw_decode(stripped)
    except json.JSONDecodeError:
        return None
    if stripped[end:].strip():
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_parse_call_object(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def parse_assistant_text(text: str, *, tools_offered: bool = True) -> ParsedAssistant:
    """Split a completion into reasoning, visible content and tool calls.

    A ``<tool_call>`` block whose body is not valid JSON is left in the content untouched (the client sees what
    the model wrote) rather than dropped.
    """
    reasoning = ""
    body = text
    think_end = body.find(THINK_CLOSE)
    if think_end != -1:
        start = body.find(THINK_OPEN)
        inner_start = start + len(THINK_OPEN) if 0 <= start < think_end else 0
        reasoning = body[inner_start:think_end].strip()
        body = (
            body[: max(start, 0)] + body[think_end + len(THINK_CLOSE) :]
            if start != -1
            else body[think_end + len(THINK_CLOSE) :]
        )
        body = body.lstrip("\n")

    calls: list[ToolCall] = []
    kept: list[str] = []
    cursor = 0
    while tools_offered:
        open_at = body.find(TOOL_OPEN, cursor)
        if open_at == -1:
            break
        close_at = body.find(TOOL_CLOSE, open_at)
        inner_end = close_at if close_at != -1 else len(body)
        parsed = _calls_from_json_text(body[open_at + len(TOOL_OPEN) : inner_end])
        block_end = inner_end + len(TOOL_CLOSE) if close_at != -1 else len(body)
        kept.append(body[cursor:open_at])
        if parsed is None:
            kept.append(body[open_at:block_end])
        else:
            calls.extend(parsed)
        cursor = block_end
    kept.append(body[cursor:])
    content = "".join(kept)

    if tools_offered and not calls:
        candidate = content.split(PYTHON_TAG, 1)[1] if PYTHON_TAG in content else content
        whole = _calls_from_json_text(candidate)
        if whole is not None:
            calls, content = whole, ""
    return ParsedAssistant(content=content.strip() if calls else content, tool_calls=calls, reasoning=reasoning)


class HFChatTokenizer:
    """A :class:`~openclaw_cli.backend.ChatTokenizer` over a transformers tokenizer with a chat template."""

    def __init__(self, hf_tokenizer: Any, *, context_length: int | None = None) -> None:
        if not getattr(hf_tokenizer, "chat_template", None):
            raise ChatTemplateError("this tokenizer has no chat template; pick an instruct/chat model")
        self.hf = hf_tokenizer
        self.context_length = int(context_length or DEFAULT_CONTEXT_LENGTH)
        eos: list[int] = []
        for token in ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>"):
            tid = hf_tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != hf_tokenizer.unk_token_id and tid >= 0:
                eos.append(tid)
        if hf_tokenizer.eos_token_id is not None:
            eos.append(int(hf_tokenizer.eos_token_id))
        self.eos_token_ids: list[int] = sorted(set(eos))
        # Tool-call and think markers are special tokens in several vocabularies but are content we must parse.
        keep = set()
        for token in (TOOL_OPEN, TOOL_CLOSE, THINK_OPEN, THINK_CLOSE, PYTHON_TAG):
            tid = hf_tokenizer.convert_tokens_to_ids(token)
            if isinstance(tid, int) and tid != hf_tokenizer.unk_token_id:
                keep.add(tid)
        self._hidden_ids = set(getattr(hf_tokenizer, "all_special_ids", [])) - keep

    @classmethod
    def from_pretrained(cls, path: str | Path, *, context_length: int | None = None) -> HFChatTokenizer:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(path)), context_length=context_length)

    def render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, add_generation_prompt: bool = True
    ) -> list[int]:
        if not messages:
            raise ChatTemplateError("messages must not be empty")
        rust = self._plain_rust_tokenizer()
        try:
            rendered = self.hf.apply_chat_template(
                _normalise_messages(messages),
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                tokenize=rust is None,
                return_dict=False,
            )
        except ChatTemplateError:
            raise
        except Exception as exc:  # jinja TemplateError, raise_exception() inside templates, bad message shapes
            raise ChatTemplateError(f"chat template rejected the messages: {exc}") from exc
        if rust is not None:
            # What apply_chat_template(tokenize=True) does for a fast tokenizer in this state, minus the wrapper
            # (~0.1 ms a request: batching, BatchEncoding, argument checks).
            return rust.encode(rendered, add_special_tokens=False).ids
        ids = rendered
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def _plain_rust_tokenizer(self) -> Any | None:
        """The Rust tokenizer when encoding text through it gives exactly transformers' ids (a fast tokenizer with no
        truncation, padding or special-token splitting set); None otherwise, and the slower transformers path runs."""
        if not getattr(self.hf, "is_fast", False) or getattr(self.hf, "split_special_tokens", False):
            return None
        rust = getattr(self.hf, "backend_tokenizer", None)
        if rust is None or rust.truncation is not None or rust.padding is not None or rust.encode_special_tokens:
            return None
        return rust

    def encode(self, text: str) -> list[int]:
        rust = self._plain_rust_tokenizer()
        if rust is not None:
            return rust.encode(text, add_special_tokens=False).ids
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of the tokens with stop/special tokens removed (what a client should see)."""
        return self.hf.decode([t for t in token_ids if t not in self._hidden_ids], skip_special_tokens=False)

    def parse_assistant(self, text: str, *, tools_offered: bool = True) -> ParsedAssistant:
        return parse_assistant_text(text, tools_offered=tools_offered)
