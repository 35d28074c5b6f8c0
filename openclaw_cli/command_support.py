"""What every command shares: one failure type, one exit-code policy, the common options.

Every command runs under :class:`openclaw_cli.cli.OpenclawGroup`, which turns a :class:`CliFailure` into red
``error:`` line(s) on stderr and its exit code, and a :class:`~openclaw_cli.settings.SettingsError` (a bad config
file, ``--set``, or environment value) into exit code :data:`EXIT_REFUSED`, whichever command read the settings.
Exit codes: 0 done; :data:`EXIT_FAILED` (1) something could not be done (nothing answered, a check failed, a
backend or store error); :data:`EXIT_REFUSED` (2) the input is refused (settings, usage, an unsafe request), the
code click itself uses for usage errors.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from openclaw_cli.loopback import is_loopback
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
ReportToOption = Annotated[
    str | None,
    typer.Option(
        "--report-to",
        metavar="TRACKERS",
        help="Send each training step's metrics to tensorboard, wandb, mlflow and/or trackio (comma-separated; all; "
        "none). Overrides train.report_to.",
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


@dataclass
class CliState:
    """Global options, shared with every subcommand through ``ctx.obj``."""

    config: Path | None = None
    debug: bool = False


def cli_state(ctx: typer.Context) -> CliState:
    return ctx.obj if isinstance(ctx.obj, CliState) else CliState()


def stdout_console() -> Console:
    # Built per use so the console always writes to the current sys.stdout (CliRunner swaps it).
    return Console()


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


@dataclass
class LoadedSettings:
    """What :func:`with_settings` hands a command."""

    settings: Settings
    overrides: dict[str, Any]
    config: Path | None  # the --config given (subcommand's, else the global one); None = ./openclaw.toml if any


def load_for_command(
    ctx: typer.Context,
    config: Path | None,
    *,
    backend: str | None = None,
    model: str | None = None,
    host: str | None = None,
    port: int | None = None,
    method: str | None = None,
    sets: list[str] | None = None,
) -> LoadedSettings:
    config = config or cli_state(ctx).config
    overrides = command_overrides(sets, backend=backend, model=model, host=host, port=port, method=method)
    return LoadedSettings(load_settings(overrides, config=config), overrides, config)


def _state(ctx: typer.Context) -> CliState:
    return ctx.obj if isinstance(ctx.obj, CliState) else CliState()


# The settings options every settings-reading command takes, resolved once by with_settings.
_SETTINGS_PARAMETERS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
    for name, annotation in (
        ("config", ConfigOption),
        ("backend", BackendOption),
        ("model", ModelOption),
        ("host", HostOption),
        ("port", PortOption),
        ("method", MethodOption),
        ("sets", SetOption),
    )
]


def with_settings(command: Callable[..., None]) -> Callable[..., None]:
    """A command written as ``command(loaded: LoadedSettings, ...its own options)`` gets the shared settings options
    (``-c/--config``, ``--backend``, ``--model``, ``--host``, ``--port``, ``--method``, ``--set``) added to its
    command line and receives the settings they resolve to (config < env < --set < named flags)."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())[1:]  # after `loaded`
    ctx_parameter = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    parameters = [ctx_parameter, *_SETTINGS_PARAMETERS, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own)]

    @functools.wraps(command)
    def resolved(ctx: typer.Context, **options: Any) -> None:
        shared = {p.name: options.pop(p.name) for p in _SETTINGS_PARAMETERS}
        config, sets = shared.pop("config"), shared.pop("sets")
        command(load_for_command(ctx, config, sets=sets, **shared), **options)

    # typer reads the command line from the signature and the type hints: the wrapper's own, not the command's.
    resolved.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    resolved.__annotations__ = {p.name: p.annotation for p in parameters}
    return resolved


