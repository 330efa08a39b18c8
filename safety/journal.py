"""The journal: a durable SQLite record of baselines, change intents and their outcome, incidents
and quarantined candidates. Every record is committed *before* the action it describes, so after
a crash (kill -9, power loss) the journal alone says what may have been written and how to undo it.
The SQLite file (durability, the fork-safe lock) is `journal_sqlite`; the reads, `journal_reads`.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from safety import anchor
from safety.errors import JournalDamaged
from safety.incident import Incident
from safety.journal_reads import OPEN_TXN_STATES, ROLLBACK_PENDING, JournalReads
from safety.journal_sqlite import (SCHEMA, SCHEMA_VERSION, connect_readonly, dump, io, load,
                                   unwritable)
from safety.securefs import open_file, secure_dir

__all__ = ["OPEN_TXN_STATES", "ROLLBACK_PENDING", "WHAT_TO_DO", "Journal", "connect_readonly",
           "damage_message", "open_readonly"]

WHAT_TO_DO = ("run `metaltune recover --from-defaults` to restore each knob's driver default, or "
              "`metaltune baseline --accept-current` to accept the values in force now as the baseline")


class Journal(JournalReads):
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
        with io():
            c = self._conn()
            c.executescript(SCHEMA)  # idempotent; commits on its own
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
            with io():
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
        with io(), anchor.locked(self.path.parent):  # io() first: fork() never copies the flock
            c = self._conn()
            jid = c.execute("SELECT value FROM meta WHERE key='journal_id'").fetchone()[0]
            last = c.execute("SELECT COALESCE(MAX(id), 0) FROM txns").fetchone()[0]
            base = c.execute("SELECT knob, identity, value, effect FROM baseline ORDER BY knob,"
                             " identity").fetchall()
            in_force = self.in_force()
            data = {"journal_id": jid, "journal": self.path.name, "last_txn": int(last),
                    "in_force": in_force,
                    "baseline": [{"knob": r[0], "identity": r[1], "value": load(r[2]), "effect": r[3]}
                                 for r in base]}
            if _same_record(anchor.read_quiet(self.anchor_path), data):
                return  # an fsync saved: nothing the anchor holds has changed
            with unwritable(self.anchor_path):
                anchor.write(self.anchor_path, {**data, "updated": time.time()})

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str]) -> "Journal":
        return cls(Path(state_dir) / "journal.db")


    # -- writes: each one a committed (fsynced) transaction ---------------------------------
    def begin_txn(self, label: str, candidate_key: Optional[str], changes: list[dict[str, Any]],
                  baseline: list[dict[str, Any]], deadline: Optional[float], probation_s: float) -> int:
        """Baseline snapshots (first time only) + the transaction + one intent row per change,
        atomically. `changes`: dicts with knob, identity, effect, before, after."""
        now = time.time()
        with self._tx() as c:
            for b in baseline:
                c.execute("INSERT OR IGNORE INTO baseline VALUES (?,?,?,?,?)",
                          (b["knob"], b["identity"], dump(b["value"]), b["effect"], now))
            cur = c.execute(
                "INSERT INTO txns (label, candidate_key, state, created, deadline, probation_s, pid,"
                " updated) VALUES (?,?,'intent',?,?,?,?,?)",
                (label, candidate_key, now, deadline, probation_s, os.getpid(), now))
            txn_id = int(cur.lastrowid)
            for i, ch in enumerate(changes):
                c.execute(
                    "INSERT INTO changes (txn_id, seq, knob, identity, effect, before, after, state,"
                    " created) VALUES (?,?,?,?,?,?,?,'intent',?)",
                    (txn_id, i, ch["knob"], ch["identity"], ch["effect"], dump(ch["before"]),
                     dump(ch["after"]), now))
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
                          (b["knob"], b["identity"], dump(b["value"]), b["effect"], now))
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
                 dump(inc.data), inc.txn_id, inc.knob))
        inc.id = int(cur.lastrowid)
        return inc.id

    def quarantine(self, key: str, reason: str, incident_id: Optional[int] = None,
                   txn_id: Optional[int] = None) -> None:
        with self._tx() as c:
            c.execute("INSERT OR IGNORE INTO quarantine VALUES (?,?,?,?,?)",
                      (key, reason, incident_id, txn_id, time.time()))

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

    def set_incident_action(self, incident_id: int, action: str) -> None:
        """What was done about an incident (or why nothing): `ROLLBACK_PENDING` until done."""
        with self._tx() as c:
            c.execute("UPDATE incidents SET action=? WHERE id=?", (action, incident_id))


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

