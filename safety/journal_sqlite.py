"""The journal's SQLite file: its schema, the process-wide lock every SQLite call holds, the
connection per thread, committed transactions, and a failed write as StateUnwritable.

Durability: `synchronous=FULL` with a rollback journal (`journal_mode=TRUNCATE`): a committed
record is fsynced, so it survives power loss, not only a process crash.

Not WAL, because of fork: the probation watchdog is *forked* from the process that holds the
journal open (it must keep the caller's knob objects) and then opens its own connection. SQLite
shares per-file state between connections of one process, and after fork() the child believes it
holds its parent's lock on WAL's shared-memory index. Once the parent dies, the next process to
open the journal resets that index, and the child's next commit touches memory past the end of
the truncated file: SIGBUS, the rollback done but never journalled (seen here about once in five
runs of "caller killed during probation" under CPU load). With a rollback journal there is no
shared memory, and every SQLite call in this process runs under one lock that fork() also takes
(`os.register_at_fork`), so a child never starts with a lock its parent held mid-statement.
"""
from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Optional

from safety.errors import StateUnwritable

# every SQLite call of this process, in any thread and any Journal, holds this lock; fork() takes
# it too, so a forked child (the watchdog) never inherits a statement or lock in progress
_IO = threading.RLock()


def _after_fork_in_child() -> None:
    global _IO
    _IO = threading.RLock()  # the child has one thread; the parent's holder is gone


os.register_at_fork(before=lambda: _IO.acquire(), after_in_parent=lambda: _IO.release(),
                    after_in_child=_after_fork_in_child)


def io() -> threading.RLock:
    """The lock of this process's SQLite calls. Take it anew for each use and never keep it: a
    forked child replaces it."""
    return _IO


SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- first value of each knob before metaltune first changed it, per physical thing (identity)
CREATE TABLE IF NOT EXISTS baseline (
    knob TEXT NOT NULL, identity TEXT NOT NULL, value TEXT NOT NULL, effect TEXT NOT NULL,
    taken_at REAL NOT NULL, PRIMARY KEY (knob, identity));
-- one transaction: a set of knob changes applied, probed and confirmed or rolled back together
--   state: intent -> probation -> confirmed | rolling_back -> rolled_back | rollback_failed
CREATE TABLE IF NOT EXISTS txns (
    id INTEGER PRIMARY KEY AUTOINCREMENT, label TEXT NOT NULL, candidate_key TEXT,
    state TEXT NOT NULL, created REAL NOT NULL, deadline REAL, probation_s REAL,
    pid INTEGER, watchdog_pid INTEGER, reason TEXT, updated REAL NOT NULL);
--   state: intent -> applied -> confirmed | rolled_back | rollback_failed
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, txn_id INTEGER NOT NULL REFERENCES txns(id),
    seq INTEGER NOT NULL, knob TEXT NOT NULL, identity TEXT NOT NULL, effect TEXT NOT NULL,
    before TEXT NOT NULL, after TEXT NOT NULL, state TEXT NOT NULL, created REAL NOT NULL,
    applied_at REAL, resolved_at REAL, reason TEXT);
CREATE INDEX IF NOT EXISTS changes_knob ON changes (knob, created);
CREATE INDEX IF NOT EXISTS changes_txn ON changes (txn_id);
CREATE TABLE IF NOT EXISTS incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, type TEXT NOT NULL,
    severity TEXT NOT NULL, xid INTEGER, gpu TEXT, source TEXT, detail TEXT NOT NULL,
    data TEXT, txn_id INTEGER, knob TEXT, action TEXT);
CREATE TABLE IF NOT EXISTS quarantine (
    key TEXT PRIMARY KEY, reason TEXT NOT NULL, incident_id INTEGER, txn_id INTEGER,
    time REAL NOT NULL);
