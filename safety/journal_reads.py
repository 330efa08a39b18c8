"""What the journal holds, read back: transactions and their changes, the baseline, incidents,
quarantined candidates and the knobs in force (each read fetched whole under the process lock)."""
from __future__ import annotations

from typing import Any, Optional

from safety.journal_sqlite import SqliteFile, io, load

OPEN_TXN_STATES = ("intent", "probation", "rolling_back")
#: an incident's action while its rollback waits for the writer (retried until done)
ROLLBACK_PENDING = "rollback pending"


class JournalReads(SqliteFile):
    """The journal's reads (`Journal` adds opening, verifying and writing)."""

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
            d["before"], d["after"] = load(d["before"]), load(d["after"])
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
            out[r["knob"]] = {"identity": r["identity"], "value": load(r["value"]),
                              "effect": r["effect"], "taken_at": r["taken_at"]}
        return out

    def baseline_for(self, knob: str, identity: str) -> tuple[bool, Any]:
        r = self._one("SELECT value FROM baseline WHERE knob=? AND identity=?",
                                 (knob, identity))
        return (True, load(r[0])) if r else (False, None)

    def count_changes(self, knob: str, since: float) -> int:
        """Changes of `knob` journalled since `since` (every intent counts: it may have reached the
        device). Rate limits are counted from here, so they hold across restarts."""
        r = self._one("SELECT COUNT(*) FROM changes WHERE knob=? AND created>=?",
                                 (knob, since))
        return int(r[0])

    def change_times(self, knob: str, since: float) -> list[float]:
        """When each change of `knob` since `since` was journalled, oldest first (when a rate
        limit frees up again)."""
        return [float(r[0]) for r in self._all(
            "SELECT created FROM changes WHERE knob=? AND created>=? ORDER BY created",
            (knob, since))]

    def incidents(self, limit: int = 20, txn_id: Optional[int] = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM incidents", []
        if txn_id is not None:
            q, args = q + " WHERE txn_id=?", [txn_id]
        rows = self._all(q + " ORDER BY id DESC LIMIT ?", (*args, limit))
        out = []
        for r in rows:
            d = dict(r)
            d["data"] = load(d["data"])
            out.append(d)
        return out

    def is_quarantined(self, key: str) -> Optional[dict[str, Any]]:
        r = self._one("SELECT rowid AS id, * FROM quarantine WHERE key=?", (key,))
        return dict(r) if r else None

    def quarantined(self) -> list[dict[str, Any]]:
        """Every quarantined candidate, oldest first; `id` (the row id) names it for a clear."""
        return [dict(r) for r in self._all("SELECT rowid AS id, * FROM quarantine ORDER BY time")]

    def in_force(self) -> list[dict[str, Any]]:
        """Knobs whose value may differ from their baseline: the latest change of each that was
        not rolled back (intent, applied, confirmed or rollback_failed), where its value is not
        the baseline's (knob, identity, value, baseline, txn)."""
        with io():
            c = self._conn()
            base = {(r[0], r[1]): r[2] for r in
                    c.execute("SELECT knob, identity, value FROM baseline").fetchall()}
            # SQLite: the bare columns come from the row holding MAX(id)
            latest = c.execute("SELECT knob, identity, after, state, txn_id, MAX(id) FROM changes"
                               " WHERE state != 'rolled_back' GROUP BY knob, identity"
                               " ORDER BY knob").fetchall()
        return [{"knob": r[0], "identity": r[1], "value": load(r[2]), "txn": r[4],
                 "baseline": load(base.get((r[0], r[1])))}
                for r in latest if base.get((r[0], r[1])) != r[2]]

    def pending_rollbacks(self) -> list[dict[str, Any]]:
        """Fatal incidents whose rollback is still to be done (oldest first)."""
        rows = self._all("SELECT * FROM incidents WHERE action=? ORDER BY id", (ROLLBACK_PENDING,))
        return [{**dict(r), "data": load(r["data"])} for r in rows]

    def last_confirmed_value(self, knob: str, identity: str) -> tuple[bool, Any]:
        r = self._one(
            "SELECT after FROM changes WHERE knob=? AND identity=? AND state='confirmed'"
            " ORDER BY id DESC LIMIT 1", (knob, identity))
        return (True, load(r[0])) if r else (False, None)