def optional_attr(module_name: str, attr: str, feature: str) -> Callable[..., Any]:
    """Import ``module_name.attr`` on first use; a missing part becomes one plain CliFailure line."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise CliFailure(f"{feature} is not available in this build ({module_name} is missing)") from None
        raise CliFailure(f"{feature} cannot load: missing dependency {missing or exc}") from None
    except ImportError as exc:
        raise CliFailure(f"{feature} cannot load: {exc}") from None
    found = getattr(module, attr, None)
    if found is None:
        raise CliFailure(f"{feature} is not available in this build ({module_name}.{attr} is missing)")
    return found


def installed_version(distribution: str) -> str | None:
    try:
        return dist_version(distribution)
    except PackageNotFoundError:
        return None


def check_mark(ok: bool) -> Text:
    return Text("✓", style="bold green") if ok else Text("✗", style="bold red")


def has_api_key(settings: Settings) -> bool:
    return bool(settings.accepted_api_keys())


def call_server(
    settings: Settings,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    timeout_s: float = 30.0,
    owner: str | None = None,
) -> dict[str, Any]:
    """One call to the running server on ``host:port`` with the configured API key (the first one: the CLI acts as
    that key's owner; ``owner``, an owner id, acts as that owner instead: :func:`owner_headers`); its error (in
    OpenAI's format) becomes a CliFailure with its message (exit 2 for a 400/404)."""
    import httpx

    where = f"{settings.host}:{settings.port}"
    url = f"http://{connect_host(settings.host)}:{settings.port}{path}"
    keys = settings.accepted_api_keys()
    headers = owner_headers(settings, owner) if owner else {"Authorization": f"Bearer {keys[0]}"} if keys else {}
    try:
        timeout = httpx.Timeout(timeout_s, connect=5.0)
        with httpx.Client(timeout=timeout, trust_env=not is_loopback(settings.host)) as client:
            response = client.request(method, url, headers=headers, json=body)
    except httpx.ConnectError:
        raise CliFailure(f"no openclaw server on {where} (start one with `openclaw launch`)") from None
    except httpx.TimeoutException:
        raise CliFailure(f"the server on {where} did not answer {method} {path} in time") from None
    except httpx.HTTPError as exc:
        raise CliFailure(f"cannot reach the server on {where}: {type(exc).__name__}: {exc}") from None
    try:
        payload = response.json()
    except ValueError:
        raise CliFailure(f"the server on {where} is not an openclaw server (no JSON at {path})") from None
    if 200 <= response.status_code < 300:
        return payload
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    message = message or f"HTTP {response.status_code}"
    if response.status_code == 401:
        raise CliFailure(f"the server on {where} refused the API key: {message} (set api_key / OPENCLAW_API_KEY)")
    refused = response.status_code in (400, 404)
    raise CliFailure(f"the server on {where}: {message}", EXIT_REFUSED if refused else EXIT_FAILED)


def owner_headers(settings: Settings, owner: str) -> dict[str, str]:
    """How the operator's CLI acts as ``owner`` (``--owner``, an id as ``openclaw status`` lists owners): with that
    owner's key from the configuration (the server learns nothing it does not already hold), or, for a session
    owner (``lessons.scope = session``), with its session id. An id no configured key or session matches fails."""
    from openclaw_cli.lesson_prompt import key_owner

    keys = settings.accepted_api_keys()
    if owner.startswith("session:") and settings.lessons.scope == "session":
        return {
            "X-Session-Id": owner.removeprefix("session:"),
            **({"Authorization": f"Bearer {keys[0]}"} if keys else {}),
        }
    for key in keys:
        if key_owner(key) == owner:
            return {"Authorization": f"Bearer {key}"}
    raise CliFailure(
        f"no configured API key belongs to owner {owner} (owner ids are key:<hash> as `openclaw status` lists them, "
        "or session:<id> with lessons.scope = session)",
        EXIT_REFUSED,
    )


def begin_service(settings: Settings, doing: str, detail: str) -> None:
    """What ``serve`` and ``launch`` do first: refuse a bind others can reach without an API key, then say in one
    bold line what starts where."""
    if not is_loopback(settings.host) and not has_api_key(settings):
        raise CliFailure(
            f"refusing to bind {settings.host} without an API key: anyone who can reach it could use the policy and "
            "read captured conversations; set api_key (OPENCLAW_API_KEY=...) or bind 127.0.0.1",
            EXIT_REFUSED,
        )
    model_name = settings.model or "embedded SmolLM2-135M-Instruct"
    where = f"{model_name} with backend {settings.backend} on http://{settings.host}:{settings.port}"
    stdout_console().print(Text(f"{doing} {where}{detail}", style="bold"), soft_wrap=True)


@contextlib.contextmanager
def service_failures(refused: Sequence[tuple[str, str]], failed: Sequence[tuple[str, str]] = ()) -> Iterator[None]:
    """A running service's expected failures as one plain line: the exception classes named (module, class) in
    ``refused`` (settings it cannot start with) exit :data:`EXIT_REFUSED`; those in ``failed`` and an OSError (the
    port is taken) :data:`EXIT_FAILED`. A class whose module was never imported cannot have been raised: it is not
    imported for this."""

    def loaded(named: Sequence[tuple[str, str]]) -> tuple[type, ...]:
        found = (getattr(sys.modules.get(module), name, None) for module, name in named)
        return tuple(cls for cls in found if isinstance(cls, type))

    try:
        yield
    except Exception as exc:
        if isinstance(exc, loaded(refused)):
            raise CliFailure(str(exc), EXIT_REFUSED) from None
        if isinstance(exc, (OSError, *loaded(failed))):
            raise CliFailure(str(exc)) from None
        raise


def connect_host(host: str) -> str:
    """The address a client dials: a wildcard bind is reached on loopback; IPv6 literals get brackets."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def with_report_to(settings: Settings, value: str | None) -> Settings:
    """``--report-to tensorboard,mlflow`` (or ``none``) over train.report_to, validated like the setting."""
    if value is None:
        return settings
    from pydantic import ValidationError

    try:
        train = type(settings.train).model_validate({**settings.train.model_dump(), "report_to": value})
    except ValidationError as exc:
        from openclaw_cli.settings import TRACKERS

        raise CliFailure(
            f"--report-to {value!r}: {exc.errors()[0]['msg']} (trackers: {', '.join(TRACKERS)}, all, none)",
            EXIT_REFUSED,
        ) from None
    return settings.model_copy(update={"train": train})