"""


def dump(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def load(s: Optional[str]) -> Any:
    return None if s is None else json.loads(s)


class SqliteFile:
    """A journal file opened per thread (never across fork); `path`, `readonly` and `_local`
    (a threading.local) are set by the subclass."""

    path: Path
    readonly: bool
    _local: threading.local

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None or getattr(self._local, "pid", None) != os.getpid():
            # never reuse a connection across fork: open a fresh one in the child
            if self.readonly:  # opening must not write: not even the journal-mode pragma
                c = connect_readonly(self.path)
            else:
                c = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
                c.execute("PRAGMA journal_mode=TRUNCATE")  # not WAL: see the module docstring
                c.execute("PRAGMA synchronous=FULL")
            c.execute("PRAGMA foreign_keys=ON")
            c.row_factory = sqlite3.Row
            self._local.conn, self._local.pid = c, os.getpid()
        return c

    class _Tx:
        """A committed write under the process lock. Ctrl-C safe: CPython raises
        KeyboardInterrupt as the C call that was running returns, so it can surface right after
        `acquire()` or right after `BEGIN IMMEDIATE`. Both are inside the `try`, whose except
        path undoes exactly what was done: a lock left held would block every other thread's
        journal call for good (the apply's probation view; its monitor thread, which journals
        incidents under the transaction's own lock), and a write transaction left open would
        make other processes' writers (the watchdog, `rollback`) wait out the busy timeout and
        this connection refuse its next BEGIN (the rollback after the Ctrl-C)."""

        def __init__(self, journal: "SqliteFile"):
            self.journal = journal
            self.lock = io()

        def __enter__(self) -> sqlite3.Connection:
            # nested under a hold of this thread (`with io():`): that hold outlives this block,
            # so it neither takes nor releases a level of its own
            self.nested = self.lock._is_owned()
            c: Optional[sqlite3.Connection] = None
            began = False
            try:
                if not self.nested:
                    self.lock.acquire()
                c = self.c = self.journal._conn()
                began = not c.in_transaction  # not someone else's transaction to roll back
                c.execute("BEGIN IMMEDIATE")
            except BaseException as e:
                try:
                    if began and c is not None and c.in_transaction:
                        c.execute("ROLLBACK")
                finally:
                    if not self.nested and self.lock._is_owned():
                        self.lock.release()
                if isinstance(e, sqlite3.OperationalError):
                    raise unwritable_error(self.journal.path, e) from None
                raise
            return c

        def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
            try:
                if et is None:
                    try:
                        self.c.execute("COMMIT")
                    except sqlite3.Error as e:
                        if self.c.in_transaction:
                            self.c.execute("ROLLBACK")
                        raise unwritable_error(self.journal.path, e) from None
                elif self.c.in_transaction:
                    # after SQLITE_FULL / an I/O error SQLite has already rolled back: a second
                    # ROLLBACK would replace the real reason with "no transaction is active"
                    self.c.execute("ROLLBACK")
            finally:
                if not self.nested:
                    self.lock.release()
            if isinstance(ev, sqlite3.OperationalError):
                raise unwritable_error(self.journal.path, ev) from None

    def _tx(self) -> "SqliteFile._Tx":
        return SqliteFile._Tx(self)

    def _all(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """A read, fetched whole under the process lock (no statement left open)."""
        with io():
            return self._conn().execute(sql, args).fetchall()

    def _one(self, sql: str, args: tuple = ()) -> Optional[sqlite3.Row]:
        rows = self._all(sql, args)
        return rows[0] if rows else None

    def data_version(self) -> tuple[int, int]:
        """(PRAGMA data_version, this connection's total_changes): changes when anyone commits."""
        with io():
            c = self._conn()
            return c.execute("PRAGMA data_version").fetchall()[0][0], c.total_changes

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None and self._local.pid == os.getpid():
            with io():
                c.close()
        self._local.conn = None


def connect_readonly(path: str | os.PathLike[str], immutable: bool = False) -> sqlite3.Connection:
    """A connection that never writes, not even SQLite's own files where it can help it: on a
    read-only file system nobody can be writing, so the file is opened as immutable (a WAL
    database would otherwise need its -shm file created)."""
    p = Path(path).absolute()
    immutable = immutable or bool(os.statvfs(p.parent).f_flag & os.ST_RDONLY)
    uri = f"file:{urllib.parse.quote(str(p))}?mode=ro" + ("&immutable=1" if immutable else "")
    return sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)


def _os_reason(path: Path, e: BaseException) -> str:
    """The operating system's words for why a write failed. SQLite says "database or disk is
    full" or "attempt to write a readonly database"; the file system says which."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    try:
        st = os.statvfs(path.parent)
    except OSError:
        st = None
    code = getattr(e, "sqlite_errorname", "") or ""
    if st is not None and st.f_flag & os.ST_RDONLY:
        return os.strerror(errno.EROFS)
    if code.startswith("SQLITE_FULL") or (st is not None and st.f_bavail == 0):
        return os.strerror(errno.ENOSPC)
    if code.startswith("SQLITE_READONLY"):
        return os.strerror(errno.EACCES)
    return f"{os.strerror(errno.EIO)} ({e})" if code.startswith("SQLITE_IOERR") else str(e)


def unwritable_error(path: Path, e: BaseException) -> StateUnwritable:
    return StateUnwritable(f"{path}: cannot write: {_os_reason(path, e)}")


class unwritable:
    """Turn a failed write of a state file (OSError, SQLite's error) into StateUnwritable."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if isinstance(ev, (OSError, sqlite3.OperationalError)) and not isinstance(ev, FileNotFoundError):
            raise unwritable_error(getattr(ev, "filename", None) and Path(ev.filename) or self.path, ev) from None
