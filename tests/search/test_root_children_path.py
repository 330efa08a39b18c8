"""A child the project starts as root never imports a module from a directory another user can
write (issue 33, item 1). The model process of `search mixed` starts as root in a work dir the
sandbox user owns and imports for seconds before it drops privileges: with `python -m` that
dir was first on its module path, and a `zoneinfo.py` the sandbox user planted there ran as
uid 0. Now every child runs with nothing of its working directory on `sys.path`
(safety.pychild)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.search.test_mixed_search import POLICY
from tests.simhelpers import REPO
from tuner.sim.hostinit import init_host

# runs as the sandbox user: plants modules the model server imports after it started, as root,
# in every fresh ks-sandbox-* dir it can write (what a process of that user can do)
PLANTER = r"""
import os, sys, time
base, marks, payload, until = sys.argv[1], sys.argv[2], sys.argv[3], time.time() + float(sys.argv[4])
done = set()
while time.time() < until and not os.path.exists(os.path.join(marks, "stop")):
    for d in os.listdir(base):
        p = os.path.join(base, d)
        if not d.startswith("ks-sandbox-") or d in done:
            continue
        try:
            for name in ("zoneinfo.py", "secrets.py"):
                with open(os.path.join(p, name), "w") as f:
                    f.write(payload)
        except OSError:
            continue
        done.add(d)
        with open(os.path.join(marks, "planted"), "a") as f:
            f.write(p + "\n")
    time.sleep(0.005)
"""

# the planted module: says who ran it, then becomes the real one (the search goes on unaware)
PAYLOAD = r"""
import os, sys, sysconfig, importlib.util
with open(os.path.join(MARKS, "ran-%d" % os.getpid()), "w") as _f:
    _f.write("%s uid=%d" % (__name__, os.geteuid()))
_d = os.path.join(sysconfig.get_paths()["stdlib"], __name__)
_s = (importlib.util.spec_from_file_location(__name__, _d + "/__init__.py",
                                             submodule_search_locations=[_d])
      if os.path.isdir(_d) else importlib.util.spec_from_file_location(__name__, _d + ".py"))
_m = importlib.util.module_from_spec(_s)
sys.modules[__name__] = _m
_s.loader.exec_module(_m)
"""


# the planter's interpreter: one the sandbox user can run (the venv's may live under a 0700 home)
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


@pytest.mark.skipif(os.geteuid() != 0, reason="the model process drops privileges only as root")
def test_a_module_the_sandbox_user_plants_in_the_model_process_dir_never_runs_as_root(tmp_path):
    from kernelsearch.harness import confine

    uid, gid = confine.sandbox_user(os.environ.get("KERNELSEARCH_SANDBOX_USER") or "nobody")
    # the temp dirs of this run only (the planter must not touch another run's): root's, 0755
    base = Path(tempfile.mkdtemp(prefix="h33-plant-", dir="/tmp"))
    os.chmod(base, 0o755)
    planter = None
    marks = base / "marks"
    marks.mkdir()
    os.chmod(marks, 0o777)  # the payload writes here whoever it runs as
    try:
        planter = subprocess.Popen(
            [PYTHON, "-I", "-c", PLANTER, str(base), str(marks),
             f"MARKS = {str(marks)!r}\n" + PAYLOAD, "600"],
            user=uid, group=gid, extra_groups=[], cwd="/")
        root = init_host(tmp_path / "h200", "h200", seed=2, os_tree=False)
        env = {**os.environ, "PYTHONPATH": str(REPO), "METALTUNE_STATE_DIR": str(tmp_path / "s"),
               "METALTUNE_RUN_DIR": str(tmp_path / "run"), "TRITON_INTERPRET": "1",
               "OMP_NUM_THREADS": "1", "TMPDIR": str(base), "KERNELSEARCH_SANDBOX_USER": str(uid)}
        env.pop("METALTUNE_BACKEND", None)
        r = subprocess.run(
            [sys.executable, "-m", "tuner", "--sim-root", str(root), "search", "mixed",
             "--knob", "none", "--family", "rmsnorm", "--no-runtime", "--budget", "1",
             "--max-choices", "2", "--policy", POLICY, "--json"],
            env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
        (marks / "stop").touch()
        planter.wait(timeout=30)
        assert r.returncode == 0, r.stderr[-3000:]
        json.loads(r.stdout)
        planted = (marks / "planted").read_text().split() if (marks / "planted").exists() else []
        assert planted, "the planter never found a sandbox dir: the test proved nothing"
        ran = sorted(p.read_text() for p in marks.glob("ran-*"))
        assert ran == [], f"planted code ran: {ran}"
    finally:
        if planter is not None and planter.poll() is None:
            planter.kill()
        for p, dirs, files in os.walk(base):
            os.chmod(p, stat.S_IRWXU)
        subprocess.run(["rm", "-rf", str(base)])
