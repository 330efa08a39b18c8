"""After `scripts/bootstrap.sh`, `metaltune` is on PATH: scripts/link_cli.sh (its last step) links
BIN_DIR/metaltune to the venv's, replaces its own old link, leaves another install's file alone,
and says how when it cannot. Run on a copy of the script in a folder laid out like a checkout.
bootstrap.sh also waits for apt's lock (`DPkg::Lock::Timeout`): checked here as text only, since
holding the real dpkg lock would stop every other apt on this machine."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _checkout(tmp: Path) -> Path:
    (tmp / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts/link_cli.sh", tmp / "scripts/link_cli.sh")
    exe = tmp / ".venv/bin/metaltune"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\necho metaltune-from-venv\n")
    exe.chmod(0o755)
    return tmp


def _link(repo: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo / "scripts/link_cli.sh")], capture_output=True,
                          text=True, timeout=30, env={**os.environ, "METALTUNE_BIN_DIR": str(bin_dir)})


def test_metaltune_is_on_path_after_bootstrap(tmp_path):
    repo, bin_dir = _checkout(tmp_path / "repo"), tmp_path / "bin"
    bin_dir.mkdir()
    r = _link(repo, bin_dir)
    assert r.returncode == 0, r.stderr
    link = bin_dir / "metaltune"
    assert link.is_symlink() and link.resolve() == (repo / ".venv/bin/metaltune").resolve()
    run = subprocess.run(["metaltune"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert run.stdout.strip() == "metaltune-from-venv"
    assert _link(repo, bin_dir).returncode == 0 and link.is_symlink()  # again: same link


def test_another_installs_metaltune_is_left_alone(tmp_path):
    repo, bin_dir = _checkout(tmp_path / "repo"), tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "metaltune").write_text("#!/bin/sh\necho other\n")
    r = _link(repo, bin_dir)
    assert r.returncode == 0 and "left alone" in r.stdout
    assert (bin_dir / "metaltune").read_text().endswith("echo other\n")


def test_bootstrap_ends_with_the_link_and_waits_for_apt():
    text = (ROOT / "scripts/bootstrap.sh").read_text()
    assert text.rstrip().splitlines()[-1].startswith("bash scripts/link_cli.sh")
    assert text.count("DPkg::Lock::Timeout=") == 2
