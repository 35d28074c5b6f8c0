"""Config templates for `openclaw init`: commented TOML files shipped as package data in ``openclaw_cli/templates/``.

They are read through :mod:`importlib.resources`, so they are found in a regular (wheel) install, an editable
install and a zipped package alike. A template's first line is a ``# `` comment holding its one-line description
(what `openclaw init --list` shows). The repository's top-level ``templates`` is a link to the same directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

TEMPLATES_PACKAGE = "openclaw_cli"
TEMPLATES_SUBDIR = "templates"
DEFAULT_TEMPLATE = "personal-agent"
TEMPLATE_SUFFIX = ".toml"


class TemplateError(Exception):
    """A template cannot be listed or written; ``str()`` is one line saying why and what to do."""


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    path: Traversable  # a pathlib.Path for a directory on disk; a zip entry when the package is zipped

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def templates_dir(root: Path | Traversable | None = None) -> Traversable:
    """``root`` if given (tests), else the package's own template directory."""
    directory = root if root is not None else resources.files(TEMPLATES_PACKAGE).joinpath(TEMPLATES_SUBDIR)
    if not directory.is_dir():
        raise TemplateError(
            f"config templates not found at {directory}: this openclaw-cli install is incomplete "
            "(reinstall it: pip install --force-reinstall openclaw-cli, or pip install -e . from a checkout)"
        )
    return directory


def list_templates(root: Path | Traversable | None = None) -> list[Template]:
    """Every template, sorted by name."""
    directory = templates_dir(root)
    found = [item for item in directory.iterdir() if item.is_file() and item.name.endswith(TEMPLATE_SUFFIX)]
    return [
        Template(item.name.removesuffix(TEMPLATE_SUFFIX), _description(item), item)
        for item in sorted(found, key=lambda item: item.name)
    ]


def get_template(name: str, root: Path | Traversable | None = None) -> Template:
    templates = {template.name: template for template in list_templates(root)}
    if name not in templates:
        known = ", ".join(templates) or "none"
        raise TemplateError(f"unknown template {name!r}; available templates: {known}")
    return templates[name]


def write_template(name: str, dest: Path, *, force: bool = False, root: Path | Traversable | None = None) -> Template:
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


def _description(item: Traversable) -> str:
    with item.open("r", encoding="utf-8") as handle:
        first = handle.readline().strip()
    return first.lstrip("#").strip() if first.startswith("#") else "(no description)"
