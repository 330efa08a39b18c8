"""`apply` while its change is in probation, as a user runs it: one line per state change (no
TTY), a countdown on a terminal, done as soon as another shell confirms or rolls back, and
`--no-wait` leaving the probation to the background (and to `metaltune confirm`)."""
from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time

from tests.simhelpers import REPO, SimCli


def _wait_state(mt: SimCli, state: str, timeout: float = 60.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = mt("status", "--json")
        if r.returncode == 0:
            s = json.loads(r.stdout)
            if s["pending"] and s["pending"]["state"] == state:
                return s
        time.sleep(0.3)
    raise AssertionError(f"no transaction reached {state}")


def test_confirm_from_another_shell_ends_the_wait(tmp_path):
    mt = SimCli(tmp_path, "h200")
    p = mt.popen("apply", "h200", "--probation", "300")
    try:
        _wait_state(mt, "probation")
        t0 = time.monotonic()
        c = mt("confirm")
        assert c.returncode == 0 and "confirmed transaction 1" in c.stdout, c.stderr
        out, err = p.communicate(timeout=30)  # not the 300 s probation
        assert time.monotonic() - t0 < 30
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert "applied (transaction 1)" in out
    # no TTY: one line per state change, in order
    lines = [ln for ln in err.splitlines() if ln.startswith("transaction 1:")]
    assert [ln.split(":", 1)[1].split()[0] for ln in lines] == ["writing", "in", "confirmed"], err
    assert "in probation for 300s" in err and "metaltune confirm" in err
    assert "confirmed by the operator" in lines[-1]


def test_rollback_from_another_shell_ends_the_wait_with_exit_1(tmp_path):
    mt = SimCli(tmp_path, "h200")
    p = mt.popen("apply", "h200", "--probation", "300")
    try:
        _wait_state(mt, "probation")
        r = mt("rollback")
        assert r.returncode == 0, r.stderr
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 1
    assert "rolled back" in err and "transaction 1: rolled back" in err
    assert "active profile: none" in mt("status").stdout


def test_no_wait_returns_in_probation_and_confirm_keeps_it(tmp_path):
    mt = SimCli(tmp_path, "h200")
    t0 = time.monotonic()
    r = mt("apply", "h200", "--probation", "300", "--no-wait")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 60
    assert "in probation (transaction 1)" in r.stdout and "metaltune confirm" in r.stdout
    s = json.loads(mt("status", "--json").stdout)
    assert s["pending"]["state"] == "probation" and s["current"]["os.numa_balancing"] == 0
    assert s["active_profile"] is None  # not until it is confirmed
    c = mt("confirm")
    assert c.returncode == 0, c.stderr
    s = json.loads(mt("status", "--json").stdout)
    assert s["pending"] is None and s["active_profile"]["name"] == "h200"
    assert s["current"]["os.numa_balancing"] == 0  # kept: the background saw the confirm
    # the background process has let the writer lock go: another apply can run
    r = mt("apply", "h200", "--probation", "0")
    assert r.returncode == 0 and "nothing to change" in r.stdout, r.stderr


def test_no_wait_probation_passes_in_the_background(tmp_path):
    mt = SimCli(tmp_path, "h200")
    r = mt("apply", "h200", "--probation", "1", "--no-wait", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["result"] == "in probation" and res["transaction"] == 1
    end = time.monotonic() + 60
    while time.monotonic() < end:
        s = json.loads(mt("status", "--json").stdout)
        if s["pending"] is None:
            break
        time.sleep(0.3)
    assert s["pending"] is None and s["recent"][0]["state"] == "confirmed", s["recent"]
    assert s["current"]["os.numa_balancing"] == 0


def test_terminal_shows_a_countdown(tmp_path):
    mt = SimCli(tmp_path, "h200")
    master, slave = pty.openpty()
    p = subprocess.Popen(mt.cmd("apply", "h200", "--probation", "3"), cwd=REPO, env=mt.env,
                         stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    buf = b""
    end = time.monotonic() + 90
    while time.monotonic() < end:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout=30)
    os.close(master)
    text = buf.decode(errors="replace")
    assert p.returncode == 0, text
    assert "probation" in text and "━" in text  # rich's bar, drawn while waiting
    assert "transaction 1: confirmed" in text
