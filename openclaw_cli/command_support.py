"""What every command shares: one failure type, one exit-code policy, the common options.

Every command runs under :class:`openclaw_cli.cli.OpenclawGroup`, which turns a :class:`CliFailure` into red
``error:`` line(s) on stderr and its exit code, and a :class:`~openclaw_cli.settings.SettingsError` (a bad config
file, ``--set``, or environment value) into exit code :data:`EXIT_REFUSED`, whichever command read the settings.
Exit codes: 0 done; :data:`EXIT_FAILED` (1) something could not be done (nothing answered, a check failed, a
backend or store error); :data:`EXIT_REFUSED` (2) the input is refused (settings, usage, an unsafe request), the
code click itself uses for usage errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from openclaw_cli.settings import DEFAULT_CONFIG_FILE, Settings, load_settings, parse_overrides

if TYPE_CHECKING:
    from openclaw_cli.store import Store

EXIT_FAILED = 1  # a check failed, nothing answered, or an operation could not be done
EXIT_REFUSED = 2  # invalid settings / usage, or a request we refuse on purpose (same code click uses for usage)


class CliFailure(Exception):
    """An expected failure: printed as red line(s) without a traceback, exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        dir_okay=False,
        help=f"TOML config file (default: ./{DEFAULT_CONFIG_FILE} when present).",
    ),
]
BackendOption = Annotated[str | None, typer.Option("--backend", help="Backend name (see `openclaw backends`).")]
ModelOption = Annotated[
    str | None,
    typer.Option("--model", help="HF model id or local path (default: the embedded SmolLM2-135M-Instruct)."),
]
HostOption = Annotated[str | None, typer.Option("--host", help="Address to bind or query (default 127.0.0.1).")]
PortOption = Annotated[int | None, typer.Option("--port", help="Port to bind or query (default 8400).")]
MethodOption = Annotated[str | None, typer.Option("--method", help="Learning method: rl, opd or combined.")]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Any setting by dotted key, repeatable, e.g. --set judge.votes=5 (JSON for lists).",
    ),
]
OutputOption = Annotated[
    Path | None, typer.Option("--output", "-o", "--out", dir_okay=False, help="Write here instead of stdout.")
]


def command_overrides(sets: list[str] | None, **named: object) -> dict[str, Any]:
    """The command line's settings: ``--set`` pairs, then the command's named flags (``None`` = not given), which are
    more specific and so win when both name the same key."""
    overrides = parse_overrides(sets or [])
    overrides.update({key: value for key, value in named.items() if value is not None})
    return overrides


def command_settings(config: Path | None, sets: list[str] | None, **named: object) -> Settings:
    """The effective settings for a command: config file < environment < ``--set`` < the command's named flags.
    A bad value raises SettingsError, which every command reports the same way."""
    return load_settings(command_overrides(sets, **named), config=config)


def open_existing_store(settings: Settings) -> Store:
    """The configured store for a reader (export, eval); a missing or unusable one is a CliFailure saying which."""
    from openclaw_cli.store import Store, StoreError

    try:
        return Store(settings.store.path, create=False)
    except StoreError as exc:
        raise CliFailure(str(exc)) from None
