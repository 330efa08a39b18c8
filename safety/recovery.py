"""Recovery and status, from the journal alone (what `metaltune recover|rollback|confirm|status`
and daemon start run). Knobs are needed only to write: pass them by name ({name: knob})."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from safety.errors import Busy, SafetyError
from safety.journal import Journal
from safety.lock import WriterLock
from safety.restore import effect_of, rollback_txn, same


def _lock(journal: Journal, state_dir: Optional[str | os.PathLike[str]], role: str,
          timeout: float) -> WriterLock:
    # a watchdog finishing a rollback holds the lock for well under a second: wait for it
    return WriterLock(Path(state_dir) if state_dir else journal.path.parent, role).acquire(timeout)


def recover(journal: Journal, knobs: Mapping[str, Any], *, state_dir: Any = None,
            lock_timeout: float = 30.0, reason: str = "recovered: never confirmed") -> dict[str, Any]:
    """Roll back every transaction that was never confirmed (oldest last: reverse order)."""
    lock = _lock(journal, state_dir, "recover", lock_timeout)
    try:
        done = []
        for t in reversed(journal.open_txns()):
            why = reason if t["state"] != "rolling_back" else f"{reason} (finishing: {t['reason']})"
            done.append(rollback_txn(journal, knobs, t["id"], why, steal=True))
        return {"recovered": done, "ok": all(d["state"] == "rolled_back" for d in done)}
    finally:
        lock.release()


def confirm_pending(journal: Journal, reason: str = "confirmed by the operator") -> dict[str, Any]:
    """Confirm the transaction in probation now. No knob is written, so no lock is needed: the
    conditional update in the journal decides against a watchdog that is rolling back."""
    pend = [t for t in journal.open_txns() if t["state"] == "probation"]
    if not pend:
        raise SafetyError("nothing is pending confirmation")
    out = []
    for t in pend:
        if not journal.confirm(t["id"], reason):
            raise SafetyError(f"transaction {t['id']} was resolved meanwhile "
                              f"({journal.txn_state(t['id'])})")
        out.append(t["id"])
    return {"confirmed": out}


def rollback_to_baseline(journal: Journal, knobs: Mapping[str, Any], *, state_dir: Any = None,
                         lock_timeout: float = 30.0, label: str = "rollback to baseline"
                         ) -> dict[str, Any]:
    """Undo anything unconfirmed, then return every journalled knob to its baseline value. The
    restore itself is journalled like any change (intent before write) and confirmed at once;
    the policy is not consulted: going back to what the host had is always allowed."""
    try:
        lock = _lock(journal, state_dir, "rollback", min(0.5, lock_timeout))
    except Busy:
        # a live writer is in probation: undo its change through the journal (the claim decides
        # against its own rollback); it sees that at its next check and lets the lock go
        for t in journal.open_txns():
            if t["state"] == "probation":
                rollback_txn(journal, knobs, t["id"], "rolled back by the operator")
        lock = _lock(journal, state_dir, "rollback", lock_timeout)
    try:
        rec = recover(journal, knobs, state_dir=state_dir, reason="rollback to baseline")
        plan, skipped = [], []
        for name, b in journal.baseline().items():
            k = knobs.get(name)
            if k is None:
                skipped.append({"knob": name, "why": "not on this host"})
                continue
            if k.identity() != b["identity"]:
                skipped.append({"knob": name, "why": f"identity changed ({b['identity']} -> "
                                                     f"{k.identity()})"})
                continue
            eff = effect_of(k)
            cur = k.read()
            pending = k.pending() if eff != "now" and hasattr(k, "pending") else None
            if same(cur, b["value"]) and pending is None:
                continue
            plan.append({"knob": name, "identity": b["identity"], "effect": eff, "before": cur,
                         "after": b["value"], "value": cur, "pending": pending})
        if not plan:
            return {"recovered": rec["recovered"], "restored": [], "skipped": skipped, "ok": rec["ok"]}
        txn = journal.begin_txn(label, None, plan, [], deadline=time.time(), probation_s=0)
        failed = []
        for p in plan:
            k = knobs[p["knob"]]
            try:
                if p["effect"] != "now":
                    if p["pending"] is not None:
                        k.clear_pending()
                    if not same(k.read(), p["after"]):
                        k.apply(p["after"])  # a pending value: the baseline returns at the next reset
                else:
                    k.apply(p["after"])
                journal.mark_applied(txn, p["knob"])
            except Exception as e:
                failed.append({"knob": p["knob"], "error": f"{type(e).__name__}: {e}"})
        if failed:
            r = rollback_txn(journal, knobs, txn, "restore to baseline failed: " +
                             "; ".join(f"{f['knob']}: {f['error']}" for f in failed), steal=True)
            return {"recovered": rec["recovered"], "restored": [], "failed": failed,
                    "skipped": skipped, "ok": False, "txn": txn, "state": r["state"]}
        journal.start_probation(txn, time.time())
        journal.confirm(txn, "baseline restored")
        return {"recovered": rec["recovered"], "restored": [p["knob"] for p in plan],
                "skipped": skipped, "ok": rec["ok"], "txn": txn}
    finally:
        lock.release()


def status(journal: Journal, knobs: Mapping[str, Any], incidents: int = 10) -> dict[str, Any]:
    """baseline, current, pending (None when nothing is pending), incidents, quarantine."""
    base = {n: b["value"] for n, b in journal.baseline().items()}
    current: dict[str, Any] = {}
    for n, k in sorted(knobs.items()):
        try:
            current[n] = k.read()
        except Exception as e:
            current[n] = {"error": f"{type(e).__name__}: {e}"}
    pending = None
    open_ = journal.open_txns()
    if open_:
        t = open_[-1]
        pending = {
            "txn": t["id"], "label": t["label"], "state": t["state"], "created": t["created"],
            "deadline": t["deadline"],
            "remaining_s": None if t["deadline"] is None else max(0.0, t["deadline"] - time.time()),
            "pid": t["pid"], "watchdog_pid": t["watchdog_pid"],
            "changes": [{"knob": c["knob"], "before": c["before"], "after": c["after"],
                         "state": c["state"]} for c in journal.changes(t["id"])],
            "others": [o["id"] for o in open_[:-1]],
        }
    return {
        "baseline": base,
        "current": current,
        "pending": pending,
        "incidents": journal.incidents(limit=incidents),
        "quarantine": len(journal.quarantined()),
        "recent": [{k: t[k] for k in ("id", "label", "state", "reason", "created")}
                   for t in journal.txns(5)],
    }
