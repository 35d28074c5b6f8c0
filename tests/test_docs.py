"""The README stays a short front page and every documentation page is reachable from the site's nav."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_is_a_front_page_of_at_most_10_kb_whose_links_resolve() -> None:
    readme = REPO / "README.md"
    assert readme.stat().st_size <= 10 * 1024
    text = readme.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links to the docs"
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, missing


def test_every_docs_page_is_in_the_mkdocs_nav() -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    in_nav = set(re.findall(r":\s*([\w-]+\.md)\s*$", config, flags=re.MULTILINE))
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages == in_nav, (pages - in_nav, in_nav - pages)
