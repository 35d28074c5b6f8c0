"""``openclaw status``: ask a running openclaw server for its status."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from openclaw_cli.command_support import (
    CliFailure,
    LoadedSettings,
    connect_host,
    has_api_key,
    stdout_console,
    with_settings,
)
from openclaw_cli.loopback import is_loopback

STATUS_PATH = "/v1/openclaw/status"
STATUS_TIMEOUT_S = 2.0


@with_settings
def status(
    loaded: LoadedSettings,
    as_json: Annotated[bool, typer.Option("--json", help="Print the server's JSON as is.")] = False,
) -> None:
    """Ask a running openclaw server for its status."""
    import httpx  # only this command needs it; keeps startup of the others short

    settings = loaded.settings
    where = f"{settings.host}:{settings.port}"
    url = f"http://{connect_host(settings.host)}:{settings.port}{STATUS_PATH}"
    headers = {}
    if has_api_key(settings):
        assert settings.api_key is not None
        headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
    try:
        # Loopback never goes through an HTTP proxy from the environment.
        with httpx.Client(timeout=STATUS_TIMEOUT_S, trust_env=not is_loopback(settings.host)) as client:
            response = client.get(url, headers=headers)
    except httpx.HTTPError:
        raise CliFailure(f"no openclaw server on {where} (start one with `openclaw serve`)") from None
    if response.status_code != 200:
        raise CliFailure(f"the server on {where} answered HTTP {response.status_code} to {STATUS_PATH}")
    try:
        body = response.json()
    except ValueError:
        raise CliFailure(f"the server on {where} is not an openclaw server (no JSON at {STATUS_PATH})") from None
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    stdout_console().print(Text(f"openclaw server on {where}", style="bold"), soft_wrap=True)
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in _flatten_json(body):
        table.add_row(key, Text(value))
    stdout_console().print(table)


def _flatten_json(value: Any, prefix: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _flatten_json(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield (prefix or "status", value if isinstance(value, str) else json.dumps(value))
