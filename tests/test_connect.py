"""``openclaw connect``: every client's output parses back (shlex, json, tomllib), names the right variables and
reaches the configured port; ``--write`` merges, backs up and keeps the file owner-only; the key never shows without
``--show-secret``. The printed OpenAI/Anthropic settings and snippets are then used, as printed, with the real SDKs
against a live proxy, and Claude Code's background slot is checked to land as a side turn."""

from __future__ import annotations

import ast
import json
import os
import shlex
import stat
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from typer.testing import CliRunner

from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.cli import app
from openclaw_cli.commands.connect import (
    FORMATS,
    KEY_ENV,
    NO_KEY_PLACEHOLDER,
    PROVIDER_ID,
    Client,
    OutputFormat,
    connect_host,
)
from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.proxy.models import ModelCatalog
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink

SECRET = "sk-proxy-secret-4242"
PORT = 18555
REF = "${" + KEY_ENV + "}"
CLAUDE_NAMES = [
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
]

runner = CliRunner()


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No keys or client settings from the developer's shell; HOME is a temp dir so nothing real is ever written."""
    for name in list(os.environ):
        if name.startswith(("OPENCLAW_", "OPENAI_", "ANTHROPIC_")) or name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def connect(*args: str) -> Any:
    return runner.invoke(app, ["connect", *args])


def ok(*args: str) -> Any:
    result = connect(*args)
    assert result.exit_code == 0, result.output
    return result


