"""``openclaw rollback``: make a running server serve an earlier policy version, at once.

``openclaw rollback --to N`` asks the server on ``host:port`` (``POST /v1/openclaw/rollback``, with the configured
API key) to serve version N from now on; requests already running finish on the version they started with. With the
local backend the trainer then continues from version N's weights (its optimizer state reset), so the next training
step builds on what is served instead of bringing the abandoned weights back. Without ``--to`` it lists the
current and servable versions (the base model 0 and the last ``local.keep_versions`` published ones); an unknown or
expired version is refused with that list. Both act on the caller's own adapter (``lora.scope = owner``: the
configured key's owner; ``--owner ID`` for another owner whose key the configuration holds).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from openclaw_cli.command_support import (
    ConfigOption,
    HostOption,
    PortOption,
    SetOption,
    call_server,
    command_settings,
)
from openclaw_cli.proxy.control import ROLLBACK_PATH, VERSIONS_PATH

TIMEOUT_S = 600.0  # serving switches at once; the answer waits for a training step in progress to end


def rollback_command(
    to: Annotated[
        int | None, typer.Option("--to", min=0, help="The policy version to serve from now on (0 = the base model).")
    ] = None,
    owner: Annotated[
        str | None,
        typer.Option(
            "--owner",
            help="Act on this owner's adapter (lora.scope = owner), by its id as `openclaw status` lists owners; "
            "default: the configured key's owner.",
        ),
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
        listing = call_server(settings, "GET", VERSIONS_PATH, timeout_s=TIMEOUT_S, owner=owner)
        if as_json:
            typer.echo(json.dumps(listing, indent=2))
            return
        servable = ", ".join(str(v) for v in listing.get("servable", []))
        whose = f"adapter {listing.get('adapter')}: " if listing.get("adapter") else ""
        typer.echo(
            f"{whose}serving version {listing.get('current')} ({listing.get('current_name')}); servable: {servable}"
        )
        typer.echo("roll back with: openclaw rollback --to VERSION")
        return
    answer = call_server(settings, "POST", ROLLBACK_PATH, {"version": to}, timeout_s=TIMEOUT_S, owner=owner)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    typer.echo(
        f"serving version {answer.get('policy_version')} ({answer.get('policy_name')}) from now on, "
        f"was {answer.get('previous_version')}; {answer.get('trainer')}"
    )
