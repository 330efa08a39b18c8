"""`search mixed` and its model processes (issue 42, item 15): METALTUNE_ENERGY_WINDOW_S, the
energy window the model process reads, never reached it (the model process's environment is an
allow-list); and a SIGTERM of the CLI left the model process's and the sandboxes' temp dirs
behind until the next search swept them. Here the real CLI runs a real mixed search: the model
process's own environment (/proc/PID/environ) holds the window, and after a SIGTERM nothing of
the search is left in its TMPDIR."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.daemon.conftest import sim_host, start_daemon  # noqa: F401  (fixtures)
from tests.search.test_mixed_search import POLICY
from tests.simhelpers import REPO
from tuner.sim.hostinit import init_host


def _model_processes(tmp: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if b"tuner.workloads.model_server" in cmd and str(tmp).encode() in env:
            out.append(int(d.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_the_energy_window_reaches_the_model_process_and_sigterm_leaves_no_temp_dirs(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="h42-tmp-", dir="/tmp"))
    os.chmod(base, 0o755)
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    env = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_STATE_DIR": str(tmp_path / "s"),
           "METALTUNE_RUN_DIR": str(tmp_path / "run"), "TRITON_INTERPRET": "1",
           "OMP_NUM_THREADS": "1", "TMPDIR": str(base), "METALTUNE_ENERGY_WINDOW_S": "2.5"}
    env.pop("METALTUNE_BACKEND", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "tuner", "--sim-root", str(root), "search", "mixed", "--knob",
         "none", "--family", "rmsnorm", "--no-runtime", "--budget", "20", "--max-choices", "2",
         "--policy", POLICY], env=env, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        end, pids = time.monotonic() + 240, []
        while time.monotonic() < end and not pids and p.poll() is None:
            pids = _model_processes(base)
            time.sleep(0.2)
        assert pids, f"no model process seen (rc={p.poll()}): {p.stderr.read() if p.poll() is not None else ''}"
        environ = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pids[0]}/environ")
                       .read_bytes().split(b"\0") if b"=" in kv)
        assert environ.get(b"METALTUNE_ENERGY_WINDOW_S") == b"2.5", sorted(environ)
        time.sleep(1.0)  # into the search: model process, sandbox dirs
        assert any(base.iterdir()), "the search made no temp dir: the test proves nothing"
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
        assert p.returncode != 0
        end = time.monotonic() + 20
        while time.monotonic() < end and any(base.iterdir()):
            time.sleep(0.2)  # the model process's tree goes as its parent unwinds
        assert sorted(x.name for x in base.iterdir()) == []
        assert not any(_alive(pid) for pid in pids)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        subprocess.run(["rm", "-rf", str(base)])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon's socket is root-only")
def test_a_daemon_stop_mid_search_leaves_no_temp_dirs(tmp_path, sim_host, start_daemon,
                                                      monkeypatch):
    import threading

    import tests.daemon.conftest as dconf
    from tests.daemon.conftest import write_config

    base = Path(tempfile.mkdtemp(prefix="h42-tmp-", dir="/tmp"))
    os.chmod(base, 0o755)
    real = dconf.base_env
    monkeypatch.setattr(dconf, "base_env", lambda run: {
        **real(run), "TMPDIR": str(base), "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"})
    try:
        d = start_daemon(write_config(tmp_path / "daemon.toml", sim_host, tmp_path))
        d.wait_ready()
        t = threading.Thread(target=lambda: _ignore(lambda: d.call(
            "search_mixed", timeout=300, knobs=["none"], families=["rmsnorm"], runtime=False,
            budget=20, max_choices=2, policy=POLICY)), daemon=True)
        t.start()
        end = time.monotonic() + 240
        while time.monotonic() < end and not _model_processes(base):
            time.sleep(0.2)
        assert _model_processes(base), d.log()[-3000:]
        time.sleep(1.0)
        assert d.stop() == 0
        assert sorted(x.name for x in base.iterdir()) == []
    finally:
        subprocess.run(["rm", "-rf", str(base)])


def _ignore(fn) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - the daemon stops under it
        pass
