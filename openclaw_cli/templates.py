"""Config templates for `openclaw init`: commented TOML files in the repository's top-level ``templates/``.

A template's first line is a ``# `` comment holding its one-line description (what `openclaw init --list` shows).
The package is installed editable, so the templates are found next to the package directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
DEFAULT_TEMPLATE = "personal-agent"
TEMPLATE_SUFFIX = ".toml"


class TemplateError(Exception):
    """A template cannot be listed or written; ``str()`` is one line saying why and what to do."""


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    path: Path

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def templates_dir(root: Path | None = None) -> Path:
    directory = root or TEMPLATES_DIR
    if not directory.is_dir():
        raise TemplateError(
            f"config templates not found at {directory} (openclaw-cli expects an editable install: pip install -e .)"
        )
    return directory


def list_templates(root: Path | None = None) -> list[Template]:
    """Every template, sorted by name."""
    directory = templates_dir(root)
    return [Template(path.stem, _description(path), path) for path in sorted(directory.glob(f"*{TEMPLATE_SUFFIX}"))]


def get_template(name: str, root: Path | None = None) -> Template:
    templates = {template.name: template for template in list_templates(root)}
    if name not in templates:
        known = ", ".join(templates) or "none"
        raise TemplateError(f"unknown template {name!r}; available templates: {known}")
    return templates[name]


def write_template(name: str, dest: Path, *, force: bool = False, root: Path | None = None) -> Template:
    """Write template ``name`` to ``dest``; refuses to replace an existing file unless ``force``."""
    template = get_template(name, root)
    if dest.is_dir():
        raise TemplateError(f"{dest} is a directory; give a file path such as {dest / 'openclaw.toml'}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # "x" makes the no-overwrite check and the create one step, so a file appearing meanwhile is never clobbered.
    mode = "w" if force else "x"
    try:
        with dest.open(mode, encoding="utf-8") as handle:
            handle.write(template.text())
    except FileExistsError:
        raise TemplateError(f"{dest} already exists; pass --force to overwrite it") from None
    except OSError as exc:
        raise TemplateError(f"cannot write {dest}: {exc.strerror or exc}") from None
    return template


def _description(path: Path) -> str:
    with path.open(encoding="utf-8") as handle:
        first = handle.readline().strip()
    return first.lstrip("#").strip() if first.startswith("#") else "(no description)"
