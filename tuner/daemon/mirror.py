"""Mirror the safety journal into the daemon's log and metrics.

Every incident and every change that was applied, confirmed or rolled back, by whoever did it (the
daemon, an operation served on the socket, a search child, a probation watchdog, recovery), is
logged once as a key=value line with its reason and counted in the metrics. The journal is the
single source of truth; this only reads it (cheaply: nothing is read when no connection has
committed since the last look).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from tuner.daemon import logs

#: label prefix of safety.rollback_to_baseline transactions
BASELINE_LABEL = "rollback to baseline"


class JournalMirror:
    def __init__(self, journal_fn: Callable[[], Any], metrics_fn: Callable[[], Any]):
        self.journal_fn = journal_fn
        self.metrics_fn = metrics_fn
        self.counts = {"incidents": 0, "rollbacks": 0, "changes": 0}
        self.last_incident: Optional[dict[str, Any]] = None
        self.last_rollback: Optional[dict[str, Any]] = None
        self._seen_incident = 0  # highest incident id already reported
        self._seen_txns: dict[int, str] = {}  # txn id -> state already reported
        self._version: dict[int, tuple[int, int]] = {}  # per thread: (data_version, total_changes)
        self._journal: Any = None  # the Journal object those refer to
        self._mu = threading.Lock()

    def tail(self, report: bool = True) -> None:
        """Report what is new in the journal. `report=False` only takes the starting point.
        Called from several threads (the loop, socket requests): one reports at a time."""
        with self._mu:
            self._tail(report)

    def _tail(self, report: bool) -> None:
        metrics = self.metrics_fn()
        try:
            journal = self.journal_fn()
            if journal is not self._journal:  # reopened (a reset made a new file): ids restart
                self._journal, self._seen_incident = journal, 0
                self._seen_txns, self._version = {}, {}
            # nothing committed by another connection since the last look: nothing to report
            ver = journal.data_version()  # this thread's connection: its own commits count too
            if report and ver == self._version.get(threading.get_ident()):
                return
            self._version[threading.get_ident()] = ver
            incs = journal.incidents(limit=50)
            txns = journal.txns(50)
        except Exception as e:
            logs.log("journal.error", level="error", error=f"{type(e).__name__}: {e}")
            return
        for r in sorted(incs, key=lambda r: r["id"]):
            if r["id"] <= self._seen_incident:
                continue
            self._seen_incident = r["id"]
            if not report:
                continue
            self.counts["incidents"] += 1
            if metrics is not None:
                metrics.incident(r["type"], r["xid"], r["gpu"])
            self.last_incident = {k: r[k] for k in ("id", "type", "severity", "xid", "gpu", "detail",
                                                    "source", "time", "txn_id", "knob")}
            logs.log("incident", level="error" if r["severity"] == "fatal" else "warning",
                     type=r["type"], severity=r["severity"], xid=r["xid"], gpu=r["gpu"],
                     detail=r["detail"], source=r["source"], txn=r["txn_id"], knobs=r["knob"])
        for t in sorted(txns, key=lambda t: t["id"]):
            old = self._seen_txns.get(t["id"])
            if old == t["state"] or (t["state"] == "intent" and report):
                continue  # intent: the writes may not have happened yet; report it once applied
            self._seen_txns[t["id"]] = t["state"]
            if not report:
                continue
            changes = journal.changes(t["id"])
            if t["state"] in ("probation", "rolling_back"):
                if old is None:
                    self.counts["changes"] += 1
                    for c in changes:
                        logs.log("change.applied", txn=t["id"], knob=c["knob"], before=c["before"],
                                 after=c["after"], reason=t["label"])
            elif t["state"] == "confirmed" and (t["label"] or "").startswith(BASELINE_LABEL):
                # a return to baseline (incident, stop policy, operator): journalled as a
                # confirmed change, reported as what it is, a rollback
                why = t["label"][len(BASELINE_LABEL):].lstrip(": ") or "rollback to baseline"
                self._report_rollback(t, changes, why, metrics, undone_key="before", to_key="after")
            elif t["state"] == "confirmed":
                if old is None:  # applied and confirmed between two looks
                    self.counts["changes"] += 1
                for c in changes:
                    logs.log("change.confirmed", txn=t["id"], knob=c["knob"], before=c["before"],
                             value=c["after"], reason=t["reason"] or t["label"])
            elif t["state"] in ("rolled_back", "rollback_failed"):
                self._report_rollback(t, changes, t["reason"] or "rolled back", metrics)

    def _report_rollback(self, t: dict[str, Any], changes: list[dict[str, Any]], why: str, metrics: Any,
                         undone_key: str = "after", to_key: str = "before") -> None:
        self.counts["rollbacks"] += 1
        code = _reason_code(why)
        if metrics is not None:
            metrics.rollback(code)
        self.last_rollback = {"txn": t["id"], "label": t["label"], "reason": why, "code": code,
                              "state": t["state"], "time": t["updated"],
                              "knobs": [c["knob"] for c in changes]}
        for c in changes:
            logs.log("rollback", level="warning", txn=t["id"], knob=c["knob"], to=c[to_key],
                     undone=c[undone_key], result=c["state"], reason=why, label=t["label"])
        if not changes:
            logs.log("rollback", level="warning", txn=t["id"], reason=why, label=t["label"])


def _reason_code(why: str) -> str:
    """The stable code at the head of a reason ("instability_xid: fatal xid gpu 0: ..." ->
    "instability_xid"); free text (an operator's rollback) -> "baseline"."""
    head = why.split(":", 1)[0].strip()
    return head if head and " " not in head else "baseline"
