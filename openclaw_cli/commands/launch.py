"""``openclaw launch``: serve, collect, judge and train in one process."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from openclaw_cli.command_support import (
    LoadedSettings,
    ReportToOption,
    begin_service,
    optional_attr,
    service_failures,
    with_report_to,
    with_settings,
)
from openclaw_cli.commands.serve import PROXY_REFUSALS

RUNTIME_MODULE = "openclaw_cli.launch"  # exports run_launch(settings, ui=...)
# Settings the runtime cannot start with (bind rules, judge configuration) are refusals, not failures.
LAUNCH_REFUSALS = (
    *PROXY_REFUSALS,
    ("openclaw_cli.learn.judge", "JudgeConfigError"),
    ("openclaw_cli.learn.promotion", "GateConfigError"),
)
# A damaged or busy store, or checkpoints that cannot be loaded: one line saying which file and what to do.
STARTUP_FAILURES = (("openclaw_cli.store", "StoreError"), ("openclaw_cli.learn.trainer_loop", "ResumeError"))


@with_settings
def launch(
    loaded: LoadedSettings,
    ui: Annotated[
        bool, typer.Option("--ui/--no-ui", help="Live dashboard (default), or plain log lines with --no-ui.")
    ] = True,
    report_to: ReportToOption = None,
) -> None:
    """Serve + collect + judge + train in one process (the learning loop). Ctrl-C stops after the current step."""
    settings = with_report_to(loaded.settings, report_to)
    doing = f": serving, judging and training ({settings.method}, batch {settings.train.batch_size})"
    begin_service(settings, "launching", doing)
    run_launch = optional_attr(RUNTIME_MODULE, "run_launch", "the learning loop (openclaw launch)")
    # With the dashboard up, only warnings go to the log; --no-ui logs the loops' progress line by line.
    logging.basicConfig(level=logging.WARNING if ui else logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with service_failures(LAUNCH_REFUSALS, STARTUP_FAILURES):
        run_launch(settings, ui=ui)
