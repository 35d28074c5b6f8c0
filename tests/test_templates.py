"""The `openclaw init` templates: shipped as package data, found through importlib.resources (also from a built
wheel, not only from an editable checkout), each valid settings with the values its use case needs, and each
documented in the table of docs/configuration.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from openclaw_cli.cli import app
from openclaw_cli.settings import load_settings
from openclaw_cli.templates import get_template, list_templates

REPO = Path(__file__).resolve().parent.parent

# The settings that make each template what it is (read from the files by hand, not from the code).
KEY_SETTINGS = {
    "personal-agent": {"method": "combined", "session_idle_s": 900.0, "train.batch_size": 4},
    "coding-agent": {
        "method": "combined",
        "session_idle_s": 3600.0,
        "train.batch_size": 8,
        "judge.max_concurrency": 8,
        "local.max_concurrent_requests": 8,
    },
    "tool-call-agent": {"method": "rl", "session_idle_s": 600.0, "train.eps_low": 0.2, "train.eps_high": 0.28},
    "terminal-agent": {"method": "combined", "session_idle_s": 1800.0, "train.lr": 5e-5, "train.max_staleness": 2},
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("OPENCLAW_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def dotted(settings: object, key: str) -> object:
    value = settings
    for part in key.split("."):
        value = getattr(value, part)
    return value


def test_templates_are_package_data_found_via_importlib_resources():
    package_dir = resources.files("openclaw_cli").joinpath("templates")
    names = sorted(item.name for item in package_dir.iterdir() if item.name.endswith(".toml"))
    assert names == sorted(f"{name}.toml" for name in KEY_SETTINGS)
    for name in KEY_SETTINGS:
        assert get_template(name).text() == package_dir.joinpath(f"{name}.toml").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(KEY_SETTINGS))
def test_init_writes_each_template_and_it_validates(name: str, tmp_path: Path):
    dest = tmp_path / f"{name}.toml"
    result = CliRunner().invoke(app, ["init", "--template", name, "--path", str(dest)])
    assert result.exit_code == 0, result.output
    assert dest.read_text(encoding="utf-8") == get_template(name).text()
    settings = load_settings(config=dest)
    assert (settings.host, settings.port, settings.api_key) == ("127.0.0.1", 8400, None)  # loopback, no secrets
    for key, expected in KEY_SETTINGS[name].items():
        assert dotted(settings, key) == expected, key


def test_the_docs_document_every_template_in_a_table():
    page = REPO / "docs" / "configuration.md"
    rows = [line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    for template in list_templates():
        (row,) = [line for line in rows if line.startswith(f"| `{template.name}` ")]
        assert row.count("|") >= 4, row  # name, for what, key settings


def test_a_built_wheel_ships_the_templates_and_finds_them_without_the_checkout(tmp_path: Path):
    """The editable-install-only bug: build a wheel from a copy of the sources and import openclaw_cli from it."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "openclaw_cli", source / "openclaw_cli", ignore=ignore)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if build.returncode != 0 and "No module named" in build.stderr:
        pytest.skip(f"cannot build a wheel offline here: {build.stderr.strip().splitlines()[-1]}")
    assert build.returncode == 0, build.stderr
    (wheel,) = tmp_path.glob("openclaw_cli-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points_text = archive.read(entry_points).decode()
    shipped = sorted(n for n in names if n.startswith("openclaw_cli/templates/"))
    assert shipped == sorted(f"openclaw_cli/templates/{name}.toml" for name in KEY_SETTINGS)
    # The backends install inside the product's namespace; test doubles and tiny test models stay out of the wheel.
    assert "openclaw_cli/backends/local/sampler.py" in names and "openclaw_cli/py.typed" in names
    assert not [n for n in names if n.startswith(("backends/", "openclaw_cli/testing/"))]
    assert "local = openclaw_cli.backends.local:LocalBackend" in entry_points_text

    # Import straight from the wheel (a zip on sys.path, ahead of the editable install): resources come from the zip.
    probe = (
        "import json, openclaw_cli, openclaw_cli.templates as t;"
        "print(json.dumps([openclaw_cli.__file__, [(x.name, len(x.text())) for x in t.list_templates()]]))"
    )
    env = {**os.environ, "PYTHONPATH": str(wheel)}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    location, found = json.loads(done.stdout)
    assert location.startswith(str(wheel))
    assert dict(found) == {name: len(get_template(name).text()) for name in KEY_SETTINGS}
