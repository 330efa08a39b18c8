"""Profile include resolution is bounded: a chain thousands deep is refused in one line (no
RecursionError), a diamond is resolved once per file (not once per path through it), cycles are
refused; what resolves still merges as before."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner import profiles
from tuner.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def chain(tmp_path: Path, depth: int) -> Path:
    for i in range(depth):
        inc = f"include: [p{i + 1}]\n" if i + 1 < depth else ""
        (tmp_path / f"p{i}.yaml").write_text(f"name: p{i}\n{inc}knobs:\n  sysctl.vm.swappiness: {i % 100}\n")
    return tmp_path / "p0.yaml"


def diamond(tmp_path: Path, levels: int) -> Path:
    """Level i has two files, each including both files of level i+1: 2^levels paths to the base."""
    (tmp_path / "base.yaml").write_text("name: base\nknobs:\n  gpu*.power_limit_w: 600\n")
    for i in reversed(range(levels)):
        below = ["base", "base"] if i == levels - 1 else [f"l{i + 1}a", f"l{i + 1}b"]
        for side in "ab":
            (tmp_path / f"l{i}{side}.yaml").write_text(
                f"name: l{i}{side}\ninclude: [{below[0]}, {below[1]}]\nknobs:\n  sysctl.vm.swappiness: {i}\n")
    (tmp_path / "top.yaml").write_text("name: top\ninclude: [l0a, l0b]\nknobs:\n  cpu.governor: performance\n")
    return tmp_path / "top.yaml"


def test_a_chain_5000_deep_is_refused_in_one_line(tmp_path):
    top = chain(tmp_path, 5000)
    with pytest.raises(BadInput, match=rf"includes nested more than {profiles.MAX_INCLUDE_DEPTH} levels deep"):
        profiles.load(str(top))


def test_a_chain_within_the_limit_resolves_with_the_child_winning(tmp_path):
    top = chain(tmp_path, profiles.MAX_INCLUDE_DEPTH + 1)
    p = profiles.load(str(top))
    assert p.values() == {"sysctl.vm.swappiness": 0}
    assert len(p.chain) == profiles.MAX_INCLUDE_DEPTH + 1 and p.chain[-1].endswith("p0.yaml")


def test_a_diamond_30_levels_deep_reads_each_file_once(tmp_path, monkeypatch):
    top = diamond(tmp_path, 30)
    reads: list[Path] = []
    real = profiles.read_file
    monkeypatch.setattr(profiles, "read_file", lambda p: (reads.append(Path(p).resolve()), real(p))[1])
    t0 = time.perf_counter()
    p = profiles.load(str(top))
    took = time.perf_counter() - t0
    assert len(reads) == len(set(reads)) == 2 * 30 + 2      # every file once: top, 60, base
    assert p.values() == {"gpu*.power_limit_w": 600, "sysctl.vm.swappiness": 0, "cpu.governor": "performance"}
    assert len(p.chain) == 62 and p.chain[0].endswith("base.yaml") and p.chain[-1].endswith("top.yaml")
    assert took < 5, took   # 2^30 visits before; a loose bound, the read count is the real check


def test_too_many_files_are_refused(tmp_path):
    n = profiles.MAX_INCLUDED_FILES + 1
    for i in range(n):
        (tmp_path / f"leaf{i}.yaml").write_text(f"name: leaf{i}\n")
    (tmp_path / "wide.yaml").write_text("name: wide\ninclude: [" + ", ".join(f"leaf{i}" for i in range(n)) + "]\n")
    with pytest.raises(BadInput, match=rf"more than {profiles.MAX_INCLUDED_FILES} files included"):
        profiles.load(str(tmp_path / "wide.yaml"))


def test_a_self_include_is_a_cycle(tmp_path):
    (tmp_path / "me.yaml").write_text("name: me\ninclude: [me]\n")
    with pytest.raises(BadInput, match=r"me\.yaml: field include: include cycle"):
        profiles.load(str(tmp_path / "me.yaml"))


@pytest.mark.parametrize("make, expect", [
    (lambda d: chain(d, 5000), "includes nested more than"),
    (lambda d: diamond(d, 30), None),
])
def test_through_the_cli(tmp_path, make, expect):
    top = make(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "METALTUNE_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run([sys.executable, "-m", "tuner", "profile", "show", str(top)], capture_output=True,
                       text=True, env=env, timeout=120, cwd=tmp_path)
    if expect is None:
        assert r.returncode == 0, r.stderr
        assert "gpu*.power_limit_w" in r.stdout
    else:
        assert r.returncode == 2, r.stderr[-2000:]
        assert r.stderr.count("\n") == 1 and expect in r.stderr and "p0.yaml" in r.stderr
