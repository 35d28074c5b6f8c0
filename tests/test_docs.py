"""The README stays a short front page and every documentation page is reachable from the site's nav."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


# A page a newcomer reads in one sitting; the benchmark tables are a reference, not a reading.
PAGE_LIMIT = 12 * 1024
LONG_REFERENCE_PAGES = {"benchmarks.md"}


def test_readme_is_a_front_page_of_at_most_7_kb_whose_links_resolve() -> None:
    readme = REPO / "README.md"
    assert readme.stat().st_size <= 7 * 1024
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


def test_every_docs_page_reads_in_one_sitting() -> None:
    long = {
        page.name: page.stat().st_size
        for page in (REPO / "docs").glob("*.md")
        if page.name not in LONG_REFERENCE_PAGES and page.stat().st_size > PAGE_LIMIT
    }
    assert long == {}
