"""What counts as a secret, in one place: credentials never reach the store, a log line or a cloud trainer.

- Request headers (:func:`scrub_headers`): credential headers are dropped before an exchange is captured.
- JSON bodies and metadata (:func:`scrub_secrets`): api_key / authorization / secret-like fields are dropped at any
  depth outside the conversation payload before a row is written.
- Free text inside conversations is a different matter (a key pasted into a message): see
  :mod:`openclaw_cli.capture.redaction`. Configured secrets (``SecretStr`` settings) are masked by
  :func:`openclaw_cli.settings.mask_secret`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any

# Header names are compared lower-cased. These never reach the store (secrets).
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "proxy-authorization", "cookie", "api-key"})
# ...and neither does any header whose name contains one of these (x-auth-token, x-goog-api-key, set-cookie,
# x-client-secret, private-token, ...). Session and turn headers (x-session-id, x-turn-type) contain none of them.
SECRET_HEADER_PARTS = ("auth", "key", "token", "secret", "cookie", "password", "passwd", "credential", "signature")

_SECRET_KEY = re.compile(
    r"^(x-)?api[-_]?key$|[-_]api[-_]?key$|^(proxy-)?authorization$|^(client[-_])?secret$|^password$"
    r"|^(access|refresh|id)[-_]token$|^cookie$|^set-cookie$",
    re.IGNORECASE,
)


# Conversation and tool payloads are data, not configuration: a tool whose schema has an "api_key" parameter, or a
# tool call carrying one, must be stored as it was. (Walking them would also cost a full pass over every history.)
_CONTENT_KEYS = frozenset({"messages", "system", "tools", "content", "choices", "input", "prompt"})


@functools.lru_cache(maxsize=4096)  # the same few field names come back in every request
def _is_secret_key(key: str) -> bool:
    return key.lower() in SECRET_HEADERS or _SECRET_KEY.search(key) is not None


def is_secret_name(name: str) -> bool:
    """A setting or field name that may hold a credential (masked wherever settings are shown): the header rule,
    the broad one (any name holding key, token, secret, password, ...), which covers every field-name pattern."""
    return is_secret_header(name)


def scrub_secrets(value: Any) -> Any:
    """A copy of a JSON value without any api_key/authorization/secret-like field, at any depth outside the
    conversation payload (messages, system, tools, content, choices, input, prompt are kept verbatim)."""
    if isinstance(value, dict):
        return {
            k: v if k in _CONTENT_KEYS else scrub_secrets(v)
            for k, v in value.items()
            if not (isinstance(k, str) and _is_secret_key(k))
        }
    if isinstance(value, list):
        return [scrub_secrets(v) for v in value]
    return value


def is_secret_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in SECRET_HEADERS or any(part in lowered for part in SECRET_HEADER_PARTS)


def scrub_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """An ASGI scope's raw header pairs as ``{lower-case name: value}`` without credentials, so nothing secret is
    ever stored. The first value of a repeated name is kept."""
    scrubbed: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name not in scrubbed and not is_secret_header(name):
            scrubbed[name] = raw_value.decode("latin-1")
    return scrubbed
