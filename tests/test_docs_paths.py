"""The layout the docs describe is the tree: every path README.md and the pages under docs/ name
exists, and every module a layout row names (`base.py` in the `tuner/workloads/` row) is in
that folder. A rename that forgets the docs fails here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")))
TOPS = ("tuner", "kernelsearch", "safety", "tests", "benchmarks", "deploy", "docs", "host_profiles")
PATH = re.compile(r"`((?:%s)/[\w./-]*)`" % "|".join(TOPS))
TICKED = re.compile(r"`([^`]+)`")


def _named_paths(text: str) -> list[str]:
    out = []
    for m in PATH.finditer(text):
        p = m.group(1).rstrip(".")
        if "*" in p or "<" in p or "{" in p:
            continue  # a pattern (`tuner/cli/<area>_cmd.py`), not a path
        out.append(p)
    return out


def _row_modules(text: str) -> list[tuple[str, str]]:
    """(folder, module) for each `name.py` in a table row whose first cell is one folder."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) < 2:
            continue
        first = TICKED.findall(cells[0])
        if len(first) != 1 or not first[0].endswith("/"):
            continue
        for name in TICKED.findall(cells[1]):
            if re.fullmatch(r"[\w/]+\.py", name) and not name.startswith(TOPS):
                out.append((first[0], name))
    return out


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_the_docs_name_exists(doc):
    text = (ROOT / doc).read_text()
    missing = [p for p in _named_paths(text) if not (ROOT / p).exists()]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_module_a_layout_row_names_is_in_its_folder(doc):
    text = (ROOT / doc).read_text()
    missing = [f"{folder}{name}" for folder, name in _row_modules(text)
               if not (ROOT / folder / name).exists()
               and not list((ROOT / folder).rglob(Path(name).name))]
    assert not missing, f"{doc}: layout rows name modules that are not there: {missing}"


def test_the_workloads_and_daemon_rows_name_every_module():
    """The rows of the folders where most new work lands list all of their modules."""
    text = (ROOT / "docs/internals/index.md").read_text()
    rows = {folder: {n for f, n in _row_modules(text) if f == folder}
            for folder in ("tuner/workloads/", "tuner/daemon/")}
    for folder, named in rows.items():
        have = {p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"}
        assert have <= named, f"docs/internals/index.md {folder} row misses {sorted(have - named)}"
