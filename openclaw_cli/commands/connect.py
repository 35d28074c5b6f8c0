"""``openclaw connect CLIENT``: the client configuration that points a tool at the running proxy.

Clients and what they get (URL, key and model names come from the effective settings, so ``--config``, ``--host``,
``--port`` and ``--set`` work as for ``openclaw serve``):

- ``claude-code``: env vars ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_AUTH_TOKEN`` (sent as a Bearer token), the main
  slots ``ANTHROPIC_MODEL`` / ``ANTHROPIC_DEFAULT_SONNET_MODEL`` / ``ANTHROPIC_DEFAULT_OPUS_MODEL`` on the served
  policy name, the background slots ``ANTHROPIC_DEFAULT_HAIKU_MODEL`` (Claude Code 2.x) and
  ``ANTHROPIC_SMALL_FAST_MODEL`` (1.x) on ``openclaw-side`` (the proxy files every request for that name as a side
  turn: stored, never trained), and ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``. ``--write`` merges them into the
  ``"env"`` object of ``~/.claude/settings.json`` (``$CLAUDE_CONFIG_DIR/settings.json`` when that is set).
- ``openclaw``: an OpenClaw agent provider, ``models.providers.openclaw-rl`` (``api: "openai-completions"``,
  ``baseUrl`` ``http://HOST:PORT/v1``, ``apiKey``, the policy and ``openclaw-side`` as its models) and
  ``agents.defaults.model.primary = "openclaw-rl/<policy>"``, in the shape of OpenClaw's ``~/.openclaw/openclaw.json``
  as its documentation describes it (checked against OpenClaw 2026.9.6; OpenClaw itself reads JSON5, ``--write``
  only merges into plain JSON). ``contextWindow`` and ``maxTokens`` come from the running server (below); with none
  up, ``--context-window`` (default 32768) and ``proxy.default_max_tokens``.
- ``codex``: a ``~/.codex/config.toml`` (``$CODEX_HOME/config.toml``) provider ``[model_providers.openclaw-rl]``
  with ``base_url``, ``env_key = "OPENCLAW_API_KEY"`` (Codex reads the key from that variable, so the file holds no
  secret) and ``wire_api = "responses"`` (the proxy serves ``/v1/responses``), plus top-level ``model`` /
  ``model_provider`` and the model's window (``model_context_window``, and ``model_auto_compact_token_limit`` at 90%
  of it; from the running server as for openclaw), which Codex cannot look up for a model outside its catalogue.
- ``openai`` / ``anthropic``: ``OPENAI_BASE_URL`` + ``OPENAI_API_KEY`` or ``ANTHROPIC_BASE_URL`` +
  ``ANTHROPIC_API_KEY`` (both SDKs read these) and a three-line Python snippet. ``--write`` needs ``--path`` (a
  dotenv file).

**Secrets.** Printed output never holds the proxy key unless ``--show-secret``: it names the variable that holds it,
``${OPENCLAW_API_KEY}`` (what shells, dotenv loaders and OpenClaw's config expand; in JSON for Claude Code it is
only a placeholder). When the proxy has no key (loopback), a fixed placeholder is printed instead, because every
client insists on some key. ``--write`` puts the real key into the file (except codex, which names the variable),
creates or replaces it with mode 0600, and first copies the file it replaces to ``<file>.bak-<timestamp>`` (also
0600).

**The running server.** When a proxy answers at the configured address, ``connect`` reads its ``/v1/models``: the
served model name and its context window and output cap (a server's name wins over the settings', and
``openclaw-policy`` is accepted for the policy whatever it is served as). With none up it says so and uses the
settings.

**Sessions.** No session header is set by default: a fixed ``X-Session-Id`` would put every conversation of the
tool into one session scope, while the proxy otherwise separates them by their message history (Claude Code sends
its own ``X-Claude-Code-Session-Id``). ``--session-id ID`` adds one anyway where a client can send static headers.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
import shlex
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import tomli_w
import typer

from openclaw_cli.command_support import (
    EXIT_REFUSED,
    CliFailure,
    ConfigOption,
    HostOption,
    PortOption,
    SetOption,
    connect_host,
)
from openclaw_cli.proxy.models import SIDE_ALIAS, ModelCatalog
from openclaw_cli.settings import ENV_PREFIX, Settings, load_settings, parse_overrides

KEY_ENV = f"{ENV_PREFIX}API_KEY"  # where openclaw itself reads the proxy key from
NO_KEY_PLACEHOLDER = "openclaw-no-key"  # the proxy has no key: any non-empty value passes, clients insist on one
PROVIDER_ID = "openclaw-rl"
DEFAULT_CONTEXT_WINDOW = 32768
SESSION_HEADER = "X-Session-Id"
FILE_MODE = 0o600
PROBE_TIMEOUT_S = 2.0  # how long connect waits for a running server's /v1/models


class Client(StrEnum):
    claude_code = "claude-code"
    openclaw = "openclaw"
    codex = "codex"
    openai = "openai"
    anthropic = "anthropic"


class OutputFormat(StrEnum):
    shell = "shell"
    json = "json"
    toml = "toml"
    dotenv = "dotenv"
    python = "python"


# The formats each client can be printed in; the first is the default.
FORMATS: dict[Client, tuple[OutputFormat, ...]] = {
    Client.claude_code: (OutputFormat.shell, OutputFormat.json, OutputFormat.dotenv),
    Client.openclaw: (OutputFormat.json,),
    Client.codex: (OutputFormat.toml,),
    Client.openai: (OutputFormat.shell, OutputFormat.dotenv, OutputFormat.json, OutputFormat.python),
    Client.anthropic: (OutputFormat.shell, OutputFormat.dotenv, OutputFormat.json, OutputFormat.python),
}


@dataclass(frozen=True)
class EnvRef:
    """A value left in a variable: ``${NAME}`` in the output instead of the secret itself."""

    name: str

    def __str__(self) -> str:
        return "${" + self.name + "}"


Value = str | EnvRef


@dataclass(frozen=True)
class Endpoint:
    """Where the proxy answers and under which names."""

    root_url: str  # http://HOST:PORT, what Anthropic clients take
    main_model: str  # the served policy name
    side_model: str  # the name that marks a request as a side turn
    key: str | None  # the proxy's API key; None when it needs none

    @property
    def openai_url(self) -> str:
        return f"{self.root_url}/v1"

    def key_value(self, *, reveal: bool) -> Value:
        if self.key is None:
            return NO_KEY_PLACEHOLDER
        return self.key if reveal else EnvRef(KEY_ENV)


@dataclass(frozen=True)
class ConnectOptions:
    reveal: bool = False  # the key itself instead of ${OPENCLAW_API_KEY}
    session_id: str | None = None  # a static X-Session-Id, where the client can send one
    context_window: int = DEFAULT_CONTEXT_WINDOW  # openclaw: the model's window (unknown without loading it)
    max_tokens: int = 2048  # openclaw: the completion budget (proxy.default_max_tokens)


@dataclass(frozen=True)
class ServedModel:
    """What a running proxy says it serves (its ``/v1/models``)."""

    name: str
    context_window: int | None
    max_output_tokens: int | None


def probe_running(endpoint: Endpoint, timeout_s: float = PROBE_TIMEOUT_S) -> ServedModel | None:
    """The served model of the proxy answering at ``endpoint``; None when none answers (or not as a proxy)."""
    import httpx

    headers = {"authorization": f"Bearer {endpoint.key}"} if endpoint.key else {}
    try:
        response = httpx.get(f"{endpoint.openai_url}/models", headers=headers, timeout=timeout_s)
        first = response.json()["data"][0] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(first, dict) or not isinstance(first.get("id"), str):
        return None

    def number(key: str) -> int | None:
        value = first.get(key)
        return value if isinstance(value, int) and value > 0 else None

    return ServedModel(first["id"], number("context_window"), number("max_output_tokens"))


def endpoint_from_settings(settings: Settings) -> Endpoint:
    catalog = ModelCatalog.from_settings(settings)
    key = settings.api_key.get_secret_value() if settings.api_key is not None else ""
    root = f"http://{connect_host(settings.host)}:{settings.port}"
    return Endpoint(root_url=root, main_model=catalog.served_name, side_model=SIDE_ALIAS, key=key or None)


# ---------------------------------------------------------------------------------------------------------------
# What each client gets


def claude_code_env(endpoint: Endpoint, *, reveal: bool, session_id: str | None = None) -> dict[str, Value]:
    env: dict[str, Value] = {
        "ANTHROPIC_BASE_URL": endpoint.root_url,
        "ANTHROPIC_AUTH_TOKEN": endpoint.key_value(reveal=reveal),
        "ANTHROPIC_MODEL": endpoint.main_model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": endpoint.main_model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": endpoint.main_model,
        # Background calls (titles, summaries) and haiku subagents: side turns, served but never trained.
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": endpoint.side_model,
        "ANTHROPIC_SMALL_FAST_MODEL": endpoint.side_model,
        # Otherwise it contacts api.anthropic.com at start-up (telemetry, update checks).
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    if session_id:
        env["ANTHROPIC_CUSTOM_HEADERS"] = f"{SESSION_HEADER}: {session_id}"
    return env


def sdk_env(client: Client, endpoint: Endpoint, *, reveal: bool) -> dict[str, Value]:
    key = endpoint.key_value(reveal=reveal)
    if client is Client.openai:
        return {"OPENAI_BASE_URL": endpoint.openai_url, "OPENAI_API_KEY": key}
    if client is Client.anthropic:
        return {"ANTHROPIC_BASE_URL": endpoint.root_url, "ANTHROPIC_API_KEY": key}
    raise ValueError(f"{client} is not an SDK client")


def python_snippet(client: Client, endpoint: Endpoint) -> str:
    """Three lines that use the env vars of :func:`sdk_env` (both SDKs read their base URL and key from them)."""
    model = json.dumps(endpoint.main_model)
    hello = '[{"role": "user", "content": "Hello!"}]'
    if client is Client.openai:
        return (
            "from openai import OpenAI\n"
            f"reply = OpenAI().chat.completions.create(model={model}, messages={hello})\n"
            "print(reply.choices[0].message.content)\n"
        )
    if client is Client.anthropic:
        return (
            "import anthropic\n"
            f"reply = anthropic.Anthropic().messages.create(model={model}, max_tokens=256, messages={hello})\n"
            "print(reply.content[0].text)\n"
        )
    raise ValueError(f"{client} is not an SDK client")


def openclaw_fragment(endpoint: Endpoint, options: ConnectOptions) -> dict[str, Any]:
    """The part of ``openclaw.json`` that adds the proxy as a provider and makes the policy the default model."""

    def model(model_id: str, name: str) -> dict[str, Any]:
        return {
            "id": model_id,
            "name": name,
            "reasoning": False,
            "input": ["text"],
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            "contextWindow": options.context_window,
            "maxTokens": options.max_tokens,
        }

    provider: dict[str, Any] = {
        "baseUrl": endpoint.openai_url,
        "apiKey": str(endpoint.key_value(reveal=options.reveal)),
        "api": "openai-completions",
        "models": [
            model(endpoint.main_model, "openclaw-cli learning policy"),
            model(endpoint.side_model, "openclaw-cli policy, side turns (never trained)"),
        ],
    }
    if options.session_id:
        provider["headers"] = {SESSION_HEADER: options.session_id}
    return {
        "models": {"mode": "merge", "providers": {PROVIDER_ID: provider}},
        "agents": {"defaults": {"model": {"primary": f"{PROVIDER_ID}/{endpoint.main_model}"}}},
    }


# The two limits Codex's config reads (checked against codex 0.171.0; it has no output cap key).
CODEX_LIMIT_KEYS = ("model_context_window", "model_auto_compact_token_limit")


def codex_fragment(endpoint: Endpoint, options: ConnectOptions) -> dict[str, Any]:
    provider: dict[str, Any] = {"name": "openclaw-cli proxy", "base_url": endpoint.openai_url}
    if endpoint.key is not None:
        provider["env_key"] = KEY_ENV  # Codex reads the key from this variable: no secret in its file
    provider["wire_api"] = "responses"
    if options.session_id:
        provider["http_headers"] = {SESSION_HEADER: options.session_id}
    # The policy is not in Codex's model catalogue: without these it guesses a cloud model's window (and warns
    # "Model metadata ... not found"), so it would compact far too late for a small local model.
    limits = {
        "model_context_window": options.context_window,
        "model_auto_compact_token_limit": int(options.context_window * 0.9),
    }
    return {
        "model": endpoint.main_model,
        "model_provider": PROVIDER_ID,
        **limits,
        "model_providers": {PROVIDER_ID: provider},
    }


# ---------------------------------------------------------------------------------------------------------------
# Rendering


_DOTENV_BARE = re.compile(r"[A-Za-z0-9_./:@+,=-]*")


def render_shell(env: Mapping[str, Value]) -> str:
    lines = []
    for name, value in env.items():
        # A variable reference must stay expandable (double quotes); anything else is quoted literally.
        shown = f'"{value}"' if isinstance(value, EnvRef) else shlex.quote(value)
        lines.append(f"export {name}={shown}")
    return "\n".join(lines) + "\n"


def render_dotenv(env: Mapping[str, Value]) -> str:
    return "".join(f"{name}={_dotenv_value(value)}\n" for name, value in env.items())


def _dotenv_value(value: Value) -> str:
    if isinstance(value, EnvRef) or _DOTENV_BARE.fullmatch(value):
        return str(value)
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("\n", "\\n")
    return f'"{escaped}"'


def render_json(document: Any) -> str:
    return json.dumps(_plain(document), indent=2, ensure_ascii=False) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, EnvRef):
        return str(value)
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _commented(text: str) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in text.splitlines())


def render(client: Client, fmt: OutputFormat, endpoint: Endpoint, options: ConnectOptions) -> str:
    """The configuration of ``client`` as text in ``fmt`` (one of ``FORMATS[client]``)."""
    if fmt not in FORMATS[client]:
        allowed = ", ".join(FORMATS[client])
        raise CliFailure(f"connect {client}: --format {fmt} is not available; choose one of: {allowed}", EXIT_REFUSED)
    if client is Client.openclaw:
        return render_json(openclaw_fragment(endpoint, options))
    if client is Client.codex:
        return tomli_w.dumps(codex_fragment(endpoint, options))
    if client is Client.claude_code:
        env = claude_code_env(endpoint, reveal=options.reveal, session_id=options.session_id)
        extra = ""
        if fmt is OutputFormat.json:
            return render_json({"env": env})
    else:
        env = sdk_env(client, endpoint, reveal=options.reveal)
        snippet = python_snippet(client, endpoint)
        if fmt is OutputFormat.python:
            return snippet
        if fmt is OutputFormat.json:
            return render_json(env)
        extra = "\n" + _commented("Then, in Python:\n" + snippet)
    return render_dotenv(env) if fmt is OutputFormat.dotenv else render_shell(env) + extra


# ---------------------------------------------------------------------------------------------------------------
# Writing


def default_path(client: Client) -> Path | None:
    """The file ``--write`` merges into when no ``--path`` is given (None: the client has no usual file)."""
    home = Path.home()
    if client is Client.claude_code:
        base = os.environ.get("CLAUDE_CONFIG_DIR")
        return (Path(base) if base else home / ".claude") / "settings.json"
    if client is Client.openclaw:
        return home / ".openclaw" / "openclaw.json"
    if client is Client.codex:
        base = os.environ.get("CODEX_HOME")
        return (Path(base) if base else home / ".codex") / "config.toml"
    return None


@dataclass(frozen=True)
class WriteResult:
    path: Path
    backup: Path | None
    holds_secret: bool


def write_client_config(client: Client, endpoint: Endpoint, path: Path, options: ConnectOptions) -> WriteResult:
    """Merge the client's configuration into ``path`` (backing up what it replaces); the real key goes in."""
    target = path.expanduser()
    if target.is_symlink():
        target = target.resolve()  # update the file a dotfile manager links to, not the link
    if target.is_dir():
        raise CliFailure(f"{target} is a directory; --path takes a file")
    existing = target.read_text(encoding="utf-8") if target.exists() else None
    merge = _MERGERS[client]
    text = merge(existing, endpoint, options, target)
    backup = _backup(target) if existing is not None else None
    _atomic_write(target, text)
    holds_secret = endpoint.key is not None and client is not Client.codex
    return WriteResult(target, backup, holds_secret)


