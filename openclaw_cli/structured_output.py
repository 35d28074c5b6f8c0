"""Constrained decoding, backend-neutral: what a request's demand looks like as an :class:`OutputConstraint`, and that
constraint as a grammar.

Three demands become constraints (the proxy parses them per API, :mod:`openclaw_cli.proxy.constraints`):

- a JSON answer (``response_format`` json_object / json_schema, Responses ``text.format``, Anthropic
  ``output_config.format``): one JSON value matching the schema (json_object: any object);
- a forced tool call (``tool_choice`` "required" / a named function, Anthropic any / tool): exactly one call, written
  in the model's own tool-call frame (:func:`tool_call_frame`, read from its chat template), whose object names an
  allowed tool and whose arguments match that tool's parameter schema.

The grammar is Lark with an embedded JSON Schema (``%json``), the input of llguidance (the local samplers; vLLM's
``guidance`` structured-output backend reads the same). JSON is written compactly with single spaces after ``:`` and
``,`` (``x-guidance`` options): free whitespace lets a small model pad a reply with newlines until ``max_tokens``.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from openclaw_cli.backend import ChatTokenizer
from openclaw_cli.tokenizer import TOOL_CLOSE, TOOL_OPEN
from openclaw_cli.types import Message, OutputConstraint, ReplyForm

JSON_LAYOUT = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
_PROBE_TOOL = "probe_tool_name"
_PROBE_ARGUMENTS = {"probe_argument": "probe value"}
_DECODER = json.JSONDecoder()


def json_form(schema: dict[str, Any] | None) -> ReplyForm:
    """One JSON value matching ``schema``; None = any JSON object (json_object)."""
    return ReplyForm(_schema_text(schema if schema is not None else {"type": "object"}))


def tool_call_form(tokenizer: ChatTokenizer, tools: list[dict[str, Any]], allowed: frozenset[str] | None) -> ReplyForm:
    """Exactly one call of a tool of ``tools`` (those named in ``allowed``; None = any), in the model's own frame."""
    frame = tool_call_frame(tokenizer)
    options = []
    definitions: dict[str, Any] = {}
    for tool in tools:
        function = tool.get("function", tool)
        name = function.get("name")
        if allowed is not None and name not in allowed:
            continue
        parameters = dict(function.get("parameters") or function.get("input_schema") or {"type": "object"})
        # "#/$defs/X" in a tool's parameters points at the root of the schema it is in, which is now the call's:
        # the definitions move there (a name two tools define differently stays put, and the grammar then says so).
        for key, value in dict(parameters.pop("$defs", {})).items():
            if definitions.setdefault(key, value) != value:
                parameters.setdefault("$defs", {})[key] = value
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, frame.arguments_key: parameters},
                "required": ["name", frame.arguments_key],
                "additionalProperties": False,
            }
        )
    call: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    if frame.in_list:
        call = {"type": "array", "items": call, "minItems": 1, "maxItems": 1}
    if definitions:
        call = {**call, "$defs": definitions}
    return ReplyForm(_schema_text(call), prefix=frame.prefix, suffix=frame.suffix)


def plain_json_schema(constraint: OutputConstraint) -> dict[str, Any] | None:
    """The JSON Schema of a constraint that is one plain JSON answer (no frame, no alternative), for a service whose
    JSON mode takes a schema (Fireworks); None for any other constraint."""
    if len(constraint.forms) != 1 or constraint.forms[0].prefix or constraint.forms[0].suffix:
        return None
    schema = json.loads(constraint.forms[0].schema_json)
    schema.pop("x-guidance", None)
    return dict(schema)


def _schema_text(schema: dict[str, Any]) -> str:
    return json.dumps({**schema, "x-guidance": JSON_LAYOUT}, ensure_ascii=False)


def lark_grammar(constraint: OutputConstraint, single_tokens: Mapping[str, int] | None = None) -> str:
    """The constraint as a Lark grammar, each form's JSON part as ``%json`` (llguidance's syntax). ``single_tokens``:
    frame markers the vocabulary holds as one token, named by id (``<[id]>``): a special token has no text to match."""
    markers = single_tokens or {}
    alternatives = []
    for form in constraint.forms:
        parts = [*_lark_text(form.prefix, markers), f"%json {form.schema_json}", *_lark_text(form.suffix, markers)]
        alternatives.append(" ".join(parts))
    return "start: " + "\n     | ".join(alternatives) + "\n"


