"""Number options of the command line: finite and bounded (`--probation inf` never ends, a NaN
passes click's own min/max checks since it compares false with both)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import typer

from tuner.errors import BadInput


def finite(lo: Optional[float] = None, hi: Optional[float] = None) -> Callable[..., Any]:
    """A typer option callback: the value finite and inside [lo, hi], else one line, exit 2."""
    def check(param: typer.CallbackParam, value: Any) -> Any:
        if value is None:
            return value
        from safety.bounds import finite as bounded
        from safety.errors import OutOfBounds

        try:
            return bounded(value, (param.opts or [param.name or "value"])[0], lo=lo, hi=hi)
        except OutOfBounds as e:
            raise BadInput(str(e)) from None

    return check