def _merge_claude_code(existing: str | None, endpoint: Endpoint, options: ConnectOptions, path: Path) -> str:
    document = _load_json_object(existing, path)
    env = document.get("env")
    if env is None:
        env = document["env"] = {}
    if not isinstance(env, dict):
        raise CliFailure(f'cannot merge into {path}: its "env" is not a JSON object')
    env.update(claude_code_env(endpoint, reveal=True, session_id=options.session_id))
    return render_json(document)


def _merge_openclaw(existing: str | None, endpoint: Endpoint, options: ConnectOptions, path: Path) -> str:
    document = _load_json_object(existing, path)
    fragment = openclaw_fragment(endpoint, dataclasses.replace(options, reveal=True))
    models = _object_at(document, ("models",), path)
    models.setdefault("mode", "merge")  # keep OpenClaw's built-in providers unless the file says otherwise
    providers = _object_at(document, ("models", "providers"), path)
    providers[PROVIDER_ID] = fragment["models"]["providers"][PROVIDER_ID]
    defaults = _object_at(document, ("agents", "defaults"), path)
    primary = fragment["agents"]["defaults"]["model"]["primary"]
    current = defaults.get("model")
    if isinstance(current, dict):
        current["primary"] = primary  # keep fallbacks and the rest
    elif isinstance(current, str):
        defaults["model"] = primary
    else:
        defaults["model"] = {"primary": primary}
    return render_json(document)


