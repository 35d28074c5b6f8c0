"""``openclaw backends``: every registered backend with its readiness checks."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from openclaw_cli import backend as registry
from openclaw_cli.command_support import CliFailure, LoadedSettings, check_mark, stdout_console, with_settings


@with_settings
def backends(
    loaded: LoadedSettings,
) -> None:
    """Every registered backend with its readiness checks (never starts one)."""
    registered = registry.available_backends()
    if not registered:
        raise CliFailure("no backends are registered (is openclaw-cli installed? try `pip install -e .`)")
    table = Table(title="Backends", title_justify="left")
    table.add_column("Backend", style="bold")
    table.add_column("")
    table.add_column("Check")
    table.add_column("Detail", overflow="fold")
    for name in sorted(registered):
        label = f"{name} (selected)" if name == loaded.settings.backend else name
        for index, check in enumerate(registry.diagnose_backend(name, loaded.settings)):
            table.add_row(label if index == 0 else "", check_mark(check.ok), check.name, Text(check.detail))
        table.add_section()
    stdout_console().print(table)
    if loaded.settings.backend not in registered:
        known = ", ".join(sorted(registered))
        raise CliFailure(f"selected backend {loaded.settings.backend!r} is not registered; choose one of: {known}")
