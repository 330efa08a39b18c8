"""Recovery and status, from the journal alone (what `metaltune recover|rollback|confirm|status`
and daemon start run). Knobs are needed only to write: pass them by name ({name: knob})."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from safety import anchor
from safety.errors import Busy, JournalDamaged, SafetyError
from safety.journal import Journal
from safety.lock import WriterLock
from safety.restore import effect_of, rollback_txn, same


def _lock(journal: Journal, state_dir: Optional[str | os.PathLike[str]], role: str,
          timeout: float) -> WriterLock:
    return _lock_path(journal.path, state_dir, role, timeout)


def _lock_path(path: Path, state_dir: Optional[str | os.PathLike[str]], role: str,
               timeout: float) -> WriterLock:
    # a watchdog finishing a rollback holds the lock for well under a second: wait for it
    return WriterLock(Path(state_dir) if state_dir else path.parent, role).acquire(timeout)


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
    undone: list[dict[str, Any]] = []  # what was undone under a live writer: said, not lost
    try:
        lock = _lock(journal, state_dir, "rollback", min(0.5, lock_timeout))
    except Busy:
        # a live writer is in probation: undo its change through the journal (the claim decides
        # against its own rollback); it sees that at its next check and lets the lock go
        for t in journal.open_txns():
            if t["state"] == "probation":
                undone.append(rollback_txn(journal, knobs, t["id"], "rolled back by the operator"))
        lock = _lock(journal, state_dir, "rollback", lock_timeout)
    try:
        rec = recover(journal, knobs, state_dir=state_dir, reason="rollback to baseline")
        rec = {"recovered": undone + rec["recovered"],
               "ok": rec["ok"] and all(d["state"] == "rolled_back" for d in undone)}
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
        res = _write_confirmed(journal, knobs, plan, label, "baseline restored")
        return {"recovered": rec["recovered"], "restored": res["restored"], "skipped": skipped,
                **{k: v for k, v in res.items() if k != "restored"}, "ok": rec["ok"] and res["ok"]}
    finally:
        lock.release()


def _write_confirmed(journal: Journal, knobs: Mapping[str, Any], plan: list[dict[str, Any]],
                     label: str, reason: str) -> dict[str, Any]:
    """Write a plan the operator asked for (back to a baseline, to the driver defaults):
    journalled like any change (intent before write) and confirmed at once; if a knob fails,
    what was written is undone and the result says why."""
    if not plan:
        return {"restored": [], "ok": True}
    txn = journal.begin_txn(label, None, plan, [], deadline=time.time(), probation_s=0)
    failed = []
    for p in plan:
        k = knobs[p["knob"]]
        try:
            if p["effect"] != "now":
                if p["pending"] is not None:
                    k.clear_pending()
                if not same(k.read(), p["after"]):
                    k.apply(p["after"])  # a pending value: it takes effect at the next reset
            else:
                k.apply(p["after"])
            journal.mark_applied(txn, p["knob"])
        except Exception as e:
            failed.append({"knob": p["knob"], "error": f"{type(e).__name__}: {e}"})
    if failed:
        r = rollback_txn(journal, knobs, txn, f"{label} failed: " +
                         "; ".join(f"{f['knob']}: {f['error']}" for f in failed), steal=True)
        return {"restored": [], "failed": failed, "ok": False, "txn": txn, "state": r["state"]}
    journal.start_probation(txn, time.time())
    journal.confirm(txn, reason)
    return {"restored": [p["knob"] for p in plan], "ok": True, "txn": txn}


def _plan_to(knobs: Mapping[str, Any], targets: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Changes that bring each knob to its target (none for a knob already there)."""
    plan = []
    for name, value in targets.items():
        k = knobs[name]
        eff = effect_of(k)
        cur = k.read()
        pending = k.pending() if eff != "now" and hasattr(k, "pending") else None
        if same(cur, value) and pending is None:
            continue
        plan.append({"knob": name, "identity": k.identity(), "effect": eff, "before": cur,
                     "after": value, "value": cur, "pending": pending})
    return plan


