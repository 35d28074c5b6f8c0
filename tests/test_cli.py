"""The `openclaw` CLI through typer's CliRunner: settings flags, config/init/backends/status/serve/launch/export."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Any

import pytest
import typer
from runtime_helpers import free_port
from typer.testing import CliRunner

from openclaw_cli import __version__
from openclaw_cli import backend as registry
from openclaw_cli.backend import BackendError, Check
from openclaw_cli.cli import app
from openclaw_cli.settings import load_settings
from openclaw_cli.templates import DEFAULT_TEMPLATE, list_templates

SECRET = "tml-secret123456789"
PROXY = "openclaw_cli.proxy"  # the module `openclaw serve` imports run_server from
TEMPLATE_NAMES = {"personal-agent", "coding-agent", "tool-call-agent", "terminal-agent"}

runner = CliRunner()


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No OPENCLAW_* / provider key from the developer's shell, a clean cwd, and a wide console for tables."""
    for name in list(os.environ):
        if name.startswith("OPENCLAW_") or name in ("TINKER_API_KEY", "FIREWORKS_API_KEY", "FIREWORKS_ACCOUNT_ID"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(autouse=True)
def quick_local_diagnose(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local backend's own diagnose imports torch/transformers/peft (tens of seconds on a busy 2-core box) and
    is tested with that backend; here it is replaced so these tests cover the CLI's listing and rendering. The
    planned tinker/fireworks backends keep their real (cheap) diagnose."""
    real = registry.diagnose_backend

    def diagnose(name: str, settings: Any) -> list[Check]:
        if name == "local":
            return [Check("local stand-in", True, "diagnose replaced in tests/test_cli.py")]
        return real(name, settings)

    monkeypatch.setattr(registry, "diagnose_backend", diagnose)  # what backends and doctor call


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


def assert_clean_failure(result: Any, exit_code: int) -> None:
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def show_json(*args: str) -> dict[str, dict[str, Any]]:
    result = invoke("config", "show", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["settings"]


# ---------------------------------------------------------------------------------------------------------------
# config show: precedence and sources


def test_flags_beat_env_beat_toml_beat_defaults(monkeypatch, tmp_path):
    (tmp_path / "openclaw.toml").write_text("port = 8401\n[judge]\nvotes = 4\n")
    toml = str(tmp_path / "openclaw.toml")

    settings = show_json()
    assert settings["port"] == {"value": 8401, "source": toml}
    assert settings["judge.votes"] == {"value": 4, "source": toml}
    assert settings["host"] == {"value": "127.0.0.1", "source": "default"}

    monkeypatch.setenv("OPENCLAW_PORT", "8402")
    monkeypatch.setenv("OPENCLAW_JUDGE__VOTES", "5")
    settings = show_json()
    assert settings["port"] == {"value": 8402, "source": "env"}
    assert settings["judge.votes"] == {"value": 5, "source": "env"}

    settings = show_json("--port", "8403", "--set", "judge.votes=6")
    assert settings["port"] == {"value": 8403, "source": "cli"}
    assert settings["judge.votes"] == {"value": 6, "source": "cli"}


def test_global_config_option_and_per_command_option(tmp_path):
    (tmp_path / "a.toml").write_text('method = "opd"\n')
    (tmp_path / "b.toml").write_text('method = "combined"\n')
    result = invoke("--config", "a.toml", "config", "show", "--json")
    document = json.loads(result.stdout)
    assert document["config_file"] == "a.toml"
    assert document["settings"]["method"] == {"value": "opd", "source": "a.toml"}
    # The subcommand's own --config is the more specific one.
    result = invoke("--config", "a.toml", "config", "show", "--json", "--config", "b.toml")
    assert json.loads(result.stdout)["settings"]["method"] == {"value": "combined", "source": "b.toml"}


def test_named_flag_beats_set_for_the_same_key():
    settings = show_json("--set", "port=9001", "--port", "9002", "--method", "opd", "--backend", "tinker")
    assert settings["port"]["value"] == 9002
    assert (settings["method"]["value"], settings["backend"]["value"]) == ("opd", "tinker")


def test_config_show_table_lists_keys_values_and_sources(monkeypatch):
    monkeypatch.setenv("OPENCLAW_JUDGE__VOTES", "7")
    result = invoke("config", "show", "--model", "org/model")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") == 4}
    assert "org/model" in rows["model"] and "cli" in rows["model"]
    assert " 7 " in rows["judge.votes"] and "env" in rows["judge.votes"]
    assert "8400" in rows["port"] and "default" in rows["port"]


# ---------------------------------------------------------------------------------------------------------------
# Secrets never leave masked


def assert_secret_absent(output: str, secret: str) -> None:
    # Not the whole secret, and no 8-character piece of it either (a prefix can identify a key).
    for start in range(len(secret) - 7):
        assert secret[start : start + 8] not in output, f"secret fragment {secret[start : start + 8]!r} leaked"


def test_keys_never_appear_in_any_output(monkeypatch, tmp_path):
    judge_secret = "sk-judgeSECRET42xyz"
    monkeypatch.setenv("OPENCLAW_TINKER__API_KEY", SECRET)
    monkeypatch.setenv("OPENCLAW_API_KEY", "proxyKEY-abcdef987")
    (tmp_path / "openclaw.toml").write_text(f'[judge]\napi_key = "{judge_secret}"\n')

    outputs = [
        invoke("config", "show"),
        invoke("config", "show", "--json"),
        invoke("backends"),
        invoke("version"),
        invoke("status", "--port", str(free_port())),
        invoke("config", "show", "--set", "judge.votes=0"),
    ]
    for result in outputs:
        for secret in (SECRET, judge_secret, "proxyKEY-abcdef987"):
            assert_secret_absent(result.output, secret)

    settings = json.loads(outputs[1].stdout)["settings"]
    assert settings["tinker.api_key"] == {"value": "**** (set)", "source": "env"}
    assert settings["judge.api_key"]["value"] == "**** (set)"
    assert settings["fireworks.api_key"] == {"value": None, "source": "default"}


# ---------------------------------------------------------------------------------------------------------------
# Invalid settings: exit 2, one line naming the key and what is allowed


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--method", "foo"], ["method", "'rl', 'opd' or 'combined'"]),
        (["--set", "judge.votes=0"], ["judge.votes", ">= 1 and <= 15"]),
        (["--set", "judge.vote=1"], ["judge.vote:", "unknown setting", "known keys in judge", "votes"]),
        (["--set", "nonsense=1"], ["nonsense", "unknown setting", "known keys in the top level", "backend"]),
        (["--port", "70000"], ["port", "<= 65535"]),
    ],
)
@pytest.mark.parametrize("command", [["config", "show"], ["serve"], ["backends"]])
def test_invalid_settings_exit_2_with_one_line(command, args, expected):
    result = invoke(*command, *args)
    assert_clean_failure(result, 2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: invalid setting ")
    for fragment in expected:
        assert fragment in lines[0]


def test_invalid_env_value_is_reported_like_a_flag(monkeypatch):
    monkeypatch.setenv("OPENCLAW_JUDGE__VOTES", "99")
    result = invoke("config", "show")
    assert_clean_failure(result, 2)
    assert "judge.votes" in result.stderr and "<= 15" in result.stderr


def test_missing_config_file_exits_2():
    result = invoke("--config", "nope.toml", "config", "show")
    assert_clean_failure(result, 2)
    assert "config file not found: nope.toml" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# init


def test_templates_are_the_four_documented_ones_with_descriptions():
    templates = list_templates()
    assert {t.name for t in templates} == TEMPLATE_NAMES
    assert DEFAULT_TEMPLATE == "personal-agent"
    for template in templates:
        assert len(template.description) > 20 and "\n" not in template.description


@pytest.mark.parametrize("name", sorted(TEMPLATE_NAMES))
def test_every_template_is_written_and_loads(name, tmp_path):
    dest = tmp_path / f"{name}.toml"
    result = invoke("init", "--template", name, "--path", str(dest))
    assert result.exit_code == 0, result.output
    assert dest.read_text() == next(t for t in list_templates() if t.name == name).text()
    settings = load_settings(config=dest)
    assert settings.backend == "local"
    assert settings.api_key is None  # templates never carry secrets
    # And the CLI attributes the template's values to the file.
    shown = show_json("--config", str(dest))
    assert shown["method"]["source"] == str(dest)


def test_init_defaults_to_personal_agent_in_openclaw_toml(tmp_path):
    result = invoke("init")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "openclaw.toml").read_text().startswith("# Personal assistant")


def test_init_refuses_to_overwrite_without_force(tmp_path):
    target = tmp_path / "openclaw.toml"
    target.write_text("# mine\n")
    result = invoke("init", "--template", "coding-agent")
    assert_clean_failure(result, 1)
    assert "already exists" in result.stderr and "--force" in result.stderr
    assert target.read_text() == "# mine\n"

    result = invoke("init", "--template", "coding-agent", "--force")
    assert result.exit_code == 0, result.output
    assert target.read_text().startswith("# Coding agent")


def test_init_list_and_unknown_template():
    result = invoke("init", "--list")
    assert result.exit_code == 0
    for template in list_templates():
        assert template.name in result.stdout
    assert "personal-agent (default)" in result.stdout
    assert not Path("openclaw.toml").exists()

    result = invoke("init", "--template", "nope")
    assert_clean_failure(result, 1)
    assert "unknown template 'nope'" in result.stderr and "terminal-agent" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# backends / version / doctor


def test_backends_lists_every_registered_backend_with_checks(monkeypatch):
    monkeypatch.setenv("OPENCLAW_TINKER__API_KEY", SECRET)
    result = invoke("backends")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for name in ("local (selected)", "tinker", "fireworks"):
        assert name in out
    assert "set --model to a Tinker base model" in out  # tinker checks the model it would train
    assert "stepwise" in out  # fireworks reports its (default) training mode
    assert "set FIREWORKS_API_KEY" in out  # fireworks has no key here...
    assert "set TINKER_API_KEY" not in out  # ...tinker has one from the env
    assert "✗" in out and "✓" in out


def test_backends_with_an_unregistered_selection_fails():
    result = invoke("backends", "--backend", "nosuch")
    assert_clean_failure(result, 1)
    assert "'nosuch' is not registered" in result.stderr


def test_version_reports_package_python_and_libraries():
    result = invoke("version")
    assert result.exit_code == 0
    assert f"openclaw-cli  {__version__}" in result.stdout
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in result.stdout
    for name in ("torch", "transformers", "peft"):
        assert name in result.stdout
    assert invoke("--version").stdout.strip() == f"openclaw-cli {__version__}"


def test_doctor_fails_on_busy_port_and_unwritable_store(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = invoke("doctor", "--port", str(port), "--set", f"store.path={blocker}/sub/store.sqlite3")
    assert_clean_failure(result, 1)
    assert f"port {port} free on 127.0.0.1" in result.stdout and "in use" in result.stdout
    assert "is not a directory" in result.stdout
    assert "checks failed" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# status


def test_status_without_a_server_exits_1_with_a_clear_message():
    port = free_port()
    result = invoke("status", "--port", str(port))
    assert_clean_failure(result, 1)
    assert result.stderr.strip() == f"error: no openclaw server on 127.0.0.1:{port} (start one with `openclaw serve`)"


@pytest.fixture
def status_server() -> Iterator[tuple[int, list[dict[str, str]]]]:
    """A loopback HTTP server answering the status route like the proxy; records request headers."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers))
            if self.path != "/v1/openclaw/status":
                self.send_error(404)
                return
            body = json.dumps({"backend": "local", "policy_version": 3, "store": {"pending": 2}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_status_renders_the_server_answer_and_sends_the_key(monkeypatch, status_server):
    port, seen = status_server
    monkeypatch.setenv("OPENCLAW_API_KEY", "proxyKEY-abcdef987")
    result = invoke("status", "--port", str(port))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == f"openclaw server on 127.0.0.1:{port}"
    cells = [line.split("│")[1:3] for line in result.stdout.splitlines() if line.count("│") == 3]
    rows = {key.strip(): value.strip() for key, value in cells}
    assert rows == {"backend": "local", "policy_version": "3", "store.pending": "2"}
    assert seen[-1]["Authorization"] == "Bearer proxyKEY-abcdef987"
    assert_secret_absent(result.output, "proxyKEY-abcdef987")

    result = invoke("status", "--port", str(port), "--json")
    assert json.loads(result.stdout) == {"backend": "local", "policy_version": 3, "store": {"pending": 2}}


# ---------------------------------------------------------------------------------------------------------------
# serve / launch / export (lazily imported modules replaced by doubles in sys.modules)


@pytest.fixture
def fake_proxy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []
    module = types.ModuleType(PROXY)
    module.run_server = lambda settings, **_: calls.append(settings)  # type: ignore[attr-defined]
    module.ProxyConfigError = ProxyConfigError  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PROXY, module)
    return calls


def test_serve_runs_the_proxy_with_the_effective_settings(fake_proxy):
    result = invoke("serve", "--port", "9123", "--method", "opd", "--set", "judge.votes=5")
    assert result.exit_code == 0, result.output
    (settings,) = fake_proxy
    assert (settings.port, settings.method, settings.judge.votes, settings.host) == (9123, "opd", 5, "127.0.0.1")
    assert "http://127.0.0.1:9123" in result.stdout


def test_serve_refuses_a_public_bind_without_api_key(fake_proxy, monkeypatch):
    result = invoke("serve", "--host", "0.0.0.0")
    assert_clean_failure(result, 2)
    assert "refusing to bind 0.0.0.0 without an API key" in result.stderr
    assert fake_proxy == []

    monkeypatch.setenv("OPENCLAW_API_KEY", "proxyKEY-abcdef987")
    result = invoke("serve", "--host", "0.0.0.0")
    assert result.exit_code == 0, result.output
    assert fake_proxy[0].host == "0.0.0.0"
    assert_secret_absent(result.output, "proxyKEY-abcdef987")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.2", "::1"])
def test_serve_allows_loopback_without_key(fake_proxy, host):
    assert invoke("serve", "--host", host).exit_code == 0
    assert fake_proxy[0].host == host


def test_serve_without_the_proxy_module_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, PROXY, None)  # import now raises ModuleNotFoundError
    result = invoke("serve")
    assert_clean_failure(result, 1)
    assert "the proxy (openclaw serve) is not available in this build" in result.stderr


class ProxyConfigError(ValueError):
    """Stands in for the proxy's own config error class."""


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (BackendError("model org/missing not found; check --model"), 1),  # a failure
        (ProxyConfigError("the capture store is not available; cannot serve"), 2),  # a refusal
    ],
)
def test_errors_while_serving_are_one_line_with_their_exit_code(
    fake_proxy, monkeypatch, error: Exception, exit_code: int
):
    def fail(settings: Any, **_: Any) -> None:
        raise error

    monkeypatch.setattr(sys.modules[PROXY], "run_server", fail)
    result = invoke("serve")
    assert_clean_failure(result, exit_code)
    assert result.stderr.strip() == f"error: {error}"


