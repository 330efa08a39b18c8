"""Root never follows a symlink another user planted, never uses a directory another user can
write, and never believes a control socket another uid answers. Through the real CLI and daemon
processes, with the run/state dir in a world-writable sticky folder (like /tmp) and an attacker
running as nobody."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.daemon.conftest import REPO, base_env, metaltune

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root against an unprivileged attacker")


def as_nobody(fn) -> None:
    """Run fn() in a forked child as nobody (the attacker); raise if it failed."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            fn()
        except BaseException as e:  # reported through the exit code
            print(f"attacker failed: {e!r}", file=sys.stderr)
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the attacker's setup failed"


@pytest.fixture
def shared():
    """A root-owned, world-writable, sticky folder (what /tmp is), plus a victim: a root-owned
    directory and file the attacker wants root to change."""
    top = Path(tempfile.mkdtemp(prefix="mt-shared-", dir="/tmp"))
    top.chmod(0o1777)
    victim = Path(tempfile.mkdtemp(prefix="mt-victim-", dir="/tmp"))
    victim.chmod(0o755)
    (victim / "precious").write_text("precious\n")
    (victim / "precious").chmod(0o644)
    yield top, victim
    shutil.rmtree(top, ignore_errors=True)
    shutil.rmtree(victim, ignore_errors=True)


def _victim_intact(victim: Path) -> None:
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755, "the victim dir's mode was changed"
    assert sorted(p.name for p in victim.iterdir()) == ["precious"], list(victim.iterdir())
    assert (victim / "precious").read_text() == "precious\n"


def _one_line(stderr: str) -> str:
    lines = [l for l in stderr.splitlines() if l.strip() and "level=" not in l]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_daemon_refuses_a_run_dir_symlinked_by_another_user(tmp_path, sim_host, shared):
    top, victim = shared
    as_nobody(lambda: os.symlink(victim, top / "run"))
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'backend = "sim"\nsim_root = "{sim_host}"\nstate_dir = "{tmp_path / "state"}"\n'
                   f'run_dir = "{top / "run"}"\nprobation_s = 1.0\n')
    try:
        p = subprocess.run([sys.executable, "-m", "tuner", "daemon", "--config", str(cfg)],
                           capture_output=True, text=True, env=base_env(top / "run"), cwd=REPO,
                           timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon started in a run dir another user's symlink points at")
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    out = p.stdout + p.stderr
    assert f"symlink owned by uid {NOBODY}" in out, out
    _victim_intact(victim)


def test_daemon_refuses_a_state_dir_another_user_owns(tmp_path, sim_host, shared):
    top, victim = shared

    def plant():
        (top / "state").mkdir(mode=0o777)
        os.chmod(top / "state", 0o777)
        os.symlink(victim / "precious", top / "state" / "writer.lock")

    as_nobody(plant)
    cfg = tmp_path / "d.toml"
    cfg.write_text(f'backend = "sim"\nsim_root = "{sim_host}"\nstate_dir = "{top / "state"}"\n'
                   f'run_dir = "{tmp_path / "run"}"\nprobation_s = 1.0\n')
    try:
        p = subprocess.run([sys.executable, "-m", "tuner", "daemon", "--config", str(cfg)],
                           capture_output=True, text=True, env=base_env(tmp_path / "run"),
                           cwd=REPO, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the daemon started on a state dir another user owns")
    assert p.returncode == 1 and f"owned by uid {NOBODY}" in p.stdout + p.stderr, p
    _victim_intact(victim)


def test_cli_never_truncates_through_a_planted_lock_symlink(tmp_path, sim_host, shared):
    top, victim = shared

    def plant():
        (top / "state").mkdir(mode=0o777)
        os.chmod(top / "state", 0o777)
        os.symlink(victim / "precious", top / "state" / "writer.lock")

    as_nobody(plant)
    env = base_env(tmp_path / "run")
    r = metaltune("--state-dir", str(top / "state"), "--backend", "sim", "--sim-root",
                  str(sim_host), "rollback", env=env, check=False)
    assert r.returncode == 1, (r.stdout, r.stderr)
    line = _one_line(r.stderr)
    assert str(top / "state") in line and f"owned by uid {NOBODY}" in line, line
    _victim_intact(victim)


def test_state_dir_symlink_into_a_victim_dir_is_not_followed(tmp_path, sim_host, shared):
    top, victim = shared
    as_nobody(lambda: os.symlink(victim, top / "state"))
    r = metaltune("--state-dir", str(top / "state"), "--backend", "sim", "--sim-root",
                  str(sim_host), "rollback", env=base_env(tmp_path / "run"), check=False)
    assert r.returncode == 1 and "symlink owned by uid" in _one_line(r.stderr), r
    _victim_intact(victim)


@contextmanager
def fake_daemon(run_dir: Path, bind_as_root: bool):
    """A control socket that answers every request with "restored to baseline", served by a
    process running as nobody. bind_as_root: root made the dir and bound the socket, and the
    server dropped to nobody before listen() (so only SO_PEERCRED can tell); otherwise the
    attacker made the run dir and the socket itself."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            s = socket.socket(socket.AF_UNIX)
            if bind_as_root:
                run_dir.mkdir(mode=0o755)
                s.bind(str(run_dir / "control.sock"))
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            if not bind_as_root:
                run_dir.mkdir(mode=0o777)
                s.bind(str(run_dir / "control.sock"))
                os.chmod(run_dir / "control.sock", 0o777)
            s.listen(8)
            os.write(w, b"1")
            answer = {"ok": True, "result": {"result": "restored to baseline", "restored": [],
                                             "recovered": [], "skipped": []}}
            while True:
                c, _ = s.accept()
                c.makefile("rb").readline()
                c.sendall((json.dumps(answer) + "\n").encode())
                c.close()
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.close(r)
    try:
        yield
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


@pytest.mark.parametrize("bind_as_root", [False, True], ids=["attacker-dir", "peercred-only"])
def test_cli_refuses_a_fake_daemon(tmp_path, sim_host, shared, bind_as_root):
    top, _ = shared
    run = top / "run"
    with fake_daemon(run, bind_as_root):
        env = base_env(run)
        r = metaltune("--state-dir", str(tmp_path / "state"), "--backend", "sim", "--sim-root",
                      str(sim_host), "rollback", env=env, check=False)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "restored" not in r.stdout
    line = _one_line(r.stderr)
    assert str(run / "control.sock") in line, line
    assert ("uid 65534" in line) and ("not trusting" in line), line