def _merge_codex(existing: str | None, endpoint: Endpoint, options: ConnectOptions, path: Path) -> str:
    try:
        document = tomllib.loads(existing) if existing else {}
    except tomllib.TOMLDecodeError as exc:
        raise CliFailure(f"cannot merge into {path}: not valid TOML ({exc})") from None
    fragment = codex_fragment(endpoint, options)
    for key in ("model", "model_provider", *CODEX_LIMIT_KEYS):
        document[key] = fragment[key]
    providers = document.setdefault("model_providers", {})
    if not isinstance(providers, dict):
        raise CliFailure(f"cannot merge into {path}: model_providers is not a table")
    providers[PROVIDER_ID] = fragment["model_providers"][PROVIDER_ID]
    return tomli_w.dumps(document)


_DOTENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


def _merge_dotenv_for(client: Client) -> Callable[[str | None, Endpoint, ConnectOptions, Path], str]:
    def merge(existing: str | None, endpoint: Endpoint, options: ConnectOptions, path: Path) -> str:
        ours = {name: _dotenv_value(value) for name, value in sdk_env(client, endpoint, reveal=True).items()}
        lines = (existing or "").splitlines()
        done: set[str] = set()
        for index, line in enumerate(lines):
            match = _DOTENV_LINE.match(line)
            if match and match.group(1) in ours:
                name = match.group(1)
                lines[index] = f"{name}={ours[name]}"
                done.add(name)
        lines.extend(f"{name}={value}" for name, value in ours.items() if name not in done)
        return "\n".join(lines) + "\n"

    return merge


