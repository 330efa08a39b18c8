"""The operation table: `@operation("name")` registers a function under its name; `options=` a
pydantic model that checks its arguments (tuner.ops.args), where the signature cannot say them;
`reads=True` an operation that changes nothing (served without the writer lock)."""
from __future__ import annotations

from typing import Any, Callable, Optional

OpFunc = Callable[..., dict[str, Any]]
OPS: dict[str, OpFunc] = {}
#: the operations that only read: the daemon runs them concurrently, without the writer lock
READS: set[str] = set()


def operation(name: str, options: Optional[type] = None,
              reads: bool = False) -> Callable[[OpFunc], OpFunc]:
    def deco(fn: OpFunc) -> OpFunc:
        if options is not None:
            fn.options = options  # type: ignore[attr-defined]
        OPS[name] = fn
        if reads:
            READS.add(name)
        return fn

    return deco
