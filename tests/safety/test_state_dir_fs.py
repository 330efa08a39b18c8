"""A read-only or full state dir (issue 15, item 11), on a real file system: a tmpfs mounted for
the test (remounted read-only, or filled up to its size limit). Read commands work (opening the
journal writes nothing; SQLite is opened read-only); write commands fail with the OS's reason
("Read-only file system", "No space left on device") in one line, exit 1, and change nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def tmpfs_state(tmp_path):
    """tmp_path/state on its own 4 MiB tmpfs; skipped where mount is not allowed."""
    d = tmp_path / "state"
    d.mkdir()
    if os.geteuid() != 0 or _mount("-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(d)).returncode:
        pytest.skip("needs root and mount (a tmpfs of a given size)")
    yield d
    _mount("-o", "remount,rw", str(d))
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def cli(tmp: Path, sim: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("METALTUNE_")}
    env.update(PYTHONPATH=str(REPO), METALTUNE_RUN_DIR=str(tmp / "no-daemon"))
    return subprocess.run([sys.executable, "-m", "tuner", "--state-dir", str(tmp / "state"),
                           "--backend", "sim", "--sim-root", str(sim), *args],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)


def ok(r: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def fails_with(r: subprocess.CompletedProcess, reason: str) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert reason in r.stderr, r.stderr
    assert "no transaction is active" not in r.stderr
    return r.stderr


def power(sim: Path) -> float:
    from tuner.sim.fake_pynvml import FakeNVML

    nv = FakeNVML(sim)
    nv.nvmlInit()
    try:
        return nv.nvmlDeviceGetPowerManagementLimit(nv.nvmlDeviceGetHandleByIndex(0)) / 1000.0
    finally:
        nv.nvmlShutdown()


@pytest.fixture
def tuned(tmp_path, tmpfs_state):
    """A sim host (on the ordinary disk) with a confirmed change, journalled on the tmpfs, and a
    trial store there too."""
    sim = tmp_path / "sim"
    ok(subprocess.run([sys.executable, "-m", "tuner", "sim", "init", str(sim), "--sku", "h200"],
                      capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}))
    for watts in (600, 650):
        (tmp_path / f"p{watts}.yaml").write_text(f"name: p{watts}\nknobs:\n  gpu0.power_limit_w: {watts}\n")
    ok(cli(tmp_path, sim, "apply", str(tmp_path / "p600.yaml"), "--probation", "0.2"))
    from tuner.search.store import TrialStore

    with TrialStore.in_state_dir(tmpfs_state) as store:
        store.new_run("host", {"why": "a run the trials command lists"})
    assert power(sim) == 600
    return tmp_path, sim


def _reads_work(tmp: Path, sim: Path) -> None:
    st = json.loads(ok(cli(tmp, sim, "status", "--json")).stdout)
    assert st["baseline"] == {"gpu0.power_limit_w": 700} and st["current"]["gpu0.power_limit_w"] == 600
    assert len(json.loads(ok(cli(tmp, sim, "trials", "--json")).stdout)["runs"]) == 1
    ok(cli(tmp, sim, "profile", "list"))
    ok(cli(tmp, sim, "profile", "show", "h200"))
    ok(cli(tmp, sim, "verify", str(tmp / "p600.yaml")))


def test_read_only_state_dir(tuned):
    tmp, sim = tuned
    state = tmp / "state"
    before = {p.name: p.stat().st_mtime_ns for p in state.iterdir()}
    assert _mount("-o", "remount,ro", str(state)).returncode == 0
    _reads_work(tmp, sim)
    for args in (["apply", str(tmp / "p650.yaml"), "--probation", "0.2"], ["rollback"],
                 ["baseline", "--accept-current"], ["recover", "--from-defaults"]):
        fails_with(cli(tmp, sim, *args), "Read-only file system")
    assert power(sim) == 600  # nothing reached the device
    assert {p.name: p.stat().st_mtime_ns for p in state.iterdir()} == before


def test_full_state_dir(tuned):
    tmp, sim = tuned
    state = tmp / "state"
    with open(state / "filler", "wb") as f:  # take every free block of the tmpfs
        try:
            while True:
                f.write(b"\0" * (1 << 16))
                f.flush()
        except OSError as e:
            assert e.errno == 28  # ENOSPC: the file system is full
    assert os.statvfs(state).f_bavail == 0
    _reads_work(tmp, sim)
    for args in (["apply", str(tmp / "p650.yaml"), "--probation", "0.2"], ["rollback"]):
        fails_with(cli(tmp, sim, *args), "No space left on device")
    assert power(sim) == 600
    os.unlink(state / "filler")  # space again: the journal is sound and takes the next change
    ok(cli(tmp, sim, "apply", str(tmp / "p650.yaml"), "--probation", "0.2"))
    assert power(sim) == 650
    ok(cli(tmp, sim, "rollback"))
    assert power(sim) == 700
