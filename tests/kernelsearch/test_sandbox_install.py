"""Run as root with metaltune's Python under a 0700 directory (a venv under /root), the sandbox
user cannot read the interpreter's packages: the judge says so before judging, and what to do,
instead of rejecting every candidate `compile_failed: ModuleNotFoundError`. Tested with a real
venv in a 0700 directory whose site-packages holds triton (a link through the closed dir)."""
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HONEST = Path(__file__).parent / "redteam" / "honest.py"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop is for root callers")


@pytest.fixture(scope="module")
def closed_venv():
    base = Path(tempfile.mkdtemp(prefix="ks-home0700-", dir="/tmp"))
    base.chmod(0o700)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_paths()["purelib"]
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    sp = venv / "lib" / ver / "site-packages"
    import triton

    (sp / "triton").symlink_to(Path(triton.__file__).parent)  # found first, through base/
    (sp / "zz-rest.pth").write_text(purelib + "\n")  # torch and the rest, readable
    yield venv / "bin" / "python"
    subprocess.run(["rm", "-rf", str(base)], check=False)


def _check(python: Path, state: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "tuner", "--state-dir", str(state), "kernel",
                           "check", "--family", "softmax", "--candidate", str(HONEST),
                           "--device", "cpu", "--no-timing", "--json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_an_unreadable_install_is_named_before_judging(closed_venv, tmp_path):
    p = _check(closed_venv, tmp_path, {"KERNELSEARCH_SANDBOX_USER": "nobody"})
    assert p.returncode == 1, p.stderr[-2000:]
    v = json.loads(p.stdout)
    assert (v["stage"], v["code"], v["rule"]) == ("process", "crashed", "sandbox_unreadable"), v
    assert str(closed_venv.parents[1]) in v["detail"]  # the path nobody cannot read
    assert "KERNELSEARCH_SANDBOX_USER=none" in v["detail"]  # and the way out
    assert v["checks"] == []  # nothing was judged


def test_the_way_out_judges_the_same_candidate(closed_venv, tmp_path):
    p = _check(closed_venv, tmp_path, {"KERNELSEARCH_SANDBOX_USER": "none"})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert json.loads(p.stdout)["verdict"] == "accepted"
