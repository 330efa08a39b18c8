"""The daemon's incident queue: what its own monitors saw, journalled once per change it belongs
to, attributed to the change in force, and for a fatal one a rollback queued and retried until it
is done (or journalled why not). One the journal cannot take yet (a full state dir) is kept and
tried again next tick, since a monitor reports an event only once; one it cannot take because the
journal is damaged or gone still rolls back: to the driver defaults, the way out a damaged journal
leaves (`recover --from-defaults`), after which it is journalled in the new journal."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

from tuner.daemon import logs
from tuner.daemon.journal_ref import JournalRef
from tuner.pids import alive

KERNEL_CANARY = "canary_kernel"  # kernelsearch.canary_reader.TYPE
KERNEL_TABLE = "kernels.table"  # tuner.knobs.kernels.NAME

#: an incident seen again within this many seconds (another monitor, the transaction's own
#: monitors) is the same event
DEDUP_S = 10.0


class IncidentQueue:
    def __init__(self, journal: JournalRef, knobs: Callable[[], dict[str, Any]],
                 writer: threading.RLock, config: Callable[[], Any], searches: Any,
                 changed: Callable[[], None], baseline_restored: Callable[[str], None],
                 restore_defaults: Callable[[], Any]):
        """`searches`: the daemon's SearchRunner (a running search owns the writes: it is
        stopped first); `changed`: the journal moved on (log, metrics); `baseline_restored`: a
        confirmed change was rolled back to the baseline; `restore_defaults`: the reset."""
        self.journal, self.knobs, self.writer, self.config = journal, knobs, writer, config
        self.searches, self.changed = searches, changed
        self.baseline_restored, self.restore_defaults = baseline_restored, restore_defaults
        #: fatal incidents whose rollback is still to run: incident id -> {reason, txn}; also
        #: in the journal (incidents.action), so a restart picks them up again
        self.pending: dict[int, dict[str, Any]] = {}
        self.unrecorded: list[Any] = []  # seen, not journalled yet (retried)
        self._said: dict[str, float] = {}  # what was logged when: once a minute

    def load_pending(self) -> None:
        """The rollbacks queued before a crash or a stop."""
        from safety.incident import REASON_BY_TYPE

        for r in self.journal().pending_rollbacks():
            where = f" gpu {r['gpu']}" if r["gpu"] is not None else ""
            reason = REASON_BY_TYPE.get(r["type"], "instability_" + r["type"])
            self.pending[r["id"]] = {"txn": r["txn_id"], "reason": f"{reason}: {r['severity']} "
                                                                   f"{r['type']}{where}: {r['detail']}"}

    def add(self, incidents: list[Any]) -> None:
        self.unrecorded.extend(incidents)

    def _once_a_minute(self, key: str) -> bool:
        if time.monotonic() - self._said.get(key, -1e9) > 60:
            self._said[key] = time.monotonic()
            return True
        return False

    def record(self) -> None:
        """Handle the incidents seen, in order; stop at the first the journal cannot take."""
        from safety.errors import JournalDamaged

        while self.unrecorded:
            inc = self.unrecorded[0]
            try:
                self._on_incident(inc)
            except JournalDamaged as e:
                self.journal.damaged()
                if self._once_a_minute("journal"):
                    logs.log("incident.unrecorded", level="error", incident=str(inc),
                             error=f"JournalDamaged: {e}", retry="next health tick")
                if inc.fatal:
                    self._roll_back_unjournalled(inc)
                return
            except Exception as e:
                if self._once_a_minute("journal"):
                    logs.log("incident.unrecorded", level="error", incident=str(inc),
                             error=f"{type(e).__name__}: {e}", retry="next health tick")
                return
            self.unrecorded.pop(0)

    def _roll_back_unjournalled(self, inc: Any) -> None:
        """A fatal incident and a journal that cannot say what is in force: the driver
        defaults, now. The incident is journalled next tick, in the journal the reset made."""
        if self.searches.running:
            self.searches.stop(f"{inc.reason}: {inc} (journal damaged)")
            return  # its child holds the writer lock; next tick
        if not self.writer.acquire(timeout=0.5):
            return
        try:
            logs.log("rollback.start", level="warning", to="driver defaults", reason=f"{inc.reason}: {inc}",
                     cause="fatal incident and the journal is damaged or gone")
            res = self.restore_defaults()
            logs.log("rollback.defaults", level="warning" if res.get("ok") else "error",
                     restored=sorted(res.get("baseline", {})), ok=res.get("ok"))
            self.baseline_restored(f"{inc.reason}: {inc}")
        except Exception as e:  # retried with the incident next tick
            logs.log("rollback.error", level="error", to="driver defaults",
                     error=f"{type(e).__name__}: {e}", retry="next health tick")
        finally:
            self.writer.release()
        self.changed()

    def _on_incident(self, inc: Any) -> None:
        """Journal it (once per change it belongs to), attribute it to the change in force,
        and for a fatal one queue the rollback. Logging and metrics come from the journal."""
        journal = self.journal()
        if inc.id is None:
            target, handled = self._attribute(journal, inc)
            if self._duplicate(journal, inc, target):
                return
            if target is not None:
                inc.txn_id = target["id"]
                knobs = [c["knob"] for c in journal.changes(target["id"])]
                if inc.type == KERNEL_CANARY and KERNEL_TABLE in knobs and not journal.open_txns():
                    knobs = [KERNEL_TABLE]  # the table change in force, not the rest of its txn
                inc.knob = inc.knob or ",".join(knobs)
            inc.attributed = (target, handled)  # a retry after a failed write goes on from here
            journal.add_incident(inc)
            self.changed()  # log + count it now, before the rollback lines
        target, handled = inc.attributed
        if not inc.fatal:
            return
        cfg = self.config()
        if target is None and inc.type == KERNEL_CANARY:
            journal.set_incident_action(inc.id, _UNATTRIBUTED)
        elif target is None:
            journal.set_incident_action(inc.id, "nothing to roll back: no change in force")
        elif handled is not None:
            journal.set_incident_action(inc.id, f"rolled back: transaction {handled['id']} "
                                                f"({handled['state']}) by its own monitors")
        elif target["state"] == "confirmed" and cfg.on_fatal_incident == "record":
            journal.set_incident_action(inc.id, "recorded only: on_fatal_incident = \"record\"")
        else:
            from safety.journal import ROLLBACK_PENDING

            journal.set_incident_action(inc.id, ROLLBACK_PENDING)
            self.pending[inc.id] = {"reason": f"{inc.reason}: {inc}", "txn": target["id"]}
            if self.searches.running:
                # the search owns the writes: stop it; once its child is gone (and what it left
                # unconfirmed recovered), the queued rollback runs
                self.searches.stop(f"{inc.reason}: {inc}")
            self.retry_rollbacks()

    def _attribute(self, journal: Any, inc: Any) -> tuple[Optional[dict[str, Any]], Optional[dict[str, Any]]]:
        """(the change the incident belongs to, that change when its own transaction already
        rolled it back for this event): the open transaction, else one rolled back within
        DEDUP_S, else the latest confirmed one still in force. (None, None): nothing in force."""
        if inc.type == KERNEL_CANARY:
            return _canary_change(journal, inc), None
        open_ = journal.open_txns()
        if open_:
            return open_[-1], None
        recent = journal.txns(1)
        if recent and recent[0]["state"] in ("rolled_back", "rollback_failed") \
                and recent[0]["updated"] >= inc.time - DEDUP_S:
            return recent[0], recent[0]
        ids = {f["txn"] for f in journal.in_force()}
        return (journal.txn(max(ids)) if ids else None), None

    def _duplicate(self, journal: Any, inc: Any, target: Optional[dict[str, Any]]) -> bool:
        """The same event seen again (another monitor, the transaction's own monitors): same
        kind within DEDUP_S, and no change came into force since it was journalled. A change
        confirmed after it is a different change, and its incident is never hidden."""
        for r in journal.incidents(limit=20):
            if inc.type == KERNEL_CANARY:
                # one line of the canary's log, read again (a restart, a transaction's monitor
                # and the daemon's): the same id; two kernels caught at once are two incidents
                if r["type"] == inc.type and (r["data"] or {}).get("id") == inc.data.get("id"):
                    return True
                continue
            if r["type"] != inc.type or r["xid"] != inc.xid or abs(r["time"] - inc.time) > DEDUP_S:
                continue
            if target is None or r["txn_id"] == target["id"] or target["created"] <= r["time"]:
                return True
        return False

    def retry_rollbacks(self) -> None:
        """Run the queued rollbacks that can run now; the others wait for the next tick (the
        writer busy, a search stopping, an apply still writing). Each ends journalled."""
        for inc_id, item in sorted(self.pending.items()):
            try:
                action = self._rollback_for(item["txn"], inc_id, item["reason"], item)
            except Exception as e:  # retried next tick; said once a minute
                action = None
                if time.monotonic() - item.get("error_at", -1e9) > 60:
                    item["error_at"] = time.monotonic()
                    logs.log("rollback.error", level="error", incident=inc_id, txn=item["txn"],
                             error=f"{type(e).__name__}: {e}", retry="next health tick")
            if action is not None:
                self.journal().set_incident_action(inc_id, action)
                del self.pending[inc_id]
                self.changed()

    def _rollback_for(self, txn_id: int, inc_id: int, reason: str, item: dict[str, Any]) -> Optional[str]:
        """Roll back for one fatal incident; the action to journal, or None to retry later."""
        from safety.restore import rollback_txn

        journal = self.journal()
        t = journal.txn(txn_id)
        if t is None:
            return f"not rolled back: transaction {txn_id} is not in the journal"
        if self.searches.running:
            return None  # its child holds the writer lock; it is being stopped
        if t["state"] in ("intent", "probation", "rolling_back"):
            if t["state"] == "intent" and _alive(t.get("pid")):
                # still writing: a restore now would run under the write in flight, which
                # would then land after it; its owner (or we, next tick) rolls it back
                return None
            if t.get("candidate_key"):
                journal.quarantine(t["candidate_key"], reason, inc_id, txn_id)
            # the journal's claim decides between us and the transaction's owner (or its
            # watchdog): exactly one restores the knobs
            res = rollback_txn(journal, self.knobs(), txn_id, reason, steal=not _alive(t.get("pid")))
            if res["state"] not in ("rolled_back", "rollback_failed"):
                return None
            return f"rolled back: transaction {txn_id} ({res['state']})"
        if t["state"] in ("rolled_back", "rollback_failed"):
            return f"rolled back: transaction {txn_id} ({t['state']}: {t['reason']})"
        return self._to_baseline(journal, t, inc_id, reason, item)

    def _to_baseline(self, journal: Any, t: dict[str, Any], inc_id: int, reason: str,
                     item: dict[str, Any]) -> Optional[str]:
        """A confirmed change: back to the baseline, under the writer, without ever blocking
        the main loop (watchdog pings) behind a long write: retried next tick."""
        txn_id = t["id"]
        if self.config().on_fatal_incident == "record":
            return "recorded only: on_fatal_incident = \"record\""
        if not self.writer.acquire(timeout=0.5):
            if not item.get("deferred"):
                item["deferred"] = True
                logs.log("rollback.deferred", level="warning", incident=inc_id, txn=txn_id,
                         reason="another write in progress", retry="every health tick")
            return None
        try:
            from safety import rollback_to_baseline

            if t.get("candidate_key"):
                journal.quarantine(t["candidate_key"], reason, inc_id, txn_id)
            knobs_of = [c["knob"] for c in journal.changes(txn_id)]
            logs.log("rollback.start", level="warning", txn=txn_id, label=t["label"], knobs=knobs_of,
                     reason=reason, to="baseline", cause="fatal incident with a confirmed change in force")
            res = rollback_to_baseline(journal, self.knobs(), state_dir=self.config().state_dir,
                                       label=f"rollback to baseline: {reason}")
            self.baseline_restored(reason)
        finally:
            self.writer.release()
        if not res["ok"] or res.get("failed"):
            return "rollback to baseline failed: " + "; ".join(
                f"{f['knob']}: {f['error']}" for f in res.get("failed", [])) + " (see `metaltune status`)"
        return f"rolled back to baseline (transaction {res.get('txn', '-')}; restored " \
               f"{', '.join(res['restored']) or 'nothing: already at baseline'})"


_UNATTRIBUTED = ("logged only: no change in force when it happened put its kernel there (no kernel "
                 "table in force names it, or it was applied after); nothing rolled back")


def _canary_change(journal: Any, inc: Any) -> Optional[dict[str, Any]]:
    """The change a wrong kernel belongs to, by time and by name: the open transaction it
    happened during (a wrong result under another change's probation is that change's), else
    the `kernels.table` change in force whose table names the kernel and that was applied
    before the kernel was caught. None: log it only (a line from before any table, a kernel no
    table in force holds) rather than blame whatever was confirmed last."""
    open_ = [t for t in journal.open_txns() if t["created"] <= inc.time]
    if open_:
        return open_[-1]
    fam, variant = inc.data.get("family"), inc.data.get("variant")
    for f in journal.in_force():
        if f["knob"] != KERNEL_TABLE or not isinstance(f["value"], dict):
            continue
        entries = f["value"].get("entries") or []
        if any(isinstance(e, dict) and e.get("family") == fam and e.get("variant") == variant
               for e in entries):
            t = journal.txn(f["txn"])
            if t is not None and t["created"] <= inc.time:
                return t
    return None


def _alive(pid: Any) -> bool:
    """Our own pid counts as alive (a transaction this daemon process holds)."""
    return pid == os.getpid() or alive(pid)