def test_unexpected_errors_are_one_line_unless_debug(fake_proxy, monkeypatch):
    def crash(settings: Any, **_: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(sys.modules[PROXY], "run_server", crash)
    result = invoke("serve")
    assert_clean_failure(result, 1)
    assert "unexpected RuntimeError: boom (run with --debug for the traceback)" in result.stderr
    result = invoke("--debug", "serve")
    assert isinstance(result.exception, RuntimeError)


@pytest.fixture
def fake_runtime(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, bool]]:
    calls: list[tuple[Any, bool]] = []
    module = types.ModuleType("openclaw_cli.launch")
    module.run_launch = lambda settings, *, ui: calls.append((settings, ui))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "openclaw_cli.launch", module)
    return calls


def test_launch_runs_the_learning_loop_with_the_effective_settings(fake_runtime, fake_proxy):
    result = invoke("launch", "--backend", "local", "--port", "9124", "--no-ui", "--set", "train.batch_size=8")
    assert result.exit_code == 0, result.output
    ((settings, ui),) = fake_runtime
    assert (settings.port, settings.backend, settings.train.batch_size, ui) == (9124, "local", 8, False)
    assert fake_proxy == []  # launch is not `serve` under another name
    assert invoke("launch").exit_code == 0 and fake_runtime[1][1] is True  # the dashboard is the default


