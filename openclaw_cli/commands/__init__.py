"""The core commands, one module each; ``openclaw_cli.cli`` registers them (and loads export, eval, connect, train
and rollback lazily from their own modules). What they share (options, settings resolution, the failure type and
exit codes) lives in :mod:`openclaw_cli.command_support`."""
