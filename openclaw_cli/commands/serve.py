"""``openclaw serve``: the proxy alone (serve and capture, no training)."""

from __future__ import annotations

from openclaw_cli.command_support import LoadedSettings, begin_service, optional_attr, service_failures, with_settings

PROXY_MODULE = "openclaw_cli.proxy"  # exports run_server(settings) and ProxyConfigError
# The proxy raises its own ProxyConfigError (a ValueError) for settings it cannot serve with.
PROXY_REFUSALS = ((PROXY_MODULE, "ProxyConfigError"),)


@with_settings
def serve(
    loaded: LoadedSettings,
) -> None:
    """Serve the policy on the OpenAI (Chat Completions, Responses) and Anthropic APIs and capture every exchange."""
    settings = loaded.settings
    apis = " (OpenAI /v1/chat/completions and /v1/responses, Anthropic /v1/messages)"
    begin_service(settings, "serving", apis)
    run_server = optional_attr(PROXY_MODULE, "run_server", "the proxy (openclaw serve)")
    from openclaw_cli.learn.lessons import lesson_keeper  # lessons act under serve too (found, verified, served)

    with service_failures(PROXY_REFUSALS):
        run_server(settings, lesson_keeper=lesson_keeper)
