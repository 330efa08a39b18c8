"""Ctrl-C at the worst moment of a journal write (the rare hang after Ctrl-C in `apply`).

CPython raises KeyboardInterrupt when the C call that was running returns (the eval breaker
runs after each call), so a SIGINT can surface right after `lock.acquire()` or right after
`BEGIN IMMEDIATE` succeeds. These inject the KeyboardInterrupt exactly there, deterministically,
and check what the rest of the process and other processes rely on afterwards: the process
lock is free for another thread, the journal is writable by another process within seconds (no
write transaction left open, which makes every other writer wait out SQLite's 30 s busy
timeout), and this connection writes again."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from safety import Journal
from safety import journal_sqlite

WRITE_ELSEWHERE = ("import sqlite3, sys\n"
                   "c = sqlite3.connect(sys.argv[1], timeout=3.0, isolation_level=None)\n"
                   "c.execute('BEGIN IMMEDIATE'); c.execute('ROLLBACK'); print('wrote')\n")


def _free_for_another_thread(timeout: float = 3.0) -> bool:
    got: list[bool] = []

    def take() -> None:
        lk = journal_sqlite.io()
        ok = lk.acquire(timeout=timeout)
        got.append(ok)
        if ok:
            lk.release()

    t = threading.Thread(target=take)
    t.start()
    t.join(timeout + 5)
    return got == [True]


def _writable_from_another_process(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WRITE_ELSEWHERE, str(path)],
                          capture_output=True, text=True, timeout=60)


def _last_label(j: Journal) -> str:
    return j._one("SELECT label FROM txns ORDER BY id DESC LIMIT 1")["label"]


class _InterruptedAfterAcquire:
    """The process lock, with Ctrl-C arriving while acquire() runs: the lock is taken, then
    KeyboardInterrupt is raised as the call returns (once)."""

    def __init__(self, real: "threading.RLock"):
        self.real, self.armed = real, True

    def acquire(self, *a, **kw):
        got = self.real.acquire(*a, **kw)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return got

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __enter__(self):
        return self.real.__enter__()

    def __exit__(self, *exc):
        return self.real.__exit__(*exc)


class _InterruptedAfterBegin:
    """A connection whose BEGIN IMMEDIATE succeeds, then KeyboardInterrupt (once)."""

    def __init__(self, real):
        self.real, self.armed = real, True

    def execute(self, sql, *a):
        cur = self.real.execute(sql, *a)
        if self.armed and sql.startswith("BEGIN"):
            self.armed = False
            raise KeyboardInterrupt
        return cur

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture
def journal(tmp_path):
    j = Journal(tmp_path / "journal.db")
    j.record("setup", "a journal with something in it")
    yield j
    lk = journal_sqlite.io()
    while lk._is_owned():  # what a failing test leaked: the next tests must not hang on it
        lk.release()
    j.close()


def test_ctrl_c_right_after_the_lock_is_taken_leaves_it_free(journal, monkeypatch):
    lock = _InterruptedAfterAcquire(journal_sqlite.io())
    monkeypatch.setattr(journal_sqlite, "io", lambda: lock)
    with pytest.raises(KeyboardInterrupt):
        journal.record("interrupted", "Ctrl-C as the lock was taken")
    assert not lock.armed, "the injected Ctrl-C did not fire"
    monkeypatch.undo()
    # another thread of this process (the probation view, the monitor thread) gets the lock
    assert _free_for_another_thread(), "the journal's process lock is still held after Ctrl-C"
    r = _writable_from_another_process(journal.path)
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    journal.record("after", "this process writes again")
    assert _last_label(journal) == "after"


def test_ctrl_c_right_after_begin_leaves_no_transaction_open(journal, monkeypatch):
    real = journal._conn()
    wrapped = _InterruptedAfterBegin(real)
    monkeypatch.setattr(journal, "_conn", lambda: wrapped)
    with pytest.raises(KeyboardInterrupt):
        journal.record("interrupted", "Ctrl-C as BEGIN IMMEDIATE returned")
    assert not wrapped.armed, "the injected Ctrl-C did not fire"
    monkeypatch.undo()
    assert not real.in_transaction, "a write transaction was left open on this connection"
    assert _free_for_another_thread()
    # another process (the watchdog, `metaltune status`/`rollback`) can write at once
    r = _writable_from_another_process(journal.path)
    assert r.returncode == 0 and "wrote" in r.stdout, r.stderr
    # and this process's next write (the rollback after Ctrl-C) is not refused
    journal.record("after", "this process writes again")
    assert _last_label(journal) == "after"


def test_a_nested_write_under_the_lock_keeps_the_outer_hold(journal):
    """A write inside a block that already holds the process lock leaves it held by that block
    (and only by it) when it ends, normally or by Ctrl-C."""
    lk = journal_sqlite.io()
    with lk:
        journal.record("nested", "under the outer hold")
        assert lk._is_owned()
    assert _free_for_another_thread()
