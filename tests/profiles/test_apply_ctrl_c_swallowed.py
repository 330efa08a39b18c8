"""A Ctrl-C that Python drops still ends `apply` (the rare hang after Ctrl-C in `apply`).

CPython raises KeyboardInterrupt in whatever Python code runs when the signal is noticed. When
that is code Python calls from C (a __del__, a weakref callback such as importlib's module-lock
cleanup, an at-fork hook), the KeyboardInterrupt is printed as "Exception ignored" and dropped,
and `apply` went on with its 300 s probation as if no Ctrl-C had come: no exit, no result. Here a
__del__ in the main thread sends the SIGINT to its own process while it runs (deterministic), as
a real Ctrl-C would arrive there; `apply` must still roll back and exit 130."""
from __future__ import annotations

import json
import signal
import subprocess

from tests.simhelpers import REPO, SimCli

SWALLOW = r"""
import os, signal, sys, time
from safety import transaction as T

real, calls = T.Transaction.check, []


class InDel:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the KeyboardInterrupt is raised here, inside __del__: Python drops it


def check(self):
    calls.append(1)
    if len(calls) == 3:  # in probation, in the main thread's wait
        InDel()  # dropped at once: its __del__ runs now
    return real(self)


T.Transaction.check = check
from tuner.cli import main
sys.exit(main())
"""


def test_a_ctrl_c_dropped_inside_a_del_still_rolls_back_and_exits_130(tmp_path):
    mt = SimCli(tmp_path, "h200")
    p = subprocess.Popen([mt.python, "-c", SWALLOW, "apply", "h200", "--probation", "300"],
                         cwd=REPO, env=mt.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError("apply went on after the Ctrl-C:\n" + err) from None
    assert "Exception ignored" in err and "KeyboardInterrupt" in err, err  # it was dropped
    assert p.returncode == 130, err
    assert "interrupted (Ctrl-C); transaction 1 rolled back" in err, err
    s = json.loads(mt("status", "--json").stdout)
    assert s["pending"] is None and s["recent"][0]["state"] == "rolled_back", s["recent"]
    assert s["current"]["os.numa_balancing"] == s["baseline"]["os.numa_balancing"]
