"""``openclaw config show``: every effective setting and where it came from."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from openclaw_cli.command_support import LoadedSettings, stdout_console, with_settings
from openclaw_cli.settings import effective_items, effective_values, resolve_config_path, settings_sources


@with_settings
def config_show(
    loaded: LoadedSettings,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (secrets still masked).")] = False,
) -> None:
    """Every effective setting with where it came from (default, config file, env, cli); secrets masked."""
    sources = settings_sources(loaded.overrides, config=loaded.config)
    config_file = resolve_config_path(loaded.config)
    if as_json:
        values = effective_values(loaded.settings)
        rows = {
            key: {"value": values[key], "source": source}
            for key, _, source in effective_items(loaded.settings, sources)
        }
        document = {"config_file": str(config_file) if config_file else None, "settings": rows}
        typer.echo(json.dumps(document, indent=2))
        return
    title = f"Effective settings (config file: {config_file})" if config_file else "Effective settings (no config file)"
    table = Table(title=title, title_justify="left")
    table.add_column("Setting", style="bold", overflow="fold")
    table.add_column("Value", overflow="fold")
    table.add_column("Source", overflow="fold")
    for key, shown, source in effective_items(loaded.settings, sources):
        table.add_row(key, Text(shown), Text(source, style=_source_style(source)))
    stdout_console().print(table)


def _source_style(source: str) -> str:
    return {"default": "dim", "env": "cyan", "cli": "bold magenta"}.get(source, "green")