def test_launch_refuses_a_public_bind_without_api_key(fake_runtime):
    result = invoke("launch", "--host", "0.0.0.0")
    assert_clean_failure(result, 2)
    assert "refusing to bind 0.0.0.0 without an API key" in result.stderr
    assert fake_runtime == []


def test_export_without_its_module_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "openclaw_cli.commands.export", None)
    result = invoke("export", "--format", "tokens")
    assert_clean_failure(result, 1)
    assert "export (openclaw export) is not available in this build" in result.stderr


def test_export_is_registered_lazily_and_gets_the_global_config(monkeypatch, tmp_path):
    received: dict[str, Any] = {}

    def export_command(
        config: Annotated[Path | None, typer.Option("--config")] = None,
        fmt: Annotated[str, typer.Option("--format")] = "messages",
    ) -> None:
        """Export captured turns."""
        received.update(config=config, fmt=fmt)

    module = types.ModuleType("openclaw_cli.commands.export")
    module.export_command = export_command  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "openclaw_cli.commands.export", module)
    (tmp_path / "x.toml").write_text("")

    assert "export" in invoke("--help").stdout
    result = invoke("--config", "x.toml", "export", "--format", "tokens")
    assert result.exit_code == 0, result.output
    assert received == {"config": Path("x.toml"), "fmt": "tokens"}


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def test_python_dash_m_runs_the_cli(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENCLAW_")}
    done = subprocess.run(
        [sys.executable, "-m", "openclaw_cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"openclaw-cli {__version__}"


def test_usage_errors_and_exits_inside_commands_keep_their_own_message(tmp_path):
    """typer vendors its own click: its usage errors and Exit must not be reported as 'unexpected'."""
    bad_choice = invoke("export", "--format", "bogus")
    assert bad_choice.exit_code == 2
    assert "unexpected" not in bad_choice.output
    missing_store = invoke("export", "--set", f"store.path={tmp_path / 'none.sqlite3'}")
    assert missing_store.exit_code == 1
    assert "no store at" in missing_store.stderr
    assert "unexpected" not in missing_store.stderr