def _lark_text(text: str, single_tokens: Mapping[str, int]) -> list[str]:
    """Lark items matching ``text``: string literals (JSON's escapes are Lark's), markers by token id."""
    items: list[str] = []
    while text:
        found = [(text.find(m), m) for m in single_tokens if m in text]
        if not found:
            items.append(json.dumps(text, ensure_ascii=False))
            break
        at, marker = min(found)
        if at:
            items.append(json.dumps(text[:at], ensure_ascii=False))
        items.append(f"<[{single_tokens[marker]}]>")
        text = text[at + len(marker) :]
    return items


@dataclass(frozen=True)
class ToolCallFrame:
    """How the model's chat template writes one tool call: the text before the call's JSON, after it, the key of its
    arguments, and whether the call object sits in a JSON list."""

    prefix: str
    suffix: str
    arguments_key: str
    in_list: bool

    def write(self, name: str, arguments: dict[str, Any]) -> str:
        call: Any = {"name": name, self.arguments_key: arguments}
        return self.prefix + json.dumps([call] if self.in_list else call) + self.suffix


HERMES_FRAME = ToolCallFrame(TOOL_OPEN + "\n", "\n" + TOOL_CLOSE, "arguments", in_list=False)


_FRAMES: weakref.WeakKeyDictionary[Any, ToolCallFrame] = weakref.WeakKeyDictionary()


def tool_call_frame(tokenizer: ChatTokenizer) -> ToolCallFrame:
    """The frame the chat template writes a tool call in (found by rendering a probe call), when the tokenizer's
    parser reads a call written in it back; else the Hermes ``<tool_call>`` frame every parser here reads. Found once
    per tokenizer."""
    if tokenizer in _FRAMES:
        return _FRAMES[tokenizer]
    frame = _rendered_frame(tokenizer)
    found = next((f for f in (frame, HERMES_FRAME) if f is not None and _parses_back(tokenizer, f)), HERMES_FRAME)
    _FRAMES[tokenizer] = found
    return found


def _rendered_frame(tokenizer: ChatTokenizer) -> ToolCallFrame | None:
    user: Message = {"role": "user", "content": "probe"}
    call = {
        "id": "call_probe",
        "type": "function",
        "function": {"name": _PROBE_TOOL, "arguments": json.dumps(_PROBE_ARGUMENTS)},
    }
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {"type": "object"}}}]
    try:
        prompt = tokenizer.decode(tokenizer.render([user], tools))
        whole = tokenizer.decode(
            tokenizer.render(
                [user, {"role": "assistant", "content": None, "tool_calls": [call]}], tools, add_generation_prompt=False
            )
        )
    except Exception:  # a template that cannot render the probe: the default frame
        return None
    if not whole.startswith(prompt):
        return None
    reply = whole[len(prompt) :]
    for start, char in enumerate(reply):
        if char not in "[{":
            continue
        try:
            value, end = _DECODER.raw_decode(reply, start)
        except json.JSONDecodeError:
            continue
        found = _probe_call(value)
        if found is None:
            continue
        arguments_key, in_list = found
        after = reply[end:]  # raw_decode returns where the value ends in reply
        close = after.find(TOOL_CLOSE)
        suffix = after[: close + len(TOOL_CLOSE)] if close != -1 else ""
        return ToolCallFrame(reply[:start].lstrip(" "), suffix, arguments_key, in_list)
    return None


def _probe_call(value: Any) -> tuple[str, bool] | None:
    in_list = isinstance(value, list)
    item = value[0] if in_list and len(value) == 1 else value
    if not isinstance(item, dict) or item.get("name") != _PROBE_TOOL:
        return None
    for key in ("arguments", "parameters"):
        if isinstance(item.get(key), dict):
            return key, in_list
    return None


def _parses_back(tokenizer: ChatTokenizer, frame: ToolCallFrame) -> bool:
    parsed = tokenizer.parse_assistant(frame.write(_PROBE_TOOL, _PROBE_ARGUMENTS))
    return [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [(_PROBE_TOOL, _PROBE_ARGUMENTS)]
