"""Trial boots in the journal: one row per boot-time candidate, written before each step it names.

A boot-time change (kernel command line, module options, pending BIOS attributes) is tried by a
one-shot boot, so its life spans a reboot and two daemon processes. The row is committed (fsynced,
as every journal write) *before* the step it names, so whatever dies in between (the daemon, the
kernel, the power) the next start reads what may have happened and finishes it:

    intent -> armed -> rebooting -> gating -> promoting -> promoted
                                         \\-> demoting -> demoted -> rolled_back
    armed (no reboot came) -> aborted         rebooting (came back on the old default) -> lost

Final states: promoted, rolled_back, lost, aborted. `safety` knows nothing of boot loaders: the
row carries the loader's own words (entry id, the boot ID and command line before) as data.
"""
from __future__ import annotations

import sqlite3
import time
from typing import Any, Optional

from safety.journal import Journal
from safety.journal_sqlite import dump, load

SCHEMA = """
CREATE TABLE IF NOT EXISTS boot_trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT, candidate_key TEXT NOT NULL, state TEXT NOT NULL,
    loader TEXT NOT NULL, entry TEXT NOT NULL, changes TEXT NOT NULL, boot_id_before TEXT NOT NULL,
    cmdline_before TEXT NOT NULL, default_before TEXT, before_values TEXT NOT NULL,
    baseline TEXT, result TEXT, reason TEXT, history TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL);
"""
FINAL = ("promoted", "rolled_back", "lost", "aborted")
STATES = ("intent", "armed", "rebooting", "gating", "promoting", "demoting", "demoted", *FINAL)


class BootTrials:
    """The boot_trials table of one journal."""

    def __init__(self, journal: Journal):
        self.journal = journal
        if not journal.readonly:
            with journal._tx() as c:
                c.execute(SCHEMA.strip())

    # -- writes -------------------------------------------------------------------------------
    def intent(self, *, candidate_key: str, loader: str, entry: str, changes: dict[str, Any],
               boot_id: str, cmdline: str, default_before: Optional[str],
               before_values: dict[str, Any]) -> int:
        now = time.time()
        hist = [{"state": "intent", "time": now, "reason": "journalled before the entry is written"}]
        with self.journal._tx() as c:
            cur = c.execute(
                "INSERT INTO boot_trials (candidate_key, state, loader, entry, changes,"
                " boot_id_before, cmdline_before, default_before, before_values, history, created,"
                " updated) VALUES (?,'intent',?,?,?,?,?,?,?,?,?,?)",
                (candidate_key, loader, entry, dump(changes), boot_id, cmdline, default_before,
                 dump(before_values), dump(hist), now, now))
            return int(cur.lastrowid)

    def move(self, trial_id: int, state: str, reason: str, *, baseline: Any = None,
             result: Any = None) -> None:
        """Record the next step before taking it (or the outcome once final)."""
        if state not in STATES:
            raise ValueError(f"unknown trial state {state!r}")
        now = time.time()
        with self.journal._tx() as c:
            row = c.execute("SELECT history, result FROM boot_trials WHERE id=?",
                            (trial_id,)).fetchone()
            if row is None:
                raise KeyError(f"no boot trial #{trial_id}")
            hist = load(row[0]) + [{"state": state, "time": now, "reason": reason}]
            if result is not None:  # what the steps found, merged (the boot IDs, the gate's numbers)
                result = {**(load(row[1]) or {}), **result}
            sets, args = ["state=?", "reason=?", "history=?", "updated=?"], [state, reason, dump(hist), now]
            if baseline is not None:
                sets.append("baseline=?")
                args.append(dump(baseline))
            if result is not None:
                sets.append("result=?")
                args.append(dump(result))
            c.execute(f"UPDATE boot_trials SET {', '.join(sets)} WHERE id=?", (*args, trial_id))

    # -- reads --------------------------------------------------------------------------------
    def _rows(self, sql: str, args: tuple = ()) -> list[dict[str, Any]]:
        try:
            return [_row(r) for r in self.journal._all(sql, args)]
        except sqlite3.OperationalError as e:  # a read-only journal from before boot trials
            if "no such table" in str(e):
                return []
            raise

    def get(self, trial_id: int) -> Optional[dict[str, Any]]:
        rows = self._rows("SELECT * FROM boot_trials WHERE id=?", (trial_id,))
        return rows[0] if rows else None

    def open(self) -> Optional[dict[str, Any]]:
        """The trial not yet final (at most one: a new one is refused while it exists)."""
        rows = self._rows(
            f"SELECT * FROM boot_trials WHERE state NOT IN ({','.join('?' * len(FINAL))})"
            " ORDER BY id DESC LIMIT 1", FINAL)
        return rows[0] if rows else None

    def all(self, limit: int = 20) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM boot_trials ORDER BY id DESC LIMIT ?", (limit,))


def _row(r: Any) -> dict[str, Any]:
    d = dict(r)
    for k in ("changes", "before_values", "baseline", "result", "history"):
        d[k] = load(d[k]) if d[k] is not None else None
    return d
