"""A profile's kernel table is a journalled change (`kernels.table`), through the real CLI on a
simulated host: `apply` writes STATE_DIR/kernels/active.json inside the safety transaction, and
`rollback`, a fatal incident during probation (`sim inject xid 79`) and `recover
--from-defaults` each remove it, leaving the model processes on the fallback."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, **kw)


def profile(path: Path, warps: int = 1) -> Path:
    path.write_text(yaml.safe_dump({"name": path.stem, "knobs": {}, "kernels": {
        "version": 1, "device": "cpu", "meta": {}, "entries": [
            {"family": "rmsnorm", "dtype": "float32", "match": {"cols": 64},
             "ranges": {"rows": [1, 64]}, "variant": "row",
             "config": {"ROWS": 1, "num_warps": warps}}]}}))
    return path


@pytest.fixture
def host(tmp_path):
    assert cli("sim", "init", str(tmp_path / "sim")).returncode == 0
    args = ["--backend", "sim", "--sim-root", str(tmp_path / "sim"), "--state-dir",
            str(tmp_path / "state")]
    return tmp_path, args, tmp_path / "state" / "kernels" / "active.json"


def test_rollback_removes_the_table(host):
    d, args, active = host
    p = cli(*args, "apply", str(profile(d / "k.yaml")), "--probation", "0")
    assert p.returncode == 0, p.stderr
    assert json.loads(active.read_text())["meta"]["profile"] == "k"
    st = json.loads(cli(*args, "status", "--json").stdout)
    assert st["baseline"]["kernels.table"] == "none"  # journalled: what there was before
    p = cli(*args, "rollback")
    assert p.returncode == 0 and "kernels.table" in p.stdout, p.stderr
    assert not active.exists()


def test_a_fatal_incident_during_probation_removes_the_table(host):
    d, args, active = host
    apply = subprocess.Popen([sys.executable, "-m", "tuner", *args, "apply",
                              str(profile(d / "k.yaml")), "--probation", "20"],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not active.exists() and time.time() < deadline and apply.poll() is None:
            time.sleep(0.2)
        assert active.exists(), "the table was never installed"
        assert cli("sim", "inject", str(d / "sim"), "xid", "79").returncode == 0
        out, err = apply.communicate(timeout=60)
    finally:
        if apply.poll() is None:
            apply.kill()
    assert apply.returncode == 1 and "Xid 79" in err, (out, err)
    assert not active.exists()


def test_recover_from_defaults_removes_the_table(host):
    d, args, active = host
    assert cli(*args, "apply", str(profile(d / "k.yaml", warps=2)), "--probation", "0").returncode == 0
    assert active.exists()
    p = cli(*args, "recover", "--from-defaults")
    assert p.returncode == 0 and "kernels.table" in p.stdout, p.stderr
    assert not active.exists()
    st = json.loads(cli(*args, "status", "--json").stdout)
    assert st["current"]["kernels.table"] == "none"