def _journal_for_reset(path: Path) -> tuple[Journal, Optional[list[str]], Optional[dict[str, str]]]:
    """The journal to record an operator's reset in: the journal itself when it is sound, else
    a new one, the damaged journal and its anchor kept beside it for inspection. Also the knobs
    the damaged journal's anchor knew (None: unknown)."""
    try:
        return Journal(path), None, None
    except JournalDamaged:
        pass
    mark = anchor.read_quiet(anchor.path_for(path))
    names = None if mark is None else sorted(
        {b["knob"] for b in mark.get("baseline", [])} | {f["knob"] for f in mark.get("in_force", [])})
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside: dict[str, str] = {}
    hot = path.with_name(path.name + "-journal")  # SQLite's rollback journal: empty unless hot
    if hot.exists() and not hot.is_symlink() and hot.stat().st_size == 0:
        hot.unlink()
    for p in (path, hot, anchor.path_for(path)):
        if p.exists() or p.is_symlink():
            dst = p.with_name(f"{p.name}.damaged-{stamp}")
            os.rename(p, dst)
            aside[p.name] = str(dst)
    return Journal(path), names, aside


def restore_defaults(journal_path: str | os.PathLike[str], knobs: Mapping[str, Any], *,
                     state_dir: Any = None, lock_timeout: float = 30.0) -> dict[str, Any]:
    """`recover --from-defaults`: put every knob metaltune knew back to the device's own default
    (`knob.default()`), and make those defaults the baseline. On a damaged journal the knobs
    come from its anchor (all of this host's, when the anchor is gone as well) and a new journal
    records the restore; on a sound one, unconfirmed changes are rolled back first."""
    path = Path(journal_path)
    lock = _lock_path(path, state_dir, "recover --from-defaults", lock_timeout)
    try:
        journal, names, aside = _journal_for_reset(path)
        rec = {"recovered": [], "ok": True} if aside is not None else \
            recover(journal, knobs, state_dir=state_dir, reason="recover --from-defaults")
        if aside is None:
            names = sorted(journal.baseline())
        skipped, base, targets = [], [], {}
        for name in names if names is not None else sorted(knobs):
            k = knobs.get(name)
            if k is None:
                skipped.append({"knob": name, "why": "not on this host"})
                continue
            if names is None and effect_of(k) != "now":
                # nothing says metaltune staged anything here: no BIOS or driver change on a guess
                skipped.append({"knob": name, "why": f"takes effect on {effect_of(k)}; no record "
                                                     "that metaltune changed it"})
                continue
            try:
                d = k.default() if hasattr(k, "default") else None
            except Exception as e:
                skipped.append({"knob": name, "why": f"cannot read its default: {type(e).__name__}: {e}"})
                continue
            if d is None:
                skipped.append({"knob": name, "why": "reports no driver default"})
                continue
            base.append({"knob": name, "identity": k.identity(), "value": d, "effect": effect_of(k)})
            targets[name] = d
        if base:
            journal.accept_baseline(base, "baseline: driver defaults (recover --from-defaults)")
        res = _write_confirmed(journal, knobs, _plan_to(knobs, targets),
                               "recover --from-defaults", "driver defaults restored")
        return {"recovered": rec["recovered"], **res, "skipped": skipped, "damaged_journal": aside,
                "baseline": {b["knob"]: b["value"] for b in base}, "ok": rec["ok"] and res["ok"]}
    finally:
        lock.release()


def accept_current(journal_path: str | os.PathLike[str], knobs: Mapping[str, Any], *,
                   state_dir: Any = None, lock_timeout: float = 30.0) -> dict[str, Any]:
    """`baseline --accept-current`: the values in force now become the baseline, by the
    operator's decision. No knob is written. On a damaged journal a new one records it (for the
    knobs its anchor knew, or every knob of the host); a sound journal must have nothing open."""
    path = Path(journal_path)
    lock = _lock_path(path, state_dir, "baseline --accept-current", lock_timeout)
    try:
        journal, names, aside = _journal_for_reset(path)
        if aside is None:
            open_ = journal.open_txns()
            if open_:
                raise SafetyError(f"transaction {open_[-1]['id']} is {open_[-1]['state']}: confirm or "
                                  "roll it back (or `metaltune recover`) before accepting a baseline")
            names = sorted(set(journal.baseline()) & set(knobs)) or None
        rows, skipped = [], []
        for name in names if names is not None else sorted(knobs):
            k = knobs.get(name)
            if k is None:
                skipped.append({"knob": name, "why": "not on this host"})
                continue
            try:
                rows.append({"knob": name, "identity": k.identity(), "value": k.read(),
                             "effect": effect_of(k)})
            except Exception as e:
                skipped.append({"knob": name, "why": f"cannot read: {type(e).__name__}: {e}"})
        txn = journal.accept_baseline(rows, "baseline accepted by the operator (baseline --accept-current)")
        return {"baseline": {r["knob"]: r["value"] for r in rows}, "skipped": skipped, "txn": txn,
                "damaged_journal": aside, "ok": True}
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
