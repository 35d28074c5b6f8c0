"""OpenAI Responses request -> OpenAI-format chat messages and tools (the form the chat template renders and the store
keeps), and the reply back into Responses output items.

Input items (``input`` as a string is one user message):

- ``message`` (also the short form without ``type``): role user / assistant / system / developer (developer ->
  system); content a string or parts (``input_text``, ``output_text``, ``refusal`` -> text; ``input_image`` -> an
  image part, which a text-only model refuses later; ``input_file`` / ``input_audio`` likewise kept as parts).
- ``function_call`` -> a tool call on the assistant message it follows (consecutive calls share one message);
  ``custom_tool_call`` likewise, its free-form ``input`` becoming ``{"input": ...}`` arguments.
- ``function_call_output`` / ``custom_tool_call_output`` -> a ``tool`` message (output a string or parts).
- ``reasoning`` -> ``reasoning_content`` of the next assistant message (summary and content text; encrypted
  content is opaque and dropped).
- other item types (web search, local shell, item references, ...) are ignored; an item that is not an object, or
  has neither ``type`` nor ``role``, is an error.

Tools: ``function`` tools as chat tools; ``custom`` tools (free-form input, e.g. Codex's ``apply_patch``) as a function
taking one string ``input``; built-in tool types are ignored (nothing here can run them).
"""

from __future__ import annotations

import json
from typing import Any

from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.types import Message

CUSTOM_INPUT_KEY = "input"
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Responses content -> chat content: a plain string when it is text only, else chat content parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProxyError(400, f"{where}.content must be a string or an array of content parts", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ProxyError(400, f"{where}.content[{j}] must be a content part with a 'type'", param=where)
        kind = part["type"]
        if kind in _TEXT_PARTS or kind == "refusal":
            text = part.get("text", part.get("refusal", ""))
            parts.append({"type": "text", "text": str(text)})
        elif kind == "input_image":
            url = part.get("image_url") or part.get("file_id") or ""
            parts.append({"type": "image_url", "image_url": {"url": str(url)}})
        elif kind in ("input_file", "input_audio"):
            parts.append({"type": kind, kind: {k: v for k, v in part.items() if k != "type"}})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _output_text(output: Any, where: str) -> str | list[dict[str, Any]]:
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _parts(output, where)
    return json.dumps(output, ensure_ascii=False)


def _reasoning_text(item: dict[str, Any]) -> str:
    texts = []
    for key in ("summary", "content"):
        for part in item.get(key) or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return "\n".join(texts)


def to_chat_messages(instructions: Any, items: Any) -> list[Message]:
    """``instructions`` + ``input`` as chat messages (see the module docstring)."""
    messages: list[Message] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ProxyError(400, "'instructions' must be a string", param="instructions")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ProxyError(400, "'input' must be a string or an array of input items", param="input")
    reasoning: str | None = None

    def open_assistant() -> Message:
        nonlocal reasoning
        last = messages[-1] if messages else None
        if last is not None and last.get("role") == "assistant":  # the reply's text, then its calls: one message
            last.setdefault("tool_calls", [])
            return last
        message: Message = {"role": "assistant", "content": None, "tool_calls": []}
        if reasoning:
            message["reasoning_content"] = reasoning
            reasoning = None
        messages.append(message)
        return message

    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ProxyError(400, f"{where} must be an object", param=where)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind is None:
            raise ProxyError(400, f"{where} needs a 'type' (or a 'role' for a message)", param=where)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ProxyError(400, f"{where}.role must be user, assistant, system or developer", param=where)
            message: Message = {
                "role": "system" if role == "developer" else role,
                "content": _parts(item.get("content", ""), where),
            }
            if role == "assistant" and reasoning:
                message["reasoning_content"] = reasoning
                reasoning = None
            messages.append(message)
        elif kind in ("function_call", "custom_tool_call"):
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise ProxyError(400, f"{where} ({kind}) needs string 'name' and 'call_id'", param=where)
            if kind == "function_call":
                arguments = item.get("arguments", "")
                arguments = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            else:
                arguments = json.dumps({CUSTOM_INPUT_KEY: str(item.get("input", ""))}, ensure_ascii=False)
            open_assistant()["tool_calls"].append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ProxyError(400, f"{where} ({kind}) needs a string 'call_id'", param=where)
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _output_text(item.get("output"), where)}
            )
        elif kind == "reasoning":
            reasoning = _reasoning_text(item) or reasoning
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls") == []:
            del message["tool_calls"]
    return messages


def to_chat_tools(tools: Any) -> tuple[list[dict[str, Any]], frozenset[str]]:
    """Function and custom tools as chat tools; also the names of the custom ones (their calls go back as
    ``custom_tool_call`` items with the free-form input)."""
    if tools is None:
        return [], frozenset()
    if not isinstance(tools, list):
        raise ProxyError(400, "'tools' must be an array", param="tools")
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise ProxyError(400, f"tools[{i}] must be an object with a 'type'", param="tools")
        if tool["type"] not in ("function", "custom"):
            continue  # built-in tools (web_search, file_search, local_shell, ...): nothing here can run them
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ProxyError(400, f"tools[{i}].name must be a non-empty string", param="tools")
        function: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        if tool["type"] == "function":
            function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
        else:
            custom.add(name)
            function["parameters"] = {
                "type": "object",
                "properties": {CUSTOM_INPUT_KEY: {"type": "string", "description": "The tool's free-form input."}},
                "required": [CUSTOM_INPUT_KEY],
            }
        out.append({"type": "function", "function": function})
    return out, frozenset(custom)


def chat_tool_choice(choice: Any) -> Any:
    """Responses ``tool_choice`` in the chat form: strings pass; ``{"type": "function"|"custom", "name"}`` becomes
    ``{"type": "function", "function": {"name"}}``; ``allowed_tools`` keeps its shape with chat tool references."""
    if choice is None or isinstance(choice, str):
        return choice
    if not isinstance(choice, dict):
        raise ProxyError(400, "tool_choice must be a string or an object", param="tool_choice")
    if choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if choice.get("type") == "allowed_tools":
        refs = [
            {"type": "function", "function": {"name": t.get("name")}}
            for t in choice.get("tools") or []
            if isinstance(t, dict)
        ]
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice.get("mode"), "tools": refs}}
    raise ProxyError(
        400,
        "tool_choice must be 'none', 'auto', 'required', {'type': 'function', 'name': ...} or "
        "{'type': 'allowed_tools', 'mode': ..., 'tools': [...]}",
        param="tool_choice",
    )
