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


def _module_level_imports(path: Path) -> set[str]:
    """Modules imported at module level (``if TYPE_CHECKING`` blocks included; imports inside functions are not)."""
    found: set[str] = set()
    statements = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.If):
            statements.extend(node.body + node.orelse)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_module_imports_itself_through_others() -> None:
    """No import circles between the package's modules (a circle means two modules that are really one, or a shared
    piece that wants a module of its own)."""
    modules = {
        ".".join(("openclaw_cli", *path.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__"): path
        for path in PACKAGE.rglob("*.py")
        if "testing" not in path.parts
    }
    # A module's own parent packages are imported before it anyway: an edge to one is no circle of ours.
    graph = {
        name: {m for m in _module_level_imports(path) if m in modules and not name.startswith(m + ".")}
        for name, path in modules.items()
    }
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == []


def test_no_function_is_longer_than_80_lines() -> None:
    """A function that outgrows a screen and a half is several jobs: give each a name."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function and (node.end_lineno or node.lineno) - node.lineno + 1 > 80:
                long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert long == []
