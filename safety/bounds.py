"""Bounds every number that reaches the safety layer is held to. A probation of `inf` never
ends (the writer is held forever), a NaN bound compares false with everything (the check is
skipped and the change goes through): every numeric input is finite and inside a stated range.

Plain Python on purpose: the transaction checks its arguments here without importing pydantic;
the pydantic models at the edges (policy, daemon config) use the same limits."""
from __future__ import annotations

import math
from typing import Any

from safety.errors import OutOfBounds

#: the longest probation anyone may ask for: a day. Longer is a change nobody watches.
MAX_PROBATION_S = 24 * 3600.0


def finite(value: Any, what: str, *, lo: float | None = None, hi: float | None = None) -> float:
    """`value` as a float, finite and within [lo, hi]; else OutOfBounds (exit 2) naming `what`."""
    if isinstance(value, bool):
        raise OutOfBounds(f"{what}: expected a number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise OutOfBounds(f"{what}: expected a number, got {value!r}") from None
    if not math.isfinite(x):
        raise OutOfBounds(f"{what}: expected a finite number, got {value!r}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        want = (f"{lo:g} to {hi:g}" if lo is not None and hi is not None
                else f">= {lo:g}" if lo is not None else f"<= {hi:g}")
        raise OutOfBounds(f"{what}: expected {want}, got {value!r}")
    return x


def probation_seconds(value: Any, what: str = "probation_s") -> float:
    return finite(value, what, lo=0.0, hi=MAX_PROBATION_S)
