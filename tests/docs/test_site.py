"""The documentation site builds strictly (what CI runs), and no internal link of README.md or
docs/ is broken."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.links import broken_links

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                        "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                       capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site/index.html").is_file()
    assert (tmp_path / "site/ARCHITECTURE/index.html").is_file()


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_broken_internal_link(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_link_check_finds_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#two-words) [gone](nope.md) [bad](a.md#three) "
                    "[out](https://example.org/x.md)\n```\n[in a fence](nope2.md)\n```\n")
    assert broken_links(page) == ["nope.md: no such file", "a.md#three: no heading #three"]


def test_nothing_points_outside_the_repository():
    """The readings and the architecture the project relies on are its own files."""
    hits = []
    for path in ROOT.rglob("*"):
        if ".git" in path.parts or ".venv" in path.parts or not path.is_file() \
                or path.suffix not in {".py", ".md", ".json", ".yaml", ".yml", ".sh", ".txt"}:
            continue
        text = path.read_text(errors="replace")
        for needle in ("shared/facts", "shared/DESIGN.md"):
            if needle in text and path != Path(__file__).resolve():
                hits.append(f"{path.relative_to(ROOT)}: {needle}")
    assert hits == []
