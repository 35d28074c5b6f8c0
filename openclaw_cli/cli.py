"""The ``openclaw`` command line (alias ``openclaw-rl``): the command group, its global options, and where each
command lives.

Every command that reads settings takes the same flags (``--config``, ``--backend``, ``--model``, ``--host``,
``--port``, ``--method``, repeatable ``--set KEY=VALUE``); flags beat ``OPENCLAW_*`` env vars, which beat the TOML
file, which beats the defaults. Errors print as one red line per problem and a non-zero exit code, never a
traceback (``--debug`` shows it): 2 for invalid settings or refused requests, 1 for failed checks and other errors.
The core commands are modules of :mod:`openclaw_cli.commands`; export, eval, connect, train and rollback are
imported only when listed or run.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn, cast

import click
import typer
from rich.text import Text
from typer.core import TyperGroup
from typer.exceptions import TyperException

from openclaw_cli import __version__
from openclaw_cli.backend import BackendError
from openclaw_cli.command_support import (
    EXIT_FAILED,
    EXIT_REFUSED,
    CliFailure,
    CliState,
    ConfigOption,
    optional_attr,
    stderr_console,
)
from openclaw_cli.commands import backends, config_show, doctor, init, launch, serve, status, version
from openclaw_cli.settings import SettingsError
from openclaw_cli.templates import TemplateError


def _print_error_lines(message: str) -> None:
    console = stderr_console()
    for line in message.splitlines() or [message]:
        # soft_wrap: one problem stays one line however narrow the terminal; Text: no markup in user values.
        console.print(Text(f"error: {line}", style="bold red"), soft_wrap=True)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file descriptor (e.g. captured in tests): nothing will be flushed to a closed pipe


class OpenclawGroup(TyperGroup):
    """Maps known failures to one red line and an exit code, and adds the lazily imported commands."""

    # ctx and commands are typed Any: recent typer vendors its own click, so their classes depend on typer's version.
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        # Recent typer vendors its own click: its Exit/Abort/usage errors are not the click package's classes.
        # Both kinds carry their own exit code and message, so let them through untouched.
        except (
            typer.Exit,
            typer.Abort,
            TyperException,
            click.exceptions.Exit,
            click.exceptions.Abort,
            click.ClickException,
        ):
            raise
        except SettingsError as exc:
            _print_error_lines(str(exc))
            raise typer.Exit(EXIT_REFUSED) from None
        except CliFailure as exc:
            _print_error_lines(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except (BackendError, TemplateError) as exc:
            _print_error_lines(str(exc))
            raise typer.Exit(EXIT_FAILED) from None
        except BrokenPipeError:
            # The reader went away (`openclaw ... | head`): stop quietly like other Unix tools, and point stdout
            # at /dev/null so the interpreter's final flush does not raise again.
            _silence_stdout()
            raise typer.Exit(EXIT_FAILED) from None
        except Exception as exc:
            if isinstance(ctx.obj, CliState) and ctx.obj.debug:
                raise
            _print_error_lines(f"unexpected {type(exc).__name__}: {exc} (run with --debug for the traceback)")
            raise typer.Exit(EXIT_FAILED) from None

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(name for name in LAZY_COMMANDS if name not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in LAZY_COMMANDS:
            command = LAZY_COMMANDS[cmd_name]()
        return command


app = typer.Typer(
    cls=OpenclawGroup,
    name="openclaw",
    help="Put a learning policy behind a local OpenAI/Anthropic-compatible proxy: capture, judge, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the effective settings.", no_args_is_help=True, add_completion=False)
app.add_typer(config_app, name="config")
app.command()(version.version)
config_app.command("show")(config_show.config_show)
app.command()(init.init)
app.command()(backends.backends)
app.command()(doctor.doctor)
app.command()(status.status)
app.command()(serve.serve)
app.command()(launch.launch)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"openclaw-cli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: ConfigOption = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show full tracebacks for unexpected errors.")] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", "-V", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    ctx.obj = CliState(config=config, debug=debug)
    if config is not None:
        # Lazily registered commands (export) take their own --config; default it to the global one.
        ctx.default_map = {name: {"config": str(config)} for name in LAZY_COMMANDS}


# ---------------------------------------------------------------------------------------------------------------
# Lazily imported commands: written elsewhere, imported only when listed or run, and a missing or broken module
# becomes a command that says so instead of breaking the whole CLI.


def _lazy_typer_command(name: str, module: str, attr: str) -> Callable[[], Any]:
    """A loader for a typer-annotated function ``module.attr`` registered as command ``name``."""

    def load() -> Any:
        try:
            function = optional_attr(module, attr, f"{name} (openclaw {name})")
        except CliFailure as exc:
            return _unavailable_command(name, str(exc))
        holder = typer.Typer(add_completion=False)
        holder.command(name=name)(function)
        command = typer.main.get_command(holder)
        command.name = name
        return command

    return load


def _lazy_typer_group(name: str, module: str, attr: str) -> Callable[[], Any]:
    """A loader for a typer app ``module.attr`` (a command with subcommands) registered as ``name``."""

    def load() -> Any:
        try:
            group = optional_attr(module, attr, f"{name} (openclaw {name})")
        except CliFailure as exc:
            return _unavailable_command(name, str(exc))
        command = typer.main.get_command(cast(typer.Typer, group))
        command.name = name
        return command

    return load


def _unavailable_command(name: str, reason: str) -> click.Command:
    def refuse(**_: Any) -> NoReturn:
        raise CliFailure(reason)

    return click.Command(
        name,
        callback=refuse,
        help=f"Not available in this build: {reason}",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


LAZY_COMMANDS: dict[str, Callable[[], Any]] = {
    "export": _lazy_typer_command("export", "openclaw_cli.commands.export", "export_command"),
    "eval": _lazy_typer_command("eval", "openclaw_cli.commands.eval", "eval_command"),
    "connect": _lazy_typer_command("connect", "openclaw_cli.commands.connect", "connect_command"),
    "train": _lazy_typer_command("train", "openclaw_cli.env_training.cli", "train_command"),
    "rollback": _lazy_typer_command("rollback", "openclaw_cli.commands.rollback", "rollback_command"),
    "lessons": _lazy_typer_group("lessons", "openclaw_cli.commands.lessons", "lessons_app"),
    "forget-owner": _lazy_typer_command("forget-owner", "openclaw_cli.commands.forget_owner", "forget_owner_command"),
}


def main() -> None:
    """Console-script entry point (``openclaw`` and ``openclaw-rl``)."""
    app()
