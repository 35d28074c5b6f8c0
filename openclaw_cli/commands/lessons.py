"""``openclaw lessons``: what the bot took from you, and your hands on it (asks the running server, as the owner of
the configured API key, or the server's one owner when it has no keys).

- ``openclaw lessons`` / ``openclaw lessons list [--status active]``: every lesson with its status, where it came
  from, how many replies it shaped and its latest evidence (why it is where it is);
- ``openclaw lessons show ID``: one lesson with all its evidence, in words (which of your prompts it was tried on,
  what changed there, what it waits for; ``--json`` for the numbers);
- ``openclaw lessons add TEXT``: teach one directly; served from the next request on;
- ``openclaw lessons forget ID``: stop serving it and erase its text (weights already trained keep it until a
  rollback: the command says so).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from openclaw_cli.command_support import (
    ConfigOption,
    HostOption,
    PortOption,
    SetOption,
    call_server,
    command_settings,
    stdout_console,
)
from openclaw_cli.learn.lesson_story import explain_entry
from openclaw_cli.proxy.lesson_routes import LESSONS_PATH

lessons_app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    help="What the bot learned from your corrections: list, show, add or forget lessons.",
)
JsonOption = Annotated[bool, typer.Option("--json", help="Print the server's JSON answer as is.")]


def _latest_why(lesson: dict[str, Any]) -> str:
    evidence = lesson.get("evidence") or []
    return str(evidence[-1].get("why", "")) if evidence else ""


def _print_lessons(payload: dict[str, Any]) -> None:
    lessons = payload.get("lessons", [])
    console = stdout_console()
    if not lessons:
        console.print(f"no lessons yet for owner {payload.get('owner')}")
        return
    table = Table(title=f"lessons of {payload.get('owner')}")
    for column in ("id", "status", "lesson", "from", "shaped", "why"):
        table.add_column(column, overflow="fold")
    for lesson in lessons:
        sources = lesson.get("source_turn_ids") or []
        origin = lesson.get("origin", "")
        table.add_row(
            str(lesson["id"]),
            Text(lesson["status"], style="bold green" if lesson["status"] == "active" else ""),
            lesson["text"],
            f"{origin} (turn {', '.join(str(s) for s in sources)})" if sources else origin,
            str(lesson.get("uses", 0)),
            _latest_why(lesson),
        )
    console.print(table)


@lessons_app.callback()
def lessons_root(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option("--status", help="Only lessons with this status.")] = None,
    as_json: JsonOption = False,
    host: HostOption = None,
    port: PortOption = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """What the bot learned from your corrections (without a subcommand: the list)."""
    ctx.obj = command_settings(config, set_, host=host, port=port)
    if ctx.invoked_subcommand is None:
        _list(ctx.obj, status, as_json)


def _list(settings: Any, status: str | None, as_json: bool) -> None:
    path = LESSONS_PATH + (f"?status={status}" if status else "")
    payload = call_server(settings, "GET", path)
    if as_json:
        typer.echo(json.dumps(payload, indent=2))
        return
    _print_lessons(payload)


@lessons_app.command("list")
def list_lessons(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option("--status", help="Only lessons with this status.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Every lesson with its status, origin, replies shaped and the latest evidence."""
    _list(ctx.obj, status, as_json)


@lessons_app.command("show")
def show_lesson(ctx: typer.Context, lesson_id: int, as_json: JsonOption = False) -> None:
    """One lesson with all its evidence, in words: which prompts it was tried on, what changed, what it waits for."""
    lesson = call_server(ctx.obj, "GET", f"{LESSONS_PATH}/{lesson_id}")
    if as_json:
        typer.echo(json.dumps(lesson, indent=2))
        return
    console = stdout_console()
    console.print(Text(f"lesson {lesson['id']} ({lesson['status']}): {lesson['text']}", style="bold"), soft_wrap=True)
    console.print(f"owner {lesson['owner']}; {lesson['origin']}; shaped {lesson.get('uses', 0)} replies")
    for entry in lesson.get("evidence", []):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.get("at", 0)))
        console.print(f"  {when}  {entry.get('status')}: {entry.get('why')}", soft_wrap=True, markup=False)
        story = explain_entry(entry)
        if story != entry.get("why"):
            for line in story.splitlines():
                console.print(f"      {line}", soft_wrap=True, markup=False)


@lessons_app.command("add")
def add_lesson(ctx: typer.Context, text: str, as_json: JsonOption = False) -> None:
    """Teach a lesson directly: served in your main-line prompts from the next request on."""
    lesson = call_server(ctx.obj, "POST", LESSONS_PATH, {"text": text})
    if as_json:
        typer.echo(json.dumps(lesson, indent=2))
        return
    typer.echo(f"lesson {lesson['id']} is active: {lesson['text']}")


@lessons_app.command("forget")
def forget_lesson(ctx: typer.Context, lesson_id: int, as_json: JsonOption = False) -> None:
    """Stop serving a lesson and erase its text."""
    answer = call_server(ctx.obj, "DELETE", f"{LESSONS_PATH}/{lesson_id}")
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    typer.echo(f"lesson {answer['id']} {answer['note']}")
