"""``openclaw launch``: serve, collect, judge and train in one process."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
from rich.text import Text

from openclaw_cli.command_support import (
    EXIT_REFUSED,
    CliFailure,
    LoadedSettings,
    optional_attr,
    refuse_exposed_bind_without_key,
    stdout_console,
    with_settings,
)
from openclaw_cli.commands.serve import PROXY_MODULE

RUNTIME_MODULE = "openclaw_cli.launch"  # exports run_launch(settings, ui=...)


@with_settings
def launch(
    loaded: LoadedSettings,
    ui: Annotated[
        bool, typer.Option("--ui/--no-ui", help="Live dashboard (default), or plain log lines with --no-ui.")
    ] = True,
) -> None:
    """Serve + collect + judge + train in one process (the learning loop). Ctrl-C stops after the current step."""
    settings = loaded.settings
    refuse_exposed_bind_without_key(settings)
    run_launch = optional_attr(RUNTIME_MODULE, "run_launch", "the learning loop (openclaw launch)")
    model_name = settings.model or "embedded SmolLM2-135M-Instruct"
    stdout_console().print(
        Text(
            f"launching {model_name} with backend {settings.backend} on http://{settings.host}:{settings.port}: "
            f"serving, judging and training ({settings.method}, batch {settings.train.batch_size})",
            style="bold",
        ),
        soft_wrap=True,
    )
    # With the dashboard up, only warnings go to the log; --no-ui logs the loops' progress line by line.
    logging.basicConfig(level=logging.WARNING if ui else logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        run_launch(settings, ui=ui)
    except OSError as exc:  # the port is taken or cannot be bound
        raise CliFailure(str(exc)) from None
    except Exception as exc:
        # Settings the runtime cannot start with (bind rules, judge configuration) are refusals, not failures.
        refusals = tuple(
            cls
            for module_name, name in (
                (PROXY_MODULE, "ProxyConfigError"),
                ("openclaw_cli.judge", "JudgeConfigError"),
                ("openclaw_cli.promotion", "GateConfigError"),
            )
            if isinstance(cls := getattr(sys.modules.get(module_name), name, None), type)
        )
        if refusals and isinstance(exc, refusals):
            raise CliFailure(str(exc), EXIT_REFUSED) from None
        # A damaged or busy store, or checkpoints that cannot be loaded: one line saying which file and what to do.
        startup_failures = tuple(
            cls
            for module_name, name in (
                ("openclaw_cli.store", "StoreError"),
                ("openclaw_cli.trainer_loop", "ResumeError"),
            )
            if isinstance(cls := getattr(sys.modules.get(module_name), name, None), type)
        )
        if startup_failures and isinstance(exc, startup_failures):
            raise CliFailure(str(exc)) from None
        raise
