"""Ctrl-C of `apply --no-wait` stops the change (issue 42, item 8). The background that writes
the knobs and waits out the probation runs in a session of its own, so the terminal's SIGINT
reached only the CLI: it exited 130 with nothing said while the background went on, and the
change passed probation and was kept. Now the CLI passes the Ctrl-C on: the background rolls
back what it wrote (or stops before writing), and the CLI says how it ended.

The SIGINT is real, sent to the CLI process by its own background at a chosen point of the
write (safety._crash's named points), as a Ctrl-C landing then would arrive."""
from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.simhelpers import REPO, SimCli

# the CLI, with the background's crash points sending the CLI a SIGINT at the point named by
# $H42_AT (the CLI's own process never stops there: only its forked background writes)
WRAP = r"""
import os, signal, sys, time
from safety import _crash

CLI, AT = os.getpid(), os.environ["H42_AT"]


def point(name):
    if name.startswith(AT) and os.getpid() != CLI:
        os.kill(CLI, signal.SIGINT)  # the operator's Ctrl-C, as the terminal sends it
        time.sleep(2.0)  # still writing when it is passed on


_crash.point = point
from tuner.cli import main
sys.exit(main())
"""


def _settled(mt: SimCli, timeout: float = 60.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = json.loads(mt("status", "--json").stdout)
        if s["pending"] is None:
            return s
        time.sleep(0.3)
    raise AssertionError(f"still pending: {s['pending']}")


@pytest.mark.parametrize("at", ["apply.before:", "apply.after:", "applied:"])
def test_ctrl_c_while_the_background_writes_rolls_back_and_says_so(tmp_path, at):
    mt = SimCli(tmp_path, "h200")
    p = subprocess.Popen([mt.python, "-c", WRAP, "apply", "h200", "--probation", "300",
                          "--no-wait"], cwd=REPO, env={**mt.env, "H42_AT": at},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out, err = p.communicate(timeout=90)
    assert p.returncode == 130, (out, err)
    assert "interrupted (Ctrl-C)" in err and "rolled back" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    s = _settled(mt)
    assert s["recent"][0]["state"] == "rolled_back", s["recent"]
    assert s["current"]["os.numa_balancing"] == s["baseline"]["os.numa_balancing"]
    time.sleep(1.5)  # a background that went on would confirm or stay in probation meanwhile
    s = json.loads(mt("status", "--json").stdout)
    assert s["pending"] is None and s["recent"][0]["state"] == "rolled_back", s["recent"]


def test_ctrl_c_before_the_background_starts_writes_nothing(tmp_path):
    mt = SimCli(tmp_path, "h200")
    p = subprocess.Popen([mt.python, "-c", WRAP, "apply", "h200", "--probation", "300",
                          "--no-wait"], cwd=REPO, env={**mt.env, "H42_AT": "no such point"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.3)  # still importing: the apply has not begun
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    assert p.returncode in (130, -signal.SIGINT)  # (before Python's handler: the signal's)
    s = json.loads(mt("status", "--json").stdout)
    assert s["pending"] is None and not s["recent"], s["recent"]
