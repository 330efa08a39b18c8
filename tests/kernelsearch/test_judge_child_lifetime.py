"""The judge's child dies with the process that judges (issue 33, item 7's class, for the
judge): it runs in a session of its own, so a SIGKILL of `metaltune kernel check` left its
warden and its worker (a candidate spinning as the sandbox user) running, with nobody left to
enforce the timeout. Both now die with their parent (PR_SET_PDEATHSIG, the worker's set again
after its privilege drop)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from tests.simhelpers import REPO

GOOD = json.loads((REPO / "tests/proposers/llm/recordings/good_kernel.json").read_text())[
    "content"][-1]["input"]["source"]


def _spinning() -> str:
    """The recorded rmsnorm candidate whose forward never returns (the guard lets it pass)."""
    i = GOOD.index("def forward(")
    j = GOOD.index("\n", GOOD.index(":", i)) + 1
    return GOOD[:j] + "    n = 0\n    while n >= 0:\n        n += 1\n" + GOOD[j:]


def test_a_killed_kernel_check_takes_the_judges_child_and_worker(tmp_path):
    cand = tmp_path / "spin.py"
    cand.write_text(_spinning())
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1",
           "METALTUNE_STATE_DIR": str(tmp_path / "state")}
    cli = subprocess.Popen([sys.executable, "-m", "tuner", "kernel", "check", "--family",
                            "rmsnorm", "--candidate", str(cand), "--device", "cpu",
                            "--no-timing", "--timeout", "300"], env=env, cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    below: list[psutil.Process] = []
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end:  # the warden and its worker, the worker busy
            try:
                below = psutil.Process(cli.pid).children(recursive=True)
                if len(below) >= 2 and below[-1].cpu_times().user > 2.0:
                    break
            except psutil.Error:
                pass
            time.sleep(0.2)
        assert len(below) >= 2, "the judge's child never started its worker"
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=30)
        end = time.monotonic() + 5
        alive = below
        while alive and time.monotonic() < end:
            alive = [p for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.1)
        assert not alive, f"outlived the killed kernel check by 5 s: {[p.pid for p in alive]}"
    finally:
        if cli.poll() is None:
            cli.kill()
        for p in below:
            try:
                p.kill()
            except psutil.Error:
                pass
