"""The journal: a durable SQLite record of baselines, change intents and their outcome, incidents
and quarantined candidates. Every record is committed *before* the action it describes, so after
a crash (kill -9, power loss) the journal alone says what may have been written and how to undo it.

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
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, Optional

from safety import anchor
from safety.errors import JournalDamaged, StateUnwritable
from safety.incident import Incident
from safety.securefs import open_file, secure_dir

# every SQLite call of this process, in any thread and any Journal, holds this lock; fork() takes
# it too, so a forked child (the watchdog) never inherits a statement or lock in progress
_IO = threading.RLock()


def _after_fork_in_child() -> None:
    global _IO
    _IO = threading.RLock()  # the child has one thread; the parent's holder is gone


os.register_at_fork(before=lambda: _IO.acquire(), after_in_parent=lambda: _IO.release(),
                    after_in_child=_after_fork_in_child)

SCHEMA_VERSION = 1

_SCHEMA = """
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

OPEN_TXN_STATES = ("intent", "probation", "rolling_back")
#: an incident's action while its rollback waits for the writer (retried until done)
ROLLBACK_PENDING = "rollback pending"
WHAT_TO_DO = ("run `metaltune recover --from-defaults` to restore each knob's driver default, or "
              "`metaltune baseline --accept-current` to accept the values in force now as the baseline")


