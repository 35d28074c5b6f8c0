"""Which LoRA adapter serves and learns from each owner (``lora.scope``, ``lora.groups``; docs/owners.md).

An *adapter* is a line of policy versions trained on one set of owners' conversations only. ``lora.scope = "shared"``
keeps one adapter, :data:`SHARED_ADAPTER`, for everyone. ``lora.scope = "owner"`` (the default) gives each owner
its own: the owner id itself (``key:<hash>`` or ``session:<scope>``, never a key), or the name of the group
(``lora.groups``) the owner is in. A server with one owner (no API key, or a single one, and owners by key) has
nothing to separate, so that owner uses the shared adapter and both scopes behave identically: an existing single-user
store and checkpoint directory are the shared adapter's, unchanged.

Every adapter numbers its own versions, 0 being the base model: a new owner is served by the base until its
adapter's first step is published.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from openclaw_cli.settings import Settings

SHARED_ADAPTER = "shared"
ADAPTER_HEADER = "x-openclaw-adapter"  # on every generation response: the adapter that answered, e.g. key:ab12…
_LOCAL_OWNER = "local"  # lesson_prompt.LOCAL_OWNER: the one owner of a keyless server
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def adapter_of(settings: Settings, owner: str) -> str:
    """The adapter that serves ``owner`` and is trained on its turns (see the module docstring)."""
    if settings.lora.scope == "shared" or owner == _LOCAL_OWNER:
        return SHARED_ADAPTER
    for group, members in settings.lora.groups.items():
        if owner in members:
            return group
    if settings.lessons.scope != "session" and len(settings.accepted_api_keys()) <= 1:
        return SHARED_ADAPTER
    return owner


def separate_adapters(settings: Settings) -> bool:
    """Whether this server can serve more than one adapter: what a backend without per-owner adapters refuses."""
    if settings.lora.scope == "shared":
        return False
    return settings.lessons.scope == "session" or len(settings.accepted_api_keys()) > 1


def adapter_dirname(adapter: str) -> str:
    """A file name for ``adapter`` (its checkpoints' directory): a session scope is the client's own text, so it is
    hashed; an owner key id and a group name are kept readable."""
    if adapter.startswith("key:") and _SAFE_NAME.match(adapter[4:]):
        return "key-" + adapter[4:]
    if _SAFE_NAME.match(adapter):
        return "group-" + adapter
    return "owner-" + hashlib.sha256(adapter.encode("utf-8")).hexdigest()[:16]


TRAINER = "trainer"  # the store consumer that trains the shared adapter


def trainer_consumer(adapter: str) -> str:
    """The store consumer that trains ``adapter``: ``trainer`` for the shared one (as before adapters were per
    owner), ``trainer@<adapter>`` for an owner's or group's, which claims only that adapter's turns (the store reads
    the adapter from the consumer name: :func:`consumer_adapter`)."""
    return TRAINER if adapter == SHARED_ADAPTER else f"{TRAINER}@{adapter}"


def consumer_adapter(consumer: str) -> str | None:
    """The adapter a trainer consumer trains (None: any other consumer, which sees every adapter's turns)."""
    if consumer == TRAINER:
        return SHARED_ADAPTER
    prefix = TRAINER + "@"
    return consumer[len(prefix) :] if consumer.startswith(prefix) else None


def adapter_state_dir(settings: Settings, adapter: str) -> Path:
    """Where ``adapter``'s checkpoints live: ``local.state_dir`` itself for the shared adapter (as before adapters
    were per owner, so an existing checkpoint directory is the shared adapter's), ``local.state_dir/adapters/<name>``
    else; resolved to an absolute path."""
    state_dir = Path(settings.local.state_dir).expanduser().resolve()
    return state_dir if adapter == SHARED_ADAPTER else state_dir / "adapters" / adapter_dirname(adapter)
