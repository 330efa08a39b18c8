"""Safety layer: policy (allowed-change list), journal, transactions with probation and rollback,
recovery and health monitors. Imports nothing from `tuner` or `kernelsearch`.

Names are loaded lazily so that a process that only needs the journal (the watchdog, a crash
test child) does not pay for pydantic and YAML.
"""
from __future__ import annotations

from typing import Any

#: tells metaltune this is its own `safety`, not PyPI's vulnerability scanner of the same name
__metaltune__ = True

_EXPORTS = {
    "Journal": "safety.journal",
    "Incident": "safety.incident",
    "classify_xid": "safety.incident",
    "Transaction": "safety.transaction",
    "transaction": "safety.transaction",
    "BadChange": "safety.transaction",
    "Policy": "safety.policy",
    "Refusal": "safety.policy",
    "WriterLock": "safety.lock",
    "recover": "safety.recovery",
    "rollback_to_baseline": "safety.recovery",
    "confirm_pending": "safety.recovery",
    "status": "safety.recovery",
    "SafetyError": "safety.errors",
    "PolicyError": "safety.errors",
    "PolicyDenied": "safety.errors",
    "Quarantined": "safety.errors",
    "Busy": "safety.errors",
    "ApplyFailed": "safety.errors",
    "ProbationExpired": "safety.errors",
    "RollbackFailed": "safety.errors",
    "Instability": "safety.errors",
    "JournalDamaged": "safety.errors",
    "StateUnwritable": "safety.errors",
    "OutOfBounds": "safety.errors",
    "restore_defaults": "safety.recovery",
    "accept_current": "safety.recovery",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'safety' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(mod), name)