def parse_shell(text: str) -> dict[str, str]:
    """``export NAME=VALUE`` lines as the shell would split them (no expansion); comments and blank lines skipped."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        assert words[0] == "export" and len(words) == 2, line
        name, _, value = words[1].partition("=")
        env[name] = value
    return env


def parse_dotenv(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        assert sep and name.isidentifier(), line
        env[name] = json.loads(value) if value.startswith('"') else value
    return env


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------------------------------------------------------
# What is printed


def test_claude_code_shell_block_names_every_slot_and_hides_the_key():
    result = ok("claude-code", "--port", str(PORT), "--set", f"api_key={SECRET}")
    env = parse_shell(result.stdout)
    assert list(env) == CLAUDE_NAMES
    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{PORT}"
    assert env["ANTHROPIC_AUTH_TOKEN"] == REF
    assert f'export ANTHROPIC_AUTH_TOKEN="{REF}"' in result.stdout  # double quotes: the shell expands it
    assert (env["ANTHROPIC_MODEL"], env["ANTHROPIC_DEFAULT_SONNET_MODEL"]) == ("openclaw-policy", "openclaw-policy")
    assert (env["ANTHROPIC_DEFAULT_HAIKU_MODEL"], env["ANTHROPIC_SMALL_FAST_MODEL"]) == ("openclaw-side",) * 2
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert SECRET not in result.output
    assert f"{KEY_ENV}" in result.stderr and "--show-secret" in result.stderr  # the key var is not set here


def test_claude_code_json_and_dotenv_match_the_shell_block():
    shell = parse_shell(ok("claude-code", "--show-secret", "--set", f"api_key={SECRET}").stdout)
    document = json.loads(ok("claude-code", "-f", "json", "--show-secret", "--set", f"api_key={SECRET}").stdout)
    dotenv = parse_dotenv(ok("claude-code", "-f", "dotenv", "--show-secret", "--set", f"api_key={SECRET}").stdout)
    assert list(document) == ["env"]
    assert document["env"] == shell == dotenv
    assert shell["ANTHROPIC_AUTH_TOKEN"] == SECRET


def test_model_slots_are_names_the_proxy_serves_and_the_haiku_slot_is_a_side_turn():
    result = ok("claude-code", "--set", "proxy.served_model_name=my-policy", "--set", 'proxy.model_aliases=["x"]')
    env = parse_shell(result.stdout)
    catalog = ModelCatalog.from_settings(Settings(proxy={"served_model_name": "my-policy"}))
    for slot in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL"):
        assert env[slot] == "my-policy"
        assert catalog.resolve(env[slot]).turn_type_hint is None  # main unless the session logic says otherwise
    for slot in ("ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL"):
        assert catalog.resolve(env[slot]).turn_type_hint == "side"


def test_no_key_configured_prints_the_placeholder_and_no_key_hint():
    result = ok("claude-code")
    assert parse_shell(result.stdout)["ANTHROPIC_AUTH_TOKEN"] == NO_KEY_PLACEHOLDER
    assert "--show-secret" not in result.stderr


def test_openclaw_provider_entry():
    result = ok("openclaw", "--port", str(PORT), "--set", f"api_key={SECRET}", "--context-window", "8192")
    document = json.loads(result.stdout)
    provider = document["models"]["providers"][PROVIDER_ID]
    assert document["models"]["mode"] == "merge"
    assert provider["baseUrl"] == f"http://127.0.0.1:{PORT}/v1"
    assert (provider["api"], provider["apiKey"]) == ("openai-completions", REF)
    assert [m["id"] for m in provider["models"]] == ["openclaw-policy", "openclaw-side"]
    assert {m["contextWindow"] for m in provider["models"]} == {8192}
    assert {m["maxTokens"] for m in provider["models"]} == {2048}  # proxy.default_max_tokens
    assert "headers" not in provider
    assert document["agents"]["defaults"]["model"]["primary"] == f"{PROVIDER_ID}/openclaw-policy"
    assert SECRET not in result.output


def test_codex_provider_block():
    result = ok("codex", "--port", str(PORT), "--set", f"api_key={SECRET}")
    document = tomllib.loads(result.stdout)
    assert document["model"] == "openclaw-policy"
    assert document["model_provider"] == PROVIDER_ID
    assert document["model_providers"][PROVIDER_ID] == {
        "name": "openclaw-cli proxy",
        "base_url": f"http://127.0.0.1:{PORT}/v1",
        "env_key": KEY_ENV,
        "wire_api": "responses",
    }
    assert "no proxy answers" in result.stderr  # nothing runs on PORT: the settings' names and limits
    # Without a proxy key Codex must not demand an env var.
    assert "env_key" not in tomllib.loads(ok("codex").stdout)["model_providers"][PROVIDER_ID]


@pytest.mark.parametrize(
    ("client", "base_url"),
    [("openai", f"http://127.0.0.1:{PORT}/v1"), ("anthropic", f"http://127.0.0.1:{PORT}")],
)
def test_sdk_clients_in_every_format(client: str, base_url: str):
    prefix = client.upper()
    common = ("--port", str(PORT), "--set", f"api_key={SECRET}")
    shell = ok(client, *common).stdout
    expected = {f"{prefix}_BASE_URL": base_url, f"{prefix}_API_KEY": REF}
    assert parse_shell(shell) == expected
    assert parse_dotenv(ok(client, "-f", "dotenv", *common).stdout) == expected
    assert json.loads(ok(client, "-f", "json", *common).stdout) == expected
    snippet = ok(client, "-f", "python", *common).stdout
    assert len(snippet.splitlines()) == 3
    ast.parse(snippet)
    assert '"openclaw-policy"' in snippet
    # The shell block carries the same snippet as comments.
    assert [line.removeprefix("# ") for line in shell.splitlines()[-3:]] == snippet.splitlines()


def test_the_key_never_shows_without_show_secret():
    for client, formats in FORMATS.items():
        for fmt in formats:
            result = ok(str(client), "-f", str(fmt), "--set", f"api_key={SECRET}")
            assert SECRET not in result.output, (client, fmt)
            revealed = ok(str(client), "-f", str(fmt), "--set", f"api_key={SECRET}", "--show-secret")
            # codex names the variable and the Python snippet reads it from the env: neither ever holds the key.
            holds_key = client is not Client.codex and fmt is not OutputFormat.python
            assert (SECRET in revealed.stdout) is holds_key, (client, fmt)


def test_urls_follow_host_port_and_the_config_file(tmp_path: Path):
    config = tmp_path / "proxy.toml"
    config.write_text('host = "0.0.0.0"\nport = 9911\napi_key = "from-file"\n')
    env = parse_shell(runner.invoke(app, ["--config", str(config), "connect", "openai"]).stdout)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9911/v1"  # a wildcard bind is reached on loopback
    env = parse_shell(ok("anthropic", "--host", "::1", "--port", "7000").stdout)
    assert env["ANTHROPIC_BASE_URL"] == "http://[::1]:7000"
    assert (connect_host("::"), connect_host("localhost"), connect_host("10.1.2.3")) == (
        "[::1]",
        "localhost",
        "10.1.2.3",
    )


def test_session_id_becomes_a_static_header_where_the_client_has_one():
    assert (
        parse_shell(ok("claude-code", "--session-id", "s-1").stdout)["ANTHROPIC_CUSTOM_HEADERS"] == "X-Session-Id: s-1"
    )
    provider = json.loads(ok("openclaw", "--session-id", "s-1").stdout)["models"]["providers"][PROVIDER_ID]
    assert provider["headers"] == {"X-Session-Id": "s-1"}
    codex = tomllib.loads(ok("codex", "--session-id", "s-1").stdout)["model_providers"][PROVIDER_ID]
    assert codex["http_headers"] == {"X-Session-Id": "s-1"}


def test_usage_errors_exit_2():
    for args, message in (
        (("codex", "-f", "json"), "choose one of: toml"),
        (("openclaw", "-f", "shell"), "choose one of: json"),
        (("openai", "--path", "x.env"), "add --write"),
        (("openai", "--write"), "needs --path"),
        (("claude-code", "--write", "-f", "shell"), "writes json"),
    ):
        result = connect(*args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
    assert connect("vim").exit_code == 2


# ---------------------------------------------------------------------------------------------------------------
# --write


def test_write_claude_code_merges_env_keeps_other_keys_and_backs_up(tmp_path: Path):
    settings_file = tmp_path / "claude" / "settings.json"
    settings_file.parent.mkdir()
    original = {"permissions": {"allow": ["Bash(ls)"]}, "env": {"FOO": "1", "ANTHROPIC_MODEL": "old"}, "model": "x"}
    settings_file.write_text(json.dumps(original))
    settings_file.chmod(0o644)

    result = ok(
        "claude-code", "--write", "--path", str(settings_file), "--port", str(PORT), "--set", f"api_key={SECRET}"
    )
    written = json.loads(settings_file.read_text())
    assert written["permissions"] == original["permissions"] and written["model"] == "x"
    assert written["env"]["FOO"] == "1"
    assert set(written["env"]) == {"FOO", *CLAUDE_NAMES}
    assert written["env"]["ANTHROPIC_MODEL"] == "openclaw-policy"
    assert written["env"]["ANTHROPIC_AUTH_TOKEN"] == SECRET  # the file needs the real key ...
    assert mode(settings_file) == 0o600  # ... so it is owner-only
    assert "mode 0600" in result.stderr and SECRET not in result.output

    (backup,) = settings_file.parent.glob("settings.json.bak-*")
    assert json.loads(backup.read_text()) == original
    assert mode(backup) == 0o600
    assert str(backup) in result.stdout

    ok("claude-code", "--write", "--path", str(settings_file))  # a second write keeps a second backup
    assert len(list(settings_file.parent.glob("settings.json.bak-*"))) == 2
    assert json.loads(settings_file.read_text())["env"]["ANTHROPIC_AUTH_TOKEN"] == NO_KEY_PLACEHOLDER


def test_write_claude_code_default_path_and_warning_about_api_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ok("claude-code", "--write")
    default = tmp_path / "home" / ".claude" / "settings.json"
    assert list(json.loads(default.read_text())["env"]) == CLAUDE_NAMES
    assert not list(default.parent.glob("*.bak-*"))  # nothing was replaced

    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(tmp_path / "cc"))
    (tmp_path / "cc").mkdir()
    (tmp_path / "cc" / "settings.json").write_text('{"env": {"ANTHROPIC_API_KEY": "sk-ant-real"}}')
    result = ok("claude-code", "--write")
    assert "ANTHROPIC_API_KEY" in result.stderr and "x-api-key" in result.stderr


def test_write_follows_a_symlinked_settings_file(tmp_path: Path):
    real = tmp_path / "dotfiles" / "settings.json"
    real.parent.mkdir()
    real.write_text("{}")
    link = tmp_path / "settings.json"
    link.symlink_to(real)
    ok("claude-code", "--write", "--path", str(link))
    assert link.is_symlink()
    assert "env" in json.loads(real.read_text())


def test_write_openclaw_merges_provider_and_primary_model(tmp_path: Path):
    path = tmp_path / "openclaw.json"
    original = {
        "gateway": {"mode": "local"},
        "models": {"providers": {"other": {"baseUrl": "https://x/v1", "api": "openai-completions", "models": []}}},
        "agents": {"defaults": {"model": {"primary": "other/m", "fallbacks": ["other/n"]}, "workspace": "~/w"}},
    }
    path.write_text(json.dumps(original))
    ok("openclaw", "--write", "--path", str(path), "--port", str(PORT), "--set", f"api_key={SECRET}")
    written = json.loads(path.read_text())
    assert written["gateway"] == {"mode": "local"}
    assert set(written["models"]["providers"]) == {"other", PROVIDER_ID}
    assert written["models"]["mode"] == "merge"
    ours = written["models"]["providers"][PROVIDER_ID]
    assert (ours["baseUrl"], ours["apiKey"]) == (f"http://127.0.0.1:{PORT}/v1", SECRET)
    assert written["agents"]["defaults"]["model"] == {
        "primary": f"{PROVIDER_ID}/openclaw-policy",
        "fallbacks": ["other/n"],
    }
    assert written["agents"]["defaults"]["workspace"] == "~/w"
    assert mode(path) == 0o600
    assert len(list(tmp_path.glob("openclaw.json.bak-*"))) == 1


def test_write_openclaw_refuses_json5_and_leaves_it_alone(tmp_path: Path):
    path = tmp_path / "openclaw.json"
    text = "{\n  // my agent\n  agents: { defaults: {} },\n}\n"
    path.write_text(text)
    result = connect("openclaw", "--write", "--path", str(path))
    assert result.exit_code == 1
    assert "not plain JSON" in result.stderr and "Traceback" not in result.output
    assert path.read_text() == text
    assert not list(tmp_path.glob("*.bak-*"))


def test_write_codex_merges_toml_without_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    (tmp_path / "codex").mkdir()
    config = tmp_path / "codex" / "config.toml"
    config.write_text('model = "gpt-5"\napproval_policy = "on-request"\n\n[model_providers.ollama]\nname = "Ollama"\n')
    result = ok("codex", "--write", "--set", f"api_key={SECRET}")
    written = tomllib.loads(config.read_text())
    assert written["approval_policy"] == "on-request"
    assert (written["model"], written["model_provider"]) == ("openclaw-policy", PROVIDER_ID)
    assert set(written["model_providers"]) == {"ollama", PROVIDER_ID}
    assert written["model_providers"][PROVIDER_ID]["env_key"] == KEY_ENV
    assert SECRET not in config.read_text()
    assert "mode 0600" not in result.stderr and KEY_ENV in result.stderr
    assert len(list(config.parent.glob("config.toml.bak-*"))) == 1


def test_write_dotenv_for_the_sdks(tmp_path: Path):
    path = tmp_path / ".env"
    path.write_text("OTHER=1\nexport OPENAI_API_KEY=old\n# comment\n")
    ok("openai", "--write", "--path", str(path), "--port", str(PORT), "--set", f"api_key={SECRET}")
    assert path.read_text() == (
        f"OTHER=1\nOPENAI_API_KEY={SECRET}\n# comment\nOPENAI_BASE_URL=http://127.0.0.1:{PORT}/v1\n"
    )
    assert mode(path) == 0o600


# ---------------------------------------------------------------------------------------------------------------
# The printed settings against a live proxy, with the real SDKs


@pytest.fixture
def live_proxy(tiny_tokenizer) -> Iterator[tuple[MemorySink, BackgroundServer]]:
    backend = FakeBackend(tiny_tokenizer, default_reply="Hello from the policy.")
    sink = MemorySink()
    with BackgroundServer(create_app(backend, sink, Settings(api_key=SECRET))) as server:
        yield sink, server


def shell_env(block: str, names: list[str]) -> dict[str, str]:
    """Evaluate the printed block in a real bash, with the key in OPENCLAW_API_KEY, and read the variables back."""
    script = block + "".join(f'printf "%s\\0" "${name}"\n' for name in names)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), KEY_ENV: SECRET}
    done = subprocess.run(["bash", "-c", script], capture_output=True, env=env, timeout=30, check=True)
    return dict(zip(names, done.stdout.decode().split("\0")[:-1], strict=True))


@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_printed_settings_and_snippet_work_with_the_real_sdk(client, live_proxy, monkeypatch, capsys):
    sink, server = live_proxy
    prefix = client.upper()
    monkeypatch.setenv(KEY_ENV, SECRET)  # as for `openclaw serve`: the key lives in the environment
    block = ok(client, "--port", str(server.port)).stdout
    assert SECRET not in block
    env = shell_env(block, [f"{prefix}_BASE_URL", f"{prefix}_API_KEY"])
    assert env[f"{prefix}_API_KEY"] == SECRET  # the shell expanded the reference
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    snippet = ok(client, "-f", "python", "--port", str(server.port)).stdout
    capsys.readouterr()
    exec(compile(snippet, f"<connect {client} snippet>", "exec"), {})
    assert capsys.readouterr().out == "Hello from the policy.\n"
    (exchange,) = sink.exchanges
    assert exchange.model == "openclaw-policy"


def test_claude_code_settings_reach_the_proxy_and_background_calls_are_side_turns(tiny_tokenizer, tmp_path):
    settings = Settings(api_key=SECRET, store={"path": tmp_path / "store.sqlite3"})
    backend = FakeBackend(tiny_tokenizer, default_reply="ok")
    with Store(settings.store.path) as store:
        app_ = create_app(backend, SessionCapture(store, settings), settings)
        with BackgroundServer(app_) as server:
            env = json.loads(
                ok(
                    "claude-code",
                    "-f",
                    "json",
                    "--show-secret",
                    "--port",
                    str(server.port),
                    "--set",
                    f"api_key={SECRET}",
                ).stdout
            )["env"]
            # What Claude Code does with them: the token as a Bearer header, the slots as model names.
            client = anthropic.Anthropic(
                base_url=env["ANTHROPIC_BASE_URL"], auth_token=env["ANTHROPIC_AUTH_TOKEN"], api_key=None, max_retries=0
            )
            for slot, text in (("ANTHROPIC_MODEL", "Fix the bug."), ("ANTHROPIC_DEFAULT_HAIKU_MODEL", "Title?")):
                client.messages.create(
                    model=env[slot],
                    max_tokens=16,
                    messages=[{"role": "user", "content": text}],
                    extra_headers={"X-Claude-Code-Session-Id": "cc-1"},
                )
        turns = list(store.iter_turns())
    # The haiku slot's name alone makes the proxy file the request as a side turn (never judged or trained).
    assert [(t.model, t.turn_type, t.session_id) for t in turns] == [
        ("openclaw-policy", "main", "cc-1"),
        ("openclaw-side", "side", "cc-1"),
    ]
    assert turns[1].status == "skipped"


def test_connect_reads_the_running_servers_name_and_limits(tiny_tokenizer: Any) -> None:
    """`serve --model DIR` serves the name DIR: connect prints that name (and openclaw-policy works too), and OpenClaw
    gets the served model's context window and output cap instead of a guess."""
    from openclaw_cli.tokenizer import HFChatTokenizer

    small = HFChatTokenizer(tiny_tokenizer.hf, context_length=8192)
    settings = Settings(model="/models/my-tiny", api_key=SECRET)
    with BackgroundServer(create_app(FakeBackend(small, ["hi"]), MemorySink(), settings)) as server:
        port = server.base_url.rsplit(":", 1)[1]
        result = ok("openclaw", "--port", port, "--set", f"api_key={SECRET}")
        provider = json.loads(result.stdout)["models"]["providers"][PROVIDER_ID]
        assert provider["models"][0]["id"] == "/models/my-tiny"
        assert {m["contextWindow"] for m in provider["models"]} == {8192}
        assert {m["maxTokens"] for m in provider["models"]} == {2048}  # the server's cap: 8192 // 4
        assert "read from the server" in result.stderr
        codex = tomllib.loads(ok("codex", "--port", port, "--set", f"api_key={SECRET}").stdout)
        assert codex["model"] == "/models/my-tiny"
        # Codex has no catalogue entry for the policy: the limits it would otherwise guess (and warn about).
        assert (codex["model_context_window"], codex["model_auto_compact_token_limit"]) == (8192, 7372)
        # The name connect prints before any server runs is accepted too.
        client = anthropic.Anthropic(base_url=server.base_url, api_key=SECRET, max_retries=0)
        reply = client.messages.create(
            model="openclaw-policy", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
        assert reply.content[0].text == "hi"
