"""Server-sent-event framing, byte-exact: ``data: {json}\\n\\n`` (OpenAI) and ``event: X\\ndata: {json}\\n\\n``
(Anthropic). Written by hand rather than through an SSE library so the frames are exactly what the SDKs parse."""

from __future__ import annotations

import json
from typing import Any

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no", "connection": "keep-alive"}
SSE_MEDIA_TYPE = "text/event-stream"
DONE_FRAME = b"data: [DONE]\n\n"
KEEPALIVE_COMMENT = b": keepalive\n\n"  # a comment line; every SSE client ignores it


def to_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def data_frame(payload: dict[str, Any]) -> bytes:
    return f"data: {to_json(payload)}\n\n".encode()


def event_frame(event: str, payload: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {to_json(payload)}\n\n".encode()
