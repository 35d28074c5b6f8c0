"""Exact wire shapes the clients depend on, asserted the same way in every test: the OpenAI and Anthropic error
bodies, and the Anthropic SSE frame."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

_ANTHROPIC_FRAME = re.compile(rb"event: ([a-z_]+)\ndata: (\{.*\})")


def assert_openai_error(
    resp: httpx.Response, status: int, *, param: str | None = None, code: str | None = None, kind: str | None = None
) -> str:
    """``resp`` is an OpenAI error body (exactly ``error.{message,type,param,code}``, a message) with what is given;
    returns the message."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    for key, wanted in (("param", param), ("code", code), ("type", kind)):
        if wanted is not None:
            assert error[key] == wanted, (key, error)
    return error["message"]


def assert_anthropic_error(resp: httpx.Response, status: int, error_type: str) -> str:
    """``resp`` is exactly an Anthropic error body of ``error_type``; returns the message."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body == {"type": "error", "error": {"type": error_type, "message": body["error"]["message"]}}
    return body["error"]["message"]


def anthropic_sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) per frame; every frame must be exactly ``event: X\\ndata: {json}`` with ``data.type == X``,
    frames split by a blank line, the body ending with one."""
    parts = raw.split(b"\n\n")
    assert parts[-1] == b"", "an SSE body ends with a blank line"
    events = []
    for part in parts[:-1]:
        match = _ANTHROPIC_FRAME.fullmatch(part)
        assert match, f"malformed SSE frame: {part[:200]!r}"
        name, data = match.group(1).decode(), json.loads(match.group(2))
        assert data["type"] == name
        events.append((name, data))
    return events
