"""Operations "status", "confirm", "rollback", "recover": the safety journal and the host's knobs.

Knobs come from `tuner.knobs.registry.discover(host)`; the work is `safety.recovery`. Safety
errors carry an exit code (2 bad input, 1 failed) and become the matching tuner error here, so
the CLI and the daemon socket report them the same way.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional

from tuner.errors import BadInput, OperationFailed
from tuner.ops.args import Count, Seconds
from tuner.ops.registry import operation


@contextlib.contextmanager
def translate() -> Iterator[None]:
    """Map `safety.errors.SafetyError` to BadInput / OperationFailed (message kept)."""
    from safety.errors import SafetyError

    try:
        yield
    except SafetyError as e:
        raise (BadInput if getattr(e, "exit_code", 1) == 2 else OperationFailed)(str(e)) from e


def knob_factory(host: Any, state_dir: Any = None) -> tuple[str, dict[str, Any]]:
    """What a Transaction's process watchdog needs to rebuild this host's knobs by name."""
    return ("tuner.ops.safety:watchdog_knobs",
            {"backend": host.backend, "sim_root": str(host.root) if host.backend == "sim" else None,
             "state_dir": str(state_dir) if state_dir is not None else None})


def watchdog_knobs(backend: str, sim_root: Optional[str] = None,
                   state_dir: Optional[str] = None) -> dict[str, Any]:
    from tuner.host import open_host
    from tuner.knobs.registry import discover

    return discover(open_host(backend, sim_root), state_dir=state_dir)


def journal_path(settings: Any) -> Path:
    return Path(settings.state_dir) / "journal.db"


def journal_for(settings: Any, create: bool = True) -> Any:
    """The journal to write in (created when `create`); None when there is none and `create` is
    false. A damaged journal is OperationFailed (exit 1) saying what the operator can do."""
    from safety.journal import Journal

    path = journal_path(settings)
    with translate():
        if not create and not path.exists() and not _anchor_exists(path):
            return None
        settings.ensure_state_dir()
        return Journal(path)


def journal_to_read(settings: Any) -> Any:
    """The journal for a read command: opened read-only (works on a read-only or full state
    dir, writes nothing); None when there is none yet."""
    from safety.journal import open_readonly

    with translate():
        return open_readonly(journal_path(settings))


def _anchor_exists(path: Path) -> bool:
    from safety.anchor import path_for

    return path_for(path).exists()


def _knobs(settings: Any) -> dict[str, Any]:
    from tuner.knobs.registry import discover

    return discover(settings.host(), state_dir=settings.state_dir)


@operation("status", reads=True)
def status(settings: Any, incidents: Count = 10) -> dict[str, Any]:
    """baseline, current, pending (None when nothing is pending), incidents."""
    from safety.recovery import status as st

    from kernelsearch.canary_reader import recent

    knobs = _knobs(settings)
    # the kernel canary's removals (its incident log), journalled by a daemon or not
    removals = recent(settings.state_dir, incidents)
    j = journal_to_read(settings)
    if j is None:  # nothing was ever changed: do not create a state dir for a read
        cur = st(_EmptyJournal(), knobs, incidents)
        return {**cur, "journal": None, "active_profile": None, "staged": staged(knobs),
                "canary_removals": removals}
    with translate():
        return {**st(j, knobs, incidents), "journal": str(j.path),
                "active_profile": active_profile(j), "staged": staged(knobs),
                "canary_removals": removals}


#: the label an applied profile's transaction carries (tuner.ops.apply), read back by status
from tuner.ops.hints import APPLY_LABEL  # noqa: E402  (re-exported: the CLI and the daemon use it)
#: operator resets after which no profile is in force any more
_RESETS = ("rollback to baseline", "recover --from-defaults", "baseline")


def active_profile(journal: Any) -> Optional[dict[str, Any]]:
    """The profile in force, as `tuned-adm active` reports it: the last applied profile whose
    transaction was confirmed, unless a rollback to baseline or a reset came after it."""
    for t in journal.txns(200):  # newest first
        label = t["label"] or ""
        if t["state"] == "confirmed" and label.startswith(APPLY_LABEL):
            from tuner.ops.hints import from_label

            return {**from_label(label), "txn": t["id"],  # type: ignore[misc]
                    "since": t["updated"] if "updated" in t else t["created"]}
        if t["state"] == "confirmed" and label.startswith(_RESETS):
            return None
    return None


def staged(knobs: dict[str, Any]) -> list[dict[str, Any]]:
    """Values written but not yet in force: BIOS attributes waiting for a reboot (or a BMC
    reset), driver module options waiting for a reload."""
    out = []
    for n, k in sorted(knobs.items()):
        if not hasattr(k, "pending"):
            continue
        try:
            p = k.pending()
            if p is None:
                continue
            cur = k.read()
        except Exception:  # noqa: BLE001 - an unreadable knob is shown by `current` already
            continue
        eff = getattr(k, "effect", None)
        out.append({"knob": n, "current": cur, "staged": p,
                    "takes_effect": getattr(eff, "value", eff) or "reboot"})
    return out


@operation("quarantine_list")
def quarantine_list(settings: Any, **_: Any) -> dict[str, Any]:
    """Candidates never tried again after a fatal incident (Xid, ECC, hang) during their probation."""
    j = journal_to_read(settings)
    rows = [] if j is None else j.quarantined()
    return {"quarantine": [_q_row(r) for r in rows]}


def _q_row(r: dict[str, Any]) -> dict[str, Any]:
    import json

    try:
        knobs = json.loads(r["key"]).get("knobs")
    except (ValueError, AttributeError):
        knobs = None
    return {"id": r["id"], "time": r["time"], "reason": r["reason"], "txn": r["txn_id"],
            "incident": r["incident_id"], "knobs": knobs, "key": r["key"]}


@operation("quarantine_clear")
def quarantine_clear(settings: Any, items: Optional[list[int]] = None, all: bool = False,
                     **_: Any) -> dict[str, Any]:
    """Let quarantined candidates be tried again (the operator's decision, journalled)."""
    if not items and not all:
        raise BadInput("quarantine clear: name the entries to clear (their ids from "
                       "`metaltune quarantine list`) or give --all")
    j = journal_for(settings, create=False)
    if j is None:
        raise OperationFailed("nothing is quarantined (no journal yet)")
    known = {r["id"] for r in j.quarantined()}
    missing = sorted(set(items or []) - known)
    if missing:
        raise OperationFailed(f"quarantine clear: no entry {', '.join(map(str, missing))}; "
                              f"quarantined: {', '.join(map(str, sorted(known))) or 'none'}")
    with translate():
        gone = j.clear_quarantine(None if all else list(items or []),
                                  "quarantine cleared by the operator (quarantine clear)")
    return {"cleared": [_q_row(r) for r in gone]}


@operation("confirm")
def confirm(settings: Any) -> dict[str, Any]:
    from safety.recovery import confirm_pending

    j = journal_for(settings, create=False)
    if j is None:
        raise OperationFailed("nothing is pending confirmation (no journal yet)")
    with translate():
        return confirm_pending(j)


@operation("rollback")
def rollback(settings: Any, lock_timeout: Seconds = 30.0) -> dict[str, Any]:
    """Undo anything unconfirmed, then return every changed knob to its baseline."""
    from safety.recovery import rollback_to_baseline

    knobs = _knobs(settings)
    j = journal_for(settings)
    with translate():
        res = rollback_to_baseline(j, knobs, state_dir=settings.state_dir, lock_timeout=lock_timeout)
    if not res["ok"] or res.get("failed"):
        raise OperationFailed("rollback incomplete: " + "; ".join(
            f"{f['knob']}: {f['error']}" for r in res["recovered"] for f in r["failed"]) +
            "; ".join(f"{f['knob']}: {f['error']}" for f in res.get("failed", [])))
    return res


@operation("recover")
def recover(settings: Any, lock_timeout: Seconds = 30.0, from_defaults: bool = False) -> dict[str, Any]:
    """Roll back every change never confirmed (after a crash; the daemon runs it at start).
    `from_defaults`: put every knob metaltune knew back to its driver default instead (the way
    out of a damaged journal)."""
    from safety.recovery import recover as rec, restore_defaults

    if from_defaults:
        knobs = _knobs(settings)
        settings.ensure_state_dir()
        with translate():
            res = restore_defaults(journal_path(settings), knobs, state_dir=settings.state_dir,
                                   lock_timeout=lock_timeout)
        if not res["ok"]:
            raise OperationFailed("recover --from-defaults incomplete: " + "; ".join(
                f"{f['knob']}: {f['error']}" for f in res.get("failed", [])))
        return res
    j = journal_for(settings, create=False)
    if j is None or not j.open_txns():  # nothing to undo: do not even probe the host
        return {"recovered": [], "ok": True}
    knobs = _knobs(settings)
    with translate():
        res = rec(j, knobs, state_dir=settings.state_dir, lock_timeout=lock_timeout)
    if not res["ok"]:
        raise OperationFailed("recover incomplete: " + "; ".join(
            f"transaction {r['txn']} {f['knob']}: {f['error']}" for r in res["recovered"]
            for f in r["failed"]))
    return res


@operation("baseline")
def baseline(settings: Any, accept_current: bool = False, lock_timeout: Seconds = 30.0) -> dict[str, Any]:
    """`accept_current`: the values in force now become the baseline (no knob is written)."""
    from safety.recovery import accept_current as accept

    if not accept_current:
        raise BadInput("baseline: nothing to do; --accept-current records the values in force "
                       "now as the baseline")
    knobs = _knobs(settings)
    settings.ensure_state_dir()
    with translate():
        return accept(journal_path(settings), knobs, state_dir=settings.state_dir,
                      lock_timeout=lock_timeout)


class _EmptyJournal:
    def baseline(self) -> dict[str, Any]:
        return {}

    def open_txns(self) -> list[Any]:
        return []

    def incidents(self, limit: int = 10) -> list[Any]:
        return []

    def quarantined(self) -> list[Any]:
        return []

    def txns(self, limit: int = 5) -> list[Any]:
        return []
