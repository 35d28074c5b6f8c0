"""Reading and checking request bodies by hand, so every rejection is a 4xx naming the exact parameter.

Unknown fields are accepted and ignored (clients such as Claude Code send fields newer than any schema we could
pin); known fields with the wrong type are rejected.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal, overload

from starlette.requests import Request

from openclaw_cli.proxy.errors import ProxyError

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
}


async def read_json_body(request: Request, max_bytes: int) -> dict[str, Any]:
    """The JSON object in the body; 413 past ``max_bytes`` (checked while reading, not after), 400 when malformed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise ProxyError(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    # ValueError covers bad JSON, bad UTF-8 and integers past Python's digit limit; RecursionError, arrays nested
    # thousands deep. Both are the client's input, never the proxy's fault.
    except (ValueError, RecursionError) as exc:
        raise ProxyError(400, f"request body is not valid JSON: {_short(exc)}") from None
    if not isinstance(body, dict):
        raise ProxyError(400, f"request body must be a JSON object, got {_json_type(body)}")
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(body):
        raise ProxyError(400, "request body holds a lone UTF-16 surrogate escape (e.g. \\ud800), which is not text")
    return body


# A \uD800-\uDFFF escape; only when one occurs is the (slower) full check for an unpaired one needed.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _has_lone_surrogate(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def check_counts(body: dict[str, Any], *, max_messages: int, max_tools: int) -> None:
    """400 when a request carries more messages or tools than the proxy accepts (proxy.max_messages/max_tools)."""
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) > max_messages:
        raise ProxyError(
            400,
            f"'messages' holds {len(messages)} messages; at most {max_messages} are accepted (proxy.max_messages)",
            param="messages",
        )
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > max_tools:
        raise ProxyError(
            400, f"'tools' holds {len(tools)} tools; at most {max_tools} are accepted (proxy.max_tools)", param="tools"
        )


def _too_large(max_bytes: int) -> ProxyError:
    return ProxyError(413, f"request body exceeds the {max_bytes} byte limit (proxy.max_body_bytes)", kind="too_large")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _matches(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # bool is an int in Python, never in JSON
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


def get_field(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], *, required: bool = False) -> Any:
    """``body[name]`` when present and of one of ``kinds``; None when absent (or null) and not required."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    value = body.get(name)
    if value is None:
        if required:
            raise ProxyError(400, f"missing required parameter '{name}'", param=name)
        return None
    if not _matches(value, kinds):
        wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise ProxyError(400, f"'{name}' must be {wanted}, got {_json_type(value)}", param=name)
    return value


@overload
def get_number(
    body: dict[str, Any], name: str, *, low: float | None = None, high: float | None = None, integer: Literal[True]
) -> int | None: ...


@overload
def get_number(
    body: dict[str, Any], name: str, *, low: float | None = None, high: float | None = None, integer: bool = False
) -> float | int | None: ...


def get_number(
    body: dict[str, Any], name: str, *, low: float | None = None, high: float | None = None, integer: bool = False
) -> float | int | None:
    value = get_field(body, name, int if integer else float)
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):  # NaN / Infinity / 1e999 parse, but mean nothing
        raise ProxyError(400, f"'{name}' must be a finite number, got {value}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (
            f"between {low} and {high}"
            if low is not None and high is not None
            else (f">= {low}" if low is not None else f"<= {high}")
        )
        raise ProxyError(400, f"'{name}' must be {bounds}, got {value}", param=name)
    return value


def string_list(body: dict[str, Any], name: str, *, max_items: int | None = None) -> list[str]:
    """A string-or-list-of-strings field (OpenAI ``stop``) as a list; empty when absent."""
    value = get_field(body, name, (str, list))
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not all(isinstance(item, str) for item in items):
        raise ProxyError(400, f"'{name}' must be a string or an array of strings", param=name)
    if max_items is not None and len(items) > max_items:
        raise ProxyError(400, f"'{name}' takes at most {max_items} entries, got {len(items)}", param=name)
    return [item for item in items if item]