_MERGERS: dict[Client, Callable[[str | None, Endpoint, ConnectOptions, Path], str]] = {
    Client.claude_code: _merge_claude_code,
    Client.openclaw: _merge_openclaw,
    Client.codex: _merge_codex,
    Client.openai: _merge_dotenv_for(Client.openai),
    Client.anthropic: _merge_dotenv_for(Client.anthropic),
}


def _load_json_object(text: str | None, path: Path) -> dict[str, Any]:
    if text is None or not text.strip():
        return {}
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliFailure(
            f"cannot merge into {path}: not plain JSON ({exc.msg} at line {exc.lineno}); files with comments "
            "(JSON5) are not rewritten: add the printed block by hand, or --write to another --path"
        ) from None
    if not isinstance(document, dict):
        raise CliFailure(f"cannot merge into {path}: the top level is not a JSON object")
    return document


def _object_at(document: dict[str, Any], keys: tuple[str, ...], path: Path) -> dict[str, Any]:
    node = document
    for depth, key in enumerate(keys):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise CliFailure(f"cannot merge into {path}: {'.'.join(keys[: depth + 1])} is not a JSON object")
        node = child
    return node


def _backup(path: Path) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    backup = path.with_name(f"{path.name}.bak-{stamp}")
    counter = 1
    while backup.exists():  # two writes within one second keep both backups
        backup = path.with_name(f"{path.name}.bak-{stamp}-{counter}")
        counter += 1
    shutil.copy2(path, backup)
    os.chmod(backup, FILE_MODE)  # the old file may hold keys too
    return backup


