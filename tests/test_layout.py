"""The wings' imports point down only (docs/layout.md): the proxy never imports learning or commands, learning never
imports commands, the backends import none of learning, commands or the wire, capture, store and tracking never import
learning; the ground floor (the shared rules every wing uses) imports nothing above it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "openclaw_cli"
FORBIDDEN = {
    "proxy": ("openclaw_cli.learn", "openclaw_cli.commands", "openclaw_cli.launch"),
    "learn": ("openclaw_cli.commands", "openclaw_cli.command_support", "openclaw_cli.cli"),
    "backends": ("openclaw_cli.learn", "openclaw_cli.commands", "openclaw_cli.proxy"),
    "capture": ("openclaw_cli.learn", "openclaw_cli.commands", "openclaw_cli.proxy"),
    "store": ("openclaw_cli.learn", "openclaw_cli.commands", "openclaw_cli.proxy"),
    # Trackers only read the store's rows: they never reach into learning, serving or the commands.
    "tracking": ("openclaw_cli.learn", "openclaw_cli.commands", "openclaw_cli.proxy", "openclaw_cli.launch"),
}


# The ground floor: modules at the package's top that every wing may use. They import one another only.
GROUND = (
    "adapters",
    "backend",
    "eventloop",
    "instructions",
    "lesson_prompt",
    "loopback",
    "loss_contract",
    "secrets_scrub",
    "settings",
    "structured_output",
    "tokenizer",
    "types",
)


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


@pytest.mark.parametrize("wing", sorted(FORBIDDEN))
def test_imports_point_down_only(wing: str) -> None:
    bad = []
    for path in sorted((PACKAGE / wing).rglob("*.py")):
        for module in _imports(path):
            if module.startswith(FORBIDDEN[wing]):
                bad.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert bad == []


@pytest.mark.parametrize("module", GROUND)
def test_the_ground_floor_imports_nothing_above_it(module: str) -> None:
    ground = {f"openclaw_cli.{name}" for name in GROUND}
    above = [m for m in _imports(PACKAGE / f"{module}.py") if m.startswith("openclaw_cli") and m not in ground]
    assert above == []
