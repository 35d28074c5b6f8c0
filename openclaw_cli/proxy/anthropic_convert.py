"""Anthropic Messages request -> OpenAI-format messages and tools (the form the chat template renders and the store
keeps), and the reverse mapping for tool-call ids.

- ``system`` (string or text blocks) -> one leading system message (blocks joined by a blank line, Claude Code's
  ``x-anthropic-billing-header:`` block left out); a ``role: "system"`` message inside the list is kept as a system
  message where it stands.
- user blocks: text / image -> content parts; ``tool_result`` -> an OpenAI ``tool`` message (content string or
  blocks; ``is_error`` prefixes the content with ``[error] `` so the model can tell a failed call).
- assistant blocks: text -> content; ``tool_use`` -> ``tool_calls`` (arguments = the input as JSON text);
  ``thinking`` -> ``reasoning_content``; ``redacted_thinking`` is dropped (it is opaque ciphertext).
- unknown block types (server tools, documents, …) are ignored; a block without a ``type`` is an error.
"""

from __future__ import annotations

import json
from typing import Any

from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.types import Message

TOOL_ERROR_PREFIX = "[error] "
# Claude Code starts its system prompt with a block of billing attribution for Anthropic's API
# ("x-anthropic-billing-header: cc_version=2.1.197.73f; cc_entrypoint=sdk-cli;"). It is metadata, not an
# instruction, and its fingerprint changes with every conversation: kept, it would put per-conversation noise at
# the head of every prompt the policy is served and trained on (and defeat prefix caching). Such a block is dropped.
BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"


def system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        texts = []
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise ProxyError(400, f"system[{i}] must be a text block", param="system")
            if block["text"].startswith(BILLING_HEADER_PREFIX):
                continue
            texts.append(block["text"])
        return "\n\n".join(texts)
    raise ProxyError(400, "'system' must be a string or an array of text blocks", param="system")


def _image_part(block: dict[str, Any]) -> dict[str, Any]:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "base64":
        url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    else:
        url = str(source.get("url", ""))
    return {"type": "image_url", "image_url": {"url": url}}


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ProxyError(400, f"{where}.content must be a string or an array of content blocks", param=where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ProxyError(400, f"{where}.content[{j}] must be a content block with a 'type'", param=where)
    return content


def _parts_to_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A single text part becomes a plain string; anything richer stays a list of OpenAI content parts."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _tool_result_content(block: dict[str, Any], where: str) -> str | list[dict[str, Any]]:
    content = block.get("content", "")
    if isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    else:
        parts = []
        for sub in _blocks(content, where):
            if sub["type"] == "text":
                parts.append({"type": "text", "text": str(sub.get("text", ""))})
            elif sub["type"] == "image":
                parts.append(_image_part(sub))
    if block.get("is_error"):
        parts.insert(0, {"type": "text", "text": TOOL_ERROR_PREFIX})
        if len(parts) > 1 and parts[1]["type"] == "text":
            parts[0:2] = [{"type": "text", "text": TOOL_ERROR_PREFIX + parts[1]["text"]}]
    return _parts_to_content(parts) if parts else ""


def _user_messages(blocks: list[dict[str, Any]], where: str) -> list[Message]:
    out: list[Message] = []
    parts: list[dict[str, Any]] = []

    def flush() -> None:
        if parts:
            out.append({"role": "user", "content": _parts_to_content(list(parts))})
            parts.clear()

    for j, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append(_image_part(block))
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise ProxyError(400, f"{where}.content[{j}] (tool_result) needs 'tool_use_id'", param=where)
            flush()
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block["tool_use_id"],
                    "content": _tool_result_content(block, f"{where}.content[{j}]"),
                }
            )
    flush()
    return out


def _assistant_message(blocks: list[dict[str, Any]], where: str) -> Message:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise ProxyError(400, f"{where}.content[{j}] (tool_use) needs 'id' and 'name'", param=where)
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
    content = "".join(texts)
    message: Message = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    return message


def to_openai_messages(system: Any, messages: Any) -> list[Message]:
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "'messages' must be a non-empty array", param="messages")
    out: list[Message] = []
    head = system_text(system)
    if head:
        out.append({"role": "system", "content": head})
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise ProxyError(400, f"{where} must be an object", param=where)
        role = msg.get("role")
        if role not in ("user", "assistant", "system"):
            raise ProxyError(400, f"{where}.role must be 'user' or 'assistant', got {role!r}", param=where)
        if "content" not in msg:
            raise ProxyError(400, f"{where} is missing 'content'", param=where)
        blocks = _blocks(msg["content"], where)
        if role == "system":
            out.append({"role": "system", "content": "".join(str(b.get("text", "")) for b in blocks)})
        elif role == "user":
            out.extend(_user_messages(blocks, where))
        else:
            out.append(_assistant_message(blocks, where))
    return out


def to_openai_tools(tools: Any) -> list[dict[str, Any]]:
    """Client tools (those with an ``input_schema``) as OpenAI function tools; Anthropic server tools (web search
    and the like, which carry no schema) cannot run here and are left out."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ProxyError(400, "'tools' must be an array", param="tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise ProxyError(400, f"tools[{i}] must be an object with a 'name'", param="tools")
        schema = tool.get("input_schema")
        if schema is None:
            continue
        if not isinstance(schema, dict):
            raise ProxyError(400, f"tools[{i}].input_schema must be a JSON schema object", param="tools")
        function: dict[str, Any] = {"name": tool["name"], "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def apply_tool_choice(tools: list[dict[str, Any]], choice: Any) -> tuple[list[dict[str, Any]] | None, bool]:
    """(tools shown to the model, whether tool calls are parsed). ``none`` hides the tools; ``tool`` shows only the
    named one; ``any`` / ``auto`` show all (any / tool are enforced as proxy/constraints.py says)."""
    if choice is None:
        return (tools or None), bool(tools)
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise ProxyError(400, "tool_choice.type must be auto, any, tool or none", param="tool_choice")
    if choice["type"] == "none":
        return None, False
    if choice["type"] == "tool":
        chosen = [t for t in tools if t["function"]["name"] == choice.get("name")]
        if not chosen:
            raise ProxyError(
                400, f"tool_choice names tool {choice.get('name')!r}, which is not in 'tools'", param="tool_choice"
            )
        return chosen, True
    return (tools or None), bool(tools)


def anthropic_tool_id(call_id: str) -> str:
    """Tool-use ids in Anthropic's ``toolu_`` style (the parser makes OpenAI-style ``call_`` ids)."""
    return "toolu_" + call_id.removeprefix("call_")
