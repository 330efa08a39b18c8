"""Crash points for the crash-consistency test: with METALTUNE_CRASH_AT=k the k-th point reached
SIGKILLs this process (no cleanup, like a power cut). Costs one attribute test when unset."""
from __future__ import annotations

import os
import signal

_AT = int(os.environ.get("METALTUNE_CRASH_AT", "0") or 0)
_LOG = os.environ.get("METALTUNE_CRASH_LOG")
_n = 0


def point(name: str) -> None:
    global _n
    if not _AT:
        return
    _n += 1
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(f"{_n} {name}\n")
    if _n == _AT:
        os.kill(os.getpid(), signal.SIGKILL)


def disable() -> None:
    """Watchdog children never crash on purpose (they inherit the environment)."""
    global _AT
    _AT = 0