def _dump(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _load(s: Optional[str]) -> Any:
    return None if s is None else json.loads(s)


class Journal:
    """One SQLite file (default `<state_dir>/journal.db`). Safe to open from several processes
    (the caller, its watchdog, `metaltune status`); one connection per thread."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False,
                 verify: bool = True):
        """`readonly`: open without writing anything (a read command on a read-only state dir);
        the journal must exist (see `open_readonly`). `verify`: compare the journal with its
        anchor and refuse a damaged one (JournalDamaged); the watchdog skips it, since it only
        ever finishes a transaction it was started for."""
        self.path = Path(path)
        if not readonly:  # a trusted dir of ours (created if missing): no planted symlink
            secure_dir(self.path.parent)
        self.anchor_path = anchor.path_for(self.path)
        self.readonly = readonly
        self._local = threading.local()
        mark = anchor.read(self.anchor_path) if verify else None
        size = self.path.stat().st_size if self.path.exists() else None
        if not size:
            if mark is not None and mark["last_txn"] > 0:
                raise JournalDamaged(damage_message(
                    self.path, "is missing" if size is None else "is empty (0 bytes)", mark))
            if readonly:
                raise FileNotFoundError(f"{self.path}: no journal yet")
        found = self._inspect() if size and verify else None
        if found is not None:
            self._compare(found, mark)
        if readonly:
            return
        with unwritable(self.path):
            self._create(mark, found, verify)

    def _create(self, mark: Optional[dict[str, Any]], found: Optional[tuple[Optional[str], int]],
                verify: bool) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():  # root-only: the journal names devices and settings
            os.close(open_file(self.path, os.O_RDWR | os.O_CREAT))
        with _IO:
            c = self._conn()
            c.executescript(_SCHEMA)  # idempotent; commits on its own
            if "action" not in {r[1] for r in c.execute("PRAGMA table_info(incidents)")}:
                c.execute("ALTER TABLE incidents ADD COLUMN action TEXT")  # journals before it
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            # the epoch: which journal this is; the anchor beside it names the same one
            c.execute("INSERT OR IGNORE INTO meta VALUES ('journal_id', ?)", (uuid.uuid4().hex,))
            c.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (repr(time.time()),))
        if verify and (mark is None or found is None or found[0] is None or found[1] > mark["last_txn"]):
            self._sync_anchor()  # new journal, a journal from before anchors, or an anchor behind

    def _inspect(self) -> tuple[Optional[str], int]:
        """(journal id, last transaction id) of an existing file, read without writing;
        JournalDamaged when SQLite cannot read it whole."""
        try:
            with _IO:
                c = self._conn()
                check = [r[0] for r in c.execute("PRAGMA quick_check").fetchall()]
                if check != ["ok"]:
                    raise JournalDamaged(damage_message(
                        self.path, f"fails SQLite's integrity check ({check[0]})",
                        anchor.read(self.anchor_path)))
                tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                if not {"meta", "txns"} <= tables:
                    return None, 0
                r = c.execute("SELECT value FROM meta WHERE key='journal_id'").fetchone()
                last = c.execute("SELECT COALESCE(MAX(id), 0) FROM txns").fetchone()[0]
                return (r[0] if r else None), int(last)
        except sqlite3.DatabaseError as e:
            self.close()
            raise JournalDamaged(damage_message(self.path, f"is not a readable SQLite database ({e})",
                                                anchor.read_quiet(self.anchor_path))) from None

    def _compare(self, found: tuple[Optional[str], int], mark: Optional[dict[str, Any]]) -> None:
        jid, last = found
        if mark is None:
            return  # no anchor yet (a new state dir, or a journal from before anchors): rebuilt
        if jid != mark["journal_id"]:
            what = ("has no journal id" if jid is None else f"has journal id {jid}") + \
                f", not {mark['journal_id']}: it is not the journal metaltune wrote here"
            self.close()
            raise JournalDamaged(damage_message(self.path, what, mark))
        if last < mark["last_txn"]:
            self.close()
            raise JournalDamaged(damage_message(
                self.path, f"ends at transaction {last} but its anchor records transaction "
                f"{mark['last_txn']}: an older copy, or cut short", mark))

    def _sync_anchor(self) -> None:
        """Write what the journal now holds into the anchor: its id, last transaction, the
        baseline and every knob whose latest change not rolled back differs from it."""
        if self.readonly:
            return
        with _IO, anchor.locked(self.path.parent):  # _IO first: fork() never copies the flock
            c = self._conn()
            jid = c.execute("SELECT value FROM meta WHERE key='journal_id'").fetchone()[0]
            last = c.execute("SELECT COALESCE(MAX(id), 0) FROM txns").fetchone()[0]
            base = c.execute("SELECT knob, identity, value, effect FROM baseline ORDER BY knob,"
                             " identity").fetchall()
            in_force = self.in_force()
            data = {"journal_id": jid, "journal": self.path.name, "last_txn": int(last),
                    "in_force": in_force,
                    "baseline": [{"knob": r[0], "identity": r[1], "value": _load(r[2]), "effect": r[3]}
                                 for r in base]}
            if _same_record(anchor.read_quiet(self.anchor_path), data):
                return  # an fsync saved: nothing the anchor holds has changed
            with unwritable(self.anchor_path):
                anchor.write(self.anchor_path, {**data, "updated": time.time()})

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str]) -> "Journal":
        return cls(Path(state_dir) / "journal.db")

    # -- connection ------------------------------------------------------------------------
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
        def __init__(self, journal: "Journal"):
            self.journal = journal
            self.lock = _IO

        def __enter__(self) -> sqlite3.Connection:
            self.lock.acquire()
            try:
                self.c = self.journal._conn()
                self.c.execute("BEGIN IMMEDIATE")
            except BaseException as e:
                self.lock.release()
                if isinstance(e, sqlite3.OperationalError):
                    raise _unwritable(self.journal.path, e) from None
                raise
            return self.c

        def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
            try:
                if et is None:
                    try:
                        self.c.execute("COMMIT")
                    except sqlite3.Error as e:
                        if self.c.in_transaction:
                            self.c.execute("ROLLBACK")
                        raise _unwritable(self.journal.path, e) from None
                elif self.c.in_transaction:
                    # after SQLITE_FULL / an I/O error SQLite has already rolled back: a second
                    # ROLLBACK would replace the real reason with "no transaction is active"
                    self.c.execute("ROLLBACK")
            finally:
                self.lock.release()
            if isinstance(ev, sqlite3.OperationalError):
                raise _unwritable(self.journal.path, ev) from None

    def _tx(self) -> "Journal._Tx":
        return Journal._Tx(self)

    def _all(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """A read, fetched whole under the process lock (no statement left open)."""
        with _IO:
            return self._conn().execute(sql, args).fetchall()

    def _one(self, sql: str, args: tuple = ()) -> Optional[sqlite3.Row]:
        rows = self._all(sql, args)
        return rows[0] if rows else None

    def data_version(self) -> tuple[int, int]:
        """(PRAGMA data_version, this connection's total_changes): changes when anyone commits."""
        with _IO:
            c = self._conn()
            return c.execute("PRAGMA data_version").fetchall()[0][0], c.total_changes

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None and self._local.pid == os.getpid():
            with _IO:
                c.close()
        self._local.conn = None

    # -- writes: each one a committed (fsynced) transaction ---------------------------------
    def begin_txn(self, label: str, candidate_key: Optional[str], changes: list[dict[str, Any]],
                  baseline: list[dict[str, Any]], deadline: Optional[float], probation_s: float) -> int:
        """Baseline snapshots (first time only) + the transaction + one intent row per change,
        atomically. `changes`: dicts with knob, identity, effect, before, after."""
        now = time.time()
        with self._tx() as c:
            for b in baseline:
                c.execute("INSERT OR IGNORE INTO baseline VALUES (?,?,?,?,?)",
                          (b["knob"], b["identity"], _dump(b["value"]), b["effect"], now))
            cur = c.execute(
                "INSERT INTO txns (label, candidate_key, state, created, deadline, probation_s, pid,"
                " updated) VALUES (?,?,'intent',?,?,?,?,?)",
                (label, candidate_key, now, deadline, probation_s, os.getpid(), now))
            txn_id = int(cur.lastrowid)
            for i, ch in enumerate(changes):
                c.execute(
                    "INSERT INTO changes (txn_id, seq, knob, identity, effect, before, after, state,"
                    " created) VALUES (?,?,?,?,?,?,?,'intent',?)",
                    (txn_id, i, ch["knob"], ch["identity"], ch["effect"], _dump(ch["before"]),
                     _dump(ch["after"]), now))
        self._sync_anchor()  # before any knob is written: the anchor knows this change
        return txn_id

    def set_watchdog(self, txn_id: int, pid: int) -> None:
        with self._tx() as c:
            c.execute("UPDATE txns SET watchdog_pid=?, updated=? WHERE id=?", (pid, time.time(), txn_id))

    def mark_applied(self, txn_id: int, knob: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE changes SET state='applied', applied_at=? WHERE txn_id=? AND knob=?"
                      " AND state='intent'", (time.time(), txn_id, knob))

    def start_probation(self, txn_id: int, deadline: float) -> bool:
        with self._tx() as c:
            n = c.execute("UPDATE txns SET state='probation', deadline=?, updated=? WHERE id=? AND"
                          " state='intent'", (deadline, time.time(), txn_id)).rowcount
        return n == 1

    def extend_deadline(self, txn_id: int, deadline: float) -> bool:
        """Move a transaction's deadline later while it is in probation (a caller still measuring
        it); never earlier, never once it is resolved. False when it is no longer in probation."""
        with self._tx() as c:
            n = c.execute("UPDATE txns SET deadline=MAX(deadline, ?), updated=? WHERE id=? AND"
                          " state='probation' AND deadline IS NOT NULL",
                          (deadline, time.time(), txn_id)).rowcount
        return n == 1

    def confirm(self, txn_id: int, reason: str = "probation passed") -> bool:
        """intent/probation -> confirmed. False when someone else already resolved it (the
        watchdog rolled it back at the deadline): the journal is the arbiter."""
        now = time.time()
        with self._tx() as c:
            n = c.execute("UPDATE txns SET state='confirmed', reason=?, updated=? WHERE id=? AND"
                          " state='probation'", (reason, now, txn_id)).rowcount
            if n:
                c.execute("UPDATE changes SET state='confirmed', resolved_at=? WHERE txn_id=?",
                          (now, txn_id))
        return n == 1  # what is in force did not change: the anchor stays as it is

    def claim_rollback(self, txn_id: int, reason: str, *, steal: bool = False) -> bool:
        """Take the right to roll a transaction back. `steal` (recovery, holding the writer
        lock) also takes over a rollback whose owner died half-way."""
        states = ("intent", "probation", "rolling_back", "rollback_failed") if steal \
            else ("intent", "probation")
        with self._tx() as c:
            n = c.execute(
                f"UPDATE txns SET state='rolling_back', reason=COALESCE(CASE WHEN state IN"
                f" ('rolling_back', 'rollback_failed') THEN reason END, ?), pid=?, updated=? WHERE id=? AND state IN"
                f" ({','.join('?' * len(states))})",
                (reason, os.getpid(), time.time(), txn_id, *states)).rowcount
        return n == 1

    def mark_change(self, change_id: int, state: str, reason: Optional[str] = None) -> None:
        with self._tx() as c:
            c.execute("UPDATE changes SET state=?, reason=?, resolved_at=? WHERE id=?",
                      (state, reason, time.time(), change_id))

    def finish_rollback(self, txn_id: int, ok: bool, reason: Optional[str] = None) -> None:
        with self._tx() as c:
            c.execute("UPDATE txns SET state=?, reason=COALESCE(?, reason), updated=? WHERE id=?",
                      ("rolled_back" if ok else "rollback_failed", reason, time.time(), txn_id))
        self._sync_anchor()

    def accept_baseline(self, rows: list[dict[str, Any]], label: str) -> int:
        """Replace the baseline of these knobs (knob, identity, value, effect) by an explicit
        decision of the operator, journalled as a confirmed transaction without changes."""
        now = time.time()
        with self._tx() as c:
            for b in rows:
                c.execute("INSERT OR REPLACE INTO baseline VALUES (?,?,?,?,?)",
                          (b["knob"], b["identity"], _dump(b["value"]), b["effect"], now))
            txn_id = int(c.execute(
                "INSERT INTO txns (label, candidate_key, state, created, deadline, probation_s, pid,"
                " reason, updated) VALUES (?,NULL,'confirmed',?,?,0,?,?,?)",
                (label, now, now, os.getpid(), label, now)).lastrowid)
        self._sync_anchor()
        return txn_id

    def add_incident(self, inc: Incident) -> int:
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO incidents (time, type, severity, xid, gpu, source, detail, data, txn_id,"
                " knob) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (inc.time, inc.type, inc.severity, inc.xid, inc.gpu, inc.source, inc.detail,
                 _dump(inc.data), inc.txn_id, inc.knob))
        inc.id = int(cur.lastrowid)
        return inc.id

    def quarantine(self, key: str, reason: str, incident_id: Optional[int] = None,
                   txn_id: Optional[int] = None) -> None:
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO quarantine VALUES (?,?,?,?,?)",
                      (key, reason, incident_id, txn_id, time.time()))

    # -- reads ---------------------------------------------------------------------------
    def txn(self, txn_id: int) -> Optional[dict[str, Any]]:
        r = self._one("SELECT * FROM txns WHERE id=?", (txn_id,))
        return dict(r) if r else None

    def txn_state(self, txn_id: int) -> Optional[str]:
        r = self._one("SELECT state FROM txns WHERE id=?", (txn_id,))
        return r[0] if r else None

    def changes(self, txn_id: int) -> list[dict[str, Any]]:
        rows = self._all("SELECT * FROM changes WHERE txn_id=? ORDER BY seq", (txn_id,))
        out = []
        for r in rows:
            d = dict(r)
            d["before"], d["after"] = _load(d["before"]), _load(d["after"])
            out.append(d)
        return out

    def open_txns(self) -> list[dict[str, Any]]:
        """Transactions never confirmed nor fully rolled back (oldest first)."""
        rows = self._all(
            f"SELECT * FROM txns WHERE state IN ({','.join('?' * len(OPEN_TXN_STATES))}) OR"
            f" (state='rollback_failed') ORDER BY id", OPEN_TXN_STATES)
        return [dict(r) for r in rows]

    def txns(self, limit: int = 20) -> list[dict[str, Any]]:
        rows = self._all("SELECT * FROM txns ORDER BY id DESC LIMIT ?", (limit,))
        return [dict(r) for r in rows]

    def baseline(self) -> dict[str, dict[str, Any]]:
        """knob -> {identity, value, effect, taken_at} (latest identity when a device changed)."""
        out: dict[str, dict[str, Any]] = {}
        for r in self._all("SELECT * FROM baseline ORDER BY taken_at"):
            out[r["knob"]] = {"identity": r["identity"], "value": _load(r["value"]),
                              "effect": r["effect"], "taken_at": r["taken_at"]}
        return out

    def baseline_for(self, knob: str, identity: str) -> tuple[bool, Any]:
        r = self._one("SELECT value FROM baseline WHERE knob=? AND identity=?",
                                 (knob, identity))
        return (True, _load(r[0])) if r else (False, None)

    def count_changes(self, knob: str, since: float) -> int:
        """Changes of `knob` journalled since `since` (every intent counts: it may have reached the
        device). Rate limits are counted from here, so they hold across restarts."""
        r = self._one("SELECT COUNT(*) FROM changes WHERE knob=? AND created>=?",
                                 (knob, since))
        return int(r[0])

    def incidents(self, limit: int = 20, txn_id: Optional[int] = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM incidents", []
        if txn_id is not None:
            q, args = q + " WHERE txn_id=?", [txn_id]
        rows = self._all(q + " ORDER BY id DESC LIMIT ?", (*args, limit))
        out = []
        for r in rows:
            d = dict(r)
            d["data"] = _load(d["data"])
            out.append(d)
        return out

    def is_quarantined(self, key: str) -> Optional[dict[str, Any]]:
        r = self._one("SELECT rowid AS id, * FROM quarantine WHERE key=?", (key,))
        return dict(r) if r else None

    def quarantined(self) -> list[dict[str, Any]]:
        """Every quarantined candidate, oldest first; `id` (the row id) names it for a clear."""
        return [dict(r) for r in self._all("SELECT rowid AS id, * FROM quarantine ORDER BY time")]

    def clear_quarantine(self, ids: Optional[list[int]], label: str) -> list[dict[str, Any]]:
        """Lift the quarantine of these entries (all when `ids` is None) by the operator's
        decision, journalled as a confirmed transaction without changes (its reason lists what
        was lifted and why it had been quarantined). Returns the entries lifted."""
        now = time.time()
        with self._tx() as c:
            rows = [dict(r) for r in c.execute(
                "SELECT rowid AS id, * FROM quarantine ORDER BY time").fetchall()]
            gone = [r for r in rows if ids is None or r["id"] in ids]
            if not gone:
                return []
            c.executemany("DELETE FROM quarantine WHERE rowid=?", [(r["id"],) for r in gone])
            self._record(c, label, "; ".join(f"#{r['id']} {r['key']} (was: {r['reason']})"
                                             for r in gone), now)
        return gone

    def record(self, label: str, reason: str) -> int:
        """An operator's decision that changes no knob (a profile applied with nothing to
        change), journalled as a confirmed transaction without changes."""
        with self._tx() as c:
            return self._record(c, label, reason, time.time())

    @staticmethod
    def _record(c: sqlite3.Connection, label: str, reason: str, now: float) -> int:
        return int(c.execute(
            "INSERT INTO txns (label, candidate_key, state, created, deadline, probation_s, pid,"
            " reason, updated) VALUES (?,NULL,'confirmed',?,?,0,?,?,?)",
            (label, now, now, os.getpid(), reason, now)).lastrowid)

    def in_force(self) -> list[dict[str, Any]]:
        """Knobs whose value may differ from their baseline: the latest change of each that was
        not rolled back (intent, applied, confirmed or rollback_failed), where its value is not
        the baseline's (knob, identity, value, baseline, txn)."""
        with _IO:
            c = self._conn()
            base = {(r[0], r[1]): r[2] for r in
                    c.execute("SELECT knob, identity, value FROM baseline").fetchall()}
            # SQLite: the bare columns come from the row holding MAX(id)
            latest = c.execute("SELECT knob, identity, after, state, txn_id, MAX(id) FROM changes"
                               " WHERE state != 'rolled_back' GROUP BY knob, identity"
                               " ORDER BY knob").fetchall()
        return [{"knob": r[0], "identity": r[1], "value": _load(r[2]), "txn": r[4],
                 "baseline": _load(base.get((r[0], r[1])))}
                for r in latest if base.get((r[0], r[1])) != r[2]]

    def set_incident_action(self, incident_id: int, action: str) -> None:
        """What was done about an incident (or why nothing): `ROLLBACK_PENDING` until done."""
        with self._tx() as c:
            c.execute("UPDATE incidents SET action=? WHERE id=?", (action, incident_id))

    def pending_rollbacks(self) -> list[dict[str, Any]]:
        """Fatal incidents whose rollback is still to be done (oldest first)."""
        rows = self._all("SELECT * FROM incidents WHERE action=? ORDER BY id", (ROLLBACK_PENDING,))
        return [{**dict(r), "data": _load(r["data"])} for r in rows]

    def last_confirmed_value(self, knob: str, identity: str) -> tuple[bool, Any]:
        r = self._one(
            "SELECT after FROM changes WHERE knob=? AND identity=? AND state='confirmed'"
            " ORDER BY id DESC LIMIT 1", (knob, identity))
        return (True, _load(r[0])) if r else (False, None)


def damage_message(path: Path, what: str, mark: Optional[dict[str, Any]]) -> str:
    """One line: what is wrong with the journal, what its anchor says was in force, what to do."""
    if mark is None:
        said = "its anchor is gone too, so what is in force is unknown"
    elif mark.get("in_force"):
        ch = "; ".join(f"{f['knob']} = {json.dumps(f['value'])} (baseline "
                       f"{json.dumps(f['baseline'])}, transaction {f['txn']})"
                       for f in mark["in_force"][:4])
        more = f" and {len(mark['in_force']) - 4} more" if len(mark["in_force"]) > 4 else ""
        said = f"its anchor records changes in force: {ch}{more}"
    else:
        said = (f"its anchor records {mark['last_txn']} transaction(s), none left in force, and "
                f"the baseline of {len(mark.get('baseline') or [])} knob(s)")
    return (f"journal {path} {what}; {said}. Nothing is recorded over an unknown state: "
            f"{WHAT_TO_DO}")


def _same_record(old: Optional[dict[str, Any]], new: dict[str, Any]) -> bool:
    return old is not None and all(old.get(k) == json.loads(json.dumps(v, default=str))
                                   for k, v in new.items())


def open_readonly(path: str | os.PathLike[str]) -> Optional[Journal]:
    """The journal for a read, opened without writing (a read-only or full state dir works);
    None when there is none yet, JournalDamaged when one should be there."""
    try:
        return Journal(path, readonly=True)
    except FileNotFoundError:
        return None


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


def _unwritable(path: Path, e: BaseException) -> StateUnwritable:
    return StateUnwritable(f"{path}: cannot write: {_os_reason(path, e)}")


class unwritable:
    """Turn a failed write of a state file (OSError, SQLite's error) into StateUnwritable."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if isinstance(ev, (OSError, sqlite3.OperationalError)) and not isinstance(ev, FileNotFoundError):
            raise _unwritable(getattr(ev, "filename", None) and Path(ev.filename) or self.path, ev) from None
