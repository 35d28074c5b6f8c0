"""``openclaw forget-owner OWNER``: the operator erases one owner: everything stored of theirs and the weights trained
on them alone.

``OWNER`` is an owner id as ``openclaw status`` lists owners (``key:<hash>``, ``session:<id>``). Deleted: the owner's
turns (conversations, token ids, judge results, feedback), the sessions left empty, their lessons, and, when the owner
has an adapter of their own (``lora.scope = owner``), that adapter: its steps, checkpoints and the trainer state kept
for it under ``local.state_dir``. Run it with the server stopped (it refuses while a launch holds the store): a running
server holds the adapter's versions in memory.

What it cannot undo is said before anything is deleted: where the owner shared an adapter (a group, or the shared
adapter), that adapter keeps what it learned from them (roll it back to a version from before, or retrain it);
copies outside this store (``openclaw export`` files, experiment-tracker runs, backups) and what a cloud backend keeps
in the user's account (Tinker training runs, Fireworks LoRA models) are not touched.
"""

from __future__ import annotations

import shutil
from typing import Annotated

import typer

from openclaw_cli.adapters import SHARED_ADAPTER, adapter_of, adapter_state_dir
from openclaw_cli.command_support import (
    EXIT_REFUSED,
    CliFailure,
    ConfigOption,
    SetOption,
    command_settings,
    open_existing_store,
)


def forget_owner_command(
    owner: Annotated[
        str, typer.Argument(help="The owner id (key:<hash> or session:<id>, as `openclaw status` lists).")
    ],
    yes: Annotated[bool, typer.Option("--yes", help="Do it without asking.")] = False,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Erase one owner: their turns, lessons, and the adapter trained on them alone (cannot be undone)."""
    from openclaw_cli.store import StoreError

    if not owner.startswith(("key:", "session:")):
        raise CliFailure(f"{owner[:12]!r} is not an owner id (key:<hash> or session:<id>)", EXIT_REFUSED)
    settings = command_settings(config, set_)
    adapter = adapter_of(settings, owner)
    own_adapter = adapter == owner
    typer.echo(
        f"forgetting owner {owner}: turns, sessions, lessons" + (", its adapter and checkpoints" if own_adapter else "")
    )
    if not own_adapter:
        shared = "the shared adapter" if adapter == SHARED_ADAPTER else f"group {adapter}'s adapter"
        typer.echo(
            f"  not undone: {shared} keeps what it learned from this owner (roll it back to a version from before "
            "their conversations, or retrain it)"
        )
    if own_adapter and settings.backend != "local":
        typer.echo(
            f"  not undone: what the {settings.backend} service keeps of this adapter (its training runs, LoRA "
            "models and checkpoints there): delete those in your account"
        )
    typer.echo("  not undone: copies outside this store (export files, tracker runs, backups)")
    if not yes and not typer.confirm("delete for good?", default=False):
        raise typer.Exit(1)
    store = open_existing_store(settings)
    try:
        store.hold_for_maintenance()
        counts = store.forget_owner(owner, adapter if own_adapter else None)
    except StoreError as exc:
        raise CliFailure(str(exc)) from None
    finally:
        store.close()
    removed = False
    if own_adapter:
        directory = adapter_state_dir(settings, adapter)
        removed = directory.is_dir()
        shutil.rmtree(directory, ignore_errors=True)
    typer.echo(
        f"deleted {counts['turns']} turns, {counts['sessions']} sessions, {counts['lessons']} lessons"
        + (f", {counts['steps']} steps, {counts['checkpoints']} checkpoint records" if own_adapter else "")
        + (" and the adapter's files" if removed else "")
    )
