"""`apply --no-wait` followed by each way its probation can end in a rollback (issue 33, item 11).

The detached probation reported "in probation" through a pipe, closed it, and on a later
rollback wrote its error message to the same descriptor number, which SQLite had reused for the
journal: `journal.db` began with a JSON error and every later command refused the state dir. Here
each path is run through the real CLI, and afterwards the journal must still be a SQLite file and
`status`, `apply --dry-run` and a fresh `apply` must work."""
from __future__ import annotations

import json
import os
import signal
import time

from tests.simhelpers import SimCli

SQLITE_MAGIC = b"SQLite format 3\x00"


def _start(mt: SimCli, probation: str = "300") -> int:
    r = mt("apply", "h200", "--probation", probation, "--no-wait", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["result"] == "in probation" and res["transaction"] == 1
    return int(res["background_pid"])


def _wait_done(mt: SimCli, pid: int, timeout: float = 90.0) -> dict:
    """Until the transaction is rolled back and the background process has exited."""
    end = time.monotonic() + timeout
    s: dict = {}
    while time.monotonic() < end:
        r = mt("status", "--json")
        assert r.returncode == 0, r.stderr  # the journal must stay readable all along
        s = json.loads(r.stdout)
        if s["pending"] is None and not _alive(pid):
            return s
        time.sleep(0.3)
    raise AssertionError(f"the probation did not end: {s.get('pending')}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (its parent, the CLI, has exited and init reaps it) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _journal_intact_and_usable(mt: SimCli, s: dict) -> None:
    db = mt.state / "journal.db"
    with open(db, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    assert head == SQLITE_MAGIC, f"journal.db overwritten: {head!r}"
    assert s["recent"][0]["id"] == 1 and s["recent"][0]["state"] == "rolled_back", s["recent"]
    assert s["current"]["os.numa_balancing"] == s["baseline"]["os.numa_balancing"]
    r = mt("apply", "h200", "--dry-run")
    assert r.returncode == 0, r.stderr
    r = mt("trials", "--json")
    assert r.returncode == 0, r.stderr


def test_no_wait_then_an_xid_rolls_back_and_keeps_the_journal(tmp_path):
    mt = SimCli(tmp_path, "h200")
    pid = _start(mt)
    assert mt("sim", "inject", str(mt.root), "xid", "79").returncode == 0
    s = _wait_done(mt, pid)
    _journal_intact_and_usable(mt, s)
    assert any(i["type"] == "xid" for i in s["incidents"]), s["incidents"]
    # the change set is quarantined after the fatal Xid: a new apply is refused, not broken
    r = mt("apply", "h200", "--probation", "0")
    assert r.returncode == 1 and "quarantined" in r.stderr, r.stderr
    assert "not a readable SQLite" not in r.stderr


def test_no_wait_then_rollback_from_another_shell_keeps_the_journal(tmp_path):
    mt = SimCli(tmp_path, "h200")
    pid = _start(mt)
    r = mt("rollback")
    assert r.returncode == 0, r.stderr
    s = _wait_done(mt, pid)
    _journal_intact_and_usable(mt, s)
    r = mt("apply", "h200", "--probation", "0")  # the writer lock was let go, the journal works
    assert r.returncode == 0 and "applied (transaction" in r.stdout, r.stdout + r.stderr


def test_no_wait_then_the_deadline_passes_unconfirmed_keeps_the_journal(tmp_path):
    """The background is stopped past its deadline (a hung caller): the watchdog rolls back; the
    background, resumed, sees the rollback and ends with an error it must not write anywhere."""
    mt = SimCli(tmp_path, "h200")
    pid = _start(mt, probation="1")  # watch 1 s, deadline 1 + 2 s grace
    os.kill(pid, signal.SIGSTOP)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            s = json.loads(mt("status", "--json").stdout)
            if s["pending"] is None:
                break
            time.sleep(0.3)
        assert s["pending"] is None and s["recent"][0]["state"] == "rolled_back", s["recent"]
    finally:
        os.kill(pid, signal.SIGCONT)
    s = _wait_done(mt, pid)
    _journal_intact_and_usable(mt, s)
    r = mt("apply", "h200", "--probation", "0")
    assert r.returncode == 0 and "applied (transaction" in r.stdout, r.stdout + r.stderr


def test_no_wait_then_recover_keeps_the_journal(tmp_path):
    """`metaltune recover` (what the daemon runs at start) while the background is in probation."""
    mt = SimCli(tmp_path, "h200")
    pid = _start(mt)
    os.kill(pid, signal.SIGKILL)  # the caller died: recover owns the unconfirmed change now
    r = mt("recover")
    assert r.returncode == 0, r.stderr
    s = _wait_done(mt, pid)
    _journal_intact_and_usable(mt, s)
