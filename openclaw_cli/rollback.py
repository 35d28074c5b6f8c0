"""``openclaw rollback``: make a running server serve an earlier policy version, at once.

``openclaw rollback --to N`` asks the server on ``host:port`` (``POST /v1/openclaw/rollback``, with the configured
API key) to serve version N from now on; requests already running finish on the version they started with. With the
local backend the trainer then continues from version N's weights (its optimizer state reset), so the next training
step builds on what is served instead of bringing the abandoned weights back. Without ``--to`` it lists the
current and servable versions (the base model 0 and the last ``local.keep_versions`` published ones); an unknown or
expired version is refused with that list.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from openclaw_cli.command_support import (
    EXIT_FAILED,
    EXIT_REFUSED,
    CliFailure,
    ConfigOption,
    HostOption,
    PortOption,
    SetOption,
    command_settings,
    connect_host,
)
from openclaw_cli.loopback import is_loopback
from openclaw_cli.proxy.control import ROLLBACK_PATH, VERSIONS_PATH
from openclaw_cli.settings import Settings

TIMEOUT_S = 600.0  # serving switches at once; the answer waits for a training step in progress to end


def _request(settings: Settings, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One call to the running server; its error (in OpenAI's format) becomes a CliFailure with its message."""
    import httpx

    where = f"{settings.host}:{settings.port}"
    url = f"http://{connect_host(settings.host)}:{settings.port}{path}"
    headers = {}
    if settings.api_key is not None and settings.api_key.get_secret_value():
        headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
    try:
        timeout = httpx.Timeout(TIMEOUT_S, connect=5.0)
        with httpx.Client(timeout=timeout, trust_env=not is_loopback(settings.host)) as client:
            response = client.request(method, url, headers=headers, json=body)
    except httpx.ConnectError:
        raise CliFailure(f"no openclaw server on {where} (start one with `openclaw launch`)") from None
    except httpx.TimeoutException:
        raise CliFailure(f"the server on {where} did not answer {method} {path} in time") from None
    except httpx.HTTPError as exc:
        raise CliFailure(f"cannot reach the server on {where}: {type(exc).__name__}: {exc}") from None
    try:
        payload = response.json()
    except ValueError:
        raise CliFailure(f"the server on {where} is not an openclaw server (no JSON at {path})") from None
    if response.status_code == 200:
        return payload
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    message = message or f"HTTP {response.status_code}"
    if response.status_code == 401:
        raise CliFailure(f"the server on {where} refused the API key: {message} (set api_key / OPENCLAW_API_KEY)")
    refused = response.status_code in (400, 404)
    raise CliFailure(f"the server on {where}: {message}", EXIT_REFUSED if refused else EXIT_FAILED)


def rollback_command(
    to: Annotated[
        int | None, typer.Option("--to", min=0, help="The policy version to serve from now on (0 = the base model).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the server's JSON answer as is.")] = False,
    host: HostOption = None,
    port: PortOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Serve an earlier policy version at once (without --to: list the versions that can serve)."""
    settings = command_settings(config, set_, host=host, port=port)
    if to is None:
        listing = _request(settings, "GET", VERSIONS_PATH)
        if as_json:
            typer.echo(json.dumps(listing, indent=2))
            return
        servable = ", ".join(str(v) for v in listing.get("servable", []))
        typer.echo(f"serving version {listing.get('current')} ({listing.get('current_name')}); servable: {servable}")
        typer.echo("roll back with: openclaw rollback --to VERSION")
        return
    answer = _request(settings, "POST", ROLLBACK_PATH, {"version": to})
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    typer.echo(
        f"serving version {answer.get('policy_version')} ({answer.get('policy_name')}) from now on, "
        f"was {answer.get('previous_version')}; {answer.get('trainer')}"
    )
