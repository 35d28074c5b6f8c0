"""``openclaw serve``: the proxy alone (serve and capture, no training)."""

from __future__ import annotations

import sys

from rich.text import Text

from openclaw_cli.command_support import (
    EXIT_REFUSED,
    CliFailure,
    LoadedSettings,
    optional_attr,
    refuse_exposed_bind_without_key,
    stdout_console,
    with_settings,
)

PROXY_MODULE = "openclaw_cli.proxy"  # exports run_server(settings) and ProxyConfigError


@with_settings
def serve(
    loaded: LoadedSettings,
) -> None:
    """Serve the policy on the OpenAI (Chat Completions, Responses) and Anthropic APIs and capture every exchange."""
    settings = loaded.settings
    refuse_exposed_bind_without_key(settings)
    run_server = optional_attr(PROXY_MODULE, "run_server", "the proxy (openclaw serve)")
    # The proxy raises its own ProxyConfigError (a ValueError) for settings it cannot serve with.
    proxy_config_error = getattr(sys.modules.get(PROXY_MODULE), "ProxyConfigError", None)
    model_name = settings.model or "embedded SmolLM2-135M-Instruct"
    stdout_console().print(
        Text(
            f"serving {model_name} with backend {settings.backend} on http://{settings.host}:{settings.port} "
            "(OpenAI /v1/chat/completions and /v1/responses, Anthropic /v1/messages)",
            style="bold",
        ),
        soft_wrap=True,
    )
    try:
        run_server(settings)
    except Exception as exc:
        if isinstance(proxy_config_error, type) and isinstance(exc, proxy_config_error):
            raise CliFailure(str(exc), EXIT_REFUSED) from None
        raise
