"""Ctrl-C inside `Transaction.begin` (the rare hang after Ctrl-C in `apply`): CPython raises
KeyboardInterrupt as the C call that was running returns, so it can surface right after the
writer lock is taken or right after the journal says "probation", before the transaction
object knows it. Injected there, deterministically: the change is rolled back at once (not by
the watchdog once the caller is gone), the journal says so, and the writer lock is free for
another process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from safety import Transaction

FLOCK_ELSEWHERE = ("import fcntl, os, sys\n"
                   "fd = os.open(sys.argv[1], os.O_RDWR)\n"
                   "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('locked')\n")


def _lock_free_for_another_process(state: Path) -> bool:
    r = subprocess.run([sys.executable, "-c", FLOCK_ELSEWHERE, str(state / "writer.lock")],
                       capture_output=True, text=True, timeout=60)
    return r.returncode == 0 and "locked" in r.stdout


def _interrupt_after(obj, name):
    """obj.name, which does its work and then has Ctrl-C raised as it returns (once)."""
    real = getattr(obj, name)
    fired = []

    def wrapped(*a, **kw):
        out = real(*a, **kw)
        if not fired:
            fired.append(out)
            raise KeyboardInterrupt
        return out

    setattr(obj, name, wrapped)
    return fired


def test_ctrl_c_as_probation_starts_rolls_back_at_once(fhost, journal, policy, state):
    _, knobs = fhost
    t = Transaction(journal, knobs, {"gpu0.power_limit_w": 500}, policy=policy, state_dir=state,
                    probation_s=300)
    fired = _interrupt_after(journal, "start_probation")
    with pytest.raises(KeyboardInterrupt):
        t.begin()
    assert fired == [True], "the injected Ctrl-C did not fire"
    assert t.state == "rolled_back", t.state
    assert journal.txn(t.id)["state"] == "rolled_back"
    assert knobs["gpu0.power_limit_w"].read() == 700
    assert _lock_free_for_another_process(state)


def test_ctrl_c_as_the_writer_lock_is_taken_leaves_it_free(fhost, journal, policy, state):
    _, knobs = fhost
    t = Transaction(journal, knobs, {"gpu0.power_limit_w": 500}, policy=policy, state_dir=state,
                    probation_s=300)
    fired = _interrupt_after(t._lock, "acquire")
    with pytest.raises(KeyboardInterrupt):
        t.begin()
    assert fired, "the injected Ctrl-C did not fire"
    assert t.state == "new" and t.id is None  # nothing journalled, nothing written
    assert knobs["gpu0.power_limit_w"].read() == 700
    assert _lock_free_for_another_process(state)


def test_ctrl_c_as_flock_returns_keeps_no_writer_lock(state, monkeypatch):
    import fcntl

    from safety import WriterLock
    from safety import lock as lockmod

    monkeypatch.setattr(fcntl, "flock", fcntl.flock)  # so the wrapper is undone afterwards
    fired = _interrupt_after(fcntl, "flock")  # the flock is taken, then Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        WriterLock(state, role="test").acquire()
    assert fired, "the injected Ctrl-C did not fire"
    assert _lock_free_for_another_process(state)
    assert str(state / "writer.lock") not in lockmod._held  # nor counted as held here
