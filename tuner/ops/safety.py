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
from tuner.ops.registry import operation


@contextlib.contextmanager
def translate() -> Iterator[None]:
    """Map `safety.errors.SafetyError` to BadInput / OperationFailed (message kept)."""
    from safety.errors import SafetyError

    try:
        yield
    except SafetyError as e:
        raise (BadInput if getattr(e, "exit_code", 1) == 2 else OperationFailed)(str(e)) from e


def knob_factory(host: Any) -> tuple[str, dict[str, Any]]:
    """What a Transaction's process watchdog needs to rebuild this host's knobs by name."""
    return ("tuner.ops.safety:watchdog_knobs",
            {"backend": host.backend, "sim_root": str(host.root) if host.backend == "sim" else None})


def watchdog_knobs(backend: str, sim_root: Optional[str] = None) -> dict[str, Any]:
    from tuner.host import open_host
    from tuner.knobs.registry import discover

    return discover(open_host(backend, sim_root))


def journal_for(settings: Any, create: bool = True) -> Any:
    from safety.journal import Journal

    path = Path(settings.state_dir) / "journal.db"
    if not create and not path.exists():
        return None
    settings.ensure_state_dir()
    return Journal(path)


def _knobs(settings: Any) -> dict[str, Any]:
    from tuner.knobs.registry import discover

    return discover(settings.host())


@operation("status")
def status(settings: Any, incidents: int = 10, **_: Any) -> dict[str, Any]:
    """baseline, current, pending (None when nothing is pending), incidents."""
    from safety.recovery import status as st

    knobs = _knobs(settings)
    j = journal_for(settings, create=False)
    if j is None:  # nothing was ever changed: do not create a state dir for a read
        cur = st(_EmptyJournal(), knobs, incidents)
        return {**cur, "journal": None}
    with translate():
        return {**st(j, knobs, incidents), "journal": str(j.path)}


@operation("confirm")
def confirm(settings: Any, **_: Any) -> dict[str, Any]:
    from safety.recovery import confirm_pending

    j = journal_for(settings, create=False)
    if j is None:
        raise OperationFailed("nothing is pending confirmation (no journal yet)")
    with translate():
        return confirm_pending(j)


@operation("rollback")
def rollback(settings: Any, lock_timeout: float = 30.0, **_: Any) -> dict[str, Any]:
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
def recover(settings: Any, lock_timeout: float = 30.0, **_: Any) -> dict[str, Any]:
    """Roll back every change never confirmed (after a crash; the daemon runs it at start)."""
    from safety.recovery import recover as rec

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
