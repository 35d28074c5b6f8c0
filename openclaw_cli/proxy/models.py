"""Which model names the proxy answers to, and what a name says about the turn.

Every accepted name is served by the same policy. ``openclaw-side`` additionally marks the request as a side turn
(a background call — title, summary, memory — that is stored but never trained on); pointing a client's "small
model" slot at it (Claude Code's ``ANTHROPIC_DEFAULT_HAIKU_MODEL``) classifies those calls without any header.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from openclaw_cli.capture import TurnType
from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.settings import Settings

DEFAULT_SERVED_NAME = "openclaw-policy"
MAIN_ALIAS = "openclaw"
SIDE_ALIAS = "openclaw-side"


@dataclass(frozen=True)
class ResolvedModel:
    requested: str  # echoed back in responses, as the real APIs do
    turn_type_hint: TurnType | None  # "side" for openclaw-side; None = let the sink decide


class ModelCatalog:
    def __init__(
        self,
        served_name: str,
        aliases: list[str],
        *,
        accept_any: bool,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
    ) -> None:
        self.served_name = served_name
        self.context_window = context_window  # listed with each name, so `openclaw connect` can configure clients
        self.max_output_tokens = max_output_tokens
        # openclaw-policy is always the policy, whatever it is served as (`connect` prints it before a server runs).
        names = [served_name, DEFAULT_SERVED_NAME, MAIN_ALIAS, SIDE_ALIAS, *aliases]
        self.names: list[str] = list(dict.fromkeys(names))  # de-duplicated, order kept
        self.accept_any = accept_any
        self.created = int(time.time())

    @classmethod
    def from_settings(
        cls, settings: Settings, *, context_window: int | None = None, max_output_tokens: int | None = None
    ) -> ModelCatalog:
        served = settings.proxy.served_model_name or settings.model or DEFAULT_SERVED_NAME
        return cls(
            served,
            list(settings.proxy.model_aliases),
            accept_any=settings.proxy.accept_any_model,
            context_window=context_window,
            max_output_tokens=max_output_tokens,
        )

    def resolve(self, name: str) -> ResolvedModel:
        if name == SIDE_ALIAS:
            return ResolvedModel(name, "side")
        if name in self.names or self.accept_any:
            return ResolvedModel(name, None)
        accepted = ", ".join(self.names)
        raise ProxyError(
            404,
            f"model '{name}' is not served here; accepted names: {accepted} "
            "(add more with proxy.model_aliases, or set proxy.accept_any_model)",
            kind="not_found",
            param="model",
            code="model_not_found",
        )

    def listing(self) -> dict[str, Any]:
        """One list readable by both SDKs: OpenAI's ``{"object": "list", "data": [{id, object, created, owned_by}]}``
        with Anthropic's per-model ``type``/``display_name``/``created_at`` and paging fields added, and the served
        model's ``context_window`` / ``max_output_tokens`` (SDKs ignore extra fields; ``openclaw connect`` reads
        them)."""
        created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))
        limits = {
            key: value
            for key, value in (("context_window", self.context_window), ("max_output_tokens", self.max_output_tokens))
            if value is not None
        }
        data = [
            {
                "id": name,
                "object": "model",
                "created": self.created,
                "owned_by": "openclaw",
                "type": "model",
                "display_name": name,
                "created_at": created_at,
                **limits,
            }
            for name in self.names
        ]
        return {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"],
            "last_id": data[-1]["id"],
        }

    def entry(self, name: str) -> dict[str, Any]:
        self.resolve(name)  # 404 for names not served
        listing = self.listing()["data"]
        found = next((item for item in listing if item["id"] == name), None)
        return found or {**listing[0], "id": name, "display_name": name}
