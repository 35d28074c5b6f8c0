"""The local OpenAI/Anthropic-compatible proxy in front of the learning policy.

``create_app(backend, sink, settings)`` builds the ASGI app; ``run_server(settings)`` is ``openclaw serve``.
"""

from openclaw_cli.proxy.app import create_app
from openclaw_cli.proxy.server import BackgroundServer, ProxyConfigError, check_bind, run_server

__all__ = ["BackgroundServer", "ProxyConfigError", "check_bind", "create_app", "run_server"]
