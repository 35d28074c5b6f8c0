"""``openclaw init``: write a commented starting config from a template."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from openclaw_cli.command_support import stdout_console
from openclaw_cli.settings import DEFAULT_CONFIG_FILE
from openclaw_cli.templates import DEFAULT_TEMPLATE, list_templates, write_template


def init(
    template: Annotated[str, typer.Option("--template", "-t", help="Template name (see --list).")] = DEFAULT_TEMPLATE,
    path: Annotated[Path, typer.Option("--path", "-p", help="Where to write the config.")] = Path(DEFAULT_CONFIG_FILE),
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing file.")] = False,
    list_only: Annotated[bool, typer.Option("--list", help="List the templates and exit.")] = False,
) -> None:
    """Write a commented starting config from a template."""
    if list_only:
        table = Table(show_header=True, box=None, pad_edge=False)
        table.add_column("Template", style="bold")
        table.add_column("Description", overflow="fold")
        for item in list_templates():
            name = f"{item.name} (default)" if item.name == DEFAULT_TEMPLATE else item.name
            table.add_row(name, item.description)
        stdout_console().print(table)
        return
    written = write_template(template, path, force=force)
    stdout_console().print(
        Text.assemble(
            ("wrote ", ""),
            (str(path), "bold"),
            (f" from template {written.name}. Next: `openclaw config show`, then `openclaw serve`.", ""),
        ),
        soft_wrap=True,
    )
