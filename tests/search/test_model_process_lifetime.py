"""A model process dies with the search that started it, and its temp dirs go (issue 33, item
7). It runs in a session of its own, which a signal to the CLI never reaches: a SIGKILL or
SIGTERM of `metaltune search mixed` used to leave it running (7 days of CPU allowed) and its
temp dirs behind. Now the kernel kills it with its parent (PR_SET_PDEATHSIG, set again after its
privilege drop), and the next model process's start removes the dirs a killed search left."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.search.test_mixed_search import POLICY
from tests.simhelpers import REPO
from tuner.sim.hostinit import init_host


# on the model process's path: its first measurement spins forever (a candidate stuck in a loop,
# or a long GPU run), so the process is busy, not waiting on its requests pipe, when the CLI dies
SPIN = """
import os, sys
if any(a.endswith("model_server") for a in sys.orig_argv):
    import tuner.workloads.llama_runners as lr
    real = lr.Bench.run
    def run(self, *a, **k):
        if not os.path.basename(os.environ.get("HOME", "")).startswith("ks-sandbox-"):
            return real(self, *a, **k)  # not confined yet (its start traces a run)
        open(os.path.join(os.environ["HOME"], "spinning"), "w").close()  # its work dir
        while True:
            pass
    lr.Bench.run = run
"""


def _model_server(cli: int, uid: int, wait_s: float = 240.0) -> psutil.Process:
    """The CLI's model process, once it is confined (it runs as `uid`, or has dropped nothing
    when the sandbox user is `none`): its work dir is then its cwd."""
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            for p in psutil.Process(cli).children():
                if "tuner.workloads.model_server" in " ".join(p.cmdline()) \
                        and p.uids().effective == uid:
                    return p
        except psutil.Error:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no confined model process below the CLI within {wait_s:g} s")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_search_takes_its_model_process_and_leaves_no_temp_dirs(tmp_path, monkeypatch,
                                                                         sig):
    from kernelsearch.harness import confine
    from tuner.sim.llama_host import LLAMA_KW
    from tuner.workloads.model_process import ModelWorkload, Recipe

    user = confine.sandbox_user() if os.geteuid() == 0 else None
    uid = user[0] if user else os.geteuid()
    base = Path(tempfile.mkdtemp(prefix="h33-life-", dir="/tmp"))  # this test's temp dirs
    os.chmod(base, 0o755)  # the sandbox user's work dir is made below it
    (base / "site").mkdir(mode=0o755)  # root's, readable by the sandbox user
    (base / "site" / "sitecustomize.py").write_text(SPIN)
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(base / "site"), str(REPO)]),
           "METALTUNE_STATE_DIR": str(tmp_path / "s"),
           "METALTUNE_RUN_DIR": str(tmp_path / "run"), "TRITON_INTERPRET": "1",
           "OMP_NUM_THREADS": "1", "TMPDIR": str(base)}
    env.pop("METALTUNE_BACKEND", None)
    cli = subprocess.Popen(
        [sys.executable, "-m", "tuner", "--sim-root", str(root), "search", "mixed", "--knob",
         "none", "--family", "rmsnorm", "--no-runtime", "--budget", "3", "--policy", POLICY,
         "--json"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    mp = None
    try:
        mp = _model_server(cli.pid, uid)
        work = Path(os.readlink(f"/proc/{mp.pid}/cwd"))  # confine.enter went there
        private = Path(os.readlink(f"/proc/{mp.pid}/fd/2")).parent  # its stderr's dir
        assert work.parent == base and private.parent == base, (work, private)
        end = time.monotonic() + 120
        while not (work / "spinning").exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert (work / "spinning").exists(), "the model process never started measuring"
        cpu = [ln for ln in Path(f"/proc/{mp.pid}/limits").read_text().splitlines()
               if ln.startswith("Max cpu time")]  # one request's or its start's, not a week
        assert int(cpu[0].split()[4]) < 24 * 3600, cpu
        cli.send_signal(sig)
        cli.wait(timeout=30)
        end = time.monotonic() + 5
        while time.monotonic() < end and mp.is_running() \
                and mp.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.1)
        assert not mp.is_running() or mp.status() == psutil.STATUS_ZOMBIE, \
            f"the model process {mp.pid} outlived its search by 5 s"
        # the next model process's start removes what the killed search left
        monkeypatch.setattr(tempfile, "tempdir", str(base))
        wl = ModelWorkload(Recipe(llama=dict(LLAMA_KW), threads=1, timeout_s=60.0))
        wl.close()
        assert not work.exists() and not private.exists(), sorted(os.listdir(base))
    finally:
        if cli.poll() is None:
            cli.kill()
        if mp is not None and mp.is_running():  # what the old code left spinning
            mp.kill()
        subprocess.run(["rm", "-rf", str(base)])


def test_stopping_the_daemons_search_takes_its_model_process(tmp_path, monkeypatch):
    """The daemon stops a search by its SearchChild (SIGTERM, SIGKILL after the grace): the
    model process below it, busy measuring, goes with it; its dirs at the next start."""
    from kernelsearch.harness import confine
    from tuner.daemon.searches import SearchChild
    from tuner.sim.llama_host import LLAMA_KW
    from tuner.workloads.model_process import ModelWorkload, Recipe

    user = confine.sandbox_user() if os.geteuid() == 0 else None
    uid = user[0] if user else os.geteuid()
    base = Path(tempfile.mkdtemp(prefix="h33-stop-", dir="/tmp"))
    os.chmod(base, 0o755)
    (base / "site").mkdir(mode=0o755)
    (base / "site" / "sitecustomize.py").write_text(SPIN)
    root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
    for k, v in {"PYTHONPATH": os.pathsep.join([str(base / "site"), str(REPO)]),
                 "METALTUNE_STATE_DIR": str(tmp_path / "s"), "METALTUNE_SIM_ROOT": str(root),
                 "METALTUNE_RUN_DIR": str(tmp_path / "run"), "TRITON_INTERPRET": "1",
                 "OMP_NUM_THREADS": "1", "TMPDIR": str(base)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("METALTUNE_BACKEND", raising=False)
    child = SearchChild("search_mixed", {"knobs": ["none"], "families": ["rmsnorm"],
                                         "runtime": False, "budget": 3, "policy": POLICY},
                        "test", tmp_path)
    mp = None
    try:
        mp = _model_server(child.pid, uid)
        work = Path(os.readlink(f"/proc/{mp.pid}/cwd"))
        private = Path(os.readlink(f"/proc/{mp.pid}/fd/2")).parent
        end = time.monotonic() + 120
        while not (work / "spinning").exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert (work / "spinning").exists(), (tmp_path / "search-child.out").read_text()[-2000:]
        child.stop(grace_s=10.0)
        end = time.monotonic() + 5
        while time.monotonic() < end and mp.is_running() \
                and mp.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.1)
        assert not mp.is_running() or mp.status() == psutil.STATUS_ZOMBIE, \
            f"the model process {mp.pid} outlived the stopped search by 5 s"
        monkeypatch.setattr(tempfile, "tempdir", str(base))
        ModelWorkload(Recipe(llama=dict(LLAMA_KW), threads=1, timeout_s=60.0)).close()
        assert not work.exists() and not private.exists(), sorted(os.listdir(base))
    finally:
        if not child.done():
            child.stop(grace_s=1.0)
        if mp is not None and mp.is_running():
            mp.kill()
        subprocess.run(["rm", "-rf", str(base)])
