"""Undo journalled changes using the journal alone: what the caller, the watchdog and `recover`
all run. A change is restored to its journalled `before` value; a pending-effect knob (BIOS,
driver option: effect != "now") by dropping the pending value."""
from __future__ import annotations

import math
import time
from typing import Any, Mapping, Optional

from safety import _crash
from safety.journal import Journal

DONE_STATES = ("rolled_back", "rollback_failed", "confirmed")
RETRY_S = (0.05, 0.2, 0.5)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def effect_of(knob: Any) -> str:
    e = getattr(knob, "effect", "now")
    return str(getattr(e, "value", e))


def restore_change(knob: Any, ch: Mapping[str, Any]) -> Optional[str]:
    """Put one knob back; None when restored, else why not."""
    if knob is None:
        return f"knob {ch['knob']} is not on this host any more"
    try:
        ident = knob.identity()
    except Exception as e:
        return f"cannot read identity: {type(e).__name__}: {e}"
    if ident != ch["identity"]:
        # another device now answers to this name (GPU swapped): never write its settings
        return f"identity changed: journal has {ch['identity']!r}, device is {ident!r}"
    try:
        if ch["effect"] != "now":
            if hasattr(knob, "pending") and knob.pending() is None:
                return None
            knob.clear_pending()
            left = knob.pending() if hasattr(knob, "pending") else None
            return None if left is None else f"pending value {left!r} still set after clear"
        cur = knob.read()
        if same(cur, ch["before"]):
            return None  # never written, or already restored: no write at all
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    # a read-back can disagree for a moment (a workload still finishing on the device): retry
    # a few times before leaving the change for `recover`
    err = ""
    for delay in RETRY_S:
        try:
            knob.apply(ch["before"])
            got = knob.read()
            if same(got, ch["before"]):
                return None
            err = f"read back {got!r} after restoring {ch['before']!r}"
        except Exception as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(delay)
    return err


def rollback_txn(journal: Journal, knobs: Mapping[str, Any], txn_id: int, reason: str, *,
                 steal: bool = False, wait_s: float = 30.0) -> dict[str, Any]:
    """Roll one transaction back in reverse order. Returns {txn, state, reason, failed}.

    Exactly one process rolls a transaction back: the claim is a conditional UPDATE in the
    journal. If someone else (the caller or its watchdog) holds the claim, wait for its result."""
    if not journal.claim_rollback(txn_id, reason, steal=steal):
        end = time.monotonic() + wait_s
        while True:
            t = journal.txn(txn_id)
            if t is None:
                raise KeyError(f"no transaction {txn_id} in {journal.path}")
            if t["state"] in DONE_STATES or time.monotonic() > end:
                return {"txn": txn_id, "state": t["state"], "reason": t["reason"], "failed": [],
                        "by_other": True}
            time.sleep(0.01)
    _crash.point("rollback.claimed")
    failed = []
    for ch in reversed(journal.changes(txn_id)):
        if ch["state"] in ("rolled_back", "confirmed"):
            continue
        why = restore_change(knobs.get(ch["knob"]), ch)
        _crash.point("rollback.restored")
        journal.mark_change(ch["id"], "rolled_back" if why is None else "rollback_failed",
                            reason if why is None else why)
        if why is not None:
            failed.append({"knob": ch["knob"], "error": why})
    journal.finish_rollback(txn_id, ok=not failed,
                            reason=None if not failed else f"{reason}; restore failed: "
                            + "; ".join(f"{f['knob']}: {f['error']}" for f in failed))
    _crash.point("rollback.done")
    return {"txn": txn_id, "state": "rolled_back" if not failed else "rollback_failed",
            "reason": reason, "failed": failed, "by_other": False}