def _atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` in one step, owner-only from the start (never briefly readable by others)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------------------------
# The command


def connect_command(
    client: Annotated[Client, typer.Argument(help="The tool to configure.", show_default=False)],
    fmt: Annotated[
        OutputFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="shell|dotenv|json for claude-code, openai, anthropic (those two also python); "
            "openclaw: json; codex: toml. Default: the first listed.",
        ),
    ] = None,
    write: Annotated[
        bool,
        typer.Option("--write", help="Merge into the tool's config file (backup kept; mode 0600; real key)."),
    ] = False,
    path: Annotated[
        Path | None,
        typer.Option(
            "--path",
            dir_okay=False,
            help="File for --write (default: ~/.claude/settings.json, ~/.openclaw/openclaw.json, "
            "~/.codex/config.toml; required for openai/anthropic, written as dotenv).",
        ),
    ] = None,
    show_secret: Annotated[
        bool, typer.Option("--show-secret", help="Print the proxy key itself instead of ${OPENCLAW_API_KEY}.")
    ] = False,
    session_id: Annotated[
        str | None,
        typer.Option("--session-id", help="Send X-Session-Id: ID on every request (one session scope for all)."),
    ] = None,
    context_window: Annotated[
        int | None,
        typer.Option(
            "--context-window",
            min=1,
            help="openclaw only: the model's context window in tokens (default: the running server's, else 32768).",
        ),
    ] = None,
    config: ConfigOption = None,
    host: HostOption = None,
    port: PortOption = None,
    sets: SetOption = None,
) -> None:
    """Print (or --write) the configuration that points Claude Code, OpenClaw, Codex or an SDK at the proxy."""
    overrides = parse_overrides(sets or [])
    for key, value in (("host", host), ("port", port)):
        if value is not None:
            overrides[key] = value
    settings = load_settings(overrides, config=config)
    endpoint = endpoint_from_settings(settings)
    served = probe_running(endpoint)
    max_tokens = settings.proxy.default_max_tokens
    if served is not None:
        endpoint = dataclasses.replace(endpoint, main_model=served.name)
        if served.max_output_tokens is not None:
            max_tokens = min(max_tokens, served.max_output_tokens)
        window = served.context_window
        typer.echo(
            f"# read from the server at {endpoint.root_url}: model {served.name}"
            + (f", context window {window}, output cap {served.max_output_tokens}" if window else ""),
            err=True,
        )
    else:
        window = None
        typer.echo(f"# no proxy answers at {endpoint.root_url}: names and limits come from the settings", err=True)
    options = ConnectOptions(
        reveal=show_secret,
        session_id=session_id,
        context_window=context_window or window or DEFAULT_CONTEXT_WINDOW,
        max_tokens=max_tokens,
    )
    if not write:
        if path is not None:
            raise CliFailure("--path is where --write writes; add --write (or leave --path out)", EXIT_REFUSED)
        typer.echo(render(client, fmt or FORMATS[client][0], endpoint, options), nl=False)
        _print_hints(client, fmt or FORMATS[client][0], endpoint, show_secret)
        return
    _write(client, fmt, path, endpoint, options)


# The format --write produces for each client (the tool's own file format).
WRITE_FORMATS: dict[Client, OutputFormat] = {
    Client.claude_code: OutputFormat.json,
    Client.openclaw: OutputFormat.json,
    Client.codex: OutputFormat.toml,
    Client.openai: OutputFormat.dotenv,
    Client.anthropic: OutputFormat.dotenv,
}


def _write(
    client: Client, fmt: OutputFormat | None, path: Path | None, endpoint: Endpoint, options: ConnectOptions
) -> None:
    native = WRITE_FORMATS[client]
    if fmt is not None and fmt is not native:
        raise CliFailure(f"connect {client} --write writes {native}; leave --format out", EXIT_REFUSED)
    target = path or default_path(client)
    if target is None:
        raise CliFailure(f"connect {client} --write needs --path (a dotenv file such as .env)", EXIT_REFUSED)
    result = write_client_config(client, endpoint, target, options)
    typer.echo(f"wrote {result.path}" + (f" (previous version saved as {result.backup})" if result.backup else ""))
    notes: list[str] = []
    if result.holds_secret:
        notes.append(f"{result.path} holds the proxy API key: it was written with mode 0600 (owner only)")
    if client is Client.claude_code and "ANTHROPIC_API_KEY" in json.loads(result.path.read_text())["env"]:
        notes.append(
            f"{result.path} also sets ANTHROPIC_API_KEY, which Claude Code sends as x-api-key and the proxy checks "
            "before the Bearer token: remove it unless it is the proxy key"
        )
    if client is Client.codex:
        if endpoint.key is not None:
            notes.append(f"codex reads the key from ${KEY_ENV}: export it in the shell that runs codex")
        if result.backup is not None:
            notes.append(f"comments of the old file are kept only in {result.backup}")
    for note in notes:
        typer.echo(f"note: {note}", err=True)


def _print_hints(client: Client, fmt: OutputFormat, endpoint: Endpoint, show_secret: bool) -> None:
    """How to use what was printed, on stderr so stdout stays the configuration alone."""
    hints: list[str] = []
    if fmt is OutputFormat.shell:
        hints.append(f'load into this shell: eval "$(openclaw connect {client})"')
    key_hidden = endpoint.key is not None and not show_secret and client is not Client.codex
    if key_hidden and not os.environ.get(KEY_ENV):
        hints.append(f"the key is shown as ${{{KEY_ENV}}}, which is not set here: export it or use --show-secret")
    if client is Client.claude_code and fmt is OutputFormat.shell:
        hints.append("or --write them into ~/.claude/settings.json; unset ANTHROPIC_API_KEY (it would win)")
    for hint in hints:
        typer.echo(f"# {hint}", err=True)
